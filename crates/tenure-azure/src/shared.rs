//! What the backend and its sessions share: the store client, the blob layout, the
//! renewal count, and the reads every part makes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tenure_core::backend::lock;
use tenure_core::{ElectionName, LeaderInfo, Member, Result};

use crate::names::{leader_of, Layout};
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
