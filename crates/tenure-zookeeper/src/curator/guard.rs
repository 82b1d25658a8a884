//! Guarding a held Curator-layout seat: a task waits for the exists watch on the
//! leading node and reports the election lost if anyone but this session deletes it.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tenure_core::backend::{revision_token, SessionEvents};
use tenure_core::{ElectionName, Error, FencingToken, Result};
use zookeeper_client::{Client, Error as ZkError, EventType};

use super::campaign::OwnWatch;
use super::{Node, ZkSession};
use crate::shared::{live_client, Shared};

impl ZkSession {
    /// Record the grant of `node` and guard it: a task waits for the node's exists watch
    /// (`watch`, or a new one) and reports the election lost if the node is deleted by
    /// anyone but this session (an operator, say). Returns the token.
    pub(super) fn granted(
        &self,
        election: &ElectionName,
        path: &str,
        node: &Node,
        watch: Option<OwnWatch>,
    ) -> FencingToken {
        let token = revision_token(node.czxid);
        let task = tokio::spawn(guard_leader(
            self.guarded(election),
            path.to_string(),
            node.name.clone(),
            token,
            watch,
        ));
        self.guard(election, task);
        token
    }

    /// What a guard of `election` needs of this session.
    fn guarded(&self, election: &ElectionName) -> Guarded {
        Guarded {
            shared: self.shared.clone(),
            client: self.client.clone(),
            nodes: self.nodes.clone(),
            events: self.events.clone(),
            election: election.clone(),
        }
    }

    /// Keep `task` as the guard of `election`'s grant, stopping the one before.
    fn guard(&self, election: &ElectionName, task: tokio::task::JoinHandle<()>) {
        if let Ok(mut guards) = self.guards.lock() {
            if let Some(old) = guards.insert(election.clone(), task) {
                old.abort();
            }
        }
    }

    /// Stop guarding `election`'s grant (before this session deletes its node).
    pub(super) fn unguard(&self, election: &ElectionName) {
        if let Some(task) = self.guards.lock().ok().and_then(|mut g| g.remove(election)) {
            task.abort();
        }
    }
}

/// What a task guarding a held election has of its session.
pub(super) struct Guarded {
    shared: Arc<Shared>,
    client: Arc<Mutex<Option<Client>>>,
    nodes: Arc<Mutex<HashMap<ElectionName, Node>>>,
    events: SessionEvents,
    election: ElectionName,
}

impl Guarded {
    /// The session's client, `None` once the session ended.
    fn client(&self) -> Option<Client> {
        live_client(&self.client)
    }

    /// Run the guard's request `request`.
    async fn call<T>(
        &self,
        request: impl Future<Output = std::result::Result<T, ZkError>>,
    ) -> Result<T> {
        self.shared.requests.call("guard", request).await
    }

    /// Could not watch `what` (failed with `e`): wait the retry delay of `attempt`,
    /// counting it.
    async fn back_off(&self, attempt: &mut u32, what: &str, e: &Error) {
        let delay = tenure_core::Retry::default().delay(*attempt);
        *attempt = attempt.saturating_add(1);
        let election = &self.election;
        tracing::debug!(%election, error = %e, ?delay, "could not watch {what}; retrying");
        tokio::time::sleep(delay).await;
    }

    /// Report the election lost: its `what` node at `path` was deleted by someone else.
    fn lost(&self, what: &str, path: &str, token: FencingToken) {
        let election = &self.election;
        tracing::warn!(%election, node = %path, token = token.0, "the {what} node was deleted by someone else");
        self.events.election_lost(
            election,
            token,
            &format!("the {what} node {path} was deleted by someone else"),
        );
    }
}

/// Guards a held election: waits for the exists watch on the leading node and, if the
/// node is deleted while this session still counts it as its own (not by `resign` or
/// `close`, which stop this task first), reports the election lost. Re-arms after other
/// node events; ends on session events (expiry is reported by the session's state task).
/// Holds no client between requests, so an abandoned session's connection still drops.
async fn guard_leader(
    g: Guarded,
    path: String,
    name: String,
    token: FencingToken,
    mut watch: Option<OwnWatch>,
) {
    let mut attempt = 0u32;
    loop {
        let deleted = match watch.take() {
            Some(w) => match w.await.event_type {
                EventType::NodeDeleted => true,
                EventType::Session => return,
                _ => continue,
            },
            None => {
                let Some(c) = g.client() else {
                    return;
                };
                let armed = g.call(c.check_and_watch_stat(&path)).await;
                drop(c);
                match armed {
                    Ok((Some(_), w)) => {
                        attempt = 0;
                        watch = Some(Box::pin(w.changed()));
                        continue;
                    }
                    Ok((None, _)) => true,
                    Err(e) => {
                        g.back_off(&mut attempt, "the leading node", &e).await;
                        continue;
                    }
                }
            }
        };
        if !deleted {
            continue;
        }
        let ours = g
            .nodes
            .lock()
            .map(|mut n| {
                let ours = n.get(&g.election).is_some_and(|node| node.name == name);
                if ours {
                    n.remove(&g.election);
                }
                ours
            })
            .unwrap_or(false);
        if ours {
            g.lost("leading", &path, token);
        }
        return;
    }
}
