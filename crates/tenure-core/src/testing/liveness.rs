//! Clauses 5 to 9: graceful handover, crash failover, no herd, connection loss, observing.

use super::*;

/// Clause 5: after `resign()`, a waiting candidate is granted quickly (far below a TTL).
pub async fn check_graceful_handover(env: &Env) {
    let Some(election) = env.election_for(Clause::GracefulHandover, "handover") else {
        return;
    };
    let (_sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "waiter granted while the seat was held"
    );
    let a_state = a.state.clone();
    let t0 = Instant::now();
    a.resign().await.expect("resign");
    let b = within(env.handover_bound(), "handover after resign", waiter)
        .await
        .expect("waiter");
    let gap = b.granted_at() - t0;
    assert!(
        a_state.reason().map(|r| r.1) <= Some(b.granted_at()),
        "successor granted before the holder's lost signal"
    );
    assert!(b.token() > a_state.token);
    eprintln!("handover on {}: {gap:?}", env.backend.scheme());
}

/// Clause 6: a holder that dies without resigning is replaced within TTL + one
/// interval, and its lost signal fires before the successor is granted.
pub async fn check_crash_failover(env: &Env) {
    let Some(election) = env.election_for(Clause::CrashFailover, "crash") else {
        return;
    };
    let (sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    sa.abandon();
    let bound = env.timing.ttl
        + env.timing.retry.max
        + env.caps().handover_poll.unwrap_or_default()
        + env.slack;
    let b = within(bound, "failover after crash", waiter)
        .await
        .expect("waiter");
    assert!(b.granted_at() - t0 <= bound);
    assert!(!a.is_leader());
    assert!(
        a.lost_at().is_some_and(|at| at <= b.granted_at()),
        "crashed holder's grant outlived the successor's start: {:?} vs {:?}",
        a.lost_at(),
        b.granted_at()
    );
    assert!(b.token() > a.token());
}

/// Clause 7: when the seat frees up, the number of store requests does not grow with
/// the number of waiters.
pub async fn check_no_herd(env: &Env) {
    if env.not_applicable(Clause::NoHerd) {
        return;
    }
    let Some(_) = env.backend.election_requests() else {
        eprintln!(
            "clause 7 not checked on {}: the backend does not count requests",
            env.backend.scheme()
        );
        return;
    };
    let election = env.election("herd");
    let sa = env.session().await;
    let a = campaign(&sa, &election, &cand("a")).await;
    let granted = Arc::new(AtomicU64::new(0));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let s = env.session().await;
        let election = election.clone();
        let granted = granted.clone();
        waiters.push(tokio::spawn(async move {
            let l = campaign(&s, &election, &cand(&format!("w{i}"))).await;
            granted.fetch_add(1, Ordering::SeqCst);
            // Hold until the test ends.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop((l, s));
        }));
    }
    let before = env.quiet_election_requests().await.unwrap_or(0);
    a.resign().await.expect("resign");
    within(env.handover_bound(), "one waiter granted", async {
        while granted.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = env.backend.election_requests().unwrap_or(0);
    assert_eq!(
        granted.load(Ordering::SeqCst),
        1,
        "more than one waiter granted"
    );
    assert!(
        after - before <= 4,
        "{} store requests for one handover to one of 8 waiters (herd)",
        after - before
    );
    for w in waiters {
        w.abort();
    }
}

/// Clause 8: a short disconnect keeps leadership; a long one fires the lost signal
/// before anyone else is granted; after reconnecting, the campaign goes on by itself.
pub async fn check_connection_loss(env: &Env) {
    if env.not_applicable(Clause::ConnectionLoss) {
        return;
    }
    let victim = match env.faults.victim_backend(env).await {
        Ok(b) => b,
        Err(why) => return eprintln!("clause 8 not checked on {}: {why}", env.backend.scheme()),
    };
    let election = env.election("disconnect");
    let sa = env.session_on(victim).await;
    let mut runner = LeaderRunner::new(sa.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone(), |ctx| async move {
        ctx.cancelled().await;
        Ok::<(), String>(())
    }));
    let first_token = within(
        env.handover_bound(),
        "runner elected",
        next_elected(&mut events),
    )
    .await;

    // Short: well within the deadline.
    let short = (env.timing.renew_deadline - env.timing.renew_interval) / 3;
    if let Err(why) = env.faults.disconnect(&sa).await {
        stop.cancel();
        return eprintln!("clause 8 not checked on {}: {why}", env.backend.scheme());
    }
    tokio::time::sleep(short).await;
    env.faults.reconnect(&sa).await.expect("reconnect");
    tokio::time::sleep(env.timing.renew_interval * 2).await;
    assert!(
        events.try_recv().is_err(),
        "a disconnect of {short:?} (< renew deadline) ended leadership"
    );

    // Long: past the TTL, so the store frees the seat for a waiter.
    let sb = env.session().await;
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move { (campaign(&sb, &election, &cand("b")).await, sb) })
    };
    env.faults.disconnect(&sa).await.expect("disconnect");
    let lost_at = within(
        env.timing.ttl + env.slack,
        "lost signal after a long disconnect",
        async {
            loop {
                match events.recv().await {
                    Some(LeadershipEvent::Lost { at, .. }) => break at,
                    Some(_) => continue,
                    None => panic!("runner stopped"),
                }
            }
        },
    )
    .await;
    let (b, sb) = within(
        env.timing.ttl * 2 + env.slack,
        "waiter granted after holder disconnected",
        waiter,
    )
    .await
    .expect("waiter");
    assert!(
        lost_at <= b.granted_at(),
        "successor granted before the holder's lost signal"
    );
    env.faults.reconnect(&sa).await.expect("reconnect");
    b.resign().await.expect("resign");
    let again = within(
        env.timing.ttl * 2 + env.handover_bound(),
        "campaign goes on after reconnect",
        next_elected(&mut events),
    )
    .await;
    assert!(again > first_token);
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
    drop(sb);
}

/// Clause 9: `leader()` and `observe()` show the current holder; an observer converges
/// on the final state.
pub async fn check_observe(env: &Env) {
    let Some(election) = env.election_for(Clause::Observe, "observe") else {
        return;
    };
    let s = env.session().await;
    assert_eq!(s.leader(&election).await.expect("leader"), None);
    let mut stream = s.observe(&election).await.expect("observe");
    let first = within(env.handover_bound(), "first observed state", stream.next())
        .await
        .expect("stream ended")
        .expect("observe item");
    assert_eq!(first, None);
    let mut last = None;
    for name in ["a", "b", "c"] {
        let si = env.session().await;
        let l = campaign(&si, &election, &cand(name)).await;
        if name != "c" {
            l.resign().await.expect("resign");
        } else {
            last = Some((l, si));
        }
    }
    let (c, sc) = last.expect("c leads");
    let expect = crate::LeaderInfo {
        id: "c".into(),
        value: "value-of-c".into(),
        token: c.token(),
    };
    let bound = env.handover_bound() + env.caps().observe_poll.unwrap_or_default();
    within(bound, "observer sees the final leader", async {
        loop {
            let item = stream.next().await.expect("stream ended").expect("item");
            if item.as_ref() == Some(&expect) {
                break;
            }
            if let Some(i) = &item {
                assert!(
                    i.token <= expect.token,
                    "observed a token from the future: {i:?}"
                );
            }
        }
    })
    .await;
    assert_eq!(s.leader(&election).await.expect("leader"), Some(expect));
    c.resign().await.expect("resign");
    within(bound, "observer sees the seat free", async {
        while stream
            .next()
            .await
            .expect("stream ended")
            .expect("item")
            .is_some()
        {}
    })
    .await;
    drop(sc);
}
