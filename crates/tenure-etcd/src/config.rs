//! Connection settings: builder, URL and environment parsing. The password never
//! appears in `Debug`, `Display`, error messages or logs.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use tenure_core::backend::config::{
    finish, from_env_table, parse_bool, unknown_key_in, BackendUrl, Credentials, Timeouts, TlsFiles,
};
use tenure_core::backend::FailoverFloor;
use tenure_core::{Error, Result, Timing};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::keys::{validate_prefix, EtcdLayout, DEFAULT_PREFIX};

/// The URL scheme of this backend: `etcd://host:port[,host:port…][?prefix=…]`
/// (`etcds://` for TLS).
pub const SCHEME: &str = "etcd";

/// The URL scheme of etcd with TLS.
pub(crate) const TLS_SCHEME: &str = "etcds";

/// Both URL schemes this backend answers to.
pub const SCHEMES: [&str; 2] = [SCHEME, TLS_SCHEME];

/// Default for [`EtcdConfig::connect_timeout`] and [`EtcdConfig::request_timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// The URL query keys.
const KEYS: &[&str] = &[
    "prefix", "layout", "username", "password", "ca", "cert", "key", "domain",
];

/// The environment variables that set a URL key.
const ENV_KEYS: &[(&str, &str)] = &[
    ("TENURE_ETCD_PREFIX", "prefix"),
    ("TENURE_ETCD_LAYOUT", "layout"),
    ("TENURE_ETCD_USERNAME", "username"),
    ("TENURE_ETCD_PASSWORD", "password"),
    ("TENURE_ETCD_CA_FILE", "ca"),
    ("TENURE_ETCD_CERT_FILE", "cert"),
    ("TENURE_ETCD_KEY_FILE", "key"),
    ("TENURE_ETCD_DOMAIN", "domain"),
    ("TENURE_ETCD_CONNECT_TIMEOUT_MS", "connect_timeout_ms"),
    ("TENURE_ETCD_REQUEST_TIMEOUT_MS", "request_timeout_ms"),
    ("TENURE_ETCD_TLS", "tls"),
];

/// How to reach etcd and where tenure keeps its keys there.
///
/// | setting | default | URL (`etcd://…?`) | environment |
/// |---|---|---|---|
/// | endpoints (`host:port`, several for a cluster) | required | `etcd://h1:2379,h2:2379` | `TENURE_ETCD_ENDPOINTS` (comma separated; `https://` entries turn TLS on) |
/// | key prefix | `tenure` | `prefix=` | `TENURE_ETCD_PREFIX` |
/// | key layout ([`EtcdLayout`]): `tenure`, or `go` to share elections with Go's `concurrency.Election` | `tenure` | `layout=` | `TENURE_ETCD_LAYOUT` |
/// | username and password | none | `username=`, `password=` (or `user:pass@` before the hosts) | `TENURE_ETCD_USERNAME`, `TENURE_ETCD_PASSWORD` |
/// | TLS | off | scheme `etcds://` | `TENURE_ETCD_TLS=true` |
/// | CA certificate (PEM file, required with TLS) | none | `ca=` | `TENURE_ETCD_CA_FILE` |
/// | client certificate and key (PEM files) | none | `cert=`, `key=` | `TENURE_ETCD_CERT_FILE`, `TENURE_ETCD_KEY_FILE` |
/// | TLS server name | the endpoint's host | `domain=` | `TENURE_ETCD_DOMAIN` |
/// | connect timeout | 5 s | `connect_timeout=5s` or `connect_timeout_ms=5000` | `TENURE_ETCD_CONNECT_TIMEOUT_MS` |
/// | request timeout | 5 s | `request_timeout=5s` or `request_timeout_ms=5000` | `TENURE_ETCD_REQUEST_TIMEOUT_MS` |
///
/// URL values are percent-decoded. Unknown parameters, empty hosts, bad ports and bad
/// prefixes are [`ErrorKind::InvalidArgument`](tenure_core::ErrorKind) naming the
/// problem; messages never repeat the password.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    prefix: String,
    /// Whether the prefix was set (`layout=go` needs it set: see [`validate`](Self::validate)).
    prefix_set: bool,
    layout: EtcdLayout,
    credentials: Credentials,
    tls: bool,
    files: TlsFiles,
    domain: Option<String>,
    timeouts: Timeouts,
}

tenure_core::config_timeouts!(EtcdConfig);
tenure_core::config_credentials!(EtcdConfig, "Authenticate as `username` with `password`.");

/// The URL form without the password: `etcd://[user@]h1:2379,h2:2379?prefix=…`, with
/// `&layout=…` when it is not the default.
impl fmt::Display for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { TLS_SCHEME } else { SCHEME };
        write!(
            f,
            "{scheme}://{}{}?prefix={}",
            self.credentials.userinfo(),
            self.endpoints.join(","),
            self.prefix
        )?;
        if self.layout != EtcdLayout::default() {
            write!(f, "&layout={}", self.layout)?;
        }
        Ok(())
    }
}

impl EtcdConfig {
    /// Settings for the given `host:port` endpoints with every default.
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: DEFAULT_PREFIX.to_string(),
            prefix_set: false,
            layout: EtcdLayout::default(),
            credentials: Credentials::default(),
            tls: false,
            files: TlsFiles::default(),
            domain: None,
            timeouts: Timeouts::new(DEFAULT_TIMEOUT),
        }
    }

    /// Parse `etcd://host:port[,host:port…][?prefix=…&username=…&password=…]` or
    /// `etcds://…` (TLS; `ca=`, `cert=`, `key=`, `domain=`); see the table above.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[SCHEME, TLS_SCHEME])?;
        url.forbid_path("set the key prefix with ?prefix=…")?;
        let mut config = EtcdConfig::new(&url.hosts);
        config.tls = url.scheme == TLS_SCHEME;
        config.credentials = url.credentials();
        finish(config, url.query, Self::set, Self::validate)
    }

    /// Read the settings from the environment: `TENURE_ETCD_ENDPOINTS` (required) and
    /// the variables of the table above.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let build = |endpoints: &str| {
            let endpoints: Vec<&str> = endpoints.split(',').map(str::trim).collect();
            let mut config = EtcdConfig::new(endpoints.iter().map(|e| {
                let e = e.strip_prefix("https://").unwrap_or(e);
                e.strip_prefix("http://").unwrap_or(e).trim_end_matches('/')
            }));
            config.tls = endpoints.iter().any(|e| e.starts_with("https://"));
            Ok(config)
        };
        // `TENURE_ETCD_TLS` (an https endpoint also turns TLS on) is not a URL key: the
        // URL's scheme says it.
        let set = |config: &mut Self, key: &str, value: String| match key {
            "tls" => {
                config.tls |= parse_bool(key, &value)?;
                Ok(())
            }
            _ => config.set(key, value),
        };
        let required = ("TENURE_ETCD_ENDPOINTS", "127.0.0.1:2379");
        from_env_table(get, required, build, ENV_KEYS, set, Self::validate)
    }

    fn set(&mut self, key: &str, value: String) -> Result<()> {
        if self.timeouts.set(key, &value)? {
            return Ok(());
        }
        match key {
            "prefix" => {
                self.prefix = value;
                self.prefix_set = true;
            }
            "layout" => self.layout = value.parse()?,
            "username" | "user" | "password" => {
                self.credentials.set(key, value);
            }
            "ca" | "cert" | "key" => {
                self.files.set(key, value);
            }
            "domain" => self.domain = Some(value),
            other => return Err(unknown_key_in(other, &[KEYS, Timeouts::KEYS])),
        }
        Ok(())
    }

    /// Check every setting; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid(
                "endpoints: at least one host:port is needed",
            ));
        }
        for e in &self.endpoints {
            validate_endpoint(e)?;
        }
        if self.layout == EtcdLayout::GoElection && !self.prefix_set {
            // With the default prefix, `--election jobs/x` would be Go's election
            // `tenure/jobs/x`, not the `jobs/x` a Go program beside it names, and both
            // would lead at once.
            return Err(Error::invalid(concat!(
                "prefix: layout=go needs the prefix set: Go's election `P/E` is prefix=P ",
                "and election E (`etcdctl elect jobs/x` is `?layout=go&prefix=jobs` with ",
                "election `x`; Go's `/services/x` is prefix=/services)"
            )));
        }
        validate_prefix(&self.prefix, self.layout)?;
        self.credentials.validate()?;
        if self.tls && self.files.ca.is_none() {
            return Err(Error::invalid(
                "ca: TLS (etcds://) needs the CA certificate file that signed the server's \
                 certificate (ca=/path/ca.pem)",
            ));
        }
        self.files.validate(self.tls, SCHEME, TLS_SCHEME)?;
        self.timeouts.validate()
    }

    /// Keep tenure's keys under `prefix` (default `tenure`): an election `E` lives at
    /// `<prefix>/E/@<lease>` (with [`EtcdLayout::GoElection`], at `<prefix>/E/<lease>`,
    /// and the prefix may start with `/`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self.prefix_set = true;
        self
    }

    /// Keep elections in `layout` (default [`EtcdLayout::Tenure`]);
    /// [`EtcdLayout::GoElection`] shares them with Go services that use
    /// `concurrency.Election` on `<prefix>/<election>`.
    pub fn layout(mut self, layout: EtcdLayout) -> Self {
        self.layout = layout;
        self
    }

    /// Use TLS, verifying the server with the CA certificate in `ca_file` (PEM).
    pub fn tls(mut self, ca_file: impl Into<PathBuf>) -> Self {
        self.tls = true;
        self.files.ca = Some(ca_file.into());
        self
    }

    /// Present a client certificate (PEM files) over TLS.
    pub fn client_identity(
        mut self,
        cert_file: impl Into<PathBuf>,
        key_file: impl Into<PathBuf>,
    ) -> Self {
        self.files.cert = Some(cert_file.into());
        self.files.key = Some(key_file.into());
        self
    }

    /// The name to verify the server's certificate against, if not the endpoint's host.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// The endpoints, `host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The key layout of elections.
    pub fn key_layout(&self) -> EtcdLayout {
        self.layout
    }

    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    pub(crate) fn password(&self) -> Option<&str> {
        self.credentials.password()
    }

    /// The gRPC client's TLS settings, with the PEM files read (`None` without TLS).
    pub(crate) fn client_tls(&self) -> Result<Option<ClientTlsConfig>> {
        if !self.tls {
            return Ok(None);
        }
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path)
                .map_err(|e| Error::invalid(format!("{what}: cannot read {}: {e}", path.display())))
        };
        let mut tls = ClientTlsConfig::new();
        let (ca, identity) = self.files.paths();
        if let Some(ca) = ca {
            tls = tls.ca_certificate(Certificate::from_pem(read("ca", ca)?));
        }
        if let Some((cert, key)) = identity {
            tls = tls.identity(Identity::from_pem(read("cert", cert)?, read("key", key)?));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain);
        }
        Ok(Some(tls))
    }

    /// The endpoint URLs for the gRPC client.
    pub(crate) fn endpoint_urls(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|e| format!("{scheme}://{e}"))
            .collect()
    }
}

fn validate_endpoint(endpoint: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::invalid(format!("endpoint {endpoint:?}: {why}")));
    let Some((host, port)) = endpoint.rsplit_once(':') else {
        return bad("expected host:port");
    };
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return bad("the host is empty");
    }
    if let Some(c) = host
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | ':' | '_')))
    {
        return bad(&format!("character {c:?} is not allowed in a host"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => bad(&format!("port {port:?} is not a number from 1 to 65535")),
    }
}

/// etcd's shortest lease.
const MIN_TTL: Duration = Duration::from_secs(1);

/// Errors where etcd cannot keep the TTL at all (below its 1 s lease, or too long);
/// a warning (once per timing and process) where the TTL works but is below the
/// floor that rides out etcd's own raft leader failover: a renewal sent just
/// before the leader fails has `renew_deadline − renew_interval` to be answered,
/// and a 3-member etcd at its default timing (heartbeat 100 ms, election timeout
/// 1 s) left renewals unanswered up to 3.06 s while it elected a new leader
/// (`integration/examples/store_failover.rs`, SIGSTOP 8 s and SIGKILL of the raft
/// leader, 37 runs). With the default shares (TTL/16, TTL × 7/8) that floor is
/// 3.8 s (see the README, *The shortest TTL*).
pub(crate) fn check_ttl(timing: &Timing) -> Result<()> {
    /// The longest a renewal went unanswered while etcd replaced its raft leader.
    const FAILOVER: Duration = Duration::from_millis(3060);
    if timing.ttl < MIN_TTL {
        return Err(Error::invalid(format!(
            "ttl: {:?} is below etcd's shortest lease of 1 s",
            timing.ttl
        )));
    }
    if timing.ttl.as_secs() > i64::MAX as u64 / 2 {
        return Err(Error::invalid(format!("ttl: {:?} is too long", timing.ttl)));
    }
    let floor = FailoverFloor {
        failover: FAILOVER,
        sync_window: Duration::ZERO,
    };
    floor.warn_below("etcd", timing, |shortest| {
        format!(
            "ttl {:?} is below the floor that rides out etcd's own leader failover: a \
             renewal sent just before etcd's raft leader fails has renew_deadline - \
             renew_interval = {:?} to be answered, and etcd at its default timing \
             (election timeout 1 s) left renewals unanswered up to {FAILOVER:?} while it \
             elected a new leader, so a healthy leader can lose its seat then; with these \
             renewal shares the shortest ttl that rides it out is {shortest} (3.8 s with \
             the default shares; see the tenure-etcd README)",
            timing.ttl,
            timing.renew_deadline.saturating_sub(timing.renew_interval),
        )
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::testing::config::{assert_refused, env_lookup};

    #[test]
    fn plain_urls() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["127.0.0.1:2379"]);
        assert_eq!(c.key_prefix(), "tenure");
        assert!(!c.is_tls());
        assert_eq!(c.endpoint_urls(), ["http://127.0.0.1:2379"]);
        let c = EtcdConfig::from_url(
            "ETCD://a:1,b:2/?prefix=app%2Fprod&username=root&password=p%40ss%26w&connect_timeout_ms=700",
        )
        .unwrap();
        assert_eq!(c.endpoints(), ["a:1", "b:2"]);
        assert_eq!(c.key_prefix(), "app/prod");
        assert_eq!(c.username(), Some("root"));
        assert_eq!(c.password(), Some("p@ss&w"));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(700));
        let c = EtcdConfig::from_url("etcd://u:s3cr%3At@[::1]:2379").unwrap();
        assert_eq!(c.username(), Some("u"));
        assert_eq!(c.password(), Some("s3cr:t"));
        assert_eq!(c.endpoints(), ["[::1]:2379"]);
    }

    #[test]
    fn tls_urls() {
        let c =
            EtcdConfig::from_url("etcds://h:2379?ca=/ca.pem&cert=/c.pem&key=/k.pem&domain=etcd")
                .unwrap();
        assert!(c.is_tls());
        assert_eq!(c.endpoint_urls(), ["https://h:2379"]);
        let (ca, id) = c.files.paths();
        assert_eq!(ca, Some(&PathBuf::from("/ca.pem")));
        assert!(id.is_some());
        assert_eq!(c.domain.as_deref(), Some("etcd"));
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("etcd://", "endpoint"),
            ("etcd://host", "host:port"),
            ("etcd://:2379", "host is empty"),
            ("etcd://h:notaport", "port"),
            ("etcd://h:0", "port"),
            ("etcd://h:2379,", "empty host"),
            ("etcd://h:2379/path", "path"),
            ("etcd://h:2379?prefix=/x", "prefix"),
            ("etcd://h:2379?colour=red", "unknown parameter"),
            ("etcd://h:2379?password=x", "without a username"),
            ("etcd://h:2379?connect_timeout_ms=0", "connect_timeout_ms"),
            ("etcd://h:2379?prefix=%zz", "hex digits"),
            ("etcds://h:2379", "ca"),
            ("etcd://h:2379?ca=/x", "etcds"),
            ("etcds://h:2379?ca=/x&cert=/c", "key"),
            ("redis://h:1", "scheme"),
            ("h:2379", "scheme"),
        ];
        assert_refused(EtcdConfig::from_url, &cases);
    }

    #[test]
    fn layouts() {
        let c = EtcdConfig::from_url("etcd://h:2379").unwrap();
        assert_eq!(c.key_layout(), EtcdLayout::Tenure);
        let c = EtcdConfig::from_url("etcd://h:2379?layout=tenure").unwrap();
        assert_eq!(c.key_layout(), EtcdLayout::Tenure);
        assert_eq!(c.to_string(), "etcd://h:2379?prefix=tenure");
        let c =
            EtcdConfig::from_url("etcd://h:2379?layout=go&prefix=%2Fservices%2Fbilling").unwrap();
        assert_eq!(c.key_layout(), EtcdLayout::GoElection);
        assert_eq!(c.key_prefix(), "/services/billing");
        assert_eq!(
            c.to_string(),
            "etcd://h:2379?prefix=/services/billing&layout=go"
        );
        // The Display form parses back to the same settings.
        assert_eq!(EtcdConfig::from_url(&c.to_string()).unwrap(), c);
        let c = EtcdConfig::from_url("etcd://h:2379?prefix=/&layout=go").unwrap();
        assert_eq!(c.key_prefix(), "/");
        let cases = [
            (
                "etcd://h:2379?layout=golang",
                "layout: \"golang\" is not a layout",
            ),
            ("etcd://h:2379?layout=Go", "use tenure"),
            ("etcd://h:2379?layout=", "layout"),
            ("etcd://h:2379?layout=go&layout=tenure", "layout"),
            // A leading '/' only with the Go layout, whose names often have one.
            ("etcd://h:2379?prefix=/x", "allowed with layout=go"),
            ("etcd://h:2379?prefix=/&layout=tenure", "prefix"),
            ("etcd://h:2379?layout=go&prefix=//x", "prefix"),
            ("etcd://h:2379?layout=go&prefix=x/", "prefix"),
            // Go's names would land under tenure's default prefix.
            ("etcd://h:2379?layout=go", "layout=go needs the prefix set"),
        ];
        assert_refused(EtcdConfig::from_url, &cases);
        let e = EtcdConfig::from_url("etcd://h:2379?layout=zk").unwrap_err();
        assert!(
            e.message().contains("tenure") && e.message().contains("go (the keys of Go's"),
            "{e}"
        );
        // Environment and builder.
        let vars = [
            ("TENURE_ETCD_ENDPOINTS", "a:1"),
            ("TENURE_ETCD_LAYOUT", "go"),
            ("TENURE_ETCD_PREFIX", "/svc"),
        ];
        let c = EtcdConfig::from_lookup(env_lookup(&vars)).unwrap();
        assert_eq!(
            (c.key_layout(), c.key_prefix()),
            (EtcdLayout::GoElection, "/svc")
        );
        let vars = [
            ("TENURE_ETCD_ENDPOINTS", "a:1"),
            ("TENURE_ETCD_LAYOUT", "golang"),
        ];
        let e = EtcdConfig::from_lookup(env_lookup(&vars)).unwrap_err();
        assert!(
            e.message()
                .starts_with("TENURE_ETCD_LAYOUT: layout: \"golang\""),
            "{e}"
        );
        let c = EtcdConfig::new(["h:1"])
            .layout(EtcdLayout::GoElection)
            .prefix("/svc");
        c.validate().unwrap();
        assert_eq!(c.key_layout(), EtcdLayout::GoElection);
        assert!(EtcdConfig::new(["h:1"]).prefix("/svc").validate().is_err());
    }

    #[test]
    fn passwords_never_show() {
        let secret = "hunter2-S3CRET";
        let urls = [
            format!("etcd://root:{secret}@127.0.0.1:2379"),
            format!("etcd://127.0.0.1:2379?username=root&password={secret}"),
        ];
        for url in urls {
            let c = EtcdConfig::from_url(&url).unwrap();
            assert_eq!(c.password(), Some(secret));
            let debug = format!("{c:?} {c:#?}");
            let display = c.to_string();
            assert!(!debug.contains(secret), "{debug}");
            assert!(!display.contains(secret), "{display}");
            assert!(debug.contains("<redacted>"));
            assert_eq!(display, "etcd://root@127.0.0.1:2379?prefix=tenure");
        }
        // Errors about a URL with a password do not repeat it.
        for url in [
            format!("etcd://root:{secret}@h:bad"),
            format!("etcd://h:1?username=root&password={secret}&bogus=1"),
            format!("etcd://h:1?username=root&password={secret}%zz"),
        ] {
            let e = EtcdConfig::from_url(&url).unwrap_err();
            assert!(!format!("{e} {e:?}").contains(secret), "{e}");
        }
    }

    #[test]
    fn environment() {
        let vars = [
            ("TENURE_ETCD_ENDPOINTS", "http://a:1, b:2"),
            ("TENURE_ETCD_PREFIX", "svc"),
            ("TENURE_ETCD_USERNAME", "root"),
            ("TENURE_ETCD_PASSWORD", "pw"),
        ];
        let c = EtcdConfig::from_lookup(env_lookup(&vars)).unwrap();
        assert_eq!(c.endpoints(), ["a:1", "b:2"]);
        assert_eq!(c.key_prefix(), "svc");
        assert_eq!(c.password(), Some("pw"));
        assert!(!format!("{c:?}").contains("\"pw\""));
        let e = EtcdConfig::from_lookup(|_| None).unwrap_err();
        assert!(e.message().contains("TENURE_ETCD_ENDPOINTS"), "{e}");
        let vars = [
            ("TENURE_ETCD_ENDPOINTS", "a:1"),
            ("TENURE_ETCD_REQUEST_TIMEOUT_MS", "soon"),
        ];
        let e = EtcdConfig::from_lookup(env_lookup(&vars)).unwrap_err();
        assert!(
            e.message().contains("TENURE_ETCD_REQUEST_TIMEOUT_MS"),
            "{e}"
        );
        let vars = [("TENURE_ETCD_ENDPOINTS", "https://a:1")];
        let e = EtcdConfig::from_lookup(env_lookup(&vars)).unwrap_err();
        assert!(e.message().starts_with("ca"), "{e}");
    }

    #[test]
    fn builder() {
        let c = EtcdConfig::new(["h:1"])
            .prefix("p")
            .credentials("u", "secret-pw")
            .connect_timeout(Duration::from_millis(300))
            .request_timeout(Duration::from_secs(2));
        c.validate().unwrap();
        assert!(!c.to_string().contains("secret-pw"));
        assert!(EtcdConfig::new(Vec::<String>::new()).validate().is_err());
    }
}
