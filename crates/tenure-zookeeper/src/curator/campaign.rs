//! A Curator-layout campaign: create the candidate node (found again by its protected
//! prefix after a lost answer), lead when it is the lowest latch, else watch the one
//! just before it.

use std::future::Future;
use std::pin::Pin;

use futures::FutureExt;
use tenure_core::backend::{encode_record, CampaignMode};
use tenure_core::{Candidate, ElectionName, Error, ErrorKind, FencingToken, Result};
use zookeeper_client::{Client, CreateMode, EventType, OneshotWatcher, SessionState, WatchedEvent};

use super::{curator_accepts, Node, ZkSession};
use crate::error::TAG;
use crate::nodes::{election_dir, sequence_of, sorted_latches};
use crate::shared::is_no_node;

impl ZkSession {
    /// This session's node in `dir` as the server has it (after a create whose answer
    /// was lost, or a campaign that was dropped), by its protected prefix.
    pub(super) async fn find_own(&self, client: &Client, dir: &str) -> Result<Option<Node>> {
        let children = self.shared.children(client, "campaign", dir).await?;
        for name in children.into_iter().filter(|c| c.starts_with(&self.prefix)) {
            match self
                .shared
                .requests
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
    pub(super) async fn ensure_node(
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
            return Ok(self.remember(election, node));
        }
        let path = format!("{dir}/{}", self.prefix);
        let data = encode_record(candidate);
        let mode = CreateMode::EphemeralSequential;
        match self
            .shared
            .create_ephemeral(client, "campaign", dir, &path, &data, mode)
            .await
        {
            Ok((stat, sequence)) => {
                let name = format!("{}{sequence}", self.prefix);
                let node = Node {
                    name,
                    czxid: stat.czxid,
                };
                Ok(self.remember(election, node))
            }
            Err(e) if e.is_retryable() => {
                // The create may have happened: look for it before trying again.
                if let Some(node) = self.find_own(client, dir).await? {
                    return Ok(self.remember(election, node));
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Campaign until leading ([`CampaignMode::Wait`]) or once.
    pub(super) async fn run(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Option<FencingToken>> {
        curator_accepts(candidate)?;
        let client = self.client()?;
        let dir = election_dir(election);
        if mode == CampaignMode::TryOnce && self.node(election).is_none() {
            // Do not queue behind a holder: look first.
            match self
                .shared
                .requests
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
        // A one-shot exists watch on this session's own node, armed while waiting: its
        // event is delivered before any later one, so when the predecessor's delete
        // arrives and it has not fired, the node is still there.
        let mut own_watch: Option<(String, OwnWatch)> = None;
        loop {
            let node = self.ensure_node(&client, election, &dir, candidate).await?;
            let (children, written) = self.shared.children_of(&client, "campaign", &dir).await?;
            if written {
                return Err(mixed_layouts(election));
            }
            let latches = sorted_latches(children);
            let Some(position) = latches.iter().position(|c| *c == node.name) else {
                // Our node is gone (deleted by someone else): queue again.
                self.set_node(election, None);
                continue;
            };
            let own_path = format!("{dir}/{}", node.name);
            if position == 0 {
                let watch = own_watch.take().filter(|(n, _)| *n == node.name);
                return Ok(Some(self.granted(
                    election,
                    &own_path,
                    &node,
                    watch.map(|(_, w)| w),
                )));
            }
            if mode == CampaignMode::TryOnce {
                self.delete(&client, election, &dir, &node).await?;
                return Ok(None);
            }
            let predecessor = format!("{dir}/{}", latches[position - 1]);
            let Some(watcher) = self
                .watch_ahead(&client, election, &predecessor, &node, &mut own_watch)
                .await?
            else {
                continue;
            };
            let woken = tokio::select! {
                event = watcher.changed() => Woken::Predecessor(event.event_type),
                _ = changed(own_watch.as_mut().map(|(_, w)| w)) => Woken::Own,
                state = states.changed() => Woken::State(state),
            };
            match woken {
                Woken::Predecessor(EventType::NodeDeleted) if position == 1 => {
                    // The leader left and we were next: sequences only grow, so we lead
                    // unless our own node went first (its event would be here already).
                    let mut watch = own_watch.take().map(|(_, w)| w);
                    if let Some(w) = watch.as_mut() {
                        if w.as_mut().now_or_never().is_some() {
                            continue;
                        }
                    }
                    return Ok(Some(self.granted(election, &own_path, &node, watch)));
                }
                Woken::Predecessor(_) => {}
                Woken::Own => own_watch = None,
                Woken::State(state) => session_ended(state)?,
            }
        }
    }

    /// Arm the exists watch on `ahead` (the node a waiter waits for) and, once per node,
    /// the one on this session's own `node` (pipelined), kept in `own_watch`. `None`
    /// when either node is gone: list again (the own node is forgotten, to queue again).
    async fn watch_ahead(
        &self,
        client: &Client,
        election: &ElectionName,
        ahead: &str,
        node: &Node,
        own_watch: &mut Option<(String, OwnWatch)>,
    ) -> Result<Option<OneshotWatcher>> {
        if own_watch.as_ref().is_some_and(|(n, _)| *n != node.name) {
            *own_watch = None;
        }
        let watch_ahead = self
            .shared
            .requests
            .call("campaign", client.check_and_watch_stat(ahead));
        let (found, watcher) = if own_watch.is_none() {
            let own_path = format!("{}/{}", election_dir(election), node.name);
            let watch_own = self
                .shared
                .requests
                .call("campaign", client.check_and_watch_stat(&own_path));
            let (ahead, own_node) = futures::join!(watch_ahead, watch_own);
            match own_node? {
                (Some(_), w) => *own_watch = Some((node.name.clone(), Box::pin(w.changed()))),
                (None, _) => {
                    self.set_node(election, None);
                    return Ok(None);
                }
            }
            ahead?
        } else {
            watch_ahead.await?
        };
        Ok(found.map(|_| watcher))
    }
}

/// The event of a one-shot watch on this session's own candidate node.
pub(super) type OwnWatch = Pin<Box<dyn Future<Output = WatchedEvent> + Send>>;

/// What woke a waiting candidate.
enum Woken {
    Predecessor(EventType),
    Own,
    State(SessionState),
}

/// The event of `watch`, or never without one.
async fn changed(watch: Option<&mut OwnWatch>) -> WatchedEvent {
    match watch {
        Some(w) => w.await,
        None => std::future::pending().await,
    }
}

/// The error of a waiting campaign whose session reached `state`, if it ended.
fn session_ended(state: SessionState) -> Result<()> {
    if !state.is_terminated() {
        return Ok(());
    }
    Err(match state {
        SessionState::AuthFailed => {
            TAG.own(ErrorKind::Unauthorized, "ZooKeeper authentication failed")
        }
        _ => TAG.own(ErrorKind::SessionExpired, "ZooKeeper session ended"),
    })
}

/// The `InvalidArgument` error for an election the default layout writes (its node
/// holds data): the layouts must never share an election (each would elect its own
/// leader).
pub(super) fn mixed_layouts(election: &ElectionName) -> Error {
    TAG.own(
        ErrorKind::InvalidArgument,
        format!(
            "election {election}: holds tenure's default-layout records, but this backend \
             uses layout=curator; candidates of both layouts must not share an election \
             (connect with layout=priority to join them)"
        ),
    )
}
