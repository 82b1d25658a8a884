//! The one error type of tenure (contract clause 12, `docs/contract.md`).

use std::fmt;

/// A boxed error from a store client or the operating system.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The result type used throughout tenure.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, independent of the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The caller passed something invalid: a bad election name, URL or timing.
    /// Retrying the same call fails the same way.
    InvalidArgument,
    /// The store could not be reached or refused service for now.
    Unavailable,
    /// The store did not answer within the configured time.
    Timeout,
    /// The session (lease, ZooKeeper session, heartbeat) expired in the store; everything
    /// held through it is gone.
    SessionExpired,
    /// The operation needs leadership that the caller does not (or no longer) hold.
    NotLeader,
    /// The store rejected the credentials or the caller lacks permission.
    Unauthorized,
    /// The backend does not offer this operation (its README and capability table say
    /// why). Retrying fails the same way.
    Unsupported,
    /// Any other failure reported by the store or its client.
    Backend,
}

impl ErrorKind {
    /// A short, stable, lowercase name (`invalid_argument`, `unavailable`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Timeout => "timeout",
            ErrorKind::SessionExpired => "session_expired",
            ErrorKind::NotLeader => "not_leader",
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Backend => "backend",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error returned by every fallible operation of tenure.
///
/// It carries a [`ErrorKind`], a human-readable message (naming the offending field or
/// value for bad input), the backend it came from (if any) and the underlying error.
/// Its `Display` never includes credentials.
#[derive(Debug, thiserror::Error)]
#[error("{kind}: {message}{}", backend_suffix(.backend))]
#[non_exhaustive]
pub struct Error {
    kind: ErrorKind,
    message: String,
    backend: Option<&'static str>,
    #[source]
    source: Option<BoxError>,
}

fn backend_suffix(backend: &Option<&'static str>) -> String {
    match backend {
        Some(b) => format!(" [{b}]"),
        None => String::new(),
    }
}

impl Error {
    /// A new error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            backend: None,
            source: None,
        }
    }

    /// Shorthand for an [`ErrorKind::InvalidArgument`] error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidArgument, message)
    }

    /// Attach the backend's name (`"etcd"`, `"mem"`, …).
    pub fn with_backend(mut self, backend: &'static str) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Attach the underlying error.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(source.into());
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind and backend.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The backend that produced the error, if any.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }

    /// Whether retrying the same operation later may succeed: true for
    /// [`ErrorKind::Unavailable`] and [`ErrorKind::Timeout`].
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Unavailable | ErrorKind::Timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_kind_message_and_backend() {
        let e = Error::new(ErrorKind::Unavailable, "connection refused").with_backend("etcd");
        assert_eq!(e.to_string(), "unavailable: connection refused [etcd]");
        assert!(e.is_retryable());
        let e = Error::invalid("ttl: must be > 0");
        assert_eq!(e.to_string(), "invalid_argument: ttl: must be > 0");
        assert!(!e.is_retryable());
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn source_is_kept() {
        let io = std::io::Error::other("boom");
        let e = Error::new(ErrorKind::Backend, "write failed").with_source(io);
        let src = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(src.as_deref(), Some("boom"));
    }
}
