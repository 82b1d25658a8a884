//! `tenure demo`: N shard managers in one process, a script (converge, crash a node,
//! add a node, drain a node), a live view and a summary.
//!
//! With `--load zipf` every node balances by load and reports, for each shard it
//! leads, that shard's Zipf figure ([`balance::zipf`]). Reports start only once the
//! cold start has converged, so the leaders then are the count plan's: their load per
//! node is the baseline, shown as bars beside the load per node once the balancer is
//! done (a step of its own before the crash); each later step also waits for it.
//!
//! Every node is a [`ShardManager`] with its own session on one backend handle. Times
//! are taken when this process receives a manager's event, so they include the event
//! delivery (microseconds) and nothing else.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tenure::shard::balance::{self, LoadPolicy};
use tenure::shard::{
    Layout, LoadReporter, ShardEvent, ShardEvents, ShardManager, ShardStatus, ShardView,
};
use tenure::{DynBackend, Error, ErrorKind, Result, Timing};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::args::DemoLoad;
use crate::bench::Figure;

/// The exponent of the figures of `--load zipf`.
pub const ZIPF_EXPONENT: f64 = 1.1;

/// How often a leader reports the figures of its shards under `--load`.
const REPORT_EVERY: Duration = Duration::from_millis(500);

/// Under `--load`, a step is over once every figure is published and no shard has
/// changed hands for this long: the balancer acts once the figures have held still
/// for a load interval (1 s) and nodes publish up to an interval apart, so three
/// intervals leave it time to have acted.
const LOAD_QUIET: Duration = Duration::from_secs(3);

/// Width of the bars of the load per node, in characters.
const BAR: usize = 24;

/// What the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Backend URL, shown in the output.
    pub backend_url: String,
    /// Membership namespace (also the shards' election prefix).
    pub namespace: String,
    /// Nodes at the start.
    pub nodes: usize,
    /// Shards.
    pub shards: usize,
    /// Replication factor.
    pub replication: usize,
    /// Session timing of every node.
    pub timing: Timing,
    /// Graceful handoffs per second and burst, per node.
    pub handoff_rate: (f64, u32),
    /// Pause between the script's steps (so a viewer can follow; 0 in tests).
    pub pause: Duration,
    /// Failure domains: with N > 0, the nodes are dealt round-robin into zones
    /// `zone-1` … `zone-N` and every shard's replicas span them.
    pub zones: usize,
    /// How long a step may go without progress (no node taking, giving up or asking
    /// for a shard) before the demo gives up on it.
    pub step_limit: Duration,
    /// The load figures the nodes report (none: they balance by count).
    pub load: DemoLoad,
}

impl DemoOptions {
    /// The defaults of `tenure demo`: 5 nodes, 256 shards, replication 3, TTL 2 s.
    pub fn new(backend_url: &str) -> DemoOptions {
        DemoOptions {
            backend_url: backend_url.to_string(),
            namespace: format!("demo-{}", std::process::id()),
            nodes: 5,
            shards: 256,
            replication: 3,
            timing: Timing::from_ttl(Duration::from_secs(2)),
            handoff_rate: (200.0, 20),
            pause: Duration::from_secs(1),
            step_limit: Duration::from_secs(30),
            zones: 0,
            load: DemoLoad::None,
        }
    }
}

mod nodes;
mod record;
mod script;
mod summary;
mod view;

use nodes::*;
use record::*;
pub use script::run_demo;
pub use summary::*;
pub use view::*;

#[cfg(test)]
mod tests {
    use super::*;
    use tenure::FencingToken;

    fn acquired(layout: &Layout, i: usize) -> ShardEvent {
        ShardEvent::Acquired {
            shard: layout.shards()[i].clone(),
            token: FencingToken(1),
            lost: CancellationToken::new(),
            stop: CancellationToken::new(),
            work: tenure::WorkGuard::detached(),
            at: Instant::now(),
        }
    }

    fn handed_off(layout: &Layout, i: usize) -> ShardEvent {
        ShardEvent::HandedOff {
            shard: layout.shards()[i].clone(),
            token: FencingToken(1),
            to: None,
            at: Instant::now(),
        }
    }

    fn status(held: usize, members: usize) -> ShardStatus {
        ShardStatus {
            members,
            held,
            target: held,
            settled: true,
            ..ShardStatus::default()
        }
    }

    #[test]
    fn a_step_is_settled_only_once_every_node_s_events_are_read() {
        let layout = Layout::new("demo", 4, 1).expect("layout");
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        let mut r = Record::new(4);
        let t = Instant::now();
        for i in 0..4 {
            r.on_event(&a, t, acquired(&layout, i));
        }
        let managers = [("a", status(4, 2)), ("b", status(0, 2))];
        assert!(r.all_read_and_settled(&managers));
        // a handed shard 0 to b; b's grant is read first, a's handoff is not read yet:
        // not settled, however quiet the managers are (the next step would count it).
        let managers = [("a", status(3, 2)), ("b", status(1, 2))];
        r.on_event(&b, t, acquired(&layout, 0));
        assert!(!r.all_read_and_settled(&managers));
        r.on_event(&a, t, handed_off(&layout, 0));
        assert!(r.all_read_and_settled(&managers));
        // Events of different nodes read in any order give the same counts: b's
        // grant of shard 1 read before a's own (older) grant would have been.
        let mut late = Record::new(4);
        late.on_event(&b, t, acquired(&layout, 1));
        late.on_event(&a, t, acquired(&layout, 1));
        late.on_event(&a, t, handed_off(&layout, 1));
        assert_eq!((late.led_by("a"), late.led_by("b")), (0, 1));
        // A crash releases the crashed node's shards.
        assert_eq!(r.crash("a", t), 3);
        assert_eq!((r.led_by("a"), r.led_by("b")), (0, 1));
        // A node that still has work pending is not settled either.
        let busy = ShardStatus {
            pending_handoffs: 1,
            ..status(1, 1)
        };
        assert!(!r.all_read_and_settled(&[("b", busy)]));
        assert!(r.all_read_and_settled(&[("b", status(1, 1))]));
    }

    #[test]
    fn the_handoff_rate_keeps_small_demos_watchable_and_drains_large_ones_in_seconds() {
        assert_eq!(handoff_rate(256, 5), (200.0, 20));
        for (shards, nodes) in [(100_000, 10), (1_000_000, 10), (1 << 20, 2)] {
            let (rate, burst) = handoff_rate(shards, nodes);
            let drain = (shards / nodes) as f64 / rate;
            assert!(drain <= 2.0, "{shards} over {nodes}: {drain} s at {rate}/s");
            assert!(burst >= 1 && f64::from(burst) <= rate, "{burst} of {rate}");
        }
    }
}
