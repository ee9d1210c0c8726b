//! Operator tokens: credentials for the people and tools that operate the
//! kernel without holding the admin token (a dashboard, a monitoring
//! script, an on-call engineer). Each has a scope ([`Scope`]), a name and an
//! optional expiry. A token reads `o<id>.<secret>`; only the SHA-256 of the
//! secret is kept, in the store and here, so neither a copy of the data
//! directory nor a memory dump yields a usable token. Revoked tokens stay
//! listed (with when they were revoked), and their ids are never reused.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::caller::Scope;

/// Random bytes in a token's secret (hex-encoded to twice as many characters).
pub(crate) const TOKEN_BYTES: usize = 32;

/// Longest token name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// One operator token as the kernel keeps it (never its secret).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorToken {
    /// Its number, in the token string (`o<id>.`); never reused.
    pub id: u64,
    /// Its name: unique among tokens not revoked.
    pub name: String,
    /// What it may do.
    pub scope: Scope,
    /// When it was created (Unix ms).
    pub created_ms: u64,
    /// When it stops working (Unix ms); `None`: never.
    pub expires_ms: Option<u64>,
    /// When it was revoked (Unix ms); `None`: it was not.
    pub revoked_ms: Option<u64>,
    /// SHA-256 of its secret, hex.
    pub(crate) hash: String,
}

impl fmt::Debug for OperatorToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorToken")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("scope", &self.scope)
            .field("created_ms", &self.created_ms)
            .field("expires_ms", &self.expires_ms)
            .field("revoked_ms", &self.revoked_ms)
            .finish_non_exhaustive()
    }
}

impl OperatorToken {
    /// Whether it authenticates at `now_ms`: not revoked, not expired.
    pub fn is_active(&self, now_ms: u64) -> bool {
        self.revoked_ms.is_none() && self.expires_ms.is_none_or(|at| now_ms < at)
    }

    /// `active`, `expired` or `revoked` at `now_ms`.
    pub fn status(&self, now_ms: u64) -> &'static str {
        if self.revoked_ms.is_some() {
            "revoked"
        } else if self.is_active(now_ms) {
            "active"
        } else {
            "expired"
        }
    }
}

/// Why a token presented with a matching secret is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a token this kernel issued (or the secret does not match).
    Unknown,
    /// It expired at this time (Unix ms).
    Expired(String),
    /// It was revoked.
    Revoked(String),
}

/// What a token change was refused for (bad input, or a state it cannot apply to).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The name breaks the rules.
    #[error("{0}")]
    InvalidName(String),
    /// Another token not revoked has the name.
    #[error("a token named {0:?} exists (revoke it first, or choose another name)")]
    NameTaken(String),
    /// No token has that name or id.
    #[error("no token {0:?} (hivekernel token ls -a lists every token)")]
    NotFound(String),
    /// The token is revoked already.
    #[error("token {0:?} is already revoked")]
    AlreadyRevoked(String),
}

/// The kernel's operator tokens, shared by the operations that change them
/// and the authentication layer that checks them.
#[derive(Clone, Default)]
pub struct OperatorTokens {
    tokens: Arc<RwLock<BTreeMap<u64, OperatorToken>>>,
}

impl fmt::Debug for OperatorTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OperatorTokens")
            .field("count", &self.tokens.read().len())
            .finish()
    }
}

impl OperatorTokens {
    /// The registry holding `tokens` (as the store kept them).
    pub fn new(tokens: Vec<OperatorToken>) -> Self {
        let map = tokens.into_iter().map(|t| (t.id, t)).collect();
        OperatorTokens {
            tokens: Arc::new(RwLock::new(map)),
        }
    }

    /// The scope of the token `o<id>.<secret>` at `now_ms`, or why it is refused.
    pub fn authenticate(&self, id: u64, secret: &str, now_ms: u64) -> Result<Scope, Refused> {
        let tokens = self.tokens.read();
        let Some(token) = tokens.get(&id) else {
            return Err(Refused::Unknown);
        };
        if !ct_eq(hash(secret).as_bytes(), token.hash.as_bytes()) {
            return Err(Refused::Unknown);
        }
        if token.revoked_ms.is_some() {
            return Err(Refused::Revoked(token.name.clone()));
        }
        if !token.is_active(now_ms) {
            return Err(Refused::Expired(token.name.clone()));
        }
        Ok(token.scope)
    }

    /// Every token, oldest first; only those active at `now_ms` unless `all`.
    pub fn list(&self, all: bool, now_ms: u64) -> Vec<OperatorToken> {
        let tokens = self.tokens.read();
        tokens
            .values()
            .filter(|t| all || t.is_active(now_ms))
            .cloned()
            .collect()
    }

    /// The token of `id`, if any.
    pub fn get(&self, id: u64) -> Option<OperatorToken> {
        self.tokens.read().get(&id).cloned()
    }

    /// A new token (not yet kept anywhere) and its token string, shown
    /// once: `name` checked (a default made from its id when `None`), its
    /// id the next after every token ever made.
    pub fn mint(
        &self,
        name: Option<&str>,
        scope: Scope,
        expires_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<(OperatorToken, String), TokenError> {
        let tokens = self.tokens.read();
        let id = tokens.keys().next_back().map_or(1, |last| last + 1);
        let name = match name {
            Some(name) => {
                check_name(name)?;
                name.to_owned()
            }
            None => format!("token-{id}"),
        };
        if tokens
            .values()
            .any(|t| t.name == name && t.revoked_ms.is_none())
        {
            return Err(TokenError::NameTaken(name));
        }
        drop(tokens);
        let secret = random_token()
            .map_err(|err| TokenError::InvalidName(format!("cannot make a token: {err}")))?;
        let token = OperatorToken {
            id,
            name,
            scope,
            created_ms: now_ms,
            expires_ms,
            revoked_ms: None,
            hash: hash(&secret),
        };
        Ok((token, format!("o{id}.{secret}")))
    }

    /// The token named `which` (or numbered, `7` or `#7`), revoked at
    /// `now_ms` (not yet kept anywhere).
    pub fn revoked(&self, which: &str, now_ms: u64) -> Result<OperatorToken, TokenError> {
        let tokens = self.tokens.read();
        let by_id = which
            .strip_prefix('#')
            .unwrap_or(which)
            .parse::<u64>()
            .ok()
            .and_then(|id| tokens.get(&id));
        let found = by_id
            .or_else(|| {
                tokens
                    .values()
                    .find(|t| t.name == which && t.revoked_ms.is_none())
            })
            .or_else(|| tokens.values().rev().find(|t| t.name == which));
        let Some(token) = found else {
            return Err(TokenError::NotFound(which.to_owned()));
        };
        if token.revoked_ms.is_some() {
            return Err(TokenError::AlreadyRevoked(token.name.clone()));
        }
        let mut token = token.clone();
        token.revoked_ms = Some(now_ms);
        Ok(token)
    }

    /// Puts `token` in the registry (new, or its revoked self), once the
    /// store has it. A name another active token took meanwhile is refused.
    pub fn put(&self, token: OperatorToken) -> Result<(), TokenError> {
        let mut tokens = self.tokens.write();
        let clash = token.revoked_ms.is_none()
            && tokens
                .values()
                .any(|t| t.id != token.id && t.name == token.name && t.revoked_ms.is_none());
        if clash {
            return Err(TokenError::NameTaken(token.name));
        }
        tokens.insert(token.id, token);
        Ok(())
    }
}

/// Names are 1 to 64 letters, digits, `.`, `_` and `-`, starting with a
/// letter (so a name never reads as an id).
fn check_name(name: &str) -> Result<(), TokenError> {
    let starts_with_letter = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic());
    let allowed = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if name.len() > MAX_NAME_BYTES || !starts_with_letter || !allowed {
        return Err(TokenError::InvalidName(format!(
            "invalid token name {}: use 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' and \
             '-', starting with a letter",
            hivekernel_agents::text::shown(name)
        )));
    }
    Ok(())
}

/// A fresh random token, hex-encoded.
pub(crate) fn random_token() -> io::Result<String> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|err| io::Error::other(format!("cannot get random bytes from the OS: {err}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compares two byte strings without stopping at the first difference.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// SHA-256 of `secret`, hex.
pub(crate) fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `o<id>.<secret>`, the id in its one decimal spelling.
pub(crate) fn parse(token: &str) -> Option<(u64, &str)> {
    let (id, secret) = token.strip_prefix('o')?.split_once('.')?;
    let canonical =
        !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !id.starts_with('0');
    if !canonical || secret.is_empty() {
        return None;
    }
    Some((id.parse().ok()?, secret))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_minted_token_authenticates_with_its_scope_until_it_expires() {
        let tokens = OperatorTokens::default();
        let (token, text) = tokens
            .mint(Some("grafana"), Scope::Read, Some(2_000), 1_000)
            .unwrap();
        assert_eq!((token.id, token.name.as_str()), (1, "grafana"));
        assert!(!format!("{token:?}").contains(&token.hash));
        tokens.put(token).unwrap();
        let (id, secret) = parse(&text).unwrap();
        assert_eq!(tokens.authenticate(id, secret, 1_500), Ok(Scope::Read));
        assert_eq!(
            tokens.authenticate(id, secret, 2_000),
            Err(Refused::Expired("grafana".into()))
        );
        assert_eq!(
            tokens.authenticate(id, "wrong", 1_500),
            Err(Refused::Unknown)
        );
        assert_eq!(tokens.authenticate(9, secret, 1_500), Err(Refused::Unknown));
        assert_eq!(tokens.list(false, 3_000), []);
        assert_eq!(tokens.list(true, 3_000).len(), 1);
    }

    #[test]
    fn revoking_keeps_the_token_listed_and_frees_its_name() {
        let tokens = OperatorTokens::default();
        let (token, text) = tokens.mint(None, Scope::Operate, None, 0).unwrap();
        assert_eq!(token.name, "token-1");
        tokens.put(token).unwrap();
        let (id, secret) = parse(&text).unwrap();
        let revoked = tokens.revoked("#1", 5).unwrap();
        tokens.put(revoked).unwrap();
        assert_eq!(
            tokens.authenticate(id, secret, 6),
            Err(Refused::Revoked("token-1".into()))
        );
        assert_eq!(
            tokens.revoked("token-1", 7),
            Err(TokenError::AlreadyRevoked("token-1".into()))
        );
        let (again, _) = tokens.mint(Some("token-1"), Scope::Read, None, 8).unwrap();
        assert_eq!(again.id, 2, "ids are never reused");
        tokens.put(again).unwrap();
        assert_eq!(tokens.revoked("token-1", 9).unwrap().id, 2);
        assert_eq!(
            tokens.revoked("nobody", 9),
            Err(TokenError::NotFound("nobody".into()))
        );
    }

    #[test]
    fn names_and_token_strings_are_checked() {
        let tokens = OperatorTokens::default();
        for bad in ["", "7", "-x", "a b", "é", &"a".repeat(65)] {
            assert!(
                matches!(
                    tokens.mint(Some(bad), Scope::Read, None, 0),
                    Err(TokenError::InvalidName(_))
                ),
                "{bad:?}"
            );
        }
        let (token, _) = tokens.mint(Some("ci"), Scope::Admin, None, 0).unwrap();
        tokens.put(token).unwrap();
        assert_eq!(
            tokens.mint(Some("ci"), Scope::Read, None, 0).unwrap_err(),
            TokenError::NameTaken("ci".into())
        );
        for bad in ["o.x", "o01.x", "o1.", "p1.x", "o-1.x", "o1x"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
        assert_eq!(parse("o12.abc"), Some((12, "abc")));
    }
}
