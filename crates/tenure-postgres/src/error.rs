//! The one place where PostgreSQL client errors become `tenure_core::Error`s.

use tenure_core::backend::Tag;
use tenure_core::{Error, ErrorKind};
use tokio_postgres::error::SqlState;

use crate::config::SCHEME;

/// The error constructors of this backend.
pub(crate) const TAG: Tag = Tag::new(SCHEME, "PostgreSQL");

/// Raised by tenure's functions: the session has expired or was closed.
const SESSION_EXPIRED: &str = "TN001";

/// Map a client error; `what` says which operation failed (e.g. `"campaign"`).
pub(crate) fn map(what: &str, err: tokio_postgres::Error) -> Error {
    if let Some(db) = err.as_db_error() {
        if db.code().code() == SESSION_EXPIRED {
            return TAG.own(
                ErrorKind::SessionExpired,
                format!("{what}: {}", db.message()),
            );
        }
    }
    TAG.wrap(kind_of(&err), what, err)
}

fn kind_of(err: &tokio_postgres::Error) -> ErrorKind {
    let Some(code) = err.code() else {
        // No server answer: the connection failed, closed or could not be set up. A
        // server certificate that does not verify, a server without TLS when TLS is
        // asked for, a client certificate the server refused (a TLS alert:
        // BadCertificate, CertificateRequired, UnknownCA, AccessDenied, …) or a password
        // the server asked for and none was given fail the same way every time.
        let text = format!("{err:?}").to_ascii_lowercase();
        let refused = [
            "certificate",
            "does not support tls",
            "unknownca",
            "accessdenied",
            "password",
        ];
        return match refused.iter().any(|word| text.contains(word)) {
            true => ErrorKind::Unauthorized,
            false => ErrorKind::Unavailable,
        };
    };
    match &code.code()[..2] {
        // A password or user refused, or a privilege missing.
        "28" => ErrorKind::Unauthorized,
        _ if *code == SqlState::INSUFFICIENT_PRIVILEGE => ErrorKind::Unauthorized,
        // Connection exceptions, too many connections or no resources, a server
        // shutting down or starting, a serialization failure or deadlock to retry.
        "08" | "53" | "57" | "40" => ErrorKind::Unavailable,
        _ => ErrorKind::Backend,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_connection_is_unavailable() {
        // The only client error we can build without a server: one from a closed
        // connection, through a failed connect to a port nobody listens on.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let err = runtime.block_on(async {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = format!("host=127.0.0.1 port={port} user=x connect_timeout=2");
            tokio_postgres::connect(&config, tokio_postgres::NoTls)
                .await
                .err()
                .unwrap()
        });
        let e = map("connect", err);
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert_eq!(e.message(), "connect");
        assert_eq!(e.backend(), Some("postgres"));
    }
}
