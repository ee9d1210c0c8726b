//! Dashboard sessions. A login trades a token for two secrets: a random
//! session id, kept by the browser in an HttpOnly cookie, and a session
//! key, answered once in the login's body and kept by the page in its
//! session storage. Every API call must carry both, the key in the
//! `X-CSRF-Token` header: a cookie alone authenticates nothing. That
//! matters because browsers send a host's cookies to every port of it, so
//! anything listening on another port of the dashboard's host (a command
//! an agent runs, say) is handed the cookie by the operator's browser; the
//! key it cannot learn, as no call answers it but the login. A live
//! stream, which a page opens without headers (`EventSource`), carries a
//! ticket instead: a single-use secret the page asks for with its key just
//! before, good for [`TICKET_LIFETIME`].
//!
//! The kernel keeps the token itself in memory only, and authenticates it
//! again on every request, so revoking or expiring the token ends its
//! sessions at once. Sessions are found by the SHA-256 of their id (a
//! lookup never compares secrets byte by byte), end after [`IDLE`]
//! without a request or [`LIFETIME`] after login. One token holds at most
//! [`MAX_PER_TOKEN`] sessions (its least recently used goes first), and at
//! most [`MAX_SESSIONS`] are open at once (a login past that is refused:
//! logins with one token cannot end another's sessions). A kernel restart
//! ends them all.

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
/// Sessions open at once at most.
pub const MAX_SESSIONS: usize = 4096;
/// Sessions one token holds at most.
pub const MAX_PER_TOKEN: usize = 16;
/// How long a live stream's ticket may be used.
pub const TICKET_LIFETIME: Duration = Duration::from_secs(30);
/// Tickets a session holds unused at most (the oldest goes first).
const MAX_TICKETS: usize = 32;

struct Session {
    /// The `authorization` header its token makes, checked on each request.
    authorization: String,
    /// The SHA-256 of that token: its sessions are counted together.
    token: String,
    /// The session key the page sends with every call.
    key: String,
    created: Instant,
    last_seen: Instant,
    /// The SHA-256 of each unused ticket, and when it was made.
    tickets: Vec<(String, Instant)>,
}

/// A request's session: who it acts as.
#[derive(Debug, Clone)]
pub struct Active {
    pub caller: Caller,
}

/// Why a request has no session.
#[derive(Debug)]
pub enum NoSession {
    /// No cookie, an unknown or ended session.
    Missing,
    /// The cookie names a session, but the key or ticket that must come
    /// with it is missing or wrong.
    Unproven(&'static str),
    /// The token it logged in with no longer works (revoked, expired): the
    /// message says which, and the session is gone.
    Refused(String),
}

/// Why a login made no session.
#[derive(Debug)]
pub enum LoginError {
    /// The token does not authenticate.
    Refused(String),
    /// [`MAX_SESSIONS`] are open, or no secret could be made.
    Unavailable(String),
}

/// A new session's secrets and caller.
#[derive(Debug)]
pub struct LoggedIn {
    /// For the cookie.
    pub id: String,
    /// For the page, answered once.
    pub key: String,
    pub active: Active,
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

    /// Logs in with `token`.
    pub fn login(&self, token: &str) -> Result<LoggedIn, LoginError> {
        let token = token.trim();
        let authorization = format!("Bearer {token}");
        let caller = self
            .auth
            .authenticate(Some(&authorization))
            .map_err(|status| LoginError::Refused(status.message().to_owned()))?;
        let (id, key) = random_token()
            .and_then(|id| Ok((id, random_token()?)))
            .map_err(|err| LoginError::Unavailable(format!("cannot make a session: {err}")))?;
        let token = hash(token);
        let now = Instant::now();
        let mut sessions = self.by_hash.lock();
        sessions.retain(|_, session| live(session, now));
        let mut own: Vec<(&String, Instant)> = sessions
            .iter()
            .filter(|(_, session)| session.token == token)
            .map(|(key, session)| (key, session.last_seen))
            .collect();
        if own.len() >= MAX_PER_TOKEN {
            own.sort_by_key(|(_, seen)| *seen);
            let ended: Vec<String> = own[..=own.len() - MAX_PER_TOKEN]
                .iter()
                .map(|(key, _)| (*key).clone())
                .collect();
            for key in ended {
                sessions.remove(&key);
            }
        } else if sessions.len() >= MAX_SESSIONS {
            return Err(LoginError::Unavailable(format!(
                "{MAX_SESSIONS} dashboard sessions are open: log out of one, or wait for one to end"
            )));
        }
        sessions.insert(
            hash(&id),
            Session {
                authorization,
                token,
                key: key.clone(),
                created: now,
                last_seen: now,
                tickets: Vec::new(),
            },
        );
        Ok(LoggedIn {
            id,
            key,
            active: Active { caller },
        })
    }

    /// The session whose id is `id`, proven by its key, its token checked
    /// again.
    pub fn get(&self, id: &str, key: &str) -> Result<Active, NoSession> {
        self.find(id, |session, _| {
            if ct_eq(key.as_bytes(), session.key.as_bytes()) {
                Ok(())
            } else if key.is_empty() {
                Err(NoSession::Unproven(
                    "this page does not hold the session's key (X-CSRF-Token): log in again",
                ))
            } else {
                Err(NoSession::Unproven(
                    "the session's key (X-CSRF-Token) is wrong: log in again",
                ))
            }
        })
    }

    /// A new ticket for a live stream of the session `id`, proven by its key.
    pub fn ticket(&self, id: &str, key: &str) -> Result<String, NoSession> {
        self.get(id, key)?;
        let ticket = random_token()
            .map_err(|err| NoSession::Refused(format!("cannot make a ticket: {err}")))?;
        let now = Instant::now();
        let mut sessions = self.by_hash.lock();
        let session = sessions.get_mut(&hash(id)).ok_or(NoSession::Missing)?;
        session
            .tickets
            .retain(|(_, made)| now.duration_since(*made) < TICKET_LIFETIME);
        if session.tickets.len() >= MAX_TICKETS {
            session.tickets.remove(0);
        }
        session.tickets.push((hash(&ticket), now));
        Ok(ticket)
    }

    /// The session whose id is `id`, proven by one of its tickets, which
    /// is used up.
    pub fn redeem(&self, id: &str, ticket: &str) -> Result<Active, NoSession> {
        let ticket = hash(ticket);
        self.find(id, |session, now| {
            let found = session
                .tickets
                .iter()
                .position(|(hash, _)| ct_eq(hash.as_bytes(), ticket.as_bytes()));
            match found {
                Some(at) => {
                    let (_, made) = session.tickets.remove(at);
                    if now.duration_since(made) < TICKET_LIFETIME {
                        Ok(())
                    } else {
                        Err(NoSession::Unproven(
                            "the stream's ticket has expired: open it again",
                        ))
                    }
                }
                None => Err(NoSession::Unproven(
                    "a live stream needs a ticket (POST /api/ticket) that was not used yet",
                )),
            }
        })
    }

    /// The session whose id is `id` if it is live and `proof` accepts it,
    /// its token checked again.
    fn find(
        &self,
        id: &str,
        proof: impl FnOnce(&mut Session, Instant) -> Result<(), NoSession>,
    ) -> Result<Active, NoSession> {
        let lookup = hash(id);
        let now = Instant::now();
        let authorization = {
            let mut sessions = self.by_hash.lock();
            let Some(session) = sessions.get_mut(&lookup) else {
                return Err(NoSession::Missing);
            };
            if !live(session, now) {
                sessions.remove(&lookup);
                return Err(NoSession::Missing);
            }
            proof(session, now)?;
            session.last_seen = now;
            session.authorization.clone()
        };
        match self.auth.authenticate(Some(&authorization)) {
            Ok(caller) => Ok(Active { caller }),
            Err(status) => {
                self.by_hash.lock().remove(&lookup);
                Err(NoSession::Refused(status.message().to_owned()))
            }
        }
    }

    /// Ends the session whose id is `id`.
    pub fn logout(&self, id: &str) {
        self.by_hash.lock().remove(&hash(id));
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
    fn a_session_is_found_by_its_id_and_key_together() {
        let sessions = sessions();
        let login = sessions.login("admin-secret").unwrap();
        assert_eq!(login.active.caller.scope(), Scope::Admin);
        assert_ne!(login.id, login.key);
        let again = sessions.get(&login.id, &login.key).unwrap();
        assert_eq!(again.caller.scope(), Scope::Admin);
        // The cookie alone, or with a wrong key, proves nothing.
        assert!(matches!(
            sessions.get(&login.id, ""),
            Err(NoSession::Unproven(_))
        ));
        assert!(matches!(
            sessions.get(&login.id, &"0".repeat(login.key.len())),
            Err(NoSession::Unproven(_))
        ));
        assert!(matches!(
            sessions.get("another-id", &login.key),
            Err(NoSession::Missing)
        ));
        sessions.logout(&login.id);
        assert!(matches!(
            sessions.get(&login.id, &login.key),
            Err(NoSession::Missing)
        ));
    }

    #[test]
    fn a_ticket_opens_one_stream_of_its_own_session() {
        let sessions = sessions();
        let one = sessions.login("admin-secret").unwrap();
        let other = sessions.login("admin-secret").unwrap();
        assert!(matches!(
            sessions.ticket(&one.id, "wrong"),
            Err(NoSession::Unproven(_))
        ));
        let ticket = sessions.ticket(&one.id, &one.key).unwrap();
        // Not with another session's cookie.
        assert!(matches!(
            sessions.redeem(&other.id, &ticket),
            Err(NoSession::Unproven(_))
        ));
        assert!(sessions.redeem(&one.id, &ticket).is_ok());
        // Used up.
        assert!(matches!(
            sessions.redeem(&one.id, &ticket),
            Err(NoSession::Unproven(_))
        ));
        // The key is no ticket.
        assert!(sessions.redeem(&one.id, &one.key).is_err());
    }

    #[test]
    fn a_wrong_token_makes_no_session() {
        let sessions = sessions();
        let Err(LoginError::Refused(err)) = sessions.login("admin-secre") else {
            panic!("a wrong token logged in");
        };
        assert_eq!(err, "invalid token");
        assert!(sessions.by_hash.lock().is_empty());
    }

    #[test]
    fn a_token_s_logins_end_only_its_own_least_recently_used_sessions() {
        let tokens = crate::tokens::OperatorTokens::default();
        let sessions =
            Sessions::new(Authenticator::new("admin-secret".into()).with_operators(tokens.clone()));
        let (token, viewer) = tokens.mint(Some("viewer"), Scope::Read, None, 0).unwrap();
        tokens.put(token).unwrap();
        let operator = sessions.login("admin-secret").unwrap();
        let mut ids = Vec::new();
        for _ in 0..MAX_PER_TOKEN {
            ids.push(sessions.login(&viewer).unwrap());
        }
        // The viewer's first session made room; the operator's stays.
        sessions.get(&ids[0].id, &ids[0].key).unwrap();
        for _ in 0..3 * MAX_PER_TOKEN {
            sessions.login(&viewer).unwrap();
        }
        assert!(sessions.get(&operator.id, &operator.key).is_ok());
        assert_eq!(sessions.by_hash.lock().len(), MAX_PER_TOKEN + 1);
        assert!(matches!(
            sessions.get(&ids[1].id, &ids[1].key),
            Err(NoSession::Missing)
        ));
    }
}
