//! `tenure campaign`: campaign, print events, run a command while leader.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tenure::{
    Candidate, DynBackend, ElectionName, Error, LeaderContext, LeaderRunner, Result, Session,
};
use tokio::process::Command;
use tokio_util::sync::CancellationToken;

use crate::args::{seconds, CampaignArgs};
use crate::events::{leadership_event_json, EventSink};

/// Campaign on `backend` until `shutdown` fires, then resign. Events go to `sink`.
pub async fn run_campaign(
    backend: DynBackend,
    args: &CampaignArgs,
    sink: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) -> Result<()> {
    let timing = args.timing.timing()?;
    let election = ElectionName::new(&args.election)?;
    let candidate = Candidate::with_value(&args.id, &args.value)?;
    let grace = seconds("grace", args.grace)?;
    if let Some(program) = args.command.first() {
        check_program(program)?;
    }
    let session = Session::open(backend, timing).await?;
    let mut runner = LeaderRunner::new(session.clone(), election, candidate)
        .task_grace(grace + Duration::from_secs(1));
    let mut events = runner.subscribe();
    let id = args.id.clone();
    let printer = tokio::spawn(async move {
        while let Some(ev) = events.recv().await {
            if let Some(line) = leadership_event_json(&id, &ev) {
                sink.emit(line);
            }
        }
    });
    let command = Arc::new(args.command.clone());
    let id = args.id.clone();
    let result = runner
        .run(shutdown, move |ctx| {
            let command = command.clone();
            let id = id.clone();
            async move {
                if command.is_empty() {
                    ctx.cancelled().await;
                    Ok(())
                } else {
                    run_command(&command, &id, &ctx, grace).await
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

/// Fail early, with `InvalidArgument`, if the command cannot be found.
fn check_program(program: &str) -> Result<()> {
    let found = if program.contains('/') {
        Path::new(program).is_file()
    } else {
        std::env::var_os("PATH")
            .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
            .unwrap_or(false)
    };
    if found {
        Ok(())
    } else {
        Err(Error::invalid(format!("command: {program:?} not found")))
    }
}

/// Run the command in its own process group until it exits or leadership ends; then
/// SIGTERM the group, and SIGKILL it after `grace`.
async fn run_command(
    command: &[String],
    id: &str,
    ctx: &LeaderContext,
    grace: Duration,
) -> std::result::Result<(), String> {
    let Some((program, args)) = command.split_first() else {
        return Ok(());
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("TENURE_TOKEN", ctx.token().get().to_string())
        .env("TENURE_ELECTION", ctx.election().as_str())
        .env("TENURE_ID", id)
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: the closure runs in the forked child before exec and only calls prctl,
    // which is async-signal-safe; it asks the kernel to SIGKILL the command if this
    // process dies (e.g. is SIGKILLed), so a dead supervisor leaves no leader running.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("could not start {program:?}: {e}"))?;
    let pid = child.id();
    tokio::select! {
        status = child.wait() => {
            return match status {
                Ok(s) if s.success() => Ok(()),
                Ok(s) => Err(format!("command exited with {s}")),
                Err(e) => Err(format!("waiting for the command failed: {e}")),
            };
        }
        _ = ctx.cancelled() => {}
    }
    if let Some(pid) = pid {
        signal_group(pid, libc::SIGTERM);
    }
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        tracing::warn!(?grace, "command ignored SIGTERM; sending SIGKILL");
        if let Some(pid) = pid {
            signal_group(pid, libc::SIGKILL);
        }
        let _ = child.kill().await;
    }
    Ok(())
}

fn signal_group(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals the process group we created for the
    // child (process_group(0) makes its pgid equal to its pid); it touches no memory.
    unsafe {
        libc::kill(-pid, signal);
    }
}
