//! `mcp_servers`, both phases: the MCP (Model Context Protocol) servers the
//! kernel starts and supervises, whose tools agents name as `mcp:<server>`.
//!
//! ```json
//! "mcp_servers": {
//!   "fs":  { "command": ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/tmp/x"],
//!            "env": { "TOKEN": "${GITHUB_TOKEN}" }, "cwd": "work",
//!            "timeout_seconds": 60, "startup_timeout_seconds": 30,
//!            "restart": { "policy": "permanent", "max_restarts": 5, "within_seconds": 60,
//!                         "backoff_ms": [500, 30000] },
//!            "tools": { "include": ["read_*", "list_*"], "exclude": ["*_write"] },
//!            "enabled": true, "max_output_bytes": 1048576 },
//!   "web": { "url": "http://127.0.0.1:3001/mcp",
//!            "headers": { "Authorization": "Bearer ${API_TOKEN}" } }
//! }
//! ```
//!
//! `${NAME}` in `command`, `env` values, `url` and header values is replaced
//! by the kernel's environment variable when the config is loaded, so secrets
//! stay out of the file.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hivekernel_agents::mcp::check_server_name;
use hivekernel_agents::text::{glob_matches as matches, shown};
use hivekernel_agents::{RestartPolicy, RestartSpec};
use serde::Deserialize;
use serde_json::Value;

use super::parse::{Section, section};
use super::validate::{Context, in_range, resolve_program};
use super::{ConfigIssue, at};
use crate::command::{MAX_ARGS, MAX_ENV};

/// One MCP server the kernel runs (an entry of `mcp_servers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServerSpec {
    /// The key in `mcp_servers`, what `mcp:<server>` names (rule: `check_server_name`).
    pub name: String,
    /// How the kernel reaches it; `${NAME}` references already expanded.
    pub transport: McpTransport,
    /// Limit on one tool call (`timeout_seconds`, 1..=86_400).
    pub call_timeout: Duration,
    /// Limit on starting it, the handshake and the first tool list included
    /// (`startup_timeout_seconds`, 1..=3_600).
    pub startup_timeout: Duration,
    /// When it is restarted; defaults: permanent, 5 restarts within 60 s,
    /// backoff 500 ms to 30 s.
    pub restart: RestartSpec,
    /// Which of its tools agents are offered.
    pub tools: McpToolFilter,
    /// A disabled server is kept in the list but never started.
    pub enabled: bool,
    /// Largest JSON-RPC message accepted from it, in bytes (4 KiB..=256 MiB).
    pub max_output_bytes: usize,
}

/// How the kernel talks to an MCP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on its stdin and stdout (`command`).
    Stdio {
        /// Program and arguments; a relative program path with a `/` is
        /// resolved against the config file's directory, a bare name is
        /// looked up in PATH when it starts.
        command: Vec<String>,
        /// Variables added to the kernel's environment.
        env: BTreeMap<String, String>,
        /// Working directory, resolved against the config file's directory;
        /// `None`: the kernel's.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP (`url`).
    Http {
        /// An `http://` or `https://` endpoint.
        url: String,
        /// Headers sent with every request (authorization, typically).
        headers: BTreeMap<String, String>,
    },
}

/// Which tools of a server agents are offered (`tools`): globs where `*` is
/// any run of characters and `?` one character.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McpToolFilter {
    /// A tool must match one of these; empty: every tool.
    pub include: Vec<String>,
    /// A tool matching any of these is left out, even when included.
    pub exclude: Vec<String>,
}

impl McpToolFilter {
    /// Whether agents are offered the tool named `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        let included = self.include.is_empty() || self.include.iter().any(|g| matches(g, tool));
        included && !self.exclude.iter().any(|g| matches(g, tool))
    }
}

const DEFAULT_CALL_TIMEOUT_SECONDS: u64 = 60;
const DEFAULT_STARTUP_TIMEOUT_SECONDS: u64 = 30;
const DEFAULT_MAX_OUTPUT_BYTES: u64 = 4 << 20;
/// Longest element of `command`, in bytes.
const MAX_ARG_BYTES: usize = 4096;
/// Longest glob in `tools`, in bytes.
const MAX_GLOB_BYTES: usize = 128;

/// What an MCP server's `restart` fields default to: a server is a
/// long-lived service, so it comes back unless it keeps failing.
fn default_restart() -> RestartSpec {
    RestartSpec {
        policy: RestartPolicy::Permanent,
        max_restarts: 5,
        within_seconds: 60,
        backoff_ms: [500, 30_000],
    }
}

/// One entry of `mcp_servers` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawServer {
    command: Option<Vec<String>>,
    env: Option<BTreeMap<String, String>>,
    cwd: Option<String>,
    url: Option<String>,
    headers: Option<BTreeMap<String, String>>,
    timeout_seconds: u64,
    startup_timeout_seconds: u64,
    restart: Option<Value>,
    tools: Option<Value>,
    enabled: bool,
    max_output_bytes: u64,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            command: None,
            env: None,
            cwd: None,
            url: None,
            headers: None,
            timeout_seconds: DEFAULT_CALL_TIMEOUT_SECONDS,
            startup_timeout_seconds: DEFAULT_STARTUP_TIMEOUT_SECONDS,
            restart: None,
            tools: None,
            enabled: true,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

/// `tools` of a server as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawTools {
    include: Vec<String>,
    exclude: Vec<String>,
}

/// Parses and checks `mcp_servers`; `lookup` reads an environment variable.
/// The servers come sorted by name, disabled ones included.
pub(super) fn servers(
    value: Option<&Value>,
    checks: &Context<'_>,
    lookup: &dyn Fn(&str) -> Option<String>,
    issues: &mut Vec<ConfigIssue>,
) -> Vec<McpServerSpec> {
    let map = match value {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Object(map)) => map,
        Some(_) => {
            let message = "expected a JSON object of server name -> server settings";
            issues.push(ConfigIssue::new("mcp_servers", message));
            return Vec::new();
        }
    };
    let mut servers: Vec<McpServerSpec> = map
        .iter()
        .map(|(name, settings)| {
            Server::new(name, checks, lookup, issues).check(name, settings, issues)
        })
        .collect();
    servers.sort_by(|a, b| a.name.cmp(&b.name));
    servers
}

/// The checks of one server, which all share its label and the lookup.
struct Server<'a> {
    checks: &'a Context<'a>,
    lookup: &'a dyn Fn(&str) -> Option<String>,
    /// `mcp_servers.fs`, or `mcp_servers["bad name"]` (quoted, cut) when the name breaks the rule.
    label: String,
}

impl<'a> Server<'a> {
    /// The checks of the server called `name`; a name that breaks the rule is an issue.
    fn new(
        name: &str,
        checks: &'a Context<'a>,
        lookup: &'a dyn Fn(&str) -> Option<String>,
        issues: &mut Vec<ConfigIssue>,
    ) -> Self {
        let label = match check_server_name(name) {
            Ok(()) => at("mcp_servers", name),
            Err(problem) => {
                let label = format!("mcp_servers[{}]", shown(name));
                issues.push(ConfigIssue::new(&label, problem));
                label
            }
        };
        Server {
            checks,
            lookup,
            label,
        }
    }

    /// Checks the server's fields and builds its spec (used only if no issue was found).
    fn check(&self, name: &str, value: &Value, issues: &mut Vec<ConfigIssue>) -> McpServerSpec {
        let fields = section::<RawServer>(Some(value), &self.label, issues);
        let transport = self.transport(&fields, issues);
        let raw = &fields.value;
        let loc = |field: &str| at(&self.label, field);
        in_range(
            raw.timeout_seconds,
            1..=86_400,
            &loc("timeout_seconds"),
            issues,
        );
        in_range(
            raw.startup_timeout_seconds,
            1..=3_600,
            &loc("startup_timeout_seconds"),
            issues,
        );
        in_range(
            raw.max_output_bytes,
            4 << 10..=256 << 20,
            &loc("max_output_bytes"),
            issues,
        );
        let restart = super::supervision::restart_over(
            raw.restart.as_ref(),
            default_restart(),
            false,
            &loc("restart"),
            issues,
        );
        McpServerSpec {
            name: name.to_owned(),
            transport,
            call_timeout: Duration::from_secs(raw.timeout_seconds),
            startup_timeout: Duration::from_secs(raw.startup_timeout_seconds),
            restart,
            tools: tool_filter(raw.tools.as_ref(), &loc("tools"), issues),
            enabled: raw.enabled,
            max_output_bytes: usize::try_from(raw.max_output_bytes).unwrap_or(usize::MAX),
        }
    }

    /// The transport: `command` (stdio) or `url` (HTTP), exactly one, each
    /// with only its own fields. Every field given is checked even when the
    /// choice is wrong, so every mistake shows at once; the transport
    /// returned then is a placeholder, unused.
    fn transport(
        &self,
        fields: &Section<RawServer>,
        issues: &mut Vec<ConfigIssue>,
    ) -> McpTransport {
        let raw = &fields.value;
        let stdio = match (&raw.command, &raw.url) {
            (Some(_), Some(_)) => {
                let message = "give either command (a stdio server) or url (an HTTP server), \
                               not both";
                issues.push(ConfigIssue::new(&self.label, message));
                None
            }
            (None, None) if fields.is_ok("command") && fields.is_ok("url") => {
                let message = "missing: give command (a stdio server) or url (an HTTP server)";
                issues.push(ConfigIssue::new(&self.label, message));
                None
            }
            (Some(_), None) => Some(true),
            (None, Some(_)) => Some(false),
            // A `command` or `url` of the wrong type, already reported.
            (None, None) => None,
        };
        let command = raw.command.as_deref().map(|c| self.command(c, issues));
        let env = raw.env.as_ref().map(|env| self.env(env, issues));
        let cwd_at = at(&self.label, "cwd");
        let cwd = raw.cwd.as_deref();
        let cwd = cwd.and_then(|cwd| self.checks.path_field(cwd, &cwd_at, issues));
        let url = raw.url.as_deref().map(|url| self.url(url, issues));
        let headers = raw.headers.as_ref().map(|h| self.headers(h, issues));
        let mut only_with = |field: &str, given: bool, needs: &str| {
            if given {
                let message = format!("{field} is only for a server with {needs}");
                issues.push(ConfigIssue::new(at(&self.label, field), message));
            }
        };
        match stdio {
            Some(true) => only_with("headers", headers.is_some(), "url (HTTP)"),
            Some(false) => {
                only_with("env", env.is_some(), "command (stdio)");
                only_with("cwd", raw.cwd.is_some(), "command (stdio)");
            }
            None => {}
        }
        match url {
            Some(url) if stdio == Some(false) => McpTransport::Http {
                url,
                headers: headers.unwrap_or_default(),
            },
            _ => McpTransport::Stdio {
                command: command.unwrap_or_default(),
                env: env.unwrap_or_default(),
                cwd,
            },
        }
    }

    /// `text` with its `${NAME}` references expanded; each problem an issue at `location`.
    fn expand(&self, text: &str, location: &str, issues: &mut Vec<ConfigIssue>) -> String {
        match expand(text, self.lookup) {
            Ok(text) => text,
            Err(problems) => {
                for problem in problems {
                    issues.push(ConfigIssue::new(location, problem));
                }
                text.to_owned()
            }
        }
    }

    /// `command`: a program and its arguments. Values are never quoted in
    /// messages: they may hold an expanded secret.
    fn command(&self, argv: &[String], issues: &mut Vec<ConfigIssue>) -> Vec<String> {
        let location = at(&self.label, "command");
        if argv.is_empty() {
            let message = "must not be empty: give the program and its arguments";
            issues.push(ConfigIssue::new(location, message));
            return Vec::new();
        }
        if argv.len() > MAX_ARGS {
            let message = format!("has {} elements, at most {MAX_ARGS}", argv.len());
            issues.push(ConfigIssue::new(&location, message));
        }
        let mut expanded = Vec::with_capacity(argv.len());
        for (i, arg) in argv.iter().enumerate() {
            let here = format!("{location}[{i}]");
            let arg = self.expand(arg, &here, issues);
            if arg.contains('\0') {
                issues.push(ConfigIssue::new(here, "contains a NUL byte"));
            } else if arg.len() > MAX_ARG_BYTES {
                let message = format!("is {} bytes long, at most {MAX_ARG_BYTES}", arg.len());
                issues.push(ConfigIssue::new(here, message));
            } else if i == 0 && arg.is_empty() {
                let message = "the program must not be empty";
                issues.push(ConfigIssue::new(here, message));
            }
            expanded.push(arg);
        }
        if let Some(program) = expanded.first_mut() {
            resolve_program(program, &self.checks.absolute_base());
        }
        expanded
    }

    /// `env`: variables the stdio server gets on top of the kernel's.
    fn env(
        &self,
        env: &BTreeMap<String, String>,
        issues: &mut Vec<ConfigIssue>,
    ) -> BTreeMap<String, String> {
        let location = at(&self.label, "env");
        if env.len() > MAX_ENV {
            let message = format!("has {} variables, at most {MAX_ENV}", env.len());
            issues.push(ConfigIssue::new(&location, message));
        }
        let mut expanded = BTreeMap::new();
        for (key, value) in env {
            let here = at(&location, key);
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                let message = format!(
                    "{} is not a variable name (not empty, no '=' and no NUL)",
                    shown(key)
                );
                issues.push(ConfigIssue::new(&here, message));
            }
            let value = self.expand(value, &here, issues);
            if value.contains('\0') {
                issues.push(ConfigIssue::new(&here, "the value contains a NUL byte"));
            }
            expanded.insert(key.clone(), value);
        }
        expanded
    }

    /// `url`: an `http://` or `https://` endpoint with a host.
    fn url(&self, written: &str, issues: &mut Vec<ConfigIssue>) -> String {
        let location = at(&self.label, "url");
        let url = self.expand(written, &location, issues);
        if let Some(problem) = super::url_problem(&url, "https://mcp.example.com/mcp") {
            // The expanded URL may hold a secret: quote what was written.
            let problem = if url == written {
                problem.replacen(&format!("{url:?}"), &shown(&url), 1)
            } else {
                let expanded = format!("{} (expanded)", shown(written));
                problem.replacen(&format!("{url:?}"), &expanded, 1)
            };
            issues.push(ConfigIssue::new(location, problem));
        }
        url
    }

    /// `headers`: names HTTP tokens, values free of control characters but tabs.
    fn headers(
        &self,
        headers: &BTreeMap<String, String>,
        issues: &mut Vec<ConfigIssue>,
    ) -> BTreeMap<String, String> {
        let location = at(&self.label, "headers");
        let mut expanded = BTreeMap::new();
        for (name, value) in headers {
            let here = at(&location, name);
            if !is_token(name) {
                let message = format!(
                    "{} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~)",
                    shown(name)
                );
                issues.push(ConfigIssue::new(&here, message));
            }
            let value = self.expand(value, &here, issues);
            if value.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
                let message = "the value contains a control character (CR, LF, NUL, ...)";
                issues.push(ConfigIssue::new(&here, message));
            }
            expanded.insert(name.clone(), value);
        }
        expanded
    }
}

/// Whether `name` is an HTTP token (RFC 9110), what a header name must be.
fn is_token(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Parses and checks a server's `tools`.
fn tool_filter(
    value: Option<&Value>,
    location: &str,
    issues: &mut Vec<ConfigIssue>,
) -> McpToolFilter {
    let raw = section::<RawTools>(value, location, issues).value;
    for (field, globs) in [("include", &raw.include), ("exclude", &raw.exclude)] {
        for (i, glob) in globs.iter().enumerate() {
            if glob.is_empty() || glob.len() > MAX_GLOB_BYTES {
                issues.push(ConfigIssue::new(
                    format!("{location}.{field}[{i}]"),
                    format!(
                        "a glob must be 1 to {MAX_GLOB_BYTES} bytes, got {} bytes",
                        glob.len()
                    ),
                ));
            }
        }
    }
    McpToolFilter {
        include: raw.include,
        exclude: raw.exclude,
    }
}

/// `text` with each `${NAME}` replaced by `lookup(NAME)` (NAME: letters,
/// digits and `_`, not starting with a digit) and each `$$` by `$`; a `$`
/// before anything else stays as it is. Every variable `lookup` does not
/// know and every malformed reference is a problem.
pub(super) fn expand(
    text: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<String, Vec<String>> {
    let mut expanded = String::with_capacity(text.len());
    let mut problems = Vec::new();
    let mut rest = text;
    while let Some(dollar) = rest.find('$') {
        expanded.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            expanded.push('$');
            rest = tail;
            continue;
        }
        let Some(reference) = after.strip_prefix('{') else {
            expanded.push('$');
            rest = after;
            continue;
        };
        let Some(end) = reference.find('}') else {
            problems.push(format!(
                "\"${{\" without a closing \"}}\" in {} (write $$ for a literal $)",
                shown(text)
            ));
            rest = "";
            break;
        };
        let name = &reference[..end];
        rest = &reference[end + 1..];
        if !super::model::is_env_name(name) {
            problems.push(format!(
                "${{{}}} does not name an environment variable (letters, digits and _, \
                 not starting with a digit)",
                hivekernel_agents::text::prefix(name, 64)
            ));
            continue;
        }
        match lookup(name) {
            Some(value) => expanded.push_str(&value),
            None => problems.push(format!("environment variable {name} is not set")),
        }
    }
    expanded.push_str(rest);
    if problems.is_empty() {
        Ok(expanded)
    } else {
        Err(problems)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn globs_match_runs_single_characters_and_literals() {
        let cases = [
            ("*", "", true),
            ("*", "anything", true),
            ("read_*", "read_file", true),
            ("read_*", "read_", true),
            ("read_*", "write_file", false),
            ("*_write", "file_write", true),
            ("*_write", "file_write_x", false),
            ("?at", "cat", true),
            ("?at", "at", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYc_", false),
            ("*b", "*xb", true),
            ("a.b", "a.b", true),
            ("a.b", "aXb", false),
            ("", "", true),
            ("", "x", false),
            ("é?", "éü", true),
            ("**a**", "bab", true),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(matches(pattern, text), expected, "{pattern:?} ~ {text:?}");
        }
    }

    #[test]
    fn a_long_text_against_many_stars_stays_fast() {
        let text = "a".repeat(10_000);
        assert!(!matches("*a*a*a*a*a*a*a*a*a*a*b", &text));
    }

    #[test]
    fn a_filter_includes_then_excludes() {
        let all = McpToolFilter::default();
        assert!(all.allows("anything"));
        let filter = McpToolFilter {
            include: vec!["read_*".into(), "list_*".into()],
            exclude: vec!["*_secret".into()],
        };
        assert!(filter.allows("read_file") && filter.allows("list_dir"));
        assert!(!filter.allows("write_file") && !filter.allows("read_secret"));
        let only_out = McpToolFilter {
            include: vec![],
            exclude: vec!["delete_?".into()],
        };
        assert!(only_out.allows("delete_all") && !only_out.allows("delete_x"));
    }

    #[test]
    fn env_references_expand_through_the_lookup() {
        let lookup = |name: &str| match name {
            "X" => Some("1".to_owned()),
            "EMPTY" => Some(String::new()),
            _ => None,
        };
        let expand = |text: &str| expand(text, lookup);
        assert_eq!(expand("a ${X} b").unwrap(), "a 1 b");
        assert_eq!(expand("${X}${X}${EMPTY}").unwrap(), "11");
        assert_eq!(expand("$$").unwrap(), "$");
        assert_eq!(expand("$$${X}").unwrap(), "$1");
        assert_eq!(expand("$${X}").unwrap(), "${X}");
        assert_eq!(expand("$HOME costs 5$").unwrap(), "$HOME costs 5$");
        assert_eq!(expand("no references").unwrap(), "no references");
        assert_eq!(
            expand("${A}-${X}-${B_2}").unwrap_err(),
            [
                "environment variable A is not set",
                "environment variable B_2 is not set"
            ]
        );
        let problems = expand("${X").unwrap_err();
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("without a closing"), "{problems:?}");
        for bad in ["${}", "${1X}", "${A-B}"] {
            let problems = expand(bad).unwrap_err();
            assert!(
                problems[0].contains("does not name an environment variable"),
                "{bad}: {problems:?}"
            );
        }
    }
}
