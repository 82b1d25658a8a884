//! The backend: the connections, and the election engine over the Redis primitives.

use std::sync::Arc;

use redis::{AsyncConnectionConfig, Value};
use tenure_core::backend::DrivenBackend;
use tenure_core::backend::{Primitives, Requests};
use tenure_core::{ElectionName, Error, Result};

use crate::config::RedisConfig;
use crate::config::SCHEME;
use crate::conn::Conn;
use crate::error::{map, TAG};
use crate::hub::Hub;
use crate::keys::{members_key_prefix, scan_pattern, session_channel_prefix, session_key_prefix};
use crate::prims::{unregister, RedisPrimitives};
use crate::scripts::READ_MANY_SCRIPT;
use crate::shared::Shared;
use crate::target::Target;

/// A Redis server as a tenure backend: the election engine of `tenure-core` decides,
/// Redis keeps what it decides (see the crate docs). Cheap to clone: clones share the
/// connections.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) shared: Arc<Shared>,
    prims: Arc<RedisPrimitives>,
    driven: DrivenBackend,
}

impl RedisBackend {
    /// Connect to Redis and check, within the configured connect timeout, that it
    /// answers, that the credentials are good and that the user may run tenure's
    /// scripts on keys under the prefix: an unreachable server gives `Unavailable` or
    /// `Timeout`, bad credentials or missing permissions `Unauthorized`, never a hang.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let target = Arc::new(Target::new(&config)?);
        let limit = config.get_connect_timeout();
        let probe_key = format!("{}:probe", config.key_prefix());
        let sessions = session_key_prefix(config.key_prefix());
        let address = config.address();
        let probe = async {
            let options = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(limit))
                .set_response_timeout(Some(config.get_request_timeout()));
            let client = target.client().await?;
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&options)
                .await
                .map_err(|e| map("connect", e))?;
            READ_MANY_SCRIPT
                .key(&probe_key)
                .arg(&sessions)
                .invoke_async::<Value>(&mut connection)
                .await
                .map_err(|e| map("connect", e))?;
            Ok::<_, Error>(())
        };
        TAG.connecting(limit, &address, probe).await?;
        tracing::debug!(%config, "connected to Redis");
        let requests = Arc::new(Requests::new(
            TAG,
            address,
            config.get_request_timeout(),
            map,
        ));
        let conn = Conn::new(target.clone(), requests.clone(), limit);
        let hub = Hub::new(target, limit, requests);
        let shared = Arc::new(Shared {
            sessions,
            session_channels: session_channel_prefix(config.key_prefix(), config.database()),
            config,
            conn,
            hub,
        });
        let prims = Arc::new(RedisPrimitives::new(shared.clone()));
        let driven = DrivenBackend::new(prims.clone(), SCHEME);
        Ok(RedisBackend {
            shared,
            prims,
            driven,
        })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// The store primitives the election engine runs on, over this backend's
    /// connections (for the primitive suite and store tools).
    pub fn primitives(&self) -> Arc<dyn Primitives> {
        self.prims.clone()
    }

    /// End the session with id `session_id` (see
    /// [`Session::id`](tenure_core::Session::id)) now, as if its TTL passed: its records
    /// stop counting (the waiters behind them are told), its holder learns of the loss
    /// at its next renewal, and its members are removed (scanning the namespaces under
    /// the prefix). For operators and fault tests.
    pub async fn expire_session(&self, session_id: &str) -> Result<()> {
        if session_id.is_empty() || !session_id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "session id {session_id:?}: expected the hex digits of a tenure session"
            )));
        }
        self.prims.revoke(session_id).await?;
        let shared = &self.shared;
        let prefix = members_key_prefix(shared.config.key_prefix());
        let pattern = scan_pattern(&prefix);
        let mut cursor = 0u64;
        loop {
            let (next, keys) = shared
                .conn
                .scan("expire session: scan namespaces", cursor, &pattern)
                .await?;
            for namespace in keys
                .iter()
                .filter_map(|key| key.strip_prefix(prefix.as_str()))
                .filter_map(|n| ElectionName::new(n).ok())
            {
                unregister(shared, session_id, &namespace, None).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

tenure_core::store_constructors!(RedisBackend, RedisConfig);

tenure_core::driven_backend!(RedisBackend, driven);
