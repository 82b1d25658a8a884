//! Member lists: a member is the blob `[prefix/]members/<namespace>/<id>` holding its
//! value, with the session that registered it in its metadata; it counts while that
//! session lives. The latest registration of an id wins.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::MemberStore;
use tenure_core::backend::{lock, poll_stream, MemberStream, Purpose};
use tenure_core::{ElectionName, Error, ErrorKind, Member, Result};

use crate::sessions::Sessions;
use crate::store::When;

/// Metadata field of a member blob: the session that registered it.
const META_SESSION: &str = "tenuresession";

/// The member lists of one backend.
#[derive(Clone)]
pub(crate) struct AzureMembers {
    inner: Arc<Inner>,
}

struct Inner {
    sessions: Arc<Sessions>,
    poll: Duration,
    /// Member values by blob name and etag, so a listing downloads only changed bodies.
    values: Mutex<HashMap<String, (String, String)>>,
    /// The member blobs each of this process's sessions registered.
    mine: Mutex<HashMap<String, HashSet<String>>>,
}

impl AzureMembers {
    pub(crate) fn new(sessions: Arc<Sessions>, poll: Duration) -> Self {
        let inner = Inner {
            sessions,
            poll,
            values: Mutex::default(),
            mine: Mutex::default(),
        };
        AzureMembers {
            inner: Arc::new(inner),
        }
    }

    /// Remove the members `session` registered (it ended).
    pub(crate) async fn drop_session(&self, session: &str) -> Result<()> {
        let names = lock(&self.inner.mine).remove(session).unwrap_or_default();
        for name in names {
            self.inner.remove(session, &name).await?;
        }
        Ok(())
    }
}

impl Inner {
    /// Delete the member blob `name` if `session` registered it.
    async fn remove(&self, session: &str, name: &str) -> Result<()> {
        let store = &self.sessions.store;
        let what = "unregister member";
        let props = store.properties(name).await;
        let Some(props) = props.map_err(|f| f.into_error(what))? else {
            return Ok(());
        };
        if props.metadata.get(META_SESSION).map(String::as_str) != Some(session) {
            return Ok(());
        }
        let deleted = store.delete(name, Some(&props.etag)).await;
        deleted.map_err(|f| f.into_error(what))
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let store = &self.sessions.store;
        let prefix = self.sessions.layout.members(namespace);
        let listed = store.list_with_metadata(&prefix).await;
        let listed = listed.map_err(|f| f.into_error("list members"))?;
        // Deeper names belong to a nested namespace.
        let listed: Vec<_> = listed
            .into_iter()
            .filter(|b| {
                b.name
                    .strip_prefix(&prefix)
                    .is_some_and(|id| !id.contains('/'))
            })
            .collect();
        let live = match listed.is_empty() {
            true => HashSet::new(),
            false => self.sessions.live_listed().await?,
        };
        let mut out = Vec::new();
        for blob in listed {
            let id = &blob.name[prefix.len()..];
            let session = blob.metadata.get(META_SESSION);
            if !session.is_some_and(|s| live.contains(s)) {
                continue;
            }
            let cached = lock(&self.values)
                .get(&blob.name)
                .filter(|(etag, _)| *etag == blob.etag)
                .map(|(_, v)| v.clone());
            let value = match cached {
                Some(v) => v,
                None => {
                    let got = store.download(&blob.name).await;
                    let Some((body, etag)) = got.map_err(|f| f.into_error("read member"))? else {
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
                    values.insert(blob.name.clone(), (etag, v.clone()));
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

#[async_trait]
impl MemberStore for AzureMembers {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let inner = &self.inner;
        if inner.sessions.known(session) == Some(false) {
            return Err(Error::new(
                ErrorKind::SessionExpired,
                "register member: the session has ended",
            ));
        }
        let name = inner.sessions.layout.member(namespace, member.id());
        let metadata = HashMap::from([(META_SESSION.to_string(), session.to_string())]);
        let body = member.value().as_bytes().to_vec();
        let put = inner
            .sessions
            .store
            .put(&name, body, metadata, When::Always, Purpose::Election);
        put.await.map_err(|f| f.into_error("register member"))?;
        lock(&inner.mine)
            .entry(session.to_string())
            .or_default()
            .insert(name);
        Ok(())
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        let name = self.inner.sessions.layout.member(namespace, id);
        self.inner.remove(session, &name).await?;
        if let Some(mine) = lock(&self.inner.mine).get_mut(session) {
            mine.remove(&name);
        }
        Ok(())
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.inner.list(namespace).await
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let first = self.inner.list(namespace).await?;
        let (inner, namespace) = (self.inner.clone(), namespace.clone());
        let poll = inner.poll;
        Ok(Box::pin(poll_stream(first, poll, move || {
            let (inner, namespace) = (inner.clone(), namespace.clone());
            async move { inner.list(&namespace).await }
        })))
    }
}
