//! `tenure campaign`: campaign, print events, run a command while leader.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tenure::{
    Candidate, DynBackend, ElectionName, LeaderContext, LeaderRunner, Result, Session, Timing,
};
use tokio_util::sync::CancellationToken;

use crate::args::{seconds, CampaignArgs};
use crate::child::{Ended, LeaderCommand};
use crate::events::{leadership_event_json, EventSink};

/// The arguments of `tenure campaign`, checked: everything that can be wrong with them
/// is found here, before the backend is connected.
#[derive(Debug, Clone)]
pub struct CampaignPlan {
    timing: Timing,
    election: ElectionName,
    candidate: Candidate,
    grace: Duration,
    command: Option<LeaderCommand>,
}

impl CampaignPlan {
    /// Check `args` (timing, election name, id, value and priority, grace, the
    /// command's program).
    pub fn new(args: &CampaignArgs) -> Result<CampaignPlan> {
        let timing = args.run.timing.timing()?;
        let election = ElectionName::new(&args.election)?;
        let mut candidate =
            Candidate::with_value(&args.id, &args.value)?.with_priority(args.priority)?;
        if args.no_preempt {
            candidate = candidate.never_preempted();
        }
        let grace = seconds("grace", args.run.grace)?;
        let command = if args.command.is_empty() {
            None
        } else {
            Some(LeaderCommand::new(&args.command, grace)?)
        };
        Ok(CampaignPlan {
            timing,
            election,
            candidate,
            grace,
            command,
        })
    }

    /// The session timing (its `connect_timeout` bounds connecting too).
    pub fn timing(&self) -> &Timing {
        &self.timing
    }
}

/// Campaign on `backend` until `shutdown` fires, then resign. Events go to `sink`.
pub async fn run_campaign(
    backend: DynBackend,
    plan: &CampaignPlan,
    sink: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) -> Result<()> {
    let grace = plan.grace;
    // A step-down (SIGTERM, preemption, handover) keeps the seat while the command
    // exits: up to --grace, then SIGKILL; the store releases it only after that.
    let timing = Timing {
        step_down_grace: grace + Duration::from_secs(2),
        ..plan.timing.clone()
    };
    let session = Session::open(backend, timing).await?;
    let mut runner = LeaderRunner::new(
        session.clone(),
        plan.election.clone(),
        plan.candidate.clone(),
    )
    .task_grace(grace + Duration::from_secs(1));
    let mut events = runner.subscribe();
    let id = plan.candidate.id().to_string();
    let printer = tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if let Some(line) = leadership_event_json(&id, &ev) {
                sink.emit(line);
            }
        }
    });
    let command = Arc::new(plan.command.clone());
    let id = plan.candidate.id().to_string();
    let result = runner
        .run(shutdown, move |ctx| {
            let command = command.clone();
            let id = id.clone();
            async move {
                match command.as_ref() {
                    Some(command) => run_command(command, &id, &ctx).await,
                    None => {
                        ctx.cancelled().await;
                        Ok(())
                    }
                }
            }
        })
        .await;
    let _ = printer.await;
    if let Err(e) = session.close().await {
        tracing::warn!(error = %e, "closing the session failed");
    }
    result
}

/// Run the command until it exits or leadership ends (then SIGTERM its group, and
/// SIGKILL it after the grace period). The command may leave its successor a state
/// (contract clause 16): what it writes to the file `$TENURE_STATE_OUT` is read when it
/// exits (not when it had to be killed) and left with the release; a state this grant
/// inherited is in the file `$TENURE_STATE_IN`, with the token of the grant that left
/// it in `$TENURE_STATE_FROM`.
async fn run_command(
    command: &LeaderCommand,
    id: &str,
    ctx: &LeaderContext,
) -> std::result::Result<(), String> {
    let files = StateFiles::new(ctx)?;
    let mut env = vec![
        ("TENURE_TOKEN", ctx.token().get().to_string()),
        ("TENURE_ELECTION", ctx.election().as_str().to_string()),
        ("TENURE_ID", id.to_string()),
        ("TENURE_STATE_OUT", files.out_path()),
    ];
    if let Some((from, path)) = files.inherited(ctx) {
        env.push(("TENURE_STATE_IN", path));
        env.push(("TENURE_STATE_FROM", from.get().to_string()));
    }
    let ended = command.start(&env)?.until(ctx.cancelled()).await;
    let killed = matches!(ended, Ended::Stopped { killed: true, .. });
    if !killed {
        files.pass_on(ctx);
    }
    match ended {
        Ended::Exited(s) if s.success() => Ok(()),
        Ended::Exited(s) => Err(format!("command exited with {s}")),
        Ended::Failed(e) => Err(format!("waiting for the command failed: {e}")),
        Ended::Stopped { status, killed } => {
            tracing::debug!(?status, killed, "command stopped");
            Ok(())
        }
    }
}

/// The command's state files: a private directory per grant, removed when done.
struct StateFiles {
    dir: PathBuf,
}

impl StateFiles {
    fn new(ctx: &LeaderContext) -> std::result::Result<StateFiles, String> {
        let dir = std::env::temp_dir().join(format!(
            "tenure-state-{}-{}-{:x}",
            std::process::id(),
            ctx.token().get(),
            tenure::backend::random_id()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("state directory {}: {e}", dir.display()))?;
        Ok(StateFiles { dir })
    }

    fn out_path(&self) -> String {
        self.dir.join("out").display().to_string()
    }

    /// Write what the grant inherited to a file; the token that left it and the path.
    fn inherited(&self, ctx: &LeaderContext) -> Option<(tenure::FencingToken, String)> {
        let (from, state) = ctx.inherited()?;
        let path = self.dir.join("in");
        match std::fs::write(&path, state) {
            Ok(()) => Some((from, path.display().to_string())),
            Err(e) => {
                tracing::error!(error = %e, "could not write the inherited state; the command starts without it");
                None
            }
        }
    }

    /// Leave what the command wrote to `$TENURE_STATE_OUT` to the next grant.
    fn pass_on(&self, ctx: &LeaderContext) {
        let path = self.dir.join("out");
        match std::fs::read(&path) {
            Ok(state) => {
                if let Err(e) = ctx.leave_state(state) {
                    tracing::error!(error = %e, "the command's state is not passed on");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(error = %e, "could not read the command's state"),
        }
    }
}

impl Drop for StateFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Campaigns in this process through [`run_campaign`] (two on one in-memory store, or
/// one whose session the store expires); the binary's own tests are in `tests/cli.rs`.
#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use clap::Parser;
    use serde_json::Value;
    use tenure::MemoryBackend;
    use tokio_util::sync::CancellationToken;

    use super::{run_campaign, CampaignPlan};
    use crate::args::{Cli, Command};
    use crate::events::MemorySink;

    /// The checked plan of `tenure campaign ARGS`.
    fn plan(args: &[&str]) -> CampaignPlan {
        let mut argv = vec!["tenure", "campaign"];
        argv.extend_from_slice(args);
        match Cli::parse_from(argv).command {
            Command::Campaign(a) => CampaignPlan::new(&a).unwrap(),
            other => panic!("parsed {other:?}"),
        }
    }

    async fn wait_for(sink: &MemorySink, pred: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..500 {
            if let Some(v) = sink.events().into_iter().find(|v| pred(v)) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("event not seen; got {:?}", sink.events());
    }

    fn is(kind: &'static str) -> impl Fn(&Value) -> bool {
        move |v| v["event"] == kind
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_campaigns_in_one_process_hand_over_on_shutdown() {
        let backend: tenure::DynBackend = Arc::new(MemoryBackend::new());
        let (sa, sb) = (MemorySink::default(), MemorySink::default());
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let args_a = plan(&["--election", "jobs/nightly", "--id", "a", "--ttl", "2"]);
        let args_b = plan(&["--election", "jobs/nightly", "--id", "b", "--ttl", "2"]);
        let a = {
            let (backend, sink, stop) = (backend.clone(), Arc::new(sa.clone()), stop_a.clone());
            tokio::spawn(async move { run_campaign(backend, &args_a, sink, stop).await })
        };
        let elected_a = wait_for(&sa, is("elected")).await;
        let b = {
            let (backend, sink, stop) = (backend.clone(), Arc::new(sb.clone()), stop_b.clone());
            tokio::spawn(async move { run_campaign(backend, &args_b, sink, stop).await })
        };
        wait_for(&sb, is("campaigning")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(sb.events().iter().all(|v| v["event"] != "elected"));
        stop_a.cancel();
        a.await.unwrap().unwrap();
        let stepping_a = wait_for(&sa, is("stepping_down")).await;
        assert_eq!(stepping_a["reason"], "shutdown");
        let resigned_a = wait_for(&sa, is("resigned")).await;
        let elected_b = wait_for(&sb, is("elected")).await;

        for v in [&elected_a, &resigned_a, &elected_b] {
            assert_eq!(v["election"], "jobs/nightly");
            assert!(v["mono_ns"].as_u64().unwrap() > 0);
            assert!(v["token"].as_u64().is_some());
        }
        assert_eq!(elected_a["id"], "a");
        assert_eq!(resigned_a["cause"], "shutdown");
        assert_eq!(resigned_a["token"], elected_a["token"]);
        assert_eq!(elected_b["id"], "b");
        assert!(elected_b["token"].as_u64() > elected_a["token"].as_u64());
        // a's tenure ended before b's began.
        assert!(resigned_a["mono_ns"].as_u64() <= elected_b["mono_ns"].as_u64());
        stop_b.cancel();
        b.await.unwrap().unwrap();
    }

    /// Clause 16 through the command: what the leader's command writes to
    /// `$TENURE_STATE_OUT` before it exits is what the next leader's command finds in
    /// `$TENURE_STATE_IN`, and its `elected` line says how many bytes it inherited.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_command_leaves_its_successor_a_state() {
        let backend: tenure::DynBackend = Arc::new(MemoryBackend::new());
        let seen = std::env::temp_dir().join(format!(
            "tenure-cli-state-test-{:x}",
            tenure::backend::random_id()
        ));
        let seen_arg = format!(
            "cat \"$TENURE_STATE_IN\" > {} && echo \" from $TENURE_STATE_FROM\" >> {}; sleep 30",
            seen.display(),
            seen.display()
        );
        let start = |args: Vec<String>| {
            let (sink, stop) = (MemorySink::default(), CancellationToken::new());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let args = plan(&args);
            let task = {
                let (backend, sink, stop) = (backend.clone(), Arc::new(sink.clone()), stop.clone());
                tokio::spawn(async move { run_campaign(backend, &args, sink, stop).await })
            };
            (sink, stop, task)
        };
        let with = |id: &str, script: &str| -> Vec<String> {
            [
                "--election",
                "jobs/state",
                "--ttl",
                "2",
                "--id",
                id,
                "--",
                "sh",
                "-c",
                script,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect()
        };
        let (sb, stop_b, b) = start(with("b", &seen_arg));
        let elected_b0 = wait_for(&sb, is("elected")).await;
        assert!(elected_b0.get("inherited_bytes").is_none(), "{elected_b0}");
        // b leads with nothing inherited; a waits, then b is shut down without a state.
        let (sa, stop_a, a) = start(with(
            "a",
            "echo cursor-7 > \"$TENURE_STATE_OUT\"; sleep 0.2",
        ));
        wait_for(&sa, is("campaigning")).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop_b.cancel();
        b.await.unwrap().unwrap();
        let elected_a = wait_for(&sa, is("elected")).await;
        assert!(elected_a.get("inherited_bytes").is_none(), "{elected_a}");
        // a's command leaves a state and exits; the next grant (a again, or c) has it.
        let (sc, stop_c, c) = start(with("c", &seen_arg));
        let elected_c = wait_for(&sc, is("elected")).await;
        assert_eq!(elected_c["inherited_bytes"], 9, "{elected_c}");
        let mut got = String::new();
        for _ in 0..100 {
            got = std::fs::read_to_string(&seen).unwrap_or_default();
            if got.contains("from") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = std::fs::remove_file(&seen);
        assert_eq!(got, format!("cursor-7\n from {}\n", elected_a["token"]));
        for (stop, task) in [(stop_c, c), (stop_a, a)] {
            stop.cancel();
            task.await.unwrap().unwrap();
        }
    }

    /// `--priority` above the leader's preempts it unless the leader runs with
    /// `--no-preempt`: its `stepping_down` line says "preempted", then `resigned`
    /// ("stepped down: preempted") comes once its work stopped, before the new grant.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_higher_priority_preempts_the_leader_unless_it_opted_out() {
        let backend: tenure::DynBackend = Arc::new(MemoryBackend::new());
        let start = |args: Vec<&str>| {
            let (sink, stop) = (MemorySink::default(), CancellationToken::new());
            let args = plan(&args);
            let task = {
                let (backend, sink, stop) = (backend.clone(), Arc::new(sink.clone()), stop.clone());
                tokio::spawn(async move { run_campaign(backend, &args, sink, stop).await })
            };
            (sink, stop, task)
        };
        let base = ["--election", "jobs/preferred", "--ttl", "2"];
        let with = |more: &[&'static str]| [&base[..], more].concat();
        let (sa, stop_a, a) = start(with(&["--id", "a", "--no-preempt"]));
        wait_for(&sa, is("elected")).await;
        let (sb, stop_b, b) = start(with(&["--id", "b", "--priority", "5"]));
        wait_for(&sb, is("campaigning")).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(sa.events().iter().all(|v| v["event"] != "lost"));
        stop_a.cancel();
        a.await.unwrap().unwrap();
        let elected_b = wait_for(&sb, is("elected")).await;
        let (sc, stop_c, c) = start(with(&["--id", "c", "--priority", "9"]));
        let stepping_b = wait_for(&sb, is("stepping_down")).await;
        assert_eq!(stepping_b["reason"], "preempted");
        let resigned_b = wait_for(&sb, is("resigned")).await;
        assert_eq!(resigned_b["cause"], "stepped down: preempted");
        assert_eq!(resigned_b["token"], elected_b["token"]);
        let elected_c = wait_for(&sc, is("elected")).await;
        assert!(stepping_b["mono_ns"].as_u64() <= resigned_b["mono_ns"].as_u64());
        assert!(resigned_b["mono_ns"].as_u64() <= elected_c["mono_ns"].as_u64());
        for (stop, task) in [(stop_c, c), (stop_b, b)] {
            stop.cancel();
            task.await.unwrap().unwrap();
        }
    }

    #[test]
    fn priorities_out_of_range_are_refused_before_connecting() {
        for bad in ["1001", "-1001"] {
            let argv = [
                "tenure",
                "campaign",
                "--election",
                "e",
                "--id",
                "a",
                "--priority",
                bad,
            ];
            let Command::Campaign(a) = Cli::parse_from(argv).command else {
                panic!("not a campaign")
            };
            let e = CampaignPlan::new(&a).unwrap_err();
            assert!(e.message().contains("candidate priority"), "{e}");
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_command_runs_only_while_leader_and_is_killed_on_loss() {
        let mem = MemoryBackend::new();
        let backend: tenure::DynBackend = Arc::new(mem.clone());
        let dir = std::env::temp_dir().join(format!("tenure-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("log");
        let script = format!(
            "echo \"$$ $TENURE_TOKEN $TENURE_ELECTION $TENURE_ID\" >> {}; exec sleep 1000",
            log.display()
        );
        let args = plan(&[
            "--election",
            "jobs/cmd",
            "--id",
            "runner-1",
            "--ttl",
            "2",
            "--grace",
            "1",
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let sink = MemorySink::default();
        let stop = CancellationToken::new();
        let task = {
            let (backend, sink, stop) = (backend.clone(), Arc::new(sink.clone()), stop.clone());
            tokio::spawn(async move { run_campaign(backend, &args, sink, stop).await })
        };
        let first = wait_for(&sink, is("elected")).await;
        let read_lines = || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .map(|l| l.split(' ').map(str::to_string).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        };
        for _ in 0..200 {
            if !read_lines().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let lines = read_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        let pid: i32 = lines[0][0].parse().unwrap();
        assert_eq!(lines[0][1], first["token"].as_u64().unwrap().to_string());
        assert_eq!(
            lines[0][2..],
            ["jobs/cmd".to_string(), "runner-1".to_string()]
        );
        assert!(alive(pid));

        // The store expires the session: leadership is lost, the command killed, and the
        // campaign goes on with a new token.
        let id = mem.session_ids().pop().unwrap();
        assert!(mem.expire_session(&id));
        let lost = wait_for(&sink, is("lost")).await;
        assert_eq!(lost["reason"], "session expired");
        for _ in 0..200 {
            if !alive(pid) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!alive(pid), "command survived the loss of leadership");
        let second = wait_for(&sink, |v| {
            v["event"] == "elected" && v["token"] != first["token"]
        })
        .await;
        assert!(second["token"].as_u64() > first["token"].as_u64());
        for _ in 0..200 {
            if read_lines().len() == 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(
            read_lines()[1][1],
            second["token"].as_u64().unwrap().to_string()
        );
        stop.cancel();
        task.await.unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn alive(pid: i32) -> bool {
        // A zombie still answers kill(0); look at /proc for its state.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !stat.contains(") Z "),
            Err(_) => false,
        }
    }
}
