//! HTML reduced to readable text.
//!
//! Not a parser: one pass over the markup that drops tags, comments and the
//! contents of `script`, `style`, `noscript`, `template` and `head`, turns
//! block elements into line breaks (paragraph-like ones into a blank line),
//! list items into `- ` lines, decodes common entities and collapses
//! whitespace (except inside `pre`). Malformed markup degrades to text, never
//! to an error.

/// Elements whose whole content is dropped.
const DROPPED: [&str; 5] = ["script", "style", "noscript", "template", "head"];
/// Elements that start and end a line.
const LINE: [&str; 22] = [
    "div",
    "li",
    "tr",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "table",
    "thead",
    "tbody",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "main",
    "aside",
    "form",
    "figure",
    "figcaption",
    "address",
];
/// Elements set apart by a blank line.
const PARAGRAPH: [&str; 10] = [
    "p",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "blockquote",
    "pre",
    "hr",
];

/// The readable text of `html`.
pub(super) fn to_text(html: &str) -> String {
    let lower = html.to_ascii_lowercase();
    let source = Source {
        lower: &lower,
        last_head_end: lower.rfind("</head").max(lower.rfind("<body")),
    };
    let bytes = html.as_bytes();
    let mut out = Text::default();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'<' => i = tag(&source, i, &mut out),
            b'&' => {
                let (decoded, used) = entity(&html[i..]);
                out.push(&decoded);
                i += used;
            }
            _ => {
                let end = html[i..].find(['<', '&']).map_or(html.len(), |at| i + at);
                out.push(&html[i..end]);
                i = end;
            }
        }
    }
    out.finish()
}

/// The page's `<title>`, decoded and collapsed, if it has a non-empty one.
pub(super) fn title(html: &str) -> Option<String> {
    let lower = html.to_ascii_lowercase();
    let open = lower.find("<title")?;
    let start = open + lower[open..].find('>')? + 1;
    let end = start + lower[start..].find("</title")?;
    let mut out = Text::default();
    out.push(&decode(&html[start..end]));
    Some(out.finish()).filter(|t| !t.is_empty())
}

/// The markup lowercased (same byte offsets as the original), for
/// case-blind search.
#[derive(Debug)]
struct Source<'a> {
    lower: &'a str,
    /// Where the last `</head` or `<body` starts: past it, a `head` has no
    /// end to search for (many unclosed `<head>` tags would otherwise cost
    /// quadratic time).
    last_head_end: Option<usize>,
}

/// Handles the markup starting at `at` (a `<`); returns where text resumes.
fn tag(source: &Source<'_>, at: usize, out: &mut Text) -> usize {
    let lower = source.lower;
    let rest = &lower[at..];
    if let Some(comment) = rest.strip_prefix("<!--") {
        return comment
            .find("-->")
            .map_or(lower.len(), |end| at + 4 + end + 3);
    }
    let closing = rest.starts_with("</");
    let name_start = at + if closing { 2 } else { 1 };
    let name_len = lower[name_start..]
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(lower.len() - name_start);
    let name = &lower[name_start..name_start + name_len];
    let is_declaration = !closing && (rest.starts_with("<!") || rest.starts_with("<?"));
    if name.is_empty() && !is_declaration {
        out.push("<"); // a lone `<` in text, as in `a < b`
        return at + 1;
    }
    let end = tag_end(lower, name_start + name_len);
    if closing || is_declaration {
        if name == "pre" {
            out.pre = out.pre.saturating_sub(1);
        }
        out.block(name);
        return end;
    }
    if DROPPED.contains(&name) {
        return skip_content(source, name, end);
    }
    if name == "pre" {
        out.pre += 1;
    }
    out.block(name);
    if name == "li" {
        out.push("- ");
    }
    end
}

/// Just past the `>` that ends a tag whose attributes start at `from`
/// (quoted values may contain `>`), or the end of input.
fn tag_end(lower: &str, from: usize) -> usize {
    let mut quote = None;
    for (offset, c) in lower[from..].char_indices() {
        match (quote, c) {
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '>') => return from + offset + 1,
            _ => {}
        }
    }
    lower.len()
}

/// Past the close of a dropped element whose content starts at `from`;
/// without a close, the rest of the input is dropped. `head` differs: its
/// close tag is optional, so it also ends where `<body` starts, and a `head`
/// that never ends drops only its own tag.
fn skip_content(source: &Source<'_>, name: &str, from: usize) -> usize {
    let lower = source.lower;
    if name != "head" {
        let close = format!("</{name}");
        return lower[from..]
            .find(&close)
            .map_or(lower.len(), |at| tag_end(lower, from + at + close.len()));
    }
    if source.last_head_end.is_none_or(|last| last < from) {
        return from;
    }
    let mut at = from;
    while let Some(offset) = lower[at..].find('<') {
        at += offset;
        if lower[at..].starts_with("<body") {
            return at;
        }
        if lower[at..].starts_with("</head") {
            return tag_end(lower, at + "</head".len());
        }
        at += 1;
    }
    from
}

/// `text` with every entity decoded.
fn decode(text: &str) -> String {
    let mut decoded = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(at) = text[i..].find('&') {
        decoded.push_str(&text[i..i + at]);
        let (entity, used) = entity(&text[i + at..]);
        decoded.push_str(&entity);
        i += at + used;
    }
    decoded.push_str(&text[i..]);
    decoded
}

/// The entity at the start of `text` (which starts with `&`) and its length
/// in bytes; an unknown or unterminated one stands for itself (`&`, 1).
fn entity(text: &str) -> (String, usize) {
    let literal = ("&".to_owned(), 1);
    // The longest entity handled (`&#x10FFFF;`, `&hellip;`) fits in 12 bytes.
    let Some(semicolon) = text.bytes().take(12).position(|b| b == b';') else {
        return literal;
    };
    let body = &text[1..semicolon];
    let decoded = if let Some(number) = body.strip_prefix('#') {
        let code = match number.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16),
            None => number.parse(),
        };
        match code {
            Ok(0) | Err(_) => None,
            Ok(code) => Some(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER)),
        }
    } else {
        named(body)
    };
    match decoded {
        Some(c) => (c.to_string(), semicolon + 1),
        None => literal,
    }
}

/// A named entity's character, for the names pages commonly use.
fn named(name: &str) -> Option<char> {
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        "nbsp" => ' ',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "hellip" => '…',
        "mdash" => '—',
        "ndash" => '–',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "middot" => '·',
        "bull" => '•',
        "euro" => '€',
        "deg" => '°',
        "times" => '×',
        _ => return None,
    })
}

/// The text being built.
#[derive(Debug, Default)]
struct Text {
    out: String,
    /// How many `pre` elements are open; whitespace is kept inside them.
    pre: usize,
}

impl Text {
    /// Appends text, collapsing whitespace outside `pre`.
    fn push(&mut self, text: &str) {
        for c in text.chars() {
            if c == '\r' {
                continue;
            }
            if self.pre > 0 || !c.is_whitespace() {
                self.out.push(c);
            } else if !self.out.is_empty() && !self.out.ends_with([' ', '\n']) {
                self.out.push(' ');
            }
        }
    }

    /// The line breaks element `name` makes, if any.
    fn block(&mut self, name: &str) {
        if name == "br" {
            self.trim_spaces();
            if !self.out.is_empty() {
                self.out.push('\n');
            }
        } else if name == "td" || name == "th" {
            self.push(" ");
        } else if LINE.contains(&name) || PARAGRAPH.contains(&name) {
            self.trim_spaces();
            if !self.out.is_empty() && !self.out.ends_with('\n') {
                self.out.push('\n');
            }
            if PARAGRAPH.contains(&name) && !self.out.is_empty() && !self.out.ends_with("\n\n") {
                self.out.push('\n');
            }
        }
    }

    fn trim_spaces(&mut self) {
        let kept = self.out.trim_end_matches([' ', '\t']).len();
        self.out.truncate(kept);
    }

    /// The text: lines without trailing blanks, at most one empty line in a row.
    fn finish(self) -> String {
        let mut text = String::with_capacity(self.out.len());
        let mut blank = 0;
        for line in self.out.lines() {
            let line = line.trim_end();
            if line.is_empty() {
                blank += 1;
                if blank > 1 || text.is_empty() {
                    continue;
                }
            } else {
                blank = 0;
            }
            text.push_str(line);
            text.push('\n');
        }
        text.trim_end().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_scripts_styles_and_head() {
        let html = "<!DOCTYPE html><html><head><title>T</title><style>p{color:red}</style>\
                    <script>var x = '<p>';</script></head><body><p>Hello <b>world</b></p>\
                    <noscript>enable js</noscript><SCRIPT type=\"text/javascript\">alert(1)</SCRIPT>\
                    <!-- a comment <p> --><p>Bye</p></body></html>";
        assert_eq!(to_text(html), "Hello world\n\nBye");
        assert_eq!(title(html).as_deref(), Some("T"));
    }

    #[test]
    fn block_elements_break_lines() {
        let html = "<h1>Title</h1><div>one</div><div>two<br>three</div>\
                    <ul><li>a</li><li>b</li></ul><table><tr><td>x</td><td>y</td></tr>\
                    <tr><td>z</td></tr></table><p>end</p>";
        assert_eq!(
            to_text(html),
            "Title\n\none\ntwo\nthree\n- a\n- b\nx y\nz\n\nend"
        );
    }

    #[test]
    fn decodes_entities() {
        let html = "<p>a &amp; b &lt;c&gt; &quot;d&quot; &#39;e&#39; f&nbsp;g &#65;&#x42;&#X43; \
                    &copy; &bogus; &amp x &#0; &#xZZ; &#1114112;</p>";
        assert_eq!(
            to_text(html),
            "a & b <c> \"d\" 'e' f g ABC © &bogus; &amp x &#0; &#xZZ; \u{fffd}"
        );
    }

    #[test]
    fn collapses_whitespace_but_keeps_pre() {
        let html = "<p>  lots\n\n  of\t space </p><pre>  keep\n    this</pre><p>after</p>";
        assert_eq!(to_text(html), "lots of space\n\n  keep\n    this\n\nafter");
    }

    #[test]
    fn hostile_markup_takes_linear_time() {
        for unit in [
            "<head>",
            "<head><body>",
            "<head></head>",
            "<script>",
            "<a title='",
            "&#",
        ] {
            let html = unit.repeat(200_000);
            let _ = to_text(&html); // quadratic work would not finish
        }
    }

    #[test]
    fn tolerates_broken_markup() {
        assert_eq!(to_text("a < b and c > d"), "a < b and c > d");
        assert_eq!(to_text("<p title='x>y'>quoted</p>"), "quoted");
        assert_eq!(to_text("<p>unclosed <b"), "unclosed");
        assert_eq!(to_text("<script>never closed"), "");
        assert_eq!(to_text("text <!-- open comment"), "text");
        assert_eq!(
            to_text("<html><head><title>x</title><body>body text"),
            "body text"
        );
        assert_eq!(to_text("<head><meta charset=utf-8>visible"), "visible");
        assert_eq!(to_text("ünïcödé <i>ok</i> 日本"), "ünïcödé ok 日本");
        assert_eq!(to_text("<head>x<body>y</head>z"), "yz");
        assert_eq!(title("<title> </title>"), None);
        assert_eq!(title("<p>no title</p>"), None);
    }
}
