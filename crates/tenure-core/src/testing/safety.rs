//! Clauses 1 to 4: one holder at a time, growing tokens, lost is final, an honest `is_leader()`.

use super::*;

/// Clause 1: concurrent candidates that campaign, hold and resign never overlap.
pub async fn check_at_most_one_holder(env: &Env) {
    let Some(election) = env.election_for(Clause::AtMostOneHolder, "one-holder") else {
        return;
    };
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let session = env.session().await;
        let election = election.clone();
        let intervals = intervals.clone();
        tasks.push(tokio::spawn(async move {
            let me = cand(&format!("c{i}"));
            for round in 0..3u64 {
                let l = campaign(&session, &election, &me).await;
                assert!(l.is_leader());
                let start = l.granted_at();
                tokio::time::sleep(Duration::from_millis(5 + (i * 7 + round * 3) % 20)).await;
                assert!(l.is_leader(), "lost the seat while holding it");
                let token = l.token();
                let state = l.state.clone();
                if round % 2 == 0 {
                    l.resign().await.expect("resign");
                } else {
                    drop(l);
                }
                let end = state
                    .reason()
                    .map(|(_, at)| *at)
                    .expect("lost signal fired");
                intervals.lock().unwrap().push(Interval {
                    holder: me.id().to_string(),
                    token,
                    start,
                    end,
                });
            }
            session.close().await.expect("close");
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "candidates", t)
            .await
            .expect("candidate task");
    }
    let intervals = intervals.lock().unwrap().clone();
    assert_eq!(intervals.len(), 12);
    assert_intervals_disjoint(intervals);
}

/// Clause 2: tokens strictly increase across resigns, sessions, try-campaigns and
/// session closes.
pub async fn check_monotonic_tokens(env: &Env) {
    let Some(election) = env.election_for(Clause::MonotonicTokens, "tokens") else {
        return;
    };
    let (s1, s2) = (env.session().await, env.session().await);
    let (a, b) = (cand("a"), cand("b"));
    let mut tokens = Vec::new();
    let l = campaign(&s1, &election, &a).await;
    tokens.push(l.token());
    l.resign().await.expect("resign");
    let l = campaign(&s2, &election, &b).await;
    tokens.push(l.token());
    l.resign().await.expect("resign");
    let l = s1
        .try_campaign(&election, &a)
        .await
        .expect("try_campaign")
        .expect("seat is free");
    tokens.push(l.token());
    assert!(
        s2.try_campaign(&election, &b).await.expect("try").is_none(),
        "try_campaign took a held seat"
    );
    drop(l); // resigns in the background
    let l = campaign(&s2, &election, &b).await;
    tokens.push(l.token());
    s2.close().await.expect("close");
    assert!(!l.is_leader(), "leadership survived closing its session");
    let s3 = env.session().await;
    let l = campaign(&s3, &election, &a).await;
    tokens.push(l.token());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    let info = s1.leader(&election).await.expect("leader");
    assert_eq!(info.map(|i| i.token), Some(l.token()));
}

/// Clause 3: once lost, a leadership never becomes valid again; a new grant has a new,
/// higher token.
pub async fn check_lost_is_final(env: &Env) {
    let Some(election) = env.election_for(Clause::LostIsFinal, "final") else {
        return;
    };
    let s = env.session().await;
    let me = cand("a");
    let first = campaign(&s, &election, &me).await;
    let first_state = first.state.clone();
    let lost = first.lost();
    first.resign().await.expect("resign");
    assert!(lost.is_cancelled());
    assert_eq!(
        first_state.reason().map(|r| r.0.clone()),
        Some(LossReason::Resigned)
    );
    let second = campaign(&s, &election, &me).await;
    assert!(second.token() > first_state.token);
    assert!(first_state.is_lost(), "an old grant came back to life");

    // After the store expires the session, the core opens a new one and the old grant
    // stays lost.
    let gen = s.generation();
    match env.faults.expire(&s).await {
        Err(why) => eprintln!(
            "clause 3 expiry part skipped on {}: {why}",
            env.backend.scheme()
        ),
        Ok(()) => {
            let reason = within(
                env.timing.ttl + env.slack,
                "lost after expiry",
                second.lost_wait(),
            )
            .await;
            assert!(
                matches!(reason, LossReason::SessionExpired | LossReason::Revoked(_)),
                "unexpected reason {reason:?}"
            );
            let third = within(
                env.timing.ttl * 2 + env.slack,
                "campaign after expiry",
                campaign(&s, &election, &me),
            )
            .await;
            assert!(s.generation() > gen, "session was not re-opened: gen {gen} now {} id {} tokens {:?} {:?} reason {reason:?}", s.generation(), s.id(), second.token(), third.token());
            assert!(third.token() > second.token());
            assert!(!second.is_leader());
            assert!(third.is_leader());
        }
    }
}

/// Clause 4: after a pause past the deadline (a GC-like stop of the whole thread),
/// `is_leader()` is false before any timer runs. Run on a current-thread runtime so
/// that the pause stops renewals too.
pub async fn check_is_leader_honest_without_io(env: &Env) {
    let Some(election) = env.election_for(Clause::HonestIsLeader, "honest") else {
        return;
    };
    let s = env.session().await;
    let l = campaign(&s, &election, &cand("a")).await;
    assert!(l.is_leader());
    let deadline = l.deadline();
    // Block the thread: no task, timer or renewal runs.
    std::thread::sleep(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(30),
    );
    assert!(!l.is_leader(), "is_leader() true after the deadline passed");
    assert_eq!(l.loss_reason(), Some(LossReason::DeadlineExceeded));
    assert_eq!(l.lost_at(), Some(deadline));
    tokio::task::yield_now().await;
    tokio::time::sleep(env.timing.renew_interval).await;
    assert!(!l.is_leader(), "lost is not final");
    // The seat is released, so someone else gets it.
    let other = env.session().await;
    let o = within(
        env.timing.ttl + env.handover_bound(),
        "seat after a paused holder",
        campaign(&other, &election, &cand("b")),
    )
    .await;
    assert!(o.token() > l.token());
}
