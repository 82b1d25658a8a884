//! Clauses 10 to 12: running work while leader, stall detection, bad input.

use super::*;

/// Clause 10: the runner campaigns, runs the task, resigns when it ends and campaigns
/// again; shutdown resigns promptly.
pub async fn check_run_when_leader(env: &Env) {
    let Some(election) = env.election_for(Clause::RunWhenLeader, "runner") else {
        return;
    };
    let s = env.session().await;
    let mut runner = LeaderRunner::new(s.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let run = tokio::spawn(runner.run(stop.clone(), move |ctx| {
        let counter = counter.clone();
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            if n < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            } else {
                ctx.cancelled().await;
                Ok::<(), String>(())
            }
        }
    }));
    let mut tokens = Vec::new();
    let mut finished = 0;
    within(env.handover_bound() * 4, "three terms", async {
        while tokens.len() < 3 {
            match events.recv().await.expect("events") {
                LeadershipEvent::Elected { token, .. } => tokens.push(token),
                LeadershipEvent::Resigned {
                    cause: ResignCause::TaskFinished,
                    ..
                } => finished += 1,
                LeadershipEvent::Lost { reason, .. } => panic!("lost: {reason}"),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(finished, 2);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // A waiter gets the seat promptly after shutdown.
    let other = env.session().await;
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move { (campaign(&other, &election, &cand("b")).await, other) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
    let resigned = loop {
        match events.recv().await {
            Some(LeadershipEvent::Resigned { cause, .. }) => break cause,
            Some(_) => continue,
            None => panic!("no resigned event"),
        }
    };
    assert_eq!(resigned, ResignCause::Shutdown);
    let (b, _other) = within(env.handover_bound(), "seat after runner shutdown", waiter)
        .await
        .expect("waiter");
    assert!(b.token() > tokens[2]);
}

/// Clause 11: a task that misses its heartbeat is cancelled and the runner resigns; a
/// task that heartbeats keeps the seat.
pub async fn check_stall_detection(env: &Env) {
    let Some(election) = env.election_for(Clause::StallDetection, "stall") else {
        return;
    };
    let s = env.session().await;
    let stall = Duration::from_millis(150);
    let mut runner = LeaderRunner::new(s.clone(), election.clone(), cand("a")).stall_timeout(stall);
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let terms = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let (t, c) = (terms.clone(), cancelled.clone());
    let run = tokio::spawn(runner.run(stop.clone(), move |ctx| {
        let (t, c) = (t.clone(), c.clone());
        async move {
            let term = t.fetch_add(1, Ordering::SeqCst);
            if term == 0 {
                // Hung: never heartbeats.
                ctx.cancelled().await;
                c.fetch_add(1, Ordering::SeqCst);
            } else {
                // Healthy: heartbeats until cancelled.
                loop {
                    ctx.heartbeat();
                    tokio::select! {
                        _ = ctx.cancelled() => break,
                        _ = tokio::time::sleep(stall / 5) => {}
                    }
                }
            }
            Ok::<(), String>(())
        }
    }));
    let cause = within(stall * 4 + env.handover_bound(), "stall detected", async {
        loop {
            match events.recv().await.expect("events") {
                LeadershipEvent::Resigned { cause, .. } => break cause,
                LeadershipEvent::Lost { reason, .. } => panic!("lost: {reason}"),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(cause, ResignCause::Stalled);
    within(env.handover_bound(), "stalled task cancelled", async {
        while cancelled.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    within(
        env.handover_bound() * 2,
        "re-elected after a stall",
        next_elected(&mut events),
    )
    .await;
    tokio::time::sleep(stall * 4).await;
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(
                ev,
                LeadershipEvent::Resigned { .. } | LeadershipEvent::Lost { .. }
            ),
            "a heartbeating task was stopped: {ev:?}"
        );
    }
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
}

/// Clause 12: bad input gives `InvalidArgument` naming the field; nothing panics.
pub async fn check_bad_input(env: &Env) {
    if env.not_applicable(Clause::Errors) {
        return;
    }
    for bad in [
        "",
        "/x",
        "x/",
        "a//b",
        "a/../b",
        "a b",
        "ü",
        &"n".repeat(300),
    ] {
        let e = ElectionName::new(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    for bad in ["", "a b", "tab\t"] {
        assert_eq!(
            Candidate::new(bad).expect_err(bad).kind(),
            ErrorKind::InvalidArgument
        );
    }
    let cases: Vec<(&str, Timing)> = vec![
        (
            "ttl",
            Timing {
                ttl: Duration::ZERO,
                ..env.timing.clone()
            },
        ),
        (
            "renew_interval",
            Timing {
                renew_interval: env.timing.ttl,
                ..env.timing.clone()
            },
        ),
        (
            "renew_deadline",
            Timing {
                renew_deadline: env.timing.ttl,
                ..env.timing.clone()
            },
        ),
        (
            "connect_timeout",
            Timing {
                connect_timeout: Duration::ZERO,
                ..env.timing.clone()
            },
        ),
    ];
    for (field, timing) in cases {
        let e = Session::open(env.backend.clone(), timing)
            .await
            .expect_err(field);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    // One candidacy per election per session.
    let election = env.election("bad-input");
    let s = env.session().await;
    let l = campaign(&s, &election, &cand("a")).await;
    let e = s
        .campaign(&election, &cand("a"))
        .await
        .expect_err("second campaign");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    l.resign().await.expect("resign");
}
