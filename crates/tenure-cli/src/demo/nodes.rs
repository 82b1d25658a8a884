//! The demo's nodes: each a shard manager with its own session, the task reading its
//! events, and the load reports of the shards it leads.

use super::*;

pub(super) struct Node {
    pub(super) id: String,
    pub(super) manager: Arc<ShardManager>,
}

/// The nodes of the demo and what they did.
pub(super) struct Demo {
    pub(super) backend: DynBackend,
    pub(super) layout: Layout,
    pub(super) options: DemoOptions,
    pub(super) nodes: Vec<Node>,
    /// Nodes started so far (they are dealt into zones in this order).
    pub(super) added: usize,
    pub(super) record: Shared,
    pub(super) started: Instant,
    /// Each shard's load figure (with `--load`).
    pub(super) figures: Option<Arc<[f64]>>,
    /// Whether the nodes report their figures yet (not during the cold start, so that
    /// it shows the count plan's leaders).
    pub(super) reporting: Arc<AtomicBool>,
}

/// What a node reports under `--load`: each shard's figure, once `on`.
pub(super) struct Reports {
    pub(super) figures: Arc<[f64]>,
    pub(super) reporter: LoadReporter,
    pub(super) on: Arc<AtomicBool>,
    pub(super) layout: Layout,
}

impl Reports {
    /// Report the figure of every shard in `led` whose leadership lasts, if reporting
    /// is on. False once the manager has stopped.
    pub(super) fn report(&self, led: &HashMap<usize, CancellationToken>) -> bool {
        if !self.on.load(Ordering::Relaxed) {
            return true;
        }
        for (&i, lost) in led {
            if lost.is_cancelled() {
                continue;
            }
            let (Some(shard), Some(figure)) = (self.layout.shards().get(i), self.figures.get(i))
            else {
                continue;
            };
            if let Err(e) = self.reporter.report(shard, *figure) {
                tracing::debug!(error = %e, "load reports stopped");
                return false;
            }
        }
        true
    }
}

/// Read one node's events into the record. Under `--load`, also report, every
/// [`REPORT_EVERY`], the figure of each shard the node leads by its events (until the
/// leadership's `lost` is cancelled), as an application's shard workers would: one
/// timer per node rather than a task per shard, so that large demos stay cheap.
pub(super) async fn read_events(
    mut events: ShardEvents,
    record: Shared,
    node: Arc<str>,
    mut reports: Option<Reports>,
) {
    // Read what has queued up in one go: at 10^5–10^6 shards a step brings events in
    // bursts, and one lock per event would let the reader fall behind.
    let mut batch = Vec::with_capacity(1024);
    let mut led: HashMap<usize, CancellationToken> = HashMap::new();
    let mut tick = tokio::time::interval(REPORT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            n = events.recv_many(&mut batch, 1024) => {
                if n == 0 {
                    return;
                }
                let at = Instant::now();
                if reports.is_some() {
                    for event in &batch {
                        match event {
                            ShardEvent::Acquired { shard, lost, .. } => {
                                led.insert(shard.index(), lost.clone());
                            }
                            ShardEvent::Lost { shard, .. } | ShardEvent::HandedOff { shard, .. } => {
                                led.remove(&shard.index());
                            }
                        }
                    }
                }
                let mut r = lock(&record);
                for event in batch.drain(..) {
                    r.on_event(&node, at, event);
                }
            }
            _ = tick.tick(), if reports.is_some() => {
                if reports.as_ref().is_some_and(|r| !r.report(&led)) {
                    reports = None;
                }
            }
        }
    }
}

/// Shards and load per node of `nodes` (and any other leader) by the leaders of `snap`.
pub(super) fn leaders_load(
    snap: &ShardView,
    nodes: &[Node],
    figures: &[f64],
) -> BTreeMap<String, (usize, f64)> {
    let mut per: BTreeMap<String, (usize, f64)> =
        nodes.iter().map(|n| (n.id.clone(), (0, 0.0))).collect();
    for s in &snap.shards {
        if let Some(l) = &s.leader {
            let e = per.entry(l.clone()).or_default();
            e.0 += 1;
            e.1 += figures.get(s.shard.index()).copied().unwrap_or(0.0);
        }
    }
    per
}

impl Demo {
    pub(super) async fn add(&mut self, id: &str) -> Result<()> {
        let mut builder = ShardManager::builder(self.backend.clone())
            .layout(self.layout.clone())
            .node_id(id)
            .timing(self.options.timing.clone())
            .handoff_rate(self.options.handoff_rate.0, self.options.handoff_rate.1);
        if self.options.zones > 0 {
            builder = builder.zone(format!("zone-{}", self.added % self.options.zones + 1));
        }
        if self.figures.is_some() {
            builder = builder.balance_by_load(LoadPolicy::default());
        }
        self.added += 1;
        let (manager, events) = builder.start().await?;
        let reports = self.figures.clone().map(|figures| Reports {
            figures,
            reporter: manager.load_reporter(),
            on: self.reporting.clone(),
            layout: self.layout.clone(),
        });
        tokio::spawn(read_events(events, self.record.clone(), id.into(), reports));
        self.nodes.push(Node {
            id: id.to_string(),
            manager: Arc::new(manager),
        });
        Ok(())
    }

    pub(super) fn take(&mut self, id: &str) -> Result<Node> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.id == id)
            .ok_or_else(|| Error::invalid(format!("no node {id}")))?;
        Ok(self.nodes.remove(i))
    }

    pub(super) fn node(&self, id: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.id == id)
            .ok_or_else(|| Error::invalid(format!("no node {id}")))
    }

    /// Every node sees all live nodes, nothing pending, every shard led by its
    /// preferred node, and the record has read every node's events (its count of each
    /// node's shards is the node's own), so a step's events are not counted in the next.
    pub(super) fn quiet(&self) -> bool {
        let statuses: Vec<(&str, ShardStatus)> = self
            .nodes
            .iter()
            .map(|n| (n.id.as_str(), n.manager.status().borrow().clone()))
            .collect();
        lock(&self.record).all_read_and_settled(&statuses)
    }

    /// What each node is doing, for telling apart progress from a stall: changes
    /// whenever a node takes, gives up or asks for a shard, or sees the members change.
    pub(super) fn progress(&self) -> Vec<(usize, usize, usize, usize, bool, usize)> {
        self.nodes
            .iter()
            .map(|n| {
                let s = n.manager.status().borrow().clone();
                (
                    s.held,
                    s.campaigning,
                    s.pending_handoffs,
                    s.members,
                    s.settled,
                    s.balancing,
                )
            })
            .collect()
    }

    /// Why the demo gave up waiting for `what`, in words: the nodes grouped by what
    /// their counters say (64 alike nodes make one line), and up to three shards not
    /// with their preferred node as the first such node sees them and as their
    /// preferred node does.
    pub(super) fn not_settled(&self, what: &str) -> Error {
        let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        for n in &self.nodes {
            let s = n.manager.status().borrow().clone();
            let held = if s.held == s.target {
                "holds its target".to_string()
            } else {
                format!("holds {} of a target of {}", s.held, s.target)
            };
            let state = format!(
                "{held}, campaigns for {}, has {} to hand off, sees {} members{}{}",
                s.campaigning,
                s.pending_handoffs,
                s.members,
                if s.settled {
                    ""
                } else {
                    ", not every shard with its preferred node"
                },
                if s.balancing > 0 {
                    format!(", balances load with {} moves still to make", s.balancing)
                } else {
                    String::new()
                }
            );
            groups.entry(state).or_default().push(&n.id);
        }
        {
            let r = lock(&self.record);
            for n in &self.nodes {
                let (read, held) = (r.led_by(&n.id), n.manager.status().borrow().held);
                if read != held {
                    groups
                        .entry(format!(
                            "holds {held} but its events read so far say {read}"
                        ))
                        .or_default()
                        .push(&n.id);
                }
            }
        }
        let mut lines: Vec<String> = groups
            .iter()
            .map(|(state, ids)| match ids.as_slice() {
                [one] => format!("{one} {state}"),
                many => format!("{} nodes ({}…) each {state}", many.len(), many[0]),
            })
            .collect();
        let unsettled = self
            .nodes
            .iter()
            .find(|n| !n.manager.status().borrow().settled);
        if let Some(n) = unsettled {
            let view = n.manager.view();
            for shard in view
                .shards
                .iter()
                .filter(|s| s.leader.is_none() || s.leader != s.preferred)
                .take(3)
            {
                let theirs = shard
                    .preferred
                    .as_deref()
                    .and_then(|p| self.nodes.iter().find(|m| m.id == p))
                    .map(|m| {
                        let v = m.manager.view();
                        let i = shard.shard.index();
                        format!(
                            "; {} sees it led by {}, preferring {}",
                            m.id,
                            v.shards[i].leader.as_deref().unwrap_or("nobody"),
                            v.shards[i].preferred.as_deref().unwrap_or("nobody")
                        )
                    })
                    .unwrap_or_default();
                lines.push(format!(
                    "shard {}: {} sees it led by {}, preferring {}{theirs}",
                    shard.shard,
                    n.id,
                    shard.leader.as_deref().unwrap_or("nobody"),
                    shard.preferred.as_deref().unwrap_or("nobody"),
                ));
            }
        }
        Error::new(
            ErrorKind::Timeout,
            format!(
                "{what}: no progress for {:?} and not settled: {}",
                self.options.step_limit,
                lines.join("; ")
            ),
        )
    }

    /// Shards and load per live node, by the leaders the store has now.
    pub(super) async fn loads_now(
        &self,
        figures: &[f64],
    ) -> Result<BTreeMap<String, (usize, f64)>> {
        let any = self
            .nodes
            .first()
            .ok_or_else(|| Error::invalid("no node left"))?;
        let snap = any.manager.snapshot().await?;
        Ok(leaders_load(&snap, &self.nodes, figures))
    }

    /// Whether every node's view has a published figure for every shard (but those
    /// too small to publish: they quantize to 0).
    pub(super) fn figures_published(&self) -> bool {
        let Some(figures) = &self.figures else {
            return true;
        };
        self.nodes.iter().all(|n| {
            n.manager.view().shards.iter().all(|s| {
                s.load.is_some()
                    || figures
                        .get(s.shard.index())
                        .is_none_or(|f| balance::quantize(*f) == 0)
            })
        })
    }

    /// Shards acquired so far (changes whenever a shard changes hands).
    pub(super) fn acquired(&self) -> usize {
        lock(&self.record).acquisitions.len()
    }

    pub(super) fn set_phase(&self, phase: Phase, note: String) {
        let mut r = lock(&self.record);
        r.phase = phase;
        r.note = note;
    }

    pub(super) fn frame(&self) -> String {
        let r = lock(&self.record);
        let total = self.layout.shards().len();
        let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &self.nodes {
            per_node.insert(&n.id, 0);
        }
        for c in &r.crashed {
            per_node.insert(c, 0);
        }
        for (l, c) in &r.led {
            if *c > 0 || per_node.contains_key(&**l) {
                per_node.insert(l, *c);
            }
        }
        let led: usize = r.led.values().sum();
        let max = per_node.values().copied().max().unwrap_or(0).max(1);
        // With --load: each node's load by the leaders its events name.
        let mut loads: HashMap<&str, f64> = HashMap::new();
        if let Some(figures) = &self.figures {
            for (i, l) in r.leaders.iter().enumerate() {
                if let Some(l) = l {
                    *loads.entry(&**l).or_default() += figures.get(i).copied().unwrap_or(0.0);
                }
            }
        }
        let top_load = loads.values().copied().fold(0.0, f64::max);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "tenure demo: {} shards, replication {}, {}, TTL {:?}",
            total,
            self.layout.replication(),
            self.options.backend_url,
            self.options.timing.ttl
        );
        let _ = writeln!(s);
        for (id, c) in &per_node {
            let width = c * 40 / max;
            let state = if r.crashed.iter().any(|x| x == id) {
                " crashed"
            } else if self
                .nodes
                .iter()
                .any(|n| n.id == *id && n.manager.status().borrow().draining)
            {
                " draining"
            } else {
                ""
            };
            let load = if self.figures.is_some() {
                let l = loads.get(id).copied().unwrap_or(0.0);
                format!("   load {} {:>7}", bar(l, top_load), thousands(l))
            } else {
                String::new()
            };
            let _ = writeln!(s, "  {id:<8} {:<40} {c:>4}{load}{state}", "█".repeat(width));
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "recent handovers:");
        for h in r.recent.iter().rev() {
            let _ = writeln!(
                s,
                "  shard {:<6} {:<8} → {:<8} gap {:>9}  ({})",
                h.shard,
                h.from,
                h.to,
                show_ms(ms(h.gap)),
                h.why
            );
        }
        for _ in r.recent.len()..6 {
            let _ = writeln!(s);
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "[{:>6.2} s] {}: {}  |  {led}/{total} shards led, {} handovers",
            self.started.elapsed().as_secs_f64(),
            r.phase.label(self.figures.is_some()),
            r.note,
            r.gaps.len()
        );
        s
    }

    /// Leaders per live node and leaderless shards, read from the store.
    pub(super) async fn end_state(&self) -> Result<EndSummary> {
        let any = self
            .nodes
            .first()
            .ok_or_else(|| Error::invalid("no node left"))?;
        let snap: ShardView = any.manager.snapshot().await?;
        let mut per_node: BTreeMap<String, usize> =
            self.nodes.iter().map(|n| (n.id.clone(), 0)).collect();
        let mut led = 0;
        for s in &snap.shards {
            if let Some(l) = &s.leader {
                led += 1;
                *per_node.entry(l.clone()).or_default() += 1;
            }
        }
        let mut per_zone: BTreeMap<String, usize> = BTreeMap::new();
        for n in &snap.nodes {
            if let Some(z) = &n.zone {
                *per_zone.entry(z.clone()).or_default() +=
                    per_node.get(&n.id).copied().unwrap_or(0);
            }
        }
        let max_leaders = per_node.values().copied().max().unwrap_or(0);
        let mean_leaders = if per_node.is_empty() {
            0.0
        } else {
            led as f64 / per_node.len() as f64
        };
        let imbalance = if mean_leaders > 0.0 {
            max_leaders as f64 / mean_leaders
        } else {
            0.0
        };
        let (load_per_node, load_imbalance, load_lower_bound) = match &self.figures {
            Some(figures) => {
                let loads: BTreeMap<String, f64> = leaders_load(&snap, &self.nodes, figures)
                    .into_iter()
                    .map(|(id, (_, load))| (id, load))
                    .collect();
                let imbalance = max_over_mean(loads.values().copied());
                (
                    loads,
                    Some(imbalance),
                    Some(lower_bound(figures, self.nodes.len())),
                )
            }
            None => (BTreeMap::new(), None, None),
        };
        Ok(EndSummary {
            led,
            leaderless: snap.shards.len() - led,
            per_node,
            per_zone,
            max_leaders,
            mean_leaders,
            imbalance,
            load_per_node,
            load_imbalance,
            load_lower_bound,
        })
    }

    pub(super) fn counts(&self) -> String {
        let r = lock(&self.record);
        let mut per_node: BTreeMap<&str, usize> =
            self.nodes.iter().map(|n| (n.id.as_str(), 0)).collect();
        for (l, c) in &r.led {
            if *c > 0 {
                per_node.insert(l, *c);
            }
        }
        per_node
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
