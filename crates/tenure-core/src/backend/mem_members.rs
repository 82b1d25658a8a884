//! The member lists of the in-memory store: registrations by (id, session), the latest
//! registration of an id winning, published to watchers change by change.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::sync::{broadcast, watch};

use super::{lock, MemberStream};
use crate::name::{ElectionName, Member};

/// Lists kept for a slow member watcher (see [`Namespace::changes`]).
const MEMBER_BACKLOG: usize = 256;

/// Every namespace's members.
#[derive(Debug, Default)]
pub(crate) struct Namespaces {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    namespaces: HashMap<ElectionName, Namespace>,
    /// Orders registrations so that the latest one of an id wins.
    next_registration: u64,
}

/// The members of one namespace.
#[derive(Debug)]
struct Namespace {
    /// By (id, session): the registration's order and the member.
    registrations: BTreeMap<(String, String), (u64, Member)>,
    /// The current list.
    current: watch::Sender<Arc<Vec<Member>>>,
    /// Every list after a change, in order, for watchers: a member that leaves and
    /// comes back at once (an expired session whose core registers it again) is seen
    /// leaving, as on a store whose watches report each event. A watcher more than
    /// [`MEMBER_BACKLOG`] lists behind skips to the ones still kept.
    changes: broadcast::Sender<Arc<Vec<Member>>>,
}

impl Namespace {
    fn new() -> Self {
        Namespace {
            registrations: BTreeMap::new(),
            current: watch::Sender::new(Arc::new(Vec::new())),
            changes: broadcast::Sender::new(MEMBER_BACKLOG),
        }
    }

    /// The list by id, the latest registration of each id winning.
    fn list(&self) -> Vec<Member> {
        let mut by_id: BTreeMap<&str, (u64, &Member)> = BTreeMap::new();
        for ((id, _), (seq, m)) in &self.registrations {
            let e = by_id.entry(id.as_str()).or_insert((*seq, m));
            if *seq > e.0 {
                *e = (*seq, m);
            }
        }
        by_id.into_values().map(|(_, m)| m.clone()).collect()
    }

    fn publish(&self) {
        let list = self.list();
        if **self.current.borrow() == list {
            return;
        }
        let list = Arc::new(list);
        self.current.send_replace(list.clone());
        let _ = self.changes.send(list);
    }
}

impl Namespaces {
    pub(crate) fn register(&self, session: &str, namespace: &ElectionName, member: &Member) {
        let mut st = lock(&self.state);
        st.next_registration += 1;
        let seq = st.next_registration;
        let ns = st
            .namespaces
            .entry(namespace.clone())
            .or_insert_with(Namespace::new);
        let key = (member.id().to_string(), session.to_string());
        ns.registrations.insert(key, (seq, member.clone()));
        ns.publish();
    }

    pub(crate) fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) {
        let mut st = lock(&self.state);
        if let Some(ns) = st.namespaces.get_mut(namespace) {
            ns.registrations
                .remove(&(id.to_string(), session.to_string()));
            ns.publish();
        }
    }

    /// Remove every registration of `session` (it ended).
    pub(crate) fn drop_session(&self, session: &str) {
        let mut st = lock(&self.state);
        for ns in st.namespaces.values_mut() {
            let before = ns.registrations.len();
            ns.registrations.retain(|(_, s), _| s != session);
            if ns.registrations.len() != before {
                ns.publish();
            }
        }
    }

    pub(crate) fn list(&self, namespace: &ElectionName) -> Vec<Member> {
        lock(&self.state)
            .namespaces
            .get(namespace)
            .map(Namespace::list)
            .unwrap_or_default()
    }

    /// The current list and the changes after it, taken under the lock so that no
    /// change falls between.
    pub(crate) fn watch(&self, namespace: &ElectionName) -> MemberStream {
        let (first, rx) = {
            let mut st = lock(&self.state);
            let ns = st
                .namespaces
                .entry(namespace.clone())
                .or_insert_with(Namespace::new);
            let first = ns.current.borrow().clone();
            (first, ns.changes.subscribe())
        };
        Box::pin(futures::stream::unfold(
            (Some(first), rx),
            |(first, mut rx)| async move {
                if let Some(list) = first {
                    return Some((Ok(list.as_ref().clone()), (None, rx)));
                }
                loop {
                    match rx.recv().await {
                        Ok(list) => return Some((Ok(list.as_ref().clone()), (None, rx))),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            },
        ))
    }
}
