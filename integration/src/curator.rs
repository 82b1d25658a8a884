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
use std::time::Duration;

use crate::error::{HarnessError, Result};
use crate::server::{find_java, versioned_jar, JAVA_LIB_DIR};
use crate::CandidateProcess;

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

/// A Curator `LeaderLatch` running in a child JVM (see the [module docs](self)).
pub struct CuratorLatch {
    what: String,
    id: String,
    node: String,
    jvm: CandidateProcess,
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
        let mut args: Vec<String> = ["-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
            .map(String::from)
            .into();
        args.extend(["-cp".into(), curator_classpath()?]);
        args.push(probe_source()?.display().to_string());
        args.extend([connect, path, id].map(String::from));
        let mut latch = CuratorLatch {
            what: format!("Curator latch {id:?} on {path}"),
            id: id.to_string(),
            node: String::new(),
            jvm: CandidateProcess::spawn_with_stdin(&java, &args)?,
        };
        let started = |l: &str| l.starts_with("ready ") || l.starts_with("error ");
        let ready = latch
            .wait_for_line(0, started, CURATOR_START_TIMEOUT)
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

    /// How many stdout lines so far equal `line`.
    pub fn count(&self, line: &str) -> usize {
        self.other_stdout().iter().filter(|l| *l == line).count()
    }

    /// Send `command` and return the rest of the first later line that starts with
    /// `prefix`, with its index. An `error …` line answering it is an error.
    async fn ask(&mut self, command: &str, prefix: &str) -> Result<(usize, String)> {
        let from = self.other_stdout().len();
        self.send_line(command).await?;
        let answer = |l: &str| l.starts_with(prefix) || l.starts_with("error ");
        let (i, line) = self.wait_for_line(from, answer, ANSWER_TIMEOUT).await?;
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
                .wait_for_line(from, |l| l.starts_with("participant "), ANSWER_TIMEOUT)
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
        self.send_line("quit").await?;
        self.jvm.close_stdin();
        match self.jvm.wait_exit(Duration::from_secs(10)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.jvm.kill_group().await;
                Err(e)
            }
        }
    }
}

/// The JVM's process: its stdout lines ([`other_stdout`](CandidateProcess::other_stdout),
/// [`wait_for_line`](CandidateProcess::wait_for_line)), stderr and stdin.
impl std::ops::Deref for CuratorLatch {
    type Target = CandidateProcess;
    fn deref(&self) -> &CandidateProcess {
        &self.jvm
    }
}

impl std::ops::DerefMut for CuratorLatch {
    fn deref_mut(&mut self) -> &mut CandidateProcess {
        &mut self.jvm
    }
}

/// An answer the probe should not have given (an `error …` line, say).
fn protocol_error(what: &str, command: &str, answer: &str) -> HarnessError {
    HarnessError::io(
        format!("{what}: command {command:?}"),
        std::io::Error::new(std::io::ErrorKind::InvalidData, answer.to_string()),
    )
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
