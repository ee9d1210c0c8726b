//! Dashboard sessions. A login trades a token for a random session id,
//! kept by the browser in an HttpOnly cookie; the kernel keeps the token
//! itself, in memory only, and authenticates it again on every request, so
//! revoking or expiring the token ends its sessions at once. Each session
//! has its own CSRF token, which every state-changing request must echo in
//! a header that a cross-site form cannot set.
//!
//! Sessions are found by the SHA-256 of their id (a lookup never compares
//! secrets byte by byte), end after [`IDLE`] without a request or
//! [`LIFETIME`] after login, and at most [`MAX_SESSIONS`] are kept (the
//! least recently used goes first). A kernel restart ends them all.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::auth::Authenticator;
use crate::kernel::Caller;
use crate::tokens::{ct_eq, hash, random_token};

/// How long a session lasts without a request.
pub const IDLE: Duration = Duration::from_secs(12 * 3600);
/// How long a session lasts at most.
pub const LIFETIME: Duration = Duration::from_secs(7 * 24 * 3600);
/// Sessions kept at most.
pub const MAX_SESSIONS: usize = 256;

struct Session {
    /// The `authorization` header its token makes, checked on each request.
    authorization: String,
    csrf: String,
    created: Instant,
    last_seen: Instant,
}

/// A request's session: who it acts as, and its CSRF token.
#[derive(Debug, Clone)]
pub struct Active {
    pub caller: Caller,
    pub csrf: String,
}

/// Why a request has no session.
#[derive(Debug)]
pub enum NoSession {
    /// No cookie, an unknown or ended session.
    Missing,
    /// The token it logged in with no longer works (revoked, expired): the
    /// message says which, and the session is gone.
    Refused(String),
}

/// The live sessions.
pub struct Sessions {
    auth: Authenticator,
    by_hash: Mutex<HashMap<String, Session>>,
}

impl std::fmt::Debug for Sessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sessions")
            .field("open", &self.by_hash.lock().len())
            .finish_non_exhaustive()
    }
}

impl Sessions {
    /// No sessions yet; tokens are checked by `auth`.
    pub fn new(auth: Authenticator) -> Self {
        Sessions {
            auth,
            by_hash: Mutex::new(HashMap::new()),
        }
    }

    /// Logs in with `token`: the new session's id, and the session.
    pub fn login(&self, token: &str) -> Result<(String, Active), String> {
        let authorization = format!("Bearer {}", token.trim());
        let caller = self
            .auth
            .authenticate(Some(&authorization))
            .map_err(|status| status.message().to_owned())?;
        let (id, csrf) = random_token()
            .and_then(|id| Ok((id, random_token()?)))
            .map_err(|err| format!("cannot make a session: {err}"))?;
        let now = Instant::now();
        let mut sessions = self.by_hash.lock();
        sessions.retain(|_, session| live(session, now));
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, session)| session.last_seen)
                .map(|(key, _)| key.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(
            hash(&id),
            Session {
                authorization,
                csrf: csrf.clone(),
                created: now,
                last_seen: now,
            },
        );
        Ok((id, Active { caller, csrf }))
    }

    /// The session whose id is `id`, its token checked again.
    pub fn get(&self, id: &str) -> Result<Active, NoSession> {
        let key = hash(id);
        let now = Instant::now();
        let (authorization, csrf) = {
            let mut sessions = self.by_hash.lock();
            let Some(session) = sessions.get_mut(&key) else {
                return Err(NoSession::Missing);
            };
            if !live(session, now) {
                sessions.remove(&key);
                return Err(NoSession::Missing);
            }
            session.last_seen = now;
            (session.authorization.clone(), session.csrf.clone())
        };
        match self.auth.authenticate(Some(&authorization)) {
            Ok(caller) => Ok(Active { caller, csrf }),
            Err(status) => {
                self.by_hash.lock().remove(&key);
                Err(NoSession::Refused(status.message().to_owned()))
            }
        }
    }

    /// Ends the session whose id is `id`.
    pub fn logout(&self, id: &str) {
        self.by_hash.lock().remove(&hash(id));
    }
}

impl Active {
    /// Whether `given` is this session's CSRF token.
    pub fn csrf_matches(&self, given: &str) -> bool {
        ct_eq(given.as_bytes(), self.csrf.as_bytes())
    }
}

fn live(session: &Session, now: Instant) -> bool {
    now.duration_since(session.last_seen) < IDLE && now.duration_since(session.created) < LIFETIME
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::caller::Scope;

    fn sessions() -> Sessions {
        Sessions::new(Authenticator::new("admin-secret".to_owned()))
    }

    #[test]
    fn a_login_makes_a_session_its_id_finds_again() {
        let sessions = sessions();
        let (id, active) = sessions.login("admin-secret").unwrap();
        assert_eq!(active.caller.scope(), Scope::Admin);
        let again = sessions.get(&id).unwrap();
        assert!(again.csrf_matches(&active.csrf));
        assert!(!again.csrf_matches("forged"));
        assert!(matches!(
            sessions.get("another-id"),
            Err(NoSession::Missing)
        ));
        sessions.logout(&id);
        assert!(matches!(sessions.get(&id), Err(NoSession::Missing)));
    }

    #[test]
    fn a_wrong_token_makes_no_session() {
        let sessions = sessions();
        let err = sessions.login("admin-secre").unwrap_err();
        assert_eq!(err, "invalid token");
        assert!(sessions.by_hash.lock().is_empty());
    }

    #[test]
    fn the_least_recently_used_session_makes_room() {
        let sessions = sessions();
        let (first, _) = sessions.login("admin-secret").unwrap();
        let mut ids = Vec::new();
        for _ in 1..MAX_SESSIONS {
            ids.push(sessions.login("admin-secret").unwrap().0);
        }
        // Touched, so not the oldest any more.
        sessions.get(&first).unwrap();
        sessions.login("admin-secret").unwrap();
        assert_eq!(sessions.by_hash.lock().len(), MAX_SESSIONS);
        assert!(sessions.get(&first).is_ok());
        assert!(matches!(sessions.get(&ids[0]), Err(NoSession::Missing)));
    }
}
