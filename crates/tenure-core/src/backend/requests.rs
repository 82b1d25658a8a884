//! The layer every store request of a backend goes through: the request timeout, the
//! backend's error mapping, the backend and endpoint tags on every error, and the
//! request count, written once instead of once per backend.
//!
//! A backend makes one [`Requests`] when it connects and shares it with its sessions;
//! each store call is wrapped in [`Requests::call`] (or counted with
//! [`Requests::count`] where the store client applies its own timeout, as a pub/sub
//! subscription does). [`Backend::election_requests`](super::Backend::election_requests)
//! then reads [`Requests::election_requests`], which the conformance suite uses to
//! check that waiters do not stampede.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};

/// What a store request is for. Renewals are counted apart: the conformance suite's
/// "election requests" leave them out, since they do not grow with the waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Campaigns, resigns, wake-ups, reads, watches, membership.
    Election,
    /// Session renewals (keep-alives, lease renewals).
    Renewal,
}

/// The error constructors of one backend, each error tagged with its scheme: a backend
/// declares one (`const TAG: Tag = Tag::new("etcd", "etcd")`) instead of writing its own
/// `own`/`timed_out`/`closed` helpers.
#[derive(Clone, Copy, Debug)]
pub struct Tag {
    scheme: &'static str,
    store: &'static str,
}

impl Tag {
    /// The tag of a backend of `scheme` talking to `store` (its name in messages).
    pub const fn new(scheme: &'static str, store: &'static str) -> Self {
        Tag { scheme, store }
    }

    /// An error of `kind` raised by the backend itself.
    pub fn own(self, kind: ErrorKind, message: impl Into<String>) -> Error {
        Error::new(kind, message).with_backend(self.scheme)
    }

    /// An error of `kind` for the operation `what`, caused by the store client's
    /// `source` (printed once, as the cause).
    pub fn wrap(
        self,
        kind: ErrorKind,
        what: &str,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        self.own(kind, what).with_source(source)
    }

    /// The error for a request (`what`) that got no answer within `limit`.
    pub fn timed_out(self, what: &str, limit: Duration) -> Error {
        self.own(
            ErrorKind::Timeout,
            format!("{what}: no answer from {} within {limit:?}", self.store),
        )
    }

    /// Run a backend's connecting (`setup`: reach the store, check the credentials, …)
    /// within `limit`; its error, or a timeout, comes back tagged with `endpoint`. Every
    /// backend's connect is bounded this way: never a hang.
    pub async fn connecting<T>(
        self,
        limit: Duration,
        endpoint: &str,
        setup: impl Future<Output = Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(limit, setup).await {
            Ok(r) => r.map_err(|e| e.with_endpoint(endpoint)),
            Err(_) => Err(self.timed_out("connect", limit).with_endpoint(endpoint)),
        }
    }

    /// The error of a request on a session the caller closed.
    pub fn closed(self) -> Error {
        Error::closed().with_backend(self.scheme)
    }
}

/// The request layer of one backend: see the [module docs](self). `E` is the store
/// client's error type, turned into an [`Error`] by the backend's mapping function.
#[derive(Debug)]
pub struct Requests<E> {
    tag: Tag,
    endpoint: String,
    timeout: Duration,
    map: fn(&str, E) -> Error,
    election: AtomicU64,
    renewal: AtomicU64,
}

impl<E> Requests<E> {
    /// The layer for the backend tagged `tag` at `endpoint` (as the user gave it;
    /// credentials are dropped from errors), with `timeout` for each request; `map`
    /// turns a store client's error for the operation `what` into an [`Error`].
    pub fn new(
        tag: Tag,
        endpoint: impl Into<String>,
        timeout: Duration,
        map: fn(&str, E) -> Error,
    ) -> Self {
        Requests {
            tag,
            endpoint: endpoint.into(),
            timeout,
            map,
            election: AtomicU64::new(0),
            renewal: AtomicU64::new(0),
        }
    }

    /// Run the election request `request` (campaign, resign, read, watch,
    /// membership): see [`call_as`](Self::call_as).
    pub async fn call<T>(
        &self,
        what: &str,
        request: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        self.call_as(Purpose::Election, what, request).await
    }

    /// Run `request` with the request timeout, counted as `purpose`. Its error is
    /// turned into an [`Error`] by the backend's mapping; every error comes back tagged
    /// with the backend and the endpoint.
    pub async fn call_as<T>(
        &self,
        purpose: Purpose,
        what: &str,
        request: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        self.count(purpose);
        let failed = match tokio::time::timeout(self.timeout, request).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => (self.map)(what, e),
            Err(_) => self.timed_out(what, self.timeout),
        };
        Err(self.tag(failed))
    }

    /// Count one request made without [`call`](Self::call).
    pub fn count(&self, purpose: Purpose) {
        let counter = match purpose {
            Purpose::Election => &self.election,
            Purpose::Renewal => &self.renewal,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests counted as [`Purpose::Election`] so far.
    pub fn election_requests(&self) -> u64 {
        self.election.load(Ordering::Relaxed)
    }

    /// Requests counted as [`Purpose::Renewal`] so far.
    pub fn renewals(&self) -> u64 {
        self.renewal.load(Ordering::Relaxed)
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// An error of `kind` raised by the backend itself, tagged with its scheme.
    pub fn error(&self, kind: ErrorKind, message: impl Into<String>) -> Error {
        self.tag.own(kind, message)
    }

    /// The error for a request (`what`) that got no answer within `limit`.
    pub fn timed_out(&self, what: &str, limit: Duration) -> Error {
        self.tag.timed_out(what, limit)
    }

    /// `error` with the backend and the endpoint attached (a backend tag it already has
    /// is kept).
    pub fn tag(&self, error: Error) -> Error {
        let error = match error.backend() {
            Some(_) => error,
            None => error.with_backend(self.tag.scheme),
        };
        error.with_endpoint(&self.endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer() -> Requests<std::io::Error> {
        Requests::new(
            Tag::new("etcd", "etcd"),
            "etcd://user:pw@127.0.0.1:2379?password=x",
            Duration::from_millis(50),
            io_error,
        )
    }

    fn io_error(what: &str, e: std::io::Error) -> Error {
        Error::new(ErrorKind::Unavailable, what).with_source(e)
    }

    #[tokio::test(start_paused = true)]
    async fn answers_pass_and_requests_are_counted_by_purpose() {
        let layer = layer();
        let got = layer
            .call_as(Purpose::Election, "read", async {
                Ok::<_, std::io::Error>(7)
            })
            .await;
        assert_eq!(got.ok(), Some(7));
        layer
            .call_as(Purpose::Renewal, "renew", async {
                Ok::<_, std::io::Error>(())
            })
            .await
            .ok();
        layer.count(Purpose::Election);
        assert_eq!(layer.election_requests(), 2);
        assert_eq!(layer.renewals(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_store_is_a_timeout_tagged_with_backend_and_endpoint() {
        let layer = layer();
        let err = layer
            .call_as(
                Purpose::Election,
                "campaign",
                std::future::pending::<std::result::Result<(), std::io::Error>>(),
            )
            .await
            .err()
            .map(|e| (e.kind(), e.to_string()));
        let Some((kind, text)) = err else {
            panic!("a pending request answered");
        };
        assert_eq!(kind, ErrorKind::Timeout);
        assert_eq!(
            text,
            "timeout: campaign: no answer from etcd within 50ms [etcd at etcd://127.0.0.1:2379]"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_error_is_mapped_once_and_tagged() {
        let layer = layer();
        let err = layer
            .call_as(Purpose::Election, "resign", async {
                Err::<(), _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionRefused,
                    "refused",
                ))
            })
            .await
            .err();
        let Some(err) = err else {
            panic!("an error answered Ok");
        };
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert_eq!(err.backend(), Some("etcd"));
        assert_eq!(err.endpoint(), Some("etcd://127.0.0.1:2379"));
        assert!(!err.to_string().contains("pw"), "{err}");
    }
}
