//! Membership: a key per member under the namespace's range, attached to the
//! registering session's lease; lists are range reads, watchers follow a prefix watch.

use std::collections::BTreeMap;
use std::time::Duration;

use tenure_core::{Member, Result, Retry};
use tokio::sync::watch;

use crate::keys::decode_member;
use crate::ops::{self, prefix_end};
use crate::proto::{EventType, WatchCreateRequest};
use crate::shared::Shared;

/// Members read per request: 64 values of at most 128 KiB fit in one answer.
const PAGE: i64 = 64;

/// One published member list, or the error shared by every watcher.
pub(crate) type Listed = tenure_core::Result<Vec<Member>>;

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

/// Follows one namespace for its watchers: a prefix watch from just after the revision
/// of the last list, applying each batch of events to the list and publishing it when
/// it changed; after a broken or compacted watch it lists again and watches from there.
/// Ends when every watcher is gone.
pub(crate) async fn watch_task(
    shared: std::sync::Arc<Shared>,
    range: String,
    mut members: BTreeMap<String, Member>,
    revision: i64,
    tx: watch::Sender<Listed>,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut from = revision + 1;
    let mut failed = false;
    let publish = |state: Listed| {
        let _ = tx.send_replace(state);
    };
    loop {
        if tx.is_closed() {
            return;
        }
        let create = WatchCreateRequest {
            key: range.as_bytes().to_vec(),
            range_end: prefix_end(range.as_bytes()),
            start_revision: from,
            ..Default::default()
        };
        let opened = shared
            .call("watch members", shared.client.watch(create))
            .await;
        let mut stream = match opened {
            Ok(s) => Some(s),
            Err(e) => {
                if !failed {
                    publish(Err(e));
                    failed = true;
                }
                None
            }
        };
        while let Some(s) = stream.as_mut() {
            let message = tokio::select! {
                _ = tx.closed() => return,
                m = s.message() => m,
            };
            match message {
                Ok(Some(response)) if response.canceled => stream = None,
                Ok(Some(response)) => {
                    attempt = 0;
                    let mut changed = false;
                    for event in &response.events {
                        let Some(kv) = &event.kv else { continue };
                        from = from.max(kv.mod_revision + 1);
                        let Some(id) = std::str::from_utf8(&kv.key)
                            .ok()
                            .and_then(|k| k.strip_prefix(range.as_str()))
                        else {
                            continue;
                        };
                        let put = event.r#type == EventType::Put as i32;
                        // A foreign value that replaced a member makes it no member.
                        let now = put.then(|| decode_member(&range, &kv.key, &kv.value));
                        match now.flatten() {
                            Some(m) if members.get(id) == Some(&m) => {}
                            Some(m) => {
                                members.insert(id.to_string(), m);
                                changed = true;
                            }
                            None => changed |= members.remove(id).is_some(),
                        }
                    }
                    if changed || failed {
                        failed = false;
                        publish(Ok(sorted(&members)));
                    }
                }
                Ok(None) | Err(_) => stream = None,
            }
        }
        // The watch broke, was cancelled (compaction) or never opened: list again and
        // watch from there.
        let delay = retry.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(if attempt > 1 { delay } else { Duration::ZERO }) => {}
        }
        match list(&shared, &range).await {
            Ok((now, at)) => {
                from = at + 1;
                if now != members || failed {
                    members = now;
                    failed = false;
                    publish(Ok(sorted(&members)));
                }
            }
            Err(e) => {
                if !failed {
                    publish(Err(e));
                    failed = true;
                }
            }
        }
    }
}
