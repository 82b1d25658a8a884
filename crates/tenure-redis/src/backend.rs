//! The backend: connection, leader reads and observation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::{AsyncConnectionConfig, Value};
use tenure_core::backend::{Capabilities, Clause, DynSession, SessionEvents};
use tenure_core::backend::{Published, Purpose, Requests};
use tenure_core::{
    Backend, ElectionName, Error, LeaderInfo, LeaderStream, Member, MemberStream, Result, Timing,
};

use crate::config::RedisConfig;
use crate::config::SCHEME;
use crate::conn::Conn;
use crate::error::{map, TAG};
use crate::follow::follow;
use crate::hub::Hub;
use crate::keys::{
    members_key_prefix, millis_up, parse_seat, scan_pattern, seat_key_prefix,
    session_channel_prefix, session_key_prefix,
};
use crate::members::{self, Known};
use crate::scripts::{HANDOVER_SCRIPT, READ_SCRIPT, RELEASE_SCRIPT, UNREGISTER_SCRIPT};
use crate::session::RedisSession;
use crate::shared::{as_int, Shared};
use crate::target::Target;

/// The longest TTL accepted (about 34 years), far below what Redis can store.
const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// Why clause 1 is declared with a condition.
const DATA_LOSS: &str = "holds while Redis keeps its data; after a restart without \
    persistence or a failover to a replica that missed writes, the seat can be granted again \
    before the old holder's deadline passes (fencing tokens keep increasing, so a guarded \
    resource refuses the old holder)";

/// A Redis server as a tenure backend.
///
/// Each [`Session`](tenure_core::Session) is a key with the session TTL; each seat is a
/// key set with `SET NX PX` by a Lua script that also mints the fencing token; one
/// script call renews a session and every seat it holds; releases publish on the
/// election's channel so the next waiter is woken at once. Members live in a hash per
/// namespace and count while their session's key lives, so renewals keep them at no
/// extra cost; watchers hear the namespace's channel and look again at the earliest
/// member session's expiry. See the crate docs.
///
/// Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) shared: Arc<Shared>,
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
            READ_SCRIPT
                .key(&probe_key)
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
        let hub = Hub::new(
            target,
            limit,
            config.get_request_timeout(),
            requests.clone(),
        );
        Ok(RedisBackend {
            shared: Arc::new(Shared {
                sessions: session_key_prefix(config.key_prefix()),
                session_channels: session_channel_prefix(config.key_prefix(), config.database()),
                config,
                conn,
                hub,
                requests,
            }),
        })
    }

    /// The store primitives the election engine runs on, over this backend's
    /// connections (for the primitive suite and store tools).
    pub fn primitives(&self) -> Arc<dyn tenure_core::backend::Primitives> {
        Arc::new(crate::prims::RedisPrimitives::new(self.shared.clone()))
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    /// End the session with id `session_id` (see
    /// [`Session::id`](tenure_core::Session::id)) now, as Redis does when its TTL passes
    /// without a renewal: its key is deleted and every seat it holds is freed (the next
    /// waiter is woken). Its holder learns of the loss at its next renewal. For
    /// operators and fault tests; scans the seats under the prefix. Its members are
    /// removed too (scanning the namespaces under the prefix) and their watchers told.
    /// Returns how many seats were freed.
    pub async fn expire_session(&self, session_id: &str) -> Result<usize> {
        if session_id.is_empty() || !session_id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(Error::invalid(format!(
                "session id {session_id:?}: expected the hex digits of a tenure session"
            )));
        }
        let shared = &self.shared;
        let session_key = format!("{}{session_id}", shared.sessions);
        shared
            .conn
            .run(Purpose::Election, "expire session", |mut c| async move {
                redis::cmd("DEL")
                    .arg(&session_key)
                    .query_async::<Value>(&mut c)
                    .await
            })
            .await?;
        let seat_prefix = seat_key_prefix(shared.config.key_prefix());
        let seats = self
            .scan_names("expire session: scan seats", &seat_prefix)
            .await?;
        let mut freed = 0;
        for name in seats {
            let election = shared.keys(&name);
            let mut invocation = RELEASE_SCRIPT.key(&election.seat);
            invocation
                .key(&election.queue)
                .key(&election.next)
                .arg(session_id)
                .arg("")
                .arg(&election.channel)
                .arg(&election.waits)
                .arg(shared.grace_ms());
            let reply = shared
                .script("expire session: free a seat", &invocation)
                .await?;
            if as_int(&reply) == Some(1) {
                freed += 1;
            }
        }
        let hash_prefix = members_key_prefix(shared.config.key_prefix());
        let namespaces = self
            .scan_names("expire session: scan namespaces", &hash_prefix)
            .await?;
        for namespace in namespaces {
            let keys = shared.member_keys(&namespace);
            let mut invocation = UNREGISTER_SCRIPT.key(&keys.hash);
            invocation.arg(session_id).arg(&keys.channel);
            shared
                .script("expire session: remove members", &invocation)
                .await?;
        }
        Ok(freed)
    }

    /// The names of every key that starts with `prefix` (a seat or a namespace key
    /// prefix), scanning the whole keyspace; keys whose rest is not a valid name are
    /// passed over.
    async fn scan_names(&self, what: &'static str, prefix: &str) -> Result<Vec<ElectionName>> {
        let pattern = scan_pattern(prefix);
        let mut names = Vec::new();
        let mut cursor = 0u64;
        loop {
            let (next, keys) = self.shared.conn.scan(what, cursor, &pattern).await?;
            names.extend(
                keys.iter()
                    .filter_map(|key| key.strip_prefix(prefix))
                    .filter_map(|n| ElectionName::new(n).ok()),
            );
            if next == 0 {
                return Ok(names);
            }
            cursor = next;
        }
    }
}

tenure_core::store_constructors!(RedisBackend, RedisConfig);

/// The handover script's answer: the holder asked, or why nobody was.
fn parse_handover(reply: &Value, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
    let bad = || crate::error::unexpected("handover", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => Some(b.clone()),
        Some(Value::SimpleString(s)) => Some(s.clone().into_bytes()),
        _ => None,
    };
    match (items.first().and_then(as_int), text(items.get(1))) {
        (Some(1), Some(raw)) => parse_seat(&raw).map(|s| s.info).ok_or_else(|| {
            TAG.own(
                tenure_core::ErrorKind::Backend,
                "handover: the seat key holds a value tenure did not write",
            )
        }),
        (Some(0), Some(why)) => {
            let why = match (why.as_slice(), to) {
                (b"nobody leads", _) => "nobody leads it, nothing to hand over".to_string(),
                (b"nobody waits", _) => "nobody waits for it, the leader keeps it".to_string(),
                (b"no such waiter", Some(id)) => format!("no candidate {id:?} waits for it"),
                _ => return Err(bad()),
            };
            Err(Error::invalid(format!("election {election}: {why}")).with_backend(SCHEME))
        }
        _ => Err(bad()),
    }
}

#[async_trait]
impl Backend for RedisBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::full()
            .except(Clause::AtMostOneHolder, DATA_LOSS)
            .batched(crate::session::BATCH)
            .prioritized()
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        if timing.ttl > MAX_TTL {
            return Err(Error::invalid(format!(
                "ttl: {:?} is too long (at most {MAX_TTL:?})",
                timing.ttl
            )));
        }
        Ok(())
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let session = RedisSession::open(self.shared.clone(), millis_up(ttl), events).await?;
        Ok(Arc::new(session))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        let keys = self.shared.keys(election);
        let (_, seat) = self.shared.read(&keys.seat).await?;
        Ok(seat.map(|s| s.info))
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        let keys = self.shared.keys(election);
        let shared = self.shared.clone();
        self.shared.count();
        // Subscribe before the first read, so no change after it goes unheard.
        let registration = shared.hub.observer(&keys.channel);
        let subscribed = registration.is_subscribed();
        let (pttl, seat) = shared.read(&keys.seat).await?;
        let (published, stream) = Published::new(seat.map(|s| s.info));
        let next = shared.next_look(pttl);
        let poll = shared.config.get_poll_interval();
        tokio::spawn(async move {
            let read = || async {
                let (pttl, seat) = shared.read(&keys.seat).await?;
                Ok((seat.map(|s| s.info), shared.next_look(pttl)))
            };
            follow(registration, published, (next, subscribed), poll, read).await
        });
        Ok(stream)
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.shared.requests.election_requests())
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        let shared = &self.shared;
        let keys = shared.keys(election);
        let mut invocation = HANDOVER_SCRIPT.key(&keys.seat);
        invocation
            .key(&keys.queue)
            .arg(to.unwrap_or(""))
            .arg(&keys.waits)
            .arg(&shared.session_channels)
            .arg(&keys.election);
        let reply = shared.script("handover", &invocation).await?;
        parse_handover(&reply, election, to)
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let keys = self.shared.member_keys(namespace);
        let (members, _) = members::list(&self.shared, &keys.hash, &mut Known::new()).await?;
        Ok(members)
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let keys = self.shared.member_keys(namespace);
        let shared = self.shared.clone();
        // Subscribe before the first list, so no change after it goes unheard.
        let registration = shared.hub.observer(&keys.channel);
        let subscribed = registration.is_subscribed();
        let mut known = Known::new();
        let (first, earliest) = members::list(&shared, &keys.hash, &mut known).await?;
        let known = Arc::new(tokio::sync::Mutex::new(known));
        let (published, stream) = Published::new(first);
        let next = members::next_look(earliest);
        let poll = shared.config.get_poll_interval();
        tokio::spawn(async move {
            let read = || async {
                let mut known = known.lock().await;
                let (members, earliest) = members::list(&shared, &keys.hash, &mut known).await?;
                Ok((members, members::next_look(earliest)))
            };
            follow(registration, published, (next, subscribed), poll, read).await
        });
        Ok(stream)
    }
}
