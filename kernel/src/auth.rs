//! Bearer-token authentication for the control plane, and the one table of
//! what each RPC needs.
//!
//! The admin token lives in `<data_dir>/admin.token` (mode 0600) and acts as
//! the kernel itself. Per-process tokens, issued to external runtimes, act as
//! their process only. Operator tokens (`hivekernel token create`, see
//! [`crate::tokens`]) see what the admin sees within their scope. The token
//! is the whole credential: no other request header can name or change the
//! caller. Tokens are never logged. [`check_scope`] refuses a call the
//! caller's scope does not cover, for every RPC, in one place.

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

use crate::caller::{Caller, Scope};
use crate::tokens::{OperatorTokens, Refused, ct_eq, random_token};

/// Name of the admin token file inside the data directory.
const ADMIN_TOKEN_FILE: &str = "admin.token";
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

/// A secret that never shows in `Debug` output.
#[derive(Clone)]
struct Secret(Arc<str>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Maps bearer tokens to callers: the admin token, tokens issued to
/// processes, and operator tokens.
#[derive(Clone, Debug)]
pub struct Authenticator {
    admin: Secret,
    /// Per-process secrets by PID; a process token reads `p<pid>.<secret>`.
    issued: Arc<RwLock<HashMap<Pid, Secret>>>,
    /// The kernel's operator tokens (`o<id>.<secret>`); none until
    /// [`Authenticator::with_operators`].
    operators: OperatorTokens,
    /// On a node of a cluster: the SHA-256 of the token another node
    /// issued to a process, as the directory lists it (set once the node
    /// has joined).
    elsewhere: Arc<Elsewhere>,
}

/// How tokens issued by other nodes are read, once the node has joined.
#[derive(Default)]
struct Elsewhere(std::sync::OnceLock<Digests>);

impl fmt::Debug for Elsewhere {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "<the directory>"
        } else {
            "<none>"
        })
    }
}

/// The SHA-256 (hex) of the token issued to a process on another node.
pub type Digests = Arc<dyn Fn(Pid) -> Option<String> + Send + Sync>;

impl Authenticator {
    /// An authenticator that knows the admin token and no process tokens yet.
    pub fn new(admin_token: String) -> Self {
        Authenticator {
            admin: Secret(Arc::from(admin_token)),
            issued: Arc::default(),
            operators: OperatorTokens::default(),
            elsewhere: Arc::default(),
        }
    }

    /// Also accepts the tokens other nodes of a cluster issued to their
    /// processes: checked against the SHA-256 `digests` reads from the
    /// directory. Set once; a later call changes nothing.
    pub fn honour_elsewhere(&self, digests: Digests) {
        let _ = self.elsewhere.0.set(digests);
    }

    /// The SHA-256 (hex) of the token issued to `pid` here, if any.
    pub fn digest(&self, pid: Pid) -> Option<String> {
        let issued = self.issued.read();
        issued
            .get(&pid)
            .map(|secret| crate::tokens::hash(&secret.0))
    }

    /// This authenticator, also accepting the operator tokens in `operators`
    /// (the kernel's registry, which token changes update).
    pub fn with_operators(mut self, operators: OperatorTokens) -> Self {
        self.operators = operators;
        self
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
        if let Some((id, secret)) = crate::tokens::parse(token) {
            let now = crate::event::unix_ms(std::time::SystemTime::now());
            // Only the holder of the real secret learns why it stopped working.
            return match self.operators.authenticate(id, secret, now) {
                Ok(scope) => Ok(Caller::Operator { token: id, scope }),
                Err(Refused::Unknown) => Err(invalid()),
                Err(Refused::Expired(name)) => Err(Status::unauthenticated(format!(
                    "token {name:?} has expired: create a new one with `hivekernel token create`"
                ))),
                Err(Refused::Revoked(name)) => Err(Status::unauthenticated(format!(
                    "token {name:?} was revoked"
                ))),
            };
        }
        let (pid, secret) = parse_process_token(token).ok_or_else(invalid)?;
        let here = self
            .issued
            .read()
            .get(&pid)
            .map(|expected| ct_eq(secret.as_bytes(), expected.0.as_bytes()));
        match here {
            Some(true) => Ok(Caller::Process(pid)),
            Some(false) => Err(invalid()),
            // Issued by the node holding it, if another node does.
            None => {
                let expected = self.elsewhere.0.get().and_then(|digests| digests(pid));
                match expected {
                    Some(expected)
                        if ct_eq(crate::tokens::hash(secret).as_bytes(), expected.as_bytes()) =>
                    {
                        Ok(Caller::Process(pid))
                    }
                    _ => Err(invalid()),
                }
            }
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

/// The `hivekernel.v1.Kernel` service's path prefix.
const KERNEL_SERVICE: &str = "/hivekernel.v1.Kernel/";

/// What each RPC of the kernel service needs. A method missing here needs
/// `admin` (a test checks that every RPC in the proto file is listed).
const METHOD_SCOPES: &[(&str, Scope)] = &[
    // Reads.
    ("GetProcess", Scope::Read),
    ("FindProcess", Scope::Read),
    ("ListProcesses", Scope::Read),
    ("SubscribeEvents", Scope::Read),
    ("ListCron", Scope::Read),
    ("GetUsageReport", Scope::Read),
    ("GetArtifact", Scope::Read),
    ("ListArtifacts", Scope::Read),
    ("GetTranscript", Scope::Read),
    ("WatchTranscript", Scope::Read),
    ("ReadLog", Scope::Read),
    ("ListMcpServers", Scope::Read),
    ("ListNodes", Scope::Read),
    ("ListMcpTools", Scope::Read),
    ("ListSkills", Scope::Read),
    ("GetSkill", Scope::Read),
    ("SkillHistory", Scope::Read),
    ("ListRequests", Scope::Read),
    ("WatchRequests", Scope::Read),
    // Acting on processes and what they own.
    ("Spawn", Scope::Operate),
    ("Kill", Scope::Operate),
    ("RestartProcess", Scope::Operate),
    ("SendMessage", Scope::Operate),
    ("ExecuteTask", Scope::Operate),
    ("WaitChild", Scope::Operate),
    ("AddCron", Scope::Operate),
    ("RemoveCron", Scope::Operate),
    ("SetCronEnabled", Scope::Operate),
    ("RunCron", Scope::Operate),
    ("StoreArtifact", Scope::Operate),
    ("DeleteArtifact", Scope::Operate),
    ("ManageSkill", Scope::Operate),
    ("CallMcpTool", Scope::Operate),
    ("Resolve", Scope::Operate),
    // An external agent's own runtime calls.
    ("Attach", Scope::Operate),
    ("AckMessages", Scope::Operate),
    ("CompleteTask", Scope::Operate),
    // The kernel itself.
    ("ReloadConfig", Scope::Admin),
    ("RestartMcpServer", Scope::Admin),
    ("CreateToken", Scope::Admin),
    ("ListTokens", Scope::Admin),
    ("RevokeToken", Scope::Admin),
];

/// The service and method a gRPC `path` names, as the kernel's own
/// strings, when it is one this server has (`None`: anything else, which a
/// metric must not take as a label).
pub fn known_method(path: &str) -> Option<(&'static str, &'static str)> {
    const OTHERS: &[(&str, &str)] = &[
        ("grpc.health.v1.Health", "Check"),
        ("grpc.health.v1.Health", "Watch"),
        (
            "grpc.reflection.v1.ServerReflection",
            "ServerReflectionInfo",
        ),
        (
            "grpc.reflection.v1alpha.ServerReflection",
            "ServerReflectionInfo",
        ),
    ];
    if let Some(method) = path.strip_prefix(KERNEL_SERVICE) {
        return METHOD_SCOPES
            .iter()
            .find(|(name, _)| *name == method)
            .map(|(name, _)| ("hivekernel.v1.Kernel", *name));
    }
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    OTHERS
        .iter()
        .find(|(s, m)| *s == service && *m == method)
        .copied()
}

/// The scope a call to the gRPC method at `path` (`/package.Service/Method`)
/// needs: the kernel service's from [`METHOD_SCOPES`], `read` for the health
/// and reflection services.
pub fn scope_needed(path: &str) -> Scope {
    match path.strip_prefix(KERNEL_SERVICE) {
        Some(method) => METHOD_SCOPES
            .iter()
            .find(|(name, _)| *name == method)
            .map_or(Scope::Admin, |(_, scope)| *scope),
        None => Scope::Read,
    }
}

/// Refuses `caller` a call to `path` its scope does not cover:
/// PERMISSION_DENIED naming the scope needed.
pub fn check_scope(caller: Caller, path: &str) -> Result<(), Status> {
    let needed = scope_needed(path);
    if caller.scope() >= needed {
        return Ok(());
    }
    let method = path.rsplit('/').next().unwrap_or(path);
    let hint = match caller {
        Caller::Process(_) => "a process token may not call it; use the admin token".to_owned(),
        _ => format!(
            "this token's scope is {}; create one with `hivekernel token create --scope {needed}`",
            caller.scope()
        ),
    };
    Err(Status::permission_denied(format!(
        "{method} needs the {needed} scope: {hint}"
    )))
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
        assert_eq!(first.len(), crate::tokens::TOKEN_BYTES * 2);
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
    fn a_token_another_node_issued_is_honoured_by_its_digest() {
        // Node b issued PID 9's token; node a reads its digest from the directory.
        let b = Authenticator::new("admin-b".into());
        let token = b.issue(Pid(9)).unwrap();
        let digest = b.digest(Pid(9)).unwrap();
        let a = Authenticator::new("admin-a".into());
        let header = format!("Bearer {token}");
        assert!(a.authenticate(Some(&header)).is_err(), "no directory yet");
        a.honour_elsewhere(Arc::new(move |pid| (pid == Pid(9)).then(|| digest.clone())));
        assert_eq!(
            a.authenticate(Some(&header)).unwrap(),
            Caller::Process(Pid(9))
        );
        let wrong = format!("Bearer p9.{}", "0".repeat(43));
        assert!(a.authenticate(Some(&wrong)).is_err());
        let other = token.replacen("p9.", "p10.", 1);
        assert!(a.authenticate(Some(&format!("Bearer {other}"))).is_err());
        // A PID this node issued a token to is checked here only.
        let own = a.issue(Pid(9)).unwrap();
        assert!(a.authenticate(Some(&header)).is_err());
        assert!(a.authenticate(Some(&format!("Bearer {own}"))).is_ok());
    }

    #[test]
    fn debug_output_hides_tokens() {
        let auth = Authenticator::new("s3cret".into());
        auth.issue(Pid(2)).unwrap();
        let shown = format!("{auth:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
    }

    #[test]
    fn every_rpc_in_the_proto_file_has_exactly_one_scope() {
        let proto = include_str!("../../proto/proto/hivekernel/v1/kernel.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|line| line.trim().strip_prefix("rpc "))
            .filter_map(|rest| rest.split('(').next())
            .map(str::trim)
            .collect();
        assert!(rpcs.len() > 20, "{rpcs:?}");
        for rpc in &rpcs {
            let listed = METHOD_SCOPES.iter().filter(|(m, _)| m == rpc).count();
            assert_eq!(listed, 1, "{rpc} must be in METHOD_SCOPES once");
        }
        for (method, _) in METHOD_SCOPES {
            assert!(
                rpcs.contains(method),
                "{method} is not an RPC of the proto file"
            );
        }
    }

    #[test]
    fn a_scope_covers_the_ones_below_it_and_names_what_is_needed() {
        let read = Caller::Operator {
            token: 3,
            scope: Scope::Read,
        };
        let operate = Caller::Operator {
            token: 4,
            scope: Scope::Operate,
        };
        let list = "/hivekernel.v1.Kernel/ListProcesses";
        let kill = "/hivekernel.v1.Kernel/Kill";
        let reload = "/hivekernel.v1.Kernel/ReloadConfig";
        assert!(check_scope(read, list).is_ok());
        assert!(check_scope(read, "/grpc.health.v1.Health/Check").is_ok());
        let err = check_scope(read, kill).unwrap_err();
        assert_eq!(err.code(), Code::PermissionDenied);
        assert!(
            err.message().contains("Kill needs the operate scope"),
            "{err:?}"
        );
        assert!(err.message().contains("scope is read"), "{err:?}");
        assert!(check_scope(operate, kill).is_ok());
        assert!(check_scope(operate, reload).is_err());
        assert!(check_scope(Caller::Admin, reload).is_ok());
        assert!(check_scope(Caller::Process(Pid(5)), kill).is_ok());
        let err =
            check_scope(Caller::Process(Pid(5)), "/hivekernel.v1.Kernel/CreateToken").unwrap_err();
        assert!(
            err.message().contains("CreateToken needs the admin scope"),
            "{err:?}"
        );
        // A method the table does not know needs the most.
        assert_eq!(scope_needed("/hivekernel.v1.Kernel/Teleport"), Scope::Admin);
    }

    #[test]
    fn operator_tokens_authenticate_with_their_scope_until_revoked() {
        let tokens = OperatorTokens::default();
        let auth = Authenticator::new("admin".into()).with_operators(tokens.clone());
        let (token, text) = tokens.mint(Some("grafana"), Scope::Read, None, 0).unwrap();
        tokens.put(token).unwrap();
        let header = format!("Bearer {text}");
        assert_eq!(
            auth.authenticate(Some(&header)).unwrap(),
            Caller::Operator {
                token: 1,
                scope: Scope::Read
            }
        );
        let forged = format!("Bearer {}x", text);
        assert_eq!(
            auth.authenticate(Some(&forged)).unwrap_err().message(),
            INVALID
        );
        tokens.put(tokens.revoked("grafana", 1).unwrap()).unwrap();
        let err = auth.authenticate(Some(&header)).unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated);
        assert!(err.message().contains("\"grafana\" was revoked"), "{err:?}");
    }

    #[test]
    fn ct_eq_compares_whole_strings() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(ct_eq(b"", b""));
    }
}
