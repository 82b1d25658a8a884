//! The one place where zookeeper-client errors become `tenure_core::Error`s.

use tenure_core::backend::Tag;
use tenure_core::{Error, ErrorKind};
use zookeeper_client::Error as ZkError;

use crate::SCHEME;

/// The error constructors of this backend (own errors, timeouts, a closed session).
pub(crate) const TAG: Tag = Tag::new(SCHEME, "ZooKeeper");

/// Map a zookeeper-client error; `what` says which operation failed (e.g. `"campaign"`).
///
/// The client's error is the cause, printed once on the error's line: the message is
/// `what` alone (tenure_core::Error's rule). The caller adds the endpoint.
pub(crate) fn map(what: &str, err: ZkError) -> Error {
    let kind = kind_of(&err);
    TAG.wrap(kind, what, err)
}

fn kind_of(err: &ZkError) -> ErrorKind {
    match err {
        ZkError::ConnectionLoss | ZkError::NoHosts | ZkError::Throttled | ZkError::NotReadOnly => {
            ErrorKind::Unavailable
        }
        // The client's errors without a code are its connection failing under a request:
        // no answer within the connection timeout, an I/O error on the socket. (Its only
        // other ones are TLS set-up errors, and this backend does not configure TLS.)
        // They are a lost connection, retried like one, not a final backend error.
        ZkError::Custom(_) => ErrorKind::Unavailable,
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
