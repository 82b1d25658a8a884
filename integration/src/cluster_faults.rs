//! What the clustered-store tests share (`etcd_cluster.rs`, `zookeeper_ensemble.rs`):
//! a session over every member, a leadership in a fresh election, and holding it
//! through a fault.

use std::time::Duration;

use tenure_core::testing::random_prefix;
use tenure_core::{Candidate, DynBackend, ElectionName, Leadership, Session, Timing};

/// With `RUST_LOG` set, logs to the test's output (shown when a test fails).
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A fresh election name under `cluster/` (a random prefix, so runs never meet).
pub fn election(what: &str) -> ElectionName {
    match ElectionName::new(format!("cluster/{}/{what}", random_prefix())) {
        Ok(name) => name,
        Err(e) => panic!("election name for {what}: {e}"),
    }
}

/// A session with `ttl` and otherwise default timing on `backend`.
pub async fn session(backend: DynBackend, ttl: Duration) -> Session {
    match Session::open(backend, Timing::from_ttl(ttl)).await {
        Ok(s) => s,
        Err(e) => panic!("open a session: {e}"),
    }
}

/// Leadership of `election` as candidate `holder`.
pub async fn lead_in(session: &Session, election: &ElectionName) -> Leadership {
    match session
        .campaign(election, &Candidate::new("holder").expect("candidate"))
        .await
    {
        Ok(l) => l,
        Err(e) => panic!("campaign for {election}: {e}"),
    }
}

/// Leadership of a fresh election named after `what`.
pub async fn lead(session: &Session, what: &str) -> Leadership {
    lead_in(session, &election(what)).await
}

/// Holds for `how_long`; panics if the lost signal fires meanwhile (`what` names the
/// fault) or if the leadership is not valid afterwards.
pub async fn hold_through(leadership: &Leadership, how_long: Duration, what: &str) {
    let lost = leadership.lost();
    tokio::select! {
        _ = lost.cancelled() => panic!(
            "{what}: a healthy leader lost its seat ({:?} at {:?})",
            leadership.loss_reason(),
            leadership.lost_at()
        ),
        _ = tokio::time::sleep(how_long) => {}
    }
    assert!(leadership.is_leader(), "{what}: not leader afterwards");
}
