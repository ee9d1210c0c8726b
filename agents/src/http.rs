//! The HTTP client every outbound call of this crate is built from.

/// A reqwest client builder over rustls with ring, the provider the
/// kernel's own TLS uses, installed once per process first (one already
/// installed is kept); certificates are checked against the system's
/// trust store.
pub fn client_builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder()
}

/// Installs ring as the process's rustls provider, unless one is already.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
