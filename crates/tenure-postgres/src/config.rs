//! Connection settings: builder, URL and environment parsing. The password never
//! appears in `Debug`, `Display`, error messages or logs.

use std::fmt;
use std::time::Duration;

use tenure_core::backend::config::{
    encode, finish, from_env_table, host_port, unknown_key_in, BackendUrl, Credentials, Timeouts,
    TlsFiles,
};
use tenure_core::{Error, Result};

/// The URL scheme of this backend:
/// `postgres://[user[:password]@]host[:port][/database][?…]`.
pub const SCHEME: &str = "postgres";

/// Every URL scheme this backend answers to (`postgresql://` is libpq's other name).
pub const SCHEMES: [&str; 2] = [SCHEME, "postgresql"];

const DEFAULT_PORT: u16 = 5432;
const DEFAULT_USER: &str = "postgres";
const DEFAULT_SCHEMA: &str = "tenure";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest schema name accepted (PostgreSQL's identifiers have 63 bytes).
const MAX_SCHEMA_LEN: usize = 48;

const KEYS: &[&str] = &[
    "schema", "sslmode", "username", "password", "ca", "cert", "key",
];

const ENV_KEYS: &[(&str, &str)] = &[
    ("TENURE_POSTGRES_USERNAME", "username"),
    ("TENURE_POSTGRES_PASSWORD", "password"),
    ("TENURE_POSTGRES_SCHEMA", "schema"),
];

/// How to reach PostgreSQL and where tenure keeps its tables there.
///
/// | setting | default | URL | environment |
/// |---|---|---|---|
/// | host and port | required; port 5432 | `postgres://host:port` | `TENURE_POSTGRES_URL` (required) |
/// | user and password | `postgres`, no password | `postgres://user:password@host` | `TENURE_POSTGRES_USERNAME`, `TENURE_POSTGRES_PASSWORD` (override the URL) |
/// | database | the user name | `postgres://host/database` | in the URL |
/// | schema for tenure's tables and functions | `tenure` | `?schema=` | `TENURE_POSTGRES_SCHEMA` |
/// | TLS, verifying the server's certificate and name | off | `?sslmode=verify-full&ca=/path` | in the URL |
/// | client certificate and key (PEM) for TLS | none | `?cert=/path&key=/path` | in the URL |
/// | connect timeout | 5 s | `?connect_timeout=5s` or `?connect_timeout_ms=5000` | in the URL |
/// | request timeout | 5 s | `?request_timeout=5s` or `?request_timeout_ms=5000` | in the URL |
///
/// `sslmode` is `disable` or `verify-full`: tenure does not offer TLS that trusts any
/// certificate (`require`, `verify-ca` and `prefer` are refused, naming
/// `verify-full`). A bad URL, an unknown parameter, a bad port or schema name is
/// [`ErrorKind::InvalidArgument`](tenure_core::ErrorKind) naming the problem.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct PostgresConfig {
    pub(crate) host: String,
    pub(crate) port: u16,
    pub(crate) credentials: Credentials,
    pub(crate) database: Option<String>,
    pub(crate) schema: String,
    pub(crate) tls: bool,
    pub(crate) files: TlsFiles,
    timeouts: Timeouts,
}

tenure_core::config_timeouts!(PostgresConfig);
tenure_core::config_credentials!(PostgresConfig, "Log in as `username` with `password`.");

/// The URL without the password.
impl fmt::Display for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        write!(
            f,
            "{SCHEME}://{}{host}:{}",
            self.credentials.userinfo(),
            self.port
        )?;
        write!(f, "/{}?schema={}", encode(self.database()), self.schema)?;
        if self.tls {
            f.write_str("&sslmode=verify-full")?;
        }
        Ok(())
    }
}

impl PostgresConfig {
    /// Settings for the server at `host` and `port`, with every default.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        PostgresConfig {
            host: host.into(),
            port,
            credentials: Credentials::default(),
            database: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            tls: false,
            files: TlsFiles::default(),
            timeouts: Timeouts::new(DEFAULT_TIMEOUT),
        }
    }

    /// Parse `postgres://[user[:password]@]host[:port][/database][?param=value&…]`;
    /// see the table above for the parameters.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&SCHEMES)?;
        let [host] = url.hosts.as_slice() else {
            return Err(Error::invalid(
                "url: expected one host (postgres://host[:port])",
            ));
        };
        let (host, port) = host_port(host, Some(DEFAULT_PORT))?;
        let mut config = PostgresConfig::new(host, port);
        config.credentials = url.credentials();
        let database = url.path.trim_start_matches('/');
        if database.contains('/') {
            return Err(Error::invalid(format!(
                "url: the path names the database, one segment (got {database:?})"
            )));
        }
        config.database = (!database.is_empty()).then(|| database.to_owned());
        finish(config, url.query, Self::set, Self::validate)
    }

    /// Read `TENURE_POSTGRES_URL` (required), then let `TENURE_POSTGRES_USERNAME`,
    /// `TENURE_POSTGRES_PASSWORD` and `TENURE_POSTGRES_SCHEMA` override the URL's values.
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    pub(crate) fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let required = (
            "TENURE_POSTGRES_URL",
            "postgres://tenure@127.0.0.1:5432/app",
        );
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
        if self.timeouts.set(key, &value)? || self.files.set(key, value.clone()) {
            return Ok(());
        }
        match key {
            "schema" => self.schema = value,
            "username" | "password" => {
                self.credentials.set(key, value);
            }
            "sslmode" => {
                self.tls = match value.as_str() {
                    "disable" => false,
                    "verify-full" => true,
                    other => {
                        return Err(Error::invalid(format!(
                            "sslmode: {other:?} is not offered; use verify-full (TLS that \
                             checks the server's certificate and name) or disable"
                        )))
                    }
                }
            }
            other => return Err(unknown_key_in(other, &[KEYS, Timeouts::KEYS])),
        }
        Ok(())
    }

    /// Put tenure's tables and functions in `schema` (default `tenure`): lower-case
    /// letters, digits and `_`, starting with a letter or `_`.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Connect over TLS, verifying the server's certificate against the CA in the PEM
    /// file `ca` and its name against the host.
    pub fn tls(mut self, ca: impl Into<String>) -> Self {
        self.tls = true;
        self.files.set("ca", ca.into());
        self
    }

    /// The database (the user name unless the URL's path names one).
    pub fn database(&self) -> &str {
        self.database.as_deref().unwrap_or_else(|| self.user())
    }

    /// The user tenure logs in as.
    pub fn user(&self) -> &str {
        self.credentials.username().unwrap_or(DEFAULT_USER)
    }

    /// Check every setting; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        if self.host.is_empty() {
            return Err(Error::invalid("host: empty"));
        }
        self.credentials.validate()?;
        self.timeouts.validate()?;
        let good = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
        let first = self.schema.chars().next();
        if !self.schema.chars().all(good)
            || first.is_none_or(|c| c.is_ascii_digit())
            || self.schema.len() > MAX_SCHEMA_LEN
        {
            return Err(Error::invalid(format!(
                "schema {:?}: must be 1 to {MAX_SCHEMA_LEN} lower-case letters, digits or _, \
                 not starting with a digit",
                self.schema
            )));
        }
        if !self.tls && (self.files.ca.is_some() || self.files.cert.is_some()) {
            return Err(Error::invalid(
                "ca/cert: TLS files given without sslmode=verify-full",
            ));
        }
        if self.tls && self.files.ca.is_none() {
            return Err(Error::invalid(
                "ca: sslmode=verify-full needs ca=/path/to/ca.pem, the CA that signed the server's certificate",
            ));
        }
        self.files.validate(self.tls, SCHEME, SCHEME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::ErrorKind;

    #[test]
    fn urls() {
        let c = PostgresConfig::from_url("POSTGRESQL://app:p%40ss@db:6000/elections?schema=t1")
            .unwrap();
        assert_eq!((c.host.as_str(), c.port, c.user()), ("db", 6000, "app"));
        assert_eq!((c.database(), c.schema.as_str()), ("elections", "t1"));
        assert_eq!(c.credentials.password(), Some("p@ss"));
        assert_eq!(c.to_string(), "postgres://app@db:6000/elections?schema=t1");
        assert!(!format!("{c:?}").contains("p@ss"));
        let c = PostgresConfig::from_url("postgres://h").unwrap();
        assert_eq!(
            (c.port, c.user(), c.database()),
            (5432, "postgres", "postgres")
        );
        let c = PostgresConfig::from_url("postgres://h?sslmode=verify-full&ca=/ca.pem").unwrap();
        assert!(c.tls);
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, says) in [
            ("postgres://h?schema=Bad", "schema \"Bad\""),
            ("postgres://h?schema=1x", "schema \"1x\""),
            ("postgres://h?sslmode=require", "use verify-full"),
            (
                "postgres://h?sslmode=verify-full",
                "ca: sslmode=verify-full needs",
            ),
            ("postgres://h?ca=/x", "without sslmode=verify-full"),
            ("postgres://h/a/b", "one segment"),
            ("postgres://a,b", "one host"),
            ("postgres://h?nope=1", "nope"),
            ("redis://h", "scheme"),
        ] {
            let e = PostgresConfig::from_url(url).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}");
            assert!(e.message().contains(says), "{url}: {}", e.message());
        }
    }

    #[test]
    fn environment_overrides_the_url() {
        let env = |name: &str| match name {
            "TENURE_POSTGRES_URL" => Some("postgres://u:old@h/db".to_owned()),
            "TENURE_POSTGRES_PASSWORD" => Some("new".to_owned()),
            "TENURE_POSTGRES_SCHEMA" => Some("BAD".to_owned()),
            _ => None,
        };
        let e = PostgresConfig::from_lookup(env).unwrap_err();
        assert!(e.message().contains("schema \"BAD\""), "{e}");
        let env = |name: &str| match name {
            "TENURE_POSTGRES_URL" => Some("postgres://u:old@h/db".to_owned()),
            "TENURE_POSTGRES_PASSWORD" => Some("new".to_owned()),
            _ => None,
        };
        let c = PostgresConfig::from_lookup(env).unwrap();
        assert_eq!(c.credentials.password(), Some("new"));
    }
}
