//! `ShardManagerBuilder::before_handoff`: a node that hands shards over releases each
//! only once the hook's future completes (and the `Acquired` event's work guard is
//! gone), so the new leader is granted after the old node's work on the shard is over
//! (in-memory store, paused time).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tenure_core::MemoryBackend;
use tenure_shard::{Layout, ShardEvent, ShardEvents, ShardManager};
use tokio::sync::watch;
use tokio::time::Instant;

mod common;
use common::{node, timing, until};

const SHARDS: usize = 8;

/// Every event of `events` with the instant it arrived, until the sender closes. The
/// log keeps no work: each grant's work guard is done at once, so the hook alone holds
/// a handoff.
fn record(mut events: ShardEvents) -> Arc<Mutex<Vec<(Instant, ShardEvent)>>> {
    let log = Arc::new(Mutex::new(Vec::new()));
    let sink = log.clone();
    tokio::spawn(async move {
        while let Some(e) = events.recv().await {
            if let ShardEvent::Acquired { work, .. } = &e {
                work.done();
            }
            sink.lock().unwrap().push((Instant::now(), e));
        }
    });
    log
}

#[tokio::test(start_paused = true)]
async fn a_handoff_resigns_only_once_the_hook_is_done() {
    let backend: tenure_core::DynBackend = Arc::new(MemoryBackend::new());
    let layout = Layout::new("hooked", SHARDS, 2).unwrap();
    // The hook holds every handoff until the test opens the gate; it notes each call.
    let (gate, opened) = watch::channel(false);
    let calls: Arc<Mutex<BTreeMap<usize, u64>>> = Arc::default();
    let noted = calls.clone();
    let (a, a_events) = ShardManager::builder(backend.clone())
        .layout(layout.clone())
        .node_id("a")
        .timing(timing())
        .before_handoff(move |shard, token| {
            noted.lock().unwrap().insert(shard.index(), token.get());
            let mut opened = opened.clone();
            async move {
                let _ = opened.wait_for(|open| *open).await;
            }
            .boxed()
        })
        .start()
        .await
        .unwrap();
    let a_log = record(a_events);
    until("a alone leads every shard", || {
        a.status().borrow().held == SHARDS
    })
    .await;

    let (b, b_events) = node(&backend, &layout, "b").await;
    let b_log = record(b_events);
    // a hands b its share, and waits for the hook.
    for _ in 0..200 {
        if calls.lock().unwrap().len() == SHARDS / 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let called = calls.lock().unwrap().clone();
    assert_eq!(called.len(), SHARDS / 2, "hook calls: {called:?}");
    // Long after the handoffs fell due, b has none of them: a has not resigned.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        b_log.lock().unwrap().is_empty(),
        "b was granted a shard before the hook finished: {:?}",
        b_log.lock().unwrap()
    );
    let handed_off = |log: &Mutex<Vec<(Instant, ShardEvent)>>| -> BTreeMap<usize, u64> {
        log.lock()
            .unwrap()
            .iter()
            .filter_map(|(_, e)| match e {
                ShardEvent::HandedOff {
                    shard, token, to, ..
                } => {
                    assert_eq!(to.as_deref(), Some("b"));
                    Some((shard.index(), token.get()))
                }
                _ => None,
            })
            .collect()
    };
    assert!(
        handed_off(&a_log).is_empty(),
        "handed off before the hook finished"
    );

    let opened_at = Instant::now();
    gate.send_replace(true);
    for _ in 0..200 {
        if b.status().borrow().held == SHARDS / 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.status().borrow().held, SHARDS / 2);
    assert_eq!(
        handed_off(&a_log),
        called,
        "one hook call per HandedOff, same token"
    );
    for (at, e) in b_log.lock().unwrap().iter() {
        if let ShardEvent::Acquired { shard, .. } = e {
            assert!(called.contains_key(&shard.index()), "{shard:?}");
            assert!(*at >= opened_at, "{shard:?} granted before the gate opened");
        }
    }
    for m in [&a, &b] {
        m.close().await.unwrap();
    }
}
