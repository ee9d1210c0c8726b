//! TLS on the gRPC control plane (rustls with ring): the files a kernel is
//! started with, loading and checking them, and the CLI's client settings.
//!
//! Every PEM file is read and parsed here, before anything starts or any
//! connection is tried, so a missing, unreadable or wrong file is reported
//! once, naming the file and what is wrong with it.

use crate::files::FileProblem;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::{self, PemObject as _};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, Server, ServerTlsConfig};

/// File name, in the data directory, of the PEM that local clients trust for the kernel.
pub const TRUST_FILE: &str = "tls-ca.pem";

/// Largest PEM file read; certificates and keys are a few KiB.
const MAX_PEM_BYTES: u64 = 1 << 20;
/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The TLS files of a kernel: the `kernel.tls` section, or the start flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain (PEM), its own certificate first.
    pub cert: PathBuf,
    /// The server's private key (PEM).
    pub key: PathBuf,
    /// Mutual TLS: clients must present a certificate signed by one of these (PEM).
    pub client_ca: Option<PathBuf>,
    /// What local clients and exec agents trust for the server (PEM); `None`: `cert`.
    pub ca: Option<PathBuf>,
}

/// The TLS flags of `hivekernel start`, before they meet the config.
#[derive(Debug, Clone, Default)]
pub struct TlsFlags {
    /// `--tls-cert`.
    pub cert: Option<PathBuf>,
    /// `--tls-key`.
    pub key: Option<PathBuf>,
    /// `--tls-client-ca`.
    pub client_ca: Option<PathBuf>,
    /// `--tls-ca`.
    pub ca: Option<PathBuf>,
}

impl TlsFlags {
    /// The files to use: each flag given replaces the config's field; a
    /// certificate without its key (or the reverse) is refused, and so are
    /// `--tls-client-ca` and `--tls-ca` when there is no certificate at all.
    pub fn over(self, config: Option<TlsFiles>) -> Result<Option<TlsFiles>, String> {
        let (cert, key) = match (self.cert, self.key, config.as_ref()) {
            (Some(cert), Some(key), _) => (cert, key),
            (Some(_), None, _) => {
                return Err("--tls-cert needs --tls-key (the certificate's private key)".into());
            }
            (None, Some(_), _) => {
                return Err("--tls-key needs --tls-cert (the certificate of that key)".into());
            }
            (None, None, Some(config)) => (config.cert.clone(), config.key.clone()),
            (None, None, None) => {
                let dangling = match (&self.client_ca, &self.ca) {
                    (Some(_), _) => "--tls-client-ca",
                    (None, Some(_)) => "--tls-ca",
                    (None, None) => return Ok(None),
                };
                return Err(format!(
                    "{dangling} needs TLS: pass --tls-cert and --tls-key (or set kernel.tls in the config)"
                ));
            }
        };
        let (client_ca, ca) = match config {
            Some(config) => (config.client_ca, config.ca),
            None => (None, None),
        };
        Ok(Some(TlsFiles {
            cert,
            key,
            client_ca: self.client_ca.or(client_ca),
            ca: self.ca.or(ca),
        }))
    }
}

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file could not be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// Which file it is (`TLS certificate`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file was read but does not hold what it should.
    #[error("{what} {}: {problem}", path.display())]
    Invalid {
        /// Which file it is.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

/// The server's TLS settings, loaded and checked.
#[derive(Debug, Clone)]
pub struct ServerTls {
    config: ServerTlsConfig,
    /// The same identity and client CA for HTTP/1.1 (the dashboard).
    http: Arc<rustls::ServerConfig>,
    trust: Vec<u8>,
    mutual: bool,
}

impl ServerTls {
    /// Reads and checks every file: each must parse, the key must belong to
    /// the certificate, and the client CA must be a usable trust root.
    pub fn load(files: &TlsFiles) -> Result<ServerTls, TlsError> {
        let cert = read_certs(&files.cert, CERT)?;
        let key = read_key(&files.key, KEY)?;
        let identity = Identity::from_pem(&cert, &key);
        let config = ServerTlsConfig::new()
            .identity(identity)
            .timeout(HANDSHAKE_TIMEOUT);
        // rustls checks the pair (and, below, the CA) when the acceptor is built.
        Server::builder()
            .tls_config(config.clone())
            .map_err(|err| TlsError::Invalid {
                what: KEY,
                path: files.key.clone(),
                problem: format!(
                    "cannot be used with the certificate {}: {}",
                    files.cert.display(),
                    crate::error::error_chain(&err)
                ),
            })?;
        let config = match &files.client_ca {
            None => config,
            Some(path) => {
                let roots = read_certs(path, CLIENT_CA)?;
                let config = config.client_ca_root(Certificate::from_pem(roots));
                Server::builder()
                    .tls_config(config.clone())
                    .map_err(|err| TlsError::Invalid {
                        what: CLIENT_CA,
                        path: path.clone(),
                        problem: format!(
                            "not a usable trust root: {}",
                            crate::error::error_chain(&err)
                        ),
                    })?;
                config
            }
        };
        let client_ca = match &files.client_ca {
            Some(path) => Some(read_certs(path, CLIENT_CA)?),
            None => None,
        };
        let http = http_config(&cert, &key, client_ca.as_deref()).map_err(|problem| {
            TlsError::Invalid {
                what: KEY,
                path: files.key.clone(),
                problem,
            }
        })?;
        let trust = match &files.ca {
            Some(path) => read_certs(path, CA)?,
            None => cert,
        };
        Ok(ServerTls {
            config,
            http: Arc::new(http),
            trust,
            mutual: files.client_ca.is_some(),
        })
    }

    /// The settings for tonic's server.
    pub fn config(&self) -> ServerTlsConfig {
        self.config.clone()
    }

    /// The settings for an HTTP/1.1 server with the same identity and
    /// client CA (the dashboard).
    pub fn http_config(&self) -> Arc<rustls::ServerConfig> {
        self.http.clone()
    }

    /// The PEM local clients trust for this server (written to [`TRUST_FILE`]).
    pub fn trust_pem(&self) -> &[u8] {
        &self.trust
    }

    /// Whether clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        self.mutual
    }
}

/// rustls settings for HTTP/1.1 from PEM already checked by `load`.
fn http_config(
    cert: &[u8],
    key: &[u8],
    client_ca: Option<&[u8]>,
) -> Result<rustls::ServerConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| err.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|err| err.to_string())?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|err| err.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                roots
                    .add(cert.map_err(|err| err.to_string())?)
                    .map_err(|err| err.to_string())?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|err| err.to_string())?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|err| format!("cannot be used with the certificate: {err}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client's TLS settings: trust `ca` for the server and, for mutual TLS,
/// present the certificate and key of `identity`.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<ClientTlsConfig, TlsError> {
    let roots = read_certs(ca, CA)?;
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(roots))
        .timeout(HANDSHAKE_TIMEOUT);
    // rustls checks the files when a connector is built; build one here so
    // that a problem is told with the file it comes from.
    let check = |config: &ClientTlsConfig| {
        Endpoint::from_static("https://localhost")
            .tls_config(config.clone())
            .map(drop)
            .map_err(|err| crate::error::error_chain(&err))
    };
    check(&config).map_err(|problem| TlsError::Invalid {
        what: CA,
        path: ca.to_owned(),
        problem: format!("not a usable trust root: {problem}"),
    })?;
    let Some((cert_path, key_path)) = identity else {
        return Ok(config);
    };
    let cert = read_certs(cert_path, CLIENT_CERT)?;
    let key = read_key(key_path, KEY)?;
    let config = config.identity(Identity::from_pem(cert, key));
    check(&config).map_err(|problem| TlsError::Invalid {
        what: CLIENT_CERT,
        path: cert_path.to_owned(),
        problem: format!(
            "cannot be used with the key {}: {problem}",
            key_path.display()
        ),
    })?;
    Ok(config)
}

/// How messages name each file.
pub(crate) const CERT: &str = "TLS certificate";
pub(crate) const KEY: &str = "TLS private key";
pub(crate) const CLIENT_CA: &str = "TLS client CA";
pub(crate) const CA: &str = "TLS CA";
const CLIENT_CERT: &str = "TLS client certificate";

/// HTTPS clients (to MCP servers, to an OTLP collector) go through rustls
/// with ring, the provider the control plane's TLS already uses; installed
/// once per process (a provider already installed is kept).
pub(crate) fn install_provider() {
    hivekernel_agents::http::install_tls_provider();
}

/// Reads a PEM file holding one or more certificates; returns its bytes.
pub(crate) fn read_certs(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = read_pem(path, what)?;
    let invalid = |problem: String| TlsError::Invalid {
        what,
        path: path.to_owned(),
        problem,
    };
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        cert.map_err(|err| invalid(format!("not valid PEM: {err}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(invalid(
            "no certificate in it (expected PEM with -----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(bytes)
}

/// Reads a PEM file holding a private key; returns its bytes.
pub(crate) fn read_key(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    let bytes = read_pem(path, what)?;
    match PrivateKeyDer::from_pem_slice(&bytes) {
        Ok(_) => Ok(bytes),
        Err(err) => Err(TlsError::Invalid {
            what,
            path: path.to_owned(),
            problem: match err {
                pem::Error::NoItemsFound => "no private key in it (expected PEM with -----BEGIN \
                                             PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY)"
                    .into(),
                err => format!("not valid PEM: {err}"),
            },
        }),
    }
}

/// The file's bytes, refusing anything too large to be a PEM file.
fn read_pem(path: &Path, what: &'static str) -> Result<Vec<u8>, TlsError> {
    crate::files::read_capped(path, MAX_PEM_BYTES).map_err(|problem| match problem {
        FileProblem::Io(source) => TlsError::Read {
            what,
            path: path.to_owned(),
            source,
        },
        FileProblem::TooLarge { .. } => TlsError::Invalid {
            what,
            path: path.to_owned(),
            problem: format!("larger than {MAX_PEM_BYTES} bytes: not a PEM file"),
        },
        FileProblem::NotRegular(_) | FileProblem::Interface(_) | FileProblem::Shared { .. } => {
            TlsError::Invalid {
                what,
                path: path.to_owned(),
                problem: problem.to_string(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> TlsFiles {
        TlsFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: None,
            ca: None,
        }
    }

    #[test]
    fn flags_replace_the_config_field_by_field() {
        let mut config = files("c.pem", "k.pem");
        config.client_ca = Some("clients.pem".into());
        let flags = TlsFlags {
            cert: Some("flag-c.pem".into()),
            key: Some("flag-k.pem".into()),
            ..TlsFlags::default()
        };
        let mut expected = files("flag-c.pem", "flag-k.pem");
        expected.client_ca = Some("clients.pem".into());
        assert_eq!(flags.over(Some(config.clone())), Ok(Some(expected)));

        let flags = TlsFlags {
            client_ca: Some("other.pem".into()),
            ..TlsFlags::default()
        };
        let merged = flags.over(Some(config)).ok().flatten();
        assert_eq!(merged.and_then(|f| f.client_ca), Some("other.pem".into()));
        assert_eq!(TlsFlags::default().over(None), Ok(None));
    }

    #[test]
    fn half_a_pair_or_a_ca_without_tls_is_refused() {
        let refused = |flags: TlsFlags| flags.over(None).err().unwrap_or_default();
        let cert_only = TlsFlags {
            cert: Some("c.pem".into()),
            ..TlsFlags::default()
        };
        assert!(refused(cert_only.clone()).contains("--tls-key"));
        // A key in the config does not complete a certificate on the command line.
        assert!(
            cert_only
                .over(Some(files("c.pem", "k.pem")))
                .is_err_and(|e| e.contains("--tls-key"))
        );
        let key_only = TlsFlags {
            key: Some("k.pem".into()),
            ..TlsFlags::default()
        };
        assert!(refused(key_only).contains("--tls-cert"));
        let ca_only = TlsFlags {
            client_ca: Some("ca.pem".into()),
            ..TlsFlags::default()
        };
        let text = refused(ca_only);
        assert!(
            text.contains("--tls-client-ca") && text.contains("--tls-cert"),
            "{text}"
        );
    }

    #[test]
    fn bad_files_are_named_with_the_problem() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let missing = dir.path().join("missing.pem");
        let text = read_certs(&missing, CERT).err().map(|e| e.to_string());
        let text = text.unwrap_or_default();
        assert!(
            text.starts_with("cannot read TLS certificate") && text.contains("missing.pem"),
            "{text}"
        );

        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello\n")?;
        let text = read_certs(&junk, CERT).err().map(|e| e.to_string());
        assert!(text.unwrap_or_default().contains("no certificate in it"));
        let text = read_key(&junk, KEY).err().map(|e| e.to_string());
        let text = text.unwrap_or_default();
        assert!(
            text.contains("junk.pem") && text.contains("no private key"),
            "{text}"
        );

        let broken = dir.path().join("broken.pem");
        std::fs::write(&broken, "-----BEGIN CERTIFICATE-----\n!!!\n")?;
        let text = read_certs(&broken, CERT).err().map(|e| e.to_string());
        assert!(text.unwrap_or_default().contains("not valid PEM"));
        Ok(())
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let write = |name: &str, text: String| -> std::io::Result<PathBuf> {
            let path = dir.path().join(name);
            std::fs::write(&path, text)?;
            Ok(path)
        };
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let two = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])?;
        let cert = write("cert.pem", one.cert.pem())?;
        let key = write("key.pem", one.signing_key.serialize_pem())?;
        let other_key = write("other.pem", two.signing_key.serialize_pem())?;

        let loaded = ServerTls::load(&files(&cert, &key))?;
        assert!(!loaded.is_mutual());
        assert_eq!(
            loaded.trust_pem(),
            std::fs::read(&cert)?,
            "the certificate by default"
        );

        let text = ServerTls::load(&files(&cert, &other_key))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            text.contains("other.pem") && text.contains("cannot be used with the certificate"),
            "{text}"
        );
        Ok(())
    }
}
