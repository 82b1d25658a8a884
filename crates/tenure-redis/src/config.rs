//! Connection settings: builder, URL and environment parsing. The password never
//! appears in `Debug`, `Display`, error messages or logs.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tenure_core::backend::config::{
    check_printable, encode, finish, from_env_table, host_port, parse_millis, parse_number,
    unknown_key_in, BackendUrl, Credentials, Secret, Timeouts, TlsFiles,
};
use tenure_core::{Error, Result};

/// The URL scheme of this backend: `redis://[[user][:password]@]host[:port][/db][?…]`.
pub const SCHEME: &str = "redis";

/// The URL scheme of Redis over TLS: `rediss://…`.
pub const TLS_SCHEME: &str = "rediss";

/// The URL scheme of Redis found through Sentinel:
/// `redis+sentinel://[[user][:password]@]sentinel[:port][,sentinel…]/service[/db][?…]`.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";

/// Redis found through Sentinel, over TLS (to the data nodes and the sentinels).
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel";

/// Every URL scheme this backend answers to.
pub const SCHEMES: [&str; 4] = [SCHEME, TLS_SCHEME, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME];

/// The port Sentinel listens on unless told otherwise.
const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// The most replicas the replication guard may wait for.
const MAX_WAIT_REPLICAS: u32 = 100;
/// Default for [`RedisConfig::replication_guard`]'s bound.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// The port Redis listens on unless told otherwise.
const DEFAULT_PORT: u16 = 6379;
/// The key prefix unless told otherwise.
const DEFAULT_PREFIX: &str = "tenure";
/// Default for [`RedisConfig::connect_timeout`] and [`RedisConfig::request_timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`RedisConfig::poll_interval`].
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The longest key prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 100;
/// The highest database number accepted.
const MAX_DB: i64 = i32::MAX as i64;

/// The URL query keys besides the TLS files and timeouts (`username` and `password`
/// also go before `@`).
const KEYS: &[&str] = &[
    "prefix",
    "username",
    "password",
    "poll_interval_ms",
    "wait_replicas",
    "wait_timeout_ms",
    "sentinel_username",
    "sentinel_password",
];

/// The environment variables that override a URL key.
const ENV_KEYS: &[(&str, &str)] = &[
    ("TENURE_REDIS_USERNAME", "username"),
    ("TENURE_REDIS_PASSWORD", "password"),
    ("TENURE_REDIS_PREFIX", "prefix"),
];

/// How to reach Redis and where tenure keeps its keys there.
///
/// | setting | default | URL | environment |
/// |---|---|---|---|
/// | host and port | required; port 6379 | `redis://host:port` | `TENURE_REDIS_URL` (required) |
/// | TLS | off | scheme `rediss://` | the scheme of `TENURE_REDIS_URL` |
/// | username (ACL) and password | none (the default user, no `AUTH`) | `redis://user:password@host`, or `redis://:password@host` for the default user | `TENURE_REDIS_USERNAME`, `TENURE_REDIS_PASSWORD` (override the URL) |
/// | database number | 0 | `redis://host/2` | in the URL |
/// | key prefix | `tenure` | `?prefix=` | `TENURE_REDIS_PREFIX` |
/// | connect timeout | 5 s | `?connect_timeout=5s` or `?connect_timeout_ms=5000` | in the URL |
/// | request timeout | 5 s | `?request_timeout=5s` or `?request_timeout_ms=5000` | in the URL |
/// | poll interval: how often a waiter or observer looks at the seat while the pub/sub link is down | 1 s | `?poll_interval_ms=` | in the URL |
/// | CA certificate (PEM) to verify the server with TLS | the system's roots | `?ca=/path` | in the URL |
/// | client certificate and key (PEM) for TLS | none | `?cert=/path&key=/path` | in the URL |
/// | Sentinel: the sentinels to ask for the primary of `service` | off (one server) | `redis+sentinel://s1:26379,s2,s3/service[/db]` (`rediss+sentinel://` for TLS) | the scheme of `TENURE_REDIS_URL` |
/// | Sentinel's own credentials | none | `?sentinel_username=…&sentinel_password=…` | in the URL |
/// | replication guard: a grant or renewal counts only once this many replicas have it | 0 (off) | `?wait_replicas=1` | in the URL |
/// | the guard's bound: how long to wait for the replicas | 500 ms | `?wait_timeout_ms=` | in the URL |
///
/// URL components are percent-decoded (`%40` for `@` in a password). A bad URL, an
/// unknown parameter, a bad port, database or prefix is
/// [`ErrorKind::InvalidArgument`](tenure_core::ErrorKind) naming the problem; messages
/// never repeat the password.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct RedisConfig {
    host: String,
    port: u16,
    tls: bool,
    credentials: Credentials,
    db: i64,
    prefix: String,
    timeouts: Timeouts,
    poll_interval: Duration,
    files: TlsFiles,
    pub(crate) sentinel: Option<Sentinel>,
    wait_replicas: u32,
    wait_timeout: Duration,
}

tenure_core::config_timeouts!(RedisConfig);
tenure_core::config_credentials!(
    RedisConfig,
    "Authenticate as the ACL user `username` with `password`."
);

/// Where Sentinel is: the sentinels to ask and the name of the monitored primary.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) struct Sentinel {
    pub(crate) service: String,
    pub(crate) nodes: Vec<(String, u16)>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Secret>,
}

/// The URL without the password: `redis://[user@]host:port/db?prefix=…`.
impl fmt::Display for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = match (&self.sentinel, self.tls) {
            (None, false) => SCHEME,
            (None, true) => TLS_SCHEME,
            (Some(_), false) => SENTINEL_SCHEME,
            (Some(_), true) => SENTINEL_TLS_SCHEME,
        };
        let userinfo = self.credentials.userinfo();
        write!(f, "{scheme}://{userinfo}{}", self.address())?;
        if let Some(sentinel) = &self.sentinel {
            write!(f, "/{}", encode(&sentinel.service))?;
        }
        write!(f, "/{}?prefix={}", self.db, encode(&self.prefix))?;
        if self.wait_replicas > 0 {
            write!(f, "&wait_replicas={}", self.wait_replicas)?;
        }
        Ok(())
    }
}

impl RedisConfig {
    /// Settings for the server at `host` (a name, an IPv4 or an IPv6 address without
    /// brackets) and `port`, with every default.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        RedisConfig {
            host: host.into(),
            port,
            tls: false,
            credentials: Credentials::default(),
            db: 0,
            prefix: DEFAULT_PREFIX.to_string(),
            timeouts: Timeouts::new(DEFAULT_TIMEOUT),
            poll_interval: DEFAULT_POLL_INTERVAL,
            files: TlsFiles::default(),
            sentinel: None,
            wait_replicas: 0,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }

    /// Settings for the primary that Sentinel monitors as `service`, asking the
    /// sentinels at `nodes` (`(host, port)`) where it is. The client asks again after
    /// a failover, and moves when the server it talks to turns out to be a replica.
    pub fn sentinel<I, H>(service: impl Into<String>, nodes: I) -> Self
    where
        I: IntoIterator<Item = (H, u16)>,
        H: Into<String>,
    {
        let nodes: Vec<(String, u16)> = nodes.into_iter().map(|(h, p)| (h.into(), p)).collect();
        let (host, port) = nodes.first().cloned().unwrap_or_default();
        let mut config = RedisConfig::new(host, port);
        config.sentinel = Some(Sentinel {
            service: service.into(),
            nodes,
            username: None,
            password: None,
        });
        config
    }

    /// Parse `redis://[[user][:password]@]host[:port][/db][?param=value&…]`,
    /// `rediss://…` (TLS) or a Sentinel URL; see the table above for the parameters.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&SCHEMES)?;
        let path = url.path.trim_matches('/');
        let (mut config, db) = if url.scheme.ends_with("+sentinel") {
            let nodes = url
                .hosts
                .iter()
                .map(|h| host_port(h, Some(DEFAULT_SENTINEL_PORT)))
                .collect::<Result<Vec<_>>>()?;
            if nodes.is_empty() {
                return Err(Error::invalid(
                    "url: expected the sentinels (redis+sentinel://host[:port][,host…]/service)",
                ));
            }
            let (service, db) = path.split_once('/').unwrap_or((path, ""));
            if service.is_empty() {
                return Err(Error::invalid(
                    "url: expected the service name Sentinel monitors as the path (redis+sentinel://host/service[/db])",
                ));
            }
            (RedisConfig::sentinel(service, nodes), db)
        } else {
            let [host] = url.hosts.as_slice() else {
                return Err(Error::invalid(
                    "url: expected one host (redis://host[:port]); Redis Cluster is not supported",
                ));
            };
            let (host, port) = host_port(host, Some(DEFAULT_PORT))?;
            (RedisConfig::new(host, port), path)
        };
        // The range is checked with the rest.
        if !db.is_empty() {
            config.db = db.parse().map_err(|_| {
                Error::invalid(format!(
                    "database: {db:?} is not a number from 0 to {MAX_DB} (the URL path is the database)"
                ))
            })?;
        }
        config.tls = url.scheme.starts_with(TLS_SCHEME);
        config.credentials = url.credentials();
        finish(config, url.query, Self::set, Self::validate)
    }

    /// Read `TENURE_REDIS_URL` (required; any URL [`from_url`](Self::from_url) takes),
    /// then let `TENURE_REDIS_USERNAME`, `TENURE_REDIS_PASSWORD` and
    /// `TENURE_REDIS_PREFIX` override the URL's values (so the password need not sit in
    /// the URL).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let required = ("TENURE_REDIS_URL", "redis://127.0.0.1:6379");
        from_env_table(
            get,
            required,
            Self::from_url,
            ENV_KEYS,
            Self::set,
            Self::validate,
        )
    }

    fn set(&mut self, key: &str, value: String) -> Result<()> {
        if self.timeouts.set(key, &value)? {
            return Ok(());
        }
        match key {
            "prefix" => self.prefix = value,
            "username" | "password" => {
                self.credentials.set(key, value);
            }
            "poll_interval_ms" => self.poll_interval = parse_millis(key, &value)?,
            "ca" | "cert" | "key" => {
                self.files.set(key, value);
            }
            "wait_replicas" => {
                self.wait_replicas =
                    parse_number(key, &value, 0, u64::from(MAX_WAIT_REPLICAS))? as u32
            }
            "wait_timeout_ms" => self.wait_timeout = parse_millis(key, &value)?,
            "sentinel_username" | "sentinel_password" => {
                let Some(sentinel) = self.sentinel.as_mut() else {
                    return Err(Error::invalid(format!(
                        "{key}: only with redis+sentinel:// (this URL names one server)"
                    )));
                };
                if key == "sentinel_username" {
                    sentinel.username = Some(value);
                } else {
                    sentinel.password = Some(Secret::new(value));
                }
            }
            other => {
                return Err(unknown_key_in(
                    other,
                    &[KEYS, TlsFiles::KEYS, Timeouts::KEYS],
                ))
            }
        }
        Ok(())
    }

    /// Check every setting; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        let nodes = self.sentinel.iter().flat_map(|s| s.nodes.iter());
        for (host, port) in std::iter::once(&(self.host.clone(), self.port)).chain(nodes) {
            validate_host(host)?;
            if *port == 0 {
                return Err(Error::invalid("port: must be from 1 to 65535"));
            }
        }
        if let Some(sentinel) = &self.sentinel {
            if sentinel.service.is_empty()
                || !sentinel.service.chars().all(|c| c.is_ascii_graphic())
            {
                return Err(Error::invalid(format!(
                    "service {:?}: must be the name Sentinel monitors (printable ASCII, no spaces)",
                    sentinel.service
                )));
            }
        }
        if self.wait_replicas > MAX_WAIT_REPLICAS {
            return Err(Error::invalid(format!(
                "wait_replicas: {} is more than {MAX_WAIT_REPLICAS}",
                self.wait_replicas
            )));
        }
        if self.wait_replicas > 0
            && (self.wait_timeout.is_zero() || self.wait_timeout >= self.timeouts.request)
        {
            return Err(Error::invalid(format!(
                "wait_timeout: {:?} must be greater than zero and below the request timeout {:?}",
                self.wait_timeout, self.timeouts.request
            )));
        }
        if !(0..=MAX_DB).contains(&self.db) {
            return Err(Error::invalid(format!(
                "database: {} is not a number from 0 to {MAX_DB}",
                self.db
            )));
        }
        // 1 to 100 bytes of printable ASCII without spaces.
        check_printable("prefix", &self.prefix, MAX_PREFIX_LEN)?;
        self.credentials.check_username()?;
        if self.credentials.username.is_some() && self.credentials.password.is_none() {
            return Err(Error::invalid(
                "password: a username needs a password (redis://user:password@host)",
            ));
        }
        self.files.validate(self.tls, SCHEME, TLS_SCHEME)?;
        self.timeouts.validate()?;
        if self.poll_interval.is_zero() {
            return Err(Error::invalid("poll_interval: must be greater than zero"));
        }
        Ok(())
    }

    /// Keep tenure's keys under `prefix` (default `tenure`): `<prefix>:seat:<election>`
    /// and so on (see the crate docs).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Authenticate as the default user with `password` (`requirepass`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.credentials = Credentials {
            username: None,
            password: Some(Secret::new(password)),
        };
        self
    }

    /// Count a grant or a renewal only once `replicas` replicas have it, waiting at
    /// most `timeout` (Redis `WAIT`): a failover to a replica then cannot lose a grant
    /// the holder was told about. A renewal that is not replicated in time fails, so
    /// a primary cut off from its replicas loses its leaders by their deadline. 0
    /// turns the guard off (the default).
    pub fn replication_guard(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = replicas;
        self.wait_timeout = timeout;
        self
    }

    /// Use database `db` (default 0).
    pub fn db(mut self, db: i64) -> Self {
        self.db = db;
        self
    }

    /// Connect with TLS (`rediss://`), verifying the server with the system's roots
    /// unless [`ca_file`](Self::ca_file) names a CA.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Verify the server's TLS certificate with the CA certificate in `path` (PEM).
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.files.ca = Some(path.into());
        self
    }

    /// Present a client certificate (PEM files) over TLS.
    pub fn client_identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.files.cert = Some(cert.into());
        self.files.key = Some(key.into());
        self
    }

    /// How often a waiting candidate or an observer reads the seat while the pub/sub
    /// link is down (default 1 s; after a random 80–100 % of it); subscribed, it reads
    /// only when told. Also the longest back-off of a member watcher's failed reads.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// Whether a password is set (the password itself is not readable).
    pub fn has_password(&self) -> bool {
        self.credentials.password.is_some()
    }

    /// The database number.
    pub fn database(&self) -> i64 {
        self.db
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The poll interval.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// The replicas a grant or renewal waits for and the bound (`None`: no guard).
    pub(crate) fn guard(&self) -> Option<(u32, Duration)> {
        (self.wait_replicas > 0).then_some((self.wait_replicas, self.wait_timeout))
    }

    pub(crate) fn secret(&self) -> Option<&str> {
        self.credentials.password()
    }

    pub(crate) fn tls_files(&self) -> (Option<&PathBuf>, Option<(&PathBuf, &PathBuf)>) {
        self.files.paths()
    }

    /// `host:port` for messages (IPv6 in brackets); with Sentinel, the sentinels'.
    pub(crate) fn address(&self) -> String {
        let one = |(host, port): &(String, u16)| match host.contains(':') {
            true => format!("[{host}]:{port}"),
            false => format!("{host}:{port}"),
        };
        match &self.sentinel {
            None => one(&(self.host.clone(), self.port)),
            Some(sentinel) => sentinel.nodes.iter().map(one).collect::<Vec<_>>().join(","),
        }
    }
}

fn validate_host(host: &str) -> Result<()> {
    if host.is_empty() {
        return Err(Error::invalid("host: must not be empty"));
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_')))
    {
        return Err(Error::invalid(format!(
            "host {host:?}: character {c:?} is not allowed"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls() {
        let c = RedisConfig::from_url(
            "redis+sentinel://:pw@127.0.0.1:26380,localhost/primary-1/3?wait_replicas=1&wait_timeout_ms=200&sentinel_password=sp",
        )
        .unwrap();
        let sentinel = c.sentinel.as_ref().unwrap();
        assert_eq!(sentinel.service, "primary-1");
        assert_eq!(
            sentinel.nodes,
            vec![
                ("127.0.0.1".to_string(), 26380),
                ("localhost".to_string(), 26379)
            ]
        );
        assert_eq!(sentinel.password.as_ref().map(|p| p.expose()), Some("sp"));
        assert_eq!(c.database(), 3);
        assert_eq!(c.guard(), Some((1, Duration::from_millis(200))));
        assert_eq!(c.secret(), Some("pw"));
        let shown = c.to_string();
        assert_eq!(
            shown,
            "redis+sentinel://127.0.0.1:26380,localhost:26379/primary-1/3?prefix=tenure&wait_replicas=1"
        );
        assert!(!format!("{c:?}").contains("sp\""), "{c:?}");
        assert!(RedisConfig::from_url("REDISS+SENTINEL://h/s")
            .unwrap()
            .is_tls());
        assert_eq!(RedisConfig::from_url("redis://h").unwrap().guard(), None);
        for (bad, says) in [
            ("redis+sentinel://h", "service name"),
            ("redis+sentinel://h/", "service name"),
            ("redis+sentinel://h/s/x", "database"),
            ("redis://h?sentinel_password=x", "only with redis+sentinel"),
            ("redis://h?wait_replicas=101", "wait_replicas"),
            (
                "redis://h?wait_replicas=1&wait_timeout_ms=5000",
                "wait_timeout",
            ),
        ] {
            let e = RedisConfig::from_url(bad).unwrap_err();
            assert!(e.message().contains(says), "{bad}: {e}");
        }
    }
    use tenure_core::testing::config::{assert_refused, env_lookup};

    #[test]
    fn plain_urls() {
        let c = RedisConfig::from_url("redis://127.0.0.1").unwrap();
        assert_eq!((c.host(), c.port(), c.database()), ("127.0.0.1", 6379, 0));
        assert_eq!(c.key_prefix(), "tenure");
        assert!(!c.is_tls());
        assert!(c.username().is_none() && !c.has_password());
        let c = RedisConfig::from_url(
            "REDIS://app:p%40ss%3Aw@cache.local:6380/3?prefix=svc%2Fa&connect_timeout_ms=700&request_timeout_ms=800&poll_interval_ms=250",
        )
        .unwrap();
        assert_eq!(c.host(), "cache.local");
        assert_eq!(c.port(), 6380);
        assert_eq!(c.database(), 3);
        assert_eq!(c.username(), Some("app"));
        assert_eq!(c.secret(), Some("p@ss:w"));
        assert_eq!(c.key_prefix(), "svc/a");
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(700));
        assert_eq!(c.get_request_timeout(), Duration::from_millis(800));
        assert_eq!(c.get_poll_interval(), Duration::from_millis(250));
        // The default user with a password (requirepass).
        let c = RedisConfig::from_url("redis://:secret@[::1]:7000/").unwrap();
        assert_eq!(c.username(), None);
        assert_eq!(c.secret(), Some("secret"));
        assert_eq!(c.host(), "::1");
        assert_eq!(c.address(), "[::1]:7000");
    }

    #[test]
    fn tls_urls() {
        let c = RedisConfig::from_url("rediss://h:6380?ca=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert!(c.is_tls());
        let (ca, id) = c.tls_files();
        assert_eq!(ca, Some(&PathBuf::from("/ca.pem")));
        assert!(id.is_some());
        let c = RedisConfig::from_url("rediss://h").unwrap();
        assert!(c.is_tls());
        assert_eq!(c.tls_files().0, None);
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("redis://", "host"),
            ("redis://:6379", "host"),
            ("redis://h:notaport", "port"),
            ("redis://h:0", "port"),
            ("redis://h:70000", "port"),
            ("redis://a:1,b:2", "one host"),
            ("redis://h?prefix=%zz", "hex digits"),
            ("redis://h/x", "database"),
            ("redis://h/-1", "database"),
            ("redis://h/1/2", "database"),
            ("redis://h?prefix=", "prefix"),
            ("redis://h?prefix=a%20b", "prefix"),
            ("redis://h?colour=red", "unknown parameter"),
            ("redis://user@h", "password"),
            ("redis://h?connect_timeout_ms=0", "connect_timeout_ms"),
            ("redis://h?poll_interval_ms=soon", "poll_interval_ms"),
            ("redis://h?ca=/x", "rediss"),
            ("rediss://h?cert=/c", "key"),
            ("redis://h/#insecure", "fragment"),
            ("etcd://h:1", "scheme"),
            ("h:6379", "scheme"),
        ];
        assert_refused(RedisConfig::from_url, &cases);
    }

    #[test]
    fn passwords_never_show() {
        let secret = "hunter2-S3CRET";
        for url in [
            format!("redis://app:{secret}@127.0.0.1:6379"),
            format!("redis://:{secret}@127.0.0.1"),
        ] {
            let c = RedisConfig::from_url(&url).unwrap();
            assert_eq!(c.secret(), Some(secret));
            let text = format!("{c:?} {c:#?} {c}");
            assert!(!text.contains(secret), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
        let c = RedisConfig::from_url(&format!("redis://app:{secret}@h:1/2?prefix=p")).unwrap();
        assert_eq!(c.to_string(), "redis://app@h:1/2?prefix=p");
        // Errors about a URL with a password do not repeat it.
        for url in [
            format!("redis://app:{secret}@h:bad"),
            format!("redis://app:{secret}@h:1?bogus=1"),
            format!("redis://app:{secret}@h:1/x"),
            format!("redis://app:{secret}%ff@h:1"),
            format!("redis://app:{secret}@h:1?prefix=a%20b"),
        ] {
            let e = RedisConfig::from_url(&url).unwrap_err();
            assert!(!format!("{e} {e:?}").contains(secret), "{e}");
        }
    }

    #[test]
    fn environment() {
        let vars = [
            ("TENURE_REDIS_URL", " rediss://h:1/4 "),
            ("TENURE_REDIS_USERNAME", "svc"),
            ("TENURE_REDIS_PASSWORD", "pw"),
            ("TENURE_REDIS_PREFIX", "app"),
        ];
        let c = RedisConfig::from_lookup(env_lookup(&vars)).unwrap();
        assert!(c.is_tls());
        assert_eq!((c.port(), c.database()), (1, 4));
        assert_eq!(c.username(), Some("svc"));
        assert_eq!(c.secret(), Some("pw"));
        assert_eq!(c.key_prefix(), "app");
        let e = RedisConfig::from_lookup(|_| None).unwrap_err();
        assert!(e.message().contains("TENURE_REDIS_URL"), "{e}");
        let vars = [("TENURE_REDIS_URL", "redis://h?x=1")];
        let e = RedisConfig::from_lookup(env_lookup(&vars)).unwrap_err();
        assert!(e.message().starts_with("TENURE_REDIS_URL"), "{e}");
    }

    #[test]
    fn builder() {
        let c = RedisConfig::new("h", 1)
            .prefix("p")
            .credentials("u", "secret-pw")
            .db(2)
            .connect_timeout(Duration::from_millis(300))
            .request_timeout(Duration::from_secs(2))
            .poll_interval(Duration::from_millis(500));
        c.validate().unwrap();
        assert!(!c.to_string().contains("secret-pw"));
        let c = c.password("other");
        assert_eq!(c.username(), None);
        assert!(RedisConfig::new("", 1).validate().is_err());
        assert!(RedisConfig::new("h", 1).db(-1).validate().is_err());
        assert!(RedisConfig::new("h", 1)
            .poll_interval(Duration::ZERO)
            .validate()
            .unwrap_err()
            .message()
            .starts_with("poll_interval"));
    }
}
