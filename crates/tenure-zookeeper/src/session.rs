//! One tenure session = one ZooKeeper session; candidacies as ephemeral sequential nodes.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_core::{
    BackendSession, Candidate, ElectionName, Error, ErrorKind, FencingToken, Member, Result,
    SessionEvents,
};
use zookeeper_client::{Acls, Client, CreateMode, SessionState};

use crate::backend::{close_session, connect_client, is_no_node, is_node_exists, Shared};
use crate::error::{closed, own};
use crate::members::{namespace_dir, parse_registration, registration_prefix};
use crate::nodes::{
    election_dir, encode, protected_prefix, random_uuid, sequence_of, sorted_latches, token_of,
};

/// A candidacy's node once created.
#[derive(Clone, Debug)]
struct Node {
    /// Name under the election's directory.
    name: String,
    /// Creation zxid: the fencing token once it leads.
    czxid: i64,
}

/// A ZooKeeper session holding any number of candidacies.
pub(crate) struct ZkSession {
    shared: Arc<Shared>,
    /// `None` once closed or abandoned; clones are taken per request.
    client: Arc<Mutex<Option<Client>>>,
    /// When renewals were last asked for, and the gap before that.
    beat: Arc<Mutex<Beat>>,
    /// Renewals in flight.
    in_flight: Arc<AtomicUsize>,
    watchdog: tokio::task::JoinHandle<()>,
    id: String,
    /// `_c_<uuid>-latch-`: this session's node name prefix in every election.
    prefix: String,
    nodes: Mutex<HashMap<ElectionName, Node>>,
    state_task: tokio::task::JoinHandle<()>,
    /// The ZooKeeper session id, the `ephemeralOwner` of this session's nodes.
    owner: i64,
    /// Member registrations by namespace and id: the node's name, `None` while unsure
    /// (a request in flight, failed or dropped). Held across requests, so registrations
    /// of one session are made one at a time.
    registrations: tokio::sync::Mutex<HashMap<(ElectionName, String), Option<String>>>,
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// The rhythm of renewals, for the watchdog.
#[derive(Clone, Copy, Debug)]
struct Beat {
    last: Instant,
    gap: Option<Duration>,
}

/// How long without a renewal request before the session counts as abandoned: twice the
/// usual gap plus 100 ms, at least 200 ms, at most half the TTL.
fn abandon_after(beat: &Beat, ttl: Duration) -> Duration {
    let cap = ttl / 2;
    match beat.gap {
        Some(gap) => {
            (gap * 2 + Duration::from_millis(100)).clamp(Duration::from_millis(200).min(cap), cap)
        }
        None => cap,
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.state_task.abort();
        self.watchdog.abort();
        self.shared.unregister(&self.id);
    }
}

impl ZkSession {
    /// Open a ZooKeeper session whose timeout is `ttl`. The server must grant exactly
    /// `ttl`: a shorter session would expire before the core's deadline assumes, a
    /// longer one would make failover slower than promised.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Self> {
        // Detached: dropping the client (an abandoned session) leaves the session to
        // expire on the server instead of closing it; `close` closes it explicitly.
        let client = connect_client(&shared.config, ttl, None, true).await?;
        let negotiated = client.session_timeout();
        if negotiated != ttl {
            return Err(Error::invalid(format!(
                "ttl: ZooKeeper granted a session timeout of {negotiated:?} for the requested {ttl:?}; \
                 the server clamps session timeouts to [minSessionTimeout, maxSessionTimeout] \
                 (by default [2, 20] × tickTime), so choose a ttl in that range"
            ))
            .with_backend(crate::SCHEME));
        }
        let owner = client.session_id().0;
        let id = format!("{owner:016x}");
        shared.register(&id, client.session().clone());
        let mut states = client.state_watcher();
        let session_id = id.clone();
        let state_task = tokio::spawn(async move {
            loop {
                match states.changed().await {
                    SessionState::Expired => {
                        tracing::debug!(session = %session_id, "ZooKeeper session expired");
                        events.expired("ZooKeeper session expired");
                        return;
                    }
                    SessionState::Closed | SessionState::AuthFailed => {
                        events.expired("ZooKeeper session ended");
                        return;
                    }
                    _ => {}
                }
            }
        });
        let client = Arc::new(Mutex::new(Some(client)));
        let beat = Arc::new(Mutex::new(Beat {
            last: Instant::now(),
            gap: None,
        }));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let watchdog = tokio::spawn(watchdog(
            client.clone(),
            beat.clone(),
            in_flight.clone(),
            ttl,
            id.clone(),
        ));
        Ok(ZkSession {
            shared,
            client,
            beat,
            in_flight,
            watchdog,
            id,
            prefix: protected_prefix(&random_uuid()),
            nodes: Mutex::new(HashMap::new()),
            state_task,
            owner,
            registrations: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    fn client(&self) -> Result<Client> {
        let client = self
            .client
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .ok_or_else(closed)?;
        match client.state() {
            SessionState::Expired => {
                Err(own(ErrorKind::SessionExpired, "ZooKeeper session expired"))
            }
            SessionState::Closed => Err(closed()),
            SessionState::AuthFailed => Err(own(
                ErrorKind::Unauthorized,
                "ZooKeeper authentication failed",
            )),
            _ => Ok(client),
        }
    }

    fn node(&self, election: &ElectionName) -> Option<Node> {
        self.nodes
            .lock()
            .ok()
            .and_then(|n| n.get(election).cloned())
    }

    fn set_node(&self, election: &ElectionName, node: Option<Node>) {
        if let Ok(mut n) = self.nodes.lock() {
            match node {
                Some(node) => n.insert(election.clone(), node),
                None => n.remove(election),
            };
        }
    }

    /// This session's node in `dir` as the server has it (after a create whose answer
    /// was lost, or a campaign that was dropped), by its protected prefix.
    async fn find_own(&self, client: &Client, dir: &str) -> Result<Option<Node>> {
        self.shared.count();
        let children = match self
            .shared
            .call("campaign", client.list_children(dir))
            .await
        {
            Ok(c) => c,
            Err(e) if is_no_node(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        for name in children.into_iter().filter(|c| c.starts_with(&self.prefix)) {
            self.shared.count();
            match self
                .shared
                .call("campaign", client.check_stat(&format!("{dir}/{name}")))
                .await?
            {
                Some(stat) => {
                    return Ok(Some(Node {
                        name,
                        czxid: stat.czxid,
                    }))
                }
                None => continue,
            }
        }
        Ok(None)
    }

    /// This session's node in `election`, created if it has none.
    async fn ensure_node(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        candidate: &Candidate,
    ) -> Result<Node> {
        if let Some(node) = self.node(election) {
            return Ok(node);
        }
        if let Some(node) = self.find_own(client, dir).await? {
            self.set_node(election, Some(node.clone()));
            return Ok(node);
        }
        let path = format!("{dir}/{}", self.prefix);
        let data = encode(candidate);
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut made_parents = false;
        loop {
            self.shared.count();
            match self
                .shared
                .call("campaign", client.create(&path, &data, &options))
                .await
            {
                Ok((stat, sequence)) => {
                    let name = format!("{}{sequence}", self.prefix);
                    let node = Node {
                        name,
                        czxid: stat.czxid,
                    };
                    self.set_node(election, Some(node.clone()));
                    return Ok(node);
                }
                Err(e) if is_no_node(&e) && !made_parents => {
                    self.shared.count();
                    let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    match self
                        .shared
                        .call("campaign", client.mkdir(dir, &parents))
                        .await
                    {
                        Ok(()) => {}
                        Err(e) if is_node_exists(&e) => {}
                        Err(e) => return Err(e),
                    }
                    made_parents = true;
                }
                Err(e) if e.is_retryable() => {
                    // The create may have happened: look for it before trying again.
                    if let Some(node) = self.find_own(client, dir).await? {
                        self.set_node(election, Some(node.clone()));
                        return Ok(node);
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Campaign until leading (`wait`) or once (`!wait`).
    async fn run(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        wait: bool,
    ) -> Result<Option<FencingToken>> {
        let client = self.client()?;
        let dir = election_dir(election);
        if !wait && self.node(election).is_none() {
            // Do not queue behind a holder: look first.
            self.shared.count();
            match self
                .shared
                .call("try campaign", client.list_children(&dir))
                .await
            {
                Ok(children) if children.iter().any(|c| sequence_of(c).is_some()) => {
                    return Ok(None)
                }
                Ok(_) => {}
                Err(e) if is_no_node(&e) => {}
                Err(e) => return Err(e),
            }
        }
        let mut states = client.state_watcher();
        loop {
            let node = self.ensure_node(&client, election, &dir, candidate).await?;
            self.shared.count();
            let children = match self
                .shared
                .call("campaign", client.list_children(&dir))
                .await
            {
                Ok(c) => c,
                Err(e) if is_no_node(&e) => Vec::new(),
                Err(e) => return Err(e),
            };
            let latches = sorted_latches(children);
            let Some(position) = latches.iter().position(|c| *c == node.name) else {
                // Our node is gone (deleted by someone else): queue again.
                self.set_node(election, None);
                continue;
            };
            if position == 0 {
                return Ok(Some(token_of(node.czxid)));
            }
            if !wait {
                self.delete(&client, election, &dir, &node).await?;
                return Ok(None);
            }
            let predecessor = format!("{dir}/{}", latches[position - 1]);
            self.shared.count();
            let (stat, watcher) = self
                .shared
                .call("campaign", client.check_and_watch_stat(&predecessor))
                .await?;
            if stat.is_none() {
                continue;
            }
            tokio::select! {
                _ = watcher.changed() => {}
                state = states.changed() => {
                    if state.is_terminated() {
                        return Err(match state {
                            SessionState::AuthFailed => own(ErrorKind::Unauthorized, "ZooKeeper authentication failed"),
                            _ => own(ErrorKind::SessionExpired, "ZooKeeper session ended"),
                        });
                    }
                }
            }
        }
    }

    /// This session's registration nodes of `id` in the namespace directory `dir`, as
    /// the server has them (after a request whose answer was lost or dropped).
    async fn find_own_registrations(
        &self,
        client: &Client,
        dir: &str,
        id: &str,
    ) -> Result<Vec<String>> {
        let children = match self
            .shared
            .call("register member", client.list_children(dir))
            .await
        {
            Ok(c) => c,
            Err(e) if is_no_node(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut own_nodes = Vec::new();
        for name in children {
            if parse_registration(&name).map(|(i, _)| i) != Some(id) {
                continue;
            }
            let stat = self
                .shared
                .call(
                    "register member",
                    client.check_stat(&format!("{dir}/{name}")),
                )
                .await?;
            if stat.is_some_and(|s| s.ephemeral_owner == self.owner) {
                own_nodes.push(name);
            }
        }
        Ok(own_nodes)
    }

    /// Create a registration node for `member` in `dir` and delete `old` (this session's
    /// previous nodes of the id) in the same transaction; the new node's name.
    async fn replace_registration(
        &self,
        client: &Client,
        dir: &str,
        member: &Member,
        old: &[String],
    ) -> Result<String> {
        let prefix = registration_prefix(dir, member.id());
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let data = member.value().as_bytes();
        if old.is_empty() {
            let mut made_parents = false;
            loop {
                match self
                    .shared
                    .call("register member", client.create(&prefix, data, &options))
                    .await
                {
                    Ok((_, sequence)) => return Ok(format!("{}:{sequence}", member.id())),
                    Err(e) if is_no_node(&e) && !made_parents => {
                        let parents = CreateMode::Persistent.with_acls(Acls::anyone_all());
                        match self
                            .shared
                            .call("register member", client.mkdir(dir, &parents))
                            .await
                        {
                            Ok(()) => {}
                            Err(e) if is_node_exists(&e) => {}
                            Err(e) => return Err(e),
                        }
                        made_parents = true;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        let mut multi = client.new_multi_writer();
        let bad = |e| crate::error::map("register member", e);
        multi.add_create(&prefix, data, &options).map_err(bad)?;
        for name in old {
            multi
                .add_delete(&format!("{dir}/{name}"), None)
                .map_err(bad)?;
        }
        let results = self
            .shared
            .call("register member", async {
                multi.commit().await.map_err(zookeeper_client::Error::from)
            })
            .await?;
        for result in results {
            if let zookeeper_client::MultiWriteResult::Create { path, .. } = result {
                if let Some(name) = path.rsplit('/').next() {
                    return Ok(name.to_string());
                }
            }
        }
        Err(own(
            ErrorKind::Backend,
            "register member: the transaction answered without the created node",
        ))
    }

    async fn delete(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        node: &Node,
    ) -> Result<()> {
        self.shared.count();
        match self
            .shared
            .call(
                "resign",
                client.delete(&format!("{dir}/{}", node.name), None),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if is_no_node(&e) => {}
            Err(e) => return Err(e),
        }
        self.set_node(election, None);
        Ok(())
    }
}

#[async_trait]
impl BackendSession for ZkSession {
    fn id(&self) -> &str {
        &self.id
    }

    async fn keep_alive(&self) -> Result<()> {
        if let Ok(mut beat) = self.beat.lock() {
            let now = Instant::now();
            beat.gap = Some(now.saturating_duration_since(beat.last));
            beat.last = now;
        }
        // One round trip: it proves the server still has the session and refreshes it.
        let client = self.client()?;
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let r = self.shared.call("keep alive", client.check_stat("/")).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if let Ok(mut beat) = self.beat.lock() {
            beat.last = beat.last.max(Instant::now());
        }
        r.map(|_| ())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        match self.run(election, candidate, true).await? {
            Some(token) => Ok(token),
            None => Err(own(ErrorKind::Backend, "campaign ended without a grant")),
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        self.run(election, candidate, false).await
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            // Nothing is held in a session that is gone.
            Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
            Err(e) => return Err(e),
        };
        let dir = election_dir(election);
        match (self.node(election), token) {
            (Some(node), Some(t)) if token_of(node.czxid) != t => Ok(()),
            (Some(node), _) => self.delete(&client, election, &dir, &node).await,
            (None, Some(_)) => Ok(()),
            (None, None) => {
                // A campaign dropped while its create was in flight may have left a node.
                match self.find_own(&client, &dir).await? {
                    Some(node) => self.delete(&client, election, &dir, &node).await,
                    None => Ok(()),
                }
            }
        }
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let client = self.client()?;
        let dir = namespace_dir(namespace);
        let mut registrations = self.registrations.lock().await;
        let key = (namespace.clone(), member.id().to_string());
        // Unsure until the answer is in: a dropped or failed request may have applied.
        let known = registrations.insert(key.clone(), None);
        let mut old = match known {
            // Never registered in this session: nothing to replace.
            None => Vec::new(),
            Some(Some(name)) => vec![name],
            Some(None) => {
                self.find_own_registrations(&client, &dir, member.id())
                    .await?
            }
        };
        let mut attempt = 0;
        loop {
            match self.replace_registration(&client, &dir, member, &old).await {
                Ok(name) => {
                    registrations.insert(key, Some(name));
                    return Ok(());
                }
                // The old node is gone (deleted by hand): look again, then replace.
                Err(e) if is_no_node(&e) && !old.is_empty() && attempt < 3 => {
                    attempt += 1;
                    old = self
                        .find_own_registrations(&client, &dir, member.id())
                        .await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        let client = match self.client() {
            Ok(c) => c,
            // Nothing is registered in a session that is gone.
            Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
            Err(e) => return Err(e),
        };
        let dir = namespace_dir(namespace);
        let mut registrations = self.registrations.lock().await;
        let key = (namespace.clone(), id.to_string());
        let names = match registrations.insert(key.clone(), None) {
            None => {
                registrations.remove(&key);
                return Ok(());
            }
            Some(Some(name)) => vec![name],
            Some(None) => self.find_own_registrations(&client, &dir, id).await?,
        };
        for name in names {
            match self
                .shared
                .call(
                    "unregister member",
                    client.delete(&format!("{dir}/{name}"), None),
                )
                .await
            {
                Ok(()) => {}
                Err(e) if is_no_node(&e) => {}
                Err(e) => return Err(e),
            }
        }
        registrations.remove(&key);
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let Some(client) = self.client.lock().ok().and_then(|mut c| c.take()) else {
            return Ok(());
        };
        // Delete the nodes first so waiters hear at once; closing the session would
        // delete them as well.
        let nodes: Vec<(ElectionName, Node)> = self
            .nodes
            .lock()
            .map(|mut n| n.drain().collect())
            .unwrap_or_default();
        if !client.state().is_terminated() {
            let deletes = nodes.iter().map(|(election, node)| {
                let path = format!("{}/{}", election_dir(election), node.name);
                let client = &client;
                async move {
                    let _ = tokio::time::timeout(
                        self.shared.config.get_request_timeout(),
                        client.delete(&path, None),
                    )
                    .await;
                }
            });
            futures::future::join_all(deletes).await;
        }
        self.shared.unregister(&self.id);
        self.watchdog.abort();
        let info = client.session().clone();
        let ended = client.state().is_terminated();
        // The client is detached: dropping it only drops the connection.
        drop(client);
        if !ended {
            // End the session now rather than at its timeout; its nodes are gone already.
            let _ = close_session(&self.shared.config, info).await;
        }
        Ok(())
    }
}

/// Drops the client of a session whose renewals stopped (the core abandoned it, as in a
/// crash), so the server stops hearing from it and expires it after its timeout, as it
/// would for a dead process. zookeeper-client would otherwise keep pinging by itself.
async fn watchdog(
    client: Arc<Mutex<Option<Client>>>,
    beat: Arc<Mutex<Beat>>,
    in_flight: Arc<AtomicUsize>,
    ttl: Duration,
    id: String,
) {
    let step = (ttl / 40).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(step).await;
        let Ok(b) = beat.lock().map(|b| *b) else {
            return;
        };
        if in_flight.load(Ordering::SeqCst) > 0 {
            continue;
        }
        if b.last.elapsed() > abandon_after(&b, ttl) {
            tracing::debug!(session = %id, "no renewals asked for: leaving the ZooKeeper session to expire");
            let dropped = client.lock().ok().and_then(|mut c| c.take());
            drop(dropped);
            return;
        }
    }
}
