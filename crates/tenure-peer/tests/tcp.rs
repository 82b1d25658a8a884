//! The algorithms over real TCP on loopback, several nodes in one process,
//! and the transport's robustness against whatever a connection sends.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tenure_peer::sim::SimRng;
use tenure_peer::transport::TransportOptions;
use tenure_peer::wire::{self, Envelope, MAX_FRAME_LEN, WIRE_VERSION};
use tenure_peer::{
    Bully, Config, ElectionAlgorithm, Heartbeat, Leader, Message, PeerId, PeerNode, QuorumGuard,
    Ring, RingVariant, Timing,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn fast_timing() -> Timing {
    Timing {
        lease: Duration::from_millis(600),
        renew_interval: Duration::from_millis(100),
        heartbeat_interval: Duration::from_millis(50),
        leader_timeout: Duration::from_millis(250),
        ..Timing::default()
    }
}

async fn cluster<A, F>(n: u64, make: F) -> (Vec<Option<PeerNode>>, BTreeMap<PeerId, SocketAddr>)
where
    A: ElectionAlgorithm + Send + 'static,
    F: Fn(Config) -> A,
{
    let (ls, addrs) = support::listeners(n).await;
    let members: Vec<PeerId> = addrs.keys().copied().collect();
    let mut nodes = Vec::new();
    for (i, l) in ls.into_iter().enumerate() {
        let id = PeerId(i as u64 + 1);
        let config = Config::with_timing(id, members.clone(), fast_timing()).expect("config");
        let node = PeerNode::with_listener(make(config), l, &addrs, TransportOptions::default())
            .expect("node");
        nodes.push(Some(node));
    }
    (nodes, addrs)
}

/// Waits until every live node agrees on one leader satisfying `ok`.
async fn agreed(
    nodes: &[Option<PeerNode>],
    ok: impl Fn(Leader) -> bool,
    limit: Duration,
) -> Leader {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let views: Vec<Option<Leader>> = nodes.iter().flatten().map(PeerNode::leader).collect();
        if let Some(Some(first)) = views.first() {
            if ok(*first) && views.iter().all(|v| v.map(|l| l.id) == Some(first.id)) {
                return *first;
            }
        }
        if tokio::time::Instant::now() > deadline {
            panic!("no agreement within {limit:?}: {views:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bully_with_heartbeats_elects_the_highest_and_fails_over_over_tcp() {
    let (mut nodes, _) = cluster(5, |c| Heartbeat::new(Bully::new(c))).await;
    let started = tokio::time::Instant::now();
    let first = agreed(&nodes, |l| l.id == PeerId(5), Duration::from_secs(5)).await;
    eprintln!(
        "bully n=5 over loopback: elected in {:?}",
        started.elapsed()
    );
    // Crash the leader: the others detect the silence and elect 4.
    let crashed = tokio::time::Instant::now();
    nodes[4] = None;
    let second = agreed(&nodes, |l| l.id == PeerId(4), Duration::from_secs(5)).await;
    eprintln!(
        "bully n=5 over loopback: failover in {:?}",
        crashed.elapsed()
    );
    assert!(second.epoch > first.epoch);
    for node in nodes.iter().flatten() {
        let stats = node.stats();
        assert_eq!(stats.malformed_total(), 0, "{stats}");
        assert_eq!(stats.rejected_connections, 0, "{stats}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ring_skips_a_dead_successor_over_tcp() {
    let (mut nodes, _) = cluster(4, |c| Heartbeat::new(Ring::new(c, RingVariant::AliveSet))).await;
    agreed(&nodes, |l| l.id == PeerId(4), Duration::from_secs(5)).await;
    nodes[3] = None;
    agreed(&nodes, |l| l.id == PeerId(3), Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_guard_over_tcp_fences_and_fails_over() {
    let (mut nodes, _) = cluster(3, |c| QuorumGuard::new(Heartbeat::new(Bully::new(c)))).await;
    let first = agreed(&nodes, |l| l.id == PeerId(3), Duration::from_secs(5)).await;
    // Isolate the leader: it steps down within a lease; the majority side
    // elects 2 in a higher epoch.
    nodes[2].as_ref().expect("3 is up").set_isolated(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let two = nodes[1].as_ref().and_then(PeerNode::leader);
        let three = nodes[2].as_ref().and_then(PeerNode::leader);
        if two.is_some_and(|l| l.id == PeerId(2)) {
            assert!(
                three.is_none_or(|l| l.id != PeerId(3)),
                "two leaders: {three:?}"
            );
            assert!(two.is_some_and(|l| l.epoch > first.epoch));
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failover: {two:?} {three:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    nodes[2] = None;
    let later = agreed(&nodes, |l| l.id == PeerId(2), Duration::from_secs(5)).await;
    assert!(later.epoch > first.epoch);
}

/// A raw connection to `addr` that has said hello as `from`.
async fn hello(addr: SocketAddr, from: u64, members: &[u64]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let hello = wire::encode_envelope(&Envelope::Hello {
        from: PeerId(from),
        cluster: tenure_peer::transport::cluster_digest(members.iter().copied().map(PeerId)),
    })
    .expect("hello");
    s.write_all(&hello).await.expect("write hello");
    s
}

/// True once the peer closed the connection.
async fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_frames_are_dropped_and_counted() {
    let (nodes, addrs) = cluster(3, |c| Heartbeat::new(Bully::new(c))).await;
    agreed(&nodes, |l| l.id == PeerId(3), Duration::from_secs(5)).await;
    let node = nodes[0].as_ref().expect("node 1");
    let addr = addrs[&PeerId(1)];
    let members = [1, 2, 3];

    // Handshakes that are refused: garbage, another cluster, a non-member,
    // the node itself, and silence until the client gives up.
    let before = node.stats().rejected_connections;
    let mut garbage = TcpStream::connect(addr).await.expect("connect");
    garbage
        .write_all(b"GET / HTTP/1.1\r\n\r\n")
        .await
        .expect("write");
    assert!(closed_by_peer(&mut garbage).await);
    assert!(closed_by_peer(&mut hello(addr, 2, &[1, 2, 3, 4]).await).await);
    assert!(closed_by_peer(&mut hello(addr, 9, &members).await).await);
    assert!(closed_by_peer(&mut hello(addr, 1, &members).await).await);
    wait_for("four refusals counted", || {
        node.stats().rejected_connections >= before + 4
    })
    .await;

    // After a valid hello: malformed frames are dropped one by one and the
    // connection goes on.
    let mut s = hello(addr, 2, &members).await;
    let good = wire::encode_envelope(&Envelope::Routed {
        channel: "other-channel".into(),
        msg: Message::Alive { epoch: 1 },
    })
    .expect("encode");
    let mut wrong_version = good.clone();
    wrong_version[4] = WIRE_VERSION + 1;
    let mut unknown_kind = good.clone();
    unknown_kind[5] = 0x7f;
    let bad_text = {
        // Channel length 2 with invalid UTF-8.
        let body = [
            WIRE_VERSION,
            0x41,
            0,
            2,
            0xff,
            0xfe,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
            0,
            1,
        ];
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&body);
        f
    };
    let truncated_body = {
        let body = [WIRE_VERSION, 0x41, 0, 0, 1, 0, 0];
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(&body);
        f
    };
    let second_hello = wire::encode_envelope(&Envelope::Hello {
        from: PeerId(2),
        cluster: 0,
    })
    .expect("encode");
    let received_before = node.stats().frames_received;
    let malformed_before = node.stats().malformed_total();
    for frame in [
        &wrong_version,
        &good,
        &unknown_kind,
        &bad_text,
        &truncated_body,
        &second_hello,
        &good,
    ] {
        s.write_all(frame).await.expect("write");
    }
    wait_for("frames counted", || {
        let st = node.stats();
        st.frames_received >= received_before + 2 && st.malformed_total() >= malformed_before + 5
    })
    .await;
    let st = node.stats();
    for label in [
        "unsupported_version",
        "unknown_kind",
        "invalid_text",
        "truncated",
        "unexpected_hello",
    ] {
        assert!(
            st.malformed.get(label).is_some_and(|n| *n >= 1),
            "{label}: {st}"
        );
    }

    // An oversized length prefix closes that connection only.
    let oversized_before = node.stats().oversized;
    s.write_all(&((MAX_FRAME_LEN as u32) * 2).to_be_bytes())
        .await
        .expect("write");
    assert!(closed_by_peer(&mut s).await);
    wait_for("oversized counted", || {
        node.stats().oversized > oversized_before
    })
    .await;

    // The node still works: it follows the leader, and a failover still
    // happens.
    assert_eq!(node.leader().map(|l| l.id), Some(PeerId(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_bytes_from_many_connections_never_hurt_a_node() {
    let (mut nodes, addrs) = cluster(3, |c| Heartbeat::new(Bully::new(c))).await;
    agreed(&nodes, |l| l.id == PeerId(3), Duration::from_secs(5)).await;
    let addr = addrs[&PeerId(1)];
    let mut rng = SimRng::new(0xf022);
    for round in 0..40u64 {
        let mut s = if round % 2 == 0 {
            hello(addr, 2, &[1, 2, 3]).await
        } else {
            TcpStream::connect(addr).await.expect("connect")
        };
        let mut bytes = Vec::new();
        for _ in 0..rng.below(8) {
            // Plausible headers with random bodies, and pure noise.
            if rng.below(2) == 0 {
                let len = rng.below(64) as u32;
                bytes.extend_from_slice(&len.to_be_bytes());
                bytes.push(if rng.below(4) == 0 {
                    rng.below(256) as u8
                } else {
                    WIRE_VERSION
                });
                bytes.push([0x40, 0x41, 0x42, rng.below(256) as u8][rng.below(4) as usize]);
                for _ in 0..len.saturating_sub(2) {
                    bytes.push(rng.below(256) as u8);
                }
            } else {
                for _ in 0..rng.below(100) {
                    bytes.push(rng.below(256) as u8);
                }
            }
        }
        let _ = s.write_all(&bytes).await;
        drop(s);
    }
    // Still a working cluster: crash the leader and watch the failover.
    nodes[2] = None;
    agreed(&nodes, |l| l.id == PeerId(2), Duration::from_secs(5)).await;
    let stats = nodes[0].as_ref().expect("node 1").stats();
    eprintln!("after the noise: {stats}");
    assert!(stats.malformed_total() + stats.rejected_connections + stats.oversized > 0);
}
