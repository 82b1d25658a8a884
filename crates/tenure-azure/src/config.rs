//! Connection settings: builder, URL, connection-string and environment parsing. Account
//! keys, SAS tokens and token credentials never appear in `Debug`, `Display`, error
//! messages or logs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use tenure_core::backend::config::{
    parse_bool, parse_millis, unknown_key_in, BackendUrl, Timeouts,
};
use tenure_core::{Error, Result};

/// The URL scheme of this backend: `azblob://account/container[/prefix][?…]`.
pub const SCHEME: &str = "azblob";

/// The URL query keys.
const KEYS: &[&str] = &["endpoint", "auth", "create_container", "poll_interval_ms"];

/// Default for [`AzureConfig::connect_timeout`] and [`AzureConfig::request_timeout`].
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`AzureConfig::poll_interval`].
const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest poll interval accepted.
pub(crate) const MIN_POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The longest blob-name prefix accepted, in bytes.
const MAX_PREFIX_LEN: usize = 200;
/// Azurite's development account.
pub(crate) const DEV_ACCOUNT: &str = "devstoreaccount1";
/// Azurite's published development account key (not a secret).
pub(crate) const DEV_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Azurite's default blob endpoint for the development account.
const DEV_ENDPOINT: &str = "http://127.0.0.1:10000/devstoreaccount1";

/// How requests are authorised.
#[derive(Clone)]
pub(crate) enum Credential {
    /// Shared key: every request is signed with HMAC-SHA256 of the account key.
    SharedKey(String),
    /// A shared access signature appended to every request's query.
    Sas(String),
    /// Entra ID tokens (bearer), from any `azure_core` token credential.
    Token(Arc<dyn TokenCredential>),
    /// Entra ID through a credential chosen when connecting (see [`EntraSource`]).
    Entra(EntraSource),
}

/// Which Entra ID credential `auth=` picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntraSource {
    /// `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET` if all are set, else the
    /// developer tools (Azure CLI, Azure Developer CLI).
    Auto,
    /// The managed identity of the host (system-assigned, or `AZURE_CLIENT_ID`).
    ManagedIdentity,
    /// The Azure CLI or Azure Developer CLI login.
    DeveloperTools,
}

impl Credential {
    fn kind(&self) -> &'static str {
        match self {
            Credential::SharedKey(_) => "shared key",
            Credential::Sas(_) => "shared access signature",
            Credential::Token(_) => "token credential",
            Credential::Entra(EntraSource::Auto) => "Entra ID (auto)",
            Credential::Entra(EntraSource::ManagedIdentity) => "Entra ID (managed identity)",
            Credential::Entra(EntraSource::DeveloperTools) => "Entra ID (developer tools)",
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} <redacted>", self.kind())
    }
}

impl PartialEq for Credential {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Credential::SharedKey(a), Credential::SharedKey(b)) => a == b,
            (Credential::Sas(a), Credential::Sas(b)) => a == b,
            (Credential::Token(a), Credential::Token(b)) => Arc::ptr_eq(a, b),
            (Credential::Entra(a), Credential::Entra(b)) => a == b,
            _ => false,
        }
    }
}

/// Where tenure keeps its blobs in Azure Blob Storage and how it gets there.
///
/// | setting | default | URL `azblob://account/container[/prefix]?…` | environment |
/// |---|---|---|---|
/// | account | required | the host part | `AZURE_STORAGE_ACCOUNT` (if the URL has none) or the connection string's `AccountName` |
/// | container | required | the first path segment | — |
/// | blob-name prefix | none | the rest of the path | — |
/// | blob endpoint | `https://<account>.blob.core.windows.net` | `?endpoint=` | the connection string's `BlobEndpoint` (or `DefaultEndpointsProtocol` + `EndpointSuffix`) |
/// | credentials | Entra ID | `?auth=key\|sas\|entra\|managed_identity\|developer_tools` (which source to use; never the secret itself) | `AZURE_STORAGE_CONNECTION_STRING`, `AZURE_STORAGE_KEY`, `AZURE_STORAGE_SAS_TOKEN`; Entra ID: `AZURE_TENANT_ID` + `AZURE_CLIENT_ID` + `AZURE_CLIENT_SECRET`, else the Azure CLI login |
/// | create the container if missing | yes | `?create_container=false` | — |
/// | poll interval: how often waiters try to acquire and observers read | 1 s (at least 100 ms) | `?poll_interval_ms=` | — |
/// | connect timeout | 5 s | `?connect_timeout=5s` or `?connect_timeout_ms=5000` | — |
/// | request timeout | 5 s | `?request_timeout=5s` or `?request_timeout_ms=5000` | — |
///
/// A bad URL, an unknown parameter or a bad value is
/// [`ErrorKind::InvalidArgument`](tenure_core::ErrorKind) naming the problem; messages
/// never repeat a key or a signature.
#[derive(Clone, PartialEq)]
pub struct AzureConfig {
    account: String,
    container: String,
    prefix: String,
    endpoint: Option<String>,
    credential: Option<Credential>,
    create_container: bool,
    poll_interval: Duration,
    timeouts: Timeouts,
}

tenure_core::config_timeouts!(AzureConfig);

impl fmt::Debug for AzureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureConfig")
            .field("account", &self.account)
            .field("container", &self.container)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.blob_endpoint())
            .field(
                "credential",
                &self
                    .credential
                    .as_ref()
                    .map(|c| format!("{} <redacted>", c.kind())),
            )
            .field("create_container", &self.create_container)
            .field("poll_interval", &self.poll_interval)
            .field("timeouts", &self.timeouts)
            .finish()
    }
}

/// The URL without credentials:
/// `azblob://account/container[/prefix]?endpoint=…&poll_interval_ms=…`.
impl fmt::Display for AzureConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}://{}/{}", self.account, self.container)?;
        if !self.prefix.is_empty() {
            write!(f, "/{}", self.prefix)?;
        }
        write!(
            f,
            "?endpoint={}&poll_interval_ms={}",
            self.blob_endpoint(),
            self.poll_interval.as_millis()
        )
    }
}

impl AzureConfig {
    /// Settings for `container` in storage `account`, with every default (Entra ID
    /// credentials from the environment unless another credential is set).
    pub fn new(account: impl Into<String>, container: impl Into<String>) -> Self {
        AzureConfig {
            account: account.into(),
            container: container.into(),
            prefix: String::new(),
            endpoint: None,
            credential: None,
            create_container: true,
            poll_interval: DEFAULT_POLL_INTERVAL,
            timeouts: Timeouts::new(DEFAULT_TIMEOUT),
        }
    }

    /// Settings for Azurite's development account (`devstoreaccount1` with its published
    /// key) at `endpoint` (e.g. `http://127.0.0.1:10000/devstoreaccount1`).
    pub fn development(endpoint: impl Into<String>, container: impl Into<String>) -> Self {
        AzureConfig::new(DEV_ACCOUNT, container)
            .endpoint(endpoint)
            .shared_key(DEV_KEY)
    }

    /// Parse `azblob://account/container[/prefix][?param=value&…]`; credentials come
    /// from the environment (see the table above) unless set later with a builder
    /// method.
    pub fn from_url(url: &str) -> Result<Self> {
        Self::from_url_with(url, |name| std::env::var(name).ok())
    }

    /// Read everything from the environment: `TENURE_AZURE_URL` (required; any URL
    /// [`from_url`](Self::from_url) takes) plus the credential variables.
    pub fn from_env() -> Result<Self> {
        let get = |name: &str| std::env::var(name).ok();
        let url = get("TENURE_AZURE_URL")
            .filter(|v| !v.trim().is_empty())
            .ok_or_else(|| {
                Error::invalid(
                    "TENURE_AZURE_URL: not set (e.g. azblob://myaccount/elections)".to_string(),
                )
            })?;
        Self::from_url_with(url.trim(), get)
            .map_err(|e| Error::invalid(format!("TENURE_AZURE_URL: {}", e.message())))
    }

    pub(crate) fn from_url_with(url: &str, get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let var = |name: &str| get(name).filter(|v| !v.trim().is_empty());
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[SCHEME])?;
        url.forbid_userinfo(
            "use AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN or AZURE_STORAGE_CONNECTION_STRING",
        )?;
        let account = match url.hosts.as_slice() {
            [] => String::new(),
            [account] => account.clone(),
            _ => {
                return Err(Error::invalid(
                    "url: expected one account (azblob://account/container[/prefix])",
                ))
            }
        };
        let path = url.path.strip_prefix('/').unwrap_or(&url.path);
        let (container, prefix) = path.split_once('/').unwrap_or((path, ""));
        let mut config = AzureConfig::new(account, container);
        config.prefix = prefix.trim_end_matches('/').to_string();
        let mut auth = None;
        for (key, value) in url.query {
            if key == "auth" {
                auth = Some(value);
            } else {
                config.set(&key, value)?;
            }
        }
        // Credentials: a connection string first (it may also name the account and the
        // endpoint), then a key, then a SAS, else Entra ID.
        let conn = var("AZURE_STORAGE_CONNECTION_STRING");
        let key = var("AZURE_STORAGE_KEY");
        let sas = var("AZURE_STORAGE_SAS_TOKEN");
        if config.account.is_empty() {
            if let Some(a) = var("AZURE_STORAGE_ACCOUNT") {
                config.account = a;
            }
        }
        let credential = match auth.as_deref() {
            None | Some("") | Some("auto") => {
                if let Some(c) = conn {
                    config.apply_connection_string(&c)?;
                    config.credential.clone()
                } else if let Some(k) = key {
                    Some(Credential::SharedKey(k))
                } else {
                    sas.map(Credential::Sas)
                        .or(Some(Credential::Entra(EntraSource::Auto)))
                }
            }
            Some("connection_string") => {
                let c = conn.ok_or_else(|| {
                    Error::invalid(
                        "auth=connection_string: AZURE_STORAGE_CONNECTION_STRING is not set",
                    )
                })?;
                config.apply_connection_string(&c)?;
                config.credential.clone()
            }
            Some("key") => {
                Some(Credential::SharedKey(key.ok_or_else(|| {
                    Error::invalid("auth=key: AZURE_STORAGE_KEY is not set")
                })?))
            }
            Some("sas") => Some(Credential::Sas(sas.ok_or_else(|| {
                Error::invalid("auth=sas: AZURE_STORAGE_SAS_TOKEN is not set")
            })?)),
            Some("entra") => Some(Credential::Entra(EntraSource::Auto)),
            Some("managed_identity") => Some(Credential::Entra(EntraSource::ManagedIdentity)),
            Some("developer_tools") => Some(Credential::Entra(EntraSource::DeveloperTools)),
            Some(other) => {
                return Err(Error::invalid(format!(
                    "auth: {other:?} is not one of auto, connection_string, key, sas, entra, \
                     managed_identity, developer_tools"
                )))
            }
        };
        config.credential = credential;
        config.validate()?;
        Ok(config)
    }

    /// Take the account, endpoint and credential from an Azure Storage connection string
    /// (`UseDevelopmentStorage=true`, or `AccountName=…;AccountKey=…;BlobEndpoint=…`,
    /// or `…;SharedAccessSignature=…`). The container and prefix stay as they are.
    pub fn connection_string(mut self, connection_string: &str) -> Result<Self> {
        self.apply_connection_string(connection_string)?;
        Ok(self)
    }

    fn apply_connection_string(&mut self, s: &str) -> Result<()> {
        let mut fields = std::collections::HashMap::new();
        for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, v)) = part.split_once('=') else {
                return Err(Error::invalid(
                    "connection string: every part must be Name=value",
                ));
            };
            fields.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
        if fields
            .get("usedevelopmentstorage")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        {
            let endpoint = fields
                .get("developmentstorageproxyuri")
                .map(|p| format!("{}/{DEV_ACCOUNT}", p.trim_end_matches('/')))
                .unwrap_or_else(|| DEV_ENDPOINT.to_string());
            self.account = DEV_ACCOUNT.to_string();
            self.endpoint = Some(endpoint);
            self.credential = Some(Credential::SharedKey(DEV_KEY.to_string()));
            return Ok(());
        }
        if let Some(a) = fields.get("accountname") {
            self.account = a.clone();
        }
        if let Some(e) = fields.get("blobendpoint") {
            self.endpoint = Some(e.clone());
        } else if let Some(suffix) = fields.get("endpointsuffix") {
            let protocol = fields
                .get("defaultendpointsprotocol")
                .map(String::as_str)
                .unwrap_or("https");
            self.endpoint = Some(format!("{protocol}://{}.blob.{suffix}", self.account));
        }
        if let Some(k) = fields.get("accountkey") {
            self.credential = Some(Credential::SharedKey(k.clone()));
        } else if let Some(sas) = fields.get("sharedaccesssignature") {
            self.credential = Some(Credential::Sas(sas.clone()));
        } else {
            return Err(Error::invalid(
                "connection string: needs AccountKey or SharedAccessSignature (or UseDevelopmentStorage=true)",
            ));
        }
        Ok(())
    }

    fn set(&mut self, key: &str, value: String) -> Result<()> {
        if self.timeouts.set(key, &value)? {
            return Ok(());
        }
        match key {
            "endpoint" => self.endpoint = Some(value),
            "create_container" => self.create_container = parse_bool(key, &value)?,
            "poll_interval_ms" => self.poll_interval = parse_millis(key, &value)?,
            "key" | "sas" | "sig" | "accountkey" | "account_key" => {
                return Err(Error::invalid(format!(
                    "url: parameter {key:?}: secrets do not go in the URL; use \
                     AZURE_STORAGE_KEY, AZURE_STORAGE_SAS_TOKEN or AZURE_STORAGE_CONNECTION_STRING"
                )))
            }
            other => return Err(unknown_key_in(other, &[KEYS, Timeouts::KEYS])),
        }
        Ok(())
    }

    /// Check every setting; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        let a = &self.account;
        if a.is_empty() {
            return Err(Error::invalid(
                "account: missing (azblob://ACCOUNT/container, or AZURE_STORAGE_ACCOUNT)",
            ));
        }
        if a.len() > 64
            || !a
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Err(Error::invalid(format!(
                "account {a:?}: must be up to 64 lowercase letters and digits"
            )));
        }
        let c = &self.container;
        let valid_container = (3..=63).contains(&c.len())
            && c.chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-')
            && !c.starts_with('-')
            && !c.ends_with('-')
            && !c.contains("--");
        if !valid_container {
            return Err(Error::invalid(format!(
                "container {c:?}: must be 3 to 63 lowercase letters, digits and single \
                 hyphens, starting and ending with a letter or digit"
            )));
        }
        let p = &self.prefix;
        if p.len() > MAX_PREFIX_LEN {
            return Err(Error::invalid(format!(
                "prefix: {} bytes, the limit is {MAX_PREFIX_LEN}",
                p.len()
            )));
        }
        if !p.is_empty() {
            if let Some(ch) = p
                .chars()
                .find(|ch| !(ch.is_ascii_alphanumeric() || matches!(ch, '-' | '_' | '.' | '/')))
            {
                return Err(Error::invalid(format!(
                    "prefix {p:?}: character {ch:?} is not allowed (ASCII letters, digits, '-', '_', '.', '/')"
                )));
            }
            if p.split('/').any(|s| s.is_empty() || s == "." || s == "..") {
                return Err(Error::invalid(format!(
                    "prefix {p:?}: no empty, '.' or '..' segments"
                )));
            }
        }
        let endpoint = self.blob_endpoint();
        match url::Url::parse(&endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err(Error::invalid(format!(
                    "endpoint {endpoint:?}: not an http(s) URL with a host"
                )))
            }
        }
        if endpoint.contains('?') {
            return Err(Error::invalid(
                "endpoint: must not carry a query (a SAS goes in AZURE_STORAGE_SAS_TOKEN)",
            ));
        }
        if self.poll_interval < MIN_POLL_INTERVAL {
            return Err(Error::invalid(format!(
                "poll_interval: {:?} is below the minimum {MIN_POLL_INTERVAL:?}",
                self.poll_interval
            )));
        }
        self.timeouts.validate()?;
        match &self.credential {
            Some(Credential::SharedKey(k))
                if azure_core::base64::decode(k).map_or(true, |b| b.is_empty()) =>
            {
                return Err(Error::invalid(
                    "account key: not base64 (check AZURE_STORAGE_KEY or AccountKey)",
                ));
            }
            Some(Credential::Sas(s)) if s.trim_start_matches('?').is_empty() => {
                return Err(Error::invalid("shared access signature: empty"));
            }
            _ => {}
        }
        Ok(())
    }

    /// Keep tenure's blobs under `prefix/` in the container (default: none).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into().trim_matches('/').to_string();
        self
    }

    /// The blob service endpoint, e.g. `http://127.0.0.1:10000/devstoreaccount1` for
    /// Azurite (default `https://<account>.blob.core.windows.net`).
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// Sign requests with the account's shared key (base64, as the portal shows it).
    pub fn shared_key(mut self, key: impl Into<String>) -> Self {
        self.credential = Some(Credential::SharedKey(key.into()));
        self
    }

    /// Append a shared access signature (`sv=…&sig=…`, with or without `?`) to every
    /// request.
    pub fn sas(mut self, sas: impl Into<String>) -> Self {
        self.credential = Some(Credential::Sas(sas.into()));
        self
    }

    /// Authenticate with Entra ID tokens from `credential` (any `azure_identity`
    /// credential); needs an `https` endpoint.
    pub fn token_credential(mut self, credential: Arc<dyn TokenCredential>) -> Self {
        self.credential = Some(Credential::Token(credential));
        self
    }

    /// Create the container when it is missing (default true). When false, a missing
    /// container is `InvalidArgument`.
    pub fn create_container(mut self, create: bool) -> Self {
        self.create_container = create;
        self
    }

    /// How often a waiting candidate tries to acquire the lease and an observer reads
    /// the blob (default 1 s, at least 100 ms). Handover after a resign takes up to one
    /// interval; waiters try again after a random 80–100 % of it.
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The storage account.
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The container.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The blob-name prefix (empty if none).
    pub fn blob_prefix(&self) -> &str {
        &self.prefix
    }

    /// The blob service endpoint.
    pub fn blob_endpoint(&self) -> String {
        match &self.endpoint {
            Some(e) => e.trim_end_matches('/').to_string(),
            None => format!("https://{}.blob.core.windows.net", self.account),
        }
    }

    /// Whether a missing container is created.
    pub fn creates_container(&self) -> bool {
        self.create_container
    }

    /// The poll interval.
    pub fn get_poll_interval(&self) -> Duration {
        self.poll_interval
    }

    /// Which kind of credential is configured (`"shared key"`, …), never the secret.
    pub fn credential_kind(&self) -> &'static str {
        self.credential
            .as_ref()
            .map_or("Entra ID (auto)", Credential::kind)
    }

    pub(crate) fn credential(&self) -> Credential {
        self.credential
            .clone()
            .unwrap_or(Credential::Entra(EntraSource::Auto))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use tenure_core::ErrorKind;

    fn parse(url: &str, env: &[(&str, &str)]) -> Result<AzureConfig> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        AzureConfig::from_url_with(url, |k| env.get(k).cloned())
    }

    #[test]
    fn urls() {
        let c = parse("azblob://acct/elections", &[]).unwrap();
        assert_eq!(
            (c.account(), c.container(), c.blob_prefix()),
            ("acct", "elections", "")
        );
        assert_eq!(c.blob_endpoint(), "https://acct.blob.core.windows.net");
        assert_eq!(c.credential_kind(), "Entra ID (auto)");
        assert!(c.creates_container());
        let c = parse(
            "AZBLOB://devstoreaccount1/c-1/svc/a/?endpoint=http%3A%2F%2F127.0.0.1%3A10000%2Fdevstoreaccount1&poll_interval_ms=100&connect_timeout_ms=700&request_timeout_ms=800&create_container=false",
            &[("AZURE_STORAGE_KEY", DEV_KEY)],
        )
        .unwrap();
        assert_eq!(c.blob_prefix(), "svc/a");
        assert_eq!(c.blob_endpoint(), DEV_ENDPOINT);
        assert_eq!(c.get_poll_interval(), Duration::from_millis(100));
        assert_eq!(c.get_connect_timeout(), Duration::from_millis(700));
        assert_eq!(c.get_request_timeout(), Duration::from_millis(800));
        assert!(!c.creates_container());
        assert_eq!(c.credential_kind(), "shared key");
        let c = parse(
            "azblob:///ccc",
            &[
                ("AZURE_STORAGE_ACCOUNT", "fromenv"),
                ("AZURE_STORAGE_SAS_TOKEN", "?sv=1&sig=x"),
            ],
        )
        .unwrap();
        assert_eq!(c.account(), "fromenv");
        assert_eq!(c.credential_kind(), "shared access signature");
        let c = parse(
            "azblob://x/ccc?auth=managed_identity",
            &[("AZURE_STORAGE_KEY", DEV_KEY)],
        )
        .unwrap();
        assert_eq!(c.credential_kind(), "Entra ID (managed identity)");
    }

    #[test]
    fn connection_strings() {
        let c = parse(
            "azblob:///ccc",
            &[(
                "AZURE_STORAGE_CONNECTION_STRING",
                "UseDevelopmentStorage=true",
            )],
        )
        .unwrap();
        assert_eq!(c.account(), DEV_ACCOUNT);
        assert_eq!(c.blob_endpoint(), DEV_ENDPOINT);
        assert_eq!(c.credential(), Credential::SharedKey(DEV_KEY.into()));
        let c = parse(
            "azblob:///ccc",
            &[(
                "AZURE_STORAGE_CONNECTION_STRING",
                "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:5/devstoreaccount1;",
            )],
        )
        .unwrap();
        assert_eq!(c.blob_endpoint(), "http://127.0.0.1:5/devstoreaccount1");
        assert_eq!(c.credential(), Credential::SharedKey("a2V5".into()));
        let c = AzureConfig::new("x", "ccc")
            .connection_string("AccountName=acct;SharedAccessSignature=sv=1&sig=abc;EndpointSuffix=core.windows.net")
            .unwrap();
        assert_eq!(c.account(), "acct");
        assert_eq!(c.blob_endpoint(), "https://acct.blob.core.windows.net");
        assert_eq!(c.credential_kind(), "shared access signature");
        assert!(AzureConfig::new("x", "ccc")
            .connection_string("AccountName=a")
            .is_err());
        assert!(AzureConfig::new("x", "ccc")
            .connection_string("garbage")
            .is_err());
    }

    #[test]
    fn bad_urls_name_the_problem() {
        for (url, needle) in [
            ("azblob://", "account"),
            ("azblob://acct", "container"),
            ("azblob://acct/AB", "container"),
            ("azblob://acct/a--b", "container"),
            ("azblob://Acct/abc", "account"),
            ("azblob://acct/abc/a//b", "prefix"),
            ("azblob://acct/abc/a b", "prefix"),
            ("azblob://acct/abc?colour=red", "unknown parameter"),
            ("azblob://acct/abc?poll_interval_ms=10", "poll_interval"),
            (
                "azblob://acct/abc?poll_interval_ms=soon",
                "poll_interval_ms",
            ),
            (
                "azblob://acct/abc?connect_timeout_ms=0",
                "connect_timeout_ms",
            ),
            (
                "azblob://acct/abc?create_container=maybe",
                "create_container",
            ),
            ("azblob://acct/abc?endpoint=ftp://x", "endpoint"),
            ("azblob://acct/abc?auth=password", "auth"),
            ("azblob://acct/abc?auth=key", "AZURE_STORAGE_KEY"),
            ("azblob://acct/abc?key=abc", "secrets do not go in the URL"),
            ("azblob://k@acct/abc", "credentials"),
            ("azblob://acct/abc#x", "fragment"),
            ("redis://acct/abc", "scheme"),
        ] {
            let e = parse(url, &[]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{url}");
            assert!(e.message().contains(needle), "{url}: {e}");
        }
        let e = parse("azblob://a/abc", &[("AZURE_STORAGE_KEY", "not base64!")]).unwrap_err();
        assert!(e.message().contains("account key"), "{e}");
    }

    #[test]
    fn secrets_never_show() {
        let key = "c2VjcmV0LWtleS1TM0NSRVQ="; // base64 of "secret-key-S3CRET"
        let sas = "sv=2024&sig=S3CRETSIG";
        for c in [
            parse("azblob://acct/abc", &[("AZURE_STORAGE_KEY", key)]).unwrap(),
            parse("azblob://acct/abc", &[("AZURE_STORAGE_SAS_TOKEN", sas)]).unwrap(),
            parse(
                "azblob:///abc",
                &[(
                    "AZURE_STORAGE_CONNECTION_STRING",
                    &format!("AccountName=acct;AccountKey={key}"),
                )],
            )
            .unwrap(),
        ] {
            let text = format!("{c:?} {c:#?} {c}");
            assert!(!text.contains(key) && !text.contains("S3CRET"), "{text}");
            assert!(text.contains("<redacted>"), "{text}");
        }
        // A secret put in the URL by mistake is not repeated in the error.
        let e = parse(&format!("azblob://acct/abc?key={key}"), &[]).unwrap_err();
        assert!(!format!("{e} {e:?}").contains(key), "{e}");
        let e = parse(&format!("azblob://acct/abc?sig={key}"), &[]).unwrap_err();
        assert!(!format!("{e} {e:?}").contains(key), "{e}");
    }
}
