//! What the backend and its sessions share: the settings, the reader session, the
//! open sessions, the request count, and the calls every part makes (connecting a
//! client, running a request with the timeout, reading a leader).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::backend::{decode_record, revision_token, Requests};
use tenure_core::{Error, ErrorKind, LeaderInfo, Result};
use zookeeper_client::{
    Acls, Client, CreateMode, CreateSequence, Error as ZkError, MultiReadResult, SessionInfo, Stat,
};

use crate::config::ZooKeeperConfig;
use crate::error::{map, TAG};
use crate::nodes::sorted_latches;

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) config: ZooKeeperConfig,
    reader: tokio::sync::Mutex<Client>,
    pub(crate) requests: Requests<zookeeper_client::Error>,
    /// Open sessions by id, for [`ZooKeeperBackend::expire_session`](crate::ZooKeeperBackend::expire_session)
    /// and [`ZooKeeperBackend::drop_connection`](crate::ZooKeeperBackend::drop_connection): the session and its client slot.
    sessions: Mutex<HashMap<String, (SessionInfo, ClientSlot)>>,
}

impl Shared {
    pub(crate) fn new(config: ZooKeeperConfig, reader: Client) -> Self {
        Shared {
            reader: tokio::sync::Mutex::new(reader),
            requests: Requests::new(
                TAG,
                config.connect_string(),
                config.get_request_timeout(),
                map,
            ),
            sessions: Mutex::new(HashMap::new()),
            config,
        }
    }

    /// The session timeout the server granted the reader session.
    pub(crate) async fn reader_session_timeout(&self) -> Duration {
        self.reader.lock().await.session_timeout()
    }

    /// The session with `id` and its client slot, if opened through this backend.
    pub(crate) fn session(&self, id: &str) -> Option<(SessionInfo, ClientSlot)> {
        self.sessions.lock().ok().and_then(|s| s.get(id).cloned())
    }

    pub(crate) fn register(&self, id: &str, info: SessionInfo, client: ClientSlot) {
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(id.to_string(), (info, client));
        }
    }

    pub(crate) fn unregister(&self, id: &str) {
        if let Ok(mut s) = self.sessions.lock() {
            s.remove(id);
        }
    }

    /// The reader client, reconnected if its session ended.
    pub(crate) async fn reader(&self) -> Result<Client> {
        let mut reader = self.reader.lock().await;
        if reader.state().is_terminated() {
            *reader = connect_client(&self.config, self.config.get_session_timeout(), None, false)
                .await?;
        }
        Ok(reader.clone())
    }

    /// The reader, caught up with the leader of the ensemble (a `sync`) for the request
    /// `what`: the server it is on may be behind the one a write went to, and a write
    /// that returned must be seen.
    pub(crate) async fn synced_reader(&self, what: &str) -> Result<Client> {
        let client = self.reader().await?;
        self.requests.call(what, client.sync("/")).await?;
        Ok(client)
    }

    /// Create the node `path` in `dir` (ephemeral: `mode`) with `data`, for the request
    /// `what`; a missing `dir` is made (with its parents) once.
    pub(crate) async fn create_ephemeral(
        &self,
        client: &Client,
        what: &str,
        dir: &str,
        path: &str,
        data: &[u8],
        mode: CreateMode,
    ) -> Result<(Stat, CreateSequence)> {
        let options = mode.with_acls(Acls::anyone_all());
        let mut made_parents = false;
        loop {
            match self
                .requests
                .call(what, client.create(path, data, &options))
                .await
            {
                Err(e) if is_no_node(&e) && !made_parents => {
                    let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    match self.requests.call(what, client.mkdir(dir, &parents)).await {
                        Err(e) if !is_node_exists(&e) => return Err(e),
                        _ => made_parents = true,
                    }
                }
                created => return created,
            }
        }
    }

    /// Make each of `dirs` (absolute, with their parents) for the request `what` in two
    /// round trips whatever their number: one multi-read finds the missing ones, one
    /// multi creates them, parents first. Should another session make one of them
    /// meanwhile, the rest are made one by one.
    pub(crate) async fn make_dirs(&self, client: &Client, what: &str, dirs: &[&str]) -> Result<()> {
        let mut paths = BTreeSet::new();
        for dir in dirs {
            let mut path = String::new();
            for (depth, segment) in dir.split('/').filter(|s| !s.is_empty()).enumerate() {
                path.push('/');
                path.push_str(segment);
                paths.insert((depth, path.clone()));
            }
        }
        if paths.is_empty() {
            return Ok(());
        }
        let bad = |e| map(what, e);
        let mut reader = client.new_multi_reader();
        for (_, path) in &paths {
            reader.add_get_data(path).map_err(bad)?;
        }
        let found = self.requests.call(what, reader.commit()).await?;
        let missing: Vec<&str> = paths
            .iter()
            .zip(found)
            .filter(|(_, r)| {
                matches!(
                    r,
                    MultiReadResult::Error {
                        err: ZkError::NoNode
                    }
                )
            })
            .map(|((_, path), _)| path.as_str())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
        let mut writer = client.new_multi_writer();
        for path in &missing {
            writer.add_create(path, &[], &parents).map_err(bad)?;
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        match self.requests.call(what, commit).await {
            Err(e) if is_node_exists(&e) => {
                for path in missing {
                    match self.requests.call(what, client.mkdir(path, &parents)).await {
                        Err(e) if !is_node_exists(&e) => return Err(e),
                        _ => {}
                    }
                }
                Ok(())
            }
            made => made.map(drop),
        }
    }

    /// The children of `dir`, for the request `what`; a missing `dir` has none.
    pub(crate) async fn children(
        &self,
        client: &Client,
        what: &str,
        dir: &str,
    ) -> Result<Vec<String>> {
        match self.requests.call(what, client.list_children(dir)).await {
            Err(e) if is_no_node(&e) => Ok(Vec::new()),
            listed => listed,
        }
    }

    /// The children of `dir` and whether it holds data (the default layout's records),
    /// for the request `what`; a missing `dir` has neither.
    pub(crate) async fn children_of(
        &self,
        client: &Client,
        what: &str,
        dir: &str,
    ) -> Result<(Vec<String>, bool)> {
        match self.requests.call(what, client.get_children(dir)).await {
            Err(e) if is_no_node(&e) => Ok((Vec::new(), false)),
            Err(e) => Err(e),
            Ok((children, stat)) => Ok((children, stat.data_length > 0)),
        }
    }

    /// The current leader of the election in `dir` (one list plus one read): the
    /// lowest latch (Curator layout).
    pub(crate) async fn read_leader(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<LeaderInfo>> {
        loop {
            let children = self.children(client, "read leader", dir).await?;
            let Some(first) = sorted_latches(children).into_iter().next() else {
                return Ok(None);
            };
            match self
                .requests
                .call("read leader", client.get_data(&format!("{dir}/{first}")))
                .await
            {
                Ok((data, stat)) => {
                    return Ok(Some(decode_record(&data, revision_token(stat.czxid))))
                }
                // The leader just left: read again.
                Err(e) if is_no_node(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Whether `e` came from ZooKeeper's `NoNode`.
pub(crate) fn is_no_node(e: &Error) -> bool {
    source_is(e, &zookeeper_client::Error::NoNode)
}

/// Whether `e` came from ZooKeeper's `NodeExists`.
pub(crate) fn is_node_exists(e: &Error) -> bool {
    source_is(e, &zookeeper_client::Error::NodeExists)
}

fn source_is(e: &Error, want: &zookeeper_client::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<zookeeper_client::Error>())
        .is_some_and(|z| z == want)
}

/// How long a connection may stay silent before the client counts it as lost and
/// reconnects to the next server: an eighth of the session timeout (the client pings
/// every 3/8 of that while idle, so a live server is never silent that long).
pub(crate) fn connection_timeout(session_timeout: Duration) -> Duration {
    (session_timeout / 8).max(Duration::from_millis(10))
}

/// Connect one client with `session_timeout`, authenticated and chrooted, within the
/// connect timeout. `session` re-attaches to an existing session.
pub(crate) async fn connect_client(
    config: &ZooKeeperConfig,
    session_timeout: Duration,
    session: Option<SessionInfo>,
    detached: bool,
) -> Result<Client> {
    let limit = config.get_connect_timeout();
    // A connection that hears nothing (pings included) for an eighth of the session
    // timeout counts as lost, and the client moves on to the next server. A renewal
    // sent a renew interval (a quarter TTL) after the last confirmed one has 5/12 of
    // the TTL before the renew deadline: the silence, then a re-attach, which waits
    // for a new ensemble leader when the silent server was the leader (the followers
    // first wait out syncLimit x tickTime). A fifth of the TTL left too little of that
    // budget for the election; zookeeper-client's default, two fifths, leaves no room
    // at all, and the reference clients' two thirds is past the deadline.
    let mut connector = Client::connector()
        .with_session_timeout(session_timeout)
        .with_connection_timeout(connection_timeout(session_timeout));
    if let Some(digest) = config.digest() {
        connector = connector.with_auth("digest", &digest);
    }
    if let Some(session) = session {
        connector = connector.with_session(session);
    }
    if detached {
        connector = connector.with_detached();
    }
    let hosts = config.connect_string();
    let client = match tokio::time::timeout(limit, connector.connect(&hosts)).await {
        Ok(Ok(c)) => c,
        Ok(Err(zookeeper_client::Error::Timeout)) => {
            return Err(TAG
                .own(
                    ErrorKind::Unavailable,
                    "connect: no ZooKeeper server answered",
                )
                .with_endpoint(&hosts))
        }
        Ok(Err(e)) => return Err(map("connect", e).with_endpoint(&hosts)),
        // The same error as the whole connect's timeout, which may come first.
        Err(_) => return Err(TAG.timed_out("connect", limit).with_endpoint(&hosts)),
    };
    let chroot = config.chroot_or_root();
    if chroot == "/" {
        return Ok(client);
    }
    client
        .chroot(chroot.to_string())
        .map_err(|_| Error::invalid(format!("chroot: {chroot:?} is not a valid ZooKeeper path")))
}

/// Where a session keeps its client (`None` once closed, abandoned or dropped).
pub(crate) type ClientSlot = Arc<Mutex<Option<Client>>>;

/// The client in `slot`, `None` once the session ended.
pub(crate) fn live_client(slot: &ClientSlot) -> Option<Client> {
    slot.lock()
        .ok()
        .and_then(|c| c.clone())
        .filter(|c| !c.state().is_terminated())
}

/// Connect the ZooKeeper session of a tenure session, its timeout `ttl`. The server
/// must grant exactly `ttl`: a shorter session would expire before the core's deadline
/// assumes, a longer one would make failover slower than promised. Detached: dropping
/// the client (an abandoned session) leaves the session to expire on the server;
/// closing it is explicit.
pub(crate) async fn open_session(config: &ZooKeeperConfig, ttl: Duration) -> Result<Client> {
    let client = connect_client(config, ttl, None, true).await?;
    let negotiated = client.session_timeout();
    if negotiated != ttl {
        return Err(Error::invalid(format!(
            "ttl: ZooKeeper granted a session timeout of {negotiated:?} for the requested {ttl:?}; \
             the server clamps session timeouts to [minSessionTimeout, maxSessionTimeout] \
             (by default [2, 20] × tickTime), so choose a ttl in that range"
        ))
        .with_backend(crate::SCHEME));
    }
    Ok(client)
}

/// Close the session `info` from a new connection: dropping the only clone of a
/// non-detached client sends the close request.
pub(crate) async fn close_session(config: &ZooKeeperConfig, info: SessionInfo) -> Result<()> {
    let other = connect_client(config, Duration::from_secs(10), Some(info), false).await?;
    drop(other);
    // Give the close request a moment to leave.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(())
}
