//! In-memory backend behaviour on a paused tokio clock: exact timings of expiry,
//! stalls and crashes, without waiting in real time.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tenure_core::{
    Backend, Candidate, ElectionName, ErrorKind, Leadership, LossReason, MemoryBackend, Session,
    StepDownReason, Timing,
};
use tokio::time::Instant;

fn timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(10));
    t.renew_interval = Duration::from_secs(2);
    t.renew_deadline = Duration::from_secs(6);
    t
}

fn name(s: &str) -> ElectionName {
    ElectionName::new(s).unwrap()
}

fn cand(s: &str) -> Candidate {
    Candidate::new(s).unwrap()
}

/// A session on `mem` with the test timing.
async fn session(mem: &MemoryBackend) -> Session {
    Session::open(Arc::new(mem.clone()), timing())
        .await
        .unwrap()
}

/// A new store, a session on it, and candidate "a" leading `election` there.
async fn leading(election: &str) -> (MemoryBackend, Session, ElectionName, Leadership) {
    let mem = MemoryBackend::new();
    let s = session(&mem).await;
    let e = name(election);
    let l = s.campaign(&e, &cand("a")).await.unwrap();
    (mem, s, e, l)
}

#[tokio::test(start_paused = true)]
async fn crashed_holder_is_replaced_one_ttl_after_its_last_renewal() {
    let mem = MemoryBackend::new();
    let (a, b) = (session(&mem).await, session(&mem).await);
    let e = name("crash");
    let la = a.campaign(&e, &cand("a")).await.unwrap();
    // Let a few renewals happen, then crash right after one.
    tokio::time::sleep(Duration::from_millis(4_100)).await;
    let last_renewal = Instant::now() - Duration::from_millis(100);
    assert!(mem.crash_session(&a.id()));
    let waiter = tokio::spawn(async move { b.campaign(&name("crash"), &cand("b")).await });
    let lb = waiter.await.unwrap().unwrap();
    let took = lb.granted_at() - last_renewal;
    // The store frees the seat exactly one TTL after the last renewal it received.
    assert_eq!(took, Duration::from_secs(10), "took {took:?}");
    // The crashed holder's signal fired at its deadline: last renewal + renew deadline.
    assert_eq!(la.loss_reason(), Some(LossReason::DeadlineExceeded));
    assert_eq!(la.lost_at(), Some(last_renewal + Duration::from_secs(6)));
    assert!(la.lost_at().unwrap() < lb.granted_at());
    assert_eq!(lb.token().get(), la.token().get() + 1);
}

#[tokio::test(start_paused = true)]
async fn a_stall_shorter_than_the_deadline_keeps_leadership() {
    let (mem, s, _, l) = leading("stall").await;
    assert!(mem.stall_session(&s.id()));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(l.is_leader());
    assert!(mem.unstall_session(&s.id()));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(l.is_leader(), "{:?}", l.loss_reason());
}

#[tokio::test(start_paused = true)]
async fn a_long_stall_loses_at_the_deadline_and_the_session_recovers() {
    let (mem, s, e, l) = leading("long-stall").await;
    let stalled_at = Instant::now();
    assert!(mem.stall_session(&s.id()));
    let reason = l.lost_wait().await;
    assert_eq!(reason, LossReason::DeadlineExceeded);
    // Deadline: last confirmed renewal (at open) + 6 s.
    assert!(l.lost_at().unwrap() <= stalled_at + Duration::from_secs(6));
    // The store expires the session after the TTL; the core re-opens a new one once
    // requests get through again.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(mem.session_ids().is_empty());
    let gen = s.generation();
    mem.unstall_session(&s.id());
    let l2 = s.campaign(&e, &cand("a")).await.unwrap();
    assert!(s.generation() > gen);
    assert!(l2.token() > l.token());
    assert!(!l.is_leader());
}

#[tokio::test(start_paused = true)]
async fn expiry_hook_fires_session_expired_and_campaigns_resume() {
    let (mem, s, e, l) = leading("expire").await;
    assert!(mem.expire_session(&s.id()));
    assert_eq!(l.lost_wait().await, LossReason::SessionExpired);
    let l2 = s.campaign(&e, &cand("a")).await.unwrap();
    assert_eq!(s.generation(), 1);
    assert!(l2.is_leader());
}

#[tokio::test(start_paused = true)]
async fn closed_session_refuses_campaigns_and_frees_seats() {
    let mem = Arc::new(MemoryBackend::new());
    let s = Session::open(mem.clone(), timing()).await.unwrap();
    let e = name("close");
    let l = s.campaign(&e, &cand("a")).await.unwrap();
    s.close().await.unwrap();
    assert_eq!(l.loss_reason(), Some(LossReason::SessionClosed));
    let err = s.campaign(&e, &cand("a")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Closed);
    assert_eq!(s.leader(&e).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_campaign_withdraws_the_candidacy() {
    let mem = Arc::new(MemoryBackend::new());
    let (a, b, c) = (
        Session::open(mem.clone(), timing()).await.unwrap(),
        Session::open(mem.clone(), timing()).await.unwrap(),
        Session::open(mem.clone(), timing()).await.unwrap(),
    );
    let e = name("withdraw");
    let la = a.campaign(&e, &cand("a")).await.unwrap();
    // b queues, then gives up.
    let r = tokio::time::timeout(Duration::from_millis(100), b.campaign(&e, &cand("b"))).await;
    assert!(r.is_err());
    let waiter = {
        let e = e.clone();
        tokio::spawn(async move { c.campaign(&e, &cand("c")).await.map(|l| (l, c)) })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    la.resign().await.unwrap();
    let (lc, _c) = waiter.await.unwrap().unwrap();
    // c, not the departed b, got the seat.
    assert_eq!(lc.candidate().id(), "c");
    assert_eq!(b.leader(&e).await.unwrap().unwrap().id, "c");
}

#[tokio::test(start_paused = true)]
async fn observers_see_each_change_in_order() {
    let mem = Arc::new(MemoryBackend::new());
    let s = Session::open(mem.clone(), timing()).await.unwrap();
    let e = name("observe");
    let mut stream = s.observe(&e).await.unwrap();
    assert_eq!(stream.next().await.unwrap().unwrap(), None);
    let l = s.campaign(&e, &cand("a")).await.unwrap();
    let seen = stream.next().await.unwrap().unwrap().unwrap();
    assert_eq!((seen.id.as_str(), seen.token), ("a", l.token()));
    l.resign().await.unwrap();
    assert_eq!(stream.next().await.unwrap().unwrap(), None);
}

/// A holder that was paused past its deadline and then hears of the loss by a store
/// notification still dates its loss to the deadline: its grant was never valid later.
#[tokio::test(flavor = "current_thread")]
async fn a_loss_learned_late_is_dated_to_the_deadline() {
    let mem = MemoryBackend::new();
    let mut t = Timing::from_ttl(Duration::from_millis(600));
    t.renew_interval = Duration::from_millis(100);
    t.renew_deadline = Duration::from_millis(300);
    let s = Session::open(Arc::new(mem.clone()), t).await.unwrap();
    let l = s.campaign(&name("late"), &cand("a")).await.unwrap();
    let deadline = l.deadline();
    // A pause of the whole thread: no renewal, no timer.
    std::thread::sleep(Duration::from_millis(400));
    // The store's notice arrives first when the thread resumes.
    assert!(mem.expire_session(&s.id()));
    l.lost_wait().await;
    assert_eq!(l.lost_at(), Some(deadline));
}

/// The error of a renewal of a session of `mem` that the store expired.
async fn renewal_after_expiry(mem: MemoryBackend) -> tenure_core::Error {
    use tenure_core::backend::SessionEvents;
    use tenure_core::Backend;
    let (events, _rx) = SessionEvents::channel();
    let s = mem
        .open_session(Duration::from_secs(10), events)
        .await
        .unwrap();
    assert!(mem.expire_session(s.id()));
    s.keep_alive().await.unwrap_err()
}

#[tokio::test(start_paused = true)]
async fn errors_name_the_store_as_their_endpoint() {
    let err = renewal_after_expiry(MemoryBackend::named("errors-endpoint")).await;
    assert_eq!(err.kind(), ErrorKind::SessionExpired);
    assert_eq!(err.endpoint(), Some("mem://errors-endpoint"));
    assert_eq!(
        err.to_string(),
        "session_expired: the session has expired [mem at mem://errors-endpoint]"
    );
}

#[tokio::test(start_paused = true)]
async fn a_private_store_names_no_endpoint() {
    let err = renewal_after_expiry(MemoryBackend::new()).await;
    assert_eq!(err.endpoint(), None);
    assert_eq!(
        err.to_string(),
        "session_expired: the session has expired [mem]"
    );
}

/// `fut`, or a panic after a minute of (virtual) time: a feed that never reports must
/// fail the test, not hang it.
async fn within_a_minute<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .expect("nothing from the loss feed within a minute")
}

async fn next_loss(losses: &mut tenure_core::Losses) -> tenure_core::Loss {
    within_a_minute(losses.next())
        .await
        .expect("the loss feed ended early")
}

/// `Session::losses` reports every grant's end once, with its reason: a resign, the
/// deadline of a stalled session (every grant at once, then released in the store in
/// one batch when the session renews again), and the close; then it ends.
#[tokio::test(start_paused = true)]
async fn losses_report_every_grant_once_with_its_reason() {
    let mem = MemoryBackend::new();
    let s = session(&mem).await;
    let mut losses = s.losses();
    let elections: Vec<ElectionName> = (0..4).map(|i| name(&format!("loss/{i}"))).collect();
    let mut held = Vec::new();
    for e in &elections {
        held.push(s.campaign(e, &cand("a")).await.unwrap());
    }
    let tokens: Vec<_> = held.iter().map(Leadership::token).collect();
    let first = held.remove(0);
    first.resign().await.unwrap();
    let loss = next_loss(&mut losses).await;
    assert_eq!(
        (&loss.election, loss.token, &loss.reason),
        (&elections[0], tokens[0], &LossReason::Resigned)
    );

    // Stalled past the deadline: the other three end at once.
    assert!(mem.stall_session(&s.id()));
    tokio::time::sleep(timing().renew_deadline + Duration::from_millis(100)).await;
    let mut ended = Vec::new();
    for _ in 0..3 {
        let loss = next_loss(&mut losses).await;
        assert_eq!(loss.reason, LossReason::DeadlineExceeded);
        ended.push((loss.election, loss.token));
    }
    ended.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    let expected: Vec<_> = elections[1..]
        .iter()
        .cloned()
        .zip(tokens[1..].iter().copied())
        .collect();
    assert_eq!(ended, expected);
    assert!(held.iter().all(|l| !l.is_leader()));
    // Once the session gets through again, the seats are released in the store.
    assert!(mem.unstall_session(&s.id()));
    let other = session(&mem).await;
    for e in &elections[1..] {
        let l = tokio::time::timeout(Duration::from_secs(5), other.campaign(e, &cand("b")))
            .await
            .expect("a lost seat was not released")
            .unwrap();
        l.resign().await.unwrap();
    }

    // A grant that is held at the close ends with it; then the receiver ends.
    let last = s.campaign(&name("loss/last"), &cand("a")).await.unwrap();
    s.close().await.unwrap();
    let loss = next_loss(&mut losses).await;
    assert_eq!(
        (loss.token, loss.reason),
        (last.token(), LossReason::SessionClosed)
    );
    assert_eq!(within_a_minute(losses.next()).await, None);
    assert_eq!(within_a_minute(s.losses().next()).await, None);
    drop(held);
}

fn ranked(id: &str, priority: i32) -> Candidate {
    cand(id).with_priority(priority).unwrap()
}

/// Clause 14: from the join of a higher-priority candidate to its grant, no timer
/// runs (no TTL, no renew interval, no poll): the holder hears of the preemption by
/// one notification and is asked to step down; its work had already stopped (its work
/// guard is gone), so its lost signal fires (`Preempted`), it releases the seat, and
/// the store wakes the preferred candidate. Four requests of the engine over the
/// in-memory store: the join's write that queues it and marks the holder told (decided
/// on the election as the backend last saw it, the holder's grant, so it commits at
/// once), its wait; the release that
/// grants the waiter (decided on the election the store pushed to the holder's
/// follower, so it commits at once); the waiter's read. (The in-memory store before
/// the engine counted four store messages: join, notification, release, wake-up.)
#[tokio::test(start_paused = true)]
async fn a_higher_priority_is_granted_one_notification_after_it_joins() {
    let mem = MemoryBackend::new();
    let (a, b) = (session(&mem).await, session(&mem).await);
    let e = name("preempt");
    let la = a.campaign(&e, &ranked("a", 0)).await.unwrap();
    drop(la.work_guard());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = mem.election_requests().unwrap();
    let joined = Instant::now();
    let lb = b.campaign(&e, &ranked("b", 5)).await.unwrap();
    let gap = lb.granted_at() - joined;
    assert_eq!(gap, Duration::ZERO, "the grant waited for a timer");
    assert_eq!(la.loss_reason(), Some(LossReason::Preempted));
    assert_eq!(la.step_down_reason(), Some(StepDownReason::Preempted));
    assert!(la.lost_at().unwrap() <= lb.granted_at());
    assert_eq!(lb.token().get(), la.token().get() + 1);
    assert_eq!(mem.election_requests().unwrap() - before, 4);
    // The preempted holder's session goes on: it may campaign again and waits.
    let again = tokio::spawn(async move { a.campaign(&name("preempt"), &ranked("a", 0)).await });
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(!again.is_finished() && lb.is_leader());
    lb.resign().await.unwrap();
    assert!(again.await.unwrap().unwrap().is_leader());
}

/// Clause 15 under paused time: a preempted holder whose work has not acknowledged
/// keeps the seat (renewed past several TTLs' worth of renewals) until it resigns, and
/// the preferred candidate is granted at that resign, not before; one that never
/// acknowledges loses the seat at the step-down grace (10 s by default).
#[tokio::test(start_paused = true)]
async fn a_preempted_holder_keeps_the_seat_until_its_work_stops() {
    let mem = MemoryBackend::new();
    let (a, b) = (session(&mem).await, session(&mem).await);
    let e = name("drain");
    let la = a.campaign(&e, &ranked("a", 0)).await.unwrap();
    let _stop = la.stepping_down();
    let high = tokio::spawn(async move { b.campaign(&name("drain"), &ranked("b", 5)).await });
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(la.step_down_reason(), Some(StepDownReason::Preempted));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(la.is_leader() && !high.is_finished());
    let w = la.watch();
    let resigned = Instant::now();
    la.resign().await.unwrap();
    let lb = high.await.unwrap().unwrap();
    assert_eq!(w.loss_reason(), Some(LossReason::Resigned));
    assert!(lb.granted_at() >= resigned);

    // A holder that never asked for its stop signal cannot hear a step-down: it is
    // released at the ask (its lost signal fires then), as before clause 15.
    let deaf = {
        let (x, y) = (session(&mem).await, session(&mem).await);
        let lx = x.campaign(&name("deaf"), &ranked("x", 0)).await.unwrap();
        let asked = Instant::now();
        let ly = y.campaign(&name("deaf"), &ranked("y", 3)).await.unwrap();
        assert_eq!(lx.loss_reason(), Some(LossReason::Preempted));
        ly.granted_at() - asked
    };
    assert_eq!(deaf, Duration::ZERO);

    // Never acknowledged: the seat goes at the grace.
    let (c, d) = (session(&mem).await, session(&mem).await);
    let held = lb.work_guard();
    let asked = Instant::now();
    let higher = tokio::spawn(async move { c.campaign(&name("drain"), &ranked("c", 9)).await });
    let lc = higher.await.unwrap().unwrap();
    assert_eq!(
        lc.granted_at() - asked,
        tenure_core::DEFAULT_STEP_DOWN_GRACE
    );
    assert_eq!(lb.loss_reason(), Some(LossReason::Preempted));
    drop((held, d));
}

/// A holder that opted out is not preempted; the higher priority is granted first
/// once it resigns.
#[tokio::test(start_paused = true)]
async fn a_holder_that_opted_out_keeps_the_seat() {
    let mem = MemoryBackend::new();
    let (a, b, c) = (
        session(&mem).await,
        session(&mem).await,
        session(&mem).await,
    );
    let e = name("opt-out");
    let la = a
        .campaign(&e, &ranked("a", 0).never_preempted())
        .await
        .unwrap();
    let low = tokio::spawn(async move { c.campaign(&name("opt-out"), &ranked("c", 1)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let high = tokio::spawn(async move { b.campaign(&name("opt-out"), &ranked("b", 9)).await });
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(la.is_leader() && !low.is_finished() && !high.is_finished());
    la.resign().await.unwrap();
    let lb = high.await.unwrap().unwrap();
    assert!(!low.is_finished());
    lb.resign().await.unwrap();
    assert!(low.await.unwrap().unwrap().is_leader());
}

/// A holder cut off from the store when a higher priority joins keeps the seat (it
/// cannot be told) until its requests get through again, then is preempted; or it
/// loses the seat at its deadline as any cut-off holder. Never two holders.
#[tokio::test(start_paused = true)]
async fn a_stalled_holder_hears_of_its_preemption_when_it_is_back() {
    let mem = MemoryBackend::new();
    let (a, b) = (session(&mem).await, session(&mem).await);
    let e = name("stalled");
    let la = a.campaign(&e, &ranked("a", 0)).await.unwrap();
    drop(la.work_guard());
    assert!(mem.stall_session(&a.id()));
    let high = tokio::spawn(async move { b.campaign(&name("stalled"), &ranked("b", 2)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(la.is_leader() && !high.is_finished());
    assert!(mem.unstall_session(&a.id()));
    let lb = high.await.unwrap().unwrap();
    assert_eq!(la.loss_reason(), Some(LossReason::Preempted));
    assert!(la.lost_at().unwrap() <= lb.granted_at());
}

/// Clause 1 under preemption: candidates of mixed priorities join, hold, get
/// preempted and resign over and over; no two grants overlap and tokens grow.
#[tokio::test(start_paused = true)]
async fn preemptions_never_make_two_holders() {
    use tenure_core::testing::{assert_intervals_disjoint, Interval};
    let mem = MemoryBackend::new();
    let intervals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let preempted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..6i32 {
        let s = session(&mem).await;
        let (intervals, preempted) = (intervals.clone(), preempted.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..8i32 {
                let me = ranked(&format!("c{i}"), (i * 3 + round * 5) % 4);
                let l = s.campaign(&name("mixed"), &me).await.unwrap();
                let hold = Duration::from_millis(300 + ((i * 7 + round * 11) % 9) as u64 * 100);
                // Hold until done or asked to step down (a preemption), then resign.
                let stop = l.stepping_down();
                tokio::select! {
                    _ = tokio::time::sleep(hold) => {}
                    _ = stop.cancelled() => {}
                }
                let (start, token) = (l.granted_at(), l.token());
                let holder = me.id().to_string();
                let w = l.watch();
                if l.step_down_reason() == Some(StepDownReason::Preempted) {
                    preempted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let _ = l.resign().await;
                let end = w.lost_at().unwrap();
                intervals.lock().unwrap().push(Interval {
                    holder,
                    token,
                    start,
                    end,
                });
                tokio::time::sleep(Duration::from_millis(((i + round) % 3) as u64 * 150)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let intervals = intervals.lock().unwrap().clone();
    assert_eq!(intervals.len(), 48);
    let preempted = preempted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(preempted >= 5, "only {preempted} preemptions");
    assert_intervals_disjoint(intervals);
}

/// A handover asks the leader to step down without stopping it: to a named waiter
/// (ahead of higher priorities), or to the best one; a leader that opted out of
/// preemption is asked too. Nobody leading, nobody waiting and an unknown waiter are
/// refused; the leader keeps its seat then.
#[tokio::test(start_paused = true)]
async fn a_handover_moves_the_seat_to_the_waiter_asked_for() {
    let mem = MemoryBackend::new();
    let observer = tenure_core::Observer::new(Arc::new(mem.clone()), Duration::from_secs(1));
    let e = name("handover");
    let refused = observer.handover(&e, None).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::InvalidArgument);
    assert!(refused.message().contains("nobody leads it"), "{refused}");
    let (a, b, c) = (
        session(&mem).await,
        session(&mem).await,
        session(&mem).await,
    );
    let la = a
        .campaign(&e, &ranked("a", 0).never_preempted())
        .await
        .unwrap();
    drop(la.work_guard());
    let refused = observer.handover(&e, None).await.unwrap_err();
    assert!(refused.message().contains("nobody waits"), "{refused}");
    let high = tokio::spawn(async move { b.campaign(&name("handover"), &ranked("b", 9)).await });
    let low = tokio::spawn(async move { c.campaign(&name("handover"), &ranked("c", 1)).await });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let refused = observer.handover(&e, Some("z")).await.unwrap_err();
    assert!(
        refused.message().contains("no candidate \"z\""),
        "{refused}"
    );
    assert!(la.is_leader());
    let asked = observer.handover(&e, Some("c")).await.unwrap();
    assert_eq!((asked.id.as_str(), asked.token), ("a", la.token()));
    let lc = low.await.unwrap().unwrap();
    drop(lc.work_guard());
    assert_eq!(la.loss_reason(), Some(LossReason::Preempted));
    assert!(la.lost_at().unwrap() <= lc.granted_at());
    assert!(
        !high.is_finished(),
        "the higher priority was granted, not the one asked for"
    );
    // Without --to: the best waiter.
    observer.handover(&e, None).await.unwrap();
    let lb = high.await.unwrap().unwrap();
    assert_eq!(lc.loss_reason(), Some(LossReason::Preempted));
    assert!(lb.token() > lc.token());
}
