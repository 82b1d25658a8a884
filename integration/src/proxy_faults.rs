//! The conformance suite's fault hooks ([`Faults`]) for any store reached over TCP:
//! the suite's victim backend reaches the store through a [`TcpProxy`] (disconnect
//! black-holes the link, reconnect heals it), and expiry is whatever the store offers,
//! given as a function of the session id.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tenure_core::testing::{Env, Faults};
use tenure_core::{DynBackend, Error, ErrorKind, Session, Timing};

use crate::TcpProxy;

type Connect =
    Box<dyn Fn(String) -> BoxFuture<'static, tenure_core::Result<DynBackend>> + Send + Sync>;
type Expire = Box<dyn Fn(String) -> BoxFuture<'static, tenure_core::Result<()>> + Send + Sync>;

/// [`Faults`] through a proxy in front of the store; see the module docs.
pub struct ProxyFaults {
    endpoint: String,
    server: SocketAddr,
    connect: Connect,
    expire: Result<Expire, &'static str>,
    proxy: tokio::sync::Mutex<Option<TcpProxy>>,
}

impl ProxyFaults {
    /// Hooks for the store at `endpoint` (listening on `server`); `connect` makes a
    /// backend from an endpoint of the same form (the proxy's address in place of the
    /// server's). Expiry is unsupported until [`expire_with`](Self::expire_with).
    pub fn new<C, F>(endpoint: &str, server: SocketAddr, connect: C) -> Self
    where
        C: Fn(String) -> F + Send + Sync + 'static,
        F: Future<Output = tenure_core::Result<DynBackend>> + Send + 'static,
    {
        ProxyFaults {
            endpoint: endpoint.to_string(),
            server,
            connect: Box::new(move |e| Box::pin(connect(e))),
            expire: Err("this store's tests do not expire sessions"),
            proxy: tokio::sync::Mutex::new(None),
        }
    }

    /// Expire a session (given its id) the store's own way.
    pub fn expire_with<E, F>(mut self, expire: E) -> Self
    where
        E: Fn(String) -> F + Send + Sync + 'static,
        F: Future<Output = tenure_core::Result<()>> + Send + 'static,
    {
        self.expire = Ok(Box::new(move |id| Box::pin(expire(id))));
        self
    }

    /// Why the store has no session to expire.
    pub fn no_expiry(mut self, why: &'static str) -> Self {
        self.expire = Err(why);
        self
    }

    /// The conformance suite's env on `backend`: `timing`, `slack_ms` milliseconds of
    /// slack on its liveness bounds, and these hooks.
    pub fn env(self, backend: DynBackend, timing: Timing, slack_ms: u64) -> Env {
        let mut env = Env::new(backend, timing);
        env.slack = Duration::from_millis(slack_ms);
        env.faults = Arc::new(self);
        env
    }

    async fn with_proxy(&self, heal: bool) -> Result<(), String> {
        let proxy = self.proxy.lock().await;
        let Some(p) = proxy.as_ref() else {
            return Err("no victim backend behind a proxy".into());
        };
        let done = if heal {
            p.heal().await
        } else {
            p.blackhole().await
        };
        done.map_err(|e| e.to_string())
    }
}

#[async_trait]
impl Faults for ProxyFaults {
    async fn victim_backend(&self, _env: &Env) -> Result<DynBackend, String> {
        let proxy = TcpProxy::start(self.server)
            .await
            .map_err(|e| e.to_string())?;
        let endpoint =
            self.endpoint
                .replacen(&self.server.to_string(), &proxy.addr().to_string(), 1);
        let backend = (self.connect)(endpoint).await.map_err(|e| e.to_string())?;
        *self.proxy.lock().await = Some(proxy);
        Ok(backend)
    }

    async fn disconnect(&self, _session: &Session) -> Result<(), String> {
        self.with_proxy(false).await
    }

    async fn reconnect(&self, _session: &Session) -> Result<(), String> {
        self.with_proxy(true).await
    }

    async fn expire(&self, session: &Session) -> Result<(), String> {
        match &self.expire {
            Ok(expire) => expire(session.id()).await.map_err(|e| e.to_string()),
            Err(why) => Err((*why).to_string()),
        }
    }
}

/// A suite's timing, in milliseconds: TTL `ttl`, a renewal every `renew`, leadership
/// valid for `deadline` after the last confirmed renewal was sent, `connect` to connect.
pub fn timing_ms(ttl: u64, renew: u64, deadline: u64, connect: u64) -> Timing {
    let mut t = Timing::from_ttl(Duration::from_millis(ttl));
    t.renew_interval = Duration::from_millis(renew);
    t.renew_deadline = Duration::from_millis(deadline);
    t.connect_timeout = Duration::from_millis(connect);
    t
}

/// Asserts that `backend` refuses a session with each TTL of `ttls` as an invalid
/// argument naming the field (`ttl…`); returns the errors.
pub async fn assert_ttls_refused(backend: &DynBackend, ttls: &[Duration]) -> Vec<Error> {
    let mut errors = Vec::new();
    for &ttl in ttls {
        let err = match Session::open(backend.clone(), Timing::from_ttl(ttl)).await {
            Ok(_) => panic!("a session with TTL {ttl:?} was opened"),
            Err(e) => e,
        };
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ttl:?}: {err}");
        assert!(err.message().starts_with("ttl"), "{ttl:?}: {err}");
        errors.push(err);
    }
    errors
}

/// The conformance [`Env`] of an etcd at `endpoint` (`server` its address), connecting
/// with the URL `url` makes of `host:port` (every member for an external cluster):
/// TTL 2 s (etcd leases are whole seconds), renewals every 300 ms, leadership valid
/// for 1.2 s after the last confirmed renewal was sent; a victim's connection cut
/// through a proxy, expiry by revoking the lease through the main backend.
pub async fn etcd_env(
    endpoint: &str,
    server: SocketAddr,
    url: impl Fn(&str) -> String + Send + Sync + 'static,
) -> Env {
    let url = Arc::new(url);
    let backend = match tenure_etcd::EtcdBackend::from_url(&url(endpoint)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to etcd at {server}: {e}"),
    };
    let faults = ProxyFaults::new(&server.to_string(), server, move |at| {
        let url = url.clone();
        async move {
            let b = tenure_etcd::EtcdBackend::from_url(&url(&at)).await?;
            Ok(Arc::new(b) as DynBackend)
        }
    });
    let main = backend.clone();
    let faults = faults.expire_with(move |id| {
        let backend = main.clone();
        async move { backend.revoke_session(&id).await }
    });
    faults.env(Arc::new(backend), timing_ms(2000, 300, 1200, 1000), 500)
}
