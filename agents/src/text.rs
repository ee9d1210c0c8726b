//! Cutting text to a size: the one rule every error, event, tool result and
//! prompt in HiveKernel uses, with one marker.
//!
//! A cut text ends in `… [cut: N bytes in all]`, so a reader (a person or a
//! model) sees both that something is missing and how much there was.

/// Bytes of a caller's value that [`shown`] quotes.
pub const SHOWN_BYTES: usize = 64;

/// The longest start of `text` that is at most `max` bytes and ends on a
/// character boundary.
pub fn prefix(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The marker a text cut from `total` bytes ends with.
fn marker(total: usize) -> String {
    format!("… [cut: {total} bytes in all]")
}

/// `text`, or when it is longer than `max` bytes, its start and the marker,
/// together at most `max` bytes (just the start when `max` cannot hold the marker).
///
/// A cut text is a new, right-sized buffer and the long one is freed: a
/// truncated `String` would keep its whole allocation, and cut texts are
/// the ones kept for long (events, transcripts, conversations).
pub fn cut(text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    cut_str(&text, max)
}

/// [`cut`] for a borrowed text.
pub fn cut_str(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let (len, mark) = kept(text, max);
    format!("{}{mark}", &text[..len])
}

/// How many bytes of an over-long `text` a cut to `max` keeps, and the marker after them.
fn kept(text: &str, max: usize) -> (usize, String) {
    let mark = marker(text.len());
    if mark.len() > max {
        return (prefix(text, max).len(), String::new());
    }
    (prefix(text, max - mark.len()).len(), mark)
}

/// Whether `text` matches `glob`: `*` matches any text (also none), `?` one
/// character, anything else itself. Greedy with one backtrack point:
/// linear in practice, never exponential.
pub fn glob_matches(glob: &str, text: &str) -> bool {
    let (glob, text): (Vec<char>, Vec<char>) = (glob.chars().collect(), text.chars().collect());
    let (mut g, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match glob.get(g) {
            Some('*') => {
                star = Some((g, t));
                g += 1;
            }
            Some(c) if *c == '?' || *c == text[t] => {
                g += 1;
                t += 1;
            }
            _ => match star {
                Some((sg, st)) => {
                    g = sg + 1;
                    t = st + 1;
                    star = Some((sg, st + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|c| *c == '*')
}

/// `value` quoted for a message, its start only when it is longer than
/// [`SHOWN_BYTES`], with the marker: a refused value may be megabytes long,
/// and the message goes whole to a model or into a gRPC status header.
pub fn shown(value: &str) -> String {
    quoted(value, SHOWN_BYTES)
}

/// [`shown`] with room for `max` bytes of the value.
pub fn quoted(value: &str, max: usize) -> String {
    if value.len() <= max {
        return format!("{value:?}");
    }
    format!("{:?}{}", prefix(value, max), marker(value.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends_on_a_char_boundary() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("abc", 10), "abc");
        assert_eq!(prefix("é", 0), "");
    }

    #[test]
    fn cut_fits_the_limit_and_says_how_much_there_was() {
        let text = "é".repeat(3000);
        assert_eq!(cut(text.clone(), 6000), text, "short enough: unchanged");
        let out = cut(text, 1000);
        assert!(out.len() <= 1000, "{}", out.len());
        assert!(out.ends_with("… [cut: 6000 bytes in all]"), "{out}");
        assert!(out.starts_with("éé"));
        // Too small for the marker: just the start.
        assert_eq!(cut("abcdef".into(), 3), "abc");
    }

    #[test]
    fn a_cut_text_keeps_no_more_memory_than_it_needs() {
        let cut_text = cut("x".repeat(1 << 20), 4096);
        assert!(cut_text.len() <= 4096);
        assert!(
            cut_text.capacity() < 8192,
            "a 4 KiB cut keeps {} bytes",
            cut_text.capacity()
        );
    }

    #[test]
    fn cut_str_matches_cut() {
        for max in [0, 3, 10, 40, 100, 5000] {
            let text = "ab€".repeat(700);
            assert_eq!(cut_str(&text, max), cut(text.clone(), max), "max {max}");
        }
    }

    #[test]
    fn shown_values_are_quoted_and_cut() {
        assert_eq!(shown("key"), "\"key\"");
        let text = shown(&"é".repeat(100));
        assert!(text.ends_with("\"… [cut: 200 bytes in all]"), "{text}");
        assert!(text.len() < 100, "{text}");
    }
}
