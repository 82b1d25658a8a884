//! The backend: connecting (and creating the schema), leader reads, observation,
//! membership reads and handover.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{Capabilities, DynSession, Published, Purpose, Requests, SessionEvents};
use tenure_core::{
    Backend, CancellationToken, ElectionName, Error, ErrorKind, LeaderInfo, LeaderStream, Member,
    MemberStream, Result, Retry,
};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// A stream of a followed state, as `Published::new` gives it.
type States<T> = std::pin::Pin<Box<dyn futures::Stream<Item = Result<T>> + Send + 'static>>;

use crate::config::{PostgresConfig, SCHEME};
use crate::error::{map, TAG};
use crate::link::{Hub, Opener, Param, Requester};
use crate::session::{PostgresSession, BATCH};
use crate::shared::{expiry, get, leader_info, Shared, SCHEMA_SQL, SCHEMA_VERSION};

/// How long a follower with nothing due to expire waits before reading again anyway
/// (a safety net: changes come by notification).
const IDLE: Duration = Duration::from_secs(60);

/// A PostgreSQL database as a tenure backend.
///
/// Sessions are rows whose expiry the server's clock decides; a seat is granted by one
/// of tenure's functions under the election's advisory lock, with a token from a
/// sequence; releases wake the next waiter with `NOTIFY`, and the next waiter sleeps
/// until the holder's expiry, read from its row. See the crate docs.
///
/// Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct PostgresBackend {
    shared: Arc<Shared>,
}

tenure_core::store_constructors!(PostgresBackend, PostgresConfig);

impl PostgresBackend {
    /// Connect, create or upgrade tenure's schema if needed (under an advisory lock, so
    /// several processes starting at once do it once), and start listening, all
    /// within the connect timeout: an unreachable server gives `Unavailable` or
    /// `Timeout`, bad credentials `Unauthorized`, a schema of a newer tenure `Backend`.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let opener = Opener::new(&config)?;
        let limit = config.get_connect_timeout();
        let endpoint = config.to_string();
        let setup = async {
            let (client, _) = opener.open().await.map_err(|e| map("connect", e))?;
            install(&client, &config.schema).await
        };
        TAG.connecting(limit, &endpoint, setup).await?;
        let requests = Requests::new(TAG, endpoint, config.get_request_timeout(), map);
        let channel = format!("tenure_{:032x}", tenure_core::backend::random_id());
        let hub = Arc::new(Hub::default());
        let stop = CancellationToken::new();
        let listen = hub
            .clone()
            .listen(opener.clone(), channel.clone(), limit, stop.clone());
        tokio::spawn(listen);
        tracing::debug!(%config, "connected to PostgreSQL");
        Ok(PostgresBackend {
            shared: Arc::new(Shared {
                requester: Requester::new(opener, requests),
                config,
                hub,
                channel,
                stop,
            }),
        })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.config
    }

    /// End the session with id `session_id` now, as the server does when its TTL
    /// passes without a renewal: its seats are freed (the next waiters woken) and its
    /// members removed; its owner learns at its next renewal. For operators and fault
    /// tests.
    pub async fn expire_session(&self, session_id: &str) -> Result<()> {
        let sql = "SELECT {S}.drop_sessions(ARRAY[$1])";
        let params: [Param; 1] = [(&session_id, Type::TEXT)];
        self.shared
            .call(Purpose::Election, "expire session", sql, &params)
            .await?;
        Ok(())
    }

    /// Follow the state `read` returns (and how long until it may expire) for the
    /// readers of the returned stream: read again on each notification on `channel`,
    /// at each reconnection of the listening connection, and when something expires.
    async fn follow<T, F, Fut>(&self, kind: &str, name: &ElectionName, read: F) -> Result<States<T>>
    where
        T: PartialEq + Clone + Send + Sync + 'static,
        F: Fn(Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(T, Option<Duration>)>> + Send,
    {
        let shared = self.shared.clone();
        let channel = shared.channel_of(kind, name).await?;
        let mut changes = shared.hub.subscribe(&channel).await;
        let mut generation = shared.hub.generation();
        generation.borrow_and_update();
        let (first, mut next) = match read(shared.clone()).await {
            Ok(first) => first,
            Err(e) => {
                drop(changes);
                shared.hub.unsubscribe(&channel);
                return Err(e);
            }
        };
        let (mut published, stream) = Published::new(first);
        tokio::spawn(async move {
            let retry = Retry::default();
            let mut failures = 0u32;
            loop {
                tokio::select! {
                    _ = published.closed() => break,
                    _ = changes.changed() => {}
                    _ = generation.changed() => {}
                    _ = tokio::time::sleep(next.unwrap_or(IDLE)) => {}
                }
                let read = read(shared.clone()).await;
                next = match &read {
                    Ok((_, next)) => next.map(|d| d + Duration::from_millis(1)),
                    Err(_) => Some(retry.delay(failures)),
                };
                failures = if read.is_ok() {
                    0
                } else {
                    failures.saturating_add(1)
                };
                published.publish(read.map(|(state, _)| state));
            }
            drop(changes);
            shared.hub.unsubscribe(&channel);
        });
        Ok(stream)
    }
}

/// Create tenure's schema, or bring it to [`SCHEMA_VERSION`], under an advisory lock.
async fn install(client: &Client, schema: &str) -> Result<()> {
    let locked = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('tenure schema'), hashtext('{schema}'));"
    );
    let ddl = SCHEMA_SQL.replace("{S}", schema);
    let current = format!("SELECT coalesce(max(version), 0) FROM {schema}.meta");
    let version = async {
        let meta = client
            .query_opt(&format!("SELECT to_regclass('{schema}.meta')::text"), &[])
            .await?;
        let exists = meta.and_then(|r| r.get::<_, Option<String>>(0)).is_some();
        match exists {
            true => Ok(client.query_one(&current, &[]).await?.get::<_, i32>(0)),
            false => Ok(0),
        }
    };
    let version = version
        .await
        .map_err(|e| map("connect: read the schema version", e))?;
    if version > SCHEMA_VERSION {
        return Err(TAG.own(
            ErrorKind::Backend,
            format!(
                "connect: schema {schema} is at version {version}, newer than this tenure \
                 knows ({SCHEMA_VERSION}): upgrade tenure, or use another ?schema="
            ),
        ));
    }
    if version < SCHEMA_VERSION {
        let script = format!("{locked}\n{ddl}\nCOMMIT;");
        client
            .batch_execute(&script)
            .await
            .map_err(|e| map("connect: create the schema", e))?;
    }
    Ok(())
}

#[async_trait]
impl Backend for PostgresBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::full().batched(BATCH).prioritized()
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        Ok(Arc::new(
            PostgresSession::open(self.shared.clone(), ttl, events).await?,
        ))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        Ok(self.shared.leader(election).await?.0)
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        let e = election.clone();
        let read = move |shared: Arc<Shared>| {
            let e = e.clone();
            async move { shared.leader(&e).await }
        };
        Ok(Box::pin(self.follow("e", election, read).await?))
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.shared.requester.requests.election_requests())
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        let e = election.as_str();
        let params: [Param; 2] = [(&e, Type::TEXT), (&to, Type::TEXT)];
        let sql = "SELECT candidate, value, token FROM {S}.handover($1, $2)";
        let rows = self
            .shared
            .call(Purpose::Election, "handover", sql, &params)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| Error::new(ErrorKind::Backend, "handover: no row"))?;
        leader_info("handover", row)
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        Ok(read_members(self.shared.clone(), namespace.clone())
            .await?
            .0)
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let ns = namespace.clone();
        let read = move |shared: Arc<Shared>| read_members(shared, ns.clone());
        Ok(Box::pin(self.follow("m", namespace, read).await?))
    }
}

/// The live members of `namespace`, and how long until the first of their sessions
/// expires.
async fn read_members(
    shared: Arc<Shared>,
    namespace: ElectionName,
) -> Result<(Vec<Member>, Option<Duration>)> {
    let sql = "SELECT m.id, m.value, \
        ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::int8 \
        FROM {S}.members m JOIN {S}.sessions s ON s.id = m.session \
        WHERE m.namespace = $1 AND s.expires_at > clock_timestamp() ORDER BY m.id";
    let ns = namespace.as_str();
    let rows = shared
        .call(Purpose::Election, "list members", sql, &[(&ns, Type::TEXT)])
        .await?;
    let mut members = Vec::with_capacity(rows.len());
    let mut first = None::<Duration>;
    for row in &rows {
        let (id, value): (String, String) =
            (get("list members", row, 0)?, get("list members", row, 1)?);
        members.push(Member::new(id, value)?);
        let expires = expiry("list members", row, 2)?;
        first = Some(first.map_or(expires, |f| f.min(expires)));
    }
    Ok((members, first))
}
