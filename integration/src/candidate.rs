//! Candidate processes (the `tenure` CLI) and the events they print.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use crate::error::{HarnessError, Result};
use crate::os::{monotonic_now_ns, send_signal, signal_group, stop_process};

/// How many stderr lines a candidate keeps.
const STDERR_LINES: usize = 200;

/// How long [`CandidateProcess::terminate`] waits after SIGTERM.
pub const TERMINATE_TIMEOUT: Duration = Duration::from_secs(10);

/// One JSON line printed by a candidate process, or an event the harness
/// added itself (see [`Event::synthetic`]).
///
/// Known kinds are [`Event::ELECTED`], [`Event::LOST`], [`Event::RESIGNED`];
/// any other kind (e.g. `"campaigning"`) is kept as it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The event kind (the `"event"` field).
    #[serde(rename = "event")]
    pub kind: String,
    /// The election name; empty if the line had none.
    #[serde(default)]
    pub election: String,
    /// The candidate id; empty if the line had none.
    #[serde(default)]
    pub id: String,
    /// The fencing token of the tenure the event is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// Why a tenure ended, for `lost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `CLOCK_MONOTONIC` nanoseconds when the event happened.
    pub mono_ns: u64,
    /// True for events the harness recorded itself: [`Event::KILLED`] when
    /// it killed the process and [`Event::EXITED`] when the process's
    /// stdout closed. Never set from a parsed line.
    #[serde(skip)]
    pub synthetic: bool,
    /// Every other field of the line.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Event {
    /// A candidate became leader; carries the token of its tenure.
    pub const ELECTED: &'static str = "elected";
    /// A leader's tenure ended without it asking (e.g. its deadline passed).
    pub const LOST: &'static str = "lost";
    /// A leader gave up its tenure.
    pub const RESIGNED: &'static str = "resigned";
    /// Added by the harness when it SIGKILLed the process.
    pub const KILLED: &'static str = "killed";
    /// Added by the harness when the process's stdout closed.
    pub const EXITED: &'static str = "exited";

    /// An event with the given fields and no extras; for building logs in
    /// tests.
    pub fn new(kind: &str, election: &str, id: &str, token: Option<u64>, mono_ns: u64) -> Self {
        Event {
            kind: kind.to_owned(),
            election: election.to_owned(),
            id: id.to_owned(),
            token,
            reason: None,
            mono_ns,
            synthetic: false,
            extra: serde_json::Map::new(),
        }
    }

    /// Parses one output line; `None` if it is not a JSON object with a
    /// string `"event"` and a numeric `"mono_ns"`.
    pub fn parse_line(line: &str) -> Option<Event> {
        let line = line.trim();
        if !line.starts_with('{') {
            return None;
        }
        serde_json::from_str(line).ok()
    }

    /// Whether the event is of `kind`.
    pub fn is(&self, kind: &str) -> bool {
        self.kind == kind
    }

    /// Whether it starts or ends a tenure: `elected`, `lost`, `resigned`, `killed` or
    /// `exited`.
    pub fn marks_tenure(&self) -> bool {
        [
            Self::ELECTED,
            Self::LOST,
            Self::RESIGNED,
            Self::KILLED,
            Self::EXITED,
        ]
        .contains(&self.kind.as_str())
    }

    fn harness(kind: &str, mono_ns: u64) -> Self {
        Event {
            synthetic: true,
            ..Event::new(kind, "", "", None, mono_ns)
        }
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.mono_ns, self.kind, self.election)?;
        if !self.id.is_empty() {
            write!(f, " id={}", self.id)?;
        }
        if let Some(token) = self.token {
            write!(f, " token={token}")?;
        }
        if let Some(reason) = &self.reason {
            write!(f, " reason={reason:?}")?;
        }
        if self.synthetic {
            write!(f, " (harness)")?;
        }
        Ok(())
    }
}

/// What the background readers collected.
#[derive(Debug, Default)]
struct Log {
    events: Vec<Event>,
    other_stdout: Vec<String>,
    stderr: VecDeque<String>,
    stdout_closed: bool,
}

#[derive(Debug)]
struct Shared {
    log: Mutex<Log>,
    version: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, change: impl FnOnce(&mut Log)) {
        change(&mut self.lock());
        self.version.send_modify(|v| *v += 1);
    }
}

/// A child process campaigning in an election — normally the `tenure` CLI,
/// `tenure campaign --backend URL --election NAME --id ID --ttl SECS [-- CMD…]`.
///
/// Its stdout is read in the background: JSON event lines go to
/// [`events`](Self::events), other lines to
/// [`other_stdout`](Self::other_stdout); the last lines of stderr are kept
/// for error messages. The process runs in its own process group; dropping
/// the handle SIGKILLs the whole group, so commands it started do not
/// outlive the test.
#[derive(Debug)]
pub struct CandidateProcess {
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    pgid: Option<u32>,
    shared: Arc<Shared>,
}

impl CandidateProcess {
    /// Starts `program` with `args` and extra environment variables `env`
    /// (on top of the inherited environment). Must be called inside a Tokio
    /// runtime.
    pub fn spawn<I, K, V>(program: &Path, args: &[String], env: I) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        Self::start(program, args, env, false)
    }

    /// Like [`spawn`](Self::spawn) without extra environment, with a pipe to its stdin
    /// for [`send_line`](Self::send_line) (for a probe that takes commands).
    pub fn spawn_with_stdin(program: &Path, args: &[String]) -> Result<Self> {
        Self::start(program, args, [("", ""); 0], true)
    }

    fn start<I, K, V>(program: &Path, args: &[String], env: I, stdin: bool) -> Result<Self>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<OsStr>,
        V: AsRef<OsStr>,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(HarnessError::NoRuntime("CandidateProcess::spawn"));
        }
        let label = label(program, args);
        let mut child = Command::new(program)
            .args(args)
            .envs(env)
            .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io(format!("starting {label}"), e))?;
        let pgid = child.id();
        let label = match pgid {
            Some(pid) => format!("{label} (pid {pid})"),
            None => label,
        };
        let (version, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            log: Mutex::new(Log::default()),
            version,
        });
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_stdout(stdout, Arc::clone(&shared)));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(read_stderr(stderr, Arc::clone(&shared)));
        }
        Ok(CandidateProcess {
            label,
            stdin: child.stdin.take(),
            child,
            pgid,
            shared,
        })
    }

    /// A short description: program, `--id` value and pid.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The process id, while the process has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// A snapshot of the events so far, in the order they were read.
    pub fn events(&self) -> Vec<Event> {
        self.shared.lock().events.clone()
    }

    /// Whether it leads now: its last `elected` is not followed by `lost`, `resigned`,
    /// `killed` or `exited`.
    pub fn leads(&self) -> bool {
        let events = self.events();
        let last = events.iter().rev().find(|e| e.marks_tenure());
        last.is_some_and(|e| e.is(Event::ELECTED))
    }

    /// Stdout lines that were not events.
    pub fn other_stdout(&self) -> Vec<String> {
        self.shared.lock().other_stdout.clone()
    }

    /// The last lines (at most 200) the process wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let log = self.shared.lock();
        log.stderr.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Waits until an event for which `pred` is true has been read (events
    /// read before the call count too) and returns the first such event.
    ///
    /// Fails with [`HarnessError::EventTimeout`] after `timeout`, or with
    /// [`HarnessError::EventStreamEnded`] once stdout has closed without one.
    pub async fn wait_for_event(
        &self,
        pred: impl Fn(&Event) -> bool,
        timeout: Duration,
    ) -> Result<Event> {
        let find = |log: &Log| log.events.iter().find(|e| pred(e)).cloned();
        self.wait_until(find, timeout, |log| render(&log.events))
            .await
    }

    /// Waits until a stdout line that is not an event, at index `from` or later of
    /// [`other_stdout`](Self::other_stdout), `matches`; returns its index and text.
    /// Fails as [`wait_for_event`](Self::wait_for_event) does.
    pub async fn wait_for_line(
        &self,
        from: usize,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<(usize, String)> {
        let find = |log: &Log| {
            let mut lines = log.other_stdout.iter().cloned().enumerate().skip(from);
            lines.find(|(_, l)| matches(l))
        };
        self.wait_until(find, timeout, |log| log.other_stdout.join("\n"))
            .await
    }

    /// What `find` finds in the log, once it does; `seen` renders the log for errors.
    async fn wait_until<T>(
        &self,
        find: impl Fn(&Log) -> Option<T>,
        timeout: Duration,
        seen: impl Fn(&Log) -> String,
    ) -> Result<T> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut version = self.shared.version.subscribe();
        loop {
            version.borrow_and_update();
            {
                let log = self.shared.lock();
                if let Some(found) = find(&log) {
                    return Ok(found);
                }
                if log.stdout_closed {
                    return Err(HarnessError::EventStreamEnded {
                        what: self.label.clone(),
                        events: seen(&log),
                        stderr_tail: log.stderr.iter().cloned().collect::<Vec<_>>().join("\n"),
                    });
                }
            }
            if tokio::time::timeout_at(deadline, version.changed())
                .await
                .is_err()
            {
                return Err(HarnessError::EventTimeout {
                    what: self.label.clone(),
                    timeout,
                    events: seen(&self.shared.lock()),
                });
            }
        }
    }

    /// Writes `line` and a newline to its stdin (see
    /// [`spawn_with_stdin`](Self::spawn_with_stdin)).
    pub async fn send_line(&mut self, line: &str) -> Result<()> {
        let what = format!("sending {line:?} to {}", self.label);
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(HarnessError::not_running(what));
        };
        let sent = stdin.write_all(format!("{line}\n").as_bytes()).await;
        sent.and(stdin.flush().await)
            .map_err(|e| HarnessError::io(what, e))
    }

    /// Closes its stdin (the process reads end of input).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits for the first event of `kind`; see
    /// [`wait_for_event`](Self::wait_for_event).
    pub async fn wait_for_kind(&self, kind: &str, timeout: Duration) -> Result<Event> {
        self.wait_for_event(|e| e.is(kind), timeout).await
    }

    /// Freezes the candidate process (SIGSTOP) and returns once it is
    /// stopped. Only the process itself is
    /// stopped: a command it started keeps running, like a workload whose
    /// supervisor hangs.
    pub fn pause(&self) -> Result<()> {
        stop_process(self.running_pid()?, &self.label)
    }

    /// Lets a paused candidate run again (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        send_signal(self.running_pid()?, libc::SIGCONT, &self.label)
    }

    /// Kills the candidate process (SIGKILL), waits until it is gone and
    /// records an [`Event::KILLED`] event stamped when the signal was sent
    /// (before the [`Event::EXITED`] its closing output causes); returns its
    /// `mono_ns`. Commands the
    /// process started keep running (see [`kill_group`](Self::kill_group)).
    pub async fn kill(&mut self) -> Result<u64> {
        let pid = self.running_pid()?;
        let at = monotonic_now_ns();
        send_signal(pid, libc::SIGKILL, &self.label)?;
        self.reap_killed(at).await
    }

    /// Kills the candidate and every process in its process group (SIGKILL),
    /// like [`kill`](Self::kill) otherwise.
    pub async fn kill_group(&mut self) -> Result<u64> {
        self.running_pid()?;
        let at = monotonic_now_ns();
        if let Some(pgid) = self.pgid {
            signal_group(pgid, libc::SIGKILL);
        }
        self.reap_killed(at).await
    }

    /// Wait for the process killed at `at` (stamped before the signal went, so the
    /// kill comes before the end of its output, which the signal causes).
    async fn reap_killed(&mut self, at: u64) -> Result<u64> {
        self.child
            .wait()
            .await
            .map_err(|e| HarnessError::io(format!("waiting for {}", self.label), e))?;
        self.shared
            .update(|log| log.events.push(Event::harness(Event::KILLED, at)));
        Ok(at)
    }

    /// Asks the candidate to stop (SIGTERM, which resumes it first if paused)
    /// and waits up to [`TERMINATE_TIMEOUT`] for it to exit.
    pub async fn terminate(&mut self) -> Result<ExitStatus> {
        self.terminate_within(TERMINATE_TIMEOUT).await
    }

    /// Like [`terminate`](Self::terminate) with a custom wait; if the process
    /// is still there after `timeout`, its group is killed and
    /// [`HarnessError::ExitTimeout`] returned.
    pub async fn terminate_within(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let pid = self.running_pid()?;
        send_signal(pid, libc::SIGTERM, &self.label)?;
        // A stopped process would not act on SIGTERM until continued.
        let _ = send_signal(pid, libc::SIGCONT, &self.label);
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                status.map_err(|e| HarnessError::io(format!("waiting for {}", self.label), e))
            }
            Err(_) => {
                self.kill_group().await?;
                Err(HarnessError::ExitTimeout {
                    what: self.label.clone(),
                    timeout,
                })
            }
        }
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(status) => {
                status.map_err(|e| HarnessError::io(format!("waiting for {}", self.label), e))
            }
            Err(_) => Err(HarnessError::EventTimeout {
                what: format!("{} (waiting for exit)", self.label),
                timeout,
                events: render(&self.events()),
            }),
        }
    }

    /// The exit status if the process has exited, without waiting.
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    fn running_pid(&self) -> Result<u32> {
        self.child
            .id()
            .ok_or_else(|| HarnessError::not_running(&*self.label))
    }
}

impl Drop for CandidateProcess {
    fn drop(&mut self) {
        // The child itself is killed by `kill_on_drop`; this takes the
        // commands it started with it.
        if let Some(pgid) = self.pgid {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

/// A readable name for error messages: the program's file name and the
/// value of `--id` if there is one.
fn label(program: &Path, args: &[String]) -> String {
    let name = program
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| PathBuf::from(program).display().to_string());
    let id = args
        .iter()
        .position(|a| a == "--id")
        .and_then(|i| args.get(i + 1))
        .or_else(|| args.iter().find_map(|a| a.strip_prefix("--id=").map(|_| a)));
    match id {
        Some(id) => format!("{name} --id {}", id.trim_start_matches("--id=")),
        None => name,
    }
}

fn render(events: &[Event]) -> String {
    if events.is_empty() {
        return "(none)".to_owned();
    }
    events
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn read_stdout(stdout: impl AsyncRead + Unpin, shared: Arc<Shared>) {
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        match Event::parse_line(&line) {
            Some(event) => shared.update(|log| log.events.push(event)),
            None => shared.update(|log| log.other_stdout.push(line)),
        }
    }
    let at = monotonic_now_ns();
    shared.update(|log| {
        log.events.push(Event::harness(Event::EXITED, at));
        log.stdout_closed = true;
    });
}

async fn read_stderr(stderr: impl AsyncRead + Unpin, shared: Arc<Shared>) {
    let mut lines = BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        shared.update(|log| {
            if log.stderr.len() == STDERR_LINES {
                log.stderr.pop_front();
            }
            log.stderr.push_back(line);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_lines() {
        let e = Event::parse_line(
            r#"{"event":"elected","election":"e1","id":"c1","token":5,"mono_ns":123456789}"#,
        )
        .unwrap();
        assert_eq!(e, Event::new("elected", "e1", "c1", Some(5), 123456789));
        let e = Event::parse_line(
            r#"{"event":"lost","election":"e1","id":"c1","token":5,"reason":"renew deadline passed","mono_ns":7}"#,
        )
        .unwrap();
        assert_eq!(e.reason.as_deref(), Some("renew deadline passed"));
        let e = Event::parse_line(
            r#"{"event":"campaigning","election":"e1","id":"c1","mono_ns":1,"backend":"etcd"}"#,
        )
        .unwrap();
        assert_eq!(e.kind, "campaigning");
        assert_eq!(e.token, None);
        assert_eq!(e.extra["backend"], "etcd");
        assert!(!e.synthetic);
    }

    #[test]
    fn rejects_lines_that_are_not_events() {
        assert!(Event::parse_line("hello").is_none());
        assert!(Event::parse_line(r#"{"mono_ns":1}"#).is_none());
        assert!(Event::parse_line(r#"{"event":"elected"}"#).is_none());
        assert!(Event::parse_line(r#"{"event":"elected","mono_ns":-1}"#).is_none());
    }

    #[test]
    fn labels_name_the_id() {
        let args: Vec<String> = ["campaign", "--id", "c7"].map(String::from).into();
        assert_eq!(label(Path::new("/x/tenure"), &args), "tenure --id c7");
        let args: Vec<String> = ["campaign", "--id=c8"].map(String::from).into();
        assert_eq!(label(Path::new("/x/tenure"), &args), "tenure --id c8");
        assert_eq!(label(Path::new("sh"), &[]), "sh");
    }
}
