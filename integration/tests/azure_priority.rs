//! Contract clause 14 on Azure Blob leases, beyond the shared suite: what the queue
//! blobs and the lease break add. A waiter that crashed does not hold the queue up
//! longer than its entry's lease; a holder cut off from the store keeps the seat until
//! its lease runs out even though a higher priority broke it (the break frees nothing
//! early); and what one poll costs in requests, by role.

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

/// Lease 15 s, renewed every second, valid 10 s after the last confirmed renewal.
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
/// no more renewals of its queue entry). When the seat frees up, the next waiter is
/// granted once that entry's lease has lapsed: within a lease duration, not never.
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
    let y = granted(y, TTL + Duration::from_secs(5), "y after x's entry lapsed").await;
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
/// waiter's break (no break period) leaves the lease in place until it runs out, so
/// the waiter is granted only after the holder's lost signal and after the lease's
/// end (at least a lease duration minus a renew interval after the link went dark).
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
    let b = granted(b, TTL * 2, "b after a's lease ran out").await;
    let waited = b.granted_at() - dark;
    eprintln!("granted {waited:?} after the holder's link went dark");
    let lost = a.lost_at().expect("a's lost signal fired");
    assert!(lost < b.granted_at(), "two holders");
    assert!(
        waited >= TTL - timing().renew_interval,
        "the break freed the seat early: {waited:?}"
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
/// waiters, each on a backend of its own so that its requests are counted apart.
/// Over about 2 s: the holder sends no election requests (its renewals are counted
/// apart), the first waiter two per poll (the queue listing and a read of the seat),
/// the others one (the listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poll_costs_one_listing_and_the_first_waiter_a_read() {
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
    let before: Vec<u64> = waiters
        .iter()
        .map(|(b, ..)| b.election_requests().unwrap_or(0))
        .collect();
    let holder_before = holder.election_requests().unwrap_or(0);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = t0.elapsed();
    let per_poll: Vec<f64> = waiters
        .iter()
        .zip(&before)
        .map(|((b, ..), n)| {
            let sent = b.election_requests().unwrap_or(0) - n;
            // Polls are 80-100 % of the interval apart: 90 % on average.
            sent as f64 / (window.as_secs_f64() / (POLL.as_secs_f64() * 0.9))
        })
        .collect();
    let holder_sent = holder.election_requests().unwrap_or(0) - holder_before;
    eprintln!(
        "requests per poll: first waiter {:.2}, others {:.2} and {:.2}; holder {} election requests in {window:?}",
        per_poll[0], per_poll[1], per_poll[2], holder_sent
    );
    assert_eq!(holder_sent, 0);
    // At most one listing per poll each (fewer polls fit the window when requests are
    // slow), and the first waiter twice what the others send.
    for p in &per_poll[1..] {
        assert!(*p > 0.3 && *p <= 1.2, "{per_poll:?}");
        let ratio = per_poll[0] / p;
        assert!((1.5..=2.5).contains(&ratio), "{per_poll:?}");
    }
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

/// Lease 15 s renewed every 3.75 s (the defaults): a holder that learnt of a
/// preemption only at its next renewal would need up to 3.75 s.
fn slow_renewals() -> Timing {
    let mut t = Timing::from_ttl(TTL);
    t.renew_interval = Duration::from_millis(3750);
    t
}

/// A holder is told of a preemption by a notice in its session's prefix, which the
/// session lists once per poll interval: the gap from the higher priority's campaign
/// to its grant is a few poll intervals, well below the renew interval (the old
/// bound, which every run right after a grant would have come close to).
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
        // The notice was read and deleted.
        let holder = sa.id();
        let mut left = b.notices(&holder).await.expect("notices");
        for _ in 0..20 {
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(POLL).await;
            left = b.notices(&holder).await.expect("notices");
        }
        assert!(left.is_empty(), "run {run}: notices left: {left:?}");
        high.resign().await.expect("resign");
        sa.close().await.expect("close");
        sb.close().await.expect("close");
    }
    eprintln!("preemption gaps with renewals every 3.75 s and polls every {POLL:?}: {gaps:?}");
    for gap in &gaps {
        assert!(
            *gap < Duration::from_secs(2),
            "a preemption took {gap:?}: the holder learnt it at its renewal, not by a notice"
        );
    }
}

/// A notice names the grant it is for: one left for an older token of an election
/// the session holds again does not end the newer grant, and is deleted; one for an
/// election it does not hold is deleted too; closing the session deletes its notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notice_for_an_older_token_does_not_end_a_newer_grant() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let b = backend(azurite.endpoint(), &container).await;
    let election = ElectionName::new("prio/old-notice").unwrap();
    let other = ElectionName::new("prio/old-notice-other").unwrap();
    let sa = Session::open(b.clone(), slow_renewals())
        .await
        .expect("session");
    let first = sa.campaign(&election, &cand("a", 0)).await.expect("a");
    let old = first.token();
    first.resign().await.expect("resign");
    let second = sa
        .campaign(&election, &cand("a", 0))
        .await
        .expect("a again");
    assert!(second.token() > old);
    let holder = sa.id();
    b.leave_notice(&holder, &election, old.0)
        .await
        .expect("notice");
    b.leave_notice(&holder, &other, second.token().0)
        .await
        .expect("notice");
    // Ten polls and more.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        second.is_leader(),
        "a notice for an older grant ended the newer one"
    );
    assert_eq!(second.loss_reason(), None);
    let left = b.notices(&holder).await.expect("notices");
    assert!(left.is_empty(), "stale notices were not deleted: {left:?}");
    // The session keeps the seat through a renewal too.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(second.is_leader());
    // Left just before closing: the close deletes it (if the poll did not first).
    b.leave_notice(&holder, &other, 1).await.expect("notice");
    second.resign().await.expect("resign");
    sa.close().await.expect("close");
    let left = b.notices(&holder).await.expect("notices");
    assert!(left.is_empty(), "notices left after close: {left:?}");
}

/// The notice poll costs a session one listing per poll interval however many seats
/// it holds, counted with its renewals (no election requests), and nothing while it
/// holds none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notice_poll_costs_one_listing_per_poll_per_session() {
    let azurite = AzuriteServer::start().await.expect("azurite");
    let container = random_prefix().to_ascii_lowercase();
    let b = backend(azurite.endpoint(), &container).await;
    let s = Session::open(b.clone(), slow_renewals())
        .await
        .expect("session");
    // Holding nothing: no requests at all.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_before = b.requests();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(b.requests() - idle_before, 0, "an idle session polled");
    const SEATS: usize = 3;
    let mut held = Vec::new();
    for i in 0..SEATS {
        let e = ElectionName::new(format!("prio/cost-notices/{i}")).unwrap();
        held.push(s.campaign(&e, &cand("a", 0)).await.expect("seat"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (all0, el0) = (b.requests(), b.election_requests().unwrap_or(0));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let window = t0.elapsed();
    let (all1, el1) = (b.requests(), b.election_requests().unwrap_or(0));
    let polls = window.as_secs_f64() / (POLL.as_secs_f64() * 0.9);
    let upkeep = (all1 - all0) - (el1 - el0);
    eprintln!(
        "{SEATS} seats held: {upkeep} upkeep requests (listings and at most one round of renewals) in {window:?}, {polls:.1} polls; {} election requests",
        el1 - el0
    );
    assert_eq!(el1 - el0, 0);
    // At most one round of renewals (one per seat) falls into the window.
    let listings_max = upkeep as f64;
    let listings_min = upkeep.saturating_sub(SEATS as u64) as f64;
    assert!(listings_min <= polls * 1.2, "{upkeep} in {polls:.1} polls");
    assert!(listings_max >= polls * 0.3, "{upkeep} in {polls:.1} polls");
    for l in held {
        l.resign().await.expect("resign");
    }
    s.close().await.expect("close");
}
