//! The shared fault scenarios (`fault_suite`) against a real Redis, a restart without
//! persistence (data loss) included, plus wrong passwords and missing permissions.

use std::time::Duration;

use tenure_core::ErrorKind;
use tenure_integration::fault_suite::{self, FaultSpec, Restart, TIMEOUTS};
use tenure_integration::redis_admin::{cmd, connect};
use tenure_integration::RedisServer;
use tenure_redis::RedisBackend;

/// The candidates' session TTL.
const TTL: Duration = Duration::from_secs(2);

/// How candidates reach Redis at `endpoint`: 1 s timeouts, keys under `prefix`.
fn spec_in(endpoint: &str, prefix: &str) -> FaultSpec {
    let url = tenure_integration::with_query(endpoint, &format!("prefix={prefix}&{TIMEOUTS}"));
    FaultSpec::new(url, TTL, Duration::from_millis(300))
}

tenure_integration::fault_tests!(RedisServer::start(), spec_in, restart: Restart::LosesItsData);

/// Runs the command `words` (separated by spaces) on `redis`.
async fn admin(redis: &RedisServer, words: &str) {
    let mut c = connect(redis.endpoint()).await;
    cmd::<redis::Value>(&mut c, &words.split(' ').collect::<Vec<_>>()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_or_missing_permission_is_unauthorized() {
    let redis = RedisServer::start().await.expect("redis");
    redis.require_local("it turns authentication on");
    let host = redis.addr();
    let password = "right-Pa55word";
    // A user who may touch only keys under `other:`, and one who may not run scripts.
    admin(&redis, "ACL SETUSER fenced on >fenced-pw ~other:* &* +@all").await;
    admin(
        &redis,
        "ACL SETUSER noscript on >noscript-pw ~* &* +@all -@scripting",
    )
    .await;
    admin(&redis, &format!("CONFIG SET requirepass {password}")).await;
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
