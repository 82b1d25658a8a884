//! Checks every row of `docs/bad-input.md`: the input produces the error kind the table
//! names, the error's one line (what the CLI prints) contains the text it names or is
//! exactly the line it names, no cause is printed twice, nothing panics, and every
//! `connect` row answers within its connect timeout plus slack. The table is read from
//! the doc, so it cannot drift from what the code does.
//!
//! It starts a Redis, an etcd and a PostgreSQL with authentication on for the
//! credential rows, so all three must be local servers (unset `TENURE_TEST_REDIS`,
//! `TENURE_TEST_ETCD` and `TENURE_TEST_POSTGRES`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tenure_azure::AzureConfig;
use tenure_core::{Candidate, ElectionName, Error, ErrorKind, Member, Timing};
use tenure_etcd::EtcdBackend;
use tenure_integration::chaos::parse_duration;
use tenure_integration::cli_faults::tenure_bin;
use tenure_integration::{
    start_with_passwords, workspace_root, AzuriteServer, EtcdServer, PostgresServer, RedisServer,
};
use tenure_peer::PeerBackend;
use tenure_postgres::PostgresBackend;
use tenure_redis::RedisBackend;
use tenure_zookeeper::ZooKeeperBackend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The password of the credential rows' servers.
const PASSWORD: &str = "right-Pa55word";
/// The connect timeout the `connect` rows' URLs give, and the slack allowed on top.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const SLACK: Duration = Duration::from_secs(4);

/// One row of the table.
#[derive(Debug)]
struct Row {
    line: usize,
    via: String,
    input: String,
    kinds: Vec<ErrorKind>,
    expect: Expect,
}

/// What the last column asks of the error's one line.
#[derive(Debug)]
enum Expect {
    /// `(any)`: not checked.
    Any,
    /// `` `text` ``: the line contains the text.
    Contains(String),
    /// `` `= line` ``: the line is exactly this (placeholders filled in).
    Line(String),
}

fn kind(name: &str) -> ErrorKind {
    match name.trim() {
        "InvalidArgument" => ErrorKind::InvalidArgument,
        "Unavailable" => ErrorKind::Unavailable,
        "Timeout" => ErrorKind::Timeout,
        "Unauthorized" => ErrorKind::Unauthorized,
        "SessionExpired" => ErrorKind::SessionExpired,
        "Closed" => ErrorKind::Closed,
        "Unsupported" => ErrorKind::Unsupported,
        "Backend" => ErrorKind::Backend,
        other => panic!("docs/bad-input.md: unknown error kind {other:?}"),
    }
}

fn unquote(cell: &str) -> String {
    let cell = cell.trim();
    // A code span holding a backtick: ``` `` text `` ```.
    if let Some(inner) = cell.strip_prefix("`` ").and_then(|c| c.strip_suffix(" ``")) {
        return inner.to_owned();
    }
    cell.strip_prefix('`')
        .and_then(|c| c.strip_suffix('`'))
        .unwrap_or(cell)
        .to_owned()
}

/// The rows of the table under `## The table`.
fn rows() -> Vec<Row> {
    let path = workspace_root().join("docs/bad-input.md");
    let text = std::fs::read_to_string(&path).expect("read docs/bad-input.md");
    let mut rows = Vec::new();
    let mut in_table = false;
    for (i, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            in_table = line.trim() == "## The table";
            continue;
        }
        if !in_table || !line.starts_with('|') || line.starts_with("|---") {
            continue;
        }
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        assert_eq!(cells.len(), 4, "docs/bad-input.md:{}: {line}", i + 1);
        if cells[0].trim() == "via" {
            continue;
        }
        let last = unquote(cells[3]);
        let expect = if last == "(any)" {
            Expect::Any
        } else if let Some(line) = last.strip_prefix("= ") {
            Expect::Line(line.to_owned())
        } else {
            Expect::Contains(last)
        };
        rows.push(Row {
            line: i + 1,
            via: cells[0].trim().to_owned(),
            input: unquote(cells[1]),
            kinds: cells[2].split(" or ").map(kind).collect(),
            expect,
        });
    }
    assert!(
        rows.len() > 40,
        "docs/bad-input.md: the table has {} rows",
        rows.len()
    );
    rows
}

/// The servers and listeners the placeholders stand for.
struct Places {
    closed: SocketAddr,
    silent: SocketAddr,
    garbage: SocketAddr,
    busy: SocketAddr,
    _busy: std::net::TcpListener,
    redis: RedisServer,
    etcd: EtcdServer,
    postgres: PostgresServer,
}

/// A listener that accepts connections and never answers (nor closes them).
async fn silent() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
        }
    });
    addr
}

/// A listener that answers every connection with random bytes (a fixed seed), at once
/// and again after everything the client sends.
async fn garbage() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let mut seed = 0x5EED_u64;
        while let Ok((mut stream, _)) = listener.accept().await {
            seed = seed.wrapping_add(1);
            tokio::spawn(async move {
                let mut state = seed;
                let mut noise = move || {
                    (0..512)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            state as u8
                        })
                        .collect::<Vec<u8>>()
                };
                let mut buf = [0u8; 4096];
                if stream.write_all(&noise()).await.is_err() {
                    return;
                }
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&noise()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn places() -> Places {
    // The credential rows need servers with passwords.
    let (redis, etcd) = start_with_passwords(PASSWORD, PASSWORD).await;
    let postgres = PostgresServer::start().await.expect("postgres");
    postgres.require_local("the credential rows set a password");
    postgres
        .require_password("app", PASSWORD)
        .await
        .expect("the password of the role app");
    let busy = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    Places {
        closed: SocketAddr::from((
            [127, 0, 0, 1],
            tenure_integration::free_port().expect("port"),
        )),
        silent: silent().await,
        garbage: garbage().await,
        busy: busy.local_addr().expect("addr"),
        _busy: busy,
        redis,
        etcd,
        postgres,
    }
}

/// The input with placeholders filled in and escapes decoded.
fn expand(input: &str, places: &Places) -> String {
    let mut s = input
        .replace("{empty}", "")
        .replace("{closed}", &places.closed.to_string())
        .replace("{silent}", &places.silent.to_string())
        .replace("{garbage}", &places.garbage.to_string())
        .replace("{busy}", &places.busy.to_string())
        .replace("{redis-auth}", &places.redis.addr().to_string())
        .replace("{etcd-auth}", &places.etcd.addr().to_string())
        .replace("{postgres-auth}", &places.postgres.addr().to_string());
    while let Some(start) = s.find("{repeat:") {
        let end = start + s[start..].find('}').expect("closing }");
        let spec = &s[start + "{repeat:".len()..end];
        let (n, c) = spec.split_once(':').expect("{repeat:N:c}");
        let text = c.repeat(n.parse().expect("a count"));
        s.replace_range(start..=end, &text);
    }
    unescape(&s)
}

fn unescape(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('0') => out.push('\0'),
            Some('\\') => out.push('\\'),
            Some('u') => {
                let rest: String = chars.by_ref().take_while(|&c| c != '}').collect();
                let hex = rest.trim_start_matches('{');
                let code = u32::from_str_radix(hex, 16).expect("\\u{hex}");
                out.push(char::from_u32(code).expect("a char"));
            }
            other => panic!("unknown escape \\{other:?}"),
        }
    }
    out
}

fn timing(spec: &str) -> tenure_core::Result<()> {
    let mut fields = std::collections::BTreeMap::new();
    for pair in spec.split_whitespace() {
        let (k, v) = pair.split_once('=').expect("field=duration");
        fields.insert(k, parse_duration(v).expect("a duration"));
    }
    let mut t = Timing::from_ttl(
        fields
            .get("ttl")
            .copied()
            .unwrap_or(Duration::from_secs(10)),
    );
    for (k, v) in fields {
        match k {
            "ttl" => {}
            "renew_interval" => t.renew_interval = v,
            "renew_deadline" => t.renew_deadline = v,
            "connect_timeout" => t.connect_timeout = v,
            other => panic!("unknown timing field {other}"),
        }
    }
    t.validate()
}

/// Runs one row; `Ok(())` means the input was accepted.
async fn run(via: &str, input: String) -> tenure_core::Result<()> {
    match via {
        "election" => ElectionName::new(&input).map(drop),
        "candidate" => Candidate::new(&input).map(drop),
        "value" => Candidate::with_value("c1", &input).map(drop),
        "member" => Member::new(&input, "").map(drop),
        "timing" => timing(&input),
        "connect" => {
            let scheme = input.split("://").next().unwrap_or("").to_ascii_lowercase();
            match scheme.as_str() {
                "etcd" | "etcds" => EtcdBackend::from_url(&input).await.map(drop),
                "redis" | "rediss" => RedisBackend::from_url(&input).await.map(drop),
                "zk" => ZooKeeperBackend::from_url(&input).await.map(drop),
                "postgres" | "postgresql" => PostgresBackend::from_url(&input).await.map(drop),
                "peer" => PeerBackend::connect(&input).await.map(drop),
                // Azurite's published development key, so no credential is looked up.
                "azblob" => AzureConfig::from_url(&input)?
                    .shared_key(AzuriteServer::ACCOUNT_KEY)
                    .connect()
                    .await
                    .map(drop),
                _ => tenure_core::connect(&input).await.map(drop),
            }
        }
        "cli" => cli(&input).await,
        other => panic!("docs/bad-input.md: unknown via {other:?}"),
    }
}

/// Runs `tenure INPUT` (the words of the input as its arguments, `mem://` unless it
/// names a backend): `Ok(())` if it runs on for 3 s or exits 0, else the error its
/// one-line `tenure: <kind>: <message>` stands for, checked against its exit code
/// (2 for bad input, 1 otherwise).
async fn cli(input: &str) -> tenure_core::Result<()> {
    let mut child = tokio::process::Command::new(tenure_bin())
        .args(input.split(' '))
        .env_remove("TENURE_BACKEND")
        .env_remove("TENURE_METRICS_ADDR")
        .env_remove("TENURE_HEALTH_ADDR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start tenure");
    let mut stderr = child.stderr.take().expect("stderr");
    let Ok(status) = tokio::time::timeout(Duration::from_secs(3), child.wait()).await else {
        return Ok(());
    };
    let status = status.expect("wait for tenure");
    let mut text = String::new();
    stderr.read_to_string(&mut text).await.expect("read stderr");
    if status.success() {
        return Ok(());
    }
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "tenure {input}: not one line: {text}");
    let line = lines[0].strip_prefix("tenure: ").expect("tenure: …");
    let (name, message) = line.split_once(": ").expect("kind: message");
    let kind = match name {
        "invalid_argument" => ErrorKind::InvalidArgument,
        "unavailable" => ErrorKind::Unavailable,
        "timeout" => ErrorKind::Timeout,
        "unauthorized" => ErrorKind::Unauthorized,
        "closed" => ErrorKind::Closed,
        "unsupported" => ErrorKind::Unsupported,
        "backend" => ErrorKind::Backend,
        other => panic!("tenure {input}: unknown kind {other:?}: {text}"),
    };
    let code = if kind == ErrorKind::InvalidArgument {
        2
    } else {
        1
    };
    assert_eq!(status.code(), Some(code), "tenure {input}: {text}");
    Err(Error::new(kind, message))
}

/// The error as the CLI prints it.
fn describe(e: &Error) -> String {
    tenure_core::one_line(e)
}

/// The text of the innermost cause of `e` (the operating system's or the client's own
/// words), if it has a cause.
fn root_cause(e: &Error) -> Option<String> {
    let mut src = std::error::Error::source(e)?;
    while let Some(inner) = src.source() {
        src = inner;
    }
    Some(src.to_string().replace('\n', " "))
}

/// Why `text` (the one line of `e`) breaks the rule that every cause is printed once.
fn repeated_cause(e: &Error, text: &str) -> Option<String> {
    let root = root_cause(e)?;
    let n = text.matches(root.as_str()).count();
    (n != 1).then(|| format!("the cause {root:?} is printed {n} times"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_row_of_the_bad_input_table_holds() {
    let rows = rows();
    let places = places().await;
    // Built before the clock of the first `cli` row starts.
    tokio::task::spawn_blocking(tenure_bin)
        .await
        .expect("build tenure");
    let mut failures = Vec::new();
    let mut actual = Vec::new();
    for row in &rows {
        let input = expand(&row.input, &places);
        let started = Instant::now();
        let via = row.via.clone();
        let task = tokio::spawn(async move { run(&via, input).await });
        let limit = CONNECT_TIMEOUT + SLACK;
        let outcome = tokio::time::timeout(limit * 3, task).await;
        let took = started.elapsed();
        let at = format!(
            "docs/bad-input.md:{} ({} `{}`)",
            row.line, row.via, row.input
        );
        let result = match outcome {
            Err(_) => {
                failures.push(format!("{at}: no answer within {:?}", limit * 3));
                continue;
            }
            Ok(Err(join)) => {
                failures.push(format!("{at}: panicked: {join}"));
                continue;
            }
            Ok(Ok(result)) => result,
        };
        if took > limit {
            failures.push(format!(
                "{at}: answered after {took:?}, past the connect timeout"
            ));
        }
        match result {
            Ok(()) => failures.push(format!("{at}: accepted")),
            Err(e) => {
                let text = describe(&e);
                actual.push(format!("{at}: {:?} in {took:?}: {text}", e.kind()));
                if !row.kinds.contains(&e.kind()) {
                    failures.push(format!(
                        "{at}: {:?}, expected {:?}: {text}",
                        e.kind(),
                        row.kinds
                    ));
                }
                match &row.expect {
                    Expect::Any => {}
                    Expect::Contains(want) => {
                        let want = expand(want, &places);
                        if !text.contains(want.as_str()) {
                            failures.push(format!("{at}: message lacks {want:?}: {text}"));
                        }
                    }
                    Expect::Line(want) => {
                        let want = expand(want, &places);
                        if text != want {
                            failures.push(format!(
                                "{at}: the line is\n    {text}\nexpected\n    {want}"
                            ));
                        }
                    }
                }
                if let Some(why) = repeated_cause(&e, &text) {
                    failures.push(format!("{at}: {why}: {text}"));
                }
            }
        }
    }
    eprintln!("{}", actual.join("\n"));
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
