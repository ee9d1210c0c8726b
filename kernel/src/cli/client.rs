//! Connecting to a running kernel: the address, TLS, the admin token, the
//! bearer interceptor, and turning gRPC statuses into [`CliError`]s.

use std::io;
use std::path::Path;
use std::time::Duration;

use hivekernel_proto::v1::FindProcessRequest;
use hivekernel_proto::v1::kernel_client::KernelClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};

use super::{CliError, ClientArgs, Target};
use crate::error::error_chain;
use crate::files::{FileProblem, read_capped};
use crate::tls::{self, TRUST_FILE};

/// Where the kernel listens unless told otherwise.
const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Task outputs can be large; the client should not be the one to refuse them.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The generated client with every request carrying the bearer token.
pub(super) type Client = KernelClient<InterceptedService<Channel, Bearer>>;

/// A connected client, plus what is needed to explain its failures.
/// Cloning shares the connection.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The gRPC client.
    pub(super) client: Client,
    addr: String,
    token_hint: String,
    /// Whether the connection is TLS, for the hints of connection failures.
    secure: bool,
}

impl Session {
    /// Connects to the kernel named by `args` and loads the token.
    pub(super) async fn connect(args: &ClientArgs) -> Result<Session, CliError> {
        // Connect before reading the token: when the kernel is down, "cannot
        // connect" is the real problem even if the token file is missing too.
        let (channel, addr, secure) = connect_channel(args).await?;
        let (token, token_hint) = load_token(
            args.token.as_deref(),
            args.token_file.as_deref(),
            &args.data_dir,
        )?;
        let client = KernelClient::with_interceptor(channel, Bearer::new(&token)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Session {
            client,
            addr,
            token_hint,
            secure,
        })
    }

    /// The PID `target` names: digits as they are, else the process the
    /// kernel finds by that name or path.
    pub(super) async fn pid(&mut self, target: &Target) -> Result<u64, CliError> {
        let text = target.as_str();
        if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
            return text
                .parse()
                .map_err(|_| CliError::Usage(format!("PID {text} is too large")));
        }
        let found = self
            .client
            .find_process(FindProcessRequest {
                target: text.to_owned(),
            })
            .await
            .map_err(|status| self.error(status))?;
        Ok(found.into_inner().pid)
    }

    /// [`Session::pid`] for an optional target; 0 when there is none.
    pub(super) async fn pid_or_zero(&mut self, target: Option<&Target>) -> Result<u64, CliError> {
        match target {
            Some(target) => self.pid(target).await,
            None => Ok(0),
        }
    }

    /// The address of the kernel this session talks to.
    pub(super) fn addr(&self) -> &str {
        &self.addr
    }

    /// The CLI error for a failed call.
    pub(super) fn error(&self, status: Status) -> CliError {
        let message = if status.message().is_empty() {
            status.code().description().to_owned()
        } else {
            status.message().to_owned()
        };
        // Only a status made on this side has a source: the connection
        // failed (a refused TLS handshake shows up here), the kernel said nothing.
        if let Some(source) = std::error::Error::source(&status) {
            let chain = error_chain(source);
            let cause = if chain.contains(&message) {
                chain
            } else {
                format!("{message}: {chain}")
            };
            return connect_error(&self.addr, cause, self.secure);
        }
        match status.code() {
            // Said by the kernel: it is reached, and cannot serve now.
            Code::Unavailable => CliError::Unavailable {
                addr: self.addr.clone(),
                message,
            },
            Code::Unauthenticated => CliError::Unauthenticated {
                message,
                hint: self.token_hint.clone(),
            },
            _ => CliError::Refused(message),
        }
    }
}

/// A connection to the kernel named by `args`, carrying no token: its
/// address as used, and whether it is TLS.
pub(super) async fn connect_channel(
    args: &ClientArgs,
) -> Result<(Channel, String, bool), CliError> {
    let addr = resolve_addr(args);
    let tls = client_tls(args, &addr)?;
    let secure = tls.is_some();
    let mut endpoint = Endpoint::from_shared(addr.clone())
        .map_err(|err| CliError::Usage(format!("invalid kernel address {addr:?}: {err}")))?
        .connect_timeout(CONNECT_TIMEOUT);
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls).map_err(|err| {
            CliError::Usage(format!("TLS settings for {addr}: {}", error_chain(&err)))
        })?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|err| connect_error(&addr, error_chain(&err), secure))?;
    Ok((channel, addr, secure))
}

/// `--addr` (or `HIVEKERNEL_ADDR`), else the address the kernel wrote to its data directory.
fn resolve_addr(args: &ClientArgs) -> String {
    let tls = args.tls_ca.is_some() || args.tls_cert.is_some();
    if let Some(addr) = &args.addr {
        return endpoint_uri(addr, tls);
    }
    match std::fs::read_to_string(args.data_dir.join("kernel.addr")) {
        Ok(addr) if !addr.trim().is_empty() => endpoint_uri(&addr, tls),
        _ => DEFAULT_ADDR.to_owned(),
    }
}

/// Accepts a URL or a bare `host:port`: https when TLS settings are given,
/// else plain-text HTTP/2.
fn endpoint_uri(addr: &str, tls: bool) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        addr.to_owned()
    } else if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}

/// The TLS settings for `addr`: `None` for plain text. An https address
/// without `--tls-ca` trusts what a local kernel wrote to its data
/// directory; TLS settings with a plain-text address are refused rather
/// than ignored, so the token never goes out in clear by mistake.
fn client_tls(args: &ClientArgs, addr: &str) -> Result<Option<ClientTlsConfig>, CliError> {
    let identity = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (None, None) => None,
        (Some(_), None) => {
            return Err(CliError::Usage(
                "--tls-cert (or HIVEKERNEL_TLS_CERT) needs --tls-key (or HIVEKERNEL_TLS_KEY)"
                    .into(),
            ));
        }
        (None, Some(_)) => {
            return Err(CliError::Usage(
                "--tls-key (or HIVEKERNEL_TLS_KEY) needs --tls-cert (or HIVEKERNEL_TLS_CERT)"
                    .into(),
            ));
        }
    };
    if !addr.to_ascii_lowercase().starts_with("https://") {
        if args.tls_ca.is_some() || identity.is_some() {
            return Err(CliError::Usage(format!(
                "{addr} is plain text, but TLS settings were given (--tls-ca, --tls-cert, \
                 --tls-key or HIVEKERNEL_TLS_*): use an https:// address, or drop them"
            )));
        }
        return Ok(None);
    }
    let ca = match &args.tls_ca {
        Some(ca) => ca.clone(),
        None => {
            let local = args.data_dir.join(TRUST_FILE);
            if !local.exists() {
                return Err(CliError::Usage(format!(
                    "{addr} serves TLS: pass --tls-ca (or HIVEKERNEL_TLS_CA) with the CA that \
                     signed its certificate (there is no {} from a local kernel)",
                    local.display()
                )));
            }
            local
        }
    };
    tls::client_config(&ca, identity)
        .map(Some)
        .map_err(|err| CliError::Usage(err.to_string()))
}

const NOT_RUNNING: &str = "is `hivekernel start` running?";

/// A failed connection, with the likely fix: TLS problems are told apart by
/// what rustls reported (a handshake the kernel refused may read as a
/// closed connection, so that is what is left when nothing else matches).
fn connect_error(addr: &str, cause: String, secure: bool) -> CliError {
    let refused = cause.contains("Connection refused") || cause.contains("tcp connect error");
    let hint = if refused {
        NOT_RUNNING
    } else if !secure {
        // A TLS server drops a plain-text client at once (or answers with
        // bytes that read as a bad HTTP/2 frame).
        "if the kernel serves TLS, use its https:// address (as in its kernel.addr) and --tls-ca"
    } else if cause.contains("UnknownIssuer") || cause.contains("NotValidForName") {
        "the kernel's certificate is not trusted: check --tls-ca (HIVEKERNEL_TLS_CA) \
         and that the certificate names the host in the address"
    } else if cause.contains("InvalidContentType") || cause.contains("corrupt message") {
        "the kernel does not seem to serve TLS: try an http:// address"
    } else {
        "if the kernel requires client certificates, pass --tls-cert and --tls-key \
         (HIVEKERNEL_TLS_CERT, HIVEKERNEL_TLS_KEY) with a certificate its client CA signed"
    };
    CliError::Connect {
        addr: addr.to_owned(),
        cause,
        hint,
    }
}

/// What is said, on stderr, when `--token` is given on the command line.
pub(super) const TOKEN_IN_ARGV: &str = "warning: every user of this machine can read a command's \
    arguments (ps, /proc/PID/cmdline), --token's included; pass it with --token-file, \
    HIVEKERNEL_TOKEN, or the data directory's admin.token instead";

/// Whether `--token` was given on the command line (not by `HIVEKERNEL_TOKEN`).
pub(super) fn token_in_argv(matches: &clap::ArgMatches) -> bool {
    let mut matches = matches;
    while let Some((_, sub)) = matches.subcommand() {
        matches = sub;
    }
    // `try_contains_id` first: `value_source` of an id the command does not
    // have is a programming error to clap.
    matches!(matches.try_contains_id("token"), Ok(true))
        && matches.value_source("token") == Some(clap::parser::ValueSource::CommandLine)
}

/// Which of `--token` and `--token-file` to use when both have a value:
/// the one on the command line when the other comes from the environment
/// (`HIVEKERNEL_TOKEN` exported in a shell does not stand in the way of
/// `--token-file`); both on the command line, or both from the
/// environment, is a usage error.
fn one_token_source<'a>(
    flag: Option<&'a str>,
    file: Option<&'a Path>,
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<(Option<&'a str>, Option<&'a Path>), CliError> {
    let (Some(token), Some(path)) = (flag, file) else {
        return Ok((flag, file));
    };
    let token_from_env = env("HIVEKERNEL_TOKEN").is_some_and(|value| value == token);
    let file_from_env = env("HIVEKERNEL_TOKEN_FILE").is_some_and(|value| value == path.as_os_str());
    match (token_from_env, file_from_env) {
        (true, false) => Ok((None, file)),
        (false, true) => Ok((flag, None)),
        (false, false) => Err(CliError::Usage(
            "--token and --token-file both name a token: give one of them".to_owned(),
        )),
        (true, true) => Err(CliError::Usage(
            "HIVEKERNEL_TOKEN and HIVEKERNEL_TOKEN_FILE are both set: unset one of them".to_owned(),
        )),
    }
}

/// The most a token file may hold: a token is a few dozen bytes.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// The token in `path` (`--token-file`), surrounding whitespace trimmed.
fn read_token_file(path: &Path) -> Result<String, CliError> {
    let flag = "--token-file (or HIVEKERNEL_TOKEN_FILE)";
    let bytes = read_capped(path, MAX_TOKEN_FILE_BYTES).map_err(|problem| match problem {
        FileProblem::Io(err) if err.kind() == io::ErrorKind::NotFound => {
            CliError::Usage(format!("no token file at {} ({flag})", path.display()))
        }
        problem => CliError::Usage(format!(
            "cannot read the token file {} ({flag}): {problem}",
            path.display()
        )),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| {
        CliError::Usage(format!(
            "the token file {} ({flag}) is not UTF-8 text",
            path.display()
        ))
    })?;
    match text.trim() {
        "" => Err(CliError::Usage(format!(
            "the token file {} ({flag}) is empty",
            path.display()
        ))),
        token => Ok(token.to_owned()),
    }
}

/// The token and a hint naming where it came from, for when the kernel
/// refuses it: `--token`, else `--token-file`, else the data directory's.
fn load_token(
    flag: Option<&str>,
    file: Option<&Path>,
    data_dir: &Path,
) -> Result<(String, String), CliError> {
    let (flag, file) = one_token_source(flag, file, |name| std::env::var_os(name))?;
    if let Some(path) = file {
        let hint = format!(
            "the token came from {} (--token-file or HIVEKERNEL_TOKEN_FILE); \
             pass the one in the kernel's data directory (admin.token)",
            path.display()
        );
        return Ok((read_token_file(path)?, hint));
    }
    if let Some(token) = flag {
        let token = token.trim();
        if token.is_empty() {
            return Err(CliError::Usage(
                "--token (or HIVEKERNEL_TOKEN) is empty".to_owned(),
            ));
        }
        let hint = "the token came from --token or HIVEKERNEL_TOKEN; \
                    pass the one in the kernel's data directory (admin.token)";
        return Ok((token.to_owned(), hint.to_owned()));
    }
    let path = data_dir.join("admin.token");
    let fix = "start the kernel with `hivekernel start CONFIG` (it writes this file), \
               point --data-dir (or HIVEKERNEL_DATA_DIR) at the kernel's data directory, \
               or pass --token-file";
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            let hint = format!(
                "the token came from {}; point --data-dir at the running kernel's data directory, \
                 or pass --token-file",
                path.display()
            );
            Ok((text.trim().to_owned(), hint))
        }
        Ok(_) => Err(CliError::Usage(format!(
            "the admin token file {} is empty: {fix}",
            path.display()
        ))),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Err(CliError::Usage(format!(
            "no admin token at {}: {fix}",
            path.display()
        ))),
        Err(err) => Err(CliError::Usage(format!(
            "cannot read the admin token {}: {err}; {fix}",
            path.display()
        ))),
    }
}

/// Adds `authorization: Bearer <token>` to every request.
#[derive(Debug, Clone)]
pub(super) struct Bearer(MetadataValue<Ascii>);

impl Bearer {
    fn new(token: &str) -> Result<Bearer, CliError> {
        let mut value: MetadataValue<Ascii> = format!("Bearer {token}").parse().map_err(|_| {
            CliError::Usage("the token has characters that cannot go in a header".to_owned())
        })?;
        value.set_sensitive(true);
        Ok(Bearer(value))
    }
}

impl Interceptor for Bearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request
            .metadata_mut()
            .insert("authorization", self.0.clone());
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn bare_host_port_becomes_http() {
        assert_eq!(endpoint_uri("127.0.0.1:9", false), "http://127.0.0.1:9");
        assert_eq!(endpoint_uri("127.0.0.1:9", true), "https://127.0.0.1:9");
        assert_eq!(endpoint_uri(" http://h:1\n", true), "http://h:1");
        assert_eq!(endpoint_uri("https://h:1", false), "https://h:1");
    }

    #[test]
    fn bearer_sets_the_authorization_header() -> Result<(), Box<dyn std::error::Error>> {
        let mut bearer = Bearer::new("s3cret")?;
        let request = bearer.call(Request::new(()))?;
        let value = request
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().ok());
        assert_eq!(value, Some(Some("Bearer s3cret")));
        Ok(())
    }

    #[test]
    fn token_comes_from_the_flag_or_the_data_dir() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let missing = load_token(None, None, dir.path())
            .err()
            .map(|e| (e.exit_code(), e.to_string()));
        let (code, text) = missing.unwrap_or_default();
        assert_eq!(code, 2);
        assert!(
            text.contains("admin.token") && text.contains("--token"),
            "{text}"
        );

        std::fs::write(dir.path().join("admin.token"), "abc\n")?;
        assert_eq!(load_token(None, None, dir.path())?.0, "abc");
        assert_eq!(load_token(Some("xyz"), None, dir.path())?.0, "xyz");
        assert!(load_token(Some(" "), None, dir.path()).is_err());
        Ok(())
    }

    #[test]
    fn the_command_line_s_token_source_wins_over_the_environment_s() {
        let file = Path::new("/run/hk/token");
        let env = |token: Option<&str>, file: Option<&str>| {
            let token = token.map(std::ffi::OsString::from);
            let file = file.map(std::ffi::OsString::from);
            move |name: &str| match name {
                "HIVEKERNEL_TOKEN" => token.clone(),
                "HIVEKERNEL_TOKEN_FILE" => file.clone(),
                _ => None,
            }
        };
        // HIVEKERNEL_TOKEN exported, --token-file given.
        let (flag, path) = one_token_source(Some("t0"), Some(file), env(Some("t0"), None)).unwrap();
        assert_eq!((flag, path), (None, Some(file)));
        // HIVEKERNEL_TOKEN_FILE exported, --token given.
        let (flag, path) =
            one_token_source(Some("t1"), Some(file), env(None, Some("/run/hk/token"))).unwrap();
        assert_eq!((flag, path), (Some("t1"), None));
        // Both on the command line, or both exported.
        let both = one_token_source(Some("t1"), Some(file), env(None, None)).unwrap_err();
        assert!(both.to_string().contains("give one of them"), "{both}");
        let exported = one_token_source(
            Some("t1"),
            Some(file),
            env(Some("t1"), Some("/run/hk/token")),
        )
        .unwrap_err();
        assert!(exported.to_string().contains("unset one"), "{exported}");
        // One alone is taken as it is.
        assert_eq!(
            one_token_source(None, Some(file), env(None, None)).unwrap(),
            (None, Some(file))
        );
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_each_problem_names_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let file = dir.path().join("hk.token");
        std::fs::write(&file, "  o1-secret\n")?;
        let (token, hint) = load_token(None, Some(&file), dir.path())?;
        assert_eq!(token, "o1-secret");
        assert!(
            hint.contains("hk.token") && !hint.contains("o1-secret"),
            "{hint}"
        );

        let problem = |path: &Path| {
            load_token(None, Some(path), dir.path())
                .err()
                .map(|e| (e.exit_code(), e.to_string()))
                .unwrap_or_default()
        };
        let (code, text) = problem(&dir.path().join("absent"));
        assert_eq!(code, 2);
        assert!(
            text.starts_with("no token file at ") && text.contains("absent"),
            "{text}"
        );
        std::fs::write(&file, " \n")?;
        let (code, text) = problem(&file);
        assert_eq!(code, 2);
        assert!(
            text.contains("hk.token") && text.contains("is empty"),
            "{text}"
        );
        std::fs::write(&file, "x".repeat(5000))?;
        let (code, text) = problem(&file);
        assert_eq!(code, 2);
        assert!(
            text.contains("hk.token") && text.contains("larger than 4096"),
            "{text}"
        );
        assert!(!text.contains("xxx"), "{text}");
        let (_, text) = problem(dir.path());
        assert!(text.contains("a directory, not a regular file"), "{text}");
        Ok(())
    }

    #[test]
    fn addr_falls_back_to_the_kernel_addr_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut args = ClientArgs {
            addr: None,
            token: None,
            token_file: None,
            data_dir: dir.path().to_owned(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        };
        assert_eq!(resolve_addr(&args), DEFAULT_ADDR);
        std::fs::write(dir.path().join("kernel.addr"), "http://127.0.0.1:4242\n")?;
        assert_eq!(resolve_addr(&args), "http://127.0.0.1:4242");
        args.addr = Some("localhost:1".to_owned());
        assert_eq!(resolve_addr(&args), "http://localhost:1");
        Ok(())
    }
}
