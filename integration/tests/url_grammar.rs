//! One URL grammar for every backend: the same inputs give the same outcome on etcd,
//! Redis, ZooKeeper, Azure, PostgreSQL, peer and mem (`tenure_core::backend::config`). Parsing
//! only: nothing connects.

use tenure_core::{ErrorKind, MemoryBackend, Result};
use tenure_integration::with_query;

/// A backend's parser and a URL it accepts.
struct Backend {
    name: &'static str,
    base: &'static str,
    parse: fn(&str) -> Result<String>,
}

fn backends() -> Vec<Backend> {
    fn debug<T: std::fmt::Debug>(r: Result<T>) -> Result<String> {
        r.map(|c| format!("{c:?}"))
    }
    fn b(name: &'static str, base: &'static str, parse: fn(&str) -> Result<String>) -> Backend {
        Backend { name, base, parse }
    }
    let peer = "peer://127.0.0.1:7001?id=1&peers=1@127.0.0.1:7001";
    vec![
        b("etcd", "etcd://127.0.0.1:2379", |u| {
            debug(tenure_etcd::EtcdConfig::from_url(u))
        }),
        b("redis", "redis://127.0.0.1:6379", |u| {
            debug(tenure_redis::RedisConfig::from_url(u))
        }),
        b("zk", "zk://127.0.0.1:2181", |u| {
            debug(tenure_zookeeper::ZooKeeperConfig::from_url(u))
        }),
        b("azblob", "azblob://devstoreaccount1/elections", |u| {
            debug(tenure_azure::AzureConfig::from_url(u))
        }),
        b("postgres", "postgres://127.0.0.1:5432", |u| {
            debug(tenure_postgres::PostgresConfig::from_url(u))
        }),
        b("peer", peer, |u| {
            debug(tenure_peer::PeerConfig::from_url(u))
        }),
        b("mem", "mem://store", |u| debug(MemoryBackend::from_url(u))),
    ]
}

/// `base` as its scheme, its authority and what follows.
fn parts(base: &str) -> (&str, &str, &str) {
    let (scheme, rest) = base.split_once("://").unwrap();
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    (scheme, &rest[..end], &rest[end..])
}

/// `base` with its authority replaced.
fn with_authority(base: &str, authority: &str) -> String {
    let (scheme, _, tail) = parts(base);
    format!("{scheme}://{authority}{tail}")
}

#[test]
fn every_backend_accepts_its_url_and_an_upper_case_scheme() {
    for b in backends() {
        (b.parse)(b.base).unwrap_or_else(|e| panic!("{}: {e}", b.name));
        let (scheme, rest) = b.base.split_once("://").unwrap();
        let upper = format!("{}://{rest}", scheme.to_ascii_uppercase());
        (b.parse)(&upper).unwrap_or_else(|e| panic!("{}: {upper}: {e}", b.name));
    }
}

#[test]
fn the_same_bad_input_fails_the_same_way_everywhere() {
    for b in backends() {
        let unknown = "url: unknown parameter \"no such\"";
        let in_query = [
            ("x=%zz", "url: x: '%' must be followed by two hex digits"),
            ("%4=1", "url: parameter name: '%'"),
            ("x=%ff", "url: x: not UTF-8 after decoding"),
            ("no+such=1", unknown),
            ("no%20such=1", unknown),
            ("dup=1&dup=2", "url: parameter \"dup\" is given twice"),
        ];
        let empty_host = "url: empty host in the host list";
        let in_authority = [
            ("a:1,,b:2", empty_host),
            ("a:1,", empty_host),
            ("a b:1", "is not allowed in a host"),
        ];
        let mut cases: Vec<(String, &str)> =
            in_query.map(|(q, e)| (with_query(b.base, q), e)).into();
        cases.extend(in_authority.map(|(a, e)| (with_authority(b.base, a), e)));
        let fragment = "url: a #fragment is not supported";
        cases.push((format!("{}#frag", b.base), fragment));
        let (_, host, tail) = parts(b.base);
        cases.push((format!("nope://{host}{tail}"), "url: unknown scheme"));
        for (url, expected) in cases {
            let outcome = if expected == "url: unknown scheme" {
                // A scheme no backend has: the scheme table answers.
                futures::executor::block_on(tenure_core::backend::connect_with(
                    &[tenure_etcd::DRIVER, tenure_core::MEM_DRIVER],
                    &url,
                ))
                .map(|_| String::new())
            } else {
                (b.parse)(&url)
            };
            let e = outcome.expect_err(&url);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{}: {url}", b.name);
            assert!(
                e.message().contains(expected),
                "{}: {url}: {e} (expected {expected:?})",
                b.name
            );
        }
    }
}

#[test]
fn passwords_never_show_whether_accepted_or_refused() {
    let secret = "hunter2-S3CRET";
    for b in backends() {
        let url = with_authority(b.base, &format!("user:{secret}@{}", parts(b.base).1));
        let shown = match (b.parse)(&url) {
            Ok(debug) => debug,
            Err(e) => format!("{e} {e:?}"),
        };
        assert!(!shown.contains(secret), "{}: {shown}", b.name);
        // A bad escape after the password: the error names the part, not the value.
        let bad = url.replace(secret, &format!("{secret}%zz"));
        let e = (b.parse)(&bad).expect_err(&bad);
        assert!(!format!("{e} {e:?}").contains(secret), "{}: {e}", b.name);
    }
}

#[test]
fn the_store_backends_take_the_same_timeouts() {
    // The four stores share the kit's timeout keys: a duration with a unit or plain
    // milliseconds, and zero or nonsense is an error naming the key.
    for b in backends()
        .into_iter()
        .filter(|b| ["etcd", "redis", "zk", "azblob"].contains(&b.name))
    {
        for good in [
            "connect_timeout=750ms&request_timeout=2s",
            "connect_timeout_ms=750&request_timeout_ms=2000",
        ] {
            let parsed = (b.parse)(&with_query(b.base, good))
                .unwrap_or_else(|e| panic!("{}: {good}: {e}", b.name));
            assert!(parsed.contains("750ms"), "{}: {parsed}", b.name);
            assert!(parsed.contains("2s"), "{}: {parsed}", b.name);
        }
        for (bad, key) in [
            ("connect_timeout=0s", "connect_timeout"),
            ("request_timeout_ms=0", "request_timeout_ms"),
            ("connect_timeout=5", "connect_timeout"),
        ] {
            let e = (b.parse)(&with_query(b.base, bad)).expect_err(bad);
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{}: {bad}", b.name);
            assert!(e.message().starts_with(key), "{}: {bad}: {e}", b.name);
        }
    }
}
