//! Membership on a real Redis, beyond the shared suite's clause 13 (one server per test,
//! or the one named by `TENURE_TEST_REDIS` for the tests that need no server of their
//! own): registrations cost the renewal nothing (one script call whatever their number,
//! and they stay alive through it), a crashed member goes at its session's expiry
//! although nothing is published, watchers cost one list per expiry while nothing
//! changes, a watcher's look after a change carries the changed value only, an ended
//! session's members go at once, and foreign and dead entries are not members.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tenure_core::{Backend, Candidate};
use tenure_integration::membership::until_where;
use tenure_integration::membership::{
    crashed_member_goes, ended_session_loses_its_members, member, name, open, pairs,
};
use tenure_integration::redis_admin::{backend, cmd, command_calls, connect, reset_stats, stat};
use tenure_integration::{run_prefix, RedisServer};
use tenure_redis::RedisBackend;

/// A server of the test's own (local where `why` says why it must be) and a backend on
/// it, waiters polling every second.
async fn server(why: Option<&str>) -> (RedisServer, RedisBackend) {
    let server = RedisServer::start().await.expect("redis");
    if let Some(why) = why {
        server.require_local(why);
    }
    let b = backend(server.endpoint(), "&poll_interval_ms=1000").await;
    (server, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_cost_the_renewal_nothing_and_live_through_it() {
    let (server, b) = server(Some("it counts the server's commands")).await;
    let ttl = Duration::from_secs(1);
    let s = open(&b, ttl).await;
    let e = name("renew/held");
    s.try_campaign(&e, &Candidate::new("holder").expect("candidate"))
        .await
        .expect("campaign")
        .expect("a free seat");
    for n in 0..20 {
        for i in 0..10 {
            s.register_member(
                &name(&format!("renew/ns-{n}")),
                &member(&format!("m-{i}"), "x"),
            )
            .await
            .expect("register");
        }
    }
    s.keep_alive().await.expect("keep-alive"); // loads the script
    let mut c = connect(server.endpoint()).await;
    reset_stats(&mut c).await;
    // Renew over twice the TTL: the registrations live only through the renewals.
    let t0 = Instant::now();
    let mut renewals = 0;
    while t0.elapsed() < ttl * 2 {
        s.keep_alive().await.expect("keep-alive");
        renewals += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // One script call per renewal, and inside it only the session's commands (a seat
    // lives while its session does): nothing per registration. (commandstats counts the commands a script
    // runs too.) The session's subscriber connection, opened when it took a seat so
    // that it hears of preemptions, pings the server every second: not a renewal.
    let mut calls = command_calls(&mut c).await;
    calls.remove("ping");
    assert_eq!(
        calls,
        HashMap::from([
            ("evalsha".to_string(), renewals),
            ("get".to_string(), renewals),
            ("pexpire".to_string(), renewals),
        ]),
        "{renewals} renewals of a session with one election and 200 registrations"
    );
    for n in 0..20 {
        let members = b
            .members(&name(&format!("renew/ns-{n}")))
            .await
            .expect("members");
        assert_eq!(members.len(), 10, "namespace {n} after {:?}", t0.elapsed());
    }
    s.close().await.expect("close");
    assert!(b
        .members(&name("renew/ns-0"))
        .await
        .expect("members")
        .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_member_goes_at_its_session_expiry_without_a_message() {
    let (server, b) = server(Some("it counts the server's commands")).await;
    let ttl = Duration::from_secs(1);
    let ns = name("crash/ns");
    let alive = open(&b, ttl).await;
    let keeper = {
        let alive = alive.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                alive.keep_alive().await.expect("keep-alive");
            }
        })
    };
    let mut c = connect(server.endpoint()).await;
    // The crashed session's last renewal is counted; then it goes silent.
    let within = ttl + Duration::from_millis(500);
    let (_w, gone) = crashed_member_goes(&b, &ns, &*alive, ttl, within, reset_stats(&mut c)).await;
    assert!(gone >= ttl - Duration::from_millis(50), "{gone:?}");
    // About a millisecond after the expiry; the margin is for a loaded test machine.
    assert!(gone <= ttl + Duration::from_millis(300), "{gone:?}");
    let calls = command_calls(&mut c).await;
    assert_eq!(calls.get("publish"), None, "{calls:?}");

    // While nothing changes, the watcher lists about once per TTL − renew interval.
    reset_stats(&mut c).await;
    let quiet = Duration::from_secs(3);
    tokio::time::sleep(quiet).await;
    let calls = command_calls(&mut c).await;
    // Only the list script reads the whole hash.
    let lists = calls.get("hgetall").copied().unwrap_or(0);
    eprintln!("{lists} lists in {quiet:?} without a change: {calls:?}");
    assert!((2..=5).contains(&lists), "{calls:?}");
    keeper.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_session_loses_its_members_at_once_and_cannot_register() {
    let (_server, b) = server(None).await;
    let ns = name("ended/ns");
    let s = open(&b, Duration::from_secs(30)).await;
    let other = name("ended/other");
    s.register_member(&other, &member("m", "1"))
        .await
        .expect("register");
    // Told at once, not at the 30 s TTL.
    ended_session_loses_its_members(&b, &ns, &*s, b.expire_session(s.id())).await;
    assert!(b.members(&other).await.expect("members").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_and_dead_entries_are_not_members() {
    let (server, b) = server(None).await;
    let ns = name("foreign/ns");
    let hash = format!("{}:members:foreign/ns", run_prefix());
    let mut c = connect(server.endpoint()).await;
    let dead = "00000000000000000000000000000000\nvalue";
    cmd::<()>(
        &mut c,
        &["HSET", &hash, "no-newline", "plain", "dead", dead],
    )
    .await;
    let s = open(&b, Duration::from_secs(10)).await;
    s.register_member(&ns, &member("live", "v"))
        .await
        .expect("register");
    // A live session's entry under an id tenure would not accept.
    let live = format!("{}\nvalue", s.id());
    cmd::<()>(&mut c, &["HSET", &hash, "bad/id", &live]).await;
    // An entry written before entries carried a version (`session\nvalue`) is read.
    cmd::<()>(&mut c, &["HSET", &hash, "older", &live]).await;
    assert_eq!(
        pairs(&b.members(&ns).await.expect("members")),
        [
            ("live".to_string(), "v".to_string()),
            ("older".to_string(), "value".to_string())
        ]
    );
    // The dead session's entry was deleted by the list; the foreign ones are left.
    let mut fields: Vec<String> = cmd(&mut c, &["HKEYS", &hash]).await;
    fields.sort();
    // (`#v` is the hash's version counter, never a member id.)
    assert_eq!(fields, ["#v", "bad/id", "live", "no-newline", "older"]);
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_reads_only_the_values_that_changed() {
    let (server, b) = server(Some("it counts the bytes the server sends")).await;
    let ns = name("delta/ns");
    let s = open(&b, Duration::from_secs(30)).await;
    let big = "b".repeat(256 * 1024);
    s.register_member(&ns, &member("big", &big))
        .await
        .expect("register big");
    s.register_member(&ns, &member("small", "0"))
        .await
        .expect("register small");
    let mut w = b.watch_members(&ns).await.expect("watch");
    let shows = |v: String| {
        let big = big.clone();
        move |l: &[tenure_core::Member]| {
            l.len() == 2 && l[0].value() == big && l[1].id() == "small" && l[1].value() == v
        }
    };
    until_where(&mut w, "both", Duration::from_secs(10), shows("0".into())).await;
    let mut c = connect(server.endpoint()).await;
    reset_stats(&mut c).await;
    let changes = 20;
    for i in 1..=changes {
        s.register_member(&ns, &member("small", &i.to_string()))
            .await
            .expect("change small");
        let what = format!("small = {i}");
        until_where(&mut w, &what, Duration::from_secs(10), shows(i.to_string())).await;
    }
    let sent = stat(&mut c, "total_net_output_bytes").await;
    // Re-reading every value would send the big one after each change: 5 MiB.
    assert!(
        sent < big.len() as u64,
        "{sent} bytes sent for {changes} changes of a small value beside a {} byte one",
        big.len()
    );
    s.close().await.expect("close");
}
