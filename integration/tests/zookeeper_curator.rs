//! Interop with a real Apache Curator `LeaderLatch` (Debian's `libcurator-recipes-java`,
//! run by `integration/java/LatchProbe.java` in a child JVM) on the same ZooKeeper path
//! as tenure candidates: whoever queued first leads, the other waits and sees who leads,
//! and each is granted the seat when the one before it leaves. One ZooKeeper for the
//! binary, a fresh election per test (they may run in parallel).
//!
//! A missing `java` or Curator jar fails the tests with a message naming
//! `bash scripts/install-test-deps.sh`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_core::{Candidate, ElectionName, LeaderInfo, Leadership, Session, Timing};
use tenure_integration::{
    curator_version, CuratorLatch, SpawnedCampaign as Campaign, ZooKeeperServer,
};
use tenure_zookeeper::ZooKeeperBackend;

tenure_integration::shared_server!(ZooKeeperServer, "ZooKeeper");

/// The chroot of tenure's URL; Curator has none, so its latch path starts with it.
const CHROOT: &str = "/curator-interop";
/// How long a waiter must keep waiting to count as "not granted".
const QUIET: Duration = Duration::from_secs(2);
/// A generous bound for a handover between the two libraries (it takes milliseconds).
const HANDOVER: Duration = Duration::from_secs(10);
/// How often the three-way test samples who leads.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);

fn connect_string() -> String {
    shared_server().1.to_string()
}

/// A fresh election for `test`: `curator/<test>-<pid>-<n>`.
fn election(test: &str) -> ElectionName {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ElectionName::new(format!("curator/{test}-{}-{n}", std::process::id())).expect("election name")
}

/// The path Curator must use for `election`: tenure puts an election at
/// `<chroot>/<name>`, the name's `/` being path separators.
fn latch_path(election: &ElectionName) -> String {
    format!("{CHROOT}/{}", election.as_str())
}

/// tenure's URL for Curator interop: `layout=curator` (the default layout keeps
/// priorities and cannot share an election with Curator).
fn curator_url() -> String {
    format!(
        "zk://{}{CHROOT}?connect_timeout=5s&request_timeout=5s&layout=curator",
        connect_string()
    )
}

async fn session() -> Session {
    let url = curator_url();
    let backend = ZooKeeperBackend::from_url(&url)
        .await
        .expect("tenure's ZooKeeper backend");
    Session::open(Arc::new(backend), Timing::from_ttl(Duration::from_secs(4)))
        .await
        .expect("tenure session")
}

async fn start_latch(election: &ElectionName, id: &str) -> CuratorLatch {
    CuratorLatch::start(&connect_string(), &latch_path(election), id)
        .await
        .unwrap_or_else(|e| panic!("starting the Curator latch {id}: {e}"))
}

/// The candidate id in tenure's node data as Curator reads it (`getLeader()`,
/// `getParticipants()` give the raw data: tenure's JSON `{"id":…,"value":…}`).
fn tenure_id_in(curator_id: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(curator_id).ok()?;
    Some(v.get("id")?.as_str()?.to_string())
}

/// A tenure campaign of candidate `id`, running in a task.
fn spawn_campaign(session: &Session, election: &ElectionName, id: &str) -> Campaign {
    Campaign::spawn(session, election, Candidate::new(id).expect("candidate id"))
}

/// Curator's view of the queue, once it has `n` participants (at most `HANDOVER`).
async fn participants(latch: &mut CuratorLatch, n: usize) -> Vec<(bool, String)> {
    let until = Instant::now() + HANDOVER;
    loop {
        let list = latch.participants().await.expect("participants");
        if list.len() == n {
            return list;
        }
        assert!(
            Instant::now() < until,
            "Curator did not see {n} participants within {HANDOVER:?}: {list:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The next leader `observe` reports that satisfies `pred`, within `HANDOVER`.
async fn observed(
    stream: &mut tenure_core::LeaderStream,
    pred: impl Fn(&Option<LeaderInfo>) -> bool,
) -> Option<LeaderInfo> {
    tenure_integration::next_leader_where(stream, HANDOVER, pred).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curator_leads_first_and_tenure_takes_over_when_it_closes() {
    let election = election("curator-first");
    eprintln!(
        "Curator {}",
        curator_version().as_deref().unwrap_or("(unknown version)")
    );
    let mut java = start_latch(&election, "java-a").await;
    java.wait_for_line(0, |l| l == "leader", HANDOVER)
        .await
        .expect("the latch leads an empty election");

    let session = session().await;
    // tenure reads Curator's node: its data (the participant id) is the leader's id.
    let curator_leader = session
        .leader(&election)
        .await
        .expect("leader()")
        .expect("tenure sees a leader");
    assert_eq!(
        (curator_leader.id.as_str(), curator_leader.value.as_str()),
        ("java-a", "")
    );
    assert!(curator_leader.token.get() > 0);
    let mut stream = session.observe(&election).await.expect("observe()");
    let first = observed(&mut stream, |_| true).await;
    assert_eq!(first.map(|l| l.id).as_deref(), Some("java-a"));

    let mut tenure = spawn_campaign(&session, &election, "tenure-a");
    // Curator sees tenure's node queued behind its own.
    let queue = participants(&mut java, 2).await;
    assert_eq!(queue[0], (true, "java-a".to_string()), "{queue:?}");
    assert!(!queue[1].0, "{queue:?}");
    assert_eq!(tenure_id_in(&queue[1].1).as_deref(), Some("tenure-a"));

    // tenure waits while Curator leads.
    tokio::time::sleep(QUIET).await;
    assert!(
        !tenure.granted().await,
        "tenure was elected while Curator leads"
    );
    assert!(java.has_leadership().await.expect("status"));
    assert_eq!(java.count("notleader"), 0, "{:?}", java.other_stdout());
    let still = session.leader(&election).await.expect("leader()");
    assert_eq!(still.map(|l| l.id).as_deref(), Some("java-a"));

    let closed = Instant::now();
    java.close().await.expect("close the latch");
    assert!(!java.has_leadership().await.expect("status"));
    let token = tenure.wait(HANDOVER).await.0.token();
    eprintln!(
        "Curator close -> tenure elected: {:.1} ms",
        closed.elapsed().as_secs_f64() * 1e3
    );
    assert!(tenure.is_leader());
    assert!(token.get() > 0);
    // The token is tenure's node's creation zxid, later than Curator's node.
    assert!(
        token > curator_leader.token,
        "{token} vs {}",
        curator_leader.token
    );
    let now = observed(&mut stream, |l| {
        l.as_ref().is_some_and(|l| l.id == "tenure-a")
    })
    .await;
    assert_eq!(now.map(|l| l.token), Some(token));
    // Curator (closed, client still open) reads tenure's node as the leader.
    let leader = java.leader().await.expect("getLeader()");
    assert_eq!(
        tenure_id_in(&leader).as_deref(),
        Some("tenure-a"),
        "{leader}"
    );

    java.quit().await.expect("quit the latch");
    session.close().await.expect("close the session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_leads_first_and_curator_takes_over_when_it_resigns() {
    let election = election("tenure-first");
    let session = session().await;
    let leadership = session
        .campaign(&election, &Candidate::new("tenure-b").expect("id"))
        .await
        .expect("tenure leads an empty election");

    let mut java = start_latch(&election, "java-b").await;
    let queue = participants(&mut java, 2).await;
    assert!(queue[0].0, "{queue:?}");
    assert_eq!(tenure_id_in(&queue[0].1).as_deref(), Some("tenure-b"));
    assert_eq!(queue[1], (false, "java-b".to_string()), "{queue:?}");
    assert!(!java.has_leadership().await.expect("status"));
    let curator_sees = java.leader().await.expect("getLeader()");
    assert_ne!(curator_sees, "java-b");
    assert_eq!(
        tenure_id_in(&curator_sees).as_deref(),
        Some("tenure-b"),
        "{curator_sees}"
    );

    // Curator waits while tenure leads.
    tokio::time::sleep(QUIET).await;
    assert_eq!(java.count("leader"), 0, "{:?}", java.other_stdout());
    assert!(!java.has_leadership().await.expect("status"));
    assert!(leadership.is_leader());
    let leader = session.leader(&election).await.expect("leader()");
    assert_eq!(leader.map(|l| l.id).as_deref(), Some("tenure-b"));

    let resigned = Instant::now();
    leadership.resign().await.expect("resign");
    java.wait_for_line(0, |l| l == "leader", HANDOVER)
        .await
        .expect("the latch leads once tenure resigned");
    eprintln!(
        "tenure resign -> Curator isLeader(): {:.1} ms",
        resigned.elapsed().as_secs_f64() * 1e3
    );
    assert!(java.has_leadership().await.expect("status"));
    assert_eq!(java.leader().await.expect("getLeader()"), "java-b");
    let leader = session.leader(&election).await.expect("leader()");
    assert_eq!(leader.map(|l| l.id).as_deref(), Some("java-b"));

    java.quit().await.expect("quit the latch");
    session.close().await.expect("close the session");
}

/// Who leads now, by each one's own account; fails if two do.
async fn sample(
    t1: &Option<Leadership>,
    java: &mut CuratorLatch,
    t2: &mut Campaign,
) -> Option<&'static str> {
    let mut leaders = Vec::new();
    if t1.as_ref().is_some_and(Leadership::is_leader) {
        leaders.push("tenure-1");
    }
    if t2.granted().await && t2.is_leader() {
        leaders.push("tenure-2");
    }
    if java.has_leadership().await.expect("status") {
        leaders.push("java-c");
    }
    assert!(leaders.len() <= 1, "two leaders at once: {leaders:?}");
    leaders.first().copied()
}

/// Sample until `want` leads (at most `HANDOVER`), then for `QUIET` longer that it
/// still does; returns how long the handover took.
async fn turn(
    want: &'static str,
    t1: &Option<Leadership>,
    java: &mut CuratorLatch,
    t2: &mut Campaign,
    turns: &mut Vec<&'static str>,
) -> Duration {
    let started = Instant::now();
    loop {
        let now = sample(t1, java, t2).await;
        if let Some(who) = now {
            if turns.last() != Some(&who) {
                turns.push(who);
            }
        }
        if now == Some(want) {
            break;
        }
        assert!(
            started.elapsed() < HANDOVER,
            "{want} did not lead within {HANDOVER:?}; turns so far {turns:?}"
        );
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let took = started.elapsed();
    let until = Instant::now() + QUIET;
    while Instant::now() < until {
        let now = sample(t1, java, t2).await;
        assert_eq!(now, Some(want), "turns so far {turns:?}");
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_curator_tenure_take_turns_in_queue_order() {
    let election = election("three-way");
    let first = session().await;
    let second = session().await;

    let t1 = first
        .campaign(&election, &Candidate::new("tenure-1").expect("id"))
        .await
        .expect("tenure-1 leads an empty election");
    let t1_token = t1.token();
    let mut t1 = Some(t1);
    let mut java = start_latch(&election, "java-c").await;
    let mut t2 = spawn_campaign(&second, &election, "tenure-2");
    let mut turns = Vec::new();
    turn("tenure-1", &t1, &mut java, &mut t2, &mut turns).await;
    // The queue, as Curator sees it, is in creation order.
    let queue = participants(&mut java, 3).await;
    let ids: Vec<(bool, String)> = queue
        .iter()
        .map(|(leader, id)| (*leader, tenure_id_in(id).unwrap_or_else(|| id.clone())))
        .collect();
    assert_eq!(
        ids,
        [
            (true, "tenure-1".to_string()),
            (false, "java-c".to_string()),
            (false, "tenure-2".to_string())
        ]
    );

    // tenure-1 leaves by dropping its leadership; Curator is next, not tenure-2.
    drop(t1.take());
    let took = turn("java-c", &t1, &mut java, &mut t2, &mut turns).await;
    eprintln!("tenure-1 dropped -> Curator leads: {took:?} (sampled)");
    let leader = second.leader(&election).await.expect("leader()");
    assert_eq!(leader.map(|l| l.id).as_deref(), Some("java-c"));

    java.close().await.expect("close the latch");
    let took = turn("tenure-2", &t1, &mut java, &mut t2, &mut turns).await;
    eprintln!("Curator closed -> tenure-2 leads: {took:?} (sampled)");
    assert_eq!(turns, ["tenure-1", "java-c", "tenure-2"]);
    let t2_token = t2.wait(HANDOVER).await.0.token();
    assert!(t2_token > t1_token, "{t2_token} vs {t1_token}");
    assert_eq!(java.count("leader"), 1, "{:?}", java.other_stdout());
    assert_eq!(java.count("notleader"), 1, "{:?}", java.other_stdout());

    java.quit().await.expect("quit the latch");
    first.close().await.expect("close the first session");
    second.close().await.expect("close the second session");
}

/// With `layout=curator` a priority and a handover are refused (`Unsupported`), and the
/// default layout refuses to join an election that holds a Curator latch (each would
/// elect its own leader), naming `layout=curator`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priorities_are_refused_with_curator_and_layouts_do_not_mix() {
    let election = election("layouts");
    let session = session().await;
    let high = Candidate::new("tenure-p")
        .expect("id")
        .with_priority(5)
        .expect("priority");
    let err = session
        .campaign(&election, &high)
        .await
        .expect_err("a priority with layout=curator");
    assert_eq!(err.kind(), tenure_core::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("priority 5"), "{err}");
    // The refusal says why: the layout, not a "not yet".
    assert!(err.to_string().contains("layout=curator"), "{err}");
    let err = session
        .observer()
        .handover(&election, None)
        .await
        .expect_err("a handover with layout=curator");
    assert_eq!(err.kind(), tenure_core::ErrorKind::Unsupported, "{err}");
    assert!(err.to_string().contains("layout=curator"), "{err}");

    let mut java = start_latch(&election, "java-l").await;
    java.wait_for_line(0, |l| l == "leader", HANDOVER)
        .await
        .expect("the latch leads an empty election");
    let url = format!(
        "zk://{}{CHROOT}?connect_timeout=5s&request_timeout=5s",
        connect_string()
    );
    let backend = ZooKeeperBackend::from_url(&url)
        .await
        .expect("tenure's ZooKeeper backend, default layout");
    let other = Session::open(Arc::new(backend), Timing::from_ttl(Duration::from_secs(4)))
        .await
        .expect("tenure session");
    let err = other
        .campaign(&election, &Candidate::new("tenure-q").expect("id"))
        .await
        .expect_err("the default layout on a Curator election");
    assert_eq!(err.kind(), tenure_core::ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("layout=curator"), "{err}");
    assert!(java.has_leadership().await.expect("status"));
    java.quit().await.expect("quit the latch");
    other.close().await.expect("close");
    session.close().await.expect("close");
}
