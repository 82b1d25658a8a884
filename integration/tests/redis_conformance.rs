//! The whole election contract against a real Redis: one server for this test binary
//! (or the one named by `TENURE_TEST_REDIS`), a random election prefix per test, a TTL
//! of 1 s, and faults injected through a TCP proxy (disconnect: black hole) and by
//! ending the session's keys through a second backend (expiry).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{BackendSession, Capabilities, Clause, SessionEvents};
use tenure_core::testing::Env;
use tenure_core::{Backend, DynBackend, ElectionName, LeaderInfo, LeaderStream, Timing};
use tenure_integration::{assert_ttls_refused, timing_ms, ProxyFaults, RedisServer};
use tenure_redis::RedisBackend;

tenure_integration::shared_server!(RedisServer, "Redis");

/// The test settings appended to a `redis://…` endpoint.
fn url(endpoint: &str) -> String {
    let query = "prefix=tenure-test&connect_timeout_ms=1000&request_timeout_ms=1000";
    tenure_integration::with_query(endpoint, &format!("{query}&poll_interval_ms=1000"))
}

async fn redis_env() -> Env {
    let (endpoint, server) = shared_server();
    let backend = match RedisBackend::from_url(&url(&endpoint)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to Redis at {server}: {e}"),
    };
    // Disconnects black-hole a victim backend's link through a proxy; expiry ends the
    // session's keys through the main backend.
    let faults = ProxyFaults::new(&endpoint, server, |at| async move {
        Ok(Arc::new(RedisBackend::from_url(&url(&at)).await?) as DynBackend)
    });
    let main = backend.clone();
    let faults = faults.expire_with(move |id| {
        let backend = main.clone();
        async move { backend.expire_session(&id).await.map(|_| ()) }
    });
    // TTL 1 s, renew every 100 ms, leadership valid for 600 ms after the last
    // confirmed renewal was sent.
    faults.env(Arc::new(backend), timing_ms(1000, 100, 600, 1000), 500)
}

tenure_core::conformance_tests!(redis_env());

/// The Redis backend declares clause 1 conditional (it holds while Redis keeps its
/// data), so the shared suite skips it; this wrapper declares every clause so the check
/// still runs against a Redis that keeps its data.
#[derive(Debug)]
struct EveryClause(RedisBackend);

#[async_trait]
impl Backend for EveryClause {
    fn scheme(&self) -> &'static str {
        self.0.scheme()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::full()
    }
    fn check_timing(&self, timing: &Timing) -> tenure_core::Result<()> {
        self.0.check_timing(timing)
    }
    async fn open_session(
        &self,
        ttl: Duration,
        events: SessionEvents,
    ) -> tenure_core::Result<Arc<dyn BackendSession>> {
        self.0.open_session(ttl, events).await
    }
    async fn leader(&self, election: &ElectionName) -> tenure_core::Result<Option<LeaderInfo>> {
        self.0.leader(election).await
    }
    async fn observe(&self, election: &ElectionName) -> tenure_core::Result<LeaderStream> {
        self.0.observe(election).await
    }
    fn election_requests(&self) -> Option<u64> {
        self.0.election_requests()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clause_01_at_most_one_holder_while_redis_keeps_its_data() {
    let mut env = redis_env().await;
    let why = env.backend.capabilities().supports(Clause::AtMostOneHolder);
    assert!(why.is_err_and(|w| w.contains("keeps its data")));
    let (endpoint, _) = shared_server();
    let backend = RedisBackend::from_url(&url(&endpoint))
        .await
        .expect("connect");
    env.backend = Arc::new(EveryClause(backend));
    tenure_core::testing::check_at_most_one_holder(&env).await;
}

/// Not in the shared suite: a TTL Redis cannot store is refused, naming the field.
#[tokio::test]
async fn absurd_ttl_is_rejected() {
    let century = [Duration::from_secs(100 * 365 * 24 * 3600)];
    assert_ttls_refused(&redis_env().await.backend, &century).await;
}
