//! Reading and checking a `SKILL.md`.
//!
//! [`read`] parses and checks one skill directory and says what is wrong
//! with it, each finding naming its file and field. The same checks serve
//! two strictnesses ([`Strictness`]): loading at start is lenient (a name
//! that breaks the rules is a warning; only an unreadable file, unparseable
//! frontmatter or a missing description skips the skill), checking and
//! writing are strict (every rule of the format is an error, unknown
//! top-level fields included). docs/SKILLS.md lists the rules.

use std::fmt;
use std::path::{Path, PathBuf};

use yaml_rust2::parser::{Event, EventReceiver, Parser};
use yaml_rust2::{Yaml, YamlLoader};

use super::Skill;

/// The file a skill directory must hold.
pub const SKILL_FILE: &str = "SKILL.md";
/// Longest name, in characters.
pub const MAX_NAME: usize = 64;
/// Longest description, in characters.
pub const MAX_DESCRIPTION: usize = 1024;
/// Longest `compatibility`, in characters.
pub const MAX_COMPATIBILITY: usize = 500;
/// Largest `SKILL.md`, in bytes: more is refused unread.
pub const MAX_FILE_BYTES: u64 = 256 * 1024;
/// Longest body, in characters, before a warning: about 5,000 tokens, what
/// the format recommends for the instructions loaded on activation.
pub const LONG_BODY: usize = 20_000;
/// The top-level frontmatter fields the format defines.
pub const FIELDS: [&str; 6] = [
    "name",
    "description",
    "license",
    "compatibility",
    "metadata",
    "allowed-tools",
];

/// How hard [`read`] is on a skill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// Loading: keep every skill that can be used, warn about the rest.
    Lenient,
    /// Checking and writing: every rule of the format must hold.
    Strict,
}

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The skill is usable as it is.
    Warning,
    /// The skill breaks the format (and, loading, is skipped when it
    /// cannot be used at all).
    Error,
}

/// One thing wrong with a skill.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    /// The file it is about.
    pub file: PathBuf,
    /// The frontmatter field it is about, if one.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let severity = match self.severity {
            Severity::Warning => "warning",
            Severity::Error => "error",
        };
        write!(f, "{}: {severity}", self.file.display())?;
        if let Some(field) = &self.field {
            write!(f, ": {field}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// What [`read`] made of a skill directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    /// The skill, unless it cannot be used at this strictness.
    pub skill: Option<Skill>,
    pub findings: Vec<Finding>,
}

impl Read {
    /// Whether any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }
}

/// The text of a skill's `SKILL.md`, which must be a regular file in its
/// directory: a symbolic link is refused (it could lead a loader that
/// reads skills from an agent's workspace to any file the kernel may
/// read), and the file is opened without following one, so it cannot be
/// swapped for one between a check and the read.
fn read_file(file: &Path) -> Result<String, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(file);
    let handle = match opened {
        Ok(handle) => handle,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("missing: a skill directory holds a {SKILL_FILE}"));
        }
        Err(_) if std::fs::symlink_metadata(file).is_ok_and(|m| m.file_type().is_symlink()) => {
            return Err(format!(
                "{SKILL_FILE} is a symbolic link: a skill's files must be in its own directory"
            ));
        }
        Err(err) => return Err(format!("cannot read it: {err}")),
    };
    let meta = handle
        .metadata()
        .map_err(|err| format!("cannot read it: {err}"))?;
    if !meta.is_file() {
        return Err(format!("{SKILL_FILE} is not a regular file"));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(format!(
            "{SKILL_FILE} is {} bytes, more than the {MAX_FILE_BYTES} allowed",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    handle
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("cannot read it: {err}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{SKILL_FILE} is more than the {MAX_FILE_BYTES} bytes allowed"
        ));
    }
    String::from_utf8(bytes).map_err(|err| format!("cannot read it: not UTF-8 text ({err})"))
}

/// Reads and checks the skill in `dir`.
pub fn read(dir: &Path, strictness: Strictness) -> Read {
    let file = dir.join(SKILL_FILE);
    let text = read_file(&file);
    let mut checker = Checker {
        file,
        strictness,
        findings: Vec::new(),
    };
    let skill = match text {
        Ok(text) => checker.skill(dir, &text),
        Err(message) => {
            checker.error(None, message);
            None
        }
    };
    Read {
        skill,
        findings: checker.findings,
    }
}

/// Parses `text` as the `SKILL.md` of a skill in `dir`, checking it.
pub fn parse(dir: &Path, text: &str, strictness: Strictness) -> Read {
    let mut checker = Checker {
        file: dir.join(SKILL_FILE),
        strictness,
        findings: Vec::new(),
    };
    let skill = checker.skill(dir, text);
    Read {
        skill,
        findings: checker.findings,
    }
}

/// Splits a `SKILL.md` into its frontmatter and body: the file starts
/// with a `---` line and the frontmatter ends at the next `---` (or `...`)
/// line.
fn split(text: &str) -> Result<(&str, &str), String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or_default();
    if first.trim_end() != "---" {
        return Err("must start with YAML frontmatter: a first line of `---`".to_owned());
    }
    let start = first.len();
    let mut at = start;
    for line in lines {
        if matches!(line.trim_end(), "---" | "...") {
            return Ok((&text[start..at], &text[at + line.len()..]));
        }
        at += line.len();
    }
    Err("the frontmatter is not closed: no `---` line after it".to_owned())
}

struct Checker {
    file: PathBuf,
    strictness: Strictness,
    findings: Vec<Finding>,
}

impl Checker {
    fn error(&mut self, field: Option<&str>, message: String) {
        self.push(Severity::Error, field, message);
    }

    /// An error when strict, a warning when lenient.
    fn rule(&mut self, field: Option<&str>, message: String) {
        let severity = match self.strictness {
            Strictness::Strict => Severity::Error,
            Strictness::Lenient => Severity::Warning,
        };
        self.push(severity, field, message);
    }

    fn push(&mut self, severity: Severity, field: Option<&str>, message: String) {
        self.findings.push(Finding {
            severity,
            file: self.file.clone(),
            field: field.map(str::to_owned),
            message,
        });
    }

    fn skill(&mut self, dir: &Path, text: &str) -> Option<Skill> {
        let (front, body) = match split(text) {
            Ok(parts) => parts,
            Err(message) => {
                self.error(None, message);
                return None;
            }
        };
        let fields = self.frontmatter(front)?;
        let mut skill = Skill {
            name: String::new(),
            description: String::new(),
            license: None,
            compatibility: None,
            allowed_tools: Vec::new(),
            metadata: Vec::new(),
            extra: Vec::new(),
            body: body.trim().to_owned(),
            dir: dir.to_path_buf(),
        };
        let mut usable = true;
        for (key, value) in &fields {
            let Some(key) = key.as_str() else {
                self.error(
                    None,
                    format!("a frontmatter key is not text: {}", shown(key)),
                );
                usable &= self.strictness == Strictness::Lenient;
                continue;
            };
            match key {
                "name" => skill.name = self.text(key, value).unwrap_or_default(),
                "description" => skill.description = self.text(key, value).unwrap_or_default(),
                "license" => skill.license = self.text(key, value),
                "compatibility" => skill.compatibility = self.text(key, value),
                "metadata" => skill.metadata = self.metadata(value),
                "allowed-tools" => skill.allowed_tools = self.tools(value),
                _ => {
                    self.rule(
                        Some(key),
                        format!(
                            "not a field of the format (known: {}); kept as is",
                            FIELDS.join(", ")
                        ),
                    );
                    skill.extra.push((key.to_owned(), json(value)));
                }
            }
        }
        usable &= self.name(dir, &skill.name);
        usable &= self.description(&skill.description);
        if let Some(compatibility) = &skill.compatibility {
            let chars = compatibility.chars().count();
            if chars == 0 || chars > MAX_COMPATIBILITY {
                self.rule(
                    Some("compatibility"),
                    format!("must be 1 to {MAX_COMPATIBILITY} characters, is {chars}"),
                );
            }
        }
        let body_chars = skill.body.chars().count();
        if body_chars > LONG_BODY {
            self.push(
                Severity::Warning,
                None,
                format!(
                    "the body is {body_chars} characters; the format recommends under about \
                     {LONG_BODY} (5,000 tokens), with details moved to references/"
                ),
            );
        }
        let usable = usable && !(self.strictness == Strictness::Strict && self.any_error());
        usable.then_some(skill)
    }

    fn any_error(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// The frontmatter as a mapping, or `None` (with an error) when it is not one.
    fn frontmatter(&mut self, front: &str) -> Option<Vec<(Yaml, Yaml)>> {
        // The loader copies an alias's whole node, so a few hundred bytes
        // of nested aliases would expand to billions of nodes.
        if has_aliases(front) {
            self.error(
                None,
                "anchors and aliases (`&name`, `*name`) are not read in skill frontmatter: \
                 write each value out"
                    .to_owned(),
            );
            return None;
        }
        let parsed = match YamlLoader::load_from_str(front) {
            Ok(docs) => docs,
            Err(err) => match self.strictness {
                // Written for another client: values with an unquoted `: `.
                Strictness::Lenient => match YamlLoader::load_from_str(&quoted(front)) {
                    Ok(docs) => {
                        self.push(
                            Severity::Warning,
                            None,
                            format!("invalid YAML ({err}); read with its values quoted"),
                        );
                        docs
                    }
                    Err(_) => {
                        self.error(None, format!("invalid YAML in the frontmatter: {err}"));
                        return None;
                    }
                },
                Strictness::Strict => {
                    self.error(None, format!("invalid YAML in the frontmatter: {err}"));
                    return None;
                }
            },
        };
        match parsed.into_iter().next() {
            Some(Yaml::Hash(hash)) => Some(hash.into_iter().collect()),
            Some(other) => {
                self.error(
                    None,
                    format!("the frontmatter must be a mapping, not {}", kind(&other)),
                );
                None
            }
            None => {
                self.error(None, "the frontmatter is empty".to_owned());
                None
            }
        }
    }

    /// A text field's value: any scalar, as its text.
    fn text(&mut self, field: &str, value: &Yaml) -> Option<String> {
        match scalar(value) {
            Some(text) => Some(text),
            None if matches!(value, Yaml::Null) => None,
            None => {
                self.error(Some(field), format!("must be text, not {}", kind(value)));
                None
            }
        }
    }

    fn metadata(&mut self, value: &Yaml) -> Vec<(String, String)> {
        let Yaml::Hash(hash) = value else {
            if !matches!(value, Yaml::Null) {
                self.rule(
                    Some("metadata"),
                    format!("must be a mapping of text to text, not {}", kind(value)),
                );
            }
            return Vec::new();
        };
        let mut pairs = Vec::with_capacity(hash.len());
        for (key, value) in hash {
            match (scalar(key), scalar(value)) {
                (Some(key), Some(value)) => pairs.push((key, value)),
                (text, _) => self.rule(
                    Some("metadata"),
                    format!(
                        "the entry {} must map text to text",
                        text.as_deref()
                            .map_or_else(|| kind(key).to_owned(), shown_str)
                    ),
                ),
            }
        }
        pairs
    }

    fn tools(&mut self, value: &Yaml) -> Vec<String> {
        match value {
            Yaml::Array(items) => {
                let tools: Vec<String> = items.iter().filter_map(scalar).collect();
                if tools.len() != items.len() {
                    self.rule(
                        Some("allowed-tools"),
                        "list items must all be text".to_owned(),
                    );
                }
                tools
            }
            Yaml::Null => Vec::new(),
            other => match scalar(other) {
                Some(text) => text.split_whitespace().map(str::to_owned).collect(),
                None => {
                    self.rule(
                        Some("allowed-tools"),
                        format!("must be text or a list of text, not {}", kind(other)),
                    );
                    Vec::new()
                }
            },
        }
    }

    /// Checks the name; false when the skill has none to be known by.
    fn name(&mut self, dir: &Path, name: &str) -> bool {
        let field = Some("name");
        if name.trim().is_empty() {
            self.error(field, "missing: every skill has a name".to_owned());
            return false;
        }
        let chars = name.chars().count();
        if chars > MAX_NAME {
            self.rule(
                field,
                format!(
                    "{} is {chars} characters, more than {MAX_NAME}",
                    shown_str(name)
                ),
            );
        }
        if name.to_lowercase() != name {
            self.rule(field, format!("{} must be lowercase", shown_str(name)));
        }
        if name.starts_with('-') || name.ends_with('-') {
            self.rule(
                field,
                format!("{} must not start or end with a hyphen", shown_str(name)),
            );
        }
        if name.contains("--") {
            self.rule(
                field,
                format!("{} must not contain consecutive hyphens", shown_str(name)),
            );
        }
        if !name.chars().all(|c| c.is_alphanumeric() || c == '-') {
            self.rule(
                field,
                format!(
                    "{} may hold only letters, digits and hyphens",
                    shown_str(name)
                ),
            );
        }
        let dir_name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        if dir_name.as_deref() != Some(name) {
            self.rule(
                field,
                format!(
                    "{} must match its directory's name ({})",
                    shown_str(name),
                    dir_name
                        .as_deref()
                        .map_or_else(|| "none".to_owned(), shown_str)
                ),
            );
        }
        true
    }

    /// Checks the description; false when it is missing (the skill cannot
    /// be offered without one).
    fn description(&mut self, description: &str) -> bool {
        let field = Some("description");
        if description.trim().is_empty() {
            self.error(
                field,
                "missing: a skill is offered to agents by its description".to_owned(),
            );
            return false;
        }
        let chars = description.chars().count();
        if chars > MAX_DESCRIPTION {
            self.rule(
                field,
                format!("is {chars} characters, more than {MAX_DESCRIPTION}"),
            );
        }
        true
    }
}

/// The frontmatter with every top-level value that is a plain, unquoted
/// scalar wrapped in single quotes: what the format's guide suggests for
/// files other clients accept (`description: Use when: ...`).
fn quoted(front: &str) -> String {
    let mut out = String::with_capacity(front.len() + 32);
    for line in front.split_inclusive('\n') {
        let starts_key = line
            .chars()
            .next()
            .is_some_and(|c| !c.is_whitespace() && c != '#');
        match line.split_once(": ") {
            Some((key, value))
                if starts_key
                    && !key.contains(' ')
                    && !value.trim().is_empty()
                    && !value
                        .trim_start()
                        .starts_with(['\'', '"', '|', '>', '[', '{', '&', '*']) =>
            {
                let value = value.trim_end_matches(['\n', '\r']);
                out.push_str(key);
                out.push_str(": '");
                out.push_str(&value.trim().replace('\'', "''"));
                out.push_str("'\n");
            }
            _ => out.push_str(line),
        }
    }
    out
}

/// A scalar's text; `None` for a mapping, a list or null.
/// Whether the YAML in `text` uses an alias; text that does not parse has
/// none (the loader reports it).
fn has_aliases(text: &str) -> bool {
    struct Aliases(bool);
    impl EventReceiver for Aliases {
        fn on_event(&mut self, event: Event) {
            self.0 |= matches!(event, Event::Alias(_));
        }
    }
    let mut found = Aliases(false);
    let _ = Parser::new_from_str(text).load(&mut found, true);
    found.0
}

fn scalar(value: &Yaml) -> Option<String> {
    match value {
        Yaml::String(text) | Yaml::Real(text) => Some(text.clone()),
        Yaml::Integer(n) => Some(n.to_string()),
        Yaml::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}

fn kind(value: &Yaml) -> &'static str {
    match value {
        Yaml::Real(_) => "a number",
        Yaml::Integer(_) => "an integer",
        Yaml::String(_) => "text",
        Yaml::Boolean(_) => "a boolean",
        Yaml::Array(_) => "a list",
        Yaml::Hash(_) => "a mapping",
        Yaml::Alias(_) => "an alias",
        Yaml::Null => "null",
        Yaml::BadValue => "an unreadable value",
    }
}

fn shown(value: &Yaml) -> String {
    scalar(value).map_or_else(|| kind(value).to_owned(), |text| shown_str(&text))
}

fn shown_str(text: &str) -> String {
    crate::text::quoted(text, 80)
}

/// A YAML value as JSON, for fields kept as they are.
fn json(value: &Yaml) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Yaml::String(text) => Value::String(text.clone()),
        Yaml::Real(text) => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.clone()), Value::Number),
        Yaml::Integer(n) => Value::from(*n),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Array(items) => Value::Array(items.iter().map(json).collect()),
        Yaml::Hash(hash) => Value::Object(
            hash.iter()
                .map(|(k, v)| (scalar(k).unwrap_or_default(), json(v)))
                .collect(),
        ),
        Yaml::Alias(_) | Yaml::Null | Yaml::BadValue => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn parsed(dir: &str, text: &str, strictness: Strictness) -> Read {
        parse(Path::new(dir), text, strictness)
    }

    fn messages(read: &Read) -> Vec<String> {
        read.findings.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn a_skill_in_the_format_reads_with_every_field_and_no_findings() {
        let text = "---\nname: pdf-tools\ndescription: Fill PDF forms. Use when a form is named.\n\
                    license: Apache-2.0\ncompatibility: Needs python3\nmetadata:\n  author: ops\n  \
                    version: 1.0\nallowed-tools: shell_exec read_file\n---\n\n# Steps\n\nDo it.\n";
        let read = parsed("skills/pdf-tools", text, Strictness::Strict);
        assert_eq!(messages(&read), Vec::<String>::new());
        let skill = read.skill.unwrap();
        assert_eq!(skill.name, "pdf-tools");
        assert_eq!(
            skill.description,
            "Fill PDF forms. Use when a form is named."
        );
        assert_eq!(skill.license.as_deref(), Some("Apache-2.0"));
        assert_eq!(skill.compatibility.as_deref(), Some("Needs python3"));
        assert_eq!(
            skill.metadata,
            [
                ("author".into(), "ops".into()),
                ("version".into(), "1.0".into())
            ]
        );
        assert_eq!(skill.allowed_tools, ["shell_exec", "read_file"]);
        assert_eq!(skill.body, "# Steps\n\nDo it.");
    }

    #[test]
    fn name_rules_are_warnings_when_loading_and_errors_when_checking() {
        let text = "---\nname: -Bad--Name_\ndescription: d\n---\nbody";
        let lenient = parsed("skills/other", text, Strictness::Lenient);
        assert!(!lenient.has_errors(), "{:?}", messages(&lenient));
        assert!(lenient.skill.is_some());
        let strict = parsed("skills/other", text, Strictness::Strict);
        assert!(strict.skill.is_none());
        let found = messages(&strict).join("\n");
        for rule in [
            "must be lowercase",
            "must not start or end with a hyphen",
            "consecutive hyphens",
            "only letters, digits and hyphens",
            "must match its directory's name (\"other\")",
        ] {
            assert!(found.contains(rule), "{rule} not in {found}");
        }
        assert!(
            found.contains("skills/other/SKILL.md: error: name: "),
            "{found}"
        );
    }

    #[test]
    fn a_missing_description_skips_the_skill_even_when_loading() {
        let read = parsed("s/a", "---\nname: a\n---\nbody", Strictness::Lenient);
        assert!(read.skill.is_none());
        assert_eq!(
            messages(&read),
            [
                "s/a/SKILL.md: error: description: missing: a skill is offered to agents by its \
              description"
            ]
        );
    }

    #[test]
    fn lengths_are_counted_in_characters() {
        let long = "é".repeat(MAX_DESCRIPTION + 1);
        let text = format!("---\nname: a\ndescription: {long}\n---\n");
        let read = parsed("s/a", &text, Strictness::Strict);
        assert_eq!(
            messages(&read),
            ["s/a/SKILL.md: error: description: is 1025 characters, more than 1024"]
        );
        let fits = format!(
            "---\nname: a\ndescription: {}\n---\n",
            "é".repeat(MAX_DESCRIPTION)
        );
        assert!(!parsed("s/a", &fits, Strictness::Strict).has_errors());
        let name = "a".repeat(MAX_NAME + 1);
        let read = parsed(
            &format!("s/{name}"),
            &format!("---\nname: {name}\ndescription: d\n---\n"),
            Strictness::Strict,
        );
        assert!(messages(&read)[0].contains("is 65 characters, more than 64"));
    }

    #[test]
    fn unknown_fields_are_kept_when_loading_and_refused_when_checking() {
        let text = "---\nname: a\ndescription: d\nversion: 2\ntags: [x, y]\n---\n";
        let read = parsed("s/a", text, Strictness::Lenient);
        let skill = read.skill.unwrap();
        assert_eq!(
            skill.extra,
            [
                ("version".to_owned(), serde_json::json!(2)),
                ("tags".to_owned(), serde_json::json!(["x", "y"]))
            ]
        );
        let strict = parsed("s/a", text, Strictness::Strict);
        assert!(strict.skill.is_none());
        assert!(messages(&strict)[0].starts_with("s/a/SKILL.md: error: version: not a field"));
    }

    #[test]
    fn an_unquoted_colon_is_read_when_loading_and_refused_when_checking() {
        let text = "---\nname: a\ndescription: Use this when: the user asks\n---\nbody";
        let read = parsed("s/a", text, Strictness::Lenient);
        assert_eq!(
            read.skill.unwrap().description,
            "Use this when: the user asks"
        );
        assert_eq!(read.findings.len(), 1);
        assert_eq!(read.findings[0].severity, Severity::Warning);
        let strict = parsed("s/a", text, Strictness::Strict);
        assert!(messages(&strict)[0].contains("invalid YAML in the frontmatter"));
    }

    #[test]
    fn malformed_files_are_refused_naming_what_is_wrong() {
        for (text, expected) in [
            ("no frontmatter", "must start with YAML frontmatter"),
            ("---\nname: a\n", "the frontmatter is not closed"),
            ("---\n- a\n- b\n---\n", "must be a mapping, not a list"),
            ("---\n---\n", "the frontmatter is empty"),
            ("---\nname: [a\n---\n", "invalid YAML in the frontmatter"),
            (
                "---\nname: {x: 1}\ndescription: d\n---\n",
                "name: must be text, not a mapping",
            ),
        ] {
            let read = parsed("s/a", text, Strictness::Lenient);
            assert!(read.skill.is_none(), "{text:?} was read");
            let found = messages(&read).join("\n");
            assert!(found.contains(expected), "{text:?}: {found}");
        }
    }

    #[test]
    fn allowed_tools_may_be_a_list_and_metadata_must_map_text_to_text() {
        let text = "---\nname: a\ndescription: d\nallowed-tools: [web_fetch, shell_exec]\n\
                    metadata:\n  ok: yes\n  nested: {x: 1}\n---\n";
        let read = parsed("s/a", text, Strictness::Strict);
        assert_eq!(
            messages(&read),
            ["s/a/SKILL.md: error: metadata: the entry \"nested\" must map text to text"]
        );
        let lenient = parsed("s/a", text, Strictness::Lenient).skill.unwrap();
        assert_eq!(lenient.allowed_tools, ["web_fetch", "shell_exec"]);
        assert_eq!(lenient.metadata, [("ok".to_owned(), "yes".to_owned())]);
    }

    #[test]
    fn aliases_are_refused_before_they_can_expand() {
        let mut bomb = String::from("---\nname: bomb\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..30 {
            let prev = i - 1;
            bomb.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        bomb.push_str("description: d\n---\nbody\n");
        for strictness in [Strictness::Lenient, Strictness::Strict] {
            let read = parsed("bomb", &bomb, strictness);
            assert!(read.skill.is_none());
            assert!(
                messages(&read)[0].contains("anchors and aliases"),
                "{read:?}"
            );
        }
    }

    #[test]
    fn a_directory_without_the_file_or_with_a_huge_one_is_refused_unread() {
        let root = std::env::temp_dir().join(format!("hk-skill-{}", std::process::id()));
        let dir = root.join("big");
        std::fs::create_dir_all(&dir).unwrap();
        let missing = read(&root.join("none"), Strictness::Lenient);
        assert!(messages(&missing)[0].contains("missing: a skill directory holds a SKILL.md"));
        let huge = format!(
            "---\nname: big\ndescription: d\n---\n{}",
            "x".repeat(300_000)
        );
        std::fs::write(dir.join(SKILL_FILE), huge).unwrap();
        let read = read(&dir, Strictness::Lenient);
        assert!(read.skill.is_none());
        assert!(messages(&read)[0].contains("more than the 262144 allowed"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_skill_file_that_is_a_symlink_is_refused_unread() {
        let root = tempfile::tempdir().unwrap();
        let secret = root.path().join("secret.md");
        std::fs::write(
            &secret,
            "---\nname: linked\ndescription: the secret\n---\nsecret\n",
        )
        .unwrap();
        let dir = root.path().join("linked");
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&secret, dir.join(SKILL_FILE)).unwrap();
        let read = read(&dir, Strictness::Lenient);
        assert!(read.skill.is_none());
        let found = messages(&read);
        assert!(found[0].contains("is a symbolic link"), "{found:?}");
        assert!(!found[0].contains("the secret"), "{found:?}");
    }
}
