//! Contract clause 14 on `peer://` across nodes: priorities decide which
//! node stands for election, a higher priority on another node preempts the
//! holder, and a handover asked on any node reaches the holder's node and
//! the named waiter's node. Three bully nodes in this process over loopback:
//! bully alone would always pick the highest id, so each check puts the
//! preferred waiter on a lower id than its rivals.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::{election, session, three_sessions, within};
use tenure_core::{
    Candidate, ElectionName, ErrorKind, Leadership, LeadershipWatch, LossReason, Observer, Session,
};
use tenure_peer::{PeerAlgorithm, PeerBackend};
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn cand(id: &str, priority: i32) -> Candidate {
    Candidate::with_value(id, format!("value-of-{id}"))
        .and_then(|c| c.with_priority(priority))
        .expect("candidate")
}

fn observer(node: &PeerBackend) -> Observer {
    Observer::new(Arc::new(node.clone()), Duration::from_secs(2))
}

/// Campaigns for `c` in the background.
fn campaign_later(s: &Session, e: &ElectionName, c: Candidate) -> JoinHandle<Leadership> {
    let (s, e) = (s.clone(), e.clone());
    tokio::spawn(async move { s.campaign(&e, &c).await.expect("campaign") })
}

/// Long enough for a campaign to reach every node (candidacy and interest
/// announcements are one message each).
async fn let_queue() {
    tokio::time::sleep(Duration::from_millis(150)).await;
}

/// Campaigns for `c` in the background and lets the campaign reach every
/// node.
async fn queued(s: &Session, e: &ElectionName, c: Candidate) -> JoinHandle<Leadership> {
    let waiter = campaign_later(s, e, c);
    let_queue().await;
    waiter
}

/// `id` (priority 0) elected on `s` as a holder that opted out of
/// preemption.
async fn unpreemptible(s: &Session, e: &ElectionName, id: &str) -> Leadership {
    s.campaign(e, &cand(id, 0).never_preempted())
        .await
        .unwrap_or_else(|err| panic!("campaign {id}: {err}"))
}

/// Asserts that `earlier` ended before `later` was granted.
fn assert_before(earlier: &LeadershipWatch, later: &Leadership) {
    let lost = earlier.lost_at().expect("the first grant ended");
    assert!(
        lost <= later.granted_at(),
        "{} was granted before {}'s lost signal",
        later.candidate().id(),
        earlier.candidate().id()
    );
    assert!(later.token() > earlier.token());
}

/// How long a waiter may take to be granted once the seat is free for it.
const GRANT: Duration = Duration::from_secs(2);

/// Three bully nodes past their start, the election `name` and a session on
/// each node.
async fn bully_trio(name: &str) -> (Vec<PeerBackend>, ElectionName, (Session, Session, Session)) {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let sessions = three_sessions(&nodes).await;
    (nodes, election(name), sessions)
}

/// The waiter `next` granted within `limit` (`what` names it), after the
/// lost signal of `earlier`.
async fn granted_after(
    earlier: &LeadershipWatch,
    next: JoinHandle<Leadership>,
    limit: Duration,
    what: &str,
) -> Leadership {
    let granted = within(limit, what, next).await.expect(what);
    assert_before(earlier, &granted);
    granted
}

/// `holder` resigns and the waiter `next` is granted after it.
async fn resign_then(
    holder: Leadership,
    next: JoinHandle<Leadership>,
    limit: Duration,
    what: &str,
) -> Leadership {
    let earlier = holder.watch();
    holder.resign().await.expect("resign");
    granted_after(&earlier, next, limit, what).await
}

/// The waiter `next` granted after `holder`, which it preempted.
async fn preempts(
    holder: &Leadership,
    next: JoinHandle<Leadership>,
    limit: Duration,
    what: &str,
) -> Leadership {
    let granted = granted_after(&holder.watch(), next, limit, what).await;
    assert_eq!(
        holder.loss_reason(),
        Some(LossReason::Preempted),
        "{what}: the holder was not preempted"
    );
    granted
}

/// One preemption across nodes: `c` (priority 1) holds on node 3, `a`
/// (priority 5) joins on node 1. Returns the time from the join to `a`'s
/// grant.
async fn preempt_once(nodes: &[PeerBackend], name: &str) -> Duration {
    let e = election(name);
    let (s1, s3) = (session(&nodes[0]).await, session(&nodes[2]).await);
    let c = within(
        Duration::from_secs(3),
        "c elected",
        s3.campaign(&e, &cand("c", 1)),
    )
    .await
    .expect("campaign c");
    let t0 = Instant::now();
    let a = campaign_later(&s1, &e, cand("a", 5));
    let reason = within(Duration::from_secs(1), "c preempted", c.lost_wait()).await;
    assert_eq!(reason, LossReason::Preempted);
    let a = granted_after(&c.watch(), a, Duration::from_secs(1), "a granted").await;
    let gap = a.granted_at() - t0;
    a.resign().await.expect("resign");
    s1.close().await.expect("close");
    s3.close().await.expect("close");
    gap
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_priority_on_another_node_preempts_the_holder() {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let gap = preempt_once(&nodes, "priority/preempt").await;
    eprintln!("preemption across nodes: {gap:?}");
    assert!(gap < Duration::from_millis(500), "preemption took {gap:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_goes_to_the_newcomer_not_to_a_third_node_that_waited() {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    for run in 0..5 {
        let e = election(&format!("priority/third-{run}"));
        let (s1, s2, s3) = three_sessions(&nodes).await;
        let l = s2.campaign(&e, &cand("l", 1)).await.expect("campaign l");
        // Node 3 (the bully's favourite) waits with the holder's priority.
        let third = queued(&s3, &e, cand("y", 1)).await;
        assert!(l.is_leader(), "an equal priority preempted");
        let newcomer = campaign_later(&s1, &e, cand("x", 5));
        let x = preempts(&l, newcomer, GRANT, "x granted").await;
        assert!(
            !third.is_finished(),
            "run {run}: the third node took the seat"
        );
        let y = resign_then(x, third, GRANT, "y after x").await;
        y.resign().await.expect("resign");
        for s in [s1, s2, s3] {
            s.close().await.expect("close");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_and_lower_priorities_on_other_nodes_do_not_preempt() {
    let (nodes, e, (s1, s2, s3)) = bully_trio("priority/no-preempt").await;
    let a = s1.campaign(&e, &cand("a", 3)).await.expect("campaign a");
    let lower = campaign_later(&s3, &e, cand("c", 1));
    let equal = campaign_later(&s2, &e, cand("b", 3));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        a.is_leader(),
        "an equal or lower priority preempted the holder"
    );
    assert_eq!(a.loss_reason(), None);
    // try_campaign never queues, so it never preempts, whatever its priority.
    let s4 = session(&nodes[2]).await;
    let tried = s4.try_campaign(&e, &cand("d", 9)).await.expect("try");
    assert!(tried.is_none());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(a.is_leader(), "a try_campaign preempted the holder");
    // b (3, node 2) goes before c (1, node 3) although bully prefers node 3.
    let b = resign_then(a, equal, GRANT, "b next").await;
    assert!(!lower.is_finished(), "the lower priority was granted first");
    let c = resign_then(b, lower, GRANT, "c last").await;
    c.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_on_different_nodes_are_granted_by_priority() {
    let (nodes, e, (s1, s2, s3)) = bully_trio("priority/order").await;
    // The holder opted out: nobody preempts it.
    let x = unpreemptible(&s3, &e, "x").await;
    let low = queued(&session(&nodes[2]).await, &e, cand("z", 0)).await;
    let mid = queued(&s2, &e, cand("b", 2)).await;
    let high = queued(&s1, &e, cand("a", 7)).await;
    assert!(x.is_leader(), "a holder that opted out was preempted");
    let a = resign_then(x, high, GRANT, "a first").await;
    assert!(!mid.is_finished() && !low.is_finished());
    let b = resign_then(a, mid, GRANT, "b second").await;
    assert!(!low.is_finished());
    let z = resign_then(b, low, GRANT, "z last").await;
    z.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_asked_on_any_node_moves_the_seat_to_the_named_waiter() {
    let (nodes, e, (s1, s2, s3)) = bully_trio("priority/handover").await;
    let x = unpreemptible(&s3, &e, "x").await;
    let high = queued(&s2, &e, cand("b", 9)).await;
    let named = queued(&s1, &e, cand("a", 0)).await;
    // Asked on node 2, which neither holds the seat nor hosts `a`.
    let asker = observer(&nodes[1]);
    let err = asker
        .handover(&e, Some("nobody"))
        .await
        .expect_err("a handover to a waiter that is not there");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(x.is_leader());
    let t0 = Instant::now();
    let asked = asker.handover(&e, Some("a")).await.expect("handover");
    assert_eq!((asked.id.as_str(), asked.token), ("x", x.token()));
    let a = preempts(&x, named, GRANT, "handover to a").await;
    eprintln!("handover across nodes: {:?}", a.granted_at() - t0);
    assert!(!high.is_finished(), "the seat went to b, not to a");
    // b, which waited before a's grant, does not preempt a.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        a.is_leader(),
        "a waiter passed over by a handover preempted"
    );
    assert!(!high.is_finished());
    // Without a name: to the best waiter, b.
    let asked = observer(&nodes[0])
        .handover(&e, None)
        .await
        .expect("handover");
    assert_eq!(asked.id, "a");
    let b = preempts(&a, high, GRANT, "handover to the best").await;
    // Nobody waits now.
    let err = observer(&nodes[2])
        .handover(&e, None)
        .await
        .expect_err("a handover with nobody waiting");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(b.is_leader());
    b.resign().await.expect("resign");
    let err = observer(&nodes[2])
        .handover(&e, None)
        .await
        .expect_err("a handover with nobody leading");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_reaches_waiters_on_the_holders_node_and_from_it() {
    let (nodes, e, (s1, s2, s3)) = bully_trio("priority/handover-local").await;
    let x = unpreemptible(&s1, &e, "x").await;
    let high = queued(&s3, &e, cand("b", 5)).await;
    let local = queued(&session(&nodes[0]).await, &e, cand("a", 0)).await;
    // Asked on node 2 for a waiter on the holder's own node.
    observer(&nodes[1])
        .handover(&e, Some("a"))
        .await
        .expect("handover to a");
    let a = granted_after(&x.watch(), local, GRANT, "a granted").await;
    assert!(!high.is_finished(), "the seat went to b, not to a");
    // Asked on the holder's node for a waiter on node 2, b still waiting.
    let other = queued(&s2, &e, cand("c", -3)).await;
    observer(&nodes[0])
        .handover(&e, Some("c"))
        .await
        .expect("handover to c");
    let c = preempts(&a, other, GRANT, "c granted").await;
    assert!(!high.is_finished(), "the seat went to b, not to c");
    let b = resign_then(c, high, GRANT, "b after c").await;
    b.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_interest_of_a_crashed_node_fades() {
    let (nodes, e, (s1, s2, s3)) = bully_trio("priority/crash").await;
    let a = unpreemptible(&s1, &e, "a").await;
    let _gone = queued(&s3, &e, cand("c", 9)).await;
    let b = queued(&s2, &e, cand("b", 1)).await;
    // Node 3 (priority 9) crashes while it waits: b must not wait forever.
    nodes[2].shutdown();
    let t0 = Instant::now();
    let a_token = a.token();
    a.resign().await.expect("resign");
    let lease = support::fast_timing().lease;
    let b = within(lease * 4, "b after node 3's interest faded", b)
        .await
        .expect("b");
    eprintln!(
        "granted behind a crashed higher priority after {:?}",
        t0.elapsed()
    );
    assert!(b.token() > a_token);
    b.resign().await.expect("resign");
}

/// Median and 95th percentile of `samples`.
fn quantiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| {
        let rank = (samples.len() as f64 * q).ceil() as usize;
        samples[rank.clamp(1, samples.len()) - 1]
    };
    (at(0.5), at(0.95))
}

/// What `tenure bench` measures for a backend with priorities, on `peer://`
/// (which `tenure bench` cannot target): each run a holder of priority 0
/// leads on `holding` and a candidate of priority 1 joins on `joining`; the
/// time from the join to its grant. And the graceful handover between the
/// same two sessions (resign → the waiter's grant).
async fn bench_like(holding: &PeerBackend, joining: &PeerBackend, runs: usize, tag: &str) {
    let e = election(&format!("priority/bench-{}", tag.replace(' ', "-")));
    let (sh, sj) = (session(holding).await, session(joining).await);
    let mut preemption = Vec::new();
    for _ in 0..runs {
        let held = sh.campaign(&e, &cand("holder", 0)).await.expect("campaign");
        let t0 = Instant::now();
        let waiter = campaign_later(&sj, &e, cand("preferred", 1));
        let granted = granted_after(&held.watch(), waiter, GRANT, "preferred granted").await;
        preemption.push(granted.granted_at() - t0);
        drop(held);
        granted.resign().await.expect("resign");
    }
    let mut handover = Vec::new();
    let mut holder = sh.campaign(&e, &cand("a", 0)).await.expect("campaign");
    for run in 0..runs {
        let (next, id) = if run % 2 == 0 { (&sj, "b") } else { (&sh, "a") };
        let waiter = campaign_later(next, &e, cand(id, 0));
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        holder.resign().await.expect("resign");
        holder = within(Duration::from_secs(2), "waiter granted", waiter)
            .await
            .expect("waiter");
        handover.push(holder.granted_at() - t0);
    }
    holder.resign().await.expect("resign");
    let (p50, p95) = quantiles(preemption);
    let (h50, h95) = quantiles(handover);
    eprintln!(
        "{tag}, {runs} runs: preemption median {p50:?} p95 {p95:?}; graceful handover median {h50:?} p95 {h95:?}"
    );
    assert!(p50 < Duration::from_millis(500), "preemption took {p50:?}");
}

/// The preemption gap, measured: `TENURE_PEER_PREEMPT_RUNS` runs (default
/// 5) with both sessions on one node and with the newcomer on another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preemption_gap() {
    let runs: usize = std::env::var("TENURE_PEER_PREEMPT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    bench_like(&nodes[0], &nodes[0], runs, "one node").await;
    // The newcomer on a lower id than the holder: only its priority elects it.
    bench_like(&nodes[2], &nodes[0], runs, "across nodes").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_algorithm_follows_priorities_across_nodes() {
    let runs = PeerAlgorithm::ALL.map(|algorithm| async move {
        let nodes = support::cluster(3, algorithm).await;
        let e = election(&format!("priority/algo-{}", algorithm.name()));
        let (s1, s2, s3) = three_sessions(&nodes).await;
        let limit = Duration::from_secs(5);
        let x = within(limit, "x elected", unpreemptible(&s2, &e, "x")).await;
        let low = campaign_later(&s3, &e, cand("z", 0));
        let high = queued(&s1, &e, cand("a", 5)).await;
        let a = resign_then(x, high, limit, "a first").await;
        assert!(!low.is_finished(), "{algorithm:?}: z before a");
        // A higher priority joins on node 2: a is preempted.
        let top = campaign_later(&session(&nodes[1]).await, &e, cand("b", 9));
        let b = preempts(&a, top, limit, &format!("{algorithm:?}: b preempts")).await;
        assert!(!low.is_finished(), "{algorithm:?}: z before b");
        let z = resign_then(b, low, limit, "z last").await;
        z.resign().await.expect("resign");
        algorithm
    });
    for done in futures::future::join_all(runs).await {
        eprintln!("{done:?}: priorities kept");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_silent_leader_is_unavailable_not_refused() {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let e = election("priority/silent");
    let (s1, s3) = (session(&nodes[0]).await, session(&nodes[2]).await);
    let x = s3.campaign(&e, &cand("x", 0)).await.expect("campaign x");
    let _waiter = queued(&s1, &e, cand("a", 0)).await;
    // Node 2 follows node 3, which now hears nothing.
    nodes[2].set_isolated(true);
    let err = observer(&nodes[1])
        .handover(&e, Some("a"))
        .await
        .expect_err("a handover to a leader that did not answer");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("did not answer"), "{err}");
    nodes[2].set_isolated(false);
    drop(x);
}
