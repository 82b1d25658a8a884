//! The engine's primitive suite on ZooKeeper (tickTime 1000 ms, so 2 s is the shortest
//! session timeout), and the ZooKeeper requests for the election operations, counted in
//! the backend's client (every request it sends, renewals included): a grant (campaign
//! on a free seat), a join (campaign behind a holder), a release (resign with a waiter,
//! until the waiter holds the seat), and a batch of 64 tries on free seats. Printed as a
//! table, never asserted.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::Primitives;
use tenure_core::engine::{Candidacy, Op, Snapshot, Token, WaitFor, Write};
use tenure_core::testing::primitives as suite;
use tenure_core::{Candidate, DynBackend, ElectionName, Result, Session};
use tenure_integration::{timing_ms, ZooKeeperServer};
use tenure_zookeeper::ZooKeeperBackend;

tenure_integration::shared_server!(ZooKeeperServer, "ZooKeeper");

async fn backend() -> ZooKeeperBackend {
    let (endpoint, server) = shared_server();
    let url = format!("zk://{endpoint}/tenure-test?connect_timeout=2s&request_timeout=1s");
    match ZooKeeperBackend::from_url(&url).await {
        Ok(b) => b,
        Err(e) => panic!("connect to ZooKeeper at {server}: {e}"),
    }
}

fn election(name: &str) -> ElectionName {
    let prefix = tenure_integration::run_prefix();
    ElectionName::new(format!("{prefix}/{name}")).expect("a valid name")
}

/// Requests sent while `f` runs and for 300 ms after (the follow loops it starts).
async fn counted<T>(
    backend: &ZooKeeperBackend,
    f: impl std::future::Future<Output = T>,
) -> (T, u64) {
    let before = backend.round_trips();
    let out = f.await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    (out, backend.round_trips() - before)
}

/// The test server's `maxSessionTimeout`.
const LONGEST: Duration = Duration::from_secs(20);

/// The primitives with session TTLs over the test server's longest session timeout
/// (the suite opens sessions of 30 s that are never meant to expire) opened at that
/// longest one instead: the server would grant no more, and the primitives refuse a
/// TTL the server does not grant exactly.
#[derive(Debug)]
struct Clamped(Arc<dyn Primitives>);

#[async_trait]
impl Primitives for Clamped {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.0.open(ttl.min(LONGEST)).await
    }
    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.0.renew(sessions).await
    }
    async fn revoke(&self, session: &str) -> Result<()> {
        self.0.revoke(session).await
    }
    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        self.0.read(election).await
    }
    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        self.0.commit(election, write).await
    }
    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        self.0.read_many(elections).await
    }
    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        self.0.commit_many(writes).await
    }
    fn batch(&self) -> Option<usize> {
        self.0.batch()
    }
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        self.0.changed(election, what).await
    }
}

/// The primitive suite of the election engine against the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primitives_keep_their_contract() {
    let backend = backend().await;
    let prefix = tenure_integration::run_prefix();
    suite::check_primitives(Arc::new(Clamped(backend.primitives())), prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation() {
    let backend = backend().await;
    let dyn_backend: DynBackend = Arc::new(backend.clone());
    // Renewals every 5 s: none falls inside a measurement.
    let timing = timing_ms(20_000, 5_000, 17_000, 1000);
    let open = || Session::open(dyn_backend.clone(), timing.clone());
    let (a, b, c) = (
        open().await.expect("open"),
        open().await.expect("open"),
        open().await.expect("open"),
    );
    let e = election("rt");
    let cand = |id: &str| Candidate::new(id).expect("candidate");
    let (held, grant) = counted(&backend, a.campaign(&e, &cand("a"))).await;
    let held = held.expect("granted");
    let queue = async {
        let (b, e, cb) = (b.clone(), e.clone(), cand("b"));
        let waiting = tokio::spawn(async move { b.campaign(&e, &cb).await });
        tokio::time::sleep(Duration::from_millis(200)).await;
        (waiting,)
    };
    let (waiting, join) = counted(&backend, queue).await;
    let release = async {
        held.resign().await.expect("resign");
        waiting.0.await.expect("join").expect("granted")
    };
    let (next, release) = counted(&backend, release).await;
    let seats: Vec<(ElectionName, Candidate)> = (0..64)
        .map(|i| (election(&format!("rt-many/{i}")), cand("c")))
        .collect();
    let (many, batch) = counted(&backend, c.try_campaign_many(&seats)).await;
    let many = many.expect("tries");
    assert_eq!(many.iter().flatten().count(), 64, "64 free seats taken");
    tenure_integration::print_table("ZooKeeper requests", [grant, join, release, batch]);
    drop((next, many));
    for s in [a, b, c] {
        s.close().await.expect("close");
    }
}

/// A put of `session`'s candidacy at `revision`, minting its token.
fn take(session: &str, revision: u64) -> Write {
    let candidacy = Candidacy {
        session: session.to_string(),
        candidate: format!("c-{session}"),
        value: String::new(),
        priority: 0,
        preemptible: true,
    };
    let put = Op::Put {
        candidacy,
        token: Token::Mint,
        told: false,
        chosen: false,
        inherited: None,
    };
    Write {
        revision,
        ops: vec![put],
        ..Write::default()
    }
}

/// A batch of writes where one election moved on before it and one write is of an
/// ended session: each gets its own answer, and the rest still go in one multi (a
/// ZooKeeper multi fails whole at its first failing op; the batch takes that write out
/// and sends the rest again, rather than sending every write on its own).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_write_in_few_requests() {
    let backend = backend().await;
    let prims = backend.primitives();
    let open = || prims.open(Duration::from_secs(20));
    let (a, b) = (open().await.expect("open"), open().await.expect("open"));
    prims.revoke(&b).await.expect("revoke");
    let seats: Vec<ElectionName> = (0..8).map(|i| election(&format!("mixed/{i}"))).collect();
    let (taken, _) = prims.commit(&seats[2], &take(&a, 0)).await.expect("commit");
    assert!(taken, "a free seat is taken");
    let writes: Vec<(ElectionName, Write)> = seats
        .iter()
        .enumerate()
        .map(|(i, e)| (e.clone(), take(if i == 5 { &b } else { &a }, 0)))
        .collect();
    let before = backend.round_trips();
    let answers = prims.commit_many(&writes).await.expect("commit many");
    let requests = backend.round_trips() - before;
    let committed: Vec<bool> = answers.iter().map(|(done, _)| *done).collect();
    let expect: Vec<bool> = (0..8).map(|i| i != 2 && i != 5).collect();
    assert_eq!(committed, expect, "{answers:?}");
    assert_eq!(answers[2].1.revision, 1, "the moved election as it stands");
    assert_eq!(
        answers[5].1.revision, 0,
        "the ended session's election, untouched"
    );
    for (i, (done, snap)) in answers.iter().enumerate() {
        if *done {
            let token = snap.record(&a).and_then(|r| r.token);
            assert!(token.is_some(), "seat {i}: {snap:?}");
        }
    }
    eprintln!("8 writes, one election moved, one session ended: {requests} requests");
    // The read of the moved election, the multi that fails at the ended session's
    // check, the multi of the other six.
    assert!(requests <= 4, "{requests} requests for the batch");
    prims.revoke(&a).await.expect("revoke");
}
