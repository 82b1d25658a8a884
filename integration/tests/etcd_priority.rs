//! Clause 14 on a real etcd beyond the shared checks: paths that `check_priority` may
//! or may not take, made certain here (written for the seat layout; the engine keeps
//! the same behaviour over the primitives). A handover to a waiter
//! deep in the queue (nobody wakes it on the release, so the first in line hands the
//! seat over on its lease), and a handover whose target left before the release (the
//! next grant goes in order and uses the request up).

use std::time::Duration;

use tenure_core::testing::Env;
use tenure_core::{Candidate, LossReason, Session};
use tenure_integration::EtcdServer;

tenure_integration::shared_server!(EtcdServer, "etcd");

/// A bound far below the TTL (2 s): met only by notification, not by an expiry.
const PROMPT: Duration = Duration::from_secs(1);
/// How long a waiter must keep waiting to count as not granted.
const QUIET: Duration = Duration::from_millis(300);

fn url(hosts: &str) -> String {
    let hosts = hosts.trim_start_matches("http://");
    format!("etcd://{hosts}?prefix=tenure-priority&connect_timeout_ms=1000&request_timeout_ms=1000")
}

async fn env() -> Env {
    let (endpoint, server) = shared_server();
    tenure_integration::etcd_env(&endpoint, server, url).await
}

fn cand(id: &str, priority: i32) -> Candidate {
    Candidate::new(id)
        .expect("candidate")
        .with_priority(priority)
        .expect("priority")
}

/// `s` campaigns for `election` as `c` in a task; the task ends with the grant.
fn waiter(
    s: &Session,
    election: &tenure_core::ElectionName,
    c: Candidate,
) -> tokio::task::JoinHandle<tenure_core::Leadership> {
    let (s, e) = (s.clone(), election.clone());
    tokio::spawn(async move { s.campaign(&e, &c).await.expect("campaign") })
}

async fn settle() {
    tokio::time::sleep(QUIET).await;
}

/// `N` sessions of `env`.
async fn sessions<const N: usize>(env: &Env) -> [Session; N] {
    let mut sessions = Vec::with_capacity(N);
    for _ in 0..N {
        sessions.push(env.session().await);
    }
    sessions.try_into().unwrap_or_else(|_| unreachable!())
}

/// `s` campaigns for `election` as `c`, a holder that opted out of preemption.
async fn hold(
    s: &Session,
    election: &tenure_core::ElectionName,
    c: Candidate,
) -> tenure_core::Leadership {
    s.campaign(election, &c.never_preempted())
        .await
        .expect("holder")
}

/// A [`waiter`] that has had time to queue.
async fn queued(
    s: &Session,
    election: &tenure_core::ElectionName,
    c: Candidate,
) -> tokio::task::JoinHandle<tenure_core::Leadership> {
    let task = waiter(s, election, c);
    settle().await;
    task
}

/// The grant `task` ends with, within `bound`.
async fn granted(
    task: tokio::task::JoinHandle<tenure_core::Leadership>,
    bound: Duration,
    what: &str,
) -> tenure_core::Leadership {
    tokio::time::timeout(bound, task)
        .await
        .unwrap_or_else(|_| panic!("{what} not granted in time"))
        .expect(what)
}

/// `holder` resigns and the waiter `next` is granted within [`PROMPT`].
async fn resign_to(
    holder: tenure_core::Leadership,
    next: tokio::task::JoinHandle<tenure_core::Leadership>,
    what: &str,
) -> tenure_core::Leadership {
    holder.resign().await.expect("resign");
    granted(next, PROMPT, what).await
}

/// The holder of `election`, seen from `s`, is asked to hand over `to` a waiter.
async fn hand_over(
    s: &Session,
    election: &tenure_core::ElectionName,
    to: Option<&str>,
) -> tenure_core::LeaderInfo {
    s.observer().handover(election, to).await.expect("handover")
}

/// Close every session, each successfully.
async fn close_all<const N: usize>(sessions: [Session; N]) {
    for s in sessions {
        s.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_reaches_a_waiter_deep_in_the_queue() {
    let env = env().await;
    let election = env.election("deep-handover");
    let sessions = sessions::<4>(&env).await;
    let [sa, sb, sc, sd] = &sessions;
    let a = hold(sa, &election, cand("a", 0)).await;
    // Order: b (9), then c and d (0, in arrival order); d waits on c, not on the seat.
    let b = queued(sb, &election, cand("b", 9)).await;
    let c = queued(sc, &election, cand("c", 0)).await;
    let d = queued(sd, &election, cand("d", 0)).await;
    assert!(a.is_leader(), "a holder that opted out was preempted");
    let asked = hand_over(sa, &election, Some("d")).await;
    assert_eq!((asked.id.as_str(), asked.token), ("a", a.token()));
    let d = granted(d, PROMPT, "d (by notification)").await;
    assert_eq!(a.loss_reason(), Some(LossReason::Preempted));
    assert!(d.token() > a.token());
    assert!(a.lost_at().expect("lost") <= d.granted_at(), "overlap");
    settle().await;
    assert!(
        !b.is_finished() && !c.is_finished(),
        "the seat went to d only"
    );
    let leader = sa
        .leader(&election)
        .await
        .expect("leader")
        .expect("d leads");
    assert_eq!((leader.id.as_str(), leader.token), ("d", d.token()));
    // The request is used up: after d, the queue order again (b, then c).
    let d_token = d.token();
    let b = resign_to(d, b, "b").await;
    assert!(b.token() > d_token);
    assert!(!c.is_finished());
    let c = resign_to(b, c, "c").await;
    c.resign().await.expect("resign");
    close_all(sessions).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_whose_target_left_goes_in_order_and_is_used_up() {
    let env = env().await;
    let election = env.election("gone-handover");
    let sessions = sessions::<3>(&env).await;
    let [sa, sb, sc] = &sessions;
    let a = hold(sa, &election, cand("a", 0)).await;
    let b = queued(sb, &election, cand("b", 0)).await;
    let c = queued(sc, &election, cand("c", 0)).await;
    hand_over(sa, &election, Some("c")).await;
    // The holder is told; before its release lands c may already be gone, or not:
    // close c's session either way and see the seat go to b.
    c.abort();
    sc.close().await.expect("close c");
    let b = granted(b, PROMPT * 3, "b").await;
    assert_eq!(a.loss_reason(), Some(LossReason::Preempted));
    assert!(b.token() > a.token());
    // Used up: a newcomer of the same priority queues behind b and b keeps the seat.
    let late = queued(sa, &election, cand("late", 0)).await;
    assert!(b.is_leader() && !late.is_finished());
    let late = resign_to(b, late, "late").await;
    late.resign().await.expect("resign");
    for s in sessions {
        let _ = s.close().await;
    }
}

/// A handover to the best waiter (`None`) moves a holder that opted out, and the
/// best waiter by priority is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_the_best_waiter_follows_the_priorities() {
    let env = env().await;
    let election = env.election("best-handover");
    let sessions = sessions::<3>(&env).await;
    let [sa, sb, sc] = &sessions;
    let a = hold(sa, &election, cand("a", 7)).await;
    let low = queued(sb, &election, cand("low", 1)).await;
    let high = queued(sc, &election, cand("high", 3)).await;
    assert!(a.is_leader(), "lower priorities preempted the holder");
    hand_over(sa, &election, None).await;
    let high = granted(high, PROMPT, "high").await;
    assert_eq!(a.loss_reason(), Some(LossReason::Preempted));
    assert!(!low.is_finished());
    let low = resign_to(high, low, "low").await;
    low.resign().await.expect("resign");
    close_all(sessions).await;
}

/// A campaign the core asks for again without withdrawing it (as after a broken watch)
/// keeps its queue key, and so its place: it is granted before a waiter that queued
/// after its first attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_asked_again_keeps_its_place() {
    use tenure_core::backend::SessionEvents;
    use tenure_core::Backend;
    let (endpoint, _server) = shared_server();
    let b = tenure_etcd::EtcdBackend::from_url(&url(&endpoint))
        .await
        .expect("backend");
    let election =
        tenure_core::ElectionName::new(format!("kept-place-{}", tenure_integration::run_prefix()))
            .expect("name");
    let open = || async {
        let (events, rx) = SessionEvents::channel();
        let s = b.open_session(Duration::from_secs(10), events).await;
        (s.expect("open"), rx)
    };
    let ((holder, _h), (first, _f), (second, _s)) = (open().await, open().await, open().await);
    let token = holder
        .campaign(&election, &cand("holder", 0))
        .await
        .expect("holder");
    // The first waiter's campaign is dropped while it waits, without a resign.
    let again = tokio::time::timeout(QUIET, first.campaign(&election, &cand("first", 0))).await;
    assert!(again.is_err(), "granted while the seat was held");
    let later = {
        let (s, e) = (second.clone(), election.clone());
        tokio::spawn(async move { s.campaign(&e, &cand("second", 0)).await })
    };
    settle().await;
    let retried = {
        let (s, e) = (first.clone(), election.clone());
        tokio::spawn(async move { s.campaign(&e, &cand("first", 0)).await })
    };
    settle().await;
    holder.resign(&election, Some(token)).await.expect("resign");
    let granted = tokio::time::timeout(PROMPT, retried)
        .await
        .expect("the retried campaign granted first")
        .expect("task")
        .expect("campaign");
    assert!(granted > token);
    assert!(!later.is_finished(), "the later waiter went first");
    first
        .resign(&election, Some(granted))
        .await
        .expect("resign");
    tokio::time::timeout(PROMPT, later)
        .await
        .expect("second granted")
        .expect("task")
        .expect("campaign");
    for s in [holder, first, second] {
        s.close().await.expect("close");
    }
}
