//! The command a leader runs (`tenure campaign -- CMD`, `tenure shards run -- CMD`):
//! started in a process group of its own, SIGKILLed by the kernel if tenure dies, and
//! stopped with SIGTERM to its group, then SIGKILL after a grace period.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use serde_json::{json, Value};
use tenure::{Error, Result};
use tokio::process::{Child, Command};

/// A command line whose program was found, and the time it gets to exit after SIGTERM.
#[derive(Debug, Clone)]
pub struct LeaderCommand {
    argv: Vec<String>,
    grace: Duration,
}

impl LeaderCommand {
    /// `argv` (the program first) with its program looked up now, so that a missing one
    /// is `InvalidArgument` before anything is connected.
    pub fn new(argv: &[String], grace: Duration) -> Result<LeaderCommand> {
        let Some(program) = argv.first() else {
            return Err(Error::invalid("command: none given after --"));
        };
        check_program(program)?;
        Ok(LeaderCommand {
            argv: argv.to_vec(),
            grace,
        })
    }

    /// Start it with `env` added to the environment it inherits.
    pub fn start(&self, env: &[(&str, String)]) -> std::result::Result<Running, String> {
        let (program, args) = match self.argv.split_first() {
            Some(split) => split,
            None => return Err("no command".to_string()),
        };
        let mut cmd = Command::new(program);
        cmd.args(args).process_group(0).kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
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
        let child = cmd
            .spawn()
            .map_err(|e| format!("could not start {program:?}: {e}"))?;
        Ok(Running {
            pid: child.id(),
            child,
            grace: self.grace,
        })
    }
}

/// How a command ended.
#[derive(Debug)]
pub enum Ended {
    /// It exited by itself.
    Exited(ExitStatus),
    /// It was told to stop: SIGTERM to its group, and SIGKILL if it was still there
    /// after the grace period (`killed`). `status` is `None` if it could not be read.
    Stopped {
        /// Its exit status.
        status: Option<ExitStatus>,
        /// Whether it needed SIGKILL.
        killed: bool,
    },
    /// Waiting for it failed.
    Failed(String),
}

impl Ended {
    /// The fields a `command_exited` line gives for this ending: `code` or `signal`,
    /// and whether tenure stopped it (and had to kill it).
    pub fn json_fields(&self) -> Value {
        let status = |s: &ExitStatus| json!({ "code": s.code(), "signal": s.signal() });
        let mut v = match self {
            Ended::Exited(s) => status(s),
            Ended::Stopped {
                status: Some(s), ..
            } => status(s),
            Ended::Stopped { status: None, .. } | Ended::Failed(_) => {
                json!({ "code": null, "signal": null })
            }
        };
        let (stopped, killed) = match self {
            Ended::Stopped { killed, .. } => (true, *killed),
            _ => (false, false),
        };
        v["stopped"] = json!(stopped);
        v["killed"] = json!(killed);
        if let Ended::Failed(e) = self {
            v["error"] = json!(e);
        }
        v
    }
}

/// A started command.
#[derive(Debug)]
pub struct Running {
    child: Child,
    pid: Option<u32>,
    grace: Duration,
}

impl Running {
    /// Its process id (and process group id).
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// Wait until it exits or `stop` completes; in the second case SIGTERM its group,
    /// and SIGKILL the group after the grace period.
    pub async fn until(mut self, stop: impl Future<Output = ()>) -> Ended {
        tokio::select! {
            status = self.child.wait() => {
                return match status {
                    Ok(s) => Ended::Exited(s),
                    Err(e) => Ended::Failed(e.to_string()),
                };
            }
            _ = stop => {}
        }
        if let Some(pid) = self.pid {
            signal_group(pid, libc::SIGTERM);
        }
        match tokio::time::timeout(self.grace, self.child.wait()).await {
            Ok(status) => Ended::Stopped {
                status: status.ok(),
                killed: false,
            },
            Err(_) => {
                tracing::warn!(grace = ?self.grace, "command ignored SIGTERM; sending SIGKILL");
                if let Some(pid) = self.pid {
                    signal_group(pid, libc::SIGKILL);
                }
                let _ = self.child.kill().await;
                Ended::Stopped {
                    status: self.child.wait().await.ok(),
                    killed: true,
                }
            }
        }
    }
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Ended, LeaderCommand};

    fn sh(script: &str, grace: Duration) -> LeaderCommand {
        let argv = ["sh", "-c", script].map(String::from);
        LeaderCommand::new(&argv, grace).unwrap()
    }

    #[test]
    fn a_missing_program_or_none_is_invalid_argument() {
        let e = LeaderCommand::new(&["/nonexistent/prog".into()], Duration::ZERO).unwrap_err();
        assert_eq!(e.kind(), tenure::ErrorKind::InvalidArgument);
        assert!(e
            .to_string()
            .contains("command: \"/nonexistent/prog\" not found"));
        let e = LeaderCommand::new(&[], Duration::ZERO).unwrap_err();
        assert!(e.to_string().contains("command: none given"), "{e}");
    }

    #[tokio::test]
    async fn it_gets_its_environment_and_reports_its_exit() {
        let cmd = sh("exit $X", Duration::from_secs(1));
        let run = cmd.start(&[("X", "3".into())]).unwrap();
        let ended = run.until(std::future::pending()).await;
        assert!(
            matches!(&ended, Ended::Exited(s) if s.code() == Some(3)),
            "{ended:?}"
        );
        let v = ended.json_fields();
        assert_eq!(v["code"], 3);
        assert_eq!(v["stopped"], false);
    }

    #[tokio::test]
    async fn stop_sends_sigterm_then_sigkill_after_the_grace() {
        let polite = sh("exec sleep 100", Duration::from_secs(5));
        let ended = polite.start(&[]).unwrap().until(async {}).await;
        let v = ended.json_fields();
        assert_eq!(
            (
                v["signal"].as_i64(),
                v["killed"].as_bool(),
                v["stopped"].as_bool()
            ),
            (Some(15), Some(false), Some(true))
        );

        let stubborn = sh("trap '' TERM; sleep 100 & wait", Duration::from_millis(300));
        let started = Instant::now();
        // Stopped once the shell has had time to set its trap.
        let settle = tokio::time::sleep(Duration::from_millis(200));
        let ended = stubborn.start(&[]).unwrap().until(settle).await;
        assert!(started.elapsed() >= Duration::from_millis(500));
        let v = ended.json_fields();
        assert_eq!(
            (v["signal"].as_i64(), v["killed"].as_bool()),
            (Some(9), Some(true)),
            "{v}"
        );
    }
}
