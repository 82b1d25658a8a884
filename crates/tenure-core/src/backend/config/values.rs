//! The values backends take from a URL or the environment: numbers, durations and
//! flags, timeouts, TLS files and credentials, and the environment overrides, each
//! with the error that names its key.

use std::path::PathBuf;
use std::time::Duration;

use super::{encode, Secret};
use crate::error::{Error, Result};

/// The error for a key a backend does not know; `known` lists the ones it does.
pub fn unknown_key(key: &str, known: &[&str]) -> Error {
    Error::invalid(format!(
        "url: unknown parameter {key:?} (known: {})",
        known.join(", ")
    ))
}

/// A positive number of milliseconds (`key` names the setting in errors).
pub fn parse_millis(key: &str, value: &str) -> Result<Duration> {
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::invalid(format!(
            "{key}: {value:?} is not a positive number of milliseconds"
        ))),
    }
}

/// A duration with a unit: `1500ms`, `10s`, `2.5s`, `2m` (`key` names the setting in
/// errors). The unit is required, so `1500` is never taken for seconds by mistake.
pub fn parse_duration(key: &str, value: &str) -> Result<Duration> {
    let v = value.trim();
    let (number, unit) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, f64::NAN)
    };
    let secs = number.trim().parse::<f64>().ok().map(|n| n * unit);
    match secs {
        Some(secs) if secs.is_finite() && (0.0..1e9).contains(&secs) => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(Error::invalid(format!(
            "{key}: {v:?} is not a duration like 250ms, 1.5s or 2m"
        ))),
    }
}

/// A boolean: `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`, any case.
pub fn parse_bool(key: &str, value: &str) -> Result<bool> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(Error::invalid(format!(
            "{key}: {value:?} is not true or false"
        ))),
    }
}

/// A whole number from `min` to `max`.
pub fn parse_number(key: &str, value: &str, min: u64, max: u64) -> Result<u64> {
    match value.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(Error::invalid(format!(
            "{key}: {value:?} is not a whole number from {min} to {max}"
        ))),
    }
}

/// The two timeouts every store's config has, with one grammar on every backend:
/// `connect_timeout=` and `request_timeout=` take a duration with a unit (`750ms`,
/// `2s`), the `…_ms=` forms plain milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// The longest connecting may take.
    pub connect: Duration,
    /// The longest one request may wait for its answer.
    pub request: Duration,
}

impl Timeouts {
    /// The URL keys [`set`](Self::set) takes.
    pub const KEYS: &'static [&'static str] = &[
        "connect_timeout",
        "request_timeout",
        "connect_timeout_ms",
        "request_timeout_ms",
    ];

    /// Both timeouts at `default`.
    pub const fn new(default: Duration) -> Self {
        Timeouts {
            connect: default,
            request: default,
        }
    }

    /// Apply one of [`KEYS`](Self::KEYS); `Ok(false)` if `key` is not one of them.
    pub fn set(&mut self, key: &str, value: &str) -> Result<bool> {
        let (slot, ms) = match key {
            "connect_timeout" => (&mut self.connect, false),
            "request_timeout" => (&mut self.request, false),
            "connect_timeout_ms" => (&mut self.connect, true),
            "request_timeout_ms" => (&mut self.request, true),
            _ => return Ok(false),
        };
        *slot = if ms {
            parse_millis(key, value)?
        } else {
            parse_duration(key, value)?
        };
        Ok(true)
    }

    /// Both positive; the error names the one that is not.
    pub fn validate(&self) -> Result<()> {
        for (name, d) in [
            ("connect_timeout", self.connect),
            ("request_timeout", self.request),
        ] {
            if d.is_zero() {
                return Err(Error::invalid(format!("{name}: must be greater than zero")));
            }
        }
        Ok(())
    }
}

/// The TLS files of a store's config (`ca=`, `cert=`, `key=`: PEM paths).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate that signed the server's certificate.
    pub ca: Option<PathBuf>,
    /// The client certificate to present.
    pub cert: Option<PathBuf>,
    /// The client certificate's private key.
    pub key: Option<PathBuf>,
}

impl TlsFiles {
    /// The URL keys [`set`](Self::set) takes.
    pub const KEYS: &'static [&'static str] = &["ca", "cert", "key"];

    /// Apply one of [`KEYS`](Self::KEYS); false if `key` is not one of them.
    pub fn set(&mut self, key: &str, value: String) -> bool {
        let slot = match key {
            "ca" => &mut self.ca,
            "cert" => &mut self.cert,
            "key" => &mut self.key,
            _ => return false,
        };
        *slot = Some(value.into());
        true
    }

    /// The files fit the connection: none over a plain one (`plain` and `secure`
    /// name the two schemes in the message), a certificate only with its key.
    pub fn validate(&self, tls: bool, plain: &str, secure: &str) -> Result<()> {
        if !tls && (self.ca.is_some() || self.cert.is_some()) {
            return Err(Error::invalid(format!(
                "ca/cert: TLS files given for a plain {plain}:// connection; use {secure}://"
            )));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(Error::invalid(
                "cert/key: a client certificate needs both cert= and key=",
            ));
        }
        Ok(())
    }

    /// The CA certificate and the client identity (certificate and key, when both are
    /// given), as the TLS setup takes them.
    pub fn paths(&self) -> (Option<&PathBuf>, Option<(&PathBuf, &PathBuf)>) {
        let identity = match (&self.cert, &self.key) {
            (Some(c), Some(k)) => Some((c, k)),
            _ => None,
        };
        (self.ca.as_ref(), identity)
    }
}

/// The user name and password of a store's config (`user:password@` before the hosts,
/// or `username=` and `password=`); the password shows only as `<redacted>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The user name.
    pub username: Option<String>,
    /// The password.
    pub password: Option<Secret>,
}

impl Credentials {
    /// `username` with `password`.
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            username: Some(username.into()),
            password: Some(Secret::new(password)),
        }
    }

    /// Apply `username=` (also `user=`) or `password=`; false if `key` is neither.
    pub fn set(&mut self, key: &str, value: String) -> bool {
        match key {
            "username" | "user" => self.username = Some(value),
            "password" => self.password = Some(Secret::new(value)),
            _ => return false,
        }
        true
    }

    /// The user name, if any.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The password, if any, for logging in (never to show).
    pub fn password(&self) -> Option<&str> {
        self.password.as_ref().map(Secret::expose)
    }

    /// The user part of the URL a config shows: `user@` (percent-encoded), or nothing.
    pub fn userinfo(&self) -> String {
        self.username
            .as_deref()
            .map_or_else(String::new, |user| format!("{}@", encode(user)))
    }

    /// A user name given is not empty.
    pub fn check_username(&self) -> Result<()> {
        if self.username.as_deref() == Some("") {
            return Err(Error::invalid("username: must not be empty"));
        }
        Ok(())
    }

    /// [`check_username`](Self::check_username), and a password comes with a user name.
    pub fn validate(&self) -> Result<()> {
        self.check_username()?;
        if self.password.is_some() && self.username.is_none() {
            return Err(Error::invalid("password: given without a username"));
        }
        Ok(())
    }
}

/// The end of every store's `from_url`: apply the query's pairs to `config` in order
/// with `set` (an unknown key is its error), then `validate` the whole.
pub fn finish<C>(
    mut config: C,
    query: Vec<(String, String)>,
    set: impl Fn(&mut C, &str, String) -> Result<()>,
    validate: impl Fn(&C) -> Result<()>,
) -> Result<C> {
    for (key, value) in query {
        set(&mut config, &key, value)?;
    }
    validate(&config)?;
    Ok(config)
}

/// [`unknown_key`] for a backend whose keys are its own table plus shared ones.
pub fn unknown_key_in(key: &str, tables: &[&[&str]]) -> Error {
    unknown_key(key, &tables.concat())
}

/// Apply environment overrides: for each `(variable, key)` of `table` whose variable is
/// set to something other than blanks (read through `get`, so tests need not touch the
/// process environment), call `set(key, value)`. An error names the variable.
pub fn env_overrides(
    get: impl Fn(&str) -> Option<String>,
    table: &[(&str, &str)],
    mut set: impl FnMut(&str, String) -> Result<()>,
) -> Result<()> {
    for (variable, key) in table {
        let Some(value) = get(variable).filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        set(key, value)
            .map_err(|e| Error::invalid(format!("{variable}: {}", without_url(e.message()))))?;
    }
    Ok(())
}

/// The whole of a store's `from_env`, read through `get`: the variable `required` must
/// be set (else an error that shows `example`), `build` makes the config from its
/// value, then the overrides of `table` apply with `set` (see [`env_overrides`]) and
/// `validate` checks the whole. Errors name the variable they come from.
pub fn from_env_table<C>(
    get: impl Fn(&str) -> Option<String>,
    (required, example): (&str, &str),
    build: impl FnOnce(&str) -> Result<C>,
    table: &[(&str, &str)],
    set: impl Fn(&mut C, &str, String) -> Result<()>,
    validate: impl Fn(&C) -> Result<()>,
) -> Result<C> {
    let value = get(required)
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| Error::invalid(format!("{required}: not set (e.g. {example})")))?;
    let mut config =
        build(value.trim()).map_err(|e| Error::invalid(format!("{required}: {}", e.message())))?;
    env_overrides(&get, table, |key, value| set(&mut config, key, value))?;
    validate(&config)?;
    Ok(config)
}

fn without_url(message: &str) -> &str {
    message.strip_prefix("url: ").unwrap_or(message)
}

/// The constructors every store backend offers, written once: for a backend `B` with
/// config `C` (which has `from_url`, `from_env`, and `B::connect(C)` and `B::config()`),
/// `B::from_url`, `B::from_env`, `C::connect`, and `B`'s `Debug`, which shows its config
/// (whose own `Debug` redacts secrets).
#[macro_export]
macro_rules! store_constructors {
    ($backend:ident, $config:ident) => {
        impl $backend {
            #[doc = concat!("Parse `url` with [`", stringify!($config), "::from_url`] and connect.")]
            pub async fn from_url(url: &str) -> $crate::Result<Self> {
                $config::from_url(url)?.connect().await
            }

            #[doc = concat!("Read the settings with [`", stringify!($config), "::from_env`] and connect.")]
            pub async fn from_env() -> $crate::Result<Self> {
                $config::from_env()?.connect().await
            }
        }

        impl $config {
            #[doc = concat!("Connect with these settings; see [`", stringify!($backend), "::connect`].")]
            pub async fn connect(self) -> $crate::Result<$backend> {
                $backend::connect(self).await
            }
        }

        impl ::std::fmt::Debug for $backend {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.debug_struct(stringify!($backend))
                    .field("config", self.config())
                    .finish()
            }
        }
    };
}

/// The timeout settings of a store's config, written once: for a config type with a
/// `timeouts: Timeouts` field, the builders `connect_timeout(d)` and
/// `request_timeout(d)` and the getters `get_connect_timeout()` and
/// `get_request_timeout()`.
#[macro_export]
macro_rules! config_timeouts {
    ($config:ident) => {
        impl $config {
            /// The longest connecting (and the first answer) may take (default 5 s).
            pub fn connect_timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.timeouts.connect = timeout;
                self
            }

            /// The longest any single request may wait for its answer (default 5 s).
            pub fn request_timeout(mut self, timeout: ::std::time::Duration) -> Self {
                self.timeouts.request = timeout;
                self
            }

            /// The connect timeout.
            pub fn get_connect_timeout(&self) -> ::std::time::Duration {
                self.timeouts.connect
            }

            /// The request timeout.
            pub fn get_request_timeout(&self) -> ::std::time::Duration {
                self.timeouts.request
            }
        }
    };
}

/// The credential settings of a store's config, written once: for a config type with a
/// `credentials: Credentials` field, the builder `credentials(username, password)`
/// (documented by `doc`) and the getter `username()`.
#[macro_export]
macro_rules! config_credentials {
    ($config:ident, $doc:literal) => {
        impl $config {
            #[doc = $doc]
            pub fn credentials(
                mut self,
                username: impl Into<String>,
                password: impl Into<String>,
            ) -> Self {
                self.credentials = $crate::backend::config::Credentials::new(username, password);
                self
            }

            /// The user name, if any.
            pub fn username(&self) -> Option<&str> {
                self.credentials.username()
            }
        }
    };
}
