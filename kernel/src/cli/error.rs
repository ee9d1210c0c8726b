//! [`CliError`]: every way a command can fail, and the exit code for each.

use std::io::{self, Write};

use crate::config::ConfigError;
use crate::daemon::StartError;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad input on the command line or in a file it names (exit 2).
    #[error("{0}")]
    Usage(String),
    /// `config check` found issues, one per line (exit 2).
    #[error(transparent)]
    Config(ConfigError),
    /// `start` failed (2 for config and usage errors, else 1).
    #[error(transparent)]
    Start(StartError),
    /// The kernel could not be reached (exit 3).
    #[error("cannot connect to {addr}: {cause}; {hint}")]
    Connect {
        /// The address tried.
        addr: String,
        /// What went wrong.
        cause: String,
        /// The likely fix.
        hint: &'static str,
    },
    /// The kernel answered that it cannot serve now (UNAVAILABLE: it is
    /// stopping, its cluster is out of reach, or its node is not a member
    /// of it now): try again, or another node (exit 3, as a connection
    /// that failed).
    #[error("unavailable: {message} (answered by {addr})")]
    Unavailable {
        /// The address that answered.
        addr: String,
        /// The kernel's message.
        message: String,
    },
    /// The kernel refused the token (exit 1).
    #[error("unauthenticated: {message}; {hint}")]
    Unauthenticated {
        /// The kernel's message.
        message: String,
        /// Where the token came from and how to get the right one.
        hint: String,
    },
    /// The kernel refused the request or the target was not found (exit 1).
    #[error("{0}")]
    Refused(String),
    /// A task ran and failed (exit 1).
    #[error("task failed: {0}")]
    TaskFailed(String),
    /// Writing to stdout failed (exit 1; silent when the reader went away).
    #[error("cannot write output: {0}")]
    Output(#[from] io::Error),
}

impl CliError {
    /// 1 refused or not found; 2 usage or config; 3 cannot connect, or
    /// the kernel cannot serve now.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Usage(_) | CliError::Config(_) => 2,
            CliError::Start(err) => err.exit_code(),
            CliError::Connect { .. } | CliError::Unavailable { .. } => 3,
            CliError::Unauthenticated { .. }
            | CliError::Refused(_)
            | CliError::TaskFailed(_)
            | CliError::Output(_) => 1,
        }
    }

    /// Prints the error to stderr, each line prefixed with `error: `.
    pub fn report(&self) {
        if matches!(self, CliError::Output(err) if err.kind() == io::ErrorKind::BrokenPipe) {
            return;
        }
        let text = self.to_string();
        let text = super::output::visible(&text);
        let mut stderr = io::stderr().lock();
        for line in text.lines() {
            // Nothing sensible is left to do if stderr itself is gone.
            let _ = writeln!(stderr, "error: {line}");
        }
    }
}
