//! Admission control: a kernel-wide cap on model requests in flight.

use std::sync::Arc;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::LlmError;

/// A cap on concurrent model requests, shared by every clone.
///
/// Callers over the cap wait in FIFO order for a slot; nobody is refused.
/// A slot is held only while an HTTP attempt is on the wire, never during a
/// backoff sleep, so a rate-limited caller does not block the others.
#[derive(Debug, Clone)]
pub struct Admission {
    slots: Arc<Semaphore>,
    capacity: usize,
}

impl Admission {
    /// A cap of `max_in_flight` concurrent requests (at least 1).
    pub fn new(max_in_flight: usize) -> Result<Self, LlmError> {
        if max_in_flight == 0 || max_in_flight > Semaphore::MAX_PERMITS {
            return Err(LlmError::Config(format!(
                "max_in_flight must be between 1 and {}, got {max_in_flight}",
                Semaphore::MAX_PERMITS
            )));
        }
        Ok(Admission {
            slots: Arc::new(Semaphore::new(max_in_flight)),
            capacity: max_in_flight,
        })
    }

    /// The cap.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests on the wire right now.
    pub fn in_flight(&self) -> usize {
        self.capacity - self.slots.available_permits()
    }

    /// Waits for a slot; the request may go out while the permit lives.
    pub(super) async fn admit(&self) -> Result<SemaphorePermit<'_>, LlmError> {
        self.slots
            .acquire()
            .await
            .map_err(|_| LlmError::Transport("LLM admission control was shut down".into()))
    }
}
