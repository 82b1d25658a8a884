//! The one error type of tenure (contract clause 12, `docs/contract.md`).

use std::fmt;
use std::sync::Arc;

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
    /// The session was closed by its owner (`Session::close`, dropping the shard
    /// manager): nothing more happens through it. Unlike
    /// [`SessionExpired`](Self::SessionExpired), nothing re-opens it.
    Closed,
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
            ErrorKind::Closed => "closed",
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
/// It carries an [`ErrorKind`], a message saying what failed (naming the offending
/// field or value for bad input), the backend it came from and the endpoint it was
/// talking to (if any), and the underlying error, its *cause* (if any).
///
/// # One line, each cause once
///
/// Every error of tenure, from every backend, follows one rule:
///
/// - the **message** says what was being done (`"connect"`, `"campaign billing"`,
///   `"node 1: listen"`) and never embeds the text of its cause: the cause is attached
///   with [`with_source`](Self::with_source);
/// - the **endpoint** the backend was talking to (a `host:port`, a list of them, or a
///   URL) is attached with [`with_endpoint`](Self::with_endpoint), which drops user
///   names, passwords, query and fragment, so it never shows credentials;
/// - the error prints as **one line**, `kind: message: cause: … [backend at endpoint]`:
///   the causes are the [`source`](std::error::Error::source) chain, and a cause whose
///   text is already on the line (a client error that repeats its own source, a
///   message that repeats its cause) is left out, so each cause is printed once. Line
///   breaks become spaces.
///
/// For example, a Redis that refuses the connection:
///
/// ```text
/// unavailable: connect: Connection refused (os error 111) [redis at 127.0.0.1:6379]
/// ```
///
/// `Display` (`{e}`, `to_string()`) is that line, so logging `{e}` shows the cause.
/// [`source`](std::error::Error::source) still returns the cause, for code that
/// inspects or downcasts it; to print an error *together with its source chain*, use
/// [`one_line`] rather than walking `source()` yourself, which would repeat the causes
/// `Display` already shows. [`one_line`] prints any error that way, a tenure `Error`
/// wrapped in an error of yours included.
///
/// Errors are cheap to clone (the cause is shared), so one failure can be handed to
/// every receiver of a stream.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Error {
    kind: ErrorKind,
    message: String,
    backend: Option<&'static str>,
    endpoint: Option<String>,
    source: Option<Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.body())?;
        match (self.backend, &self.endpoint) {
            (Some(backend), Some(endpoint)) => write!(f, " [{backend} at {endpoint}]"),
            (Some(backend), None) => write!(f, " [{backend}]"),
            (None, Some(endpoint)) => write!(f, " [at {endpoint}]"),
            (None, None) => Ok(()),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause()
    }
}

/// `err` and its [`source`](std::error::Error::source) chain on one line: its
/// `Display`, then each cause whose text is not on the line yet, separated by `": "`,
/// with line breaks as spaces. For a tenure [`Error`] this is its `Display` (which
/// shows its causes already); for an error of yours that wraps one, your text followed
/// by the tenure error's line. What the `tenure` CLI prints.
pub fn one_line(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = flatten(&err.to_string());
    push_causes(&mut line, err.source());
    line
}

/// Append to `line` the text of `cause` and of its sources, each unless the line holds
/// that text already. A cause that repeats the one appended just before it and says
/// more (`"io: refused"` after `"io"`) replaces it.
fn push_causes(line: &mut String, mut cause: Option<&(dyn std::error::Error + 'static)>) {
    // Where the cause appended last begins.
    let mut last: Option<usize> = None;
    while let Some(c) = cause {
        let text = flatten(&c.to_string());
        let text = text.trim();
        if !text.is_empty() && !line.contains(text) {
            match last {
                Some(start) if text.contains(&line[start..]) => {
                    line.truncate(start);
                    line.push_str(text);
                }
                _ => {
                    if !line.is_empty() {
                        line.push_str(": ");
                    }
                    last = Some(line.len());
                    line.push_str(text);
                }
            }
        }
        cause = c.source();
    }
}

/// `text` with every line break (`\r\n`, `\n`, `\r`) as one space.
fn flatten(text: &str) -> String {
    text.replace("\r\n", " ").replace(['\n', '\r'], " ")
}

/// `endpoint` without user information (`user:password@`), query and fragment: what
/// [`Error::with_endpoint`] keeps.
fn without_credentials(endpoint: &str) -> String {
    let (scheme, rest) = match endpoint.find("://") {
        Some(i) => endpoint.split_at(i + 3),
        None => ("", endpoint),
    };
    // Everything up to the last `@` may be credentials (a password may hold `/`, `@`,
    // `?` or `#`), so it goes first, then the query and the fragment.
    let rest = match rest.rfind('@') {
        Some(i) => &rest[i + 1..],
        None => rest,
    };
    let rest = match rest.find(['?', '#']) {
        Some(i) => &rest[..i],
        None => rest,
    };
    format!("{scheme}{rest}")
}

impl Error {
    /// A new error of `kind` with `message`: what failed, without the text of the cause
    /// (attach the cause with [`with_source`](Self::with_source)).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            backend: None,
            endpoint: None,
            source: None,
        }
    }

    /// The error for an operation on a session its owner closed
    /// ([`ErrorKind::Closed`]).
    pub fn closed() -> Self {
        Error::new(ErrorKind::Closed, "session closed")
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

    /// Attach the endpoint the backend was talking to: a `host:port`, a comma-separated
    /// list of them, or a URL. User names, passwords, the query and the fragment are
    /// dropped, so it is safe to pass a URL as the user gave it.
    pub fn with_endpoint(mut self, endpoint: impl AsRef<str>) -> Self {
        self.endpoint = Some(without_credentials(endpoint.as_ref()));
        self
    }

    /// Attach the underlying error (the cause). It prints once on the error's line, so
    /// the message need not, and should not, repeat it.
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// What went wrong.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message, without the kind, the causes, the backend and the endpoint.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The backend that produced the error, if any.
    pub fn backend(&self) -> Option<&'static str> {
        self.backend
    }

    /// The endpoint the backend was talking to, without credentials, if known.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Whether retrying the same operation later may succeed: true for
    /// [`ErrorKind::Unavailable`] and [`ErrorKind::Timeout`].
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind, ErrorKind::Unavailable | ErrorKind::Timeout)
    }

    /// The message and each cause not already in it (the line without the kind, the
    /// backend and the endpoint). The kind is left out of the comparison, so a cause
    /// that reads like a kind (`"timeout"`) still prints.
    fn body(&self) -> String {
        let mut body = flatten(&self.message);
        push_causes(&mut body, self.cause());
        body
    }

    fn cause(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
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

    /// An error with a fixed text and an optional source, like a client's.
    #[derive(Debug)]
    struct Wrap(&'static str, Option<BoxError>);

    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1
                .as_deref()
                .map(|s| s as &(dyn std::error::Error + 'static))
        }
    }

    fn refused() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused")
    }

    #[test]
    fn a_chain_whose_texts_repeat_prints_each_once() {
        // A client error that prints its io error, and has it as its source.
        let client = Wrap("Connection refused", Some(Box::new(refused())));
        let e = Error::new(ErrorKind::Unavailable, "connect")
            .with_backend("redis")
            .with_endpoint("127.0.0.1:1")
            .with_source(client);
        let line = e.to_string();
        assert_eq!(
            line,
            "unavailable: connect: Connection refused [redis at 127.0.0.1:1]"
        );
        assert_eq!(line.matches("Connection refused").count(), 1);
        assert_eq!(one_line(&e), line);
        // The cause is still there for code that inspects it.
        let source = std::error::Error::source(&e).map(|s| s.to_string());
        assert_eq!(source.as_deref(), Some("Connection refused"));
    }

    #[test]
    fn a_message_that_repeats_its_cause_prints_it_once() {
        // What backends did before the rule: the cause in the message and as source.
        let e = Error::new(ErrorKind::Unavailable, "connect: Connection refused")
            .with_backend("etcd")
            .with_source(Wrap("Connection refused", Some(Box::new(refused()))));
        assert_eq!(
            e.to_string(),
            "unavailable: connect: Connection refused [etcd]"
        );
    }

    #[test]
    fn distinct_causes_each_print_in_order() {
        let chain = Wrap(
            "error sending request",
            Some(Box::new(Wrap(
                "client error (Connect)",
                Some(Box::new(refused())),
            ))),
        );
        let e = Error::new(ErrorKind::Unavailable, "connect").with_source(chain);
        assert_eq!(
            e.to_string(),
            "unavailable: connect: error sending request: client error (Connect): \
             Connection refused"
        );
    }

    #[test]
    fn a_cause_that_repeats_the_previous_and_says_more_replaces_it() {
        let chain = Wrap(
            "transport error",
            Some(Box::new(Wrap("transport error: Connection refused", None))),
        );
        let e = Error::new(ErrorKind::Unavailable, "connect").with_source(chain);
        assert_eq!(
            e.to_string(),
            "unavailable: connect: transport error: Connection refused"
        );
    }

    #[test]
    fn one_line_prints_a_wrapped_tenure_error_once() {
        let inner = Error::new(ErrorKind::Timeout, "campaign")
            .with_backend("zk")
            .with_endpoint("10.0.0.1:2181")
            .with_source(refused());
        let outer = Wrap("leader task failed", Some(Box::new(inner)));
        let line = one_line(&outer);
        assert_eq!(
            line,
            "leader task failed: timeout: campaign: Connection refused [zk at 10.0.0.1:2181]"
        );
        // Walking the chain by hand would print the cause twice: one_line does not.
        assert_eq!(line.matches("Connection refused").count(), 1);
    }

    #[test]
    fn a_cause_that_reads_like_the_kind_still_prints() {
        let e = Error::new(ErrorKind::Timeout, "connect").with_source(Wrap("timeout", None));
        assert_eq!(e.to_string(), "timeout: connect: timeout");
        // An empty message: the cause follows the kind.
        let e = Error::new(ErrorKind::Backend, "").with_source(Wrap("garbage", None));
        assert_eq!(e.to_string(), "backend: garbage");
        assert_eq!(e.clone().to_string(), "backend: garbage");
    }

    #[test]
    fn line_breaks_become_spaces() {
        let e = Error::new(ErrorKind::Backend, "read")
            .with_source(Wrap("bad frame\nat offset 3\r\n", None));
        assert_eq!(e.to_string(), "backend: read: bad frame at offset 3");
        assert!(!one_line(&e).contains('\n'));
    }

    #[test]
    fn endpoints_never_show_credentials() {
        for (given, kept) in [
            ("127.0.0.1:6379", "127.0.0.1:6379"),
            (
                "10.0.0.1:2181,10.0.0.2:2181/chroot",
                "10.0.0.1:2181,10.0.0.2:2181/chroot",
            ),
            ("redis://:S3CRET@h:6379/0", "redis://h:6379/0"),
            ("redis://user:pa/ss@w0rd@h:6379", "redis://h:6379"),
            ("etcd://root:S3CRET@h:2379?password=S3CRET", "etcd://h:2379"),
            (
                "http://127.0.0.1:10000/devstoreaccount1/c?sv=1&sig=S3CRET",
                "http://127.0.0.1:10000/devstoreaccount1/c",
            ),
            ("user:S3CRET@h:1#frag", "h:1"),
            ("redis://:S3?CR#ET@h:6379", "redis://h:6379"),
        ] {
            let e = Error::new(ErrorKind::Unavailable, "connect").with_endpoint(given);
            assert_eq!(e.endpoint(), Some(kept), "{given}");
            assert!(!e.to_string().contains("S3CRET"), "{e}");
        }
        let e = Error::new(ErrorKind::Unavailable, "connect").with_endpoint("h:1");
        assert_eq!(e.to_string(), "unavailable: connect [at h:1]");
    }

    #[test]
    fn a_clone_shares_the_cause_and_prints_the_same_line() {
        let e = Error::new(ErrorKind::Unavailable, "watch leader")
            .with_backend("redis")
            .with_endpoint("h:6379")
            .with_source(Wrap("broken pipe", Some(Box::new(refused()))));
        let copy = e.clone();
        assert_eq!(copy.to_string(), e.to_string());
        assert_eq!(copy.kind(), e.kind());
        assert_eq!(copy.message(), "watch leader");
        assert_eq!(copy.endpoint(), Some("h:6379"));
        let cause = std::error::Error::source(&copy).map(|c| c.to_string());
        assert_eq!(cause.as_deref(), Some("broken pipe"));
        let closed = Error::closed().with_backend("etcd");
        assert_eq!(closed.to_string(), "closed: session closed [etcd]");
        assert!(!closed.is_retryable());
    }
}
