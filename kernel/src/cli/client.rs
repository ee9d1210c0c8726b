//! Connecting to a running kernel: the address, the admin token, the bearer
//! interceptor, and turning gRPC statuses into [`CliError`]s.

use std::io;
use std::path::Path;
use std::time::Duration;

use hivekernel_proto::v1::kernel_client::KernelClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use super::{CliError, ClientArgs};

/// Where the kernel listens unless told otherwise.
const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Task outputs can be large; the client should not be the one to refuse them.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// The generated client with every request carrying the bearer token.
pub(super) type Client = KernelClient<InterceptedService<Channel, Bearer>>;

/// A connected client, plus what is needed to explain its failures.
#[derive(Debug)]
pub(super) struct Session {
    /// The gRPC client.
    pub(super) client: Client,
    addr: String,
    token_hint: String,
}

impl Session {
    /// Connects to the kernel named by `args` and loads the token.
    pub(super) async fn connect(args: &ClientArgs) -> Result<Session, CliError> {
        let addr = resolve_addr(args);
        let endpoint = Endpoint::from_shared(addr.clone())
            .map_err(|err| CliError::Usage(format!("invalid kernel address {addr:?}: {err}")))?
            .connect_timeout(CONNECT_TIMEOUT);
        // Connect before reading the token: when the kernel is down, "cannot
        // connect" is the real problem even if the token file is missing too.
        let channel = endpoint.connect().await.map_err(|err| CliError::Connect {
            addr: addr.clone(),
            cause: error_chain(&err),
        })?;
        let (token, token_hint) = load_token(args.token.as_deref(), &args.data_dir)?;
        let client = KernelClient::with_interceptor(channel, Bearer::new(&token)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES);
        Ok(Session {
            client,
            addr,
            token_hint,
        })
    }

    /// The CLI error for a failed call.
    pub(super) fn error(&self, status: Status) -> CliError {
        let message = if status.message().is_empty() {
            status.code().description().to_owned()
        } else {
            status.message().to_owned()
        };
        match status.code() {
            Code::Unavailable => CliError::Connect {
                addr: self.addr.clone(),
                cause: message,
            },
            Code::Unauthenticated => CliError::Unauthenticated {
                message,
                hint: self.token_hint.clone(),
            },
            _ => CliError::Refused(message),
        }
    }
}

/// `--addr` (or `HIVEKERNEL_ADDR`), else the address the kernel wrote to its data directory.
fn resolve_addr(args: &ClientArgs) -> String {
    if let Some(addr) = &args.addr {
        return endpoint_uri(addr);
    }
    match std::fs::read_to_string(args.data_dir.join("kernel.addr")) {
        Ok(addr) if !addr.trim().is_empty() => endpoint_uri(&addr),
        _ => DEFAULT_ADDR.to_owned(),
    }
}

/// Accepts a URL or a bare `host:port` (taken as plain-text HTTP/2).
fn endpoint_uri(addr: &str) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// The token and a hint naming where it came from, for when the kernel refuses it.
fn load_token(flag: Option<&str>, data_dir: &Path) -> Result<(String, String), CliError> {
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
               or pass --token";
    match std::fs::read_to_string(&path) {
        Ok(text) if !text.trim().is_empty() => {
            let hint = format!(
                "the token came from {}; point --data-dir at the running kernel's data directory, \
                 or pass --token",
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

/// An error and its causes, `a: b: c`, without repeats.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
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
    use super::*;

    #[test]
    fn bare_host_port_becomes_http() {
        assert_eq!(endpoint_uri("127.0.0.1:9"), "http://127.0.0.1:9");
        assert_eq!(endpoint_uri(" http://h:1\n"), "http://h:1");
        assert_eq!(endpoint_uri("https://h:1"), "https://h:1");
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
        let missing = load_token(None, dir.path())
            .err()
            .map(|e| (e.exit_code(), e.to_string()));
        let (code, text) = missing.unwrap_or_default();
        assert_eq!(code, 2);
        assert!(
            text.contains("admin.token") && text.contains("--token"),
            "{text}"
        );

        std::fs::write(dir.path().join("admin.token"), "abc\n")?;
        assert_eq!(load_token(None, dir.path())?.0, "abc");
        assert_eq!(load_token(Some("xyz"), dir.path())?.0, "xyz");
        assert!(load_token(Some(" "), dir.path()).is_err());
        Ok(())
    }

    #[test]
    fn addr_falls_back_to_the_kernel_addr_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let mut args = ClientArgs {
            addr: None,
            token: None,
            data_dir: dir.path().to_owned(),
        };
        assert_eq!(resolve_addr(&args), DEFAULT_ADDR);
        std::fs::write(dir.path().join("kernel.addr"), "http://127.0.0.1:4242\n")?;
        assert_eq!(resolve_addr(&args), "http://127.0.0.1:4242");
        args.addr = Some("localhost:1".to_owned());
        assert_eq!(resolve_addr(&args), "http://localhost:1");
        Ok(())
    }
}
