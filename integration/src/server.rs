//! Real stores as child processes: etcd, ZooKeeper, Redis, Azurite and PostgreSQL.

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::error::{HarnessError, Result};
use crate::os::{
    children, file_tail, find_in, find_in_path, free_port, has_ended, is_executable, is_root,
    loopback, send_signal, stop_process, user_ids,
};
use crate::probe;

/// How long a server may take to answer its readiness probe.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the first readiness probe may wait for its answer; each probe
/// that times out doubles it, up to [`MAX_PROBE_TIMEOUT`]. Short at first so
/// a probe caught in a half-started server does not hold up readiness.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// The longest a readiness probe waits (for slow, loaded machines).
const MAX_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Pause between readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How much of a server's log an error message shows.
const LOG_TAIL_BYTES: u64 = 3000;

/// How many times `start` picks new ports when a server could not bind.
const START_ATTEMPTS: usize = 3;

/// How long [`terminate`](StoreServer::terminate) waits after SIGTERM before it kills.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// The stores the harness can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Etcd,
    ZooKeeper,
    Redis,
    Azurite,
    Postgres,
}

/// What to run for one local server, fixed for its lifetime so a restart
/// reuses the same port and data directory.
#[derive(Debug)]
struct Launch {
    program: PathBuf,
    args: Vec<OsString>,
    /// Ready once it accepts connections, not when the store's probe answers.
    listen_only: bool,
    /// The uid and gid to run it as (none: the harness's own).
    user: Option<(u32, u32)>,
    /// It forks helper processes that serve clients too (PostgreSQL's backends): pause
    /// and resume signal them as well, and a kill kills them first.
    forks: bool,
    /// What `terminate` sends to ask it to exit.
    exit_signal: libc::c_int,
}

impl Launch {
    fn of(program: &Path, args: Vec<String>) -> Self {
        Launch {
            program: program.to_path_buf(),
            args: args.into_iter().map(OsString::from).collect(),
            listen_only: false,
            user: None,
            forks: false,
            exit_signal: libc::SIGTERM,
        }
    }
}

impl Kind {
    /// Its name in messages, the variable that names an external server, and what its
    /// endpoint has before and after `host:port`.
    const fn table(self) -> [&'static str; 4] {
        match self {
            Kind::Etcd => ["etcd", "TENURE_TEST_ETCD", "http://", ""],
            Kind::ZooKeeper => ["ZooKeeper", "TENURE_TEST_ZOOKEEPER", "", ""],
            Kind::Redis => ["Redis", "TENURE_TEST_REDIS", "redis://", ""],
            Kind::Azurite => [
                "Azurite",
                "TENURE_TEST_AZURITE",
                "http://",
                "/devstoreaccount1",
            ],
            Kind::Postgres => [
                "PostgreSQL",
                "TENURE_TEST_POSTGRES",
                "postgres://tenure@",
                "/postgres",
            ],
        }
    }

    fn name(self) -> &'static str {
        self.table()[0]
    }

    const fn env_var(self) -> &'static str {
        self.table()[1]
    }

    fn endpoint(self, addr: SocketAddr) -> String {
        let [_, _, before, after] = self.table();
        format!("{before}{addr}{after}")
    }

    async fn probe(self, addr: SocketAddr, timeout: Duration) -> std::result::Result<(), String> {
        match self {
            Kind::Etcd => probe::etcd(addr, timeout).await,
            Kind::ZooKeeper => probe::zookeeper(addr, timeout).await,
            Kind::Redis => probe::redis(addr, timeout).await,
            Kind::Azurite => probe::azurite(addr, timeout).await,
            Kind::Postgres => probe::postgres(addr, timeout).await,
        }
    }

    /// Normalises an external endpoint given in the environment and returns
    /// it with its `host:port`.
    fn external(self, value: &str) -> std::result::Result<(String, String), String> {
        let value = value.trim().trim_end_matches('/');
        if value.is_empty() {
            return Err("it is empty".to_owned());
        }
        let (scheme, rest) = match value.split_once("://") {
            Some((scheme, rest)) => (Some(scheme), rest),
            None => (None, value),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        // Redis and PostgreSQL URLs may carry credentials (and PostgreSQL ones a query
        // right after the port); ZooKeeper connect strings may list several hosts: the
        // first one is probed.
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let host_port = authority.split([',', '?']).next().unwrap_or(authority);
        let host_port = host_port.to_owned();
        if !host_port.contains(':') {
            return Err("it names no port (expected host:port)".to_owned());
        }
        let endpoint = match self {
            Kind::Etcd => format!("{}://{rest}", scheme.unwrap_or("http")),
            Kind::ZooKeeper => {
                if scheme.is_some() {
                    return Err("a ZooKeeper endpoint is host:port, without a scheme".to_owned());
                }
                value.to_owned()
            }
            Kind::Redis => format!("{}://{rest}", scheme.unwrap_or("redis")),
            Kind::Azurite => {
                let path = if path.is_empty() {
                    "/devstoreaccount1"
                } else {
                    path
                };
                format!("{}://{authority}{path}", scheme.unwrap_or("http"))
            }
            Kind::Postgres => format!("{}://{rest}", scheme.unwrap_or("postgres")),
        };
        Ok((endpoint, host_port))
    }

    /// Prepares the data directory and command line of a local server.
    /// `zk_tick` overrides ZooKeeper's `tickTime` (1000 ms).
    fn prepare(
        self,
        root: &Path,
        data_dir: &Path,
        port: u16,
        zk_tick: Option<Duration>,
    ) -> Result<Launch> {
        match self {
            Kind::Etcd => {
                let program = self.program()?;
                let peer = free_port()?;
                let cluster = format!("e1=http://127.0.0.1:{peer}");
                let args = etcd_args(
                    "e1",
                    data_dir,
                    (port, peer),
                    &cluster,
                    (Some(10), "warn"),
                    "",
                );
                Ok(Launch::of(&program, args))
            }
            Kind::ZooKeeper => {
                // 20 s is the default maxSessionTimeout at 1000 ms, kept for a shorter tick.
                let tick = zk_tick.map_or(1000, |t| t.as_millis().max(1));
                let config = format!(
                    "tickTime={tick}\nmaxSessionTimeout=20000\ninitLimit=10\nsyncLimit=5\n"
                );
                zookeeper_launch(root, data_dir, port, &config, "ZooKeeperServerMain")
            }
            Kind::Redis => Ok(Launch::of(&self.program()?, redis_args(port, data_dir))),
            Kind::Azurite => {
                let program = self.program()?;
                let mut args = words(&format!(
                    "--blobHost 127.0.0.1 --blobPort {port} --skipApiVersionCheck --loose \
                     --disableTelemetry --silent --location"
                ));
                args.push(data_dir.display().to_string());
                Ok(Launch::of(&program, args))
            }
            Kind::Postgres => postgres_prepare(root, data_dir, port, None),
        }
    }
}

impl Kind {
    /// The store's program (for ZooKeeper, java).
    fn program(self) -> Result<PathBuf> {
        match self {
            Kind::Etcd => find_etcd("etcd"),
            Kind::ZooKeeper => find_java("java (needed by ZooKeeper)"),
            Kind::Redis => require_program("redis-server", "redis-server", REDIS_PACKAGE),
            Kind::Azurite => find_azurite(),
            Kind::Postgres => postgres_program("postgres"),
        }
    }

    /// Runs the store's program with `args` (its whole command line) for the data
    /// directory `data_dir` in `root`, set up as the store needs it (PostgreSQL's is
    /// initialised first, and the server runs as its own user when the harness is root).
    fn launch_with(self, root: &Path, data_dir: &Path, args: Vec<String>) -> Result<Launch> {
        match self {
            Kind::Postgres => {
                let user = postgres_init(root, data_dir)?;
                Ok(postgres_launch(&self.program()?, args, user))
            }
            _ => Ok(Launch::of(&self.program()?, args)),
        }
    }
}

/// The words of `text` (no word of it may contain white space).
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// An etcd member `name` with its data in `data_dir`, serving clients on loopback port
/// `ports.0` and peers on `ports.1`, in the new cluster `cluster` (`name=peer-url,…`),
/// with a raft heartbeat of `beat_ms` and an election timeout ten times that (`None`:
/// etcd's defaults, 100 ms and 1 s), logging at `log_level`; `extra` are more flags.
fn etcd_args(
    name: &str,
    data_dir: &Path,
    (client, peer): (u16, u16),
    cluster: &str,
    (beat_ms, log_level): (Option<u32>, &str),
    extra: &str,
) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client}");
    let peer = format!("http://127.0.0.1:{peer}");
    let raft = beat_ms.map_or(String::new(), |beat| {
        format!(
            "--heartbeat-interval {beat} --election-timeout {}",
            beat * 10
        )
    });
    let mut args = words(&format!(
        "--name {name} --listen-client-urls {client} --advertise-client-urls {client} \
         --listen-peer-urls {peer} --initial-advertise-peer-urls {peer} \
         --initial-cluster {cluster} --initial-cluster-state new {extra} {raft} \
         --logger zap --log-level {log_level} --data-dir"
    ));
    args.push(data_dir.display().to_string());
    args
}

/// Writes `text` to `path`; `what` names the file in the error.
fn write_file(path: &Path, text: &str, what: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| HarnessError::File {
        path: path.to_path_buf(),
        reason: format!("cannot write {what}: {e}"),
    })
}

/// A ZooKeeper server (`main`, a class of `org.apache.zookeeper.server`) with its data
/// in `data_dir`, serving clients on loopback `port`, configured by `root/zoo.cfg`:
/// `config` (its tick and limits) and the settings every server here shares.
fn zookeeper_launch(
    root: &Path,
    data_dir: &Path,
    port: u16,
    config: &str,
    main: &str,
) -> Result<Launch> {
    let java = Kind::ZooKeeper.program()?;
    let classpath = zookeeper_classpath()?;
    let path = root.join("zoo.cfg");
    let text = format!(
        "{config}dataDir={}\n\
         clientPort={port}\n\
         clientPortAddress=127.0.0.1\n\
         admin.enableServer=false\n\
         4lw.commands.whitelist=*\n",
        data_dir.display()
    );
    write_file(&path, &text, "ZooKeeper config")?;
    let mut args = words(
        "-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dzookeeper.jmx.log4j.disable=true",
    );
    args.extend(["-cp".into(), classpath]);
    args.push(format!("org.apache.zookeeper.server.{main}"));
    args.push(path.display().to_string());
    Ok(Launch::of(&java, args))
}

/// Where `redis-server` comes from.
const REDIS_PACKAGE: &str = "the apt package redis-server";

/// A Redis server on loopback `port` without persistence, its files in `dir`.
fn redis_args(port: u16, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = ["--port", &port.to_string(), "--bind", "127.0.0.1"]
        .map(String::from)
        .to_vec();
    args.extend(["--save", "", "--appendonly", "no", "--dir"].map(String::from));
    args.push(dir.display().to_string());
    args
}

/// Where Debian puts each PostgreSQL version's programs, `<this>/<version>/bin` (not in
/// `PATH`).
const POSTGRES_LIB_DIR: &str = "/usr/lib/postgresql";

/// Where PostgreSQL's programs come from.
const POSTGRES_PACKAGE: &str = "the apt package postgresql (with postgresql-client)";

/// The user a local PostgreSQL runs as when the harness runs as root, which PostgreSQL
/// refuses; Debian's package creates it.
const POSTGRES_SYSTEM_USER: &str = "postgres";

/// The superuser `initdb` creates (trusted, no password), whom the probe names.
const POSTGRES_USER: &str = "tenure";

/// The database of a local server's endpoint.
const POSTGRES_DATABASE: &str = "postgres";

/// How long one `psql` run of [`PostgresServer::sql`] may take.
const SQL_TIMEOUT: Duration = Duration::from_secs(30);

/// A PostgreSQL program (`initdb`, `postgres`, `psql`): from the highest version's
/// directory under [`POSTGRES_LIB_DIR`], else from `PATH`.
fn postgres_program(program: &'static str) -> Result<PathBuf> {
    let lib = Path::new(POSTGRES_LIB_DIR);
    find_postgres(lib, std::env::var_os("PATH"), program)
}

/// `program` from `lib/<version>/bin` of the highest version (`15`, `9.6`) that has it,
/// else from the search path `path`; missing, the error names the package.
fn find_postgres(lib: &Path, path: Option<OsString>, program: &'static str) -> Result<PathBuf> {
    let versioned = std::fs::read_dir(lib).ok().and_then(|entries| {
        entries
            .flatten()
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let version: Vec<u32> = name
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<_>>()?;
                let bin = entry.path().join("bin").join(program);
                is_executable(&bin).then_some((version, bin))
            })
            .max_by(|a, b| a.0.cmp(&b.0))
            .map(|(_, bin)| bin)
    });
    versioned
        .or_else(|| path.and_then(|path| find_in(&path, program)))
        .ok_or_else(|| HarnessError::MissingBinary {
            what: program,
            detail: format!(
                "no {}/<version>/bin/{program} and no `{program}` in PATH",
                lib.display()
            ),
            package: POSTGRES_PACKAGE,
        })
}

/// The uid and gid a local PostgreSQL must run as: none (the harness's own) unless the
/// harness runs as root, then those of [`POSTGRES_SYSTEM_USER`].
fn postgres_user() -> Result<Option<(u32, u32)>> {
    if !is_root() {
        return Ok(None);
    }
    match user_ids(POSTGRES_SYSTEM_USER)? {
        Some(ids) => Ok(Some(ids)),
        None => Err(HarnessError::MissingBinary {
            what: "the `postgres` system user",
            detail: "the harness runs as root, PostgreSQL refuses to, and there is no \
                     `postgres` user to run it as"
                .to_owned(),
            package: POSTGRES_PACKAGE,
        }),
    }
}

/// Sets the permission bits of `path` to `mode`.
fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|e| {
        HarnessError::File {
            path: path.to_path_buf(),
            reason: format!("cannot set its mode to {mode:o}: {e}"),
        }
    })
}

/// Makes `user` (if any) the owner of `path`.
fn give_to(path: &Path, user: Option<(u32, u32)>) -> Result<()> {
    match user {
        None => Ok(()),
        Some((uid, gid)) => {
            std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| HarnessError::File {
                path: path.to_path_buf(),
                reason: format!("cannot give it to uid {uid} (gid {gid}): {e}"),
            })
        }
    }
}

/// Makes `data_dir` (in the temporary directory `root`) a new PostgreSQL cluster with
/// `initdb` (the trusted superuser `tenure`, UTF-8, locale C; no fsync) and a
/// `pg_hba.conf` of [`Hba::default`]. Returns the user the server must run as (none: the
/// harness's own); for another user the data directory becomes theirs and `root`
/// traversable. The data directory ends with mode 0700, as PostgreSQL wants.
fn postgres_init(root: &Path, data_dir: &Path) -> Result<Option<(u32, u32)>> {
    let initdb = postgres_program("initdb")?;
    let user = postgres_user()?;
    if user.is_some() {
        set_mode(root, 0o711)?;
        give_to(data_dir, user)?;
    }
    set_mode(data_dir, 0o700)?;
    let mut command = Command::new(&initdb);
    command
        .arg("-D")
        .arg(data_dir)
        .args(["-U", POSTGRES_USER, "--auth=trust", "-E", "UTF8"])
        .args(["--locale=C", "--no-sync"])
        .current_dir(root)
        .stdin(Stdio::null());
    if let Some((uid, gid)) = user {
        command.uid(uid).gid(gid);
    }
    let doing = format!(
        "initialising {} with {}",
        data_dir.display(),
        initdb.display()
    );
    let out = command
        .output()
        .map_err(|e| HarnessError::io(doing.clone(), e))?;
    if !out.status.success() {
        let why = format!(
            "{}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return Err(HarnessError::failed(doing, why));
    }
    let hba = data_dir.join("pg_hba.conf");
    write_file(&hba, &Hba::default().text(), "pg_hba.conf")?;
    Ok(user)
}

/// A local PostgreSQL on loopback `port` with its cluster in `data_dir` (made here with
/// [`postgres_init`]) and, with `tls` (certificate and key, PEM), TLS on.
fn postgres_prepare(
    root: &Path,
    data_dir: &Path,
    port: u16,
    tls: Option<(&str, &str)>,
) -> Result<Launch> {
    let program = Kind::Postgres.program()?;
    let user = postgres_init(root, data_dir)?;
    let dir = data_dir.display();
    let mut args = vec![
        "-D".to_owned(),
        dir.to_string(),
        "-p".to_owned(),
        port.to_string(),
    ];
    for setting in [
        "listen_addresses=127.0.0.1".to_owned(),
        // The harness's own way in (psql), which pg_hba.conf always trusts.
        format!("unix_socket_directories={dir}"),
        // Commits are still written to the OS before they return, so a killed server
        // keeps them (fencing tokens must survive restarts); only a crash of the machine
        // could lose them.
        "fsync=off".to_owned(),
        "full_page_writes=off".to_owned(),
        "max_connections=200".to_owned(),
        "shared_buffers=32MB".to_owned(),
    ] {
        args.extend(["-c".to_owned(), setting]);
    }
    if let Some((cert_pem, key_pem)) = tls {
        let (cert, key) = (data_dir.join("server.crt"), data_dir.join("server.key"));
        write_file(&cert, cert_pem, "the server certificate")?;
        give_to(&cert, user)?;
        write_file(&key, key_pem, "the server key")?;
        set_mode(&key, 0o600)?;
        give_to(&key, user)?;
        for setting in [
            "ssl=on".to_owned(),
            format!("ssl_cert_file={}", cert.display()),
            format!("ssl_key_file={}", key.display()),
        ] {
            args.extend(["-c".to_owned(), setting]);
        }
    }
    Ok(postgres_launch(&program, args, user))
}

/// PostgreSQL's `program` with `args`, run as `user`: it forks a backend per
/// connection, and SIGINT is its fast shutdown (SIGTERM would wait for every client to
/// leave).
fn postgres_launch(program: &Path, args: Vec<String>, user: Option<(u32, u32)>) -> Launch {
    Launch {
        user,
        forks: true,
        exit_signal: libc::SIGINT,
        ..Launch::of(program, args)
    }
}

/// What a local PostgreSQL's `pg_hba.conf` lets in over TCP (from 127.0.0.1): plain and
/// TLS connections or TLS only, trusted or with a SCRAM password. The Unix socket in
/// the data directory (the harness's own way in) stays trusted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Hba {
    tls_only: bool,
    password: bool,
}

impl Hba {
    /// The file.
    fn text(self) -> String {
        let kind = if self.tls_only { "hostssl" } else { "host" };
        let method = if self.password {
            "scram-sha-256"
        } else {
            "trust"
        };
        format!(
            "# Written by the tenure test harness.\n\
             local all all trust\n\
             {kind} all all 127.0.0.1/32 {method}\n"
        )
    }

    /// What a file written by [`text`](Self::text) says.
    fn parse(text: &str) -> Self {
        let tcp = text.lines().find(|line| line.starts_with("host"));
        Hba {
            tls_only: tcp.is_some_and(|line| line.starts_with("hostssl ")),
            password: tcp.is_some_and(|line| line.ends_with(" scram-sha-256")),
        }
    }

    /// Whether the server's `answer` to a plain (non-TLS) startup as `tenure` shows these
    /// rules in force.
    fn in_force(self, answer: &probe::PostgresAnswer) -> bool {
        match answer {
            probe::PostgresAnswer::Error { code, .. } => self.tls_only && code == "28000",
            probe::PostgresAnswer::Authentication(code) => {
                !self.tls_only && (*code == probe::POSTGRES_AUTH_OK) != self.password
            }
        }
    }
}

/// `text` as an SQL string literal.
fn sql_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `name` as an SQL identifier.
fn sql_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn require_program(program: &str, what: &'static str, package: &'static str) -> Result<PathBuf> {
    find_in_path(program).ok_or_else(|| HarnessError::MissingBinary {
        what,
        detail: format!("no `{program}` in PATH"),
        package,
    })
}

pub(crate) fn find_java(what: &'static str) -> Result<PathBuf> {
    if let Some(home) = std::env::var_os("JAVA_HOME") {
        let java = Path::new(&home).join("bin/java");
        if is_executable(&java) {
            return Ok(java);
        }
    }
    require_program(
        "java",
        what,
        "the apt package zookeeper, which pulls in a Java runtime",
    )
}

/// Where Debian puts Java libraries.
pub(crate) const JAVA_LIB_DIR: &str = "/usr/share/java";

/// The jar `<prefix><version>.jar` in [`JAVA_LIB_DIR`] with the highest version (one
/// that starts with a digit), if any.
pub(crate) fn versioned_jar(prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(JAVA_LIB_DIR)
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix(prefix))
                .and_then(|rest| rest.strip_suffix(".jar"))
                .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect();
    found.sort();
    found.pop()
}

/// The class path for a standalone ZooKeeper server: the ZooKeeper jar (whose
/// manifest names its own dependencies), its jute and slf4j API jars when they
/// exist as separate files, and one slf4j binding so its log reaches stderr.
fn zookeeper_classpath() -> Result<String> {
    let dir = Path::new(JAVA_LIB_DIR);
    let existing = |name: &str| {
        let path = dir.join(name);
        path.is_file().then_some(path)
    };
    let server = existing("zookeeper.jar")
        .or_else(|| versioned_jar("zookeeper-"))
        .ok_or_else(|| HarnessError::MissingBinary {
            what: "ZooKeeper",
            detail: format!("no zookeeper.jar in {JAVA_LIB_DIR}"),
            package: "the apt package zookeeper",
        })?;
    let mut parts = vec![server];
    parts.extend(existing("zookeeper-jute.jar").or_else(|| versioned_jar("zookeeper-jute-")));
    parts.extend(existing("slf4j-api.jar").or_else(|| versioned_jar("slf4j-api-")));
    parts.extend(
        existing("slf4j-simple.jar")
            .or_else(|| versioned_jar("slf4j-simple-"))
            .or_else(|| existing("slf4j-nop.jar")),
    );
    let joined: Vec<String> = parts.iter().map(|p| p.display().to_string()).collect();
    Ok(joined.join(":"))
}

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// Where `etcd` and `etcdctl` come from.
const ETCD_PACKAGE: &str =
    "etcd 3.5 in .tools/etcd, from Debian trixie's etcd-server and etcd-client";

/// `program` (`etcd` or `etcdctl`) from `.tools/etcd/bin` under the workspace root,
/// else from `PATH`.
fn find_etcd(program: &'static str) -> Result<PathBuf> {
    local_or_in_path(
        workspace_root().join(".tools/etcd/bin").join(program),
        std::env::var_os("PATH"),
        program,
        ETCD_PACKAGE,
    )
}

/// The `etcdctl` the harness runs (from `.tools/etcd/bin` under the workspace root, else
/// from `PATH`), for tests that drive it themselves (`etcdctl elect`); missing, the error
/// names `bash scripts/install-test-deps.sh`.
pub fn etcdctl_program() -> Result<PathBuf> {
    find_etcd("etcdctl")
}

/// `azurite-blob` from `.tools/azurite` under the workspace root, else from
/// `PATH`.
fn find_azurite() -> Result<PathBuf> {
    local_or_in_path(
        workspace_root().join(".tools/azurite/node_modules/.bin/azurite-blob"),
        std::env::var_os("PATH"),
        "azurite-blob",
        "the npm package azurite@3 in .tools/azurite",
    )
}

/// A tool the install script puts under the workspace (`own`) if it is there, else
/// `program` from the search path `path`; missing, it names `package`.
fn local_or_in_path(
    own: PathBuf,
    path: Option<OsString>,
    program: &'static str,
    package: &'static str,
) -> Result<PathBuf> {
    if is_executable(&own) {
        return Ok(own);
    }
    path.and_then(|path| find_in(&path, program))
        .ok_or_else(|| HarnessError::MissingBinary {
            what: program,
            detail: format!("no {} and no `{program}` in PATH", own.display()),
            package,
        })
}

/// Whether a server's log says it could not bind its port.
fn port_clash(log: &str) -> bool {
    ["address already in use", "EADDRINUSE", "BindException"]
        .iter()
        .any(|needle| {
            log.to_ascii_lowercase()
                .contains(&needle.to_ascii_lowercase())
        })
}

/// A server process started by the harness.
#[derive(Debug)]
struct Local {
    launch: Launch,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
    started: Instant,
    startup: Duration,
    /// Kept last so the directory is removed after the process is gone.
    root: TempDir,
}

impl Local {
    /// A server that is not running yet: `launch` in `root`, its data in `data_dir`,
    /// its output in `root/server.log`.
    fn new(launch: Launch, data_dir: PathBuf, root: TempDir) -> Self {
        Local {
            launch,
            data_dir,
            log_path: root.path().join("server.log"),
            child: None,
            started: Instant::now(),
            startup: Duration::ZERO,
            root,
        }
    }

    /// Spawns the process and waits until it answers its probe.
    async fn launch(&mut self, kind: Kind, addr: SocketAddr) -> Result<()> {
        self.spawn(kind)?;
        self.wait_ready(kind, addr).await
    }

    /// Starts the process without waiting for it.
    fn spawn(&mut self, kind: Kind) -> Result<()> {
        let spawn = || {
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log_path)?;
            let mut command = Command::new(&self.launch.program);
            command
                .args(&self.launch.args)
                .current_dir(self.root.path())
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            if let Some((uid, gid)) = self.launch.user {
                command.uid(uid).gid(gid);
            }
            command.spawn()
        };
        let (name, program) = (kind.name(), self.launch.program.display());
        let doing = format!(
            "starting {name} ({program}, its log in {})",
            self.log_path.display()
        );
        self.child = Some(spawn().map_err(|e| HarnessError::io(doing, e))?);
        self.started = Instant::now();
        Ok(())
    }

    /// Waits until the spawned process answers its probe (at most [`READY_TIMEOUT`]).
    async fn wait_ready(&mut self, kind: Kind, addr: SocketAddr) -> Result<()> {
        let started = self.started;
        let mut timeout = PROBE_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(HarnessError::ExitedEarly {
                        server: kind.name(),
                        status: status.to_string(),
                        log_tail: self.log_tail(),
                    });
                }
            }
            let probe = if self.launch.listen_only {
                let connected = tokio::net::TcpStream::connect(addr).await;
                connected.map(drop).map_err(|e| e.to_string())
            } else {
                kind.probe(addr, timeout).await
            };
            let last_probe = match probe {
                Ok(()) => {
                    self.startup = started.elapsed();
                    return Ok(());
                }
                Err(why) => {
                    if why.starts_with(probe::NO_ANSWER) {
                        timeout = (timeout * 2).min(MAX_PROBE_TIMEOUT);
                    }
                    why
                }
            };
            if started.elapsed() >= READY_TIMEOUT {
                self.stop().await;
                return Err(HarnessError::NotReady {
                    server: kind.name(),
                    addr,
                    timeout: READY_TIMEOUT,
                    last_probe,
                    log_tail: self.log_tail(),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// SIGKILLs the process (if running; its helpers first) and reaps it without
    /// blocking the runtime, then waits (up to 5 s) until its helpers are gone too.
    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let helpers = self.kill_helpers(child.id());
            let _ = child.kill();
            let mut reaped = false;
            for _ in 0..500 {
                if !matches!(child.try_wait(), Ok(None)) {
                    reaped = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if !reaped {
                // Still not reaped after 2.5 s: wait for it on a blocking thread.
                let _ = tokio::task::spawn_blocking(move || child.wait()).await;
            }
            // A PostgreSQL backend that lives on keeps the old shared memory attached,
            // and a new postmaster refuses to start while it does.
            for _ in 0..1000 {
                if helpers.iter().all(|&helper| has_ended(helper)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// For a server that forks helpers: freezes the server `pid` (so that it starts no
    /// more), SIGKILLs its children and returns their pids. Nothing for other servers.
    fn kill_helpers(&self, pid: u32) -> Vec<u32> {
        if !self.launch.forks {
            return Vec::new();
        }
        let _ = stop_process(pid, "server");
        let helpers = children(pid);
        for &helper in &helpers {
            let _ = send_signal(helper, libc::SIGKILL, "server helper");
        }
        helpers
    }

    /// SIGSTOPs the process (and its helpers) and returns once all are stopped.
    fn pause(&self, kind: Kind) -> Result<()> {
        let pid = self.pid(kind)?;
        stop_process(pid, kind.name())?;
        if self.launch.forks {
            for helper in children(pid) {
                match stop_process(helper, kind.name()) {
                    Ok(()) | Err(HarnessError::NotRunning { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// SIGCONTs the process (and its helpers).
    fn resume(&self, kind: Kind) -> Result<()> {
        let pid = self.pid(kind)?;
        if self.launch.forks {
            for helper in children(pid) {
                let _ = send_signal(helper, libc::SIGCONT, kind.name());
            }
        }
        send_signal(pid, libc::SIGCONT, kind.name())
    }

    /// Asks the process to exit (SIGTERM, or the server's own exit signal), waits up to
    /// `grace` for it, and SIGKILLs it if it is still running then.
    async fn terminate(&mut self, grace: Duration) {
        let signal = self.launch.exit_signal;
        if let Some(child) = self.child.as_mut() {
            if send_signal(child.id(), signal, "server").is_ok() {
                let started = Instant::now();
                while started.elapsed() < grace {
                    if !matches!(child.try_wait(), Ok(None)) {
                        self.child = None;
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        self.stop().await;
    }

    fn pid(&self, kind: Kind) -> Result<u32> {
        self.child
            .as_ref()
            .map(Child::id)
            .ok_or_else(|| HarnessError::not_running(format!("the {} server", kind.name())))
    }

    fn log_tail(&self) -> String {
        file_tail(&self.log_path, LOG_TAIL_BYTES)
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.kill_helpers(child.id());
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One store the harness runs as a child process on a free loopback port with a
/// temporary data directory (killed, and the directory removed, on drop), or the
/// external one its environment variable names: where it listens and the faults on
/// its process. [`EtcdServer`], [`ZooKeeperServer`], [`RedisServer`] and
/// [`AzuriteServer`] deref to it.
#[derive(Debug)]
pub struct StoreServer {
    endpoint: String,
    addr: SocketAddr,
    /// The local process as the one member; none for an external server.
    members: Members,
}

impl StoreServer {
    /// A local server of `kind`, or the external one its variable names (after checking
    /// that it answers; the faults then return [`HarnessError::ExternalServer`]). A
    /// missing program is [`HarnessError::MissingBinary`], never skipped.
    async fn start(kind: Kind) -> Result<Self> {
        match std::env::var(kind.env_var()) {
            Ok(value) if !value.trim().is_empty() => Self::external(kind, &value).await,
            _ => Self::local(kind, |root, dir, port| kind.prepare(root, dir, port, None)).await,
        }
    }

    async fn external(kind: Kind, value: &str) -> Result<Self> {
        let bad = |reason: String| HarnessError::BadEnvironment {
            variable: kind.env_var(),
            value: value.to_owned(),
            reason,
        };
        let (endpoint, host_port) = kind.external(value).map_err(bad)?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(host_port.as_str())
            .await
            .map_err(|e| bad(format!("cannot resolve {host_port}: {e}")))?
            .collect();
        let addr = addrs
            .iter()
            .find(|a| a.is_ipv4())
            .or_else(|| addrs.first())
            .copied()
            .ok_or_else(|| bad(format!("{host_port} resolves to no address")))?;
        let probe = || kind.probe(addr, MAX_PROBE_TIMEOUT);
        let ready = retry(READY_TIMEOUT, Duration::from_millis(200), probe).await;
        ready.map_err(|last_probe| HarnessError::NotReady {
            server: kind.name(),
            addr,
            timeout: READY_TIMEOUT,
            last_probe,
            log_tail: format!("(external server from {}; no log)", kind.env_var()),
        })?;
        let members = Members::ready(kind, Vec::new()).await?;
        Ok(StoreServer {
            endpoint,
            addr,
            members,
        })
    }

    /// A local server of `kind` on a free port, as `prepare(root, data_dir, port)` says
    /// (trying new ports if it could not bind).
    async fn local(
        kind: Kind,
        prepare: impl Fn(&Path, &Path, u16) -> Result<Launch>,
    ) -> Result<Self> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (root, data_dir) =
                temp_root(&format!("tenure-{}-", kind.name().to_ascii_lowercase()))?;
            let port = free_port()?;
            let addr = loopback(port);
            let launch = prepare(root.path(), &data_dir, port)?;
            let mut local = Local::new(launch, data_dir, root);
            match local.launch(kind, addr).await {
                Ok(()) => {
                    return Ok(StoreServer {
                        endpoint: kind.endpoint(addr),
                        addr,
                        members: Members::ready(kind, vec![(addr, local)]).await?,
                    })
                }
                Err(HarnessError::ExitedEarly { ref log_tail, .. })
                    if attempt < START_ATTEMPTS && port_clash(log_tail) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The local process as member 0, or the error of an external server.
    fn running(&self) -> Result<&Members> {
        match self.is_external() {
            true => Err(HarnessError::ExternalServer {
                server: self.name(),
                endpoint: self.endpoint.clone(),
                variable: self.env_var(),
            }),
            false => Ok(&self.members),
        }
    }

    fn local_mut(&mut self) -> Result<&mut Members> {
        self.running()?;
        Ok(&mut self.members)
    }

    /// The one-member [`Members`] of a local server (none for an external one).
    pub(crate) fn members(&mut self) -> &mut Members {
        &mut self.members
    }

    /// The store's client endpoint, in the store's own form (see each handle).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The endpoint with `addr` (e.g. a proxy's) in place of the server's address.
    pub fn endpoint_at(&self, addr: impl std::fmt::Display) -> String {
        let at = addr.to_string();
        self.endpoint.replacen(&self.addr.to_string(), &at, 1)
    }

    /// The socket address the server listens on (what a [`TcpProxy`](crate::TcpProxy)
    /// forwards to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The store's name, for messages.
    pub fn name(&self) -> &'static str {
        self.members.kind.name()
    }

    /// The environment variable that names an external server instead.
    pub fn env_var(&self) -> &'static str {
        self.members.kind.env_var()
    }

    /// Whether this handle points at an external server (faults on the process are
    /// then impossible).
    pub fn is_external(&self) -> bool {
        self.members.is_empty()
    }

    /// For a test that needs its own server (it stops, restarts or reconfigures it,
    /// or counts all its commands; `why` says which): panics, naming the variable to
    /// unset, when the server is external. Such a test never passes without running.
    pub fn require_local(&self, why: &str) {
        assert!(
            !self.is_external(),
            "{}: {why}, so this test needs a local server: unset {}",
            self.name(),
            self.env_var()
        );
    }

    /// The data directory of a local server (kept across restarts, removed on drop).
    pub fn data_dir(&self) -> Option<&Path> {
        self.members.list.first().map(|(_, l)| l.data_dir.as_path())
    }

    /// How long the last (re)start took until the server answered.
    pub fn startup_time(&self) -> Option<Duration> {
        self.members.list.first().map(|(_, l)| l.startup)
    }

    /// The end of the server's combined stdout/stderr log.
    pub fn log_tail(&self) -> String {
        match self.is_external() {
            true => format!("(external server from {}; no log)", self.env_var()),
            false => self.members.log_tail(0),
        }
    }

    /// The process id while a local server process is running.
    pub fn pid(&self) -> Option<u32> {
        self.members.pid(0).ok()
    }

    /// Freezes the server process (SIGSTOP) and returns once all its threads are
    /// stopped: its port stays open and the kernel accepts connections, but nothing
    /// answers.
    pub fn pause(&self) -> Result<()> {
        self.running()?.pause(0)
    }

    /// Lets a paused server process run again (SIGCONT).
    pub fn resume(&self) -> Result<()> {
        self.running()?.resume(0)
    }

    /// Kills the server process (SIGKILL); it stays down until
    /// [`restart`](Self::restart).
    pub async fn kill(&mut self) -> Result<()> {
        self.local_mut()?.kill(0).await
    }

    /// Stops the server process the orderly way: SIGTERM, then up to
    /// `TERMINATE_GRACE` for it to save its state and exit, then SIGKILL. It stays
    /// down until [`restart`](Self::restart).
    pub async fn terminate(&mut self) -> Result<()> {
        self.local_mut()?.terminate(0).await
    }

    /// Kills the server process (if running) and starts it again on the same port
    /// with the same data directory, once it answers.
    pub async fn restart(&mut self) -> Result<()> {
        self.local_mut()?.restart(0).await
    }
}

/// Defines a public handle of one store: a [`StoreServer`] of `$kind` it derefs to.
macro_rules! server_handle {
    ($(#[$meta:meta])* $name:ident, $kind:expr) => {
        $(#[$meta])*
        ///
        /// Dropping it kills the process and removes its data directory.
        #[derive(Debug)]
        pub struct $name(pub(crate) StoreServer);

        impl $name {
            /// The environment variable that, when set, names an external server to
            /// use instead of starting one.
            pub const ENV: &'static str = $kind.env_var();

            /// Starts a fresh server (or uses the external one [`Self::ENV`] names) and
            /// waits (at most [`READY_TIMEOUT`]) until it answers; see [`StoreServer`].
            pub async fn start() -> Result<Self> {
                StoreServer::start($kind).await.map(Self)
            }

            /// Starts the store's program with the arguments `args(data_dir, port)`
            /// (its whole configuration, on a free loopback `port`), ready once it
            /// accepts connections: for a server the readiness probe cannot speak to,
            /// such as one serving TLS only. Never external. (For PostgreSQL,
            /// `data_dir` is made a cluster with `initdb` first, and the server runs as
            /// its own user when the harness is root.)
            pub async fn start_with_args(args: impl Fn(&Path, u16) -> Vec<String>) -> Result<Self> {
                let kind = $kind;
                let prepare = |root: &Path, dir: &Path, port| {
                    let launch = kind.launch_with(root, dir, args(dir, port))?;
                    Ok(Launch { listen_only: true, ..launch })
                };
                StoreServer::local(kind, prepare).await.map(Self)
            }
        }

        impl std::ops::Deref for $name {
            type Target = StoreServer;
            fn deref(&self) -> &StoreServer {
                &self.0
            }
        }

        impl std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut StoreServer {
                &mut self.0
            }
        }

        impl From<$name> for StoreServer {
            fn from(server: $name) -> StoreServer {
                server.0
            }
        }
    };
}

server_handle! {
    /// A single-member etcd server (fast raft timings: 10 ms heartbeat, 100 ms
    /// election timeout; one member elects only itself, so they shorten its start, not a
    /// failover: the store-failover tests use an [`EtcdCluster`] at production timing,
    /// see [`ClusterTiming`]), ready once `GET /health` reports healthy. Its endpoint is
    /// the client URL, `http://127.0.0.1:PORT`.
    EtcdServer, Kind::Etcd
}

impl EtcdServer {
    /// Adds the user `root` with `password` and turns authentication on (with
    /// `etcdctl`): from then on every client has to log in.
    pub fn enable_auth(&self, password: &str) -> Result<()> {
        let root = format!("root:{password}");
        for (args, what) in [
            (vec!["user", "add", root.as_str()], "etcdctl user add root"),
            (vec!["auth", "enable"], "etcdctl auth enable"),
        ] {
            let out = etcdctl(self.endpoint(), &args, what)?;
            if !out.status.success() {
                let why = String::from_utf8_lossy(&out.stderr).replace(password, "***");
                return Err(HarnessError::failed(what, why));
            }
        }
        Ok(())
    }
}

/// Runs `etcdctl ARGS` (API v3) against `endpoints`; `what` names it in errors.
fn etcdctl(endpoints: &str, args: &[&str], what: &str) -> Result<std::process::Output> {
    Command::new(find_etcd("etcdctl")?)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(args)
        .output()
        .map_err(|e| HarnessError::io(format!("running {what}"), e))
}

/// A local Redis that requires `redis_password` and a local etcd whose `root` user has
/// `etcd_password`, auth on: for the tests of credentials. Panics (naming the variable
/// to unset) where a server is external, and when either cannot be set up.
pub async fn start_with_passwords(
    redis_password: &str,
    etcd_password: &str,
) -> (RedisServer, EtcdServer) {
    let redis = RedisServer::start().await.expect("redis");
    let etcd = EtcdServer::start().await.expect("etcd");
    redis.require_local("it sets a password on the server");
    etcd.require_local("it turns authentication on");
    redis
        .require_password(redis_password)
        .await
        .expect("CONFIG SET requirepass");
    etcd.enable_auth(etcd_password).expect("etcd auth");
    (redis, etcd)
}

impl RedisServer {
    /// Sets `requirepass` (`CONFIG SET`): from then on clients need `password`.
    pub async fn require_password(&self, password: &str) -> Result<()> {
        let set = ["CONFIG", "SET", "requirepass", password];
        redis_query::<redis::Value>(self.addr(), &set)
            .await
            .map(drop)
    }
}

server_handle! {
    /// A standalone ZooKeeper server with `tickTime=1000` (so session timeouts from
    /// 2 s to 20 s are honoured; a standalone server has no leader to lose, so this is
    /// not the production timing the [`ZooKeeperEnsemble`] runs at, see
    /// [`ClusterTiming`]), ready once the four-letter command `srvr` reports a mode. Its
    /// endpoint is the connect string, `127.0.0.1:PORT` (no scheme).
    ZooKeeperServer, Kind::ZooKeeper
}

impl ZooKeeperServer {
    /// Like [`start`](Self::start), with `tickTime` = `tick` instead of 1000 ms (and
    /// `maxSessionTimeout` 20 s), for benchmarks: the server expires sessions in tick
    /// buckets, so a shorter tick makes crash failover closer to the session timeout.
    /// Session timeouts from 2 × `tick` to 20 s are honoured. With
    /// [`ENV`](Self::ENV) set, the external server is used as it is.
    pub async fn start_with_tick_time(tick: Duration) -> Result<Self> {
        Ok(ZooKeeperServer(match std::env::var(Self::ENV) {
            Ok(v) if !v.trim().is_empty() => StoreServer::start(Kind::ZooKeeper).await?,
            _ => {
                let prepare = |root: &Path, dir: &Path, port| {
                    Kind::ZooKeeper.prepare(root, dir, port, Some(tick))
                };
                StoreServer::local(Kind::ZooKeeper, prepare).await?
            }
        }))
    }
}

server_handle! {
    /// A Redis server without persistence (a restart starts empty), ready once `PING`
    /// answers `+PONG`. Its endpoint is the connection URL, `redis://127.0.0.1:PORT`.
    RedisServer, Kind::Redis
}

server_handle! {
    /// An Azurite blob service (the Azure Storage emulator) with the well-known
    /// development account `devstoreaccount1`, API version checks off and telemetry
    /// off, ready once its blob endpoint answers HTTP. Its endpoint is the account
    /// URL, `http://127.0.0.1:PORT/devstoreaccount1`.
    AzuriteServer, Kind::Azurite
}

impl AzuriteServer {
    /// The account name of Azurite's development storage account.
    pub const ACCOUNT: &'static str = "devstoreaccount1";

    /// The base64 account key of Azurite's development storage account (a
    /// published, well-known test key).
    pub const ACCOUNT_KEY: &'static str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    /// A connection string (as `AZURE_STORAGE_CONNECTION_STRING` takes it) for the
    /// development account with `key` at the account URL `endpoint`
    /// (`http://HOST:PORT/devstoreaccount1`, e.g. a proxy's address in front of Azurite).
    pub fn connection_string(endpoint: &str, key: &str) -> String {
        format!(
            "AccountName={};AccountKey={key};BlobEndpoint={endpoint}",
            Self::ACCOUNT
        )
    }
}

server_handle! {
    /// A PostgreSQL server (from the highest version under `/usr/lib/postgresql`, else
    /// `PATH`) on a cluster `initdb` made: the superuser `tenure`, trusted without a
    /// password ([`USER`](Self::USER)), UTF-8, locale C. It listens on 127.0.0.1 and on a
    /// Unix socket in its data directory, with `fsync=off`, `full_page_writes=off` and
    /// `max_connections=200`; commits are still written to the OS before they return, so
    /// a killed or restarted server keeps every committed transaction. When the harness
    /// runs as root it runs as the `postgres` system user (PostgreSQL refuses root).
    /// Ready once a startup message gets past its start-up checks
    /// ([`probe::postgres`](crate::probe::postgres)). Its endpoint is the connection URL,
    /// `postgres://tenure@127.0.0.1:PORT/postgres`.
    ///
    /// The faults reach its backends too: [`pause`](StoreServer::pause) stops the
    /// postmaster and every backend (open connections hang as well as new ones),
    /// [`kill`](StoreServer::kill) kills them all (a crash; the restart recovers from
    /// the WAL), and [`terminate`](StoreServer::terminate) is a fast shutdown (SIGINT:
    /// PostgreSQL's SIGTERM would wait for every client to leave).
    PostgresServer, Kind::Postgres
}

impl PostgresServer {
    /// The superuser of a local server (trusted on the Unix socket always, and over TCP
    /// until [`require_password`](Self::require_password)).
    pub const USER: &'static str = POSTGRES_USER;

    /// The database a local server's endpoint names.
    pub const DATABASE: &'static str = POSTGRES_DATABASE;

    /// The `psql` the harness runs (from the highest version under
    /// `/usr/lib/postgresql`, else from `PATH`), for tests that connect with it
    /// themselves (over TCP, with a password or TLS); missing, the error names
    /// `bash scripts/install-test-deps.sh`.
    pub fn psql_program() -> Result<PathBuf> {
        postgres_program("psql")
    }

    /// Like [`start`](Self::start), with TLS on: `cert_pem` (the server certificate,
    /// then any intermediates) and `key_pem` (its private key; PKCS#8 or PKCS#1 PEM) are
    /// written to the data directory (the key with mode 0600, owned by the server's
    /// user) and the server runs with `ssl=on`. Plain TCP connections are still accepted
    /// until [`require_tls`](Self::require_tls). Never external.
    pub async fn start_with_tls(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let prepare = |root: &Path, dir: &Path, port| {
            postgres_prepare(root, dir, port, Some((cert_pem, key_pem)))
        };
        StoreServer::local(Kind::Postgres, prepare).await.map(Self)
    }

    /// Runs `sql` (one or more statements, in one implicit transaction) with `psql` as
    /// [`USER`](Self::USER) on the Unix socket of a local server (or on the endpoint of an
    /// external one), stopping at the first error, and returns what it printed: one line
    /// per row, columns separated by `|`, no headers or command tags, without the last
    /// newline. An SQL error is [`HarnessError::Io`] with psql's message.
    pub async fn sql(&self, sql: &str) -> Result<String> {
        let psql = postgres_program("psql")?;
        let mut command = tokio::process::Command::new(&psql);
        command.args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"]);
        match self.data_dir() {
            Some(dir) => {
                let port = self.addr().port().to_string();
                command.arg("-h").arg(dir).args(["-p", &port]);
                command.args(["-U", Self::USER, "-d", Self::DATABASE]);
            }
            None => {
                command.args(["-d", self.endpoint()]);
            }
        }
        command
            .args(["-c", sql])
            .stdin(Stdio::null())
            .kill_on_drop(true);
        let doing = || format!("running `{sql}` with psql on {}", self.endpoint());
        let out = tokio::time::timeout(SQL_TIMEOUT, command.output())
            .await
            .map_err(|_| HarnessError::failed(doing(), format!("no end within {SQL_TIMEOUT:?}")))?
            .map_err(|e| HarnessError::io(doing(), e))?;
        if !out.status.success() {
            let why = format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr));
            return Err(HarnessError::failed(doing(), why.trim_end()));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        Ok(text.strip_suffix('\n').unwrap_or(&text).to_owned())
    }

    /// Gives the role `user` (created if missing, able to log in, with every privilege
    /// on the database `postgres` and its schema `public`) the password `password`,
    /// stored as SCRAM-SHA-256, and from then on requires a password of every TCP
    /// connection (`scram-sha-256` in `pg_hba.conf`, kept over restarts; the harness's
    /// own Unix socket stays trusted). Returns once the server enforces it (after SIGHUP,
    /// a plain startup as `tenure` is asked for a password).
    pub async fn require_password(&self, user: &str, password: &str) -> Result<()> {
        self.running()?;
        let hide = |e: HarnessError| {
            let text = e.to_string();
            let why = match password.is_empty() {
                true => text,
                false => text.replace(password, "***"),
            };
            HarnessError::failed(format!("setting the password of the role {user:?}"), why)
        };
        let find = format!(
            "SELECT count(*) FROM pg_roles WHERE rolname = {}",
            sql_literal(user)
        );
        let verb = match self.sql(&find).await?.as_str() {
            "0" => "CREATE",
            _ => "ALTER",
        };
        let role = sql_identifier(user);
        let statements = format!(
            "SET password_encryption = 'scram-sha-256'; \
             {verb} ROLE {role} LOGIN PASSWORD {}; \
             GRANT ALL ON DATABASE {POSTGRES_DATABASE} TO {role}; \
             GRANT ALL ON SCHEMA public TO {role}",
            sql_literal(password)
        );
        self.sql(&statements).await.map_err(hide)?;
        self.set_hba(|hba| hba.password = true).await
    }

    /// From then on accepts TCP connections only over TLS (`hostssl` in `pg_hba.conf`,
    /// kept over restarts): a plain startup is refused with SQLSTATE 28000 ("no
    /// pg_hba.conf entry … no encryption"). Needs a server started with
    /// [`start_with_tls`](Self::start_with_tls). Returns once the server enforces it.
    pub async fn require_tls(&self) -> Result<()> {
        self.running()?;
        if self.sql("SHOW ssl").await? != "on" {
            let why = "its ssl setting is off: start it with PostgresServer::start_with_tls";
            return Err(HarnessError::failed("requiring TLS of PostgreSQL", why));
        }
        self.set_hba(|hba| hba.tls_only = true).await
    }

    /// Rewrites `pg_hba.conf` as `change` says, makes the server reload it (SIGHUP), and
    /// waits (up to 10 s) until a plain startup's answer shows the new rules in force.
    async fn set_hba(&self, change: impl FnOnce(&mut Hba)) -> Result<()> {
        self.running()?;
        let not_running = || HarnessError::not_running("the PostgreSQL server");
        let path = self.data_dir().ok_or_else(not_running)?.join("pg_hba.conf");
        let text = std::fs::read_to_string(&path).map_err(|e| HarnessError::File {
            path: path.clone(),
            reason: format!("cannot read pg_hba.conf: {e}"),
        })?;
        let mut hba = Hba::parse(&text);
        change(&mut hba);
        write_file(&path, &hba.text(), "pg_hba.conf")?;
        send_signal(
            self.pid().ok_or_else(not_running)?,
            libc::SIGHUP,
            self.name(),
        )?;
        let addr = self.addr();
        let within = Duration::from_secs(10);
        retry(within, Duration::from_millis(20), || async move {
            let timeout = Duration::from_secs(1);
            let answer = probe::postgres_hello(addr, POSTGRES_USER, POSTGRES_DATABASE, timeout);
            match answer.await {
                Ok(answer) if hba.in_force(&answer) => Ok(()),
                other => Err(HarnessError::failed(
                    "reloading pg_hba.conf (SIGHUP)",
                    format!("{hba:?} not in force after {within:?}: a plain startup got {other:?}"),
                )),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_endpoints_are_normalised() {
        let azurite = "http://127.0.0.1:10000/devstoreaccount1";
        for (kind, value, endpoint, addr) in [
            (
                Kind::Etcd,
                "127.0.0.1:2379",
                "http://127.0.0.1:2379",
                "127.0.0.1:2379",
            ),
            (
                Kind::Etcd,
                "http://localhost:2379/",
                "http://localhost:2379",
                "localhost:2379",
            ),
            (
                Kind::ZooKeeper,
                "zk1:2181,zk2:2181/chroot",
                "zk1:2181,zk2:2181/chroot",
                "zk1:2181",
            ),
            (
                Kind::Redis,
                "redis://:secret@127.0.0.1:6379/0",
                "redis://:secret@127.0.0.1:6379/0",
                "127.0.0.1:6379",
            ),
            (
                Kind::Redis,
                "127.0.0.1:6379",
                "redis://127.0.0.1:6379",
                "127.0.0.1:6379",
            ),
            (
                Kind::Azurite,
                "http://127.0.0.1:10000",
                azurite,
                "127.0.0.1:10000",
            ),
            (
                Kind::Azurite,
                "http://127.0.0.1:10000/devstoreaccount1/",
                azurite,
                "127.0.0.1:10000",
            ),
            (
                Kind::Postgres,
                "postgres://tenure@127.0.0.1:5432/postgres",
                "postgres://tenure@127.0.0.1:5432/postgres",
                "127.0.0.1:5432",
            ),
            (
                Kind::Postgres,
                "postgresql://app:s3cret@db.example:6543/tenure?sslmode=require",
                "postgresql://app:s3cret@db.example:6543/tenure?sslmode=require",
                "db.example:6543",
            ),
            (
                Kind::Postgres,
                "postgres://app@localhost:5432?sslmode=disable",
                "postgres://app@localhost:5432?sslmode=disable",
                "localhost:5432",
            ),
            (
                Kind::Postgres,
                "tenure@127.0.0.1:5432/postgres/",
                "postgres://tenure@127.0.0.1:5432/postgres",
                "127.0.0.1:5432",
            ),
        ] {
            let found = kind.external(value).unwrap();
            assert_eq!(found, (endpoint.to_string(), addr.to_string()), "{value}");
        }
        assert!(Kind::ZooKeeper.external("http://zk:2181").is_err());
        assert!(Kind::Redis.external("redis://localhost").is_err());
        assert!(Kind::Etcd.external("  ").is_err());
        assert!(Kind::Postgres
            .external("postgres://tenure@db/postgres")
            .is_err());
        assert_eq!(Kind::Postgres.env_var(), "TENURE_TEST_POSTGRES");
    }

    #[test]
    fn local_endpoints_have_the_documented_shape() {
        let addr = loopback(1234);
        for (kind, endpoint) in [
            (Kind::Etcd, "http://127.0.0.1:1234"),
            (Kind::ZooKeeper, "127.0.0.1:1234"),
            (Kind::Redis, "redis://127.0.0.1:1234"),
            (Kind::Azurite, "http://127.0.0.1:1234/devstoreaccount1"),
            (Kind::Postgres, "postgres://tenure@127.0.0.1:1234/postgres"),
        ] {
            assert_eq!(kind.endpoint(addr), endpoint);
        }
    }

    #[test]
    fn port_clashes_are_recognised() {
        assert!(port_clash(
            "listen tcp 127.0.0.1:5: bind: address already in use"
        ));
        assert!(port_clash("java.net.BindException: Address already in use"));
        assert!(port_clash("Error: listen EADDRINUSE: address"));
        assert!(!port_clash("all good"));
    }

    #[test]
    fn zookeeper_classpath_starts_with_the_server_jar() {
        if let Ok(cp) = zookeeper_classpath() {
            assert!(cp.split(':').next().unwrap().contains("zookeeper"), "{cp}");
        }
    }

    #[test]
    fn missing_binaries_name_the_install_script() {
        let err = require_program("no-such-program-xyz", "thing", "the apt package thing")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bash scripts/install-test-deps.sh"), "{err}");
        assert!(err.contains("the apt package thing"), "{err}");
    }

    /// An executable `dir/name` (a shell script), with its directories.
    fn fake_program(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        std::fs::create_dir_all(dir).unwrap();
        let file = dir.join(name);
        std::fs::write(&file, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
        file
    }

    #[test]
    fn postgres_programs_come_from_the_highest_version_else_path() {
        let dir = tempfile::tempdir().unwrap();
        let (lib, path) = (dir.path().join("lib"), dir.path().join("path"));
        std::fs::create_dir_all(&path).unwrap();
        let search = Some(path.clone().into_os_string());
        let find = |program| find_postgres(&lib, search.clone(), program);

        let err = find("initdb").unwrap_err();
        assert!(
            matches!(err, HarnessError::MissingBinary { what: "initdb", .. }),
            "{err}"
        );
        let err = err.to_string();
        assert!(err.contains("bash scripts/install-test-deps.sh"), "{err}");
        assert!(err.contains("the apt package postgresql"), "{err}");
        assert!(err.contains("/<version>/bin/initdb"), "{err}");

        let in_path = fake_program(&path, "initdb");
        assert_eq!(find("initdb").unwrap(), in_path);
        // Versions compare as numbers (9.6 < 10 < 15); a version without the program,
        // or a directory that is no version, does not count.
        fake_program(&lib.join("9.6/bin"), "initdb");
        let ten = fake_program(&lib.join("10/bin"), "initdb");
        assert_eq!(find("initdb").unwrap(), ten);
        let fifteen = fake_program(&lib.join("15/bin"), "initdb");
        fake_program(&lib.join("16/bin"), "psql");
        fake_program(&lib.join("latest/bin"), "initdb");
        assert_eq!(find("initdb").unwrap(), fifteen);
        assert_eq!(find("psql").unwrap(), lib.join("16/bin/psql"));
    }

    #[test]
    fn pg_hba_rules_are_written_read_and_recognised() {
        use probe::PostgresAnswer::{Authentication, Error};
        let no_entry = Error {
            code: "28000".into(),
            message: "no pg_hba.conf entry".into(),
        };
        for (tls_only, password) in [(false, false), (false, true), (true, false), (true, true)] {
            let hba = Hba { tls_only, password };
            let text = hba.text();
            assert_eq!(Hba::parse(&text), hba, "{text}");
            assert!(text.contains("\nlocal all all trust\n"), "{text}");
            let seen = [Authentication(0), Authentication(10), no_entry.clone()]
                .map(|answer| hba.in_force(&answer));
            let expected = match (tls_only, password) {
                (false, false) => [true, false, false],
                (false, true) => [false, true, false],
                (true, _) => [false, false, true],
            };
            assert_eq!(seen, expected, "{hba:?}");
        }
        assert_eq!(Hba::parse(""), Hba::default());
    }

    #[test]
    fn sql_quoting_doubles_quotes() {
        assert_eq!(sql_literal("it's"), "'it''s'");
        assert_eq!(sql_identifier("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn a_tool_is_taken_from_the_workspace_else_from_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (local, path) = (dir.path().join("local"), dir.path().join("path"));
        std::fs::create_dir_all(&path).unwrap();
        let search = Some(path.clone().into_os_string());
        let find = |search: Option<OsString>| {
            local_or_in_path(local.join("etcd"), search, "etcd", ETCD_PACKAGE)
        };
        let err = find(search.clone()).unwrap_err().to_string();
        assert!(err.contains("bash scripts/install-test-deps.sh"), "{err}");
        assert!(err.contains(ETCD_PACKAGE), "{err}");
        let fake = |dir: &Path| {
            std::fs::create_dir_all(dir).unwrap();
            let file = dir.join("etcd");
            std::fs::write(&file, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).unwrap();
            file
        };
        let in_path = fake(&path);
        assert_eq!(find(search.clone()).unwrap(), in_path);
        let own = fake(&local);
        assert_eq!(find(search).unwrap(), own);
    }
}

/// How a local store cluster ([`EtcdCluster`], [`ZooKeeperEnsemble`]) is timed. The
/// single-server handles ([`EtcdServer`], [`ZooKeeperServer`]) keep their own fast
/// settings: they test the backends against one server, not a store's failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClusterTiming {
    /// As production runs them: etcd at its defaults (heartbeat 100 ms, election
    /// timeout 1 s); ZooKeeper with `tickTime` 2000 ms, `initLimit` 5 and `syncLimit` 2
    /// (the production configuration of Kafka's operations guide), so session timeouts
    /// from 4 s to 40 s are honoured. Every cluster fault test and clustered chaos run
    /// uses this.
    #[default]
    Production,
    /// Faster than anyone runs a store, for the labelled fast group (`fast_…` tests)
    /// only: etcd with a 20 ms heartbeat and a 200 ms election timeout; ZooKeeper with
    /// `tickTime` 500 ms, `initLimit` 10 and `syncLimit` 2 (session timeouts from 1 s
    /// to 20 s). Failovers here take a fraction of the production time, so a test that
    /// passes only here says nothing about a production cluster.
    Fast,
}

impl ClusterTiming {
    /// `production` or `fast`, for test names and tables.
    pub fn name(self) -> &'static str {
        match self {
            ClusterTiming::Production => "production",
            ClusterTiming::Fast => "fast",
        }
    }

    /// etcd's raft heartbeat in milliseconds (the election timeout is ten of them);
    /// `None` leaves etcd's defaults.
    fn etcd_heartbeat_ms(self) -> Option<u32> {
        match self {
            ClusterTiming::Production => None,
            ClusterTiming::Fast => Some(20),
        }
    }

    /// etcd's election timeout.
    pub fn etcd_election_timeout(self) -> Duration {
        Duration::from_millis(u64::from(self.etcd_heartbeat_ms().unwrap_or(100)) * 10)
    }

    /// ZooKeeper's `tickTime`.
    pub fn zookeeper_tick(self) -> Duration {
        match self {
            ClusterTiming::Production => Duration::from_millis(2000),
            ClusterTiming::Fast => Duration::from_millis(500),
        }
    }

    /// ZooKeeper's (`initLimit`, `syncLimit`), in ticks.
    fn zookeeper_limits(self) -> (u32, u32) {
        match self {
            ClusterTiming::Production => (5, 2),
            ClusterTiming::Fast => (10, 2),
        }
    }

    /// `syncLimit` × `tickTime`: how long a ZooKeeper follower goes on without its
    /// leader (answering its clients' reads and pings) before it gives up and elects.
    pub fn zookeeper_sync_window(self) -> Duration {
        self.zookeeper_tick() * self.zookeeper_limits().1
    }

    /// The session timeouts a ZooKeeper ensemble honours: [2, 20] × `tickTime`.
    pub fn zookeeper_session_timeouts(self) -> (Duration, Duration) {
        (self.zookeeper_tick() * 2, self.zookeeper_tick() * 20)
    }

    /// The ensemble's `zoo.cfg` lines for its tick, limits and session timeouts.
    fn zookeeper_config(self) -> String {
        let (init, sync) = self.zookeeper_limits();
        let (min, max) = self.zookeeper_session_timeouts();
        format!(
            "tickTime={}\ninitLimit={init}\nsyncLimit={sync}\nminSessionTimeout={}\n\
             maxSessionTimeout={}\n",
            self.zookeeper_tick().as_millis(),
            min.as_millis(),
            max.as_millis()
        )
    }
}

/// A local etcd cluster of several members, each its own process with its own data
/// directory, on free loopback ports, timed as its [`ClusterTiming`] says (production
/// unless started with [`start_with`](Self::start_with)); the members log at `info`
/// (elections, and a paused leader's lease revocations, see
/// [`leases_expired`](Self::leases_expired)). Faults go to one member at a time:
/// [`pause`](Members::pause) (SIGSTOP), [`resume`](Members::resume),
/// [`kill`](Members::kill), [`restart`](Members::restart).
///
/// Dropping it kills every member and removes the data directories.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Members,
    timing: ClusterTiming,
}

impl EtcdCluster {
    /// Starts `size` members at production timing together and waits until each
    /// answers `/health`.
    pub async fn start(size: usize) -> Result<Self> {
        Self::start_with(size, ClusterTiming::Production).await
    }

    /// Starts `size` members with `timing`, logging at `info`.
    pub async fn start_with(size: usize, timing: ClusterTiming) -> Result<Self> {
        Self::start_logging(size, timing, "info").await
    }

    /// Starts `size` members with `timing`, logging at `log_level` (`debug` shows,
    /// with etcd 3.5.13 or later, whether a member that was paused skipped the
    /// leadership check before it revoked leases as it resumed). The members run the
    /// harness's etcd, or the program `TENURE_CLUSTER_ETCD` names (to compare etcd
    /// versions, e.g. Debian bookworm's 3.4.23 in `/usr/bin/etcd`).
    pub async fn start_logging(
        size: usize,
        timing: ClusterTiming,
        log_level: &str,
    ) -> Result<Self> {
        let program = match std::env::var_os("TENURE_CLUSTER_ETCD") {
            Some(program) if !program.is_empty() => PathBuf::from(program),
            _ => find_etcd("etcd")?,
        };
        let ports: Vec<(u16, u16)> = (0..size)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let initial: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect();
        let (initial, token) = (
            initial.join(","),
            format!("--initial-cluster-token tenure-{}", std::process::id()),
        );
        let clients: Vec<u16> = ports.iter().map(|p| p.0).collect();
        let raft = (timing.etcd_heartbeat_ms(), log_level);
        let members = Members::spawn(Kind::Etcd, "tenure-etcd-cluster-", &clients, |i, _, dir| {
            let args = etcd_args(&format!("e{i}"), dir, ports[i], &initial, raft, &token);
            Ok(Launch::of(&program, args))
        });
        Ok(EtcdCluster {
            members: members.await?,
            timing,
        })
    }

    /// How the cluster is timed.
    pub fn timing(&self) -> ClusterTiming {
        self.timing
    }

    /// The version member `i` reports (`/version`'s `etcdserver`, e.g. `3.5.16`).
    pub async fn version(&self, i: usize) -> Result<String> {
        let addr = self.member_addr(i)?;
        let text = probe::http_get(addr, "/version", Duration::from_secs(2))
            .await
            .map_err(|why| HarnessError::failed(format!("GET /version of etcd member {i}"), why))?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or(text.as_str(), |(_, b)| b);
        let value: serde_json::Value = serde_json::from_str(body.trim()).map_err(|e| {
            HarnessError::failed(format!("reading etcd member {i}'s /version"), e.to_string())
        })?;
        match value["etcdserver"].as_str() {
            Some(v) => Ok(v.to_string()),
            None => Err(HarnessError::failed(
                format!("reading etcd member {i}'s /version"),
                format!("no etcdserver in {body}"),
            )),
        }
    }

    /// How many leases member `i`'s own lessor revoked because their TTL ran out on
    /// its clock since it started (`etcd_debugging_server_lease_expired_total` of its
    /// `/metrics`): only a member that is (or believes it is) raft leader revokes, so a
    /// count that grows on a member that was paused while another led is that member's
    /// stale lessor at work.
    pub async fn leases_expired(&self, i: usize) -> Result<u64> {
        let addr = self.member_addr(i)?;
        let text = read_metrics(addr)
            .await
            .map_err(|why| HarnessError::failed(format!("GET /metrics of etcd member {i}"), why))?;
        let name = "etcd_debugging_server_lease_expired_total";
        let value = text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?;
            rest.trim().parse::<f64>().ok()
        });
        Ok(value.unwrap_or(0.0) as u64)
    }

    fn member_addr(&self, i: usize) -> Result<SocketAddr> {
        self.members
            .addrs()
            .get(i)
            .copied()
            .ok_or_else(|| self.members.missing(i))
    }

    /// Waits (at most 30 s) until a member is raft leader; its index.
    pub async fn wait_leader(&self) -> Result<usize> {
        retry(
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async { self.leader() },
        )
        .await
    }

    /// The index of the member that is raft leader now, asked with `etcdctl endpoint
    /// status` of every member that answers.
    pub fn leader(&self) -> Result<usize> {
        let endpoints: Vec<String> = self.addrs().iter().map(|a| format!("http://{a}")).collect();
        let status = [
            "endpoint",
            "status",
            "--write-out=fields",
            "--command-timeout=1s",
        ];
        let out = etcdctl(&endpoints.join(","), &status, "etcdctl endpoint status")?;
        let text = String::from_utf8_lossy(&out.stdout);
        // One block of `"Key" : value` lines per endpoint, blocks separated by a blank
        // line; the leader's block has "MemberID" equal to "Leader".
        for block in text.split("\n\n") {
            let field = |name: &str| {
                block.lines().find_map(|line| {
                    let (key, value) = line.split_once(" : ")?;
                    (key.trim().trim_matches('"') == name)
                        .then(|| value.trim().trim_matches('"').to_string())
                })
            };
            if let (Some(member), Some(leader), Some(endpoint)) =
                (field("MemberID"), field("Leader"), field("Endpoint"))
            {
                if member == leader {
                    if let Some(i) = endpoints.iter().position(|e| *e == endpoint) {
                        return Ok(i);
                    }
                }
            }
        }
        let why = format!("no member reports itself leader: {text}");
        Err(HarnessError::failed("finding the etcd leader", why))
    }
}

/// The whole `/metrics` page of the etcd member at `addr` (HTTP/1.0, so not chunked;
/// larger than the probes' answers), within 5 s.
async fn read_metrics(addr: SocketAddr) -> std::result::Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let work = async {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| e.to_string())?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\n\r\n")
            .await
            .map_err(|e| e.to_string())?;
        let mut text = Vec::new();
        stream
            .take(16 << 20)
            .read_to_end(&mut text)
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&text).into_owned())
    };
    match tokio::time::timeout(Duration::from_secs(5), work).await {
        Ok(result) => result,
        Err(_) => Err("no answer within 5 s".to_string()),
    }
}

/// A ZooKeeper ensemble of local servers (`QuorumPeerMain`) on free loopback ports,
/// timed as its [`ClusterTiming`] says (production unless started with
/// [`start_with`](Self::start_with)): at production timing `tickTime` 2000 ms,
/// `initLimit` 5, `syncLimit` 2, session timeouts from 4 s to 40 s. A follower cut off
/// from its leader goes on answering its clients' reads and pings for `syncLimit` ×
/// `tickTime` (4 s at production timing,
/// [`sync_window`](ClusterTiming::zookeeper_sync_window)) before it drops them and
/// elects; a session re-attaching meanwhile waits for the new leader. Members are
/// numbered from 0; member `i` has `myid` `i + 1`. Each is ready once `srvr` answers
/// with a `Mode:` (it serves only while it is part of a quorum).
///
/// Dropping it kills every member and removes the data directories.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    members: Members,
    timing: ClusterTiming,
}

impl ZooKeeperEnsemble {
    /// Starts `size` servers at production timing together and waits until each serves.
    pub async fn start(size: usize) -> Result<Self> {
        Self::start_with(size, ClusterTiming::Production).await
    }

    /// Starts `size` servers with `timing` together and waits until each serves.
    pub async fn start_with(size: usize, timing: ClusterTiming) -> Result<Self> {
        let ports: Vec<(u16, u16, u16)> = (0..size)
            .map(|_| Ok((free_port()?, free_port()?, free_port()?)))
            .collect::<Result<_>>()?;
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer, election))| {
                format!("server.{}=127.0.0.1:{peer}:{election}\n", i + 1)
            })
            .collect();
        let config = format!("{}{servers}", timing.zookeeper_config());
        let clients: Vec<u16> = ports.iter().map(|p| p.0).collect();
        let prefix = "tenure-zookeeper-ensemble-";
        let members = Members::spawn(Kind::ZooKeeper, prefix, &clients, |i, root, dir| {
            write_file(&dir.join("myid"), &format!("{}\n", i + 1), "myid")?;
            zookeeper_launch(root, dir, clients[i], &config, "quorum.QuorumPeerMain")
        });
        Ok(ZooKeeperEnsemble {
            members: members.await?,
            timing,
        })
    }

    /// How the ensemble is timed.
    pub fn timing(&self) -> ClusterTiming {
        self.timing
    }

    /// What server `i` answers to the four-letter word `srvr` (within 1 s).
    pub async fn srvr(&self, i: usize) -> Result<String> {
        let addr = self.members.addrs().get(i).copied();
        let addr =
            addr.ok_or_else(|| HarnessError::not_running(format!("ZooKeeper server {i}")))?;
        probe::exchange(addr, b"srvr", |_| false, Duration::from_secs(1))
            .await
            .map(|a| String::from_utf8_lossy(&a).into_owned())
            .map_err(|why| {
                HarnessError::failed(format!("asking ZooKeeper server {i} for srvr"), why)
            })
    }

    /// The server the ZooKeeper session `session_id` (16 hex digits, as
    /// [`Session::id`](tenure_core::Session::id) gives it) is connected to now, asked
    /// with each server's `cons` (its connections and their session ids).
    pub async fn serving(&self, session_id: &str) -> Result<Option<usize>> {
        let Ok(wanted) = u64::from_str_radix(session_id, 16) else {
            let why = format!("{session_id:?} is not hex");
            return Err(HarnessError::failed("reading a ZooKeeper session id", why));
        };
        for (i, addr) in self.members.addrs().into_iter().enumerate() {
            let Ok(answer) =
                probe::exchange(addr, b"cons", |_| false, Duration::from_secs(1)).await
            else {
                continue;
            };
            let text = String::from_utf8_lossy(&answer);
            let has = text.split("sid=0x").skip(1).any(|rest| {
                let hex: String = rest.chars().take_while(char::is_ascii_hexdigit).collect();
                u64::from_str_radix(&hex, 16) == Ok(wanted)
            });
            if has {
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// The index of the server whose `srvr` says `Mode: leader`.
    pub async fn leader(&self) -> Result<usize> {
        let mut answers = Vec::new();
        for i in 0..self.members.len() {
            match self.srvr(i).await {
                Ok(text) if text.contains("Mode: leader") => return Ok(i),
                Ok(text) => answers.push(format!("{i}: {}", text.lines().last().unwrap_or(""))),
                Err(e) => answers.push(format!("{i}: {e}")),
            }
        }
        let why = format!("no server reports Mode: leader ({})", answers.join("; "));
        Err(HarnessError::failed(
            "finding the ZooKeeper ensemble leader",
            why,
        ))
    }

    /// Waits until every running server serves and one of them leads (at most 30 s);
    /// the leader's index.
    pub async fn wait_leader(&self) -> Result<usize> {
        retry(
            Duration::from_secs(30),
            Duration::from_millis(100),
            || async {
                for i in 0..self.members.len() {
                    if !matches!(self.srvr(i).await, Ok(t) if t.contains("Mode:")) {
                        return Err(HarnessError::not_running(format!(
                            "ZooKeeper server {i} serving"
                        )));
                    }
                }
                self.leader().await
            },
        )
        .await
    }
}

/// The member processes of a local store cluster ([`EtcdCluster`],
/// [`ZooKeeperEnsemble`] deref to it), with faults for one member at a time.
#[derive(Debug)]
pub struct Members {
    kind: Kind,
    list: Vec<(SocketAddr, Local)>,
}

impl Members {
    /// Members serving clients on `ports`, member `i` started as `launch(i, root,
    /// data_dir)` says in a temporary directory `root` (named `prefix…`) of its own,
    /// once each answers its readiness probe.
    async fn spawn(
        kind: Kind,
        prefix: &str,
        ports: &[u16],
        mut launch: impl FnMut(usize, &Path, &Path) -> Result<Launch>,
    ) -> Result<Self> {
        let mut list = Vec::new();
        for (i, port) in ports.iter().enumerate() {
            let (root, dir) = temp_root(prefix)?;
            let mut local = Local::new(launch(i, root.path(), &dir)?, dir, root);
            local.spawn(kind)?;
            list.push((loopback(*port), local));
        }
        Self::ready(kind, list).await
    }

    /// Members spawned together, once each answers its readiness probe.
    async fn ready(kind: Kind, mut list: Vec<(SocketAddr, Local)>) -> Result<Self> {
        for (addr, local) in &mut list {
            local.wait_ready(kind, *addr).await?;
        }
        Ok(Members { kind, list })
    }

    /// The members' client addresses, in member order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.list.iter().map(|(a, _)| *a).collect()
    }

    /// `host:port,host:port,…` for the store's URL.
    pub fn hosts(&self) -> String {
        let hosts: Vec<String> = self.addrs().iter().map(|a| a.to_string()).collect();
        hosts.join(",")
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True if there are no members.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The end of member `i`'s log (empty for an unknown member).
    pub fn log_tail(&self, i: usize) -> String {
        self.list
            .get(i)
            .map(|(_, local)| local.log_tail())
            .unwrap_or_default()
    }

    /// The lines of member `i`'s whole log (all its runs) that contain any of
    /// `needles`, in order.
    pub fn log_lines(&self, i: usize, needles: &[&str]) -> Vec<String> {
        let Some((_, local)) = self.list.get(i) else {
            return Vec::new();
        };
        let text = std::fs::read(&local.log_path).unwrap_or_default();
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|line| needles.iter().any(|n| line.contains(n)))
            .map(str::to_string)
            .collect()
    }

    fn missing(&self, i: usize) -> HarnessError {
        HarnessError::not_running(format!("{} member {i}", self.kind.name()))
    }

    fn pid(&self, i: usize) -> Result<u32> {
        match self.list.get(i) {
            Some((_, local)) => local.pid(self.kind),
            None => Err(self.missing(i)),
        }
    }

    /// The members process `pid` has a TCP connection to now (for this test process,
    /// `std::process::id()`): where its clients' requests and streams go.
    pub fn connected_from(&self, pid: u32) -> Result<Vec<usize>> {
        let peers = crate::os::loopback_peers(pid)?;
        Ok(self
            .addrs()
            .iter()
            .enumerate()
            .filter(|(_, a)| peers.contains(&a.port()))
            .map(|(i, _)| i)
            .collect())
    }

    /// SIGSTOP member `i`: its connections stay open, it answers nothing.
    pub fn pause(&self, i: usize) -> Result<()> {
        self.local(i)?.pause(self.kind)
    }

    /// SIGCONT member `i`.
    pub fn resume(&self, i: usize) -> Result<()> {
        self.local(i)?.resume(self.kind)
    }

    fn local(&self, i: usize) -> Result<&Local> {
        self.list
            .get(i)
            .map(|(_, l)| l)
            .ok_or_else(|| self.missing(i))
    }

    /// SIGKILL member `i`; it stays down until [`restart`](Self::restart).
    pub async fn kill(&mut self, i: usize) -> Result<()> {
        self.local_mut(i)?.stop().await;
        Ok(())
    }

    /// SIGTERM member `i`, then up to `TERMINATE_GRACE` for it to save its state and
    /// exit, then SIGKILL; it stays down until [`restart`](Self::restart).
    pub async fn terminate(&mut self, i: usize) -> Result<()> {
        self.local_mut(i)?.terminate(TERMINATE_GRACE).await;
        Ok(())
    }

    fn local_mut(&mut self, i: usize) -> Result<&mut Local> {
        let missing = self.missing(i);
        self.list.get_mut(i).map(|(_, local)| local).ok_or(missing)
    }

    /// Start member `i` again on its ports and data directory (SIGKILLing it first if
    /// it runs) and wait until it answers (for a cluster member: rejoined a quorum).
    pub async fn restart(&mut self, i: usize) -> Result<()> {
        let (kind, missing) = (self.kind, self.missing(i));
        let (addr, local) = self.list.get_mut(i).ok_or(missing)?;
        local.stop().await;
        local.launch(kind, *addr).await
    }
}

/// A cluster handle derefs to its [`Members`].
macro_rules! deref_members {
    ($($cluster:ty),*) => {$(
        impl std::ops::Deref for $cluster {
            type Target = Members;
            fn deref(&self) -> &Members {
                &self.members
            }
        }

        impl std::ops::DerefMut for $cluster {
            fn deref_mut(&mut self) -> &mut Members {
                &mut self.members
            }
        }
    )*};
}

deref_members!(EtcdCluster, ZooKeeperEnsemble);

/// Redis under Sentinel on loopback: a primary, two replicas of it, and three
/// sentinels that monitor it as [`service`](Self::service) (quorum 2, a primary that
/// does not answer for [`DOWN_AFTER`](Self::DOWN_AFTER) is down, failover timeout 4 s).
/// Data node `0` starts as the primary and `1`, `2` as its replicas; after a failover
/// one replica is the primary, which [`primary`](Self::primary) reports. Two replicas,
/// so that a replication guard of one replica still has one after a failover. Faults per node through
/// [`data`](Self::data) and [`sentinels`](Self::sentinels).
pub struct RedisSentinels {
    data: Members,
    sentinels: Members,
    service: String,
}

impl RedisSentinels {
    /// How long Sentinel waits before it counts a silent primary as down.
    pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

    /// Start the primary, the replicas and three sentinels, and wait until the
    /// replicas follow the primary and every sentinel knows them and the other two
    /// sentinels (so a failover can happen).
    pub async fn start() -> Result<Self> {
        let program = require_program("redis-server", "redis-server", REDIS_PACKAGE)?;
        let service = format!("tenure-{}", std::process::id());
        let data = [free_port()?, free_port()?, free_port()?];
        let primary = data[0];
        let data = Members::spawn(Kind::Redis, "tenure-redis-data-", &data, |i, _, dir| {
            let mut args = redis_args(data[i], dir);
            // A replica that cannot continue from its offset after a failover needs a
            // full copy; Redis waits 5 s by default before sending one, for other
            // replicas to join it. Here there is at most one other replica.
            args.extend(["--repl-diskless-sync-delay".into(), "0".into()]);
            if i > 0 {
                args.extend([
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    primary.to_string(),
                ]);
            }
            Ok(Launch::of(&program, args))
        });
        let data = data.await?;
        let sentinels = [free_port()?, free_port()?, free_port()?];
        let prefix = "tenure-redis-sentinel-";
        let sentinels = Members::spawn(Kind::Redis, prefix, &sentinels, |i, root, dir| {
            let (config, down) = (root.join("sentinel.conf"), Self::DOWN_AFTER.as_millis());
            let text = format!(
                "port {}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {service} 127.0.0.1 {primary} 2\n\
                 sentinel down-after-milliseconds {service} {down}\n\
                 sentinel failover-timeout {service} 4000\n\
                 sentinel parallel-syncs {service} 1\n",
                sentinels[i],
                dir.display()
            );
            write_file(&config, &text, "the Sentinel config")?;
            let args = vec![config.display().to_string(), "--sentinel".to_string()];
            Ok(Launch::of(&program, args))
        });
        let group = RedisSentinels {
            data,
            sentinels: sentinels.await?,
            service,
        };
        group.wait_until_monitored().await?;
        Ok(group)
    }

    /// The name the sentinels monitor the primary as.
    pub fn service(&self) -> &str {
        &self.service
    }

    /// `redis+sentinel://s1,s2,s3/service` plus `query` (`"?…"` or empty).
    pub fn url(&self, query: &str) -> String {
        format!(
            "redis+sentinel://{}/{}{query}",
            self.sentinels.hosts(),
            self.service
        )
    }

    /// The primary and the replica (index 0 started as the primary).
    pub fn data(&mut self) -> &mut Members {
        &mut self.data
    }

    /// The three sentinels.
    pub fn sentinels(&mut self) -> &mut Members {
        &mut self.sentinels
    }

    /// The data node whose `ROLE` is `master` now (of those that answer).
    pub async fn primary(&self) -> Result<usize> {
        for (i, addr) in self.data.addrs().into_iter().enumerate() {
            if let Ok(role) = redis_query::<Vec<redis::Value>>(addr, &["ROLE"]).await {
                if matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master") {
                    return Ok(i);
                }
            }
        }
        Err(HarnessError::not_running(
            "a Redis primary (no data node answers ROLE with master)",
        ))
    }

    /// Asks the first sentinel that answers for a failover now (`SENTINEL FAILOVER`):
    /// a replica is promoted while the primary lives, and Sentinel then turns the old
    /// primary into a replica of the new one.
    pub async fn force_failover(&self) -> Result<()> {
        let mut last = None;
        for sentinel in self.sentinels.addrs() {
            match redis_query::<redis::Value>(sentinel, &["SENTINEL", "FAILOVER", &self.service])
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(HarnessError::not_running("a sentinel")))
    }

    /// The data node the sentinels name as primary, once a majority agree on one
    /// other than `old` (waits up to 30 s).
    pub async fn wait_failover(&self, old: usize) -> Result<usize> {
        let addrs = self.data.addrs();
        retry(
            Duration::from_secs(30),
            Duration::from_millis(50),
            || async {
                let mut votes = vec![0; addrs.len()];
                for sentinel in self.sentinels.addrs() {
                    let ask = ["SENTINEL", "get-master-addr-by-name", &self.service];
                    let named = redis_query::<Option<(String, u16)>>(sentinel, &ask).await;
                    if let Ok(Some((_, port))) = named {
                        if let Some(i) = addrs.iter().position(|a| a.port() == port) {
                            votes[i] += 1;
                        }
                    }
                }
                let what = format!("a Sentinel failover away from data node {old} within 30 s");
                let chosen = (0..addrs.len()).find(|&i| i != old && votes[i] >= 2);
                chosen.ok_or_else(|| HarnessError::not_running(what))
            },
        )
        .await
    }

    /// Waits until data node `primary` has a replica whose link is up and in sync
    /// (`INFO replication` lists one with `state=online`), up to `within`; returns how
    /// long that took. A grant or renewal with `wait_replicas=1` can be confirmed only
    /// then. On time-out the error shows the node's replication section.
    pub async fn wait_replica_online(&self, primary: usize, within: Duration) -> Result<Duration> {
        let started = std::time::Instant::now();
        let addr = self
            .data
            .addrs()
            .get(primary)
            .copied()
            .ok_or_else(|| HarnessError::not_running(format!("data node {primary}")))?;
        retry(within, Duration::from_millis(50), || async {
            let info = redis_query::<String>(addr, &["INFO", "replication"]).await;
            match info {
                Ok(info) if info.contains("state=online") => Ok(started.elapsed()),
                Ok(info) => Err(HarnessError::not_running(format!(
                    "an online replica of data node {primary} within {within:?} (its INFO \
                     replication: {})",
                    info.trim().replace("\r\n", "; ")
                ))),
                Err(e) => Err(e),
            }
        })
        .await
    }

    async fn wait_until_monitored(&self) -> Result<()> {
        retry(READY_TIMEOUT, Duration::from_millis(100), || async {
            let mut known = true;
            for replica in &self.data.addrs()[1..] {
                known &= redis_query::<String>(*replica, &["INFO", "replication"])
                    .await
                    .is_ok_and(|info| info.contains("master_link_status:up"));
            }
            for sentinel in self.sentinels.addrs() {
                for what in ["replicas", "sentinels"] {
                    let ask = ["SENTINEL", what, &self.service];
                    let list = redis_query::<Vec<redis::Value>>(sentinel, &ask).await;
                    known &= list.is_ok_and(|l| l.len() >= 2);
                }
            }
            if known {
                return Ok(());
            }
            let (service, log) = (&self.service, self.sentinels.log_tail(0));
            Err(HarnessError::not_running(format!(
                "Sentinel monitoring of {service} within {READY_TIMEOUT:?} (sentinel log: {log})"
            )))
        })
        .await
    }
}

/// A temporary directory for one process (named `prefix…`) and the `data` directory in it.
fn temp_root(prefix: &str) -> Result<(TempDir, PathBuf)> {
    let root = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|e| HarnessError::io("creating a temporary directory", e))?;
    let dir = root.path().join("data");
    std::fs::create_dir_all(&dir).map_err(|e| HarnessError::File {
        path: dir.clone(),
        reason: format!("cannot create directory: {e}"),
    })?;
    Ok((root, dir))
}

/// What `attempt` gives once it succeeds, trying every `every` for at most `within`
/// (then its last error).
pub(crate) async fn retry<T, E, F: std::future::Future<Output = Result<T, E>>>(
    within: Duration,
    every: Duration,
    mut attempt: impl FnMut() -> F,
) -> Result<T, E> {
    let until = Instant::now() + within;
    loop {
        match attempt().await {
            Err(_) if Instant::now() < until => tokio::time::sleep(every).await,
            done => return done,
        }
    }
}

/// One command to the Redis (or Sentinel) at `addr`, with a 1 s bound.
async fn redis_query<T: redis::FromRedisValue>(addr: SocketAddr, args: &[&str]) -> Result<T> {
    let failed =
        |why: String| HarnessError::not_running(format!("an answer from Redis at {addr}: {why}"));
    let query = async {
        let client = redis::Client::open(format!("redis://{addr}"))?;
        let mut c = client.get_multiplexed_async_connection().await?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async::<T>(&mut c).await
    };
    match tokio::time::timeout(Duration::from_secs(1), query).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(failed(e.to_string())),
        Err(_) => Err(failed("no answer within 1 s".into())),
    }
}
