//! Membership: a key per member under the namespace's range, attached to the
//! registering session's lease; lists are range reads, watchers follow the range on the
//! backend's prefix watch.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use tenure_core::backend::primitive::MemberStore;
use tenure_core::backend::Published;
use tenure_core::{ElectionName, Member, MemberStream, Result};

use crate::follow::{follow, Follower};
use crate::keys::{decode_member, parse_lease_hex};
use crate::ops::{self, op, prefix_end};
use crate::proto::{Event, EventType, TxnRequest};
use crate::shared::Shared;

/// The member lists of the sessions of both layouts (a session id is its lease id):
/// a member is a key on its session's lease.
pub(crate) struct EtcdMembers {
    pub(crate) shared: Arc<Shared>,
}

#[async_trait]
impl MemberStore for EtcdMembers {
    /// A put on a revoked or expired lease fails with "lease not found":
    /// `SessionExpired`. The put goes in a transaction: etcd (3.4) checks a plain put
    /// against every key already on its lease, which for a node holding 10,000 seats
    /// was a tenth of etcd's time at each update of the value.
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let key = self.shared.keys.member_key(namespace, member.id());
        let put = ops::put(&key, member.value().as_bytes(), parse_lease_hex(session)?);
        let txn = TxnRequest {
            success: vec![op(put)],
            ..Default::default()
        };
        self.shared.call("register member", txn).await?;
        Ok(())
    }

    /// Only if this session registered it: a later registration by another session
    /// stays.
    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        let key = self.shared.keys.member_key(namespace, id);
        let txn = TxnRequest {
            compare: vec![ops::on_lease(&key, parse_lease_hex(session)?)],
            success: vec![op(ops::delete(&key))],
            failure: Vec::new(),
        };
        self.shared.call("unregister member", txn).await?;
        Ok(())
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let range = self.shared.keys.member_range(namespace);
        Ok(list(&self.shared, &range).await?.0.into_values().collect())
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let range = self.shared.keys.member_range(namespace);
        let mut members = Members {
            range: range.clone(),
            members: BTreeMap::new(),
        };
        let (first, revision) = members.read(&self.shared).await?;
        let (published, stream) = Published::new(first);
        let shared = self.shared.clone();
        tokio::spawn(follow(shared, range, revision, published, members));
        Ok(stream)
    }
}

/// Members read per request: 16 values of at most 512 KiB make an answer of 8 MiB.
const PAGE: i64 = 16;

/// Read every member of the namespace `range` at one revision, page by page; returns
/// them by id and the revision read at.
async fn list(shared: &Shared, range: &str) -> Result<(BTreeMap<String, Member>, i64)> {
    let end = prefix_end(range.as_bytes());
    let mut members = BTreeMap::new();
    let mut from = range.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let page = ops::page(from.clone(), end.clone(), PAGE, revision);
        let resp = shared.call("list members", page).await?;
        if revision == 0 {
            revision = ops::revision(&resp.header);
        }
        let more = resp.more;
        let kvs = resp.kvs;
        let Some(last) = kvs.last() else {
            return Ok((members, revision));
        };
        from = last.key.clone();
        from.push(0);
        for kv in &kvs {
            if let Some(m) = decode_member(range, &kv.key, &kv.value) {
                members.insert(m.id().to_string(), m);
            }
        }
        if !more {
            return Ok((members, revision));
        }
    }
}

fn sorted(members: &BTreeMap<String, Member>) -> Vec<Member> {
    members.values().cloned().collect()
}

/// One namespace's members, kept from its key range (see [`crate::follow`]).
pub(crate) struct Members {
    pub(crate) range: String,
    pub(crate) members: BTreeMap<String, Member>,
}

impl Follower for Members {
    type State = Vec<Member>;

    async fn read(&mut self, shared: &Shared) -> Result<(Vec<Member>, i64)> {
        let (members, at) = list(shared, &self.range).await?;
        self.members = members;
        Ok((sorted(&self.members), at))
    }

    /// Each event changes one member: no request.
    async fn apply(&mut self, _: &Shared, events: &[Event]) -> Option<Vec<Member>> {
        for event in events {
            let Some(kv) = &event.kv else { continue };
            let Some(id) = std::str::from_utf8(&kv.key)
                .ok()
                .and_then(|k| k.strip_prefix(self.range.as_str()))
            else {
                continue;
            };
            let put = event.r#type == EventType::Put as i32;
            // A foreign value that replaced a member makes it no member.
            match put
                .then(|| decode_member(&self.range, &kv.key, &kv.value))
                .flatten()
            {
                Some(m) => self.members.insert(id.to_string(), m),
                None => self.members.remove(id),
            };
        }
        Some(sorted(&self.members))
    }
}
