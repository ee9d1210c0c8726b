//! The one mapping from kernel errors to gRPC status codes.

use hivekernel_agents::ErrorKind;
use tonic::{Code, Status};

use crate::error::KernelError;

impl From<KernelError> for Status {
    fn from(err: KernelError) -> Self {
        Status::new(code(err.kind()), err.message())
    }
}

/// The gRPC code for an error class.
pub(crate) fn code(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::PermissionDenied => Code::PermissionDenied,
        ErrorKind::ResourceExhausted => Code::ResourceExhausted,
        ErrorKind::FailedPrecondition => Code::FailedPrecondition,
        ErrorKind::DeadlineExceeded => Code::DeadlineExceeded,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Internal => Code::Internal,
    }
}

#[cfg(test)]
mod tests {
    use hivekernel_agents::Pid;

    use super::*;

    #[test]
    fn kernel_errors_keep_their_class_and_message() {
        let cases = [
            (KernelError::NotFound(Pid(9)), Code::NotFound),
            (
                KernelError::InvalidArgument("x".into()),
                Code::InvalidArgument,
            ),
            (
                KernelError::PermissionDenied("x".into()),
                Code::PermissionDenied,
            ),
            (
                KernelError::TooManyChildren {
                    parent: Pid(1),
                    count: 2,
                    max: 2,
                },
                Code::ResourceExhausted,
            ),
            (
                KernelError::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (
                KernelError::DeadlineExceeded("x".into()),
                Code::DeadlineExceeded,
            ),
            (KernelError::ShuttingDown, Code::Unavailable),
        ];
        for (err, expected) in cases {
            let message = err.to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), expected);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn a_huge_message_is_cut() {
        let status = Status::from(KernelError::InvalidArgument("é".repeat(1 << 20)));
        assert!(status.message().len() <= crate::error::MAX_MESSAGE_BYTES);
        assert!(
            status.message().ends_with("… [cut: 2097170 bytes in all]"),
            "{}",
            &status.message()[4000..]
        );
    }
}
