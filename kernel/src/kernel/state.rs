//! Per-process durable values: a small key-value space each process owns
//! (a daemon's conversation lives here), kept in the store so it survives a
//! restart. Without a store nothing is kept and reads find nothing.

use hivekernel_agents::Pid;

use crate::error::{KernelError, Result};
use crate::kernel::Kernel;
use crate::store::Write;

/// Longest key, in bytes.
pub const MAX_STATE_KEY_BYTES: usize = 128;
/// Largest value, in bytes.
pub const MAX_STATE_VALUE_BYTES: usize = 8 << 20;

impl Kernel {
    /// `pid`'s durable value under `key`.
    pub async fn load_state(&self, pid: Pid, key: &str) -> Result<Option<String>> {
        check_key(key)?;
        // In memory nothing was kept: there is no value, not an error.
        let Some(store) = self.store() else {
            return Ok(None);
        };
        Ok(store.state(pid, key.to_owned()).await?)
    }

    /// Sets (or with `None` removes) `pid`'s durable value under `key`;
    /// returns once committed.
    pub async fn save_state(&self, pid: Pid, key: &str, value: Option<String>) -> Result<()> {
        check_key(key)?;
        if let Some(value) = &value
            && value.len() > MAX_STATE_VALUE_BYTES
        {
            return Err(KernelError::InvalidArgument(format!(
                "state value for {key:?} is {} bytes (at most {MAX_STATE_VALUE_BYTES})",
                value.len()
            )));
        }
        let key = key.to_owned();
        self.inner
            .store()
            .commit(Write::State { pid, key, value })
            .await?;
        Ok(())
    }
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_STATE_KEY_BYTES || key.chars().any(char::is_control) {
        return Err(KernelError::InvalidArgument(format!(
            "state key must be 1 to {MAX_STATE_KEY_BYTES} bytes without control characters, got {}",
            crate::error::shown(key)
        )));
    }
    Ok(())
}
