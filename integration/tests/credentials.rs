//! Passwords never appear in `Debug`, `Display`, error messages (with their sources) or
//! tracing output, for etcd, Redis, ZooKeeper and PostgreSQL: configs parsed from URLs
//! with credentials, bad URLs that carry a password, failed connections (nothing
//! listening, wrong password against a real server) and a real session with
//! credentials, all while a subscriber records every tracing event at TRACE level from
//! every crate.

use std::time::Duration;

use tenure_core::Error;
use tenure_etcd::{EtcdBackend, EtcdConfig};
use tenure_integration::cluster_faults::elect_and_resign;
use tenure_integration::{free_port, start_with_passwords, PostgresServer, ZooKeeperServer};
use tenure_postgres::{PostgresBackend, PostgresConfig};
use tenure_redis::{RedisBackend, RedisConfig};
use tenure_zookeeper::ZooKeeperConfig;

#[path = "support/capture.rs"]
mod capture;
use capture::Captured;

/// The secrets; letters and digits only, so they read the same percent-encoded.
const ETCD_SECRET: &str = "EtcdS3cretXq7";
const REDIS_SECRET: &str = "RedisS3cretZk4";
const ZK_SECRET: &str = "ZooS3cretWv9";
const PG_SECRET: &str = "PgS3cretMn2";
const SECRETS: [&str; 4] = [ETCD_SECRET, REDIS_SECRET, ZK_SECRET, PG_SECRET];

/// An error with its sources, in Display and Debug form.
fn render(e: &Error) -> String {
    let mut s = format!("{e}\n{e:?}");
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!("\n{inner}\n{inner:?}"));
        src = inner.source();
    }
    s
}

fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(
            !text.contains(secret),
            "{what} contains a password:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_stay_out_of_debug_display_errors_and_traces() {
    let captured = Captured::install_global();
    let mut texts: Vec<(String, String)> = Vec::new();
    let closed = format!("127.0.0.1:{}", free_port().expect("port"));

    // Configs with credentials: Debug, Display, and traced both ways.
    let etcd = EtcdConfig::from_url(&format!(
        "etcd://{closed}?username=root&password={ETCD_SECRET}&connect_timeout_ms=500"
    ))
    .expect("etcd config");
    let etcd_userinfo =
        EtcdConfig::from_url(&format!("etcd://root:{ETCD_SECRET}@{closed}")).expect("etcd config");
    let redis = RedisConfig::from_url(&format!(
        "redis://user:{REDIS_SECRET}@{closed}?connect_timeout_ms=500"
    ))
    .expect("redis config");
    let zk = ZooKeeperConfig::from_url(&format!(
        "zk://user:{ZK_SECRET}@{closed}/chroot?connect_timeout=500ms"
    ))
    .expect("zookeeper config");
    let pg = PostgresConfig::from_url(&format!(
        "postgres://app:{PG_SECRET}@{closed}/db?connect_timeout_ms=500"
    ))
    .expect("postgres config");
    let pg_param = PostgresConfig::from_url(&format!(
        "postgresql://{closed}?username=app&password={PG_SECRET}&sslmode=verify-full&ca=/ca.pem"
    ))
    .expect("postgres config");
    for (what, debug_text, display_text) in [
        ("etcd config", format!("{etcd:?}"), etcd.to_string()),
        (
            "etcd config (user info)",
            format!("{etcd_userinfo:?}"),
            etcd_userinfo.to_string(),
        ),
        ("redis config", format!("{redis:?}"), redis.to_string()),
        ("zookeeper config", format!("{zk:?}"), zk.to_string()),
        ("postgres config", format!("{pg:?}"), pg.to_string()),
        (
            "postgres config (parameters)",
            format!("{pg_param:?}"),
            pg_param.to_string(),
        ),
    ] {
        tracing::info!(config.debug = %debug_text, config.display = %display_text, "{what}");
        texts.push((what.to_owned(), format!("{debug_text}\n{display_text}")));
    }

    // Bad URLs that carry a password, and nothing listening: the connection errors.
    for (what, result) in [
        (
            "etcd bad url",
            EtcdConfig::from_url(&format!(
                "etcd://root:{ETCD_SECRET}@127.0.0.1:99999?bogus=1"
            ))
            .map(drop),
        ),
        (
            "etcd bad parameter",
            EtcdConfig::from_url(&format!(
                "etcd://127.0.0.1:2379?password={ETCD_SECRET}&bogus=1"
            ))
            .map(drop),
        ),
        (
            "redis bad url",
            RedisConfig::from_url(&format!("redis://u:{REDIS_SECRET}@127.0.0.1:99999")).map(drop),
        ),
        (
            "redis bad parameter",
            RedisConfig::from_url(&format!("redis://u:{REDIS_SECRET}@127.0.0.1?bogus=1")).map(drop),
        ),
        (
            "zookeeper bad url",
            ZooKeeperConfig::from_url(&format!("zk://u:{ZK_SECRET}@127.0.0.1:2181/bad//chroot"))
                .map(drop),
        ),
        (
            "postgres bad url",
            PostgresConfig::from_url(&format!("postgres://u:{PG_SECRET}@127.0.0.1:99999"))
                .map(drop),
        ),
        (
            "postgres bad parameter",
            PostgresConfig::from_url(&format!(
                "postgres://127.0.0.1?password={PG_SECRET}&bogus=1"
            ))
            .map(drop),
        ),
        (
            "postgres sslmode refused",
            PostgresConfig::from_url(&format!(
                "postgres://u:{PG_SECRET}@127.0.0.1?sslmode=require"
            ))
            .map(drop),
        ),
        ("etcd unreachable", etcd.clone().connect().await.map(drop)),
        ("redis unreachable", redis.clone().connect().await.map(drop)),
        (
            "zookeeper unreachable",
            zk.clone().connect().await.map(drop),
        ),
        ("postgres unreachable", pg.clone().connect().await.map(drop)),
    ] {
        let e = result.expect_err(what);
        texts.push((what.to_owned(), render(&e)));
    }

    // Real servers: a wrong password is refused, the right one works.
    let (redis_server, etcd_server) = start_with_passwords(REDIS_SECRET, ETCD_SECRET).await;
    let zk_server = ZooKeeperServer::start().await.expect("zookeeper");
    let pg_server = PostgresServer::start().await.expect("postgres");
    pg_server.require_local("it sets a password");
    pg_server
        .require_password("app", PG_SECRET)
        .await
        .expect("postgres password");
    let p = format!("{}/{}", pg_server.addr(), PostgresServer::DATABASE);
    let (r, e, z) = (
        redis_server.addr(),
        etcd_server.addr(),
        zk_server.endpoint().to_owned(),
    );
    let (wrong_redis, wrong_etcd) = (format!("{REDIS_SECRET}x"), format!("{ETCD_SECRET}x"));
    let wrong_pg = format!("{PG_SECRET}x");
    for (what, result) in [
        (
            "redis wrong password",
            RedisBackend::from_url(&format!("redis://:{wrong_redis}@{r}"))
                .await
                .map(drop),
        ),
        (
            "etcd wrong password",
            EtcdBackend::from_url(&format!("etcd://root:{wrong_etcd}@{e}"))
                .await
                .map(drop),
        ),
        (
            "postgres wrong password",
            PostgresBackend::from_url(&format!("postgres://app:{wrong_pg}@{p}"))
                .await
                .map(drop),
        ),
        (
            "postgres no password",
            PostgresBackend::from_url(&format!("postgres://app@{p}"))
                .await
                .map(drop),
        ),
    ] {
        texts.push((what.to_owned(), render(&result.expect_err(what))));
    }
    // A connected backend holds the password: its Debug shows none.
    let pg_backend = PostgresBackend::from_url(&format!("postgres://app:{PG_SECRET}@{p}"))
        .await
        .expect("postgres with the right password");
    texts.push(("postgres backend".to_owned(), format!("{pg_backend:?}")));
    drop(pg_backend);
    for (what, url) in [
        ("redis", format!("redis://:{REDIS_SECRET}@{r}")),
        ("etcd", format!("etcd://root:{ETCD_SECRET}@{e}")),
        ("zk", format!("zk://user:{ZK_SECRET}@{z}/credentials")),
        ("postgres", format!("postgres://app:{PG_SECRET}@{p}")),
        (
            "postgres-parameter",
            format!("postgres://{p}?username=app&password={PG_SECRET}&schema=by_param"),
        ),
    ] {
        let backend = tenure::connect(&url).await;
        let backend = backend.unwrap_or_else(|e| panic!("{what} with the right password: {e}"));
        elect_and_resign(backend, Duration::from_secs(2), what).await;
    }

    for (what, text) in &texts {
        assert_clean(what, text);
    }
    let log = captured.text();
    assert!(
        log.contains("redis config") && log.lines().count() > 10,
        "the subscriber recorded nothing:\n{log}"
    );
    // The PostgreSQL backend's own events (its connect event carries the config).
    assert!(
        log.contains("tenure_postgres"),
        "no event of tenure_postgres recorded:\n{log}"
    );
    assert_clean("the tracing output", &log);
}
