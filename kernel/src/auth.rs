//! Bearer-token authentication for the control plane.
//!
//! The admin token lives in `<data_dir>/admin.token` (mode 0600) and acts as
//! the kernel itself. Per-process tokens, issued to external runtimes, act as
//! their process only. The token is the whole credential: no other request
//! header can name or change the caller. Tokens are never logged.

use std::collections::HashMap;
use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hivekernel_agents::Pid;
use parking_lot::RwLock;
use tonic::Status;

use crate::caller::Caller;

/// Name of the admin token file inside the data directory.
const ADMIN_TOKEN_FILE: &str = "admin.token";
/// Random bytes in a token (hex-encoded to twice as many characters).
const TOKEN_BYTES: usize = 32;
/// Message for a request without credentials.
const MISSING: &str = "missing authorization metadata: send `authorization: Bearer <token>` \
                       (the admin token is in <data_dir>/admin.token)";
/// Message for a malformed or unknown credential; deliberately says no more.
const INVALID: &str = "invalid token";

/// Where the admin token of `data_dir` is kept.
pub fn admin_token_path(data_dir: &Path) -> PathBuf {
    data_dir.join(ADMIN_TOKEN_FILE)
}

/// Reads the admin token of `data_dir`, creating the directory and a fresh
/// random token (mode 0600) on first use.
pub fn load_or_create_admin_token(data_dir: &Path) -> io::Result<String> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)?;
    let path = admin_token_path(data_dir);
    if !path.exists() {
        let token = random_token()?;
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut file) => {
                file.write_all(token.as_bytes())?;
                file.write_all(b"\n")?;
                file.sync_all()?;
                return Ok(token);
            }
            // Another kernel created it first: use theirs.
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
            Err(err) => return Err(err),
        }
    }
    read_admin_token(&path)
}

fn read_admin_token(path: &Path) -> io::Result<String> {
    let mode = std::fs::metadata(path)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        tracing::warn!(
            path = %path.display(),
            was = format_args!("{:o}", mode & 0o777),
            "admin token file was open to other users; its mode is now 600"
        );
    }
    let token = std::fs::read_to_string(path)?.trim().to_owned();
    if token.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "admin token file {} is empty; delete it to have a new token generated",
                path.display()
            ),
        ));
    }
    Ok(token)
}

/// A fresh random token, hex-encoded.
fn random_token() -> io::Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|err| io::Error::other(format!("cannot get random bytes from the OS: {err}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A secret that never shows in `Debug` output.
#[derive(Clone)]
struct Secret(Arc<str>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Maps bearer tokens to callers: the admin token, and tokens issued to processes.
#[derive(Clone, Debug)]
pub struct Authenticator {
    admin: Secret,
    /// Per-process secrets by PID; a process token reads `p<pid>.<secret>`.
    issued: Arc<RwLock<HashMap<Pid, Secret>>>,
}

impl Authenticator {
    /// An authenticator that knows the admin token and no process tokens yet.
    pub fn new(admin_token: String) -> Self {
        Authenticator {
            admin: Secret(Arc::from(admin_token)),
            issued: Arc::default(),
        }
    }

    /// Checks an `authorization` header value and names the caller. Only
    /// the canonical form is accepted: `Bearer` (in any case), one space and
    /// the token, nothing around it; a token with spaces around it is another
    /// string, and refused.
    pub fn authenticate(&self, header: Option<&str>) -> Result<Caller, Status> {
        let header = header.ok_or_else(|| Status::unauthenticated(MISSING))?;
        let invalid = || Status::unauthenticated(INVALID);
        let (scheme, token) = header.split_once(' ').ok_or_else(invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(invalid());
        }
        if ct_eq(token.as_bytes(), self.admin.0.as_bytes()) {
            return Ok(Caller::Admin);
        }
        let (pid, secret) = parse_process_token(token).ok_or_else(invalid)?;
        let issued = self.issued.read();
        match issued.get(&pid) {
            Some(expected) if ct_eq(secret.as_bytes(), expected.0.as_bytes()) => {
                Ok(Caller::Process(pid))
            }
            _ => Err(invalid()),
        }
    }

    /// Issues a token that acts as `pid`, replacing any earlier one.
    pub fn issue(&self, pid: Pid) -> io::Result<String> {
        let secret = random_token()?;
        let token = format!("p{pid}.{secret}");
        self.issued.write().insert(pid, Secret(Arc::from(secret)));
        Ok(token)
    }

    /// Revokes the token issued to `pid`, if any.
    pub fn revoke(&self, pid: Pid) {
        self.issued.write().remove(&pid);
    }
}

/// `p<pid>.<secret>`, the PID in its one decimal spelling (no sign, no
/// leading zero), so one process has one token string.
fn parse_process_token(token: &str) -> Option<(Pid, &str)> {
    let (pid, secret) = token.strip_prefix('p')?.split_once('.')?;
    let canonical = !pid.is_empty()
        && pid.bytes().all(|b| b.is_ascii_digit())
        && (pid == "0" || !pid.starts_with('0'));
    if !canonical {
        return None;
    }
    Some((Pid(pid.parse().ok()?), secret))
}

/// Compares two byte strings without stopping at the first difference.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tonic::Code;

    #[test]
    fn admin_token_is_created_once_with_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("nested/data");
        let first = load_or_create_admin_token(&data_dir).unwrap();
        assert_eq!(first.len(), TOKEN_BYTES * 2);
        assert!(first.bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(admin_token_path(&data_dir))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(load_or_create_admin_token(&data_dir).unwrap(), first);
    }

    #[test]
    fn empty_token_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(admin_token_path(dir.path()), "  \n").unwrap();
        let err = load_or_create_admin_token(dir.path()).unwrap_err();
        assert!(err.to_string().contains("admin.token"), "{err}");
    }

    #[test]
    fn bearer_admin_token_is_admin() {
        let auth = Authenticator::new("s3cret".into());
        assert_eq!(
            auth.authenticate(Some("Bearer s3cret")).unwrap(),
            Caller::Admin
        );
        assert_eq!(
            auth.authenticate(Some("bearer s3cret")).unwrap(),
            Caller::Admin
        );
    }

    #[test]
    fn bad_credentials_are_unauthenticated() {
        let auth = Authenticator::new("s3cret".into());
        let missing = auth.authenticate(None).unwrap_err();
        assert_eq!(missing.code(), Code::Unauthenticated);
        assert!(missing.message().contains("authorization: Bearer"));
        for header in [
            "",
            "s3cret",
            "Basic s3cret",
            "Bearer s3cre",
            "Bearer s3cret2",
            "Bearer ",
            "Bearer  s3cret",
            "Bearer s3cret ",
            " Bearer s3cret",
        ] {
            let err = auth.authenticate(Some(header)).unwrap_err();
            assert_eq!(err.code(), Code::Unauthenticated, "{header:?}");
            assert_eq!(err.message(), INVALID);
        }
    }

    #[test]
    fn issued_process_tokens_act_as_their_process_until_revoked() {
        let auth = Authenticator::new("admin".into());
        let token = auth.issue(Pid(7)).unwrap();
        let header = format!("Bearer {token}");
        assert_eq!(
            auth.authenticate(Some(&header)).unwrap(),
            Caller::Process(Pid(7))
        );
        let forged = token.replacen("p7.", "p8.", 1);
        assert!(
            auth.authenticate(Some(&format!("Bearer {forged}")))
                .is_err()
        );
        auth.revoke(Pid(7));
        assert!(auth.authenticate(Some(&header)).is_err());
    }

    #[test]
    fn debug_output_hides_tokens() {
        let auth = Authenticator::new("s3cret".into());
        auth.issue(Pid(2)).unwrap();
        let shown = format!("{auth:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn ct_eq_compares_whole_strings() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }
}
