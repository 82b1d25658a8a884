//! The one place where the gRPC statuses of etcd's answers become
//! `tenure_core::Error`s.

use std::error::Error as StdError;

use tenure_core::{Error, ErrorKind};
use tonic::{Code, Status};

use crate::config::SCHEME;

/// Map a gRPC status; `what` says which operation failed (e.g. `"campaign"`). The
/// message names the operation and the cause, each cause of the chain once.
pub(crate) fn map(what: &str, status: Status) -> Error {
    let kind = status_kind(status.code(), &cause_text(&status));
    Error::new(kind, format!("{what}: {}", cause_text(&status))).with_backend(SCHEME)
}

/// The status message followed by every error below it whose text it does not already
/// contain (tonic puts "transport error" in the message and the refused connection in
/// the source chain).
fn cause_text(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = StdError::source(status);
    while let Some(inner) = source {
        let line = inner.to_string();
        if !line.is_empty() && !text.contains(&line) {
            if text.is_empty() {
                text = line;
            } else {
                text = format!("{text}: {line}");
            }
        }
        source = inner.source();
    }
    if text.is_empty() {
        text = format!("gRPC status {:?}", status.code());
    }
    text
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

    fn kind(status: Status) -> ErrorKind {
        map("op", status).kind()
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
    fn causes_print_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let status = Status::from_error(Box::new(io));
        let e = map("connect", status);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert_eq!(e.backend(), Some("etcd"));
        assert_eq!(e.message().matches("Connection refused").count(), 1, "{e}");
        assert!(e.message().starts_with("connect: "), "{e}");
    }
}
