//! Membership: a key per member under the namespace's range, attached to the
//! registering session's lease; lists are range reads, watchers follow a prefix watch.

use std::collections::BTreeMap;

use tenure_core::{Member, Result};

use crate::follow::Follower;
use crate::keys::decode_member;
use crate::ops::{self, prefix_end};
use crate::proto::{Event, EventType};
use crate::shared::Shared;

/// Members read per request: 16 values of at most 512 KiB make an answer of 8 MiB.
const PAGE: i64 = 16;

/// Read every member of the namespace `range` at one revision, page by page; returns
/// them by id and the revision read at.
pub(crate) async fn list(shared: &Shared, range: &str) -> Result<(BTreeMap<String, Member>, i64)> {
    let end = prefix_end(range.as_bytes());
    let mut members = BTreeMap::new();
    let mut from = range.as_bytes().to_vec();
    let mut revision = 0;
    loop {
        let page = ops::page(from.clone(), end.clone(), PAGE, revision);
        let resp = shared
            .requests
            .call("list members", shared.client.range(page))
            .await?;
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
