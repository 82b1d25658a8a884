//! The one place where the gRPC statuses of etcd's answers become
//! `tenure_core::Error`s.

use std::error::Error as StdError;

use tenure_core::backend::Tag;
use tenure_core::{Error, ErrorKind};
use tonic::{Code, Status};

use crate::config::SCHEME;

/// The error constructors of this backend (own errors, timeouts, a closed session).
pub(crate) const TAG: Tag = Tag::new(SCHEME, "etcd");

/// Map a gRPC status; `what` says which operation failed (e.g. `"campaign"`). The
/// message is `what` alone; the status is the cause, so the error prints each part of
/// the chain once (`connect: tcp connect error: Connection refused (os error 111)`).
pub(crate) fn map(what: &str, status: Status) -> Error {
    let kind = status_kind(status.code(), &chain_text(&status));
    Error::new(kind, what)
        .with_backend(SCHEME)
        .with_source(StatusCause(status))
}

/// A gRPC status as the cause of an error: its text is the status message (the code
/// when the message is empty), its source the status's own source, so the chain goes
/// on to the transport or I/O error without tonic's debug rendering.
#[derive(Debug)]
struct StatusCause(Status);

impl std::fmt::Display for StatusCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.message() {
            "" => write!(f, "gRPC status {:?}", self.0.code()),
            message => f.write_str(message),
        }
    }
}

impl StdError for StatusCause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.source()
    }
}

/// The status message and every error below it, for deciding the kind.
fn chain_text(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut source = StdError::source(status);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
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
        let cases = [
            (
                Status::invalid_argument(
                    "etcdserver: authentication failed, invalid user ID or password",
                ),
                ErrorKind::Unauthorized,
            ),
            (
                Status::permission_denied("etcdserver: permission denied"),
                ErrorKind::Unauthorized,
            ),
            (
                Status::not_found("etcdserver: requested lease not found"),
                ErrorKind::SessionExpired,
            ),
            (
                Status::unavailable("etcdserver: no leader"),
                ErrorKind::Unavailable,
            ),
            (Status::deadline_exceeded("x"), ErrorKind::Timeout),
            (Status::cancelled("Timeout expired"), ErrorKind::Timeout),
            (
                Status::invalid_argument("etcdserver: key is not provided"),
                ErrorKind::InvalidArgument,
            ),
            (
                Status::new(Code::Unknown, "transport error"),
                ErrorKind::Unavailable,
            ),
            (Status::internal("boom"), ErrorKind::Backend),
        ];
        for (status, want) in cases {
            let text = format!("{status:?}");
            assert_eq!(kind(status), want, "{text}");
        }
    }

    #[test]
    fn causes_print_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let status = Status::from_error(Box::new(io));
        let e = map("connect", status);
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert_eq!(e.backend(), Some("etcd"));
        assert_eq!(e.message(), "connect");
        let line = e.to_string();
        assert_eq!(line.matches("Connection refused").count(), 1, "{line}");
        assert!(line.starts_with("unavailable: connect: "), "{line}");
    }
}
