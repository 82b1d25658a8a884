//! What the demo records as events arrive: the phase it is in, each handover and
//! release, and the figures of the step.

use super::*;

/// The script's steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Start,
    Balance,
    Crash,
    Join,
    Drain,
    Done,
}

impl Phase {
    /// The step as the live view shows it; `load`: with the step that balances by load.
    pub(super) fn label(self, load: bool) -> &'static str {
        match (self, load) {
            (Phase::Start, false) => "1/4 start and converge",
            (Phase::Crash, false) => "2/4 crash a node",
            (Phase::Join, false) => "3/4 add a node",
            (Phase::Drain, false) => "4/4 drain a node",
            (Phase::Start, true) => "1/5 start and converge",
            (Phase::Balance, _) => "2/5 balance by load",
            (Phase::Crash, true) => "3/5 crash a node",
            (Phase::Join, true) => "4/5 add a node",
            (Phase::Drain, true) => "5/5 drain a node",
            (Phase::Done, _) => "done",
        }
    }
}

/// A shard changing hands, for the live view.
#[derive(Debug, Clone)]
pub(super) struct Handover {
    pub(super) shard: String,
    pub(super) from: Arc<str>,
    pub(super) to: Arc<str>,
    pub(super) gap: Duration,
    pub(super) why: &'static str,
}

/// Why and when a shard was let go, by whom.
#[derive(Debug, Clone)]
pub(super) struct Released {
    pub(super) at: Instant,
    pub(super) from: Arc<str>,
    pub(super) why: &'static str,
}

/// What the event readers record.
pub(super) struct Record {
    pub(super) phase: Phase,
    pub(super) leaders: Vec<Option<Arc<str>>>,
    /// Shards led per node as its own events read so far say (acquired minus given
    /// up: one node's events arrive in order, while events of different nodes can be
    /// read in any order), so comparing it with each manager's status tells whether
    /// every event was read.
    pub(super) led: HashMap<Arc<str>, usize>,
    pub(super) acquired_at: Vec<Option<Instant>>,
    pub(super) released: HashMap<usize, Released>,
    pub(super) recent: VecDeque<Handover>,
    /// (phase, shard, at, node) of every acquisition.
    pub(super) acquisitions: Vec<(Phase, usize, Instant, Arc<str>)>,
    /// (phase, why, gap, from) of every shard that changed hands after a release by
    /// node `from`.
    pub(super) gaps: Vec<(Phase, &'static str, Duration, Arc<str>)>,
    pub(super) crashed: Vec<String>,
    pub(super) note: String,
}

pub(super) type Shared = Arc<Mutex<Record>>;

pub(super) fn lock(r: &Shared) -> std::sync::MutexGuard<'_, Record> {
    match r.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Record {
    pub(super) fn new(shards: usize) -> Record {
        Record {
            phase: Phase::Start,
            leaders: vec![None; shards],
            led: HashMap::new(),
            acquired_at: vec![None; shards],
            released: HashMap::new(),
            recent: VecDeque::new(),
            acquisitions: Vec::new(),
            gaps: Vec::new(),
            crashed: Vec::new(),
            note: String::new(),
        }
    }

    pub(super) fn push_recent(&mut self, h: Handover) {
        if self.recent.len() == 6 {
            self.recent.pop_front();
        }
        self.recent.push_back(h);
    }

    pub(super) fn on_event(&mut self, node: &Arc<str>, at: Instant, event: ShardEvent) {
        let count = self.led.entry(node.clone()).or_default();
        match &event {
            ShardEvent::Acquired { .. } => *count += 1,
            ShardEvent::Lost { .. } | ShardEvent::HandedOff { .. } => {
                *count = count.saturating_sub(1)
            }
        }
        match event {
            ShardEvent::Acquired { shard, .. } => {
                let i = shard.index();
                self.acquisitions.push((self.phase, i, at, node.clone()));
                if let Some(r) = self.released.remove(&i) {
                    let gap = at.saturating_duration_since(r.at);
                    self.gaps.push((self.phase, r.why, gap, r.from.clone()));
                    self.push_recent(Handover {
                        shard: shard.name().to_string(),
                        from: r.from,
                        to: node.clone(),
                        gap,
                        why: r.why,
                    });
                }
                self.leaders[i] = Some(node.clone());
                self.acquired_at[i] = Some(at);
            }
            ShardEvent::HandedOff { shard, .. } => {
                self.on_release(node, at, shard.index(), "handoff")
            }
            ShardEvent::Lost { shard, .. } => self.on_release(node, at, shard.index(), "lost"),
        }
    }

    pub(super) fn on_release(&mut self, node: &Arc<str>, at: Instant, i: usize, why: &'static str) {
        match &self.leaders[i] {
            Some(l) if l == node => {
                self.leaders[i] = None;
                self.released.insert(
                    i,
                    Released {
                        at,
                        from: node.clone(),
                        why,
                    },
                );
            }
            // Another node's grant was seen first (events of different nodes race on
            // the way here): the gap was at most the delivery skew.
            Some(_) => {
                let acquired = self.acquired_at[i].unwrap_or(at);
                let gap = acquired.saturating_duration_since(at);
                self.gaps.push((self.phase, why, gap, node.clone()));
            }
            None => {}
        }
    }

    pub(super) fn crash(&mut self, node: &str, at: Instant) -> usize {
        self.crashed.push(node.to_string());
        let node: Arc<str> = node.into();
        self.led.remove(&node);
        let mut n = 0;
        for i in 0..self.leaders.len() {
            if self.leaders[i].as_ref() == Some(&node) {
                n += 1;
                self.on_release(&node, at, i, "crash");
            }
        }
        n
    }

    /// Shards led by `node` as the events read so far say.
    pub(super) fn led_by(&self, node: &str) -> usize {
        self.led.get(node).copied().unwrap_or(0)
    }

    /// Whether every node (id, status) sees all of them, has nothing pending, has every
    /// shard with its preferred node, and this record has read all of its events.
    pub(super) fn all_read_and_settled(&self, nodes: &[(&str, ShardStatus)]) -> bool {
        nodes
            .iter()
            .all(|(id, s)| s.is_quiet(nodes.len()) && self.led_by(id) == s.held)
    }
}
