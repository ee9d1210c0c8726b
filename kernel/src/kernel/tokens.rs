//! Operator tokens through the kernel: create, list, revoke. Each change is
//! committed to the store before it takes effect, and is a `token` event on
//! PID 1 naming who made it. Only a caller with the admin scope may call
//! these (the authentication layer refuses the rest first).

use std::time::{Duration, SystemTime};

use hivekernel_agents::Pid;

use super::{Caller, Kernel, Result};
use crate::caller::Scope;
use crate::error::KernelError;
use crate::events::{EventKind, unix_ms};
use crate::store::Write;
use crate::tokens::{OperatorToken, OperatorTokens};

/// Longest lifetime a token may be given: ten years.
pub const MAX_TOKEN_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// A token to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewToken {
    /// Its name; `None`: `token-<id>`.
    pub name: Option<String>,
    /// What it may do.
    pub scope: Scope,
    /// How long it works; `None`: until revoked.
    pub expires_in: Option<Duration>,
}

/// Operator tokens through the kernel ([`Kernel::tokens`]): the registry the
/// authentication layer reads, and creating, listing and revoking tokens as the
/// admin.
#[derive(Debug, Clone, Copy)]
pub struct TokensHandle<'k> {
    kernel: &'k Kernel,
}

impl Kernel {
    /// The kernel's operator tokens.
    pub fn tokens(&self) -> TokensHandle<'_> {
        TokensHandle { kernel: self }
    }
}

impl TokensHandle<'_> {
    /// The operator tokens, as the authentication layer reads them.
    pub fn registry(self) -> OperatorTokens {
        self.kernel.inner.tokens().0.clone()
    }

    /// Creates an operator token: its record, and the token string, which
    /// is shown this once and kept nowhere.
    pub async fn create(self, caller: Caller, new: NewToken) -> Result<(OperatorToken, String)> {
        require_admin(caller, "create tokens")?;
        self.kernel.check_running()?;
        if new
            .expires_in
            .is_some_and(|d| d.is_zero() || d > MAX_TOKEN_LIFETIME)
        {
            return Err(KernelError::InvalidArgument(format!(
                "expires_in must be between 1 second and {} days",
                MAX_TOKEN_LIFETIME.as_secs() / 86_400
            )));
        }
        let (tokens, changes) = self.kernel.inner.tokens();
        let _one_at_a_time = changes.lock().await;
        let now = unix_ms(SystemTime::now());
        let expires_ms = new
            .expires_in
            .map(|d| now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)));
        let (token, secret) = tokens.mint(new.name.as_deref(), new.scope, expires_ms, now)?;
        self.keep(caller, &token, "created").await?;
        Ok((token, secret))
    }

    /// Every operator token, oldest first; only active ones unless `all`.
    pub fn list(self, caller: Caller, all: bool) -> Result<Vec<OperatorToken>> {
        require_admin(caller, "list tokens")?;
        let now = unix_ms(SystemTime::now());
        Ok(self.kernel.inner.tokens().0.list(all, now))
    }

    /// Revokes the token named (or numbered) `which`: from the next call on,
    /// it is refused.
    pub async fn revoke(self, caller: Caller, which: &str) -> Result<OperatorToken> {
        require_admin(caller, "revoke tokens")?;
        self.kernel.check_running()?;
        let (tokens, changes) = self.kernel.inner.tokens();
        let _one_at_a_time = changes.lock().await;
        let token = tokens.revoked(which, unix_ms(SystemTime::now()))?;
        self.keep(caller, &token, "revoked").await?;
        Ok(token)
    }

    /// Commits `token` to the store, then puts it in the registry and says so.
    async fn keep(self, caller: Caller, token: &OperatorToken, action: &str) -> Result<()> {
        self.kernel
            .inner
            .store()
            .commit(Write::Token(Box::new(token.clone())))
            .await?;
        self.kernel.inner.tokens().0.put(token.clone())?;
        self.kernel.inner.events().emit(
            Pid::KERNEL,
            EventKind::Token {
                action: action.to_owned(),
                id: token.id,
                name: token.name.clone(),
                scope: token.scope.to_string(),
                by: caller.who(),
            },
        );
        tracing::info!(id = token.id, name = %token.name, scope = %token.scope, by = %caller.who(), "token {action}");
        Ok(())
    }
}

/// Refuses a caller without the admin scope.
fn require_admin(caller: Caller, what: &str) -> Result<()> {
    if caller.scope() < Scope::Admin {
        return Err(KernelError::PermissionDenied(format!(
            "only the admin scope may {what}"
        )));
    }
    Ok(())
}
