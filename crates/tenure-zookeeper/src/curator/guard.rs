//! Guarding a held Curator-layout seat: a task waits for the exists watch on the
//! leading node and reports the election lost if anyone but this session deletes it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenure_core::backend::{revision_token, SessionEvents};
use tenure_core::{ElectionName, FencingToken};
use zookeeper_client::{Client, EventType};

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
        let g = Guarded {
            shared: self.shared.clone(),
            client: self.client.clone(),
            nodes: self.nodes.clone(),
            events: self.events.clone(),
            election: election.clone(),
        };
        let task = tokio::spawn(guard_leader(
            g,
            path.to_string(),
            node.name.clone(),
            token,
            watch,
        ));
        if let Ok(mut guards) = self.guards.lock() {
            if let Some(old) = guards.insert(election.clone(), task) {
                old.abort();
            }
        }
        token
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
    let election = &g.election;
    let mut attempt = 0u32;
    loop {
        let deleted = match watch.take() {
            Some(w) => match w.await.event_type {
                EventType::NodeDeleted => true,
                EventType::Session => return,
                _ => continue,
            },
            None => {
                let Some(c) = live_client(&g.client) else {
                    return;
                };
                let armed = g
                    .shared
                    .requests
                    .call("guard", c.check_and_watch_stat(&path));
                let armed = armed.await;
                drop(c);
                match armed {
                    Ok((Some(_), w)) => {
                        attempt = 0;
                        watch = Some(Box::pin(w.changed()));
                        continue;
                    }
                    Ok((None, _)) => true,
                    Err(e) => {
                        let delay = tenure_core::Retry::default().delay(attempt);
                        attempt = attempt.saturating_add(1);
                        tracing::debug!(%election, error = %e, ?delay, "could not watch the leading node; retrying");
                        tokio::time::sleep(delay).await;
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
                let ours = n.get(election).is_some_and(|node| node.name == name);
                if ours {
                    n.remove(election);
                }
                ours
            })
            .unwrap_or(false);
        if ours {
            tracing::warn!(%election, node = %path, token = token.0, "the leading node was deleted by someone else");
            let why = format!("the leading node {path} was deleted by someone else");
            g.events.election_lost(election, token, &why);
        }
        return;
    }
}
