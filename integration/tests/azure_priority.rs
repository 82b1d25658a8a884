//! Contract clause 14 on Azure Blob Storage, beyond the shared suite: what polling and
//! sessions judged by their blob's etag add. A waiter that crashed does not hold the
//! queue up longer than its session's TTL; a holder cut off from the store keeps the
//! seat until its session is seen ended, although a higher priority asked for it; a
//! preemption is learnt within a poll; and what one poll costs in requests, by role.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tenure_azure::{AzureBackend, AzureConfig};
use tenure_core::testing::random_prefix;
use tenure_core::{Backend, Candidate, ElectionName, Leadership, LossReason, Session, Timing};
use tenure_integration::{AzuriteServer, TcpProxy};

const TTL: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(100);

fn config(endpoint: &str, container: &str) -> AzureConfig {
    AzureConfig::development(endpoint, container)
        .poll_interval(POLL)
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(Duration::from_secs(1))
}

async fn backend(endpoint: &str, container: &str) -> Arc<AzureBackend> {
    Arc::new(
        AzureBackend::connect(config(endpoint, container))
            .await
            .expect("connect"),
    )
}

/// TTL 15 s, renewed every second, valid 10 s after the last confirmed renewal.
fn timing() -> Timing {
    let mut t = Timing::from_ttl(TTL);
    t.renew_interval = Duration::from_secs(1);
    t.renew_deadline = Duration::from_secs(10);
    t
}

async fn session(backend: &Arc<AzureBackend>) -> Session {
    Session::open(backend.clone(), timing())
        .await
        .expect("session")
}

fn cand(id: &str, priority: i32) -> Candidate {
    Candidate::new(id)
        .and_then(|c| c.with_priority(priority))
        .expect("candidate")
}

fn spawn_campaign(
    s: &Session,
    election: &ElectionName,
    c: Candidate,
) -> tokio::task::JoinHandle<tenure_core::Result<Leadership>> {
    let (s, e) = (s.clone(), election.clone());
    tokio::spawn(async move { s.campaign(&e, &c).await })
}

async fn granted(
    waiter: tokio::task::JoinHandle<tenure_core::Result<Leadership>>,
    within: Duration,
    what: &str,
) -> Leadership {
    match tokio::time::timeout(within, waiter).await {
        Ok(Ok(Ok(l))) => l,
        Ok(Ok(Err(e))) => panic!("{what}: {e}"),
        Ok(Err(e)) => panic!("{what}: {e}"),
        Err(_) => panic!("{what}: not granted within {within:?}"),
    }
}

/// A waiter of the highest priority crashes (its session is abandoned: no more polls,
/// no more renewals). When the seat frees up, the release grants it, and the next
/// waiter is granted once the crashed session is seen ended: within about a TTL, not
/// never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_waiter_holds_the_queue_up_at_most_one_lease() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let b = backend(azurite.endpoint(), &container).await;
    let election = ElectionName::new("prio/crashed-waiter").unwrap();
    let (sa, sx, sy) = (session(&b).await, session(&b).await, session(&b).await);
    let a = sa
        .campaign(&election, &cand("a", 0).never_preempted())
        .await
        .expect("a");
    let x = spawn_campaign(&sx, &election, cand("x", 5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let y = spawn_campaign(&sy, &election, cand("y", 0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    sx.abandon();
    let crashed = Instant::now();
    let first = a.token();
    a.resign().await.expect("resign");
    let y = granted(y, TTL + Duration::from_secs(5), "y after x's session ended").await;
    let waited = crashed.elapsed();
    eprintln!("the next waiter was granted {waited:?} after the first one crashed");
    assert!(waited < TTL + Duration::from_secs(3), "{waited:?}");
    assert!(y.token() > first);
    let x = tokio::time::timeout(Duration::from_secs(1), x).await;
    assert!(
        matches!(x, Ok(Ok(Err(_)))),
        "the crashed waiter was granted"
    );
    y.resign().await.expect("resign");
    for s in [sa, sy] {
        s.close().await.expect("close");
    }
}

/// A holder whose link is black-holed cannot be told that a higher priority waits; the
/// seat stays its until its session is seen ended, so the waiter is granted only after
/// the holder's lost signal (at least a TTL minus a renew interval after the link went
/// dark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_holder_keeps_the_seat_until_its_lease_runs_out() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let proxy = TcpProxy::start(azurite.addr()).await.expect("proxy");
    let through_proxy = backend(&azurite.endpoint_at(proxy.addr()), &container).await;
    let direct = backend(azurite.endpoint(), &container).await;
    let election = ElectionName::new("prio/cut-off").unwrap();
    let sa = session(&through_proxy).await;
    let sb = session(&direct).await;
    let a = sa.campaign(&election, &cand("a", 0)).await.expect("a");
    proxy.blackhole().await.expect("blackhole");
    let dark = Instant::now();
    let b = spawn_campaign(&sb, &election, cand("b", 7));
    let b = granted(b, TTL * 2, "b after a's session ended").await;
    let waited = b.granted_at() - dark;
    eprintln!("granted {waited:?} after the holder's link went dark");
    let lost = a.lost_at().expect("a's lost signal fired");
    assert!(lost < b.granted_at(), "two holders");
    assert!(
        waited >= TTL - timing().renew_interval,
        "the seat was freed early: {waited:?}"
    );
    assert_ne!(a.loss_reason(), Some(LossReason::Preempted));
    assert!(b.token() > a.token());
    // The observers see b; a's view heals with its link.
    let info = direct
        .leader(&election)
        .await
        .expect("leader")
        .expect("held");
    assert_eq!((info.id.as_str(), info.token), ("b", b.token()));
    proxy.heal().await.expect("heal");
    b.resign().await.expect("resign");
    sb.close().await.expect("close");
    let _ = sa.close().await;
}

/// What a poll costs, by role: one holder that opted out of preemption and three
/// waiters, each on a backend of its own so that its requests are counted apart (all
/// of them: renewals every second included). Printed, not asserted: the holder reads
/// its election once per poll; each waiter reads the election and the session of the
/// record ahead of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_poll_costs_by_role() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let election = ElectionName::new("prio/cost").unwrap();
    let holder = backend(azurite.endpoint(), &container).await;
    let sa = session(&holder).await;
    let a = sa
        .campaign(&election, &cand("a", 0).never_preempted())
        .await
        .expect("a");
    let mut waiters = Vec::new();
    for (id, priority) in [("first", 5), ("second", 1), ("third", 0)] {
        let b = backend(azurite.endpoint(), &container).await;
        let s = session(&b).await;
        let task = spawn_campaign(&s, &election, cand(id, priority));
        waiters.push((b, s, task));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = waiters.iter().map(|(b, ..)| b.requests()).collect();
    let holder_before = holder.requests();
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = t0.elapsed();
    // Polls are 80-100 % of the interval apart: 90 % on average.
    let polls = window.as_secs_f64() / (POLL.as_secs_f64() * 0.9);
    let per_poll: Vec<f64> = waiters
        .iter()
        .zip(&before)
        .map(|((b, ..), n)| (b.requests() - n) as f64 / polls)
        .collect();
    let holder_per_poll = (holder.requests() - holder_before) as f64 / polls;
    eprintln!(
        "requests per poll ({polls:.1} polls in {window:?}, renewals included): holder {holder_per_poll:.2}, waiters {:.2}, {:.2}, {:.2}",
        per_poll[0], per_poll[1], per_poll[2]
    );
    assert!(a.is_leader());
    a.resign().await.expect("resign");
    for (_, s, task) in waiters {
        if let Ok(Ok(Ok(l))) = tokio::time::timeout(Duration::from_secs(5), task).await {
            let _ = l.resign().await;
        }
        let _ = s.close().await;
    }
    sa.close().await.expect("close");
}

/// A handover request is used up by the grant it asked for: after the target was
/// granted and resigned, it campaigns again, and the seat goes in priority order (to
/// the higher priority that was passed over), not to the target a second time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_request_is_used_up_by_the_grant() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let b = backend(azurite.endpoint(), &container).await;
    let election = ElectionName::new("prio/handover-used-up").unwrap();
    let (sa, sb, sc) = (session(&b).await, session(&b).await, session(&b).await);
    let a = sa
        .campaign(&election, &cand("a", 0).never_preempted())
        .await
        .expect("a");
    let high = spawn_campaign(&sb, &election, cand("b", 9));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let low = spawn_campaign(&sc, &election, cand("c", 0));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked = b.handover(&election, Some("c")).await.expect("handover");
    assert_eq!((asked.id.as_str(), asked.token), ("a", a.token()));
    let c = granted(low, Duration::from_secs(5), "c, the target").await;
    assert_eq!(a.loss_reason(), Some(LossReason::Preempted));
    assert!(!high.is_finished(), "b was granted before the target");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let c_token = c.token();
    c.resign().await.expect("resign");
    let again = spawn_campaign(&sc, &election, cand("c", 0));
    let b_leads = granted(high, Duration::from_secs(5), "b after the target").await;
    assert!(b_leads.token() > c_token);
    assert!(!again.is_finished(), "the used-up request granted c again");
    b_leads.resign().await.expect("resign");
    let c2 = granted(again, Duration::from_secs(5), "c after b").await;
    c2.resign().await.expect("resign");
    for s in [sa, sb, sc] {
        s.close().await.expect("close");
    }
}

/// TTL 15 s renewed every 3.75 s: a holder that learnt of a preemption only at its
/// next renewal would need up to 3.75 s.
fn slow_renewals() -> Timing {
    let mut t = Timing::from_ttl(TTL);
    t.renew_interval = Duration::from_millis(3750);
    t
}

/// A holder is told of a preemption in its record, which it reads once per poll
/// interval: the gap from the higher priority's campaign to its grant is a few poll
/// intervals, well below the renew interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemption_is_learnt_within_a_poll_not_a_renewal() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let b = backend(azurite.endpoint(), &container).await;
    let election = ElectionName::new("prio/notice-gap").unwrap();
    let mut gaps = Vec::new();
    for run in 0..3 {
        let sa = Session::open(b.clone(), slow_renewals())
            .await
            .expect("session");
        let sb = Session::open(b.clone(), slow_renewals())
            .await
            .expect("session");
        let a = sa.campaign(&election, &cand("a", 0)).await.expect("a");
        // Right after the grant, so the holder's next renewal is a renew interval away.
        let start = Instant::now();
        let high = spawn_campaign(&sb, &election, cand("b", 5));
        let high = granted(high, TTL * 2, "the higher priority").await;
        let gap = high.granted_at() - start;
        let lost = a.lost_at().expect("a's lost signal fired");
        assert!(lost <= high.granted_at(), "run {run}: two holders");
        assert_eq!(a.loss_reason(), Some(LossReason::Preempted), "run {run}");
        assert!(high.token() > a.token());
        eprintln!("run {run}: preemption gap {gap:?}");
        gaps.push(gap);
        high.resign().await.expect("resign");
        sa.close().await.expect("close");
        sb.close().await.expect("close");
    }
    eprintln!("preemption gaps with renewals every 3.75 s and polls every {POLL:?}: {gaps:?}");
    for gap in &gaps {
        assert!(
            *gap < Duration::from_secs(2),
            "a preemption took {gap:?}: the holder did not learn it at its poll"
        );
    }
}
