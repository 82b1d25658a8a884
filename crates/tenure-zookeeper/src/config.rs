//! Connection settings, from code, a URL or the environment.

use std::fmt;
use std::time::Duration;

use tenure_core::backend::config::{
    finish, from_env_table, parse_duration, parse_millis, unknown_key_in, BackendUrl, Credentials,
    Timeouts,
};
use tenure_core::{Error, Result};

use crate::SCHEME;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
const DEFAULT_CHROOT: &str = "/tenure";

/// The URL query keys.
const KEYS: &[&str] = &[
    "chroot",
    "layout",
    "username",
    "password",
    "session_timeout",
    "session_timeout_ms",
];

/// The environment variables that set a URL key.
const ENV_KEYS: &[(&str, &str)] = &[
    ("TENURE_ZK_CHROOT", "chroot"),
    ("TENURE_ZK_LAYOUT", "layout"),
    ("TENURE_ZK_USERNAME", "username"),
    ("TENURE_ZK_PASSWORD", "password"),
    ("TENURE_ZK_SESSION_TIMEOUT_MS", "session_timeout_ms"),
    ("TENURE_ZK_CONNECT_TIMEOUT_MS", "connect_timeout_ms"),
    ("TENURE_ZK_REQUEST_TIMEOUT_MS", "request_timeout_ms"),
];

/// How candidate nodes are named and who leads (see the crate README, *Layouts*).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub enum ZooKeeperLayout {
    /// tenure's own layout (the default): the election engine over ZooKeeper, an
    /// election being the data of its node, written by one conditional `multi` per
    /// step. Keeps priorities, preemption, handover and state transfer (contract
    /// clauses 14 and 16); cannot share an election with Curator's `LeaderLatch`. URL
    /// `layout=priority`.
    #[default]
    Priority,
    /// Curator `LeaderLatch` names (`_c_<uuid>-latch-<sequence>`, the lowest sequence
    /// leads), to share an election with Java services using Curator. No priorities:
    /// a priority other than 0 and a handover are `Unsupported`. URL `layout=curator`.
    Curator,
}

impl ZooKeeperLayout {
    /// The URL value: `priority` or `curator`.
    pub fn as_str(self) -> &'static str {
        match self {
            ZooKeeperLayout::Priority => "priority",
            ZooKeeperLayout::Curator => "curator",
        }
    }
}

impl fmt::Display for ZooKeeperLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How to reach ZooKeeper.
///
/// | setting | default | URL (`zk://…`) | environment |
/// |---|---|---|---|
/// | hosts (`host:port`, several for an ensemble) | required | `zk://h1:2181,h2:2181` | `TENURE_ZK_HOSTS` (comma separated) |
/// | chroot (created if missing) | `/tenure` | path: `zk://h:2181/apps/tenure` (`/` for none) | `TENURE_ZK_CHROOT` |
/// | node layout ([`ZooKeeperLayout`]) | `priority` | `layout=priority` or `layout=curator` | `TENURE_ZK_LAYOUT` |
/// | digest user and password | none | `user:password@` before the hosts | `TENURE_ZK_USERNAME`, `TENURE_ZK_PASSWORD` |
/// | session timeout of the backend's reader session (leader reads, observers) | 10 s | `session_timeout=10s` | `TENURE_ZK_SESSION_TIMEOUT_MS` |
/// | connect timeout | 5 s | `connect_timeout=5s` or `connect_timeout_ms=5000` | `TENURE_ZK_CONNECT_TIMEOUT_MS` |
/// | request timeout | 5 s | `request_timeout=5s` or `request_timeout_ms=5000` | `TENURE_ZK_REQUEST_TIMEOUT_MS` |
///
/// Durations in URLs take `ms` or `s` (`1500ms`, `10s`); `…_ms=` forms take plain
/// milliseconds. The session timeout of a tenure session is its TTL, not this setting.
/// URL values are percent-decoded. Unknown parameters, empty hosts, bad ports and bad
/// chroots are `InvalidArgument` naming the problem; messages never repeat the password.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ZooKeeperConfig {
    hosts: Vec<String>,
    chroot: String,
    layout: ZooKeeperLayout,
    credentials: Credentials,
    session_timeout: Duration,
    timeouts: Timeouts,
}

tenure_core::config_timeouts!(ZooKeeperConfig);
tenure_core::config_credentials!(
    ZooKeeperConfig,
    "Authenticate with ZooKeeper's `digest` scheme as `username:password`."
);

/// The URL form without the password: `zk://[user@]h1:2181,h2:2181/chroot`, with
/// `?layout=curator` for that layout.
impl fmt::Display for ZooKeeperConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{SCHEME}://{}{}{}",
            self.credentials.userinfo(),
            self.hosts.join(","),
            self.chroot_or_root()
        )?;
        if self.layout != ZooKeeperLayout::default() {
            write!(f, "?layout={}", self.layout)?;
        }
        Ok(())
    }
}

impl ZooKeeperConfig {
    /// Settings for `hosts` (`host:port`) with every other setting at its default.
    pub fn new<I, S>(hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ZooKeeperConfig {
            hosts: hosts.into_iter().map(Into::into).collect(),
            chroot: DEFAULT_CHROOT.to_string(),
            layout: ZooKeeperLayout::default(),
            credentials: Credentials::default(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            timeouts: Timeouts::new(DEFAULT_TIMEOUT),
        }
    }

    /// Parse `zk://[user:password@]host:port[,host:port…][/chroot][?param=value&…]`
    /// (see the table on [`ZooKeeperConfig`]).
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[SCHEME])?;
        let mut config = ZooKeeperConfig::new(&url.hosts);
        config.credentials = url.credentials();
        if !url.path.is_empty() {
            config.chroot = url.path;
        }
        finish(config, url.query, Self::set, Self::validate)
    }

    /// Read `TENURE_ZK_HOSTS` (required), `TENURE_ZK_CHROOT`, `TENURE_ZK_USERNAME`,
    /// `TENURE_ZK_PASSWORD`, `TENURE_ZK_SESSION_TIMEOUT_MS`, `TENURE_ZK_CONNECT_TIMEOUT_MS`
    /// and `TENURE_ZK_REQUEST_TIMEOUT_MS`.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let build = |hosts: &str| Ok(ZooKeeperConfig::new(hosts.split(',').map(str::trim)));
        let required = ("TENURE_ZK_HOSTS", "127.0.0.1:2181");
        from_env_table(get, required, build, ENV_KEYS, Self::set, Self::validate)
    }

    fn set(&mut self, key: &str, value: String) -> Result<()> {
        if self.timeouts.set(key, &value)? {
            return Ok(());
        }
        match key {
            "chroot" => self.chroot = value,
            "layout" => {
                self.layout = match value.as_str() {
                    "priority" => ZooKeeperLayout::Priority,
                    "curator" => ZooKeeperLayout::Curator,
                    other => {
                        return Err(Error::invalid(format!(
                            "layout: {other:?} is not a layout (priority or curator)"
                        )))
                    }
                }
            }
            "username" | "user" | "password" => {
                self.credentials.set(key, value);
            }
            "session_timeout" => self.session_timeout = parse_duration(key, &value)?,
            "session_timeout_ms" => self.session_timeout = parse_millis(key, &value)?,
            other => return Err(unknown_key_in(other, &[KEYS, Timeouts::KEYS])),
        }
        Ok(())
    }

    /// Check the settings: at least one `host:port` with a valid port, an absolute
    /// chroot without empty, `.` or `..` segments, timeouts > 0.
    pub fn validate(&self) -> Result<()> {
        if self.hosts.is_empty() || self.hosts.iter().any(|h| h.is_empty()) {
            return Err(Error::invalid(
                "hosts: empty host (expected host:port[,host:port…])",
            ));
        }
        for h in &self.hosts {
            let (host, port) = h
                .rsplit_once(':')
                .ok_or_else(|| Error::invalid(format!("hosts: {h:?} has no port (host:port)")))?;
            if host.is_empty() || host.contains(['/', '@', '?', ' ']) {
                return Err(Error::invalid(format!("hosts: bad host in {h:?}")));
            }
            match port.parse::<u16>() {
                Ok(p) if p > 0 => {}
                _ => return Err(Error::invalid(format!("hosts: bad port in {h:?}"))),
            }
        }
        if self.chroot != "/" {
            let bad = !self.chroot.starts_with('/')
                || self.chroot.ends_with('/')
                || self.chroot[1..]
                    .split('/')
                    .any(|s| s.is_empty() || s == "." || s == "..")
                || self.chroot.chars().any(|c| c.is_control());
            if bad {
                return Err(Error::invalid(format!(
                    "chroot: {:?} is not an absolute ZooKeeper path like /apps/tenure",
                    self.chroot
                )));
            }
        }
        self.credentials.validate()?;
        if self.session_timeout.is_zero() {
            return Err(Error::invalid("session_timeout: must be greater than zero"));
        }
        self.timeouts.validate()
    }

    /// Use `chroot` (an absolute path, created if missing; `/` for none).
    pub fn chroot(mut self, chroot: impl Into<String>) -> Self {
        self.chroot = chroot.into();
        self
    }

    /// Name candidate nodes by `layout` ([`ZooKeeperLayout::Priority`] by default).
    pub fn layout(mut self, layout: ZooKeeperLayout) -> Self {
        self.layout = layout;
        self
    }

    /// The node layout.
    pub fn get_layout(&self) -> ZooKeeperLayout {
        self.layout
    }

    /// Session timeout of the backend's own reader session.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The `host:port` list.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The chroot, `/` for none.
    pub fn chroot_or_root(&self) -> &str {
        &self.chroot
    }

    pub(crate) fn digest(&self) -> Option<Vec<u8>> {
        let user = self.credentials.username()?;
        let password = self.credentials.password().unwrap_or_default();
        Some(format!("{user}:{password}").into_bytes())
    }

    /// The reader session's timeout.
    pub fn get_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The connect string for zookeeper-client (no chroot: the backend applies it).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::testing::config::env_lookup;
    use tenure_core::ErrorKind;

    #[test]
    fn parses_urls() {
        let c = ZooKeeperConfig::from_url(
            "zk://bob:s%40cret@h1:2181,h2:2182/apps/t?session_timeout=4s&connect_timeout=1500ms&request_timeout_ms=700",
        )
        .unwrap();
        assert_eq!(c.hosts(), ["h1:2181", "h2:2182"]);
        assert_eq!(c.chroot_or_root(), "/apps/t");
        assert_eq!(c.username(), Some("bob"));
        assert_eq!(c.digest().unwrap(), b"bob:s@cret");
        assert_eq!(c.get_session_timeout(), Duration::from_secs(4));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(1500));
        assert_eq!(c.get_request_timeout(), Duration::from_millis(700));
        let c = ZooKeeperConfig::from_url("zk://127.0.0.1:2181").unwrap();
        assert_eq!(c.chroot_or_root(), "/tenure");
        assert_eq!(c.get_layout(), ZooKeeperLayout::Priority);
        let c = ZooKeeperConfig::from_url("zk://h:1/x?layout=curator").unwrap();
        assert_eq!(c.get_layout(), ZooKeeperLayout::Curator);
        assert_eq!(c.to_string(), "zk://h:1/x?layout=curator");
        let c = ZooKeeperConfig::from_url("zk://h:1/x?layout=priority").unwrap();
        assert_eq!(c.get_layout(), ZooKeeperLayout::Priority);
        assert_eq!(c.to_string(), "zk://h:1/x");
        let e = ZooKeeperConfig::from_url("zk://h:1/x?layout=latch").unwrap_err();
        assert!(e.message().contains("layout"), "{e}");
        assert_eq!(c.digest(), None);
        let c = ZooKeeperConfig::from_url("zk://127.0.0.1:2181/").unwrap();
        assert_eq!(c.chroot_or_root(), "/");
        // The scheme is case-insensitive, as for every backend.
        let c = ZooKeeperConfig::from_url("ZK://127.0.0.1:2181/a+b").unwrap();
        assert_eq!(c.chroot_or_root(), "/a+b");
    }

    #[test]
    fn password_never_shown() {
        let c = ZooKeeperConfig::from_url("zk://bob:hunter2@h:2181/x").unwrap();
        for s in [format!("{c}"), format!("{c:?}")] {
            assert!(!s.contains("hunter2"), "{s}");
            assert!(s.contains("bob"), "{s}");
        }
        assert_eq!(c.to_string(), "zk://bob@h:2181/x");
        let e = ZooKeeperConfig::from_url("zk://bob:hunter2@h:99999/x").unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }

    #[test]
    fn bad_urls_are_invalid_argument() {
        for u in [
            "etcd://h:1",
            "zk://",
            "zk://h",
            "zk://h:0",
            "zk://h:x",
            "zk://h:1,,h:2",
            "zk://h:1/a/",
            "zk://h:1/a//b",
            "zk://h:1/a/../b",
            "zk://h:1/a?nope=1",
            "zk://h:1/a?session_timeout=10",
            "zk://h:1/a?connect_timeout_ms=x",
            "zk://h:1/a?request_timeout=0s",
            "zk://h:1/a?layout=",
            "zk://h:1/a?layout=Curator",
            "zk://:pw@h:1/a",
            "zk://h:1/%zz",
        ] {
            let e = ZooKeeperConfig::from_url(u).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{u}: {e}");
        }
    }

    #[test]
    fn env() {
        let vars = [
            ("TENURE_ZK_HOSTS", "a:1, b:2"),
            ("TENURE_ZK_CHROOT", "/x"),
            ("TENURE_ZK_USERNAME", "u"),
            ("TENURE_ZK_PASSWORD", "p"),
            ("TENURE_ZK_CONNECT_TIMEOUT_MS", "250"),
        ];
        let c = ZooKeeperConfig::from_lookup(env_lookup(&vars)).unwrap();
        assert_eq!(c.hosts(), ["a:1", "b:2"]);
        assert_eq!(c.chroot_or_root(), "/x");
        assert_eq!(c.digest().unwrap(), b"u:p");
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(250));
        let e = ZooKeeperConfig::from_lookup(|_| None).unwrap_err();
        assert!(e.message().contains("TENURE_ZK_HOSTS"));
        let vars = [
            ("TENURE_ZK_HOSTS", "h:1"),
            ("TENURE_ZK_SESSION_TIMEOUT_MS", "soon"),
        ];
        let e = ZooKeeperConfig::from_lookup(env_lookup(&vars)).unwrap_err();
        assert!(e.message().contains("TENURE_ZK_SESSION_TIMEOUT_MS"), "{e}");
    }
}
