//! The backend: connecting (and creating the schema), leader reads, observation,
//! membership reads and handover.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use tenure_core::backend::{Capabilities, DynSession, Published, Purpose, Requests, SessionEvents};
use tenure_core::{
    Backend, CancellationToken, ElectionName, ErrorKind, LeaderInfo, LeaderStream, Member,
    MemberStream, Result, Retry,
};
use tokio_postgres::Client;

use crate::config::{PostgresConfig, SCHEME};
use crate::error::{map, TAG};
use crate::link::{Hub, Opener, Requester};
use crate::session::PostgresSession;
use crate::shared::{get, leader_info, millis, Shared, BATCH, SCHEMA};

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
        let (hub, stop) = (Arc::new(Hub::default()), CancellationToken::new());
        let listen = hub
            .clone()
            .listen(opener.clone(), channel.clone(), limit, stop.clone());
        tokio::spawn(listen);
        tracing::debug!(%config, "connected to PostgreSQL");
        let requester = Requester::new(opener, &config.schema, requests);
        let reaping = AtomicBool::new(false);
        let shared = Arc::new(Shared {
            config,
            requester,
            hub,
            channel,
            stop,
            reaping,
        });
        Ok(PostgresBackend { shared })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &PostgresConfig {
        &self.shared.config
    }

    /// How many statements this backend has sent on its request connection (each one
    /// round trip: renewals, elections and members alike), for measurements.
    pub fn round_trips(&self) -> u64 {
        self.shared
            .requester
            .sent
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// End the session with id `session_id` now, as the server does when its TTL
    /// passes without a renewal: its seats are freed (the next waiters woken) and its
    /// members removed; its owner learns at its next renewal. For operators and fault
    /// tests.
    pub async fn expire_session(&self, session_id: &str) -> Result<()> {
        self.shared.end_session(session_id).await
    }

    /// Follow the state `read` returns (and how long until it may expire) for the
    /// readers of the returned stream: read again on each notification on the
    /// channel of `(kind, name)`, at each reconnection of the listening connection,
    /// and when something expires.
    async fn follow<T, F, Fut>(&self, kind: &str, name: &ElectionName, read: F) -> Result<States<T>>
    where
        T: PartialEq + Clone + Send + Sync + 'static,
        F: Fn(Arc<Shared>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(T, Option<Duration>)>> + Send,
    {
        let shared = self.shared.clone();
        let sql = "SELECT {S}.chan($1, $2)";
        let channel: String = get(
            "observe",
            &shared.one("observe", sql, &[&kind, &name.as_str()]).await?,
            0,
        )?;
        let mut changes = shared.hub.subscribe(&channel).await;
        let mut generation = shared.hub.generation();
        generation.borrow_and_update();
        let (first, mut next) = match read(shared.clone()).await {
            Ok(first) => first,
            Err(e) => {
                drop(changes);
                shared.hub.unsubscribe(&channel).await;
                return Err(e);
            }
        };
        let (mut published, stream) = Published::new(first);
        tokio::spawn(async move {
            let (retry, mut failures) = (Retry::default(), 0u32);
            loop {
                tokio::select! {
                    _ = published.closed() => break,
                    _ = changes.changed() => {}
                    _ = generation.changed() => {}
                    _ = tokio::time::sleep(next.unwrap_or(IDLE)) => {}
                }
                let read = read(shared.clone()).await;
                (next, failures) = match &read {
                    Ok((_, next)) => (next.map(|d| d + Duration::from_millis(1)), 0),
                    Err(_) => (Some(retry.delay(failures)), failures.saturating_add(1)),
                };
                published.publish(read.map(|(state, _)| state));
            }
            drop(changes);
            shared.hub.unsubscribe(&channel).await;
        });
        Ok(stream)
    }
}

/// A stream of a followed state, as `Published::new` gives it.
type States<T> = Pin<Box<dyn Stream<Item = Result<T>> + Send + 'static>>;

/// Create tenure's schema, or bring it to the crate's version, under an advisory lock.
async fn install(client: &Client, schema: &str) -> Result<()> {
    let latest = SCHEMA.0;
    let ddl = SCHEMA
        .1
        .replace("{S}", schema)
        .replace("{V}", &latest.to_string());
    let version = async {
        let meta = format!("SELECT to_regclass('{schema}.meta')::text");
        let exists = client
            .query_one(&meta, &[])
            .await?
            .get::<_, Option<String>>(0)
            .is_some();
        let current = format!("SELECT coalesce(max(version), 0) FROM {schema}.meta");
        match exists {
            true => Ok(client.query_one(&current, &[]).await?.get::<_, i32>(0)),
            false => Ok(0),
        }
    };
    let version = version
        .await
        .map_err(|e| map("connect: read the schema version", e))?;
    if version > latest {
        let why = format!(
            "connect: schema {schema} is at version {version}, newer than this tenure knows \
             ({latest}): upgrade tenure, or use another ?schema="
        );
        return Err(TAG.own(ErrorKind::Backend, why));
    }
    if version < latest {
        let lock = "SELECT pg_advisory_xact_lock(hashtext('tenure schema'), hashtext('{S}'))";
        let script = format!("BEGIN; {};\n{ddl}\nCOMMIT;", lock.replace("{S}", schema));
        let created = client.batch_execute(&script).await;
        created.map_err(|e| map("connect: create the schema", e))?;
    }
    Ok(())
}

#[async_trait]
impl Backend for PostgresBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::full().batched(BATCH as usize).prioritized()
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
        let sql = "SELECT candidate, value, token FROM {S}.handover($1, $2)";
        let row = self
            .shared
            .one("handover", sql, &[&election.as_str(), &to])
            .await?;
        leader_info("handover", &row)
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
    let rows = shared
        .requester
        .call(
            Purpose::Election,
            "list members",
            sql,
            &[&namespace.as_str()],
        )
        .await?;
    let (mut members, mut first) = (Vec::with_capacity(rows.len()), None::<Duration>);
    for row in &rows {
        members.push(Member::new(
            get::<&str>("list members", row, 0)?,
            get::<&str>("list members", row, 1)?,
        )?);
        let expires = millis(get("list members", row, 2)?);
        first = Some(first.map_or(expires, |f| f.min(expires)));
    }
    Ok((members, first))
}
