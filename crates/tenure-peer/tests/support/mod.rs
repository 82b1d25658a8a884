//! Clusters of `peer://` nodes in one process, over real TCP on loopback.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::testing::memory_timing;
use tenure_core::{DynBackend, ElectionName, Session};
use tenure_peer::{PeerAlgorithm, PeerBackend, PeerConfig, PeerId, Timing};
use tokio::net::TcpListener;

/// Short periods so that tests are quick: a 1.5 s quorum lease (sessions of
/// up to 1.5 s TTL fit), heartbeats every 50 ms, failure detection after
/// 250 ms.
pub fn fast_timing() -> Timing {
    Timing {
        lease: Duration::from_millis(1500),
        renew_interval: Duration::from_millis(250),
        heartbeat_interval: Duration::from_millis(50),
        leader_timeout: Duration::from_millis(250),
        answer_timeout: Duration::from_millis(100),
        announce_timeout: Duration::from_millis(300),
        tie_break_step: Duration::from_millis(50),
        invite_interval: Duration::from_millis(200),
        round_timeout: Duration::from_millis(300),
    }
}

/// `n` nodes running `algorithm`, started on free ports, past their start:
/// a node acknowledges nobody for one lease after it starts (it may have
/// acknowledged someone just before a crash), so this waits that out.
pub async fn cluster(n: u64, algorithm: PeerAlgorithm) -> Vec<PeerBackend> {
    let nodes = cluster_now(n, algorithm).await;
    tokio::time::sleep(fast_timing().lease).await;
    nodes
}

/// Like [`cluster`] without waiting.
pub async fn cluster_now(n: u64, algorithm: PeerAlgorithm) -> Vec<PeerBackend> {
    cluster_with(n, algorithm, |_| {}).await
}

/// Listeners for members `1..=n` on free loopback ports, and their
/// addresses.
pub async fn listeners(n: u64) -> (Vec<TcpListener>, BTreeMap<PeerId, SocketAddr>) {
    let mut ls = Vec::new();
    let mut addrs = BTreeMap::new();
    for id in 1..=n {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        addrs.insert(PeerId(id), l.local_addr().expect("addr"));
        ls.push(l);
    }
    (ls, addrs)
}

/// Like [`cluster_now`], with `adjust` applied to every node's configuration.
pub async fn cluster_with(
    n: u64,
    algorithm: PeerAlgorithm,
    adjust: impl Fn(&mut PeerConfig),
) -> Vec<PeerBackend> {
    let (listeners, members) = listeners(n).await;
    let mut nodes = Vec::new();
    for (i, l) in listeners.into_iter().enumerate() {
        let id = PeerId(i as u64 + 1);
        let mut config = PeerConfig::new(id, members[&id], members.clone());
        config.algorithm = algorithm;
        config.timing = fast_timing();
        config.hold_off = Duration::from_millis(500);
        adjust(&mut config);
        nodes.push(PeerBackend::with_listener(config, l).expect("node"));
    }
    nodes
}

pub fn election(name: &str) -> ElectionName {
    ElectionName::new(name).expect("name")
}

/// A session on `node`.
pub async fn session(node: &PeerBackend) -> Session {
    let backend: DynBackend = Arc::new(node.clone());
    Session::open(backend, memory_timing())
        .await
        .expect("session")
}

/// A session on each of the first three nodes, in order.
pub async fn three_sessions(nodes: &[PeerBackend]) -> (Session, Session, Session) {
    (
        session(&nodes[0]).await,
        session(&nodes[1]).await,
        session(&nodes[2]).await,
    )
}

/// `fut`'s output; panics (naming `what`) if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within {limit:?}"))
}
