//! Where the connections go: the one server of a `redis://` URL, or the primary that
//! Sentinel names for a `redis+sentinel://` URL, asked again whenever a connection is
//! made (after a failure, a timeout, a `READONLY` answer or an announced switch), so the
//! backend follows a failover.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::{
    AsyncConnectionConfig, Client, ClientTlsConfig, ConnectionAddr, IntoConnectionInfo,
    RedisConnectionInfo, TlsCertificates,
};
use tenure_core::backend::{lock, Requests};
use tenure_core::{Error, ErrorKind, Result};

use crate::config::{RedisConfig, Sentinel};
use crate::error::{map, TAG};
use crate::hub::{Hub, Registration};

/// The server the command and subscriber connections go to (one per backend).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Target {
    Fixed(Client),
    /// The primary Sentinel names, and the switches of primary it announced.
    Sentinel {
        config: RedisConfig,
        sentinel: Sentinel,
        switches: Arc<Switches>,
        /// The subscription to each sentinel's `+switch-master` announcements.
        _listeners: Vec<Registration>,
    },
}

/// The primary switches Sentinel announced for the service (`+switch-master`): a
/// connection made before the latest one goes to a replaced primary, which may still
/// take writes until Sentinel demotes it (seconds later); counting them lets the
/// connections follow at once.
#[derive(Default)]
pub(crate) struct Switches {
    count: AtomicU64,
    last: Mutex<String>,
}

impl Switches {
    /// Note an announcement (each sentinel sends its own: counted once).
    fn announce(&self, payload: &str) {
        let mut last = lock(&self.last);
        if *last != payload {
            *last = payload.to_string();
            self.count.fetch_add(1, Ordering::SeqCst);
            tracing::info!(switch = %payload, "Sentinel switched the primary");
        }
    }
}

impl Target {
    /// Must run in a Tokio runtime: with Sentinel it subscribes to every sentinel's
    /// announcements (each sentinel announces every switch, so one that is down costs
    /// nothing while another listens), each on a subscriber of its own.
    pub(crate) fn new(config: &RedisConfig) -> Result<Self> {
        let Some(sentinel) = config.sentinel.clone() else {
            return data_client(config, (config.host(), config.port())).map(Target::Fixed);
        };
        let switches = Arc::new(Switches::default());
        let mut listeners = Vec::new();
        for at in &sentinel.nodes {
            let at_sentinel = Arc::new(Target::Fixed(sentinel_client(config, &sentinel, at)?));
            let timeout = config.get_request_timeout();
            let requests = Requests::new(TAG, format!("{}:{}", at.0, at.1), timeout, map);
            let hub = Hub::new(
                at_sentinel,
                config.get_connect_timeout(),
                Arc::new(requests),
            );
            let (switches, service) = (switches.clone(), sentinel.service.clone());
            let announced = Arc::new(move |payload: &[u8]| {
                let payload = String::from_utf8_lossy(payload);
                // `<service> <old-ip> <old-port> <new-ip> <new-port>`
                if payload.split(' ').next() == Some(service.as_str()) {
                    switches.announce(&payload);
                }
            });
            listeners.push(hub.listener("+switch-master", announced));
        }
        Ok(Target::Sentinel {
            config: config.clone(),
            sentinel,
            switches,
            _listeners: listeners,
        })
    }

    /// How many primary switches Sentinel announced so far (always 0 for one server):
    /// a connection made at an earlier count must be replaced.
    pub(crate) fn switches(&self) -> u64 {
        match self {
            Target::Fixed(_) => 0,
            Target::Sentinel { switches, .. } => switches.count.load(Ordering::SeqCst),
        }
    }

    /// A client for the server to use now: the configured one, or the primary the
    /// first sentinel that answers names.
    pub(crate) async fn client(&self) -> Result<Client> {
        match self {
            Target::Fixed(client) => Ok(client.clone()),
            Target::Sentinel {
                config, sentinel, ..
            } => {
                let (host, port) = primary(config, sentinel).await?;
                tracing::debug!(%host, port, service = %sentinel.service, "Sentinel named the primary");
                data_client(config, (&host, port))
            }
        }
    }
}

/// A client for a data node at `host:port` with the configured credentials and database.
fn data_client(config: &RedisConfig, at: (&str, u16)) -> Result<Client> {
    let credentials = (config.username(), config.secret());
    client_at(config, at, credentials, config.database())
}

/// A client for the sentinel at `host:port`, with Sentinel's own credentials.
fn sentinel_client(
    config: &RedisConfig,
    sentinel: &Sentinel,
    at: &(String, u16),
) -> Result<Client> {
    let (host, port) = at;
    let password = sentinel.password.as_ref().map(|p| p.expose());
    client_at(
        config,
        (host, *port),
        (sentinel.username.as_deref(), password),
        0,
    )
}

/// Ask the sentinels in turn where the primary of the service is; the first answer
/// wins. Each sentinel gets the connect timeout.
async fn primary(config: &RedisConfig, sentinel: &Sentinel) -> Result<(String, u16)> {
    let mut last = None;
    for at in &sentinel.nodes {
        let endpoint = format!("{}:{}", at.0, at.1);
        match ask(config, sentinel, at).await {
            Ok(Some(primary)) => return Ok(primary),
            Ok(None) => {
                let why = format!(
                    "sentinel {endpoint} does not know a primary for {:?}",
                    sentinel.service
                );
                last = Some(TAG.own(ErrorKind::Unavailable, why))
            }
            Err(e) => last = Some(e.with_endpoint(endpoint)),
        }
    }
    Err(last.unwrap_or_else(|| TAG.own(ErrorKind::Unavailable, "no sentinel to ask")))
}

async fn ask(
    config: &RedisConfig,
    sentinel: &Sentinel,
    at: &(String, u16),
) -> Result<Option<(String, u16)>> {
    let limit = config.get_connect_timeout();
    let client = sentinel_client(config, sentinel, at)?;
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit));
    let asking = async {
        let mut connection = client
            .get_multiplexed_async_connection_with_config(&options)
            .await?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&sentinel.service)
            .query_async::<Option<(String, u16)>>(&mut connection)
            .await
    };
    match tokio::time::timeout(limit, asking).await {
        Ok(answer) => answer.map_err(|e| map("ask sentinel", e)),
        Err(_) => Err(TAG.timed_out("ask sentinel", limit)),
    }
}

/// A redis client for the server at `host:port` with `config`'s TLS settings,
/// authenticating as `user` with `password`, on database `db`.
fn client_at(
    config: &RedisConfig,
    (host, port): (&str, u16),
    (user, password): (Option<&str>, Option<&str>),
    db: i64,
) -> Result<Client> {
    let addr = if config.is_tls() {
        // rustls needs a process-wide crypto provider; keep one that is already there.
        let _ = rustls::crypto::ring::default_provider().install_default();
        ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(host.to_string(), port)
    };
    let mut redis_info = RedisConnectionInfo::default().set_db(db);
    if let Some(user) = user {
        redis_info = redis_info.set_username(user);
    }
    if let Some(password) = password {
        redis_info = redis_info.set_password(password);
    }
    let info = addr
        .into_connection_info()
        .map_err(|e| map("redis url", e))?
        .set_redis_settings(redis_info);
    let (ca, identity) = config.tls_files();
    if config.is_tls() && (ca.is_some() || identity.is_some()) {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                Error::invalid(format!("{what}: cannot read {}", path.display())).with_source(e)
            })
        };
        let root_cert = ca.map(|p| read("ca", p)).transpose()?;
        let client_tls = match identity {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: read("cert", cert)?,
                client_key: read("key", key)?,
            }),
            None => None,
        };
        return Client::build_with_tls(
            info,
            TlsCertificates {
                client_tls,
                root_cert,
            },
        )
        .map_err(|e| map("TLS settings", e));
    }
    Client::open(info).map_err(|e| map("redis url", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_switch_counts_once_whichever_sentinels_announce_it() {
        let s = Switches::default();
        s.announce("svc 127.0.0.1 1 127.0.0.1 2");
        s.announce("svc 127.0.0.1 1 127.0.0.1 2");
        s.announce("svc 127.0.0.1 1 127.0.0.1 2");
        assert_eq!(s.count.load(Ordering::SeqCst), 1);
        s.announce("svc 127.0.0.1 2 127.0.0.1 3");
        s.announce("svc 127.0.0.1 2 127.0.0.1 3");
        assert_eq!(s.count.load(Ordering::SeqCst), 2);
    }
}
