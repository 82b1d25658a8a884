//! The session definition: many elections on one session, seats taken and resigned in batches.

use super::*;

/// Not a numbered clause but part of the session definition: one session holds many
/// elections and keeps them all with one renewal stream.
pub async fn check_many_elections_one_session(env: &Env) {
    let s = env.session().await;
    let me = cand("many");
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(campaign(&s, &env.election(&format!("many/{i:03}")), &me).await);
    }
    tokio::time::sleep(env.timing.renew_deadline + env.timing.renew_interval).await;
    assert!(
        held.iter().all(Leadership::is_leader),
        "a grant lapsed while the session renewed"
    );
    let tokens: Vec<_> = held.iter().map(Leadership::token).collect();
    for l in held {
        l.resign().await.expect("resign");
    }
    assert_eq!(tokens.len(), 100);
}

/// Not a numbered clause but part of the session definition: `try_campaign_many` takes
/// the free seats of a batch and only those (partial success: seats another session
/// holds stay its own), each grant a leadership with its own token as from
/// `try_campaign`; a store that declares [`Capabilities::batch`] asks in round trips,
/// not seat by seat; a bad batch is refused whole.
pub async fn check_batch_campaign(env: &Env) {
    const SEATS: usize = 40;
    let (sa, sb) = (env.session().await, env.session().await);
    let elections: Vec<ElectionName> = (0..SEATS)
        .map(|i| env.election(&format!("batch/{i:02}")))
        .collect();
    let taken = |i: usize| i % 7 == 3;
    let mut held = Vec::new();
    for (i, election) in elections.iter().enumerate().filter(|(i, _)| taken(*i)) {
        held.push((i, campaign(&sa, election, &cand("a")).await));
    }
    let seats: Vec<(ElectionName, Candidate)> =
        elections.iter().map(|e| (e.clone(), cand("b"))).collect();
    let before = env.backend.election_requests();
    let got = sb
        .try_campaign_many(&seats)
        .await
        .expect("try_campaign_many");
    let after = env.backend.election_requests();
    assert_eq!(got.len(), SEATS, "one answer per seat");
    for (i, answer) in got.iter().enumerate() {
        match answer {
            None => assert!(taken(i), "seat {i} was free but not granted"),
            Some(l) => {
                assert!(!taken(i), "seat {i} is held by a but was granted to b");
                assert!(l.is_leader(), "seat {i}: granted but not leading");
                assert_eq!(l.election(), &elections[i]);
                let leader = env.backend.leader(&elections[i]).await.expect("leader");
                assert_eq!(
                    leader.map(|info| (info.id, info.token)),
                    Some(("b".to_string(), l.token())),
                    "seat {i}: the store names another leader or token"
                );
            }
        }
    }
    for (i, l) in &held {
        assert!(l.is_leader(), "a lost seat {i} to b's batch");
        let leader = env.backend.leader(&elections[*i]).await.expect("leader");
        assert_eq!(
            leader.map(|info| info.id),
            Some("a".to_string()),
            "seat {i}"
        );
    }
    let granted = got.iter().flatten().count();
    if let (Some(batch), Some(before), Some(after)) = (env.caps().batch, before, after) {
        // A few round trips a chunk (ZooKeeper's are the most: read the queues, create,
        // read back, withdraw the losers, and two more to make missing directories),
        // plus at most one notification registration per grant; seat by seat would be
        // at least one request per seat and its registration.
        let bound = 6 * SEATS.div_ceil(batch) + granted;
        let used = usize::try_from(after - before).unwrap_or(usize::MAX);
        assert!(
            used <= bound,
            "a batch of {SEATS} seats took {used} election requests (at most {bound} with batches of {batch})"
        );
        eprintln!(
            "batch of {SEATS} on {}: {used} election requests",
            env.backend.scheme()
        );
    }
    // A seat b now holds, or the same election twice, refuses the whole batch.
    let free = env.election("batch/free");
    let again = [(elections[0].clone(), cand("b")), (free.clone(), cand("b"))];
    let err = sb.try_campaign_many(&again).await.err().map(|e| e.kind());
    assert_eq!(
        err,
        Some(ErrorKind::InvalidArgument),
        "a batch with a held seat"
    );
    let twice = [(free.clone(), cand("b")), (free.clone(), cand("b"))];
    let err = sb.try_campaign_many(&twice).await.err().map(|e| e.kind());
    assert_eq!(
        err,
        Some(ErrorKind::InvalidArgument),
        "a batch naming a seat twice"
    );
    assert_eq!(
        env.backend.leader(&free).await.expect("leader"),
        None,
        "a refused batch took a seat"
    );
    for l in got.into_iter().flatten() {
        l.resign().await.expect("resign");
    }
}

/// Not a numbered clause but part of the session definition: `resign_many` resigns a
/// batch as `resign` does each seat: every lost signal fires (`Resigned`), every seat is
/// free afterwards or granted to its waiter with a greater token, a store that declares
/// [`Capabilities::batch`] releases them in round trips, not seat by seat; a leadership
/// of another session in the batch is resigned through its own session.
pub async fn check_batch_resign(env: &Env) {
    const SEATS: usize = 24;
    let (sa, sb) = (env.session().await, env.session().await);
    let elections: Vec<ElectionName> = (0..SEATS)
        .map(|i| env.election(&format!("resign-batch/{i:02}")))
        .collect();
    let seats: Vec<(ElectionName, Candidate)> =
        elections.iter().map(|e| (e.clone(), cand("a"))).collect();
    let held: Vec<Leadership> = sa
        .try_campaign_many(&seats)
        .await
        .expect("try_campaign_many")
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.unwrap_or_else(|| panic!("free seat {i} not granted")))
        .collect();
    let watches: Vec<LeadershipWatch> = held.iter().map(Leadership::watch).collect();
    let first_token = held[0].token();
    let waiter = {
        let (sb, e) = (sb.clone(), elections[0].clone());
        tokio::spawn(async move { campaign(&sb, &e, &cand("b")).await })
    };
    let foreign_seat = env.election("resign-batch/foreign");
    let foreign = campaign(&sb, &foreign_seat, &cand("b")).await;
    let foreign_watch = foreign.watch();
    let mut batch = held;
    batch.push(foreign);
    // The waiter queues beside the foreign campaign: its requests are not the batch's.
    let before = env.quiet_election_requests().await;
    sa.resign_many(batch).await.expect("resign_many");
    let after = env.backend.election_requests();
    for (i, w) in watches.iter().chain([&foreign_watch]).enumerate() {
        assert!(!w.is_leader(), "seat {i}: still leading after resign_many");
        assert_eq!(w.loss_reason(), Some(LossReason::Resigned), "seat {i}");
    }
    let next = within(env.timing.ttl, "the waiter of a resigned seat", waiter)
        .await
        .expect("waiter task");
    assert!(
        next.token() > first_token,
        "the waiter's token must be greater"
    );
    for (i, election) in elections
        .iter()
        .enumerate()
        .skip(1)
        .chain([(SEATS, &foreign_seat)])
    {
        let leader = env.backend.leader(election).await.expect("leader");
        assert_eq!(leader, None, "seat {i}: not free after resign_many");
    }
    if let (Some(batch), Some(before), Some(after)) = (env.caps().batch, before, after) {
        // One round trip a chunk, the foreign seat's own resign, and slack for the
        // waiter's wake-up.
        let bound = 2 * SEATS.div_ceil(batch) + 3;
        let used = usize::try_from(after - before).unwrap_or(usize::MAX);
        assert!(
            used <= bound,
            "resigning {SEATS} seats took {used} election requests (at most {bound} with batches of {batch})"
        );
    }
    next.resign().await.expect("resign");
}
