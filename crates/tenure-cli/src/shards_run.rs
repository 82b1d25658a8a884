//! `tenure shards run`: a shard manager node that runs a command for every shard it
//! leads, so that a service in any language can be sharded.
//!
//! Each grant of a shard gets one run of the command, with the shard and the grant's
//! fencing token in its environment. The command is stopped (SIGTERM to its process
//! group, SIGKILL after the grace) when the shard is lost, and before the shard is
//! given up in a planned transition (a handoff, a drain, a preemption, SIGTERM): the
//! grant's work guard is held until the command exited, and only then does the node
//! release the seat (contract clause 15), so the next node's command starts after this
//! one ended. SIGTERM drains the node that way, shard by shard.
//!
//! Event lines, each with `namespace`, `shard`, `index`, `election`, `id`, `token` and
//! `mono_ns` (CLOCK_MONOTONIC nanoseconds of what the line reports: the grant, the
//! loss — for a missed deadline the deadline —, the release; not when it was printed):
//! `acquired`; `command_started` (`pid`); `handing_off` (`to`: the node that takes it,
//! or null) or `stepping_down` (`reason`) when the grant is asked to step down;
//! `command_exited` (`code` or `signal`, `stopped` if tenure stopped it, `killed` if it
//! took SIGKILL, `error` if it could not be started or waited for); and exactly one
//! end per `acquired`: `lost` (`reason`) or `handed_off` (`to`) once the seat is
//! released. A grant that ended before its `acquired` line was printed is still
//! printed, followed by its end. After a drain, one `drained` line (`namespace`, `id`,
//! `mono_ns`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tenure::shard::{Layout, Shard, ShardEvent, ShardEvents, ShardManager};
use tenure::{
    DynBackend, Error, ErrorKind, FencingToken, Member, MemoryBackend, Result, StepDownReason,
    Timing, WorkGuard,
};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::args::{seconds, ShardsRunArgs};
use crate::child::{Ended, LeaderCommand};
use crate::clock::{mono_ns, monotonic_now_ns};
use crate::events::EventSink;

/// The arguments of `tenure shards run`, checked: everything that can be wrong with
/// them is found here, before the backend is connected.
#[derive(Debug, Clone)]
pub struct RunPlan {
    layout: Layout,
    id: String,
    zone: Option<String>,
    timing: Timing,
    command: LeaderCommand,
    grace: Duration,
    /// `--member-grace`; `None`: the shard manager's default (a quarter of the TTL).
    member_grace: Option<Duration>,
}

impl RunPlan {
    /// Check `args`: layout, id, zone, timing, grace, member grace and the command's
    /// program.
    pub async fn new(args: &ShardsRunArgs) -> Result<RunPlan> {
        let layout = args.layout.layout()?;
        Member::check_id(&args.id).map_err(|e| Error::invalid(format!("id: {}", e.message())))?;
        let timing = args.run.timing.timing()?;
        let grace = seconds("grace", args.run.grace)?;
        let member_grace = args
            .member_grace
            .map(|s| seconds("member_grace", s))
            .transpose()?;
        let command = LeaderCommand::new(&args.command, grace)?;
        let plan = RunPlan {
            layout,
            id: args.id.clone(),
            zone: args.zone.clone(),
            timing,
            command,
            grace,
            member_grace,
        };
        plan.check_settings().await?;
        Ok(plan)
    }

    /// The session timing (its `connect_timeout` bounds connecting too).
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// The node's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The shard manager checks its settings (the zone's rule among them) as it
    /// starts: start one on a store of this process's own and leave at once, so that
    /// a bad setting is reported before the real store is connected.
    async fn check_settings(&self) -> Result<()> {
        let (manager, _events) = self.builder(Arc::new(MemoryBackend::new())).start().await?;
        manager.close().await
    }

    fn builder(&self, backend: DynBackend) -> tenure::shard::ShardManagerBuilder {
        // A step-down keeps the seat while the command exits: up to --grace, then
        // SIGKILL; the seat is released only after that.
        let timing = Timing {
            step_down_grace: self.grace + Duration::from_secs(2),
            ..self.timing.clone()
        };
        let mut builder = ShardManager::builder(backend)
            .layout(self.layout.clone())
            .node_id(&self.id)
            .timing(timing);
        if let Some(grace) = self.member_grace {
            builder = builder.member_grace(grace);
        }
        match &self.zone {
            Some(zone) => builder.zone(zone),
            None => builder,
        }
    }
}

/// Be a node of the namespace on `backend` until `shutdown` fires, then drain and
/// leave. Event lines go to `sink`.
pub async fn run_shards(
    backend: DynBackend,
    plan: &RunPlan,
    sink: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) -> Result<()> {
    let (manager, events) = plan.builder(backend).start().await?;
    let mut node = Node {
        plan,
        sink,
        supervisors: JoinSet::new(),
    };
    let (result, mut events) = node.follow(&manager, events, shutdown).await;
    // Close: grants still held (after a failed drain) step down, each command stops
    // first, and each grant's end is printed as the manager reports it.
    let close = manager.close();
    tokio::pin!(close);
    let closed = loop {
        tokio::select! {
            r = &mut close => break r,
            Some(event) = events.recv() => node.handle(event),
        }
    };
    while let Ok(event) = events.try_recv() {
        node.handle(event);
    }
    if let Err(e) = closed {
        tracing::warn!(error = %e, "closing the shard manager failed");
    }
    while node.supervisors.join_next().await.is_some() {}
    result
}

/// The event loop of one node.
struct Node<'a> {
    plan: &'a RunPlan,
    sink: Arc<dyn EventSink>,
    /// One task per grant: runs its command and reports how it ended.
    supervisors: JoinSet<()>,
}

impl Node<'_> {
    /// Handle the manager's events until `shutdown`, then drain: every shard handed
    /// over, every command exited. Gives the event stream back for the close.
    async fn follow(
        &mut self,
        manager: &ShardManager,
        mut events: ShardEvents,
        shutdown: CancellationToken,
    ) -> (Result<()>, ShardEvents) {
        let drain = async {
            shutdown.cancelled().await;
            manager.drain().await
        };
        tokio::pin!(drain);
        let drained = loop {
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.handle(event),
                    None => break Err(Error::new(ErrorKind::Closed, "shard manager stopped")),
                },
                result = &mut drain => break result,
                Some(_) = self.supervisors.join_next(), if !self.supervisors.is_empty() => {}
            }
        };
        // The events sent before the drain ended.
        while let Ok(event) = events.try_recv() {
            self.handle(event);
        }
        if drained.is_ok() {
            while self.supervisors.join_next().await.is_some() {}
            self.sink.emit(json!({
                "event": "drained", "namespace": self.plan.layout.namespace().as_str(),
                "id": self.plan.id, "mono_ns": monotonic_now_ns(),
            }));
        }
        (drained, events)
    }

    fn handle(&mut self, event: ShardEvent) {
        match event {
            ShardEvent::Acquired {
                shard,
                token,
                stop,
                work,
                at,
                ..
            } => {
                let grant = Grant::new(self.plan, &shard, token);
                self.sink.emit(grant.line("acquired", at));
                // Asked to step down or lost before this event was read: nothing to
                // run, and the work guard goes with the event.
                if stop.is_cancelled() {
                    if let Some(line) = grant.step_down_line(&work) {
                        self.sink.emit(line);
                    }
                    return;
                }
                let supervisor = Supervisor {
                    grant,
                    command: self.plan.command.clone(),
                    sink: self.sink.clone(),
                    stop,
                    work,
                };
                self.supervisors.spawn(supervisor.run());
            }
            ShardEvent::Lost {
                shard,
                token,
                reason,
                at,
            } => {
                let mut line = Grant::new(self.plan, &shard, token).line("lost", at);
                line["reason"] = json!(reason.to_string());
                self.sink.emit(line);
            }
            ShardEvent::HandedOff {
                shard,
                token,
                to,
                at,
            } => {
                let mut line = Grant::new(self.plan, &shard, token).line("handed_off", at);
                line["to"] = json!(to);
                self.sink.emit(line);
            }
        }
    }
}

/// One grant of one shard: what its event lines and its command's environment say.
#[derive(Debug, Clone)]
struct Grant {
    namespace: String,
    shard: String,
    index: usize,
    election: String,
    id: String,
    token: u64,
}

impl Grant {
    fn new(plan: &RunPlan, shard: &Shard, token: FencingToken) -> Grant {
        Grant {
            namespace: plan.layout.namespace().as_str().to_string(),
            shard: shard.name().to_string(),
            index: shard.index(),
            election: plan.layout.election(shard).as_str().to_string(),
            id: plan.id.clone(),
            token: token.get(),
        }
    }

    /// The event line `kind` about this grant, stamped with `at`.
    fn line(&self, kind: &str, at: Instant) -> Value {
        json!({
            "event": kind, "namespace": self.namespace, "shard": self.shard,
            "index": self.index, "election": self.election, "id": self.id,
            "token": self.token, "mono_ns": mono_ns(at),
        })
    }

    /// `handing_off` (a handoff or a drain) or `stepping_down` (any other reason), if
    /// the grant was asked to step down.
    fn step_down_line(&self, work: &WorkGuard) -> Option<Value> {
        let reason = work.step_down_reason()?;
        let at = work.stepping_down_at().unwrap_or_else(Instant::now);
        Some(match reason {
            StepDownReason::Handoff(to) => {
                let mut line = self.line("handing_off", at);
                line["to"] = json!(to);
                line
            }
            StepDownReason::Drain => {
                let mut line = self.line("handing_off", at);
                line["to"] = Value::Null;
                line
            }
            other => {
                let mut line = self.line("stepping_down", at);
                line["reason"] = json!(other.to_string());
                line
            }
        })
    }

    fn env(&self) -> [(&'static str, String); 5] {
        [
            ("TENURE_SHARD", self.shard.clone()),
            ("TENURE_SHARD_INDEX", self.index.to_string()),
            ("TENURE_TOKEN", self.token.to_string()),
            ("TENURE_ELECTION", self.election.clone()),
            ("TENURE_ID", self.id.clone()),
        ]
    }
}

/// Runs the command of one grant until it exits or the grant must stop, then lets the
/// grant go (drops its work guard).
struct Supervisor {
    grant: Grant,
    command: LeaderCommand,
    sink: Arc<dyn EventSink>,
    /// Cancelled when the grant is asked to step down or ends.
    stop: CancellationToken,
    /// Held while the command runs: a step-down releases the seat once it is gone.
    work: WorkGuard,
}

impl Supervisor {
    async fn run(self) {
        let ended = match self.command.start(&self.grant.env()) {
            Ok(running) => {
                let mut line = self.grant.line("command_started", Instant::now());
                line["pid"] = json!(running.pid());
                self.sink.emit(line);
                let (stop, work, grant, sink) = (
                    self.stop.clone(),
                    self.work.clone(),
                    self.grant.clone(),
                    self.sink.clone(),
                );
                let stopped = async move {
                    stop.cancelled().await;
                    if let Some(line) = grant.step_down_line(&work) {
                        sink.emit(line);
                    }
                };
                running.until(stopped).await
            }
            Err(e) => Ended::Failed(e),
        };
        let mut line = self.grant.line("command_exited", Instant::now());
        if let (Some(line), Value::Object(fields)) = (line.as_object_mut(), ended.json_fields()) {
            line.extend(fields);
        }
        self.sink.emit(line);
        // The work is over: a step-down (now or later) releases the seat at once.
        drop(self.work);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use clap::Parser;
    use serde_json::Value;
    use tenure::{ErrorKind, MemoryBackend};
    use tokio_util::sync::CancellationToken;

    use super::{run_shards, RunPlan};
    use crate::args::{Cli, Command, ShardsCommand, ShardsRunArgs};
    use crate::events::MemorySink;

    fn args(extra: &[&str]) -> ShardsRunArgs {
        let mut argv = vec!["tenure", "shards", "run"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Shards(s)) => match s.command {
                ShardsCommand::Run(a) => a,
                other => panic!("parsed {other:?}"),
            },
            other => panic!("parsed {other:?}"),
        }
    }

    const BASE: [&str; 6] = ["--namespace", "orders", "--shards", "8", "--id", "n1"];

    async fn plan(extra: &[&str]) -> tenure::Result<RunPlan> {
        let mut all = BASE.to_vec();
        all.extend_from_slice(extra);
        RunPlan::new(&args(&all)).await
    }

    #[tokio::test]
    async fn arguments_parse_with_their_defaults() {
        let a = args(&[&BASE[..], &["--", "sh", "-c", "echo $TENURE_SHARD"]].concat());
        assert_eq!(
            (
                a.layout.namespace.as_str(),
                a.layout.shards,
                a.layout.replication
            ),
            ("orders", 8, 3)
        );
        assert_eq!(
            (a.id.as_str(), a.zone.as_deref(), a.run.grace),
            ("n1", None, 5.0)
        );
        assert_eq!(a.command, ["sh", "-c", "echo $TENURE_SHARD"]);
        assert_eq!(a.run.health.health_addr, None);
        let a = args(
            &[
                &BASE[..],
                &[
                    "--replication",
                    "2",
                    "--zone",
                    "eu-1a",
                    "--grace",
                    "0.5",
                    "--ttl",
                    "2",
                ],
                &["--health-addr", "127.0.0.1:9000", "--", "true"],
            ]
            .concat(),
        );
        assert_eq!(
            (a.layout.replication, a.zone.as_deref(), a.run.grace),
            (2, Some("eu-1a"), 0.5)
        );
        assert_eq!(
            a.run.health.health_addr,
            Some("127.0.0.1:9000".parse().unwrap())
        );
        let p = RunPlan::new(&a).await.unwrap();
        assert_eq!(p.timing().ttl, Duration::from_secs(2));
        assert_eq!(p.id(), "n1");
        assert_eq!(
            p.member_grace, None,
            "the manager's default: a quarter of the TTL"
        );
        let p = plan(&["--member-grace", "1.5", "--", "true"])
            .await
            .unwrap();
        assert_eq!(p.member_grace, Some(Duration::from_millis(1500)));
        // A bad address is refused by the parser, naming the flag.
        let bad = Cli::try_parse_from([
            "tenure",
            "shards",
            "run",
            "--health-addr",
            "nowhere",
            "--",
            "true",
        ])
        .unwrap_err();
        assert!(bad.to_string().contains("--health-addr"), "{bad}");
    }

    #[tokio::test]
    async fn bad_input_names_the_flag() {
        for (extra, want) in [
            (&["--zone", "eu west", "--", "true"][..], "zone:"),
            (&["--grace", "-1", "--", "true"], "grace:"),
            (&["--member-grace", "-1", "--", "true"], "member_grace:"),
            (&["--member-grace", "5000", "--", "true"], "member_grace:"),
            (&["--ttl", "0", "--", "true"], "ttl"),
            (&["--replication", "0", "--", "true"], "replication"),
            (
                &["--", "/nonexistent/prog"],
                "command: \"/nonexistent/prog\" not found",
            ),
            (&[], "command: none given after --"),
        ] {
            let e = plan(extra).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{extra:?}: {e}");
            assert!(e.to_string().contains(want), "{extra:?}: {e}");
        }
        let mut bad_id = BASE.to_vec();
        bad_id[5] = "n/1";
        bad_id.extend(["--", "true"]);
        let e = RunPlan::new(&args(&bad_id)).await.unwrap_err();
        assert!(
            e.to_string().starts_with("invalid_argument: id: member id"),
            "{e}"
        );
        let mut bad_shards = BASE.to_vec();
        bad_shards[3] = "0";
        bad_shards.extend(["--", "true"]);
        let e = RunPlan::new(&args(&bad_shards)).await.unwrap_err();
        assert!(e.to_string().contains("shards"), "{e}");
    }

    async fn wait_for(sink: &MemorySink, what: &str, pred: impl Fn(&[Value]) -> bool) {
        for _ in 0..1000 {
            if pred(&sink.events()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{what}: not seen; got {:#?}", sink.events());
    }

    fn count(events: &[Value], kind: &str, id: &str) -> usize {
        events
            .iter()
            .filter(|v| v["event"] == kind && v["id"] == id)
            .count()
    }

    /// Issue 37's event-line bugs, on events made by hand: a grant asked to step down
    /// (or lost) before its `acquired` line was printed still gets `acquired`, no
    /// command, and then its end line; and every line carries the instant of what it
    /// reports, not the instant it was printed (a `lost` after a freeze: the deadline).
    #[tokio::test]
    async fn every_acquired_line_gets_one_end_stamped_with_what_it_reports() {
        use tenure::shard::ShardEvent;
        use tenure::{FencingToken, LossReason, WorkGuard};
        use tokio::time::Instant;

        let plan = plan(&["--", "true"]).await.unwrap();
        let sink = MemorySink::default();
        let mut node = super::Node {
            plan: &plan,
            sink: Arc::new(sink.clone()),
            supervisors: tokio::task::JoinSet::new(),
        };
        let shard = plan.layout.shards()[3].clone();
        let granted = Instant::now() - Duration::from_secs(3);
        let ended = granted + Duration::from_secs(1);
        let stop = CancellationToken::new();
        stop.cancel();
        node.handle(ShardEvent::Acquired {
            shard: shard.clone(),
            token: FencingToken(7),
            lost: CancellationToken::new(),
            stop,
            work: WorkGuard::detached(),
            at: granted,
        });
        node.handle(ShardEvent::HandedOff {
            shard: shard.clone(),
            token: FencingToken(7),
            to: Some("n2".into()),
            at: ended,
        });
        node.handle(ShardEvent::Acquired {
            shard: shard.clone(),
            token: FencingToken(9),
            lost: CancellationToken::new(),
            stop: {
                let s = CancellationToken::new();
                s.cancel();
                s
            },
            work: WorkGuard::detached(),
            at: ended,
        });
        node.handle(ShardEvent::Lost {
            shard,
            token: FencingToken(9),
            reason: LossReason::DeadlineExceeded,
            at: ended + Duration::from_millis(500),
        });
        assert!(
            node.supervisors.is_empty(),
            "a command started for an ended grant"
        );
        let lines = sink.events();
        let kinds: Vec<(&str, u64)> = lines
            .iter()
            .map(|v| (v["event"].as_str().unwrap(), v["token"].as_u64().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("acquired", 7),
                ("handed_off", 7),
                ("acquired", 9),
                ("lost", 9)
            ]
        );
        let ns = |i: usize| lines[i]["mono_ns"].as_u64().unwrap();
        assert_eq!(ns(0), crate::clock::mono_ns(granted));
        assert_eq!(ns(1), crate::clock::mono_ns(ended));
        assert_eq!(
            ns(3) - ns(2),
            500_000_000,
            "lost is stamped with its own instant"
        );
        assert!(ns(3) < crate::clock::monotonic_now_ns());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_nodes_share_the_shards_and_a_drain_stops_each_command_first() {
        let backend: tenure::DynBackend = Arc::new(MemoryBackend::new());
        let script = "trap 'exit 0' TERM; while :; do sleep 0.05; done";
        let node = |id: &'static str| {
            let backend = backend.clone();
            async move {
                let a = args(&[
                    "--namespace",
                    "jobs",
                    "--shards",
                    "8",
                    "--replication",
                    "2",
                    "--id",
                    id,
                    "--ttl",
                    "2",
                    "--grace",
                    "2",
                    "--",
                    "sh",
                    "-c",
                    script,
                ]);
                let plan = RunPlan::new(&a).await.unwrap();
                let (sink, stop) = (MemorySink::default(), CancellationToken::new());
                let task = {
                    let (sink, stop) = (Arc::new(sink.clone()), stop.clone());
                    tokio::spawn(async move { run_shards(backend, &plan, sink, stop).await })
                };
                (sink, stop, task)
            }
        };
        let (sa, stop_a, a) = node("a").await;
        wait_for(&sa, "a runs 8 commands", |e| {
            count(e, "command_started", "a") == 8
        })
        .await;
        let (sb, stop_b, b) = node("b").await;
        wait_for(&sb, "b runs 4 commands", |e| {
            count(e, "command_started", "b") == 4
        })
        .await;
        // Each handoff: a's command exited before a resigned, and before b's started.
        let a_events = sa.events();
        for started in sb
            .events()
            .iter()
            .filter(|v| v["event"] == "command_started")
        {
            let exited = a_events
                .iter()
                .find(|v| v["event"] == "command_exited" && v["shard"] == started["shard"])
                .expect("a's command for the shard exited");
            assert_eq!(exited["stopped"], true);
            assert_eq!(
                exited["signal"],
                Value::Null,
                "it exited on its own after SIGTERM"
            );
            assert!(exited["mono_ns"].as_u64() < started["mono_ns"].as_u64());
            assert!(started["token"].as_u64() > exited["token"].as_u64());
        }
        stop_a.cancel();
        a.await.unwrap().unwrap();
        let a_events = sa.events();
        assert_eq!(a_events.last().unwrap()["event"], "drained");
        assert_eq!(count(&a_events, "command_exited", "a"), 8);
        assert_eq!(count(&a_events, "handed_off", "a"), 8);
        wait_for(&sb, "b runs all 8", |e| {
            e.iter().filter(|v| v["event"] == "command_started").count()
                - e.iter().filter(|v| v["event"] == "command_exited").count()
                == 8
        })
        .await;
        stop_b.cancel();
        b.await.unwrap().unwrap();
        let b_events = sb.events();
        assert_eq!(count(&b_events, "command_exited", "b"), 8);
        let last = b_events.last().unwrap();
        assert_eq!(
            (last["event"].as_str(), last["namespace"].as_str()),
            (Some("drained"), Some("jobs"))
        );
    }
}
