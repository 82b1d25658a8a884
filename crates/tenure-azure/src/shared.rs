//! What the backend and its sessions share: the store client, the blob layout, the
//! renewal count, and the reads every part makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenure_core::backend::lock;
use tenure_core::{ElectionName, Error, ErrorKind, LeaderInfo, Member, Result};

use crate::config::SCHEME;
use crate::error::TAG;
use crate::names::{leader_of, session_of, token_of, Layout};
use crate::queue::{handover_metadata, Blob, Queue, HANDOVER};
use crate::store::lease_lost;
use crate::store::Store;

/// What the backend and its sessions share.
pub(crate) struct Shared {
    pub(crate) store: Arc<Store>,
    pub(crate) layout: Layout,
    /// Member values by blob name and etag, so a listing downloads only changed bodies.
    values: Mutex<HashMap<String, (String, String)>>,
}

impl Shared {
    pub(crate) fn new(store: Arc<Store>, layout: Layout) -> Self {
        Shared {
            store,
            layout,
            values: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) async fn read_leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        let name = self.layout.election(election);
        match self.store.properties(&name).await {
            Ok(Some(p)) if p.leased => Ok(leader_of(&p.metadata)),
            Ok(_) => Ok(None),
            Err(f) => Err(f.into_error("read leader")),
        }
    }

    /// Ask the holder of `election` to step down to `to` (or the best waiter): write
    /// the handover request into the queue, then break the holder's lease without a
    /// break period (its next renewal fails and it is told it is preempted; the seat
    /// stays its until it releases it or the lease runs out). The break is
    /// conditional on the etag the holder was read with, so a later holder is never
    /// asked by mistake; if the holder changed meanwhile, everything is read again.
    pub(crate) async fn hand_over(
        &self,
        election: &ElectionName,
        to: Option<&str>,
    ) -> Result<LeaderInfo> {
        let name = self.layout.election(election);
        let nobody = || {
            Error::invalid(format!(
                "election {election}: nobody leads it, nothing to hand over"
            ))
            .with_backend(SCHEME)
        };
        for _ in 0..4 {
            let props = self
                .store
                .properties(&name)
                .await
                .map_err(|f| f.into_error("handover: read leader"))?;
            let Some(props) = props.filter(|p| p.leased) else {
                return Err(nobody());
            };
            let Some(info) = leader_of(&props.metadata) else {
                return Err(nobody());
            };
            let queue = self.read_queue(election).await?;
            match to {
                Some(id) if !queue.live().any(|e| e.id == id) => {
                    return Err(Error::invalid(format!(
                        "election {election}: no candidate {id:?} waits for it"
                    ))
                    .with_backend(SCHEME))
                }
                None if queue.live().next().is_none() => {
                    return Err(Error::invalid(format!(
                        "election {election}: nobody waits for it, {:?} keeps it",
                        info.id
                    ))
                    .with_backend(SCHEME))
                }
                _ => {}
            }
            let request = format!("{}{HANDOVER}", self.layout.queue(election));
            self.store
                .put_metadata_blob(&request, handover_metadata(to, info.token.0))
                .await
                .map_err(|f| f.into_error("handover: write request"))?;
            if props.breaking {
                // Told already (preempted, or an earlier handover): the request only
                // redirects the next grant.
                return Ok(info);
            }
            match self.store.break_lease_at_expiry(&name, &props.etag).await {
                Ok(()) => {
                    self.notify(election, &props.metadata).await;
                    return Ok(info);
                }
                // The holder changed or released since it was read: read again.
                Err(f) if f.status == Some(412) || lease_lost(&f) => continue,
                Err(f) => return Err(f.into_error("handover: tell the leader")),
            }
        }
        Err(TAG.own(
            ErrorKind::Unavailable,
            format!("handover: the leader of {election} kept changing; try again"),
        ))
    }

    /// Tell the holder of the grant `metadata` describes (a grant of `election` whose
    /// lease was just broken without a break period) that it is asked to step down: an
    /// empty blob in its session's notice prefix naming the election and the grant's
    /// token, which its session lists once per poll interval while it holds seats.
    /// Best effort: the broken lease stays the fallback (a holder that cannot list, or
    /// a grant written before notices existed, learns at its next renewal).
    pub(crate) async fn notify(&self, election: &ElectionName, metadata: &HashMap<String, String>) {
        let (Some(session), Some(token)) = (session_of(metadata), token_of(metadata)) else {
            return;
        };
        let notice = self.layout.notice(session, election, token);
        if let Err(f) = self.store.put_metadata_blob(&notice, HashMap::new()).await {
            tracing::debug!(blob = %notice, error = %f.error.text, "could not leave a notice; the holder learns at its next renewal");
        }
    }

    /// The waiting queue of `election` (one listing, with metadata).
    pub(crate) async fn read_queue(&self, election: &ElectionName) -> Result<Queue> {
        let prefix = self.layout.queue(election);
        let listed = self
            .store
            .list_with_metadata(&prefix)
            .await
            .map_err(|f| f.into_error("read queue"))?;
        Ok(Queue::from_listing(listed.into_iter().filter_map(|b| {
            let name = b.name.strip_prefix(&prefix)?.to_string();
            Some(Blob {
                name,
                etag: b.etag,
                leased: b.leased,
                metadata: b.metadata,
            })
        })))
    }

    pub(crate) async fn read_members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let prefix = self.layout.members(namespace);
        let listed = self
            .store
            .list(&prefix)
            .await
            .map_err(|f| f.into_error("list members"))?;
        let mut out = Vec::new();
        for blob in listed {
            let Some(id) = blob.name.strip_prefix(&prefix) else {
                continue;
            };
            // Deeper names belong to a nested namespace.
            if id.contains('/') || !blob.leased {
                continue;
            }
            let cached = {
                let values = lock(&self.values);
                values
                    .get(&blob.name)
                    .filter(|(etag, _)| *etag == blob.etag)
                    .map(|(_, v)| v.clone())
            };
            let value = match cached {
                Some(v) => v,
                None => {
                    let Some(body) = self
                        .store
                        .download(&blob.name)
                        .await
                        .map_err(|f| f.into_error("read member"))?
                    else {
                        continue;
                    };
                    let Ok(v) = String::from_utf8(body) else {
                        tracing::warn!(blob = %blob.name, "member value is not UTF-8; skipped");
                        continue;
                    };
                    let mut values = lock(&self.values);
                    if values.len() > 100_000 {
                        values.clear();
                    }
                    values.insert(blob.name.clone(), (blob.etag.clone(), v.clone()));
                    v
                }
            };
            match Member::new(id, &value) {
                Ok(m) => out.push(m),
                Err(e) => tracing::warn!(blob = %blob.name, error = %e, "not a member; skipped"),
            }
        }
        out.sort_by(|a, b| a.id().cmp(b.id()));
        Ok(out)
    }
}
