//! The in-memory backend (`mem://`): the election engine over the in-memory store of
//! its primitives ([`MemPrimitives`]), with fault hooks for tests. The embedded
//! default, and the store the CLI's demo runs on. Driven by tokio time, so tests can
//! `tokio::time::pause()`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use crate::backend::config::{unknown_key, BackendUrl};
use crate::backend::{DrivenBackend, MemPrimitives};
use crate::error::{Error, Result};

/// The URL scheme of the in-memory backend: `mem://` (a private store) or `mem://NAME`
/// (a store shared by every `connect("mem://NAME")` in this process).
pub const MEM_SCHEME: &str = "mem";

/// An in-process store keeping the whole contract: the [election
/// engine](crate::engine) over [`MemPrimitives`] (sessions with TTLs on tokio time,
/// one conditional write per change, strictly increasing fencing tokens), so every
/// rule the other stores keep it keeps the same way, state transfer (clause 16)
/// included.
///
/// Fault hooks for tests act on a session by its id ([`Session::id`](crate::Session::id)):
/// [`expire_session`](Self::expire_session), [`stall_session`](Self::stall_session)
/// (its requests stop reaching the store, as in a partition, until
/// [`unstall_session`](Self::unstall_session)) and [`crash_session`](Self::crash_session)
/// (it stops forever without resigning; the store frees its seats after the TTL).
///
/// Clones share the store.
#[derive(Clone)]
pub struct MemoryBackend {
    store: Arc<MemStore>,
}

struct MemStore {
    name: String,
    primitives: MemPrimitives,
    driven: DrivenBackend,
}

crate::driven_backend!(MemoryBackend, store.driven);

fn registry() -> &'static Mutex<HashMap<String, Weak<MemStore>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<String, Weak<MemStore>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

impl Default for MemoryBackend {
    fn default() -> Self {
        MemoryBackend::new()
    }
}

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("name", &self.store.name)
            .finish()
    }
}

impl MemStore {
    fn new(name: &str) -> Self {
        let primitives = MemPrimitives::new();
        let mut driven = DrivenBackend::new(Arc::new(primitives.clone()), MEM_SCHEME);
        if !name.is_empty() {
            driven = driven.with_endpoint(format!("{MEM_SCHEME}://{name}"));
        }
        MemStore {
            name: name.to_string(),
            primitives,
            driven,
        }
    }
}

impl MemoryBackend {
    /// A new private store.
    pub fn new() -> Self {
        MemoryBackend {
            store: Arc::new(MemStore::new("")),
        }
    }

    /// The store called `name` in this process, created if no live one exists, so that
    /// separate parts of one program can meet in it.
    pub fn named(name: &str) -> Self {
        let mut reg = match registry().lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(store) = reg.get(name).and_then(Weak::upgrade) {
            return MemoryBackend { store };
        }
        let store = Arc::new(MemStore::new(name));
        reg.insert(name.to_string(), Arc::downgrade(&store));
        MemoryBackend { store }
    }

    /// Parse `mem://` or `mem://NAME` (NAME: letters, digits, `-`, `_`, `.`).
    pub fn from_url(url: &str) -> Result<Self> {
        let url = BackendUrl::parse(url)?;
        url.expect_scheme(&[MEM_SCHEME])?;
        url.forbid_userinfo("the memory store takes none")?;
        url.forbid_path("name the store as mem://NAME")?;
        if let Some((key, _)) = url.query.first() {
            return Err(unknown_key(key, &[]));
        }
        let name = match url.hosts.as_slice() {
            [] => return Ok(MemoryBackend::new()),
            [name] => name.as_str(),
            _ => return Err(Error::invalid("url: expected one store name (mem://NAME)")),
        };
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(Error::invalid(format!(
                "url: store name may use ASCII letters, digits, '-', '_', '.' (found {c:?})"
            )));
        }
        Ok(MemoryBackend::named(name))
    }

    /// End the session now, as its lease running out would: its records stay, dead,
    /// until a write clears them, and its client hears that the session expired (from
    /// a follow loop of a seat it holds, or its next request). This is earlier than the
    /// TTL promises, so the holder may still believe it leads while the next waiter is
    /// granted: the case fencing tokens exist for; tests of clause 1 use
    /// [`stall_session`](Self::stall_session) or [`crash_session`](Self::crash_session)
    /// instead. False if no such session.
    pub fn expire_session(&self, id: &str) -> bool {
        self.store.primitives.end_session(id)
    }

    /// Revoke the session now, as etcd's lessor revokes a lease: its seats and members
    /// are deleted at once, and the holder hears of each seat as a watch on it would
    /// tell it (`ElectionLost`), but not of the session, which it learns is gone from
    /// its next request (`SessionExpired`). False if no such session.
    pub fn revoke_session(&self, id: &str) -> bool {
        self.store.primitives.revoke_session(id)
    }

    /// Stop the session's requests from reaching the store (a partition): they wait
    /// until [`unstall_session`](Self::unstall_session); the store expires the session
    /// after its TTL meanwhile.
    pub fn stall_session(&self, id: &str) -> bool {
        self.store.driven.set_gate(id, false)
    }

    /// Let a stalled session's requests through again.
    pub fn unstall_session(&self, id: &str) -> bool {
        self.store.driven.set_gate(id, true)
    }

    /// Make the session stop for good without resigning (a crashed holder): its
    /// requests never complete and the store frees its seats after the TTL.
    pub fn crash_session(&self, id: &str) -> bool {
        self.store.driven.set_gate(id, false)
    }

    /// Ids of the sessions the store currently keeps.
    pub fn session_ids(&self) -> Vec<String> {
        self.store.primitives.session_ids()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, SessionEvents};
    use crate::name::{ElectionName, Member};
    use futures::StreamExt;
    use std::time::Duration;

    fn ids(list: Vec<Member>) -> Vec<String> {
        list.iter().map(|m| m.id().to_string()).collect()
    }

    /// The conformance check's expired-session step failed under load: the core's new
    /// session registered the member again before the watcher read, and a watch
    /// channel handed over only the latest list, in which the member never left.
    #[tokio::test]
    async fn a_member_that_leaves_and_returns_at_once_is_seen_leaving() {
        let backend = MemoryBackend::new();
        let ns = ElectionName::new("ns").unwrap();
        let (events, _rx) = SessionEvents::channel();
        let ttl = Duration::from_secs(10);
        let a = backend.open_session(ttl, events.clone()).await.unwrap();
        let d = backend.open_session(ttl, events).await.unwrap();
        a.register_member(&ns, &Member::new("a", "1").unwrap())
            .await
            .unwrap();
        d.register_member(&ns, &Member::new("d", "1").unwrap())
            .await
            .unwrap();
        let mut w = backend.watch_members(&ns).await.unwrap();
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a", "d"]);
        // d leaves and comes back before the watcher reads again.
        d.unregister_member(&ns, "d").await.unwrap();
        d.register_member(&ns, &Member::new("d", "1").unwrap())
            .await
            .unwrap();
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a"]);
        assert_eq!(ids(w.next().await.unwrap().unwrap()), ["a", "d"]);
    }
}
