//! The one place where etcd-client errors become `tenure_core::Error`s.

use etcd_client::Error as EtcdError;
use tenure_core::{Error, ErrorKind};
use tonic::Code;

use crate::SCHEME;

/// Map an etcd-client error; `what` says which operation failed (e.g. `"campaign"`).
pub(crate) fn map(what: &str, err: EtcdError) -> Error {
    let kind = kind_of(&err);
    Error::new(kind, format!("{what}: {err}"))
        .with_backend(SCHEME)
        .with_source(err)
}

/// An error of `kind` raised by this crate itself.
pub(crate) fn own(kind: ErrorKind, message: impl Into<String>) -> Error {
    Error::new(kind, message).with_backend(SCHEME)
}

/// The error for a request that got no answer within `limit`.
pub(crate) fn timed_out(what: &str, limit: std::time::Duration) -> Error {
    own(
        ErrorKind::Timeout,
        format!("{what}: no answer from etcd within {limit:?}"),
    )
}

fn kind_of(err: &EtcdError) -> ErrorKind {
    match err {
        EtcdError::GRpcStatus(status) => status_kind(status.code(), status.message()),
        EtcdError::TransportError(_) | EtcdError::IoError(_) | EtcdError::WatchError(_) => {
            ErrorKind::Unavailable
        }
        EtcdError::LeaseKeepAliveError(msg) if msg.contains("lease not found") => {
            ErrorKind::SessionExpired
        }
        EtcdError::LeaseKeepAliveError(_) => ErrorKind::Unavailable,
        EtcdError::InvalidArgs(_)
        | EtcdError::InvalidUri(_)
        | EtcdError::InvalidMetadataValue(_)
        | EtcdError::EndpointError(_) => ErrorKind::InvalidArgument,
        _ => ErrorKind::Backend,
    }
}

/// The kind of a gRPC status from etcd. etcd reports some conditions with generic codes
/// (a wrong password is `InvalidArgument`), so the message decides those first.
fn status_kind(code: Code, message: &str) -> ErrorKind {
    let m = message.to_ascii_lowercase();
    if m.contains("authentication failed")
        || m.contains("permission denied")
        || m.contains("invalid auth token")
        || m.contains("user name is empty")
        || m.contains("user name not found")
        || m.contains("invalid username or password")
    {
        return ErrorKind::Unauthorized;
    }
    if m.contains("requested lease not found") {
        return ErrorKind::SessionExpired;
    }
    match code {
        Code::Unauthenticated | Code::PermissionDenied => ErrorKind::Unauthorized,
        Code::DeadlineExceeded => ErrorKind::Timeout,
        // tonic reports its own request timeout as `Cancelled: Timeout expired`.
        Code::Cancelled if m.contains("timeout expired") => ErrorKind::Timeout,
        Code::Unavailable | Code::Cancelled | Code::Aborted | Code::ResourceExhausted => {
            ErrorKind::Unavailable
        }
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            ErrorKind::InvalidArgument
        }
        // Connection failures below gRPC (refused, reset, broken pipe) arrive as Unknown.
        Code::Unknown
            if [
                "transport",
                "connect",
                "connection",
                "broken pipe",
                "h2 protocol",
            ]
            .iter()
            .any(|w| m.contains(w)) =>
        {
            ErrorKind::Unavailable
        }
        _ => ErrorKind::Backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Status;

    fn kind(status: Status) -> ErrorKind {
        map("op", EtcdError::GRpcStatus(status)).kind()
    }

    #[test]
    fn statuses_map_to_kinds() {
        assert_eq!(
            kind(Status::invalid_argument(
                "etcdserver: authentication failed, invalid user ID or password"
            )),
            ErrorKind::Unauthorized
        );
        assert_eq!(
            kind(Status::permission_denied("etcdserver: permission denied")),
            ErrorKind::Unauthorized
        );
        assert_eq!(
            kind(Status::not_found("etcdserver: requested lease not found")),
            ErrorKind::SessionExpired
        );
        assert_eq!(
            kind(Status::unavailable("etcdserver: no leader")),
            ErrorKind::Unavailable
        );
        assert_eq!(kind(Status::deadline_exceeded("x")), ErrorKind::Timeout);
        assert_eq!(
            kind(Status::cancelled("Timeout expired")),
            ErrorKind::Timeout
        );
        assert_eq!(
            kind(Status::invalid_argument("etcdserver: key is not provided")),
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            kind(Status::new(Code::Unknown, "transport error")),
            ErrorKind::Unavailable
        );
        assert_eq!(kind(Status::internal("boom")), ErrorKind::Backend);
    }

    #[test]
    fn client_errors_map_to_kinds() {
        let e = map(
            "keep-alive",
            EtcdError::LeaseKeepAliveError("lease not found".into()),
        );
        assert_eq!(e.kind(), ErrorKind::SessionExpired);
        assert_eq!(e.backend(), Some("etcd"));
        assert!(e.message().starts_with("keep-alive: "), "{e}");
        let e = map("x", EtcdError::InvalidArgs("empty endpoints".into()));
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = map("x", EtcdError::WatchError("closed".into()));
        assert!(e.is_retryable());
    }
}
