//! The demo's script: converge, balance by load, crash a node, add one, drain one,
//! each step settled before the next, and the summary at the end.

use super::*;

/// Run the demo on `backend`; progress goes to `display`. Closes every node at the end.
pub async fn run_demo(
    backend: DynBackend,
    options: DemoOptions,
    display: Display,
    shutdown: CancellationToken,
) -> Result<DemoSummary> {
    if options.nodes < 2 {
        return Err(Error::invalid(format!(
            "nodes: {}; the script crashes one node and drains another, so it needs at least 2",
            options.nodes
        )));
    }
    options.timing.validate()?;
    let layout = Layout::new(&options.namespace, options.shards, options.replication)?;
    let view = Arc::new(View {
        display: Mutex::new(display),
        drawn: Mutex::new(0),
    });
    let started = Instant::now();
    let demo = Arc::new(tokio::sync::Mutex::new(Demo {
        backend,
        layout: layout.clone(),
        options: options.clone(),
        nodes: Vec::new(),
        added: 0,
        record: Arc::new(Mutex::new(Record::new(options.shards))),
        started,
        figures: match options.load {
            DemoLoad::None => None,
            DemoLoad::Zipf => Some(balance::zipf(options.shards, ZIPF_EXPONENT).into()),
        },
        reporting: Arc::new(AtomicBool::new(false)),
    }));
    let stop_drawing = CancellationToken::new();
    let drawer = if view.is_live() {
        let (demo, view, stop) = (demo.clone(), view.clone(), stop_drawing.clone());
        Some(tokio::spawn(async move {
            loop {
                // Built while the script is not between two of its own steps'
                // await points that hold the lock: the script only holds it briefly.
                let frame = demo.lock().await.frame();
                view.draw(&frame);
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
        }))
    } else {
        None
    };
    let script = script(demo.clone(), view.clone(), started);
    let result = tokio::select! {
        r = script => r,
        _ = shutdown.cancelled() => Err(Error::new(ErrorKind::Unavailable, "interrupted")),
    };
    stop_drawing.cancel();
    if let Some(d) = drawer {
        let _ = d.await;
    }
    {
        let d = demo.lock().await;
        view.draw(&d.frame());
        for n in &d.nodes {
            if let Err(e) = n.manager.close().await {
                tracing::warn!(node = %n.id, error = %e, "closing a node failed");
            }
        }
    }
    result
}

pub(super) async fn pause(options: &DemoOptions) {
    if !options.pause.is_zero() {
        tokio::time::sleep(options.pause).await;
    }
}

pub(super) async fn script(
    demo: Arc<tokio::sync::Mutex<Demo>>,
    view: Arc<View>,
    started: Instant,
) -> Result<DemoSummary> {
    let options = demo.lock().await.options.clone();
    let ids: Vec<String> = (1..=options.nodes).map(|i| format!("node-{i}")).collect();
    let say = |s: String| view.line(&format!("[{:>6.2} s] {s}", started.elapsed().as_secs_f64()));
    say(format!(
        "starting {} nodes: {} shards, replication {}, on {}, TTL {:?} (renew every {:?})",
        options.nodes,
        options.shards,
        options.replication,
        options.backend_url,
        options.timing.ttl,
        options.timing.renew_interval
    ));

    // 1. Start and converge.
    let t0 = Instant::now();
    {
        let mut d = demo.lock().await;
        d.set_phase(Phase::Start, format!("{} nodes campaigning", ids.len()));
        for id in &ids {
            d.add(id).await?;
        }
    }
    let converged = settle(&demo, "converge").await?;
    let converge = converged.saturating_duration_since(t0);
    {
        let d = demo.lock().await;
        say(format!(
            "converged in {}: {}",
            show_ms(ms(converge)),
            d.counts()
        ));
        d.set_phase(
            Phase::Start,
            format!("converged in {}", show_ms(ms(converge))),
        );
    }
    pause(&options).await;

    // 1b. With --load: the nodes start reporting their figures and balance by load.
    let figures = demo.lock().await.figures.clone();
    let load = match figures {
        Some(figures) => {
            let load = balance_by_load(&demo, &figures).await?;
            say(format!(
                "balanced by load in {} with {} moves: load max / mean {:.3} by count, {:.3} by load (lower bound {:.3})",
                show_ms(load.balance_ms),
                load.moves,
                load.max_over_mean_by_count,
                load.max_over_mean_by_load,
                load.lower_bound
            ));
            for line in load.bars() {
                view.line(&format!("  {line}"));
            }
            demo.lock().await.set_phase(
                Phase::Balance,
                format!(
                    "{} moves: max / mean {:.2} by count, {:.2} by load",
                    load.moves, load.max_over_mean_by_count, load.max_over_mean_by_load
                ),
            );
            pause(&options).await;
            Some(load)
        }
        None => None,
    };

    // 2. Crash a node.
    let victim = ids[ids.len() / 2].clone();
    let t_crash;
    let crashed_shards;
    {
        let mut d = demo.lock().await;
        let node = d.take(&victim)?;
        let held: Vec<usize> = node.manager.held().iter().map(|(s, _)| s.index()).collect();
        d.set_phase(
            Phase::Crash,
            format!("{victim} crashed with {} shards", held.len()),
        );
        t_crash = Instant::now();
        node.manager.abandon();
        lock(&d.record).crash(&victim, t_crash);
        crashed_shards = held;
        say(format!(
            "crashed {victim} (no resign; its {} shards wait for its TTL to expire)",
            crashed_shards.len()
        ));
    }
    settle_step(&demo, "failover").await?;
    let failover = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        let mut last = t_crash;
        let mut seen = 0;
        let mut was_crashed = vec![false; r.leaders.len()];
        for &i in &crashed_shards {
            if let Some(c) = was_crashed.get_mut(i) {
                *c = true;
            }
        }
        // The first acquisition of each (balancing by load may move one again later).
        for (_, shard, at, _) in &r.acquisitions {
            if *at >= t_crash {
                if let Some(c) = was_crashed.get_mut(*shard).filter(|c| **c) {
                    *c = false;
                    seen += 1;
                    last = last.max(*at);
                }
            }
        }
        if seen < crashed_shards.len() {
            tracing::warn!(
                seen,
                expected = crashed_shards.len(),
                "not every shard of the crashed node was acquired again"
            );
        }
        last.saturating_duration_since(t_crash)
    };
    {
        let d = demo.lock().await;
        say(format!(
            "{victim}'s {} shards led again {} after the crash: {}",
            crashed_shards.len(),
            show_ms(ms(failover)),
            d.counts()
        ));
        d.set_phase(
            Phase::Crash,
            format!("failover took {}", show_ms(ms(failover))),
        );
    }
    pause(&options).await;

    // 3. Add a node.
    let newcomer = format!("node-{}", options.nodes + 1);
    let t_join = Instant::now();
    {
        let mut d = demo.lock().await;
        d.set_phase(Phase::Join, format!("{newcomer} joins"));
        d.add(&newcomer).await?;
    }
    say(format!("added {newcomer}"));
    let joined = settle_step(&demo, "join").await?;
    let join = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        let moves = r
            .acquisitions
            .iter()
            .filter(|(p, ..)| *p == Phase::Join)
            .count();
        let optimum = r
            .leaders
            .iter()
            .filter(|l| l.as_deref() == Some(newcomer.as_str()))
            .count();
        let gaps: Vec<Duration> = r
            .gaps
            .iter()
            .filter(|(p, ..)| *p == Phase::Join)
            .map(|(_, _, g, _)| *g)
            .collect();
        JoinSummary {
            node: newcomer.clone(),
            moves,
            optimum,
            gaps: Spread::of(&gaps),
            settle_ms: ms(joined.saturating_duration_since(t_join)),
        }
    };
    {
        let d = demo.lock().await;
        say(format!(
            "{newcomer} took {} shards with {} moves (optimum {}), handoff gaps {}: {}",
            join.optimum,
            join.moves,
            join.optimum,
            join.gaps.show(),
            d.counts()
        ));
        d.set_phase(
            Phase::Join,
            format!("{} moves, optimum {}", join.moves, join.optimum),
        );
    }
    pause(&options).await;

    // 4. Drain a node, then let it leave.
    let drained = ids[0].clone();
    demo.lock()
        .await
        .set_phase(Phase::Drain, format!("{drained} drains"));
    let drain_start = Instant::now();
    // Drain without holding the lock, so the live view keeps drawing.
    drain_node(&demo, &drained).await?;
    let drain_time = drain_start.elapsed();
    {
        let mut d = demo.lock().await;
        let node = d.take(&drained)?;
        node.manager.close().await?;
    }
    settle_step(&demo, "drain").await?;
    let drain = {
        let d = demo.lock().await;
        let r = lock(&d.record);
        // The drained node's own handoffs (with --load, the balancer may move others').
        let gaps: Vec<Duration> = r
            .gaps
            .iter()
            .filter(|(p, why, _, from)| {
                *p == Phase::Drain && *why == "handoff" && **from == *drained
            })
            .map(|(_, _, g, _)| *g)
            .collect();
        DrainSummary {
            node: drained.clone(),
            handoffs: gaps.len(),
            gaps: Spread::of(&gaps),
            drain_ms: ms(drain_time),
        }
    };
    {
        let d = demo.lock().await;
        say(format!(
            "drained {drained} in {}: {} handoffs, gaps {}; it left: {}",
            show_ms(drain.drain_ms),
            drain.handoffs,
            drain.gaps.show(),
            d.counts()
        ));
        d.set_phase(Phase::Done, format!("{drained} drained and left"));
    }

    let d = demo.lock().await;
    let end = d.end_state().await?;
    let all_gaps: Vec<Duration> = lock(&d.record)
        .gaps
        .iter()
        .filter(|(_, why, ..)| *why == "handoff")
        .map(|(_, _, g, _)| *g)
        .collect();
    Ok(DemoSummary {
        backend: options.backend_url.clone(),
        namespace: options.namespace.clone(),
        nodes: options.nodes,
        shards: options.shards,
        replication: options.replication,
        ttl_ms: ms(options.timing.ttl),
        renew_interval_ms: ms(options.timing.renew_interval),
        converge_ms: ms(converge),
        crashes: vec![CrashSummary {
            node: victim,
            shards: crashed_shards.len(),
            failover_ms: ms(failover),
        }],
        join,
        drain,
        handoff_gaps: Spread::of(&all_gaps),
        load,
        end,
        wall_ms: ms(started.elapsed()),
    })
}

/// Settle without holding the demo's lock between checks (the view draws meanwhile).
/// The budget scales with the work: the demo gives up only after `step_limit` in which
/// no node took, gave up or asked for a shard, however long the whole step takes.
pub(super) async fn settle(demo: &Arc<tokio::sync::Mutex<Demo>>, what: &str) -> Result<Instant> {
    let limit = demo.lock().await.options.step_limit;
    let mut last = (demo.lock().await.progress(), Instant::now());
    let mut since: Option<Instant> = None;
    loop {
        let (quiet, now) = {
            let d = demo.lock().await;
            (d.quiet(), d.progress())
        };
        if quiet {
            let s = *since.get_or_insert_with(Instant::now);
            if s.elapsed() >= Duration::from_millis(100) {
                return Ok(s);
            }
        } else {
            since = None;
        }
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() > limit {
            return Err(demo.lock().await.not_settled(what));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The step that balances by load: the load per node by the leaders of the cold start
/// (the count plan: no figure is published yet), then the nodes report their figures
/// and the balancer moves shards until the load per node settles.
pub(super) async fn balance_by_load(
    demo: &Arc<tokio::sync::Mutex<Demo>>,
    figures: &[f64],
) -> Result<LoadSummary> {
    let by_count = demo.lock().await.loads_now(figures).await?;
    let (started, before) = {
        let d = demo.lock().await;
        d.set_phase(Phase::Balance, "the nodes report their loads".into());
        d.reporting.store(true, Ordering::Relaxed);
        (Instant::now(), d.acquired())
    };
    let balanced = settle_step(demo, "balance by load").await?;
    let d = demo.lock().await;
    let by_load = d.loads_now(figures).await?;
    let moves = d.acquired().saturating_sub(before);
    let mut per_node = BTreeMap::new();
    for id in by_count.keys().chain(by_load.keys()) {
        let (a, b) = (
            by_count.get(id).copied().unwrap_or_default(),
            by_load.get(id).copied().unwrap_or_default(),
        );
        per_node.insert(
            id.clone(),
            NodeLoad {
                shards_by_count: a.0,
                by_count: a.1,
                shards_by_load: b.0,
                by_load: b.1,
            },
        );
    }
    Ok(LoadSummary {
        figures: format!("Zipf figures, exponent {ZIPF_EXPONENT}"),
        largest: figures.iter().copied().fold(0.0, f64::max),
        total: figures.iter().sum(),
        max_over_mean_by_count: max_over_mean(per_node.values().map(|n| n.by_count)),
        max_over_mean_by_load: max_over_mean(per_node.values().map(|n| n.by_load)),
        lower_bound: lower_bound(figures, d.nodes.len()),
        per_node,
        moves,
        balance_ms: ms(balanced.saturating_duration_since(started)),
    })
}

/// [`settle`]; with `--load`, also until every shard's figure is published and no
/// shard has changed hands for [`LOAD_QUIET`] (the balancer acts a while after the
/// figures held still, so the first quiet moment is not the end of a step). Returns
/// when the last quiet stretch began; gives up when shards still change hands after
/// four times `step_limit`, or the figures are not all published within it.
pub(super) async fn settle_step(
    demo: &Arc<tokio::sync::Mutex<Demo>>,
    what: &str,
) -> Result<Instant> {
    let (load, limit) = {
        let d = demo.lock().await;
        (d.figures.is_some(), d.options.step_limit)
    };
    if !load {
        return settle(demo, what).await;
    }
    let started = Instant::now();
    let mut published = false;
    loop {
        let at = settle(demo, what).await?;
        if !published {
            published = demo.lock().await.figures_published();
            if !published {
                if started.elapsed() > limit {
                    return Err(Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "{what}: the nodes' load figures were not all published within {limit:?}"
                        ),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        }
        let (moved, since) = (demo.lock().await.acquired(), Instant::now());
        let mut still = true;
        while since.elapsed() < LOAD_QUIET {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let d = demo.lock().await;
            if d.acquired() != moved || !d.quiet() {
                still = false;
                break;
            }
        }
        if still {
            return Ok(at);
        }
        if started.elapsed() > limit * 4 {
            return Err(Error::new(
                ErrorKind::Timeout,
                format!(
                    "{what}: shards still change hands after {:?} of balancing by load",
                    limit * 4
                ),
            ));
        }
    }
}

/// Drain `id` without holding the demo's lock while it runs. Like [`settle`], it gives
/// up only after `step_limit` in which the node handed nothing over.
pub(super) async fn drain_node(demo: &Arc<tokio::sync::Mutex<Demo>>, id: &str) -> Result<()> {
    let (manager, limit) = {
        let d = demo.lock().await;
        (d.node(id)?.manager.clone(), d.options.step_limit)
    };
    let mut status = manager.status();
    let left = |s: &tenure::shard::ShardStatus| (s.held, s.campaigning);
    let mut last = (left(&status.borrow()), Instant::now());
    let drain = manager.drain();
    tokio::pin!(drain);
    loop {
        tokio::select! {
            r = &mut drain => return r,
            _ = status.changed() => {
                let now = left(&status.borrow_and_update());
                if now != last.0 {
                    last = (now, Instant::now());
                }
            }
            _ = tokio::time::sleep_until(last.1 + limit) => {
                let (held, campaigning) = last.0;
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "drain of {id}: nothing handed over for {limit:?}; it still holds {held} shards and campaigns for {campaigning}"
                    ),
                ));
            }
        }
    }
}
