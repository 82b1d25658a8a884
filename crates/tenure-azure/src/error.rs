//! The one place where Azure client errors become `tenure_core::Error`s.

use azure_core::error::ErrorKind as AzureKind;
use azure_core::http::StatusCode;
use tenure_core::backend::Tag;
use tenure_core::{Error, ErrorKind};

use crate::config::SCHEME;

/// The error constructors of this backend (own errors, timeouts, a closed session).
pub(crate) const TAG: Tag = Tag::new(SCHEME, "Azure Blob Storage");

/// What a failed request was, as the backend's logic needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The HTTP status, if the service answered.
    pub(crate) status: Option<u16>,
    /// The service's error code (`x-ms-error-code`), if any.
    pub(crate) code: Option<String>,
    /// The error, ready for the caller.
    pub(crate) error: ErrorKindAndText,
    /// The URL the request went to (the container's), once the store has set it.
    pub(crate) endpoint: Option<String>,
}

/// An error kind and a text without secrets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ErrorKindAndText {
    pub(crate) kind: ErrorKind,
    pub(crate) text: String,
}

impl Failure {
    pub(crate) fn code_is(&self, code: &str) -> bool {
        self.code.as_deref() == Some(code)
    }

    /// The same failure, naming the URL the request went to.
    pub(crate) fn at(mut self, endpoint: &str) -> Self {
        self.endpoint = Some(endpoint.to_string());
        self
    }

    /// The tenure error for this failure of `what`: the message is `what`, the
    /// (redacted) text of the client's error its cause, printed once on the error's line
    /// (tenure_core::Error's rule), and the endpoint the URL the request went to.
    pub(crate) fn into_error(self, what: &str) -> Error {
        let e = TAG
            .own(self.error.kind, what)
            .with_source(Cause(self.error.text));
        match self.endpoint {
            Some(endpoint) => e.with_endpoint(endpoint),
            None => e,
        }
    }
}

/// The cause of an error as text: an Azure client error with signatures and keys
/// removed (the client error itself may repeat the request URL with its SAS, so it is
/// never attached as it is).
#[derive(Debug)]
pub(crate) struct Cause(pub(crate) String);

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Cause {}

/// Classify an Azure client error.
pub(crate) fn classify(err: &azure_core::Error) -> Failure {
    match err.kind() {
        AzureKind::HttpResponse {
            status, error_code, ..
        } => {
            let status_n = u16::from(*status);
            let kind = match *status {
                StatusCode::Forbidden | StatusCode::Unauthorized => ErrorKind::Unauthorized,
                StatusCode::RequestTimeout => ErrorKind::Timeout,
                StatusCode::TooManyRequests
                | StatusCode::InternalServerError
                | StatusCode::BadGateway
                | StatusCode::ServiceUnavailable
                | StatusCode::GatewayTimeout => ErrorKind::Unavailable,
                StatusCode::BadRequest => ErrorKind::InvalidArgument,
                _ => ErrorKind::Backend,
            };
            let code = error_code.clone();
            let text = match &code {
                Some(c) => format!("HTTP {status_n} {c}"),
                None => format!("HTTP {status_n}"),
            };
            Failure {
                status: Some(status_n),
                code,
                error: ErrorKindAndText { kind, text },
                endpoint: None,
            }
        }
        AzureKind::Connection | AzureKind::Io => Failure {
            status: None,
            code: None,
            error: ErrorKindAndText {
                kind: ErrorKind::Unavailable,
                text: redact(&chain(err)),
            },
            endpoint: None,
        },
        AzureKind::Credential => Failure {
            status: None,
            code: None,
            error: ErrorKindAndText {
                kind: ErrorKind::Unauthorized,
                text: format!("credential: {}", redact(&chain(err))),
            },
            endpoint: None,
        },
        _ => {
            let text = redact(&chain(err));
            // reqwest errors of a broken connection arrive as `Other` from some paths.
            let lower = text.to_ascii_lowercase();
            let kind = if lower.contains("connect")
                || lower.contains("error sending request")
                || lower.contains("connection")
                || lower.contains("broken pipe")
            {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Backend
            };
            Failure {
                status: None,
                code: None,
                error: ErrorKindAndText { kind, text },
                endpoint: None,
            }
        }
    }
}

/// The error and its sources as one line.
fn chain(err: &azure_core::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let t = s.to_string();
        if !text.contains(&t) {
            text.push_str(": ");
            text.push_str(&t);
        }
        source = s.source();
    }
    text
}

/// Remove the values of signature-like query parameters (`sig=`, `se=`…) and
/// authorisation headers from a message (client errors may repeat the request URL).
pub(crate) fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let end = rest.find(['&', ' ', ')', '"', '\'']).unwrap_or(rest.len());
        let pair = &rest[..end];
        match pair.split_once('=') {
            Some((k, _)) if !matches!(k, "comp" | "restype" | "timeout" | "prefix" | "include") => {
                out.push_str(k);
                out.push_str("=<redacted>");
            }
            _ => out.push_str(pair),
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    if let Some(i) = out.find("SharedKey ") {
        out.truncate(i);
        out.push_str("SharedKey <redacted>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: StatusCode, code: &str) -> azure_core::Error {
        AzureKind::HttpResponse {
            status,
            error_code: Some(code.to_string()),
            raw_response: None,
        }
        .into_error()
    }

    #[test]
    fn statuses_map_to_kinds() {
        for (status, code, kind) in [
            (
                StatusCode::Forbidden,
                "AuthenticationFailed",
                ErrorKind::Unauthorized,
            ),
            (
                StatusCode::Conflict,
                "LeaseAlreadyPresent",
                ErrorKind::Backend,
            ),
            (
                StatusCode::ServiceUnavailable,
                "ServerBusy",
                ErrorKind::Unavailable,
            ),
            (
                StatusCode::InternalServerError,
                "InternalError",
                ErrorKind::Unavailable,
            ),
            (
                StatusCode::BadRequest,
                "InvalidHeaderValue",
                ErrorKind::InvalidArgument,
            ),
        ] {
            let f = classify(&http(status, code));
            assert_eq!(f.error.kind, kind, "{code}");
            assert!(f.code_is(code));
            assert_eq!(f.status, Some(u16::from(status)));
        }
        let f = classify(&azure_core::Error::with_message(
            AzureKind::Connection,
            "refused",
        ));
        assert_eq!(f.error.kind, ErrorKind::Unavailable);
        let e = f.at("http://h:1/acct/c?sig=S3CRET").into_error("acquire");
        assert_eq!(e.backend(), Some("azblob"));
        assert_eq!(e.message(), "acquire");
        assert_eq!(
            e.to_string(),
            "unavailable: acquire: refused [azblob at http://h:1/acct/c]"
        );
    }

    #[test]
    fn signatures_are_redacted() {
        let t = redact("error sending request for url (http://h/c/b?comp=lease&sv=2024&sig=S3CRET%3D): refused");
        assert!(!t.contains("S3CRET"), "{t}");
        assert!(t.contains("comp=lease"), "{t}");
        assert!(t.contains("sig=<redacted>"), "{t}");
        let t = redact("Authorization: SharedKey acct:S3CRET");
        assert!(!t.contains("S3CRET"), "{t}");
    }
}
