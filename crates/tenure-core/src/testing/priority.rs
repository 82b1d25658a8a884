//! Clause 14: priority order, preemption and handover, or their refusal.

use super::*;

fn with_priority(c: Candidate, priority: i32) -> Candidate {
    match c.with_priority(priority) {
        Ok(c) => c,
        Err(e) => panic!("priority {priority}: {e}"),
    }
}

/// Clause 14: the highest-priority waiter is granted next (ties: queue order); a
/// candidate that joins with a higher priority than a preemptible holder preempts it
/// (lost signal `Preempted` first, then the preferred candidate is granted within a
/// handover); an equal or lower priority, a holder that opted out, and a
/// `try_campaign` never preempt; no two holders. A backend that does not declare
/// [`Capabilities::priority`] must refuse a priority with `Unsupported` (checked here
/// instead).
pub async fn check_priority(env: &Env) {
    if let Err(why) = env.caps().supports(Clause::Priority) {
        eprintln!(
            "contract clause 14 (Priority) not applicable on {}: {why}; checking the rejection",
            env.backend.scheme()
        );
        check_priority_rejected(env).await;
        return;
    }
    check_priority_order(env).await;
    check_preemption(env).await;
    check_handover(env).await;
}

/// A backend without priorities refuses a candidate with one, on every way in, with an
/// `Unsupported` error that names the priority and the backend; priority 0 and the
/// opt-out alone campaign as before.
pub async fn check_priority_rejected(env: &Env) {
    let election = env.election("priority-rejected");
    // A backend that said why it cannot keep priorities must be quoted in the error.
    let declared = match env.caps().supports(Clause::Priority) {
        Err(why) if why != crate::backend::PRIORITY_NOT_YET => Some(why),
        _ => None,
    };
    let s = env.session().await;
    let c = with_priority(cand("a"), 7);
    let seats = [(election.clone(), c.clone())];
    let errors = [
        s.campaign(&election, &c).await.err(),
        s.try_campaign(&election, &c).await.err(),
        s.try_campaign_many(&seats).await.err(),
    ];
    for e in errors {
        let e = e.expect("a priority on a backend without priorities was accepted");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let line = crate::one_line(&e);
        assert!(line.contains("priority 7"), "{line}");
        assert!(line.contains(env.backend.scheme()), "{line}");
        if let Some(why) = declared {
            assert!(line.contains(why), "{line}: the declared reason is missing");
        }
    }
    let plain = cand("a").never_preempted();
    let l = campaign(&s, &election, &plain).await;
    let e = s
        .observer()
        .handover(&election, None)
        .await
        .expect_err("a handover on a backend without priorities was accepted");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    if let Some(why) = declared {
        let line = crate::one_line(&e);
        assert!(line.contains(why), "{line}: the declared reason is missing");
    }
    assert!(l.is_leader());
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

/// Clause 14, handover: the leader (one that opted out of preemption, too) steps down
/// to the waiter asked for, ahead of a higher priority, within a handover; its lost
/// signal (`Preempted`) fires first; asking for a waiter that is not there is
/// `InvalidArgument` and leaves the leader alone.
async fn check_handover(env: &Env) {
    let election = env.election("handover");
    let (sa, sb, sc) = (
        env.session().await,
        env.session().await,
        env.session().await,
    );
    let a = campaign(&sa, &election, &cand("a").never_preempted()).await;
    let waiter = |s: &Session, c: Candidate| {
        let (s, e) = (s.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &c).await })
    };
    let high = waiter(&sb, with_priority(cand("b"), 9));
    let_queue(env).await;
    let low = waiter(&sc, cand("c"));
    let_queue(env).await;
    let observer = sa.observer();
    // The holder's work listens for a step-down.
    let stop = a.stepping_down();
    let e = observer.handover(&election, Some("nobody")).await;
    let e = e.expect_err("a handover to a waiter that is not there was accepted");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(a.is_leader());
    let t0 = Instant::now();
    let asked = observer
        .handover(&election, Some("c"))
        .await
        .expect("handover");
    assert_eq!((asked.id.as_str(), asked.token), ("a", a.token()));
    // The holder is asked to step down; it acknowledges by resigning.
    within(
        env.handover_bound(),
        "holder asked to step down",
        stop.cancelled(),
    )
    .await;
    assert_eq!(a.step_down_reason(), Some(StepDownReason::Preempted));
    let a_watch = a.watch();
    a.resign().await.expect("resign");
    let c = within(env.handover_bound(), "handover to c", low)
        .await
        .expect("c granted");
    eprintln!(
        "handover on {}: {:?}",
        env.backend.scheme(),
        c.granted_at() - t0
    );
    assert_eq!(a_watch.loss_reason(), Some(LossReason::Resigned));
    assert!(!high.is_finished(), "the handover went to b, not to c");
    assert_intervals_disjoint(vec![watch_interval(&a_watch), interval_open(&c)]);
    c.resign().await.expect("resign");
    within(env.handover_bound(), "b after c", high)
        .await
        .expect("b granted");
    for s in [sa, sb, sc] {
        s.close().await.expect("close");
    }
}

/// Clause 14, order: behind a holder that opted out, waiters joining with priorities
/// 0, 5, 5, 2 are granted 5, 5 (in queue order), 2, 0.
async fn check_priority_order(env: &Env) {
    let election = env.election("priority-order");
    let sa = env.session().await;
    let a = campaign(&sa, &election, &cand("a").never_preempted()).await;
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (id, priority) in [("b", 0), ("c", 5), ("d", 5), ("e", 2)] {
        let s = env.session().await;
        let (election, granted) = (election.clone(), granted.clone());
        let me = with_priority(cand(id), priority);
        waiters.push(tokio::spawn(async move {
            let l = campaign(&s, &election, &me).await;
            granted.lock().unwrap().push(me.id().to_string());
            let token = l.token();
            l.resign().await.expect("resign");
            s.close().await.expect("close");
            token
        }));
        let_queue(env).await;
    }
    assert!(a.is_leader(), "a holder that opted out was preempted");
    assert_eq!(a.loss_reason(), None);
    let first = a.token();
    a.resign().await.expect("resign");
    let mut tokens = Vec::new();
    for w in waiters {
        let bound = env.handover_bound() * 4;
        tokens.push(within(bound, "waiters granted", w).await.expect("waiter"));
    }
    assert_eq!(*granted.lock().unwrap(), ["c", "d", "e", "b"]);
    assert!(tokens.iter().all(|t| *t > first));
    sa.close().await.expect("close");
}

/// Clause 14, preemption: a higher priority joins → the holder's lost signal fires
/// (`Preempted`) before the preferred candidate is granted, within a handover of the
/// join; equal priority, lower priority and `try_campaign` do not preempt.
async fn check_preemption(env: &Env) {
    let election = env.election("preemption");
    let (sa, sb, sc) = (
        env.session().await,
        env.session().await,
        env.session().await,
    );
    let a = campaign(&sa, &election, &with_priority(cand("a"), 1)).await;
    // The holder's work: it acknowledges a step-down by dropping its guard.
    let work = a.work_guard();
    // try_campaign never queues, so it never preempts.
    let tried = sc
        .try_campaign(&election, &with_priority(cand("c"), 9))
        .await;
    assert!(
        tried.expect("try_campaign").is_none(),
        "seat taken by a try"
    );
    // A lower priority waits without preempting.
    let low = {
        let (s, e) = (sc.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("c"), 0)).await })
    };
    let_queue(env).await;
    assert!(a.is_leader(), "a lower priority preempted the holder");
    let t0 = Instant::now();
    let b = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("b"), 3)).await })
    };
    within(
        env.handover_bound(),
        "holder asked to step down",
        a.stepping_down().cancelled(),
    )
    .await;
    assert_eq!(a.step_down_reason(), Some(StepDownReason::Preempted));
    // Clause 15: the seat is held until the work acknowledges.
    assert!(a.is_leader(), "the seat ended before the work acknowledged");
    drop(work);
    let reason = within(env.handover_bound(), "holder preempted", a.lost_wait()).await;
    assert_eq!(reason, LossReason::Preempted);
    let b = within(env.handover_bound(), "preferred candidate granted", b)
        .await
        .expect("preferred candidate");
    let gap = b.granted_at() - t0;
    assert!(gap <= env.handover_bound(), "preemption took {gap:?}");
    eprintln!("preemption on {}: {gap:?}", env.backend.scheme());
    // Equal priority: b keeps the seat.
    let equal = {
        let (s, e) = (sa.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("a"), 3)).await })
    };
    let_queue(env).await;
    assert!(b.is_leader(), "an equal priority preempted the holder");
    assert!(!low.is_finished() && !equal.is_finished());
    let intervals = vec![interval(&a), interval_open(&b)];
    assert_intervals_disjoint(intervals);
    // The equal-priority waiter queued after the lower one but is granted first.
    b.resign().await.expect("resign");
    let next = within(env.handover_bound(), "next waiter", equal)
        .await
        .expect("equal waiter");
    assert!(!low.is_finished(), "a lower priority was granted first");
    next.resign().await.expect("resign");
    within(env.handover_bound(), "last waiter", low)
        .await
        .expect("low waiter");
    for s in [sa, sb, sc] {
        s.close().await.expect("close");
    }
}
