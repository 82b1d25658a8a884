//! The one place where redis client errors become `tenure_core::Error`s.

use redis::{ErrorKind as RedisKind, RedisError};
use tenure_core::backend::Tag;
use tenure_core::{Error, ErrorKind};

use crate::config::SCHEME;

/// The error constructors of this backend (own errors, timeouts, a closed session).
pub(crate) const TAG: Tag = Tag::new(SCHEME, "Redis");

/// Map a redis client error, the cause of an error whose message is `what` (the caller
/// adds the endpoint).
pub(crate) fn map(what: &str, err: RedisError) -> Error {
    let kind = kind_of(&err);
    TAG.wrap(kind, what, err)
}

/// The error for a session the store no longer has.
pub(crate) fn session_gone(what: &str, id: &str) -> Error {
    TAG.own(
        ErrorKind::SessionExpired,
        format!("{what}: Redis no longer has session {id}"),
    )
}

/// An answer of a shape this crate does not expect.
pub(crate) fn unexpected(what: &str, detail: impl std::fmt::Display) -> Error {
    TAG.own(
        ErrorKind::Backend,
        format!("{what}: unexpected answer from Redis: {detail}"),
    )
}

/// Server error codes that mean the credentials or the permissions are wrong.
const AUTH_CODES: [&str; 3] = ["NOAUTH", "WRONGPASS", "NOPERM"];

/// Server error codes that pass: the server is loading, busy, a replica or failing over.
const TRANSIENT_CODES: [&str; 6] = [
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
];

fn kind_of(err: &RedisError) -> ErrorKind {
    if err.is_timeout() {
        return ErrorKind::Timeout;
    }
    if let Some(code) = err.code() {
        if AUTH_CODES.contains(&code) {
            return ErrorKind::Unauthorized;
        }
        if TRANSIENT_CODES.contains(&code) {
            return ErrorKind::Unavailable;
        }
    }
    // Every server error has its code (above), known to redis or not.
    match err.kind() {
        RedisKind::AuthenticationFailed => ErrorKind::Unauthorized,
        // A server certificate that does not verify fails the same way every time.
        RedisKind::Io if err.to_string().contains("certificate") => ErrorKind::Unauthorized,
        RedisKind::Io => ErrorKind::Unavailable,
        RedisKind::InvalidClientConfig => ErrorKind::InvalidArgument,
        _ => {
            // The handshake reports a refused AUTH or SELECT as a plain response error.
            let text = err.to_string().to_ascii_lowercase();
            if text.contains("authentication") || text.contains("noauth") {
                ErrorKind::Unauthorized
            } else {
                ErrorKind::Backend
            }
        }
    }
}

/// Whether the connection that produced `err` may be out of step with the server (its
/// answer may still arrive and be taken for the answer to a later request), so it must
/// not be used again.
pub(crate) fn poisons_connection(err: &RedisError) -> bool {
    // A primary that was demoted answers writes with READONLY: connect again, so that
    // with Sentinel the new primary is asked for.
    if err.code() == Some("READONLY") {
        return true;
    }
    matches!(
        err.kind(),
        RedisKind::Io | RedisKind::Parse | RedisKind::AuthenticationFailed | RedisKind::Client
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::ServerErrorKind;

    fn io(kind: std::io::ErrorKind) -> RedisError {
        RedisError::from(std::io::Error::new(kind, "x"))
    }

    #[test]
    fn client_errors_map_to_kinds() {
        assert_eq!(
            map("op", io(std::io::ErrorKind::ConnectionRefused)).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(
            map("op", io(std::io::ErrorKind::ConnectionReset)).kind(),
            ErrorKind::Unavailable
        );
        assert_eq!(
            map("op", io(std::io::ErrorKind::TimedOut)).kind(),
            ErrorKind::Timeout
        );
        let e = map(
            "connect",
            RedisError::from((
                RedisKind::AuthenticationFailed,
                "Password authentication failed",
            )),
        );
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        assert_eq!(e.backend(), Some("redis"));
        assert_eq!(e.message(), "connect");
        let e = map(
            "x",
            RedisError::from((RedisKind::InvalidClientConfig, "bad")),
        );
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let e = map(
            "x",
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "invalid peer certificate: UnknownIssuer",
            )),
        );
        assert_eq!(e.kind(), ErrorKind::Unauthorized);
        let e = map("x", RedisError::from((RedisKind::Parse, "garbage")));
        assert_eq!(e.kind(), ErrorKind::Backend);
        assert!(poisons_connection(&io(std::io::ErrorKind::TimedOut)));
        assert!(!poisons_connection(&RedisError::from((
            RedisKind::Server(ServerErrorKind::NoPerm),
            "no"
        ))));
    }

    #[test]
    fn the_cause_prints_once() {
        let e = map("connect", io(std::io::ErrorKind::ConnectionRefused)).with_endpoint("h:1");
        assert_eq!(e.message(), "connect");
        assert_eq!(e.to_string(), "unavailable: connect: x [redis at h:1]");
    }

    #[test]
    fn server_errors_map_to_kinds() {
        for (code, kind) in [
            ("NOAUTH", ErrorKind::Unauthorized),
            ("WRONGPASS", ErrorKind::Unauthorized),
            ("NOPERM", ErrorKind::Unauthorized),
            ("LOADING", ErrorKind::Unavailable),
            ("READONLY", ErrorKind::Unavailable),
            ("BUSY", ErrorKind::Unavailable),
            ("OOM", ErrorKind::Backend),
            ("ERR", ErrorKind::Backend),
        ] {
            let err = redis::make_extension_error(code.to_string(), Some("detail".into()));
            // Codes redis knows become their own kind; the mapping looks at the code.
            assert_eq!(err.code(), Some(code));
            assert_eq!(map("x", err).kind(), kind, "{code}");
        }
        for (server, kind) in [
            (ServerErrorKind::NoPerm, ErrorKind::Unauthorized),
            (ServerErrorKind::BusyLoading, ErrorKind::Unavailable),
            (ServerErrorKind::ReadOnly, ErrorKind::Unavailable),
            (ServerErrorKind::ResponseError, ErrorKind::Backend),
            (ServerErrorKind::NoScript, ErrorKind::Backend),
        ] {
            let err = RedisError::from((RedisKind::Server(server), "detail"));
            assert_eq!(map("x", err).kind(), kind, "{server:?}");
        }
    }
}
