//! The one place where zookeeper-client errors become `tenure_core::Error`s.

use std::time::Duration;

use tenure_core::{Error, ErrorKind};
use zookeeper_client::Error as ZkError;

use crate::SCHEME;

/// Map a zookeeper-client error; `what` says which operation failed (e.g. `"campaign"`).
///
/// The client's error is the cause, printed once on the error's line: the message is
/// `what` alone (tenure_core::Error's rule). The caller adds the endpoint.
pub(crate) fn map(what: &str, err: ZkError) -> Error {
    let kind = kind_of(&err);
    Error::new(kind, what).with_backend(SCHEME).with_source(err)
}

/// An error of `kind` raised by this crate itself.
pub(crate) fn own(kind: ErrorKind, message: impl Into<String>) -> Error {
    Error::new(kind, message).with_backend(SCHEME)
}

/// The error for a request that got no answer within `limit`.
pub(crate) fn timed_out(what: &str, limit: Duration) -> Error {
    own(
        ErrorKind::Timeout,
        format!("{what}: no answer from ZooKeeper within {limit:?}"),
    )
}

/// The error for a session that was closed by this process.
pub(crate) fn closed() -> Error {
    Error::closed().with_backend(SCHEME)
}

fn kind_of(err: &ZkError) -> ErrorKind {
    match err {
        ZkError::ConnectionLoss | ZkError::NoHosts | ZkError::Throttled | ZkError::NotReadOnly => {
            ErrorKind::Unavailable
        }
        ZkError::Timeout => ErrorKind::Timeout,
        ZkError::SessionExpired | ZkError::ClientClosed | ZkError::SessionMoved => {
            ErrorKind::SessionExpired
        }
        ZkError::NoAuth | ZkError::AuthFailed => ErrorKind::Unauthorized,
        ZkError::BadArguments(_) | ZkError::InvalidAcl | ZkError::NoChildrenForEphemerals => {
            ErrorKind::InvalidArgument
        }
        _ => ErrorKind::Backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let k = |e: ZkError| map("x", e).kind();
        assert_eq!(k(ZkError::ConnectionLoss), ErrorKind::Unavailable);
        assert_eq!(k(ZkError::NoHosts), ErrorKind::Unavailable);
        assert_eq!(k(ZkError::Timeout), ErrorKind::Timeout);
        assert_eq!(k(ZkError::SessionExpired), ErrorKind::SessionExpired);
        assert_eq!(k(ZkError::ClientClosed), ErrorKind::SessionExpired);
        assert_eq!(k(ZkError::NoAuth), ErrorKind::Unauthorized);
        assert_eq!(k(ZkError::AuthFailed), ErrorKind::Unauthorized);
        assert_eq!(k(ZkError::InvalidAcl), ErrorKind::InvalidArgument);
        assert_eq!(k(ZkError::NoNode), ErrorKind::Backend);
        let e = map("campaign", ZkError::NoAuth).with_endpoint("h:2181");
        assert_eq!(e.backend(), Some("zk"));
        assert_eq!(e.message(), "campaign");
        let cause = ZkError::NoAuth.to_string();
        assert_eq!(
            e.to_string(),
            format!("unauthorized: campaign: {cause} [zk at h:2181]")
        );
    }
}
