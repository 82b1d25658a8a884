//! The priority layout (the default; see the crate README, *Layouts*): campaigns in
//! (priority, sequence) order, grants as a leader node made in a transaction guarded by
//! the election node's data version, the holder's guard (preemption, handover,
//! revocation) and the handover request.
//!
//! Every change to who may be granted next bumps the election node's data version in
//! the same transaction: a candidate joining (`create` + `setData`), a grant
//! (`setData(version)` + `create` of the leader node) and a handover request
//! (`setData(version)` + the `:handover` node). A waiter decides that it is next from
//! one `getChildren` answer, which carries that version, and makes the leader node
//! only with `setData(election, version)` in the same transaction: if anyone joined,
//! was granted or asked for a handover since, the whole transaction fails and the
//! waiter reads again. A grant is therefore right the moment it exists; nothing is
//! granted and taken back.

use tenure_core::backend::decode_record;
use tenure_core::LeaderInfo;
use zookeeper_client::Stat;

use super::*;
use crate::nodes::{
    candidate_prefix, handover_name, leader_prefix, priority_key, session_prefix, Queue,
};

/// The `InvalidArgument` error for an election that holds nodes of the other layout:
/// the two must never share an election (each would elect its own leader).
pub(crate) fn mixed_layouts(election: &ElectionName, ours: ZooKeeperLayout) -> Error {
    let (found, other) = match ours {
        ZooKeeperLayout::Curator => ("tenure's priority-layout leader node", "priority"),
        _ => ("Curator LeaderLatch nodes", "curator"),
    };
    TAG.own(
        ErrorKind::InvalidArgument,
        format!(
            "election {election}: holds {found}, but this backend uses layout={ours}; \
             candidates of both layouts must not share an election (connect with \
             layout={other} to join them)"
        ),
    )
}

/// Whether `e` is a transaction lost to a concurrent change (the election's version
/// moved, a node it counted on is gone or came): read again and retry.
fn contended(e: &Error) -> bool {
    [ZkError::BadVersion, ZkError::NoNode, ZkError::NodeExists]
        .iter()
        .any(|z| {
            std::error::Error::source(e)
                .and_then(|s| s.downcast_ref::<ZkError>())
                .is_some_and(|found| found == z)
        })
}

/// The last segment of a path the server answered.
fn name_of(path: &str) -> String {
    path.rsplit('/').next().unwrap_or_default().to_string()
}

/// What a grant transaction made: the candidate node (when it made one), the leader
/// node, and the zxid of the transaction (the leader node's `czxid`, read from the
/// election node's new `mzxid`: the stat of a create inside a multi may be empty,
/// ZOOKEEPER-4026).
struct Made {
    candidate: Option<String>,
    leader: String,
    zxid: i64,
}

impl Made {
    /// The session's nodes after the grant (no candidate node if it made none).
    fn node(self) -> Node {
        Node {
            name: self.candidate.unwrap_or_default(),
            czxid: self.zxid,
            leader: Some(self.leader),
        }
    }
}

/// Add a grant for `uuid` to `writer`: bump the election's version from `version`,
/// check the candidate node `own` (or create one with `create`), make the leader node
/// and use up the handover nodes seen. Returns how many results it adds.
#[allow(clippy::too_many_arguments)]
fn add_grant(
    writer: &mut zookeeper_client::MultiWriter<'_>,
    dir: &str,
    uuid: &str,
    version: i32,
    own: Option<&str>,
    create: Option<&str>,
    record: &[u8],
    handovers: &[String],
) -> std::result::Result<usize, ZkError> {
    let ephemeral = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
    writer.add_set_data(dir, b"", Some(version))?;
    if let Some(own) = own {
        writer.add_check_version(&format!("{dir}/{own}"), -1)?;
    }
    if let Some(prefix) = create {
        writer.add_create(&format!("{dir}/{prefix}"), record, &ephemeral)?;
    }
    writer.add_create(
        &format!("{dir}/{}", leader_prefix(uuid)),
        record,
        &ephemeral,
    )?;
    for h in handovers {
        writer.add_delete(&format!("{dir}/{h}"), None)?;
    }
    Ok(3 + handovers.len())
}

/// Read one grant's results (as [`add_grant`] added them).
fn read_grant(results: &[MultiWriteResult]) -> Option<Made> {
    let MultiWriteResult::SetData { stat } = results.first()? else {
        return None;
    };
    let (candidate, leader) = match results.get(1)? {
        MultiWriteResult::Check => (None, results.get(2)?),
        MultiWriteResult::Create { path, .. } => (Some(name_of(path)), results.get(2)?),
        _ => return None,
    };
    let MultiWriteResult::Create { path, .. } = leader else {
        return None;
    };
    Some(Made {
        candidate,
        leader: name_of(path),
        zxid: stat.mzxid,
    })
}

impl ZkSession {
    /// Campaign until granted ([`CampaignMode::Wait`]) or once, in the priority layout.
    pub(super) async fn run_priority(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<FencingToken>> {
        let client = self.client()?;
        let dir = election_dir(election);
        if mode == CampaignMode::TryOnce && self.node(election).is_none() {
            return self.try_free(&client, election, &dir, candidate).await;
        }
        let mut states = client.state_watcher();
        // As in the Curator layout: a one-shot exists watch on the own node, which also
        // fires when a handover names this waiter (it sets the node's data).
        let mut own_watch: Option<(String, OwnWatch)> = None;
        loop {
            let node = self.join(&client, election, &dir, candidate).await?;
            let listed = self
                .shared
                .requests
                .call("campaign", client.get_children(&dir))
                .await;
            let (children, stat) = match listed {
                Ok(found) => found,
                Err(e) if is_no_node(&e) => {
                    self.set_node(election, None);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let q = Queue::parse(&children);
            if q.curator {
                return Err(mixed_layouts(election, self.layout));
            }
            if q.holder.as_deref() == Some(self.uuid.as_str()) {
                // Granted by a transaction whose answer was lost.
                if let Some(token) = self.adopt(&client, election, &dir, &q, candidate).await? {
                    return Ok(Some(token));
                }
                continue;
            }
            let Some(position) = q.position(&node.name) else {
                // Our node is gone (deleted by someone else): queue again.
                self.set_node(election, None);
                continue;
            };
            if position == 0 && q.leader.is_none() {
                match self
                    .grant(&client, &dir, &node, candidate, stat.version, &q.handovers)
                    .await
                {
                    Ok(held) => return Ok(Some(self.hold(election, &dir, held, candidate))),
                    Err(e) if contended(&e) => continue,
                    Err(e) => return Err(e),
                }
            }
            if mode == CampaignMode::TryOnce {
                self.delete(&client, election, &dir, &node).await?;
                return Ok(None);
            }
            // The best waiter watches the leader node, any other the waiter before it.
            let ahead = match (position, &q.leader) {
                (0, Some(leader)) => leader.clone(),
                (p, _) => match q.waiters.get(p.wrapping_sub(1)) {
                    Some(w) => w.name.clone(),
                    None => continue,
                },
            };
            let ahead = format!("{dir}/{ahead}");
            let Some(watcher) = self
                .watch_ahead(&client, election, &ahead, &node, &mut own_watch)
                .await?
            else {
                continue;
            };
            // The best waiter also watches the election node's data, whose version every
            // join, grant and handover bumps: it lists again at each, so that when the
            // seat is released its version is current and it takes the seat without
            // another list. An exists watch armed on another version: list again now.
            let mut version_changed: Option<OwnWatch> = None;
            if position == 0 {
                let (current, w) = self
                    .shared
                    .requests
                    .call("campaign", client.check_and_watch_stat(&dir))
                    .await?;
                if current.is_none_or(|c| c.version != stat.version) {
                    continue;
                }
                version_changed = Some(Box::pin(w.changed()));
            }
            let watching_leader = position == 0;
            // Biased: a change of our node or of the version, when its event is in
            // together with the release's, is seen first (a grant on that version
            // would fail anyway).
            tokio::select! {
                biased;
                _ = changed(own_watch.as_mut().map(|(_, w)| w)) => own_watch = None,
                _ = changed(version_changed.as_mut()) => {}
                event = watcher.changed() => {
                    if watching_leader && event.event_type == EventType::NodeDeleted {
                        // The seat was released. If nothing joined, was granted or asked
                        // for a handover since the list (the version is unchanged), the
                        // only leader node then is the one just deleted and nobody queued
                        // ahead since: take the seat on that version without listing
                        // again. Otherwise the transaction fails and we list.
                        match self
                            .grant(&client, &dir, &node, candidate, stat.version, &q.handovers)
                            .await
                        {
                            Ok(held) => return Ok(Some(self.hold(election, &dir, held, candidate))),
                            Err(e) if contended(&e) => {}
                            Err(e) => return Err(e),
                        }
                    }
                }
                state = states.changed() => session_ended(state)?,
            }
        }
    }

    /// This session's candidate node in `election` for `candidate`, made if it has none:
    /// a `create` and a `setData` of the election node (its version counts joins) in one
    /// transaction. A node of the session found in the election (a lost answer, a
    /// dropped campaign) is used if it has the candidate's priority and opt-out, else
    /// deleted first.
    async fn join(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        candidate: &Candidate,
    ) -> Result<Node> {
        let wanted = candidate_prefix(&self.uuid, candidate.priority(), candidate.preemptible());
        if let Some(node) = self.node(election) {
            if node.leader.is_some() || node.name.starts_with(&wanted) {
                return Ok(node);
            }
            // Left by an earlier candidacy with another priority or opt-out (a revoked
            // seat whose withdrawal failed): leave that place first.
            self.delete(client, election, dir, &node).await?;
        }
        if let Some(node) = self.find_own_candidate(client, dir, &wanted).await? {
            return Ok(self.remember(election, node));
        }
        let data = encode_record(candidate);
        let options = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        let mut made_parents = false;
        loop {
            let mut writer = client.new_multi_writer();
            let bad = |e| crate::error::map("campaign", e);
            writer
                .add_create(&format!("{dir}/{wanted}"), &data, &options)
                .map_err(bad)?;
            writer.add_set_data(dir, b"", None).map_err(bad)?;
            let commit = async { writer.commit().await.map_err(ZkError::from) };
            match self.shared.requests.call("campaign", commit).await {
                Ok(results) => {
                    let Some(MultiWriteResult::Create { path, .. }) = results.first() else {
                        return Err(self.unexpected("campaign"));
                    };
                    let node = Node::candidate(name_of(path), 0);
                    return Ok(self.remember(election, node));
                }
                Err(e) if is_no_node(&e) && !made_parents => {
                    self.shared.make_dirs(client, "campaign", &[dir]).await?;
                    made_parents = true;
                }
                Err(e) if e.is_retryable() => {
                    // The create may have happened: look for it before trying again.
                    if let Some(node) = self.find_own_candidate(client, dir, &wanted).await? {
                        return Ok(self.remember(election, node));
                    }
                    return Err(e);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// This session's candidate node in `dir` named with `wanted`; nodes of the
    /// session with another priority or opt-out are deleted.
    async fn find_own_candidate(
        &self,
        client: &Client,
        dir: &str,
        wanted: &str,
    ) -> Result<Option<Node>> {
        let mine = session_prefix(&self.uuid);
        let children = self.shared.children(client, "campaign", dir).await?;
        let mut found = None;
        for name in children.into_iter().filter(|c| c.starts_with(&mine)) {
            if found.is_none() && name.starts_with(wanted) {
                found = Some(Node::candidate(name, 0));
                continue;
            }
            let path = format!("{dir}/{name}");
            match self
                .shared
                .requests
                .call("campaign", client.delete(&path, None))
                .await
            {
                Err(e) if !is_no_node(&e) => return Err(e),
                _ => {}
            }
        }
        Ok(found)
    }

    /// This session's nodes in `dir` as the server has them (a campaign dropped while
    /// its transaction was in flight): its candidate node and its leader node.
    pub(super) async fn find_own_priority(
        &self,
        client: &Client,
        dir: &str,
    ) -> Result<Option<Node>> {
        let children = self.shared.children(client, "resign", dir).await?;
        let mine = session_prefix(&self.uuid);
        let q = Queue::parse(&children);
        let leader = q
            .leader
            .filter(|_| q.holder.as_deref() == Some(self.uuid.as_str()));
        let candidate = children.into_iter().find(|c| c.starts_with(&mine));
        Ok(match (candidate, leader) {
            (None, None) => None,
            (name, leader) => Some(Node {
                name: name.unwrap_or_default(),
                czxid: 0,
                leader,
            }),
        })
    }

    /// The seat this session holds by a leader node it did not know of (a grant whose
    /// answer was lost): recorded and guarded, with its token. `None` if it went.
    async fn adopt(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        q: &Queue,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let Some(leader) = q.leader.clone() else {
            return Ok(None);
        };
        let stat: Option<Stat> = self
            .shared
            .requests
            .call("campaign", client.check_stat(&format!("{dir}/{leader}")))
            .await?;
        let Some(stat) = stat else {
            return Ok(None);
        };
        let name = q
            .holder_entry
            .as_ref()
            .map(|e| e.name.clone())
            .unwrap_or_default();
        let node = Node {
            name,
            czxid: stat.czxid,
            leader: Some(leader),
        };
        Ok(Some(self.hold(election, dir, node, candidate)))
    }

    /// Make the leader node for `node`, guarded by the election's `version` (see the
    /// module's doc), using up `handovers`.
    async fn grant(
        &self,
        client: &Client,
        dir: &str,
        node: &Node,
        candidate: &Candidate,
        version: i32,
        handovers: &[String],
    ) -> Result<Node> {
        let mut writer = client.new_multi_writer();
        let record = encode_record(candidate);
        add_grant(
            &mut writer,
            dir,
            &self.uuid,
            version,
            Some(&node.name),
            None,
            &record,
            handovers,
        )
        .map_err(|e| crate::error::map("campaign", e))?;
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        let results = self.shared.requests.call("campaign", commit).await?;
        let made = read_grant(&results).ok_or_else(|| self.unexpected("campaign"))?;
        Ok(Node {
            name: node.name.clone(),
            ..made.node()
        })
    }

    /// `try_campaign` on a seat this session has no node in: granted only if nobody
    /// holds or waits for the seat, in one transaction that also makes the candidate
    /// node; never queues.
    async fn try_free(
        &self,
        client: &Client,
        election: &ElectionName,
        dir: &str,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        const WHAT: &str = "try campaign";
        let mut made_parents = false;
        loop {
            let (children, version) = match self
                .shared
                .requests
                .call(WHAT, client.get_children(dir))
                .await
            {
                Ok((children, stat)) => (children, stat.version),
                Err(e) if is_no_node(&e) && !made_parents => {
                    self.shared.make_dirs(client, WHAT, &[dir]).await?;
                    made_parents = true;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let q = Queue::parse(&children);
            if q.curator {
                return Err(mixed_layouts(election, self.layout));
            }
            if q.leader.is_some() || !q.waiters.is_empty() || q.holder_entry.is_some() {
                return Ok(None);
            }
            let prefix =
                candidate_prefix(&self.uuid, candidate.priority(), candidate.preemptible());
            let record = encode_record(candidate);
            let mut writer = client.new_multi_writer();
            add_grant(
                &mut writer,
                dir,
                &self.uuid,
                version,
                None,
                Some(&prefix),
                &record,
                &q.handovers,
            )
            .map_err(|e| crate::error::map(WHAT, e))?;
            let commit = async { writer.commit().await.map_err(ZkError::from) };
            return match self.shared.requests.call(WHAT, commit).await {
                Ok(results) => {
                    let made = read_grant(&results).ok_or_else(|| self.unexpected(WHAT))?;
                    Ok(Some(self.hold(election, dir, made.node(), candidate)))
                }
                // Someone joined or was granted meanwhile: the seat is not free.
                Err(e) if contended(&e) => Ok(None),
                Err(e) => Err(e),
            };
        }
    }

    /// Take the free seats of `chunk` (at most [`BATCH`]) in the priority layout: one
    /// multi-read of every election node's version and children, the missing
    /// directories made (two round trips, only if some are missing), and one
    /// transaction granting every free seat, each guarded by its election's version.
    /// If that transaction loses to a concurrent change, the free seats are tried one
    /// by one. A seat this session already has a node in goes the one-seat way.
    pub(super) async fn try_chunk_priority(
        &self,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        const WHAT: &str = "try_campaign_many";
        let client = self.client()?;
        let bad = |e| crate::error::map(WHAT, e);
        // The version first: children read after it can only be newer, and a grant on
        // an older version fails.
        let (dirs, read) = self
            .read_chunk(&client, chunk, |r, dir| {
                r.add_get_data(dir)?;
                r.add_get_children(dir)
            })
            .await?;
        let mut answers = vec![None; chunk.len()];
        if read.len() != 2 * chunk.len() {
            return Err(self.unexpected(WHAT));
        }
        let (mut free, mut missing) = (Vec::new(), Vec::new());
        for (i, pair) in read.chunks(2).enumerate() {
            let (election, candidate) = &chunk[i];
            if self.node(election).is_some() {
                answers[i] = self
                    .run_priority(election, candidate, CampaignMode::TryOnce)
                    .await?;
                continue;
            }
            match (&pair[0], &pair[1]) {
                (MultiReadResult::Data { stat, .. }, MultiReadResult::Children { children }) => {
                    let q = Queue::parse(children);
                    if q.curator {
                        return Err(mixed_layouts(election, self.layout));
                    }
                    if q.leader.is_none() && q.waiters.is_empty() && q.holder_entry.is_none() {
                        free.push((i, stat.version, q.handovers));
                    }
                }
                (
                    MultiReadResult::Error {
                        err: ZkError::NoNode,
                    },
                    _,
                ) => {
                    missing.push(dirs[i].as_str());
                    free.push((i, 0, Vec::new()));
                }
                // Made between the two reads: taken for held, as trying never queues.
                (
                    _,
                    MultiReadResult::Error {
                        err: ZkError::NoNode,
                    },
                ) => {}
                (MultiReadResult::Error { err }, _) | (_, MultiReadResult::Error { err }) => {
                    return Err(bad(err.clone()))
                }
                _ => return Err(self.unexpected(WHAT)),
            }
        }
        if free.is_empty() {
            return Ok(answers);
        }
        self.shared.make_dirs(&client, WHAT, &missing).await?;
        let prefixes: Vec<String> = free
            .iter()
            .map(|(i, _, _)| {
                let c = &chunk[*i].1;
                candidate_prefix(&self.uuid, c.priority(), c.preemptible())
            })
            .collect();
        let records: Vec<Vec<u8>> = free
            .iter()
            .map(|(i, _, _)| encode_record(&chunk[*i].1))
            .collect();
        let mut writer = client.new_multi_writer();
        let mut spans = Vec::with_capacity(free.len());
        for (((i, version, handovers), prefix), record) in free.iter().zip(&prefixes).zip(&records)
        {
            let n = add_grant(
                &mut writer,
                &dirs[*i],
                &self.uuid,
                *version,
                None,
                Some(prefix),
                record,
                handovers,
            )
            .map_err(bad)?;
            spans.push(n);
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        match self.shared.requests.call(WHAT, commit).await {
            Ok(results) => {
                let mut at = 0;
                for ((i, _, _), n) in free.iter().zip(spans) {
                    let part = results
                        .get(at..at + n)
                        .ok_or_else(|| self.unexpected(WHAT))?;
                    at += n;
                    let made = read_grant(part).ok_or_else(|| self.unexpected(WHAT))?;
                    let (election, candidate) = &chunk[*i];
                    answers[*i] = Some(self.hold(election, &dirs[*i], made.node(), candidate));
                }
            }
            Err(e) if contended(&e) => {
                for (i, _, _) in &free {
                    let (election, candidate) = &chunk[*i];
                    answers[*i] = self
                        .try_free(&client, election, &dirs[*i], candidate)
                        .await?;
                }
            }
            Err(e) => return Err(e),
        }
        Ok(answers)
    }

    /// Record the grant of `node` (with its leader node) and guard it (see
    /// [`guard_holder`]). Returns the token.
    fn hold(
        &self,
        election: &ElectionName,
        dir: &str,
        node: Node,
        candidate: &Candidate,
    ) -> FencingToken {
        let token = revision_token(node.czxid);
        self.set_node(election, Some(node.clone()));
        let task = tokio::spawn(guard_holder(
            self.guarded(election),
            dir.to_string(),
            node,
            Rank {
                key: priority_key(candidate.priority()),
                preemptible: candidate.preemptible(),
            },
            token,
        ));
        self.guard(election, task);
        token
    }
}

/// A holder's priority key and opt-out.
struct Rank {
    key: u16,
    preemptible: bool,
}

/// Guards a held seat of the priority layout with one child watch on the election:
/// - a waiter that outranks a preemptible holder, or a handover node, makes it report
///   `preempted` (once; the core then resigns);
/// - its leader node gone while this session still counts it as its own (deleted by
///   someone else: `resign` and `close` stop this task first) makes it report the
///   election lost, and then withdraw its candidate node so that it does not stand in
///   line for a seat nobody campaigns for.
///
/// Ends on session events (expiry is reported by the session's state task). Holds no
/// client between requests, so an abandoned session's connection still drops.
async fn guard_holder(g: Guarded, dir: String, node: Node, rank: Rank, token: FencingToken) {
    let Some(leader) = node.leader.clone() else {
        return;
    };
    let election = &g.election;
    let mut attempt = 0u32;
    let mut told = false;
    loop {
        let Some(c) = g.client() else {
            return;
        };
        let listed = g.call(c.get_and_watch_children(&dir)).await;
        let (children, watcher) = match listed {
            Ok((children, _, watcher)) => (children, Some(watcher)),
            Err(e) if is_no_node(&e) => (Vec::new(), None),
            Err(e) => {
                g.back_off(&mut attempt, "the election", &e).await;
                continue;
            }
        };
        attempt = 0;
        if !children.contains(&leader) {
            // The seat is gone; the candidate node stays known (without its leader
            // node) until it is deleted, here or by the core's release of the grant.
            let ours = g
                .nodes
                .lock()
                .map(|mut n| match n.get_mut(election) {
                    Some(held) if held.leader.as_deref() == Some(leader.as_str()) => {
                        held.leader = None;
                        true
                    }
                    _ => false,
                })
                .unwrap_or(false);
            if ours {
                g.lost("leader", &format!("{dir}/{leader}"), token);
                // Out of line at once: nobody campaigns for this candidate node now.
                let own = format!("{dir}/{}", node.name);
                let withdrawn = node.name.is_empty()
                    || match g.call(c.delete(&own, None)).await {
                        Ok(()) => true,
                        Err(e) => is_no_node(&e),
                    };
                if withdrawn {
                    if let Ok(mut n) = g.nodes.lock() {
                        if n.get(election).is_some_and(|held| held.name == node.name) {
                            n.remove(election);
                        }
                    }
                }
            }
            return;
        }
        drop(c);
        let q = Queue::parse(&children);
        if !told && (!q.handovers.is_empty() || (rank.preemptible && q.outranks(rank.key))) {
            told = true;
            tracing::debug!(%election, token = token.0, handover = !q.handovers.is_empty(), "preempted");
            g.events.preempted(election, token);
        }
        let Some(watcher) = watcher else { return };
        if watcher.changed().await.event_type == EventType::Session {
            return;
        }
    }
}

/// `Backend::handover` in the priority layout, on the reader session: find the holder
/// and the waiter asked for (by candidate id, the first in grant order with it; or any
/// waiter for `None`), then in one transaction guarded by the election's version make
/// `:handover[:<target node>]` (the holder's child watch fires: it is told as for a
/// preemption) and rewrite the target's node with its own data (its exists watch fires,
/// so it looks again and finds itself first in line).
pub(crate) async fn handover(
    shared: &Shared,
    election: &ElectionName,
    to: Option<&str>,
) -> Result<LeaderInfo> {
    const WHAT: &str = "handover";
    let client = shared.synced_reader(WHAT).await?;
    let dir = election_dir(election);
    let bad = |e| crate::error::map(WHAT, e);
    let nobody_leads = || {
        TAG.own(
            ErrorKind::InvalidArgument,
            format!("election {election}: nobody leads it, nothing to hand over"),
        )
    };
    for _ in 0..10 {
        let (children, stat) = match shared.requests.call(WHAT, client.get_children(&dir)).await {
            Ok(found) => found,
            Err(e) if is_no_node(&e) => return Err(nobody_leads()),
            Err(e) => return Err(e),
        };
        let q = Queue::parse(&children);
        let Some(leader) = q.leader.clone() else {
            return Err(nobody_leads());
        };
        let (data, leader_stat) = match shared
            .requests
            .call(WHAT, client.get_data(&format!("{dir}/{leader}")))
            .await
        {
            Ok(found) => found,
            Err(e) if is_no_node(&e) => continue,
            Err(e) => return Err(e),
        };
        let info = decode_record(&data, revision_token(leader_stat.czxid));
        if q.waiters.is_empty() {
            return Err(TAG.own(
                ErrorKind::InvalidArgument,
                format!(
                    "election {election}: nobody waits for it, {:?} keeps it",
                    info.id
                ),
            ));
        }
        let mut target = None;
        if let Some(id) = to {
            let mut reader = client.new_multi_reader();
            for w in &q.waiters {
                reader
                    .add_get_data(&format!("{dir}/{}", w.name))
                    .map_err(bad)?;
            }
            let read = shared.requests.call(WHAT, reader.commit()).await?;
            for (w, r) in q.waiters.iter().zip(read) {
                if let MultiReadResult::Data { data, stat } = r {
                    if decode_record(&data, FencingToken(0)).id == id {
                        target = Some((w.name.clone(), data, stat.version));
                        break;
                    }
                }
            }
            if target.is_none() {
                return Err(TAG.own(
                    ErrorKind::InvalidArgument,
                    format!("election {election}: no candidate {id:?} waits for it"),
                ));
            }
        }
        let mut writer = client.new_multi_writer();
        writer
            .add_set_data(&dir, b"", Some(stat.version))
            .map_err(bad)?;
        for h in &q.handovers {
            writer
                .add_delete(&format!("{dir}/{h}"), None)
                .map_err(bad)?;
        }
        let name = handover_name(target.as_ref().map(|(n, _, _)| n.as_str()));
        let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
        writer
            .add_create(&format!("{dir}/{name}"), b"", &persistent)
            .map_err(bad)?;
        if let Some((node, data, version)) = &target {
            writer
                .add_set_data(&format!("{dir}/{node}"), data, Some(*version))
                .map_err(bad)?;
        }
        let commit = async { writer.commit().await.map_err(ZkError::from) };
        match shared.requests.call(WHAT, commit).await {
            Ok(_) => return Ok(info),
            Err(e) if contended(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(TAG.own(
        ErrorKind::Unavailable,
        format!("election {election}: handover: the election kept changing, try again"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::parse_candidate;

    #[test]
    fn contended_errors_are_the_lost_races_only() {
        let e = |z| crate::error::map("x", z);
        assert!(contended(&e(ZkError::BadVersion)));
        assert!(contended(&e(ZkError::NoNode)));
        assert!(contended(&e(ZkError::NodeExists)));
        assert!(!contended(&e(ZkError::ConnectionLoss)));
        assert!(!contended(&e(ZkError::NoAuth)));
        assert!(
            parse_candidate(&format!("{}0000000001", candidate_prefix("u", 3, true))).is_some()
        );
    }
}
