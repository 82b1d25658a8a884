//! `peer://` across nodes: sessions on different nodes of one cluster (in
//! this process, over real TCP on loopback) hand over, fail over and observe
//! each other.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use support::{election, session, within};
use tenure_core::testing::memory_timing;
use tenure_core::{
    Backend, Candidate, DynBackend, ElectionName, ErrorKind, Leadership, Session, Timing,
};
use tenure_peer::{PeerAlgorithm, PeerBackend};
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn cand(id: &str) -> Candidate {
    Candidate::with_value(id, format!("value-of-{id}")).expect("candidate")
}

async fn campaign(s: &Session, e: &ElectionName, c: &str) -> Leadership {
    s.campaign(e, &cand(c)).await.expect("campaign")
}

/// Campaigns for `c` in the background.
fn campaign_later(s: &Session, e: &ElectionName, c: &str) -> JoinHandle<Leadership> {
    let (s, e, c) = (s.clone(), e.clone(), c.to_owned());
    tokio::spawn(async move { campaign(&s, &e, &c).await })
}

/// A three-node bully cluster where node 3 holds the seat as `c` and node 1
/// has waited for it, as `a`, for 200 ms.
struct Standoff {
    nodes: Vec<PeerBackend>,
    e: ElectionName,
    s3: Session,
    c: Leadership,
    waiter: JoinHandle<Leadership>,
}

async fn standoff(name: &str) -> Standoff {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let e = election(name);
    let (s3, s1) = (session(&nodes[2]).await, session(&nodes[0]).await);
    let c = campaign(&s3, &e, "c").await;
    let waiter = campaign_later(&s1, &e, "a");
    tokio::time::sleep(Duration::from_millis(200)).await;
    Standoff {
        nodes,
        e,
        s3,
        c,
        waiter,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_on_different_nodes_hand_over_and_every_node_observes() {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let e = election("handover/across-nodes");
    let (s1, s3) = (session(&nodes[0]).await, session(&nodes[2]).await);
    let observer = session(&nodes[1]).await;
    let mut seen = observer.observe(&e).await.expect("observe");
    assert_eq!(seen.next().await.expect("item").expect("ok"), None);

    let a = within(
        Duration::from_secs(2),
        "node 1 elected",
        campaign(&s1, &e, "a"),
    )
    .await;
    let waiter = campaign_later(&s3, &e, "c");
    // Node 3 outranks node 1 but does not take a held seat.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!waiter.is_finished(), "node 3 took over a held seat");
    assert!(a.is_leader());
    let info = within(Duration::from_secs(2), "observer sees a", async {
        loop {
            if let Some(info) = seen.next().await.expect("item").expect("ok") {
                break info;
            }
        }
    })
    .await;
    assert_eq!((info.id.as_str(), info.token), ("a", a.token()));
    assert_eq!(
        Backend::leader(&nodes[2], &e)
            .await
            .expect("leader")
            .map(|i| i.token),
        Some(a.token())
    );

    let t0 = Instant::now();
    let a_token = a.token();
    a.resign().await.expect("resign");
    let c = within(Duration::from_millis(500), "handover to node 3", waiter)
        .await
        .expect("waiter");
    eprintln!("handover across nodes: {:?}", t0.elapsed());
    assert!(c.token() > a_token);
    within(Duration::from_secs(2), "observer sees c", async {
        loop {
            let item = seen.next().await.expect("item").expect("ok");
            if item
                .as_ref()
                .is_some_and(|i| i.id == "c" && i.token == c.token())
            {
                break;
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_node_is_replaced_after_its_lease_and_loses_first() {
    let Standoff {
        nodes, c, waiter, ..
    } = standoff("crash/node").await;
    let t0 = Instant::now();
    nodes[2].shutdown();
    let lease = support::fast_timing().lease;
    let a = within(lease * 2, "failover after a node crash", waiter)
        .await
        .expect("waiter");
    eprintln!("failover after a node crash: {:?}", t0.elapsed());
    assert!(a.token() > c.token());
    assert!(!c.is_leader());
    let lost = c.lost_at().expect("the crashed node's grant is lost");
    assert!(
        lost <= a.granted_at(),
        "successor granted before the crashed holder's deadline"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_elects_and_hands_over() {
    let runs = PeerAlgorithm::ALL.map(|algorithm| async move {
        let nodes = support::cluster(3, algorithm).await;
        let e = election(&format!("algo/{}", algorithm.name()));
        let sessions = [
            session(&nodes[0]).await,
            session(&nodes[1]).await,
            session(&nodes[2]).await,
        ];
        let mut tasks = Vec::new();
        for (i, s) in sessions.iter().enumerate() {
            let (s, e) = (s.clone(), e.clone());
            tasks.push(tokio::spawn(async move {
                let l = campaign(&s, &e, &format!("n{}", i + 1)).await;
                (i, l)
            }));
        }
        let mut tokens = Vec::new();
        // Three terms: the winner resigns, the next wins, and so on.
        for _ in 0..3 {
            let deadline = Instant::now() + Duration::from_secs(5);
            let (i, l) = loop {
                if let Some(k) = tasks.iter().position(|t| t.is_finished()) {
                    break tasks.swap_remove(k).await.expect("task");
                }
                assert!(Instant::now() < deadline, "{algorithm:?}: nobody elected");
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            assert!(
                tasks.iter().all(|t| !t.is_finished()),
                "{algorithm:?}: two granted at once"
            );
            tokens.push(l.token());
            let seen = Backend::leader(&nodes[(i + 1) % 3], &e)
                .await
                .expect("leader");
            if let Some(info) = seen {
                assert!(info.token <= l.token(), "{algorithm:?}: {info:?}");
            }
            l.resign().await.expect("resign");
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "{algorithm:?}: {tokens:?}"
        );
        algorithm
    });
    for done in futures::future::join_all(runs).await {
        eprintln!("{done:?}: three terms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resigning_node_lets_a_waiting_node_win_before_trying_again() {
    let Standoff {
        nodes: _nodes,
        e,
        s3,
        c,
        waiter,
    } = standoff("hold-off").await;
    // Node 3 outranks node 1; resigning and campaigning again at once must
    // still hand the seat over.
    c.resign().await.expect("resign");
    let again = campaign_later(&s3, &e, "c");
    let a = within(Duration::from_secs(1), "node 1 wins", waiter)
        .await
        .expect("waiter");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!again.is_finished(), "node 3 took the seat back");
    assert!(a.is_leader());
    let a_token = a.token();
    a.resign().await.expect("resign");
    let c2 = within(Duration::from_secs(2), "node 3 again", again)
        .await
        .expect("again");
    assert!(c2.token() > a_token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_timings_are_invalid_arguments() {
    for url in [
        "peer://127.0.0.1:7001",
        "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001&algorithm=raft",
        "peer://nowhere?id=1&peers=1@127.0.0.1:7001",
    ] {
        let e = PeerBackend::connect(url).await.expect_err(url);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}: {e}");
    }
    let nodes = support::cluster_now(1, PeerAlgorithm::Bully).await;
    // The listen address is taken by the node above.
    let taken = format!("peer://{0}?id=1&peers=1@{0}", nodes[0].local_addr());
    let e = PeerBackend::connect(&taken).await.expect_err("in use");
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    // A TTL longer than the quorum lease cannot be kept.
    let backend: DynBackend = Arc::new(nodes[0].clone());
    let e = Session::open(backend, Timing::from_ttl(Duration::from_secs(10)))
        .await
        .expect_err("ttl over the lease");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("ttl"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_cluster_works_alone() {
    let nodes = support::cluster(1, PeerAlgorithm::Ring).await;
    let e = election("alone");
    let s = session(&nodes[0]).await;
    let first = campaign(&s, &e, "a").await;
    let t = first.token();
    first.resign().await.expect("resign");
    let second = campaign(&s, &e, "a").await;
    assert!(second.token() > t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_a_restart_of_every_node_with_state_files() {
    let dir = std::env::temp_dir().join(format!(
        "tenure-peer-restart-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let with_state = |c: &mut tenure_peer::PeerConfig| {
        c.state = Some(dir.join(format!("node-{}.state", c.id)));
    };
    let e = election("restart/all");
    let mut last = 0;
    for round in 0..2 {
        let nodes = support::cluster_with(3, PeerAlgorithm::Bully, with_state).await;
        tokio::time::sleep(support::fast_timing().lease).await;
        let s = session(&nodes[round]).await;
        for _ in 0..2 {
            let l = campaign(&s, &e, "a").await;
            assert!(
                l.token().get() > last,
                "round {round}: {} after {last}",
                l.token().get()
            );
            last = l.token().get();
            l.resign().await.expect("resign");
        }
        s.close().await.expect("close");
        for n in &nodes {
            n.shutdown();
        }
        // Let the listeners close before the next round binds new ports.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_session_is_replaced_within_its_ttl_on_any_node() {
    // Clause 6 for a crashed *session* (the node lives on): the node expires
    // it after its TTL, as a store would. The waiter is on the same node and
    // on another.
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    for (i, waiter_node) in [0usize, 2].into_iter().enumerate() {
        let e = election(&format!("abandon/{i}"));
        let sa = session(&nodes[0]).await;
        let sb = session(&nodes[waiter_node]).await;
        let a = campaign(&sa, &e, "a").await;
        let waiter = campaign_later(&sb, &e, "b");
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t0 = Instant::now();
        sa.abandon();
        let timing = memory_timing();
        let bound = timing.ttl + timing.retry.max + Duration::from_millis(200);
        let b = within(bound, "failover after an abandoned session", waiter)
            .await
            .expect("waiter");
        eprintln!("abandoned session replaced after {:?}", t0.elapsed());
        assert!(!a.is_leader());
        assert!(a.lost_at().is_some_and(|at| at <= b.granted_at()));
        assert!(b.token() > a.token());
    }
}
