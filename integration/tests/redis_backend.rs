//! What the Redis backend promises beyond the shared suite, against a real Redis (one
//! server per test, or the one named by `TENURE_TEST_REDIS`): answers stay in step after
//! a connection lost bytes, one renewal call for many elections, tokens above a lost or
//! lagging counter, failover at the TTL without keyspace notifications, waiters and
//! observers that converge after pub/sub messages were lost, one wake-up per release across
//! processes, and passwords kept out of logs; and for priorities (clause 14): a holder
//! that missed its preemption notice hears of it at its next renewal or once its link
//! heals, a preempted holder that campaigns again queues behind the preferred
//! candidate, a campaign given up leaves the queue at once, and the queue keeps its
//! order in Redis.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tenure_core::{
    Backend, Candidate, DynBackend, ElectionName, ErrorKind, Leadership, LossReason, Session,
    Timing,
};
use tenure_integration::cluster_faults::{spawn_campaign, wait_grant, Waiter};
use tenure_integration::membership::name;
use tenure_integration::redis_admin::{backend, cmd, command_calls, connect, reset_stats, stat};
use tenure_integration::{run_prefix, timing_ms, RedisServer, TcpProxy};
use tenure_redis::RedisBackend;

#[path = "support/capture.rs"]
mod capture;
use capture::Captured;

fn timing(ttl: Duration) -> Timing {
    let mut t = Timing::from_ttl(ttl);
    t.connect_timeout = Duration::from_secs(1);
    t
}

fn cand(id: &str) -> Candidate {
    Candidate::with_value(id, format!("value-of-{id}")).expect("candidate")
}

async fn session(b: &RedisBackend, t: &Timing) -> Session {
    Session::open(Arc::new(b.clone()) as DynBackend, t.clone())
        .await
        .expect("session")
}

/// Two sessions on `b`: the first leads `e` as `a`, the second waits for it as `b`.
async fn held_and_waited(
    b: &RedisBackend,
    t: &Timing,
    e: &ElectionName,
) -> (Session, Leadership, Waiter) {
    let (sa, sb) = (session(b, t).await, session(b, t).await);
    let a = sa.campaign(e, &cand("a")).await.expect("campaign");
    (sa, a, spawn_campaign(sb, e, cand("b")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_stay_in_step_after_the_link_lost_bytes() {
    let server = RedisServer::start().await.expect("redis");
    let direct = backend(server.endpoint(), "").await;
    let t = timing(Duration::from_secs(10));
    let holders = session(&direct, &t).await;
    let mut held = Vec::new();
    for i in 0..6 {
        let e = name(&format!("step/{i}"));
        held.push(
            holders
                .campaign(&e, &cand(&format!("holder-{i}")))
                .await
                .expect("campaign"),
        );
    }
    let proxy = TcpProxy::start(server.addr()).await.expect("proxy");
    let victim = backend(&server.endpoint_at(proxy.addr()), "").await;
    assert_eq!(
        victim
            .leader(&name("step/0"))
            .await
            .expect("read")
            .map(|l| l.id),
        Some("holder-0".to_string())
    );
    // Requests sent into the black hole get no answer...
    proxy.blackhole().await.expect("blackhole");
    for i in 0..3 {
        let err = victim
            .leader(&name(&format!("step/{i}")))
            .await
            .expect_err("no answer through a black hole");
        assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    }
    proxy.heal().await.expect("heal");
    // ...and once the link heals, every answer belongs to its own request.
    for round in 0..3 {
        for i in (0..6).rev() {
            let got = victim
                .leader(&name(&format!("step/{i}")))
                .await
                .expect("read after heal");
            assert_eq!(
                got.map(|l| l.id),
                Some(format!("holder-{i}")),
                "round {round}: the answer to another request"
            );
        }
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_renewal_call_per_interval_whatever_the_number_of_elections() {
    let server = RedisServer::start().await.expect("redis");
    server.require_local("it counts the script calls of the whole server");
    let b = backend(server.endpoint(), "&poll_interval_ms=60000").await;
    let mut raw = connect(server.endpoint()).await;
    let mut t = timing(Duration::from_secs(4));
    t.renew_interval = Duration::from_millis(200);
    for n in [1usize, 100, 2000] {
        let s = session(&b, &t).await;
        let me = cand("many");
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            held.push(
                s.campaign(&name(&format!("renew-{n}/{i:05}")), &me)
                    .await
                    .expect("campaign"),
            );
        }
        // Each seat's follow loop reads its election once after subscribing: not a
        // renewal.
        tokio::time::sleep(Duration::from_millis(500)).await;
        reset_stats(&mut raw).await;
        let window = Duration::from_millis(1000);
        tokio::time::sleep(window).await;
        let calls = command_calls(&mut raw)
            .await
            .get("evalsha")
            .copied()
            .unwrap_or(0);
        let intervals = (window.as_millis() / t.renew_interval.as_millis()) as u64;
        eprintln!("{n} elections: {calls} renewal calls in {window:?} ({intervals} intervals)");
        assert!(
            (intervals.saturating_sub(1)..=intervals + 1).contains(&calls),
            "{n} elections: {calls} calls in {intervals} renew intervals"
        );
        assert!(held.iter().all(|l| l.is_leader()));
        s.close().await.expect("close");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_continue_above_a_lost_or_lagging_counter() {
    let server = RedisServer::start().await.expect("redis");
    let b = backend(server.endpoint(), "").await;
    let mut raw = connect(server.endpoint()).await;
    let t = timing(Duration::from_secs(10));
    let s = session(&b, &t).await;
    let e = name("reborn");
    let counter = format!("{}:token:reborn", run_prefix());
    let mut last = 0u64;
    for round in 0..4 {
        let l = s.campaign(&e, &cand("a")).await.expect("campaign");
        let token = l.token().get();
        assert!(token > last, "round {round}: {token} after {last}");
        // Tokens follow the server clock: microseconds since 1970.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_millis() as u64;
        assert!(
            token / 1000 <= now_ms + 1000,
            "{token} is ahead of the clock"
        );
        last = token;
        l.resign().await.expect("resign");
        match round {
            // The counter is lost, as after a restart without persistence.
            0 => {
                cmd::<()>(&mut raw, &["DEL", &counter]).await;
            }
            // The counter lags, as on a replica that missed the last writes.
            1 => {
                cmd::<()>(&mut raw, &["SET", &counter, &(last - 5).to_string()]).await;
            }
            _ => {}
        }
    }
    // Grants in quick succession, with the counter lost after every other one (within
    // the same millisecond as the last grant, at times), still increase.
    let mut tokens = vec![last];
    for i in 0..40 {
        let l = s
            .try_campaign(&e, &cand("a"))
            .await
            .expect("try")
            .expect("free");
        tokens.push(l.token().get());
        l.resign().await.expect("resign");
        if i % 2 == 0 {
            cmd::<()>(&mut raw, &["DEL", &counter]).await;
        }
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_failover_follows_the_ttl_not_the_poll_interval() {
    let server = RedisServer::start().await.expect("redis");
    // Waiters look at least every 5 s; the seat expires after 1 s.
    let b = backend(server.endpoint(), "&poll_interval_ms=5000").await;
    let t = timing(Duration::from_secs(1));
    let e = name("crash/ttl");
    let (sa, a, waiter) = held_and_waited(&b, &t, &e).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crashed = tokio::time::Instant::now();
    sa.abandon();
    let (granted, _sb) = wait_grant(waiter, Duration::from_secs(3), "failover within 3 s").await;
    let gap = granted.granted_at() - crashed;
    eprintln!("crash failover with TTL {:?}: {gap:?}", t.ttl);
    assert!(gap <= t.ttl + Duration::from_millis(150), "{gap:?}");
    assert!(a.lost_at().is_some_and(|at| at <= granted.granted_at()));
    assert!(granted.token() > a.token());
}

/// Pub/sub is fire and forget: a subscriber whose link is down misses what is published
/// meanwhile. Its waiters and observers do not poll; the re-subscription wakes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_and_observers_converge_after_messages_lost_to_a_broken_link() {
    let server = RedisServer::start().await.expect("redis");
    // The waiter and the observer reach Redis through a proxy, the holder directly;
    // neither backend looks by itself within the test.
    let direct = backend(server.endpoint(), "&poll_interval_ms=60000").await;
    let proxy = TcpProxy::start(server.addr()).await.expect("proxy");
    let cut_off = backend(&server.endpoint_at(proxy.addr()), "&poll_interval_ms=60000").await;
    let t = timing(Duration::from_secs(20));
    let e = name("lost");
    let sa = session(&direct, &t).await;
    let a = sa.campaign(&e, &cand("a")).await.expect("campaign");
    let waiter = spawn_campaign(session(&cut_off, &t).await, &e, cand("b"));
    let mut observed = cut_off.observe(&e).await.expect("observe");
    let first = observed.next().await.expect("item").expect("state");
    assert_eq!(first.map(|l| l.id), Some("a".into()));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The release is published while the subscriber is cut off: nobody hears it.
    proxy.cut().await.expect("cut");
    a.resign().await.expect("resign");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted through a cut link");
    let healed = Instant::now();
    proxy.heal().await.expect("heal");
    let (granted, _sb) = wait_grant(
        waiter,
        Duration::from_secs(5),
        "the waiter looked again after the re-subscription",
    )
    .await;
    eprintln!(
        "waiter granted {:?} after the link healed",
        healed.elapsed()
    );
    assert!(healed.elapsed() < Duration::from_secs(3));
    // The observer converges on the new holder (it may or may not see the gap, or an
    // error while cut off).
    tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            let state = observed.next().await.expect("item");
            if state.is_ok_and(|s| s.is_some_and(|l| l.id == "b" && l.token == granted.token())) {
                break;
            }
        }
    })
    .await
    .expect("observer converged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_waiter_across_processes() {
    let server = RedisServer::start().await.expect("redis");
    let t = timing(Duration::from_secs(10));
    let e = name("herd");
    // Each backend has its own connections and subscriber, like a separate process.
    let holder_backend = backend(server.endpoint(), "&poll_interval_ms=30000").await;
    let holder = session(&holder_backend, &t).await;
    let a = holder.campaign(&e, &cand("a")).await.expect("campaign");
    let mut backends = Vec::new();
    let (granted_tx, mut granted_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let b = backend(server.endpoint(), "&poll_interval_ms=30000").await;
        let s = session(&b, &t).await;
        backends.push(b);
        let (e, tx) = (e.clone(), granted_tx.clone());
        tasks.push(tokio::spawn(async move {
            let l = s
                .campaign(&e, &cand(&format!("w{i}")))
                .await
                .expect("campaign");
            let _ = tx.send(i);
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop((l, s));
        }));
        // Queue in a known order.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let count = |bs: &[RedisBackend]| -> u64 {
        bs.iter().map(|b| b.election_requests().unwrap_or(0)).sum()
    };
    let before = count(&backends);
    let t0 = Instant::now();
    a.resign().await.expect("resign");
    let first = tokio::time::timeout(Duration::from_secs(2), granted_rx.recv())
        .await
        .expect("a waiter granted")
        .expect("sender");
    let handover = t0.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = count(&backends);
    eprintln!(
        "handover to waiter {first} of 6 (separate backends): {handover:?}, {} waiter requests",
        after - before
    );
    assert_eq!(first, 0, "the first in line is woken");
    assert!(
        granted_rx.try_recv().is_err(),
        "a second waiter was granted"
    );
    // The woken waiter only: its wake-up, its acquire, and its unsubscribe.
    assert!(
        after - before <= 3,
        "{} requests by waiters",
        after - before
    );
    for task in tasks {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_handover_of_a_new_backend_is_prompt() {
    let server = RedisServer::start().await.expect("redis");
    let t = timing(Duration::from_secs(10));
    let mut gaps = Vec::new();
    for round in 0..3 {
        // A new backend opens its subscriber connection for the first waiter.
        let b = backend(server.endpoint(), "&poll_interval_ms=30000").await;
        let e = name(&format!("first/{round}"));
        let (_sa, a, waiter) = held_and_waited(&b, &t, &e).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = tokio::time::Instant::now();
        a.resign().await.expect("resign");
        let (granted, _sb) = wait_grant(waiter, Duration::from_secs(5), "granted").await;
        gaps.push(granted.granted_at() - t0);
    }
    gaps.sort();
    eprintln!("first handovers: {gaps:?}");
    assert!(gaps[1] < Duration::from_millis(25), "{gaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_backend_keeps_its_connections() {
    let server = RedisServer::start().await.expect("redis");
    server.require_local("it counts the connections of the whole server");
    let mut raw = connect(server.endpoint()).await;
    let b = backend(server.endpoint(), "").await;
    let t = timing(Duration::from_secs(1));
    let e = name("idle");
    let (_sa, _a, waiter) = held_and_waited(&b, &t, &e).await;
    let _observed = b.observe(&e).await.expect("observe");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = stat(&mut raw, "total_connections_received").await;
    // Renewals and pings of the subscriber.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = stat(&mut raw, "total_connections_received").await;
    assert_eq!(
        after, before,
        "the backend opened new connections while idle"
    );
    waiter.abort();
}

#[tokio::test(flavor = "current_thread")]
async fn passwords_never_reach_logs_debug_or_errors() {
    let server = RedisServer::start().await.expect("redis");
    server.require_local("it sets a password on the server");
    let secret = "Sup3r-S3cret-pw";
    let mut raw = connect(server.endpoint()).await;
    let (captured, _guard) = Captured::install_default();
    let base = server.endpoint().trim_start_matches("redis://").to_string();
    let right = format!("redis://:{secret}@{base}?prefix=pw");
    // Without a password, then with the wrong and the right one.
    let unauthenticated = format!("redis://{base}?prefix=pw");
    cmd::<()>(&mut raw, &["CONFIG", "SET", "requirepass", secret]).await;
    let err = RedisBackend::from_url(&unauthenticated)
        .await
        .expect_err("no password");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let wrong = format!("redis://:{secret}-wrong@{base}");
    let err = RedisBackend::from_url(&wrong)
        .await
        .expect_err("wrong password");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    let ok = RedisBackend::from_url(&right)
        .await
        .expect("right password");
    let s = session(&ok, &timing(Duration::from_secs(2))).await;
    let l = s
        .campaign(&name("pw/e"), &cand("a"))
        .await
        .expect("campaign");
    l.resign().await.expect("resign");
    s.close().await.expect("close");
    let text = format!(
        "{}\n{err}\n{err:?}\n{ok:?}\n{}\n{:?}",
        captured.text(),
        ok.config(),
        ok.config()
    );
    assert!(
        text.contains("connected to Redis"),
        "nothing was logged: {text}"
    );
    assert!(!text.contains(secret), "the password leaked:\n{text}");
}

fn ranked(id: &str, priority: i32) -> Candidate {
    cand(id).with_priority(priority).expect("priority")
}

/// Clause 14: a holder cut off from Redis when a higher priority joins is told once its
/// requests get through again (before its deadline), then steps down to the newcomer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_when_preempted_is_told_once_its_link_heals() {
    let server = RedisServer::start().await.expect("redis");
    let direct = backend(server.endpoint(), "").await;
    let proxy = TcpProxy::start(server.addr()).await.expect("proxy");
    let victim = backend(&server.endpoint_at(proxy.addr()), "").await;
    let t = timing_ms(4000, 200, 2400, 1000);
    let e = name("cut-off");
    let sa = session(&victim, &t).await;
    let a = sa.campaign(&e, &ranked("a", 0)).await.expect("campaign");
    let sb = session(&direct, &t).await;
    proxy.blackhole().await.expect("blackhole");
    let waiter = spawn_campaign(sb, &e, ranked("b", 3));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(a.loss_reason(), None, "told through a black hole");
    assert!(a.is_leader());
    proxy.heal().await.expect("heal");
    let healed = Instant::now();
    let reason = tokio::time::timeout(Duration::from_millis(2000), a.lost_wait())
        .await
        .expect("told once the link healed");
    eprintln!("cut-off holder told {:?} after the heal", healed.elapsed());
    assert_eq!(reason, LossReason::Preempted);
    let (granted, _sb) = wait_grant(waiter, Duration::from_secs(3), "newcomer granted").await;
    assert!(a.lost_at().is_some_and(|at| at <= granted.granted_at()));
    assert!(granted.token() > a.token());
}

/// Clause 14: a preempted holder that campaigns again at once (as `LeaderRunner` does)
/// does not take the seat back while it is free between its release and the preferred
/// candidate's grant: the seat is kept for the waiter woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_holder_campaigning_again_queues_behind_the_newcomer() {
    let server = RedisServer::start().await.expect("redis");
    let b = backend(server.endpoint(), "&poll_interval_ms=30000").await;
    let t = timing(Duration::from_secs(10));
    for round in 0..5 {
        let e = name(&format!("again/{round}"));
        let (sa, sb) = (session(&b, &t).await, session(&b, &t).await);
        let a = sa.campaign(&e, &ranked("a", 1)).await.expect("campaign");
        let newcomer = spawn_campaign(sb, &e, ranked("b", 2));
        assert_eq!(a.lost_wait().await, LossReason::Preempted);
        let again = spawn_campaign(sa, &e, ranked("a", 1));
        let (granted, _sb) = wait_grant(newcomer, Duration::from_secs(2), "newcomer").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !again.is_finished(),
            "round {round}: the preempted holder barged"
        );
        assert!(granted.is_leader());
        let token = granted.token();
        granted.resign().await.expect("resign");
        let (back, _sa) = wait_grant(again, Duration::from_secs(2), "back to a").await;
        assert!(back.token() > token);
        back.resign().await.expect("resign");
    }
}

/// Clause 14: a waiter that stops waiting (its campaign dropped) leaves the queue at
/// once, so a preemption it caused ends with the next waiter in order, without waiting
/// for its place to expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_given_up_leaves_the_queue() {
    let server = RedisServer::start().await.expect("redis");
    let b = backend(server.endpoint(), "&poll_interval_ms=30000").await;
    let t = timing(Duration::from_secs(10));
    let e = name("given-up");
    let (sa, sb, sc) = (
        session(&b, &t).await,
        session(&b, &t).await,
        session(&b, &t).await,
    );
    let a = sa
        .campaign(&e, &cand("a").never_preempted())
        .await
        .expect("campaign");
    let low = spawn_campaign(sc, &e, ranked("c", 0));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let high = spawn_campaign(sb, &e, ranked("b", 9));
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The live records as the engine reads them: a given-up candidacy is deleted by
    // its withdrawal, or counts as dead once its dropped session is closed (whichever
    // comes first; a dead record stays in the hash until a write clears it).
    let prims = b.primitives();
    let live = || async {
        let snap = prims.read(&e).await.expect("read");
        snap.records.iter().filter(|r| r.live).count()
    };
    assert_eq!(live().await, 3, "the holder and two waiters");
    high.abort();
    tokio::time::timeout(Duration::from_secs(2), async {
        while live().await != 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the given-up campaign left the queue");
    assert!(a.is_leader(), "a holder that opted out was preempted");
    let t0 = Instant::now();
    a.resign().await.expect("resign");
    let (granted, _sc) = wait_grant(low, Duration::from_secs(2), "the next waiter").await;
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(granted.candidate().id(), "c");
}
