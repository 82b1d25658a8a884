//! Fault tests against a real Redis with real candidate processes (the `tenure` CLI,
//! whose leader command writes its token to a guarded resource): SIGKILL and SIGSTOP of
//! the holder, SIGSTOP of Redis, a restart of Redis without persistence (data loss), a
//! cut connection, and bad input (unreachable server, wrong password, missing
//! permissions). Each test starts its own Redis.
//!
//! Tests that stop, restart or reconfigure the server need a local one; with
//! `TENURE_TEST_REDIS` set they say so and stop. Run with `--test-threads=2` or fewer on
//! small machines.

use std::process::Command;
use std::time::{Duration, Instant};

use tenure_core::ErrorKind;
use tenure_integration::cli_faults::{
    assert_fenced, assert_no_stale_write_accepted, is, ms, next_leader, spawn_writer, stop_all,
    tenure_bin, wait,
};
use tenure_integration::fault_suite::{self, FaultSpec};
use tenure_integration::{
    check_fencing, monotonic_now_ns, CandidateProcess, Event, FencingViolation, GuardedResource,
    RedisServer, TcpProxy,
};
use tenure_redis::RedisBackend;

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);
/// The CLI's renew interval for that TTL (TTL / 4).
const RENEW_INTERVAL: Duration = Duration::from_millis(500);
/// The CLI's renew deadline for that TTL (TTL × 2/3).
const RENEW_DEADLINE: Duration = Duration::from_millis(1334);
/// How often a leader's command writes its token.
const WRITE_EVERY: Duration = Duration::from_millis(100);

/// The backend URL for candidates: 1 s timeouts, a prefix per test.
fn candidate(
    backend_url: &str,
    election: &str,
    id: &str,
    resource: &GuardedResource,
) -> CandidateProcess {
    spawn_writer(backend_url, election, id, TTL, resource, WRITE_EVERY)
}

fn url(endpoint: &str, prefix: &str) -> String {
    let sep = if endpoint.contains('?') { '&' } else { '?' };
    format!("{endpoint}{sep}prefix={prefix}&connect_timeout_ms=1000&request_timeout_ms=1000")
}

/// `endpoint` with the server's address replaced by `proxy`.
fn via(endpoint: &str, server: &RedisServer, proxy: &TcpProxy) -> String {
    endpoint.replacen(&server.addr().to_string(), &proxy.addr().to_string(), 1)
}

/// Whether `server` can be stopped and reconfigured; says why not otherwise.
fn local(server: &RedisServer, test: &str) -> bool {
    if server.is_external() {
        eprintln!(
            "{test}: not run: it stops or reconfigures the server, and {} names an external one",
            RedisServer::ENV
        );
        return false;
    }
    true
}

/// The shared fault scenarios' settings for this store (a key prefix per test).
fn spec(redis: &RedisServer, prefix: &str) -> FaultSpec {
    FaultSpec::new(
        url(redis.endpoint(), prefix),
        TTL,
        Duration::from_millis(300),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_the_ttl() {
    let redis = RedisServer::start().await.expect("redis");
    let spec = spec(&redis, "faults-kill");
    fault_suite::sigkill_of_the_holder(&spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_for_two_ttls() {
    let redis = RedisServer::start().await.expect("redis");
    let spec = spec(&redis, "faults-stop-holder");
    fault_suite::sigstop_of_the_holder(&spec).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_redis_fires_lost_before_the_ttl() {
    let redis = RedisServer::start().await.expect("redis");
    fault_suite::sigstop_of_the_store(&spec(&redis, "faults-stop-redis"), &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_keeps_tokens_increasing() {
    let mut redis = RedisServer::start().await.expect("redis");
    if !local(&redis, "restart_without_persistence") {
        return;
    }
    let resource = GuardedResource::start().await.expect("resource");
    let url = url(redis.endpoint(), "faults-restart");
    let election = "faults/restart";
    let a = candidate(&url, election, "a", &resource);
    let b = candidate(&url, election, "b", &resource);
    let (first, elected) = next_leader(&[&a, &b], 0, Duration::from_secs(10)).await;
    let holder = [&a, &b][first];
    let old_token = elected.token.expect("token");
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Every key is gone: sessions, the seat and the fencing counter.
    redis.restart().await.expect("restart redis");
    let restarted = monotonic_now_ns();
    let lost = wait(
        holder,
        |e| e.is(Event::LOST) && e.mono_ns > elected.mono_ns,
        RENEW_INTERVAL + Duration::from_secs(2),
    )
    .await;
    let (who, next) = next_leader(&[&a, &b], restarted, TTL * 3).await;
    let new_token = next.token.expect("token");
    eprintln!(
        "Redis restarted without data: old holder lost {:.0} ms after it ({:?}); {} elected after {:.0} ms with token {new_token} (old {old_token})",
        ms(lost.mono_ns.saturating_sub(restarted)),
        lost.reason,
        ["a", "b"][who],
        ms(next.mono_ns.saturating_sub(restarted)),
    );
    // The reborn counter starts from the clock, above every token handed out before.
    assert!(new_token > old_token, "{new_token} after {old_token}");
    // The old holder learns at its next renewal.
    assert!(
        lost.mono_ns <= restarted + (RENEW_INTERVAL + Duration::from_millis(500)).as_nanos() as u64,
        "lost {:.0} ms after the restart",
        ms(lost.mono_ns.saturating_sub(restarted))
    );
    // The resource saw both tokens and took no stale write.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(resource.accepted().iter().any(|w| w.token == new_token));
    assert_no_stale_write_accepted(&resource);
    // Data loss may let the tenures overlap (the documented limit); tokens never go back.
    let logs: Vec<Vec<Event>> = [&a, &b].iter().map(|c| c.events()).collect();
    let violations = check_fencing(&logs);
    for v in &violations {
        match v {
            FencingViolation::Overlap { .. } => eprintln!("overlap after data loss (allowed): {v}"),
            other => panic!("fencing violation: {other}\n{logs:#?}"),
        }
    }
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_then_the_campaign_goes_on() {
    let redis = RedisServer::start().await.expect("redis");
    let resource = GuardedResource::start().await.expect("resource");
    let proxy = TcpProxy::start(redis.addr()).await.expect("proxy");
    let direct = url(redis.endpoint(), "faults-cut");
    let through_proxy = url(&via(redis.endpoint(), &redis, &proxy), "faults-cut");
    let election = "faults/cut";
    let a = candidate(&through_proxy, election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), Duration::from_secs(10)).await;
    let mut b = candidate(&direct, election, "b", &resource);
    wait(&b, is("campaigning"), Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = monotonic_now_ns();
    proxy.cut().await.expect("cut");
    let lost = wait(&a, is(Event::LOST), TTL + Duration::from_secs(1)).await;
    let b_elected = wait(&b, is(Event::ELECTED), TTL * 2).await;
    assert!(lost.mono_ns <= b_elected.mono_ns);
    assert!(lost.mono_ns <= cut + RENEW_DEADLINE.as_nanos() as u64);
    proxy.heal().await.expect("heal");
    // a campaigns again by itself; when b leaves, a leads with a new token.
    tokio::time::sleep(TTL).await;
    b.terminate().await.expect("terminate b");
    let again = wait(
        &a,
        |e| e.is(Event::ELECTED) && e.mono_ns > lost.mono_ns,
        TTL * 3,
    )
    .await;
    eprintln!(
        "cut: lost {:.0} ms after the cut, b elected after {:.0} ms",
        ms(lost.mono_ns - cut),
        ms(b_elected.mono_ns - cut)
    );
    assert!(b_elected.token > a_elected.token);
    assert!(again.token > b_elected.token);
    assert_no_stale_write_accepted(&resource);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_fails_within_the_connect_timeout() {
    let limit = Duration::from_millis(700);
    // Nothing listens: refused at once.
    let port = tenure_integration::free_port().expect("port");
    let started = Instant::now();
    let err = RedisBackend::from_url(&format!(
        "redis://127.0.0.1:{port}?connect_timeout_ms={}",
        limit.as_millis()
    ))
    .await
    .expect_err("nothing listens");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
    // Something accepts but never answers (a black hole): a timeout, not a hang.
    let redis = RedisServer::start().await.expect("redis");
    let proxy = TcpProxy::start(redis.addr()).await.expect("proxy");
    proxy.blackhole().await.expect("blackhole");
    let started = Instant::now();
    let err = RedisBackend::from_url(&format!(
        "{}?connect_timeout_ms={}",
        via(redis.endpoint(), &redis, &proxy),
        limit.as_millis()
    ))
    .await
    .expect_err("black hole");
    let took = started.elapsed();
    assert!(
        matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
        "{err}"
    );
    assert!(took <= limit + Duration::from_millis(300), "took {took:?}");
    // The CLI says it on one line and exits 1.
    let started = Instant::now();
    let out = Command::new(tenure_bin())
        .args([
            "campaign",
            "--backend",
            &format!("redis://127.0.0.1:{port}?connect_timeout_ms=700"),
            "--election",
            "x",
            "--id",
            "a",
        ])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("tenure: unavailable"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

async fn admin(redis: &RedisServer, args: &[&str]) {
    let client = redis::Client::open(redis.endpoint()).expect("client");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("admin connection");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let _: redis::Value = cmd.query_async(&mut c).await.expect("admin command");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_or_missing_permission_is_unauthorized() {
    let redis = RedisServer::start().await.expect("redis");
    if !local(&redis, "wrong_password") {
        return;
    }
    let host = redis.addr();
    let password = "right-Pa55word";
    // A user who may touch only keys under `other:`, and one who may not run scripts.
    admin(
        &redis,
        &[
            "ACL",
            "SETUSER",
            "fenced",
            "on",
            ">fenced-pw",
            "~other:*",
            "&*",
            "+@all",
        ],
    )
    .await;
    admin(
        &redis,
        &[
            "ACL",
            "SETUSER",
            "noscript",
            "on",
            ">noscript-pw",
            "~*",
            "&*",
            "+@all",
            "-@scripting",
        ],
    )
    .await;
    admin(&redis, &["CONFIG", "SET", "requirepass", password]).await;
    for (url, what) in [
        (format!("redis://:wrong-pw@{host}"), "wrong password"),
        (format!("redis://{host}"), "no password"),
        (format!("redis://nobody:wrong-pw@{host}"), "unknown user"),
        (
            format!("redis://fenced:fenced-pw@{host}"),
            "no access to the prefix",
        ),
        (
            format!("redis://noscript:noscript-pw@{host}"),
            "no scripting",
        ),
    ] {
        let err = RedisBackend::from_url(&url).await.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::Unauthorized, "{what}: {err}");
        assert!(!format!("{err} {err:?}").contains("-pw"), "{what}: {err}");
    }
    // The user limited to `other:` works with that prefix.
    RedisBackend::from_url(&format!("redis://fenced:fenced-pw@{host}?prefix=other"))
        .await
        .expect("prefix the user may use");
    // The right password works end to end.
    let backend = RedisBackend::from_url(&format!("redis://:{password}@{host}"))
        .await
        .expect("right password");
    let session = tenure_core::Session::open(
        std::sync::Arc::new(backend),
        tenure_core::Timing::from_ttl(TTL),
    )
    .await
    .expect("session");
    let election = tenure_core::ElectionName::new("auth/check").expect("name");
    let l = session
        .campaign(&election, &tenure_core::Candidate::new("a").expect("id"))
        .await
        .expect("campaign");
    l.resign().await.expect("resign");
    session.close().await.expect("close");
    // The CLI says it on one line, without the password, and exits 1.
    let out = Command::new(tenure_bin())
        .args([
            "campaign",
            "--backend",
            &format!("redis://:wrong-pw@{host}"),
            "--election",
            "x",
            "--id",
            "a",
        ])
        .output()
        .expect("run tenure");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("tenure: unauthorized"), "{stderr}");
    assert!(!stderr.contains("wrong-pw"), "{stderr}");
}
