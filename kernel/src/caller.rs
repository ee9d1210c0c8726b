//! Who is asking: the identity every kernel operation acts for.

use hivekernel_agents::Pid;

/// Who is asking. The identity comes from the caller's credential, never from the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The operator holding the admin token; acts as the kernel (PID 1).
    Admin,
    /// A process, acting only as itself.
    Process(Pid),
}

impl Caller {
    /// The PID the caller acts as.
    pub fn pid(self) -> Pid {
        match self {
            Caller::Admin => Pid::KERNEL,
            Caller::Process(pid) => pid,
        }
    }
}
