//! Clauses 15 and 16: planned transitions and state transfer.

use super::*;

/// Clause 15, planned transitions: a holder asked to step down keeps the seat (held,
/// renewed, still the leader observers see) until its work acknowledges, and only then
/// is the waiter granted, within a handover; a holder whose work never acknowledges
/// loses the seat at the step-down grace and the waiter is granted then; the runner,
/// shut down, stops its task before it releases the seat.
pub async fn check_planned_transitions(env: &Env) {
    check_step_down_waits_for_the_work(env).await;
    check_step_down_grace(env).await;
    check_runner_stops_before_release(env).await;
}

/// Clause 16, state transfer: a holder that resigns with a state leaves it to the
/// waiter its release grants, with its token; with nobody waiting, to the next grant
/// (once); a grant after a crash inherits nothing; a state over the limit is refused
/// with `InvalidArgument` and the seat is released all the same. A backend without
/// the clause answers `Unsupported` and still releases.
pub async fn check_state_transfer(env: &Env) {
    let election = env.election("state");
    if env.not_applicable(Clause::StateTransfer) {
        let (_sa, a, waiter) = held_and_awaited(env, &election).await;
        let err = a.resign_with(b"x".to_vec()).await.expect_err("unsupported");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        within(env.handover_bound(), "granted after the release", waiter)
            .await
            .expect("waiter");
        return;
    }
    let (_sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ta = a.token();
    a.resign_with(b"cursor=1".to_vec())
        .await
        .expect("resign_with");
    let b = within(env.handover_bound(), "granted after resign_with", waiter)
        .await
        .expect("waiter");
    assert_eq!(b.inherited(), Some((ta, &b"cursor=1"[..])));
    // Nobody waits: the next grant takes it, and only that one.
    let tb = b.token();
    let big = vec![7u8; crate::engine::MAX_STATE];
    b.resign_with(big.clone()).await.expect("the largest state");
    let sc = env.session().await;
    let c = campaign(&sc, &election, &cand("c")).await;
    assert_eq!(c.inherited(), Some((tb, &big[..])));
    let over = vec![0u8; crate::engine::MAX_STATE + 1];
    let err = c.resign_with(over).await.expect_err("over the limit");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let sd = env.session().await;
    let d = campaign(&sd, &election, &cand("d")).await;
    assert_eq!(d.inherited(), None, "a refused state was left after all");
    // A crash leaves nothing, even to a waiter.
    let se = env.session().await;
    let wait_e = {
        let election = election.clone();
        tokio::spawn(async move { campaign(&se, &election, &cand("e")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    sd.abandon();
    let e = within(
        env.timing.ttl * 2 + env.slack,
        "granted after the holder crashed",
        wait_e,
    )
    .await
    .expect("waiter");
    assert_eq!(e.inherited(), None, "a crashed holder left a state");
    drop(d);
}

/// How long the checks of clause 15 let a step-down wait before they look again: long
/// enough that a seat released early would have been granted to the waiter.
fn drain_time(env: &Env) -> Duration {
    env.handover_bound().min(Duration::from_secs(2))
}

async fn check_step_down_waits_for_the_work(env: &Env) {
    let election = env.election("step-down");
    let (sa, a, waiter) = held_and_awaited(env, &election).await;
    let_queue(env).await;
    let work = a.work_guard();
    let second = work.clone();
    assert!(a.step_down(StepDownReason::Requested));
    assert!(!a.step_down(StepDownReason::Shutdown), "asked twice");
    assert!(a.stepping_down().is_cancelled() && work.stepping_down().is_cancelled());
    assert_eq!(work.step_down_reason(), Some(StepDownReason::Requested));
    // The work drains: the seat stays held and renewed, past renewals.
    tokio::time::sleep(drain_time(env)).await;
    assert!(a.is_leader(), "the seat ended while the work was draining");
    assert!(
        !waiter.is_finished(),
        "the waiter was granted before the work stopped"
    );
    let seen = sa.leader(&election).await.expect("leader").map(|l| l.id);
    assert_eq!(
        seen.as_deref(),
        Some("a"),
        "observers see the holder meanwhile"
    );
    // One guard of two is not an acknowledgement; the last one (done) is.
    drop(second);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(a.is_leader() && !waiter.is_finished());
    let acked = Instant::now();
    work.done();
    let b = within(
        env.handover_bound(),
        "waiter after the acknowledgement",
        waiter,
    )
    .await
    .expect("waiter");
    assert_eq!(a.loss_reason(), Some(LossReason::Resigned));
    let end = a.lost_at().expect("ended");
    assert!(
        end >= acked && end <= b.granted_at(),
        "released before the acknowledgement"
    );
    assert_intervals_disjoint(vec![interval(&a), interval_open(&b)]);
    eprintln!(
        "step-down on {}: acknowledged → successor granted in {:?}",
        env.backend.scheme(),
        b.granted_at() - acked
    );
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
}

async fn check_step_down_grace(env: &Env) {
    let election = env.election("step-down-grace");
    let grace = Duration::from_millis(600) + env.slack;
    let timing = Timing {
        step_down_grace: grace,
        ..env.timing.clone()
    };
    let sa = match Session::open(env.backend.clone(), timing).await {
        Ok(s) => s,
        Err(e) => panic!("open session: {e}"),
    };
    let a = campaign(&sa, &election, &cand("a")).await;
    let sb = env.session().await;
    let waiter = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &cand("b")).await })
    };
    let_queue(env).await;
    // Work that never acknowledges: the guard is kept and the holder never resigns.
    let work = a.work_guard();
    let asked = Instant::now();
    a.step_down(StepDownReason::Requested);
    let b = within(grace + env.handover_bound(), "waiter at the grace", waiter)
        .await
        .expect("waiter");
    let end = a.lost_at().expect("the seat ended at the grace");
    assert!(
        end >= asked + grace,
        "released {:?} after the ask, before the grace",
        end - asked
    );
    assert!(b.granted_at() >= end);
    assert!(!a.is_leader() && work.stepping_down().is_cancelled());
    drop(work);
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
    sb.close().await.expect("close");
}

async fn check_runner_stops_before_release(env: &Env) {
    let election = env.election("step-down-runner");
    let drain = Duration::from_millis(300);
    let sa = env.session().await;
    let task_ended = Arc::new(Mutex::new(None::<Instant>));
    let shutdown = CancellationToken::new();
    let mut runner = LeaderRunner::new(sa.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let run = {
        let (shutdown, ended) = (shutdown.clone(), task_ended.clone());
        tokio::spawn(runner.run(shutdown, move |ctx| {
            let ended = ended.clone();
            async move {
                ctx.cancelled().await;
                // The task flushes for a while after it was told to stop.
                tokio::time::sleep(drain).await;
                *ended.lock().unwrap() = Some(Instant::now());
                Ok::<(), String>(())
            }
        }))
    };
    loop {
        match within(env.handover_bound(), "elected", events.recv()).await {
            Some(LeadershipEvent::Elected { .. }) => break,
            Some(_) => continue,
            None => panic!("the runner stopped before it was elected"),
        }
    }
    let sb = env.session().await;
    let waiter = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &cand("b")).await })
    };
    let_queue(env).await;
    shutdown.cancel();
    let b = within(
        drain + env.handover_bound(),
        "waiter after shutdown",
        waiter,
    )
    .await
    .expect("waiter");
    let ended = task_ended.lock().unwrap().expect("the task ended");
    assert!(
        b.granted_at() >= ended,
        "the successor was granted before the task ended"
    );
    within(env.handover_bound(), "runner returned", run)
        .await
        .expect("join")
        .expect("run");
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        seen.push(ev);
    }
    assert!(
        matches!(
            seen.first(),
            Some(LeadershipEvent::SteppingDown {
                reason: StepDownReason::Shutdown,
                ..
            })
        ),
        "{seen:?}"
    );
    assert!(
        matches!(
            seen.get(1),
            Some(LeadershipEvent::Resigned {
                cause: ResignCause::Shutdown,
                aborted: false,
                ..
            })
        ),
        "{seen:?}"
    );
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
    sb.close().await.expect("close");
}
