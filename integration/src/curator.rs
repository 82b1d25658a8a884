//! A real Apache Curator `LeaderLatch` in a child JVM, for interop tests of the ZooKeeper
//! backend.
//!
//! [`CuratorLatch::start`] runs `integration/java/LatchProbe.java` with Java's
//! single-file source launcher (no build step) on the Debian jars in `/usr/share/java`
//! (package `libcurator-recipes-java`, which pulls in Curator's framework and client;
//! ZooKeeper, Guava and slf4j come with the `zookeeper` package). The probe prints one
//! line per latch event (`leader`, `notleader`) and answers commands (`status`,
//! `leader`, `participants`, `close`, `quit`); see the Java file for the protocol.
//! The child is killed when the [`CuratorLatch`] is dropped.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use crate::error::{HarnessError, Result};
use crate::server::{find_java, versioned_jar, JAVA_LIB_DIR};

/// The jars of the probe's class path, in order: Curator (recipes, framework, client),
/// the ZooKeeper client and its wire format, Guava, the slf4j API and its no-op
/// binding (so neither Curator nor ZooKeeper logs anything).
const JARS: [(&str, &str); 8] = [
    (
        "curator-recipes.jar",
        "the apt package libcurator-recipes-java",
    ),
    (
        "curator-framework.jar",
        "the apt package libcurator-framework-java",
    ),
    (
        "curator-client.jar",
        "the apt package libcurator-client-java",
    ),
    ("zookeeper.jar", "the apt package libzookeeper-java"),
    ("zookeeper-jute.jar", "the apt package libzookeeper-java"),
    ("guava.jar", "the apt package libguava-java"),
    ("slf4j-api.jar", "the apt package libslf4j-java"),
    ("slf4j-nop.jar", "the apt package libslf4j-java"),
];

/// How long [`CuratorLatch::start`] waits for `ready` (the JVM compiles the probe
/// first, which takes a few seconds on a loaded machine).
pub const CURATOR_START_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a command waits for its answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(15);

/// How many stderr lines are kept for error messages.
const STDERR_LINES: usize = 100;

/// The Curator version the probe runs with, from the versioned name Debian gives
/// `curator-recipes.jar` (`curator-recipes-5.4.0.jar`), if there is one.
pub fn curator_version() -> Option<String> {
    let jar = versioned_jar("curator-recipes-")?;
    let name = jar.file_name()?.to_str()?;
    Some(
        name.strip_prefix("curator-recipes-")?
            .strip_suffix(".jar")?
            .to_string(),
    )
}

/// The class path for the probe, or a [`HarnessError::MissingBinary`] naming the
/// install script and the first missing jar's package.
pub fn curator_classpath() -> Result<String> {
    classpath_in(Path::new(JAVA_LIB_DIR))
}

fn classpath_in(dir: &Path) -> Result<String> {
    let mut parts = Vec::with_capacity(JARS.len());
    for (jar, package) in JARS {
        let path = dir.join(jar);
        if !path.is_file() {
            return Err(HarnessError::MissingBinary {
                what: "Apache Curator (for the LeaderLatch interop test)",
                detail: format!("no {}", path.display()),
                package,
            });
        }
        parts.push(path.display().to_string());
    }
    Ok(parts.join(":"))
}

/// The probe's source file, `integration/java/LatchProbe.java`.
fn probe_source() -> Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("java/LatchProbe.java");
    if path.is_file() {
        Ok(path)
    } else {
        Err(HarnessError::File {
            path,
            reason: "the Curator probe's source is missing".into(),
        })
    }
}

/// What the reader tasks collected.
#[derive(Default)]
struct Output {
    lines: Vec<String>,
    stderr: Vec<String>,
    ended: bool,
}

/// A Curator `LeaderLatch` running in a child JVM (see the [module docs](self)).
pub struct CuratorLatch {
    what: String,
    id: String,
    node: String,
    child: Child,
    stdin: Option<ChildStdin>,
    output: Arc<Mutex<Output>>,
    changed: watch::Receiver<u64>,
}

impl std::fmt::Debug for CuratorLatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CuratorLatch")
            .field("id", &self.id)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl CuratorLatch {
    /// Start a latch on `path` (an absolute ZooKeeper path, no chroot) with participant
    /// id `id`, connected to `connect` (`host:port`), and wait until its node exists
    /// (at most [`CURATOR_START_TIMEOUT`]). A missing `java` or jar is an error naming
    /// `bash scripts/install-test-deps.sh`.
    pub async fn start(connect: &str, path: &str, id: &str) -> Result<Self> {
        let java = find_java("java (needed by the Curator probe)")?;
        let classpath = curator_classpath()?;
        let source = probe_source()?;
        let what = format!("Curator latch {id:?} on {path}");
        let mut child = Command::new(&java)
            .args([
                "-Xmx128m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
                "-cp",
                &classpath,
            ])
            .arg(&source)
            .args([connect, path, id])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| HarnessError::io(format!("spawning {} for {what}", java.display()), e))?;
        let output = Arc::new(Mutex::new(Output::default()));
        let (tx, changed) = watch::channel(0u64);
        let tx = Arc::new(tx);
        if let Some(stdout) = child.stdout.take() {
            tokio::spawn(read_lines(stdout, output.clone(), tx.clone(), false));
        }
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(read_lines(stderr, output.clone(), tx, true));
        }
        let stdin = child.stdin.take();
        let mut latch = CuratorLatch {
            what,
            id: id.to_string(),
            node: String::new(),
            child,
            stdin,
            output,
            changed,
        };
        let ready = latch
            .wait_line(
                0,
                |l| l.starts_with("ready ") || l.starts_with("error "),
                CURATOR_START_TIMEOUT,
            )
            .await?;
        match ready.1.strip_prefix("ready ") {
            Some(node) => latch.node = node.to_string(),
            None => {
                let answer = format!("{}; stderr:\n{}", ready.1, latch.stderr_tail());
                return Err(protocol_error(&latch.what, "start", &answer));
            }
        }
        Ok(latch)
    }

    /// The participant id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The full path of the latch's node (as printed in `ready`).
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Every stdout line so far.
    pub fn lines(&self) -> Vec<String> {
        self.lock().lines.clone()
    }

    /// How many stdout lines so far equal `line`.
    pub fn count(&self, line: &str) -> usize {
        self.lock().lines.iter().filter(|l| *l == line).count()
    }

    /// How many stdout lines so far.
    fn line_count(&self) -> usize {
        self.lock().lines.len()
    }

    /// Wait for the first stdout line at index `from` or later that `matches`; returns
    /// its index and text. Fails on timeout or when the probe ends first.
    pub async fn wait_line(
        &self,
        from: usize,
        matches: impl Fn(&str) -> bool,
        timeout: Duration,
    ) -> Result<(usize, String)> {
        let mut changed = self.changed.clone();
        let search = async {
            loop {
                {
                    let out = self.lock();
                    if let Some((i, l)) = out
                        .lines
                        .iter()
                        .enumerate()
                        .skip(from)
                        .find(|(_, l)| matches(l))
                    {
                        return Ok((i, l.clone()));
                    }
                    if out.ended {
                        return Err(HarnessError::EventStreamEnded {
                            what: self.what.clone(),
                            events: out.lines.join("\n"),
                            stderr_tail: tail(&out.stderr),
                        });
                    }
                }
                if changed.changed().await.is_err() {
                    // Both readers are gone: the next round sees `ended`.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        match tokio::time::timeout(timeout, search).await {
            Ok(r) => r,
            Err(_) => Err(HarnessError::EventTimeout {
                what: self.what.clone(),
                timeout,
                events: self.lines().join("\n"),
            }),
        }
    }

    /// Send one command line.
    pub async fn send(&mut self, command: &str) -> Result<()> {
        let what = self.what.clone();
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| HarnessError::NotRunning { what: what.clone() })?;
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| HarnessError::io(format!("sending {command:?} to {what}"), e))?;
        stdin
            .flush()
            .await
            .map_err(|e| HarnessError::io(format!("sending {command:?} to {what}"), e))
    }

    /// Send `command` and return the rest of the first later line that starts with
    /// `prefix`, with its index. An `error …` line answering it is an error.
    async fn ask(&mut self, command: &str, prefix: &str) -> Result<(usize, String)> {
        let from = self.line_count();
        self.send(command).await?;
        let (i, line) = self
            .wait_line(
                from,
                |l| l.starts_with(prefix) || l.starts_with("error "),
                ANSWER_TIMEOUT,
            )
            .await?;
        match line.strip_prefix(prefix) {
            Some(rest) => Ok((i, rest.to_string())),
            None => Err(protocol_error(&self.what, command, &line)),
        }
    }

    /// `LeaderLatch.hasLeadership()`.
    pub async fn has_leadership(&mut self) -> Result<bool> {
        let (_, v) = self.ask("status", "hasLeadership=").await?;
        Ok(v == "true")
    }

    /// The id of `LeaderLatch.getLeader()`: the lowest node's data as text (empty when
    /// nobody is queued).
    pub async fn leader(&mut self) -> Result<String> {
        Ok(self.ask("leader", "leaderid=").await?.1)
    }

    /// `LeaderLatch.getParticipants()` in queue order: `(is_leader, id)` each.
    pub async fn participants(&mut self) -> Result<Vec<(bool, String)>> {
        let (at, n) = self.ask("participants", "participants=").await?;
        let n: usize = n
            .parse()
            .map_err(|_| protocol_error(&self.what, "participants", &n))?;
        // The probe prints the list in one block right after the count.
        let mut list = Vec::with_capacity(n);
        let mut from = at + 1;
        for _ in 0..n {
            let (i, line) = self
                .wait_line(from, |l| l.starts_with("participant "), ANSWER_TIMEOUT)
                .await?;
            from = i + 1;
            let rest = line.trim_start_matches("participant ");
            let (leader, id) = rest.split_once(' ').unwrap_or((rest, ""));
            list.push((leader == "true", id.to_string()));
        }
        Ok(list)
    }

    /// `LeaderLatch.close(NOTIFY_LEADER)`; returns once it returned (`closed`).
    pub async fn close(&mut self) -> Result<()> {
        self.ask("close", "closed").await.map(|_| ())
    }

    /// Close the client and wait for the JVM to exit (killed after 10 s).
    pub async fn quit(mut self) -> Result<()> {
        self.send("quit").await?;
        self.stdin = None;
        match tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await {
            Ok(r) => r
                .map(|_| ())
                .map_err(|e| HarnessError::io(format!("waiting for {}", self.what), e)),
            Err(_) => {
                let _ = self.child.start_kill();
                Err(HarnessError::ExitTimeout {
                    what: self.what.clone(),
                    timeout: Duration::from_secs(10),
                })
            }
        }
    }

    /// The last lines the JVM wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        tail(&self.lock().stderr)
    }

    fn lock(&self) -> MutexGuard<'_, Output> {
        self.output.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An answer the probe should not have given (an `error …` line, say).
fn protocol_error(what: &str, command: &str, answer: &str) -> HarnessError {
    HarnessError::io(
        format!("{what}: command {command:?}"),
        std::io::Error::new(std::io::ErrorKind::InvalidData, answer.to_string()),
    )
}

fn tail(lines: &[String]) -> String {
    lines.join("\n")
}

/// Collect a pipe's lines into `output`; the stdout reader marks the end.
async fn read_lines(
    pipe: impl AsyncRead + Unpin,
    output: Arc<Mutex<Output>>,
    tx: Arc<watch::Sender<u64>>,
    is_stderr: bool,
) {
    let mut lines = BufReader::new(pipe).lines();
    loop {
        let line = lines.next_line().await;
        let done = {
            let mut out = output.lock().unwrap_or_else(|p| p.into_inner());
            match line {
                Ok(Some(l)) if is_stderr => {
                    out.stderr.push(l);
                    if out.stderr.len() > STDERR_LINES {
                        out.stderr.remove(0);
                    }
                    false
                }
                Ok(Some(l)) => {
                    out.lines.push(l);
                    false
                }
                Ok(None) | Err(_) => {
                    if !is_stderr {
                        out.ended = true;
                    }
                    true
                }
            }
        };
        tx.send_modify(|n| *n += 1);
        if done {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_jar_names_the_install_script_and_its_package() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = classpath_in(dir.path())
            .expect_err("no jars there")
            .to_string();
        assert!(err.contains("bash scripts/install-test-deps.sh"), "{err}");
        assert!(err.contains("libcurator-recipes-java"), "{err}");
        for (jar, _) in JARS {
            std::fs::write(dir.path().join(jar), b"").expect("write jar");
        }
        let classpath = classpath_in(dir.path()).expect("all jars there");
        assert_eq!(classpath.split(':').count(), JARS.len());
        assert!(classpath.contains("curator-recipes.jar"), "{classpath}");
    }
}
