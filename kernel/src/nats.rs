//! Reaching NATS as a client (a node's connection, docs/CLUSTER.md
//! "Access: who may join"): the credentials a server URL carries, the
//! nkey seed and credentials files, the TLS settings, and server URLs
//! shown without their secrets.
//!
//! async-nats 0.51 sends only the credentials of its `ConnectOptions`, not
//! those written in a server URL, and logs the URLs it was given at debug
//! level; so the credentials are taken out of the URLs here, and the
//! client is handed the URLs without them.

use std::borrow::Cow;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::files::read_private;
use crate::tls::{self, TlsError};

/// Largest nkey seed or credentials file read: a credentials file (a JWT
/// and a seed) is a few KiB.
const MAX_SECRET_BYTES: u64 = 64 * 1024;

/// How `tls_ca`, `tls_cert` and `tls_key` files are named in messages.
const NATS_CA: &str = "NATS TLS CA";
const NATS_CERT: &str = "NATS TLS client certificate";
const NATS_KEY: &str = "NATS TLS client key";

/// The credentials in a server URL's user info.
#[derive(Clone, PartialEq, Eq)]
pub enum UrlCredentials {
    /// `nats://USER:PASSWORD@HOST:PORT`.
    UserPassword {
        /// The user, percent-decoded.
        user: String,
        /// The password, percent-decoded.
        password: String,
    },
    /// `nats://TOKEN@HOST:PORT`.
    Token(String),
}

impl fmt::Debug for UrlCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UrlCredentials::UserPassword { user, .. } => write!(f, "UserPassword({user}:***)"),
            UrlCredentials::Token(_) => f.write_str("Token(***)"),
        }
    }
}

/// `url` as it may be shown: the password of its user info replaced by
/// `***` (`nats://alice:***@host:4222`), or the whole user info when it is
/// a token (`nats://***@host:4222`). Everything up to the last `@` counts
/// as user info, so a malformed URL shows less, never more.
pub fn redacted(url: &str) -> Cow<'_, str> {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, url),
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return Cow::Borrowed(url);
    };
    let shown = match userinfo.split_once(':') {
        Some((user, _)) => format!("{user}:***"),
        None => "***".to_owned(),
    };
    Cow::Owned(match scheme {
        Some(scheme) => format!("{scheme}://{shown}@{host}"),
        None => format!("{shown}@{host}"),
    })
}

/// `text` with every URL in it [`redacted`] (a URL runs from its scheme
/// to the next blank or quote, so several joined by commas are hidden up
/// to the last `@`): for messages that may quote a server URL, such as a
/// parser's.
pub fn redacted_in(text: &str) -> String {
    let ends = |c: char| c.is_whitespace() || matches!(c, '"' | '\'');
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .char_indices()
            .rfind(|&(_, c)| ends(c))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at..].find(ends).map_or(rest.len(), |i| at + i);
        shown.push_str(&rest[..start]);
        shown.push_str(&redacted(&rest[start..end]));
        rest = &rest[end..];
    }
    shown.push_str(rest);
    shown
}

/// `servers` as they may be shown, comma-separated ([`redacted`]).
pub fn shown_servers(servers: &[String]) -> String {
    servers
        .iter()
        .map(|url| redacted(url))
        .collect::<Vec<_>>()
        .join(",")
}

/// `url` without its user info, and the credentials that held, if any;
/// or why that user info cannot be credentials (never quoting it).
pub fn split_credentials(url: &str) -> Result<(String, Option<UrlCredentials>), String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok((url.to_owned(), None));
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return Ok((url.to_owned(), None));
    };
    let decode = |part: &str, what: &str| {
        percent_decode_str(part)
            .decode_utf8()
            .map(Cow::into_owned)
            .map_err(|_| format!("its {what} is not UTF-8 once percent-decoded"))
    };
    let credentials = match userinfo.split_once(':') {
        Some(("", _)) => {
            return Err("names a password but no user (expected USER:PASSWORD@ or TOKEN@)".into());
        }
        Some((user, password)) => UrlCredentials::UserPassword {
            user: decode(user, "user")?,
            password: decode(password, "password")?,
        },
        None if userinfo.is_empty() => {
            return Err(
                "has an empty user info before '@' (expected USER:PASSWORD@ or TOKEN@)".into(),
            );
        }
        None => UrlCredentials::Token(decode(userinfo, "token")?),
    };
    Ok((format!("{scheme}://{host}"), Some(credentials)))
}

/// The credentials `servers` carry, one set for every server: the URLs
/// that carry any must carry the same. Else the index of the first that
/// differs and why.
pub fn url_credentials(servers: &[String]) -> Result<Option<UrlCredentials>, (usize, String)> {
    let mut found: Option<(usize, UrlCredentials)> = None;
    for (i, url) in servers.iter().enumerate() {
        let (_, credentials) = split_credentials(url).map_err(|why| (i, why))?;
        match (&found, credentials) {
            (None, Some(credentials)) => found = Some((i, credentials)),
            (Some((first, known)), Some(credentials)) if *known != credentials => {
                return Err((
                    i,
                    format!(
                        "carries other credentials than server [{first}]: a node signs in to \
                         every server the same way, so give the same (or none) in each URL"
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(found.map(|(_, credentials)| credentials))
}

/// The text of the secret file at `path`: a regular file, its owner's
/// alone, at most 64 KiB of UTF-8. `what` names it in the error.
fn read_secret(path: &Path, what: &str) -> Result<String, String> {
    let bytes = read_private(path, MAX_SECRET_BYTES)
        .map_err(|problem| format!("cannot read {what} {}: {problem}", path.display()))?;
    String::from_utf8(bytes).map_err(|_| format!("{what} {} is not UTF-8 text", path.display()))
}

/// The nkey seed of a NATS user in the file at `path` (what `nk -gen user`
/// prints: one line starting with `SU`; a decorated block as in a
/// credentials file is read too). The error never quotes the file.
pub fn read_nkey_seed(path: &Path) -> Result<String, String> {
    let text = read_secret(path, "nkey seed file")?;
    let seed = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('-') && !line.starts_with('*'))
        .unwrap_or_default();
    let shown = path.display();
    match nkeys::KeyPair::from_seed(seed) {
        Ok(_) if seed.starts_with("SU") => Ok(seed.to_owned()),
        Ok(_) => Err(format!(
            "{shown} holds an nkey seed that is not a user's (a user's seed starts with SU: \
             `nk -gen user`)"
        )),
        Err(err) => Err(format!(
            "{shown} holds no nkey seed ({}; expected one line starting with SU, as `nk -gen \
             user` prints it)",
            err.kind()
        )),
    }
}

/// The text of the NATS credentials file at `path` (a user JWT and its
/// nkey seed, as `nsc` writes it), checked to hold both.
pub fn read_creds(path: &Path) -> Result<String, String> {
    let text = read_secret(path, "credentials file")?;
    match async_nats::ConnectOptions::new().credentials(&text) {
        Ok(_) => Ok(text),
        Err(err) => Err(format!(
            "{} is not a NATS credentials file: {err} (expected a user JWT and its nkey seed, \
             as nsc writes them)",
            path.display()
        )),
    }
}

/// Which of `tls_ca`, `tls_cert` and `tls_key` a TLS problem is about.
pub type TlsField = &'static str;

/// The TLS settings of a NATS client: it trusts `ca` for the servers (the
/// system's roots without one) and presents `identity` (certificate and
/// key) when given. Every file is read here, once, as the config reads
/// its TLS files.
pub fn client_tls(
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, (TlsField, TlsError)> {
    let invalid = |what: &'static str, path: &Path, problem: String| TlsError::Invalid {
        what,
        path: path.to_owned(),
        problem,
    };
    let mut roots = rustls::RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = tls::read_certs(path, NATS_CA).map_err(|err| ("tls_ca", err))?;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let added = cert.map_err(|err| err.to_string()).and_then(|cert| {
                    roots
                        .add(cert)
                        .map_err(|err| format!("not a usable trust root: {err}"))
                });
                added.map_err(|problem| ("tls_ca", invalid(NATS_CA, path, problem)))?;
            }
        }
        None => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|err| ("tls_ca", invalid(NATS_CA, Path::new(""), err.to_string())))?
        .with_root_certificates(roots);
    let Some((cert_path, key_path)) = identity else {
        return Ok(builder.with_no_client_auth());
    };
    let cert = tls::read_certs(cert_path, NATS_CERT).map_err(|err| ("tls_cert", err))?;
    let key = tls::read_key(key_path, NATS_KEY).map_err(|err| ("tls_key", err))?;
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| ("tls_cert", invalid(NATS_CERT, cert_path, err.to_string())))?;
    let key = PrivateKeyDer::from_pem_slice(&key)
        .map_err(|err| ("tls_key", invalid(NATS_KEY, key_path, err.to_string())))?;
    builder.with_client_auth_cert(chain, key).map_err(|err| {
        let problem = format!(
            "cannot be used with the certificate {}: {err}",
            cert_path.display()
        );
        ("tls_key", invalid(NATS_KEY, key_path, problem))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn user_info_is_hidden_whatever_its_shape() {
        assert_eq!(
            redacted("nats://alice:s3cret@10.0.0.1:4222"),
            "nats://alice:***@10.0.0.1:4222"
        );
        assert_eq!(redacted("tls://t0ken@nats:4443"), "tls://***@nats:4443");
        assert_eq!(redacted("nats://10.0.0.1:4222"), "nats://10.0.0.1:4222");
        // An '@' in the password, unencoded, and a URL without a scheme.
        assert_eq!(
            redacted("nats://alice:p@ss@host:1"),
            "nats://alice:***@host:1"
        );
        assert_eq!(redacted("alice:s3cret@host:1"), "alice:***@host:1");
        assert_eq!(
            shown_servers(&["nats://a:b@h:1".into(), "nats://h:2".into()]),
            "nats://a:***@h:1,nats://h:2"
        );
        assert_eq!(
            redacted_in(r#"invalid type: string "nats://a:b@h:1", or 'tls://t@h:2' "#),
            r#"invalid type: string "nats://a:***@h:1", or 'tls://***@h:2' "#
        );
        assert_eq!(
            redacted_in("a\u{3000}nats://t@h:1"),
            "a\u{3000}nats://***@h:1"
        );
    }

    #[test]
    fn credentials_come_out_of_the_url_decoded() {
        let (bare, creds) = split_credentials("nats://alice:p%40ss@host:4222").unwrap();
        assert_eq!(bare, "nats://host:4222");
        assert_eq!(
            creds,
            Some(UrlCredentials::UserPassword {
                user: "alice".into(),
                password: "p@ss".into()
            })
        );
        let (bare, creds) = split_credentials("tls://t0ken@host:4443").unwrap();
        assert_eq!(bare, "tls://host:4443");
        assert_eq!(creds, Some(UrlCredentials::Token("t0ken".into())));
        assert_eq!(
            split_credentials("nats://host:4222").unwrap(),
            ("nats://host:4222".into(), None)
        );
        let why = split_credentials("nats://:s3cret@host:1").unwrap_err();
        assert!(why.contains("no user") && !why.contains("s3cret"), "{why}");
        assert!(split_credentials("nats://@host:1").is_err());
        let why = split_credentials("nats://a:%ff%fe@host:1").unwrap_err();
        assert!(why.contains("password is not UTF-8"), "{why}");
        assert_eq!(
            format!("{:?}", creds.unwrap()),
            "Token(***)",
            "Debug hides the secret"
        );
    }

    #[test]
    fn every_url_carries_the_same_credentials_or_none() {
        let servers = |urls: &[&str]| urls.iter().map(|u| u.to_string()).collect::<Vec<_>>();
        let same = servers(&["nats://a:b@h:1", "nats://h:2", "nats://a:b@h:3"]);
        assert!(matches!(
            url_credentials(&same),
            Ok(Some(UrlCredentials::UserPassword { .. }))
        ));
        assert_eq!(url_credentials(&servers(&["nats://h:1"])), Ok(None));
        let (at, why) =
            url_credentials(&servers(&["nats://a:b@h:1", "nats://a:c@h:2"])).unwrap_err();
        assert_eq!(at, 1);
        assert!(why.contains("server [0]") && !why.contains(":c@"), "{why}");
    }

    #[test]
    fn an_nkey_seed_file_is_read_when_it_holds_a_users_seed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            path
        };
        let user = nkeys::KeyPair::new_user();
        let seed = user.seed().unwrap();
        assert_eq!(
            read_nkey_seed(&write("user.nk", &format!("{seed}\n"))).unwrap(),
            seed
        );
        let decorated =
            format!("-----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n");
        assert_eq!(read_nkey_seed(&write("dec.nk", &decorated)).unwrap(), seed);

        let account = nkeys::KeyPair::new_account().seed().unwrap();
        let why = read_nkey_seed(&write("account.nk", &account)).unwrap_err();
        assert!(
            why.contains("not a user's") && !why.contains(&account),
            "{why}"
        );
        let broken = format!("{}X", &seed[..seed.len() - 1]);
        let why = read_nkey_seed(&write("broken.nk", &broken)).unwrap_err();
        assert!(
            why.contains("holds no nkey seed") && !why.contains(&broken),
            "{why}"
        );

        let open = write("open.nk", &seed);
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let why = read_nkey_seed(&open).unwrap_err();
        assert!(why.contains("mode 644") && !why.contains(&seed), "{why}");
    }
}
