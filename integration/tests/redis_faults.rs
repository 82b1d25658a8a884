//! Fault tests against a real Redis with real candidate processes (the `tenure` CLI,
//! whose leader command writes its token to a guarded resource): SIGKILL and SIGSTOP of
//! the holder, SIGSTOP of Redis, a restart of Redis without persistence (data loss), a
//! cut connection, and bad input (unreachable server, wrong password, missing
//! permissions). Each test starts its own Redis.
//!
//! Tests that stop, restart or reconfigure the server need a local one; with
//! `TENURE_TEST_REDIS` set they say so and stop. Run with `--test-threads=2` or fewer on
//! small machines.

use std::time::Duration;

use tenure_core::testing::random_prefix;
use tenure_core::ErrorKind;
use tenure_integration::fault_suite::{self, FaultSpec, Restart};
use tenure_integration::{RedisServer, StoreServer};
use tenure_redis::RedisBackend;

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach Redis at `endpoint`: 1 s timeouts, keys under `prefix`.
fn spec_at(endpoint: &str, prefix: &str) -> FaultSpec {
    let sep = if endpoint.contains('?') { '&' } else { '?' };
    FaultSpec::new(
        format!("{endpoint}{sep}prefix={prefix}&connect_timeout_ms=1000&request_timeout_ms=1000"),
        TTL,
        Duration::from_millis(300),
    )
}

/// How candidates reach Redis at `endpoint`, under a prefix of their own.
fn spec(endpoint: &str) -> FaultSpec {
    spec_at(endpoint, &random_prefix())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_holder_fails_over_within_the_ttl() {
    let redis = RedisServer::start().await.expect("redis");
    fault_suite::sigkill_of_the_holder(&spec(redis.endpoint())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_the_holder_for_two_ttls() {
    let redis = RedisServer::start().await.expect("redis");
    fault_suite::sigstop_of_the_holder(&spec(redis.endpoint())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_of_redis_fires_lost_before_the_ttl() {
    let redis = RedisServer::start().await.expect("redis");
    fault_suite::sigstop_of_the_store(&spec(redis.endpoint()), &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_without_persistence_keeps_tokens_increasing() {
    let mut redis = RedisServer::start().await.expect("redis");
    let spec = spec(redis.endpoint());
    fault_suite::store_restart(&spec, &mut redis, Restart::LosesItsData).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connection_then_the_campaign_goes_on() {
    let redis = RedisServer::start().await.expect("redis");
    let prefix = random_prefix();
    fault_suite::cut_connection(&redis, &|e: &str| spec_at(e, &prefix)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_fails_within_the_connect_timeout() {
    let redis = RedisServer::start().await.expect("redis");
    fault_suite::unreachable_store(&redis, &spec).await;
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
    redis.require_local("it turns authentication on");
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
    // The CLI says it on one line, without the password; the right one works.
    let at = |url: String| FaultSpec::new(url, TTL, Duration::from_millis(300));
    fault_suite::wrong_credentials(
        &[at(format!("redis://:wrong-pw@{host}"))],
        &at(format!("redis://:{password}@{host}")),
        "wrong-pw",
    )
    .await;
}
