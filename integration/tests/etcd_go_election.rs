//! Interop with Go's etcd election recipe: the real `etcdctl elect` (etcd 3.5's, which
//! runs the Go client's `concurrency.Election`) and tenure candidates with `layout=go`
//! share one election on one etcd. Whoever created its key first leads, the other waits
//! and reads the leader's proposal, and the next in line is granted when the leader
//! resigns (SIGINT makes `etcdctl elect` resign) or its lease expires (SIGKILL). Then
//! the contract suite over the Go layout, as far as the layout allows.
//!
//! One etcd for the binary, a fresh election per test (they may run in parallel). A
//! missing `etcdctl` fails the tests with a message naming
//! `bash scripts/install-test-deps.sh`.

use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure_core::testing::Env;
use tenure_core::{Candidate, ElectionName, LeaderInfo, LeaderStream, Leadership, Session, Timing};
use tenure_etcd::EtcdBackend;
use tenure_integration::{
    check_fencing_at, etcdctl_program, monotonic_now_ns, run_prefix, EtcdServer, Event,
    SpawnedCampaign as Campaign,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::sync::mpsc;

tenure_integration::shared_server!(EtcdServer, "etcd");

/// How long a waiter must keep waiting to count as "not granted".
const QUIET: Duration = Duration::from_secs(2);
/// A bound for a handover by notification: far below both sides' TTLs (tenure 4 s, Go
/// 60 s), so meeting it means the waiter did not wait for an expiry. It takes
/// milliseconds.
const NOTIFICATION: Duration = Duration::from_secs(2);
/// A generous bound for things that take milliseconds (a process printing its key).
const PROMPT: Duration = Duration::from_secs(10);
/// The TTL of a Go `concurrency.Session` by default; `etcdctl elect` has no flag for it.
const GO_SESSION_TTL: Duration = Duration::from_secs(60);
/// tenure's session TTL in the interop tests.
const TTL: Duration = Duration::from_secs(4);

// ---------------------------------------------------------------------------------------
// Names, backends, sessions
// ---------------------------------------------------------------------------------------

/// The etcd URL of tenure's backend on `host` (`host:port`) with the Go layout.
fn url(host: &str, prefix: &str) -> String {
    let host = host.trim_start_matches("http://");
    format!(
        "etcd://{host}?layout=go&prefix={prefix}&connect_timeout_ms=2000&request_timeout_ms=2000"
    )
}

/// A fresh election for `test`: `go/<test>-<n>`.
fn election(test: &str) -> ElectionName {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    ElectionName::new(format!("go/{test}-{n}")).expect("election name")
}

/// The name Go (and `etcdctl elect`) gives the election that tenure calls `election`
/// under `prefix`.
fn go_name(prefix: &str, election: &ElectionName) -> String {
    format!("{}/{election}", prefix.trim_end_matches('/'))
}

async fn session_under(prefix: &str) -> Session {
    let backend = EtcdBackend::from_url(&url(&shared_server().0, prefix))
        .await
        .expect("tenure's etcd backend with layout=go");
    Session::open(Arc::new(backend), Timing::from_ttl(TTL))
        .await
        .expect("tenure session")
}

/// A session's lease id as Go writes it in its key (`%x`).
fn go_lease(session: &Session) -> String {
    let lease = u64::from_str_radix(&session.id(), 16).expect("an etcd session id is hex");
    format!("{lease:x}")
}

fn candidate(id: &str, value: &str) -> Candidate {
    Candidate::with_value(id, value).expect("candidate")
}

// ---------------------------------------------------------------------------------------
// etcdctl elect as a child process
// ---------------------------------------------------------------------------------------

/// A key as `etcdctl -w json elect` prints it: its own once elected, the leader's for
/// every change when listening (`-l`).
#[derive(Debug, Clone)]
struct GoKey {
    key: String,
    value: String,
    create_revision: u64,
    lease: i64,
    /// When the line was read (`CLOCK_MONOTONIC` ns).
    seen_ns: u64,
}

/// One `etcdctl elect` process; SIGKILLed if dropped.
struct Etcdctl {
    what: String,
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<(u64, String)>,
    stderr: Arc<Mutex<String>>,
}

impl Etcdctl {
    /// `etcdctl elect NAME PROPOSAL`: campaigns, prints its key once elected, and on
    /// SIGINT resigns (or, still waiting, withdraws) and exits.
    fn campaign(name: &str, proposal: &str) -> Etcdctl {
        Etcdctl::start(&["elect", name, proposal], format!("etcdctl elect {name}"))
    }

    /// `etcdctl elect -l NAME`: prints the leader's key whenever it changes.
    fn listen(name: &str) -> Etcdctl {
        Etcdctl::start(&["elect", "-l", name], format!("etcdctl elect -l {name}"))
    }

    fn start(args: &[&str], what: String) -> Etcdctl {
        let program = etcdctl_program().unwrap_or_else(|e| panic!("{e}"));
        let mut child = tokio::process::Command::new(program)
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", shared_server().0))
            .args(["-w", "json"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {what}: {e}"));
        let (tx, lines) = mpsc::unbounded_channel();
        let stdout = child.stdout.take().expect("piped stdout");
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send((monotonic_now_ns(), line)).is_err() {
                    return;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stderr.take().expect("piped stderr");
        let sink = stderr.clone();
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text).await;
            sink.lock().expect("stderr").push_str(&text);
        });
        Etcdctl {
            what,
            child,
            lines,
            stderr,
        }
    }

    /// The next key it prints, within `bound`.
    async fn next_key(&mut self, bound: Duration) -> GoKey {
        match tokio::time::timeout(bound, self.lines.recv()).await {
            Ok(Some((seen_ns, line))) => parse_key(&line, seen_ns)
                .unwrap_or_else(|| panic!("{}: unexpected output {line:?}", self.what)),
            Ok(None) => panic!(
                "{} exited without printing a key: {}",
                self.what,
                self.stderr_text()
            ),
            Err(_) => panic!("{} printed no key within {bound:?}", self.what),
        }
    }

    /// True if it printed nothing (was not elected, saw no change) for `quiet`.
    async fn silent_for(&mut self, quiet: Duration) -> bool {
        tokio::time::timeout(quiet, self.lines.recv())
            .await
            .is_err()
    }

    /// SIGINT: `etcdctl elect` cancels its campaign or resigns, then exits.
    fn interrupt(&self) {
        let pid = self.child.id().expect("etcdctl is running") as libc::pid_t;
        // SAFETY: kill(2) with a pid this test started and has not reaped.
        let sent = unsafe { libc::kill(pid, libc::SIGINT) };
        assert_eq!(sent, 0, "SIGINT to {}", self.what);
    }

    /// SIGKILL: its lease stays until etcd expires it.
    async fn kill(&mut self) {
        self.child.kill().await.expect("SIGKILL etcdctl");
    }

    async fn exit(&mut self, bound: Duration) -> ExitStatus {
        tokio::time::timeout(bound, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} did not exit within {bound:?}", self.what))
            .expect("wait for etcdctl")
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().expect("stderr").clone()
    }
}

/// A line of `etcdctl -w json` output with one key-value (keys and values in base64).
fn parse_key(line: &str, seen_ns: u64) -> Option<GoKey> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let kv = v.get("kvs")?.get(0)?;
    let text = |field: &str| match kv.get(field).and_then(|f| f.as_str()) {
        Some(b64) => base64_decode(b64).map(|b| String::from_utf8_lossy(&b).into_owned()),
        None => Some(String::new()), // empty values are left out
    };
    Some(GoKey {
        key: text("key")?,
        value: text("value")?,
        create_revision: kv.get("create_revision")?.as_u64()?,
        lease: kv.get("lease").and_then(|l| l.as_i64()).unwrap_or(0),
        seen_ns,
    })
}

/// Standard base64 with padding, as Go's `encoding/json` writes `[]byte`.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0u32);
    for c in text.bytes().filter(|c| *c != b'=') {
        bits = (bits << 6) | u32::from(digit(c)?);
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    Some(out)
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("bXllbC94").unwrap(), b"myel/x");
    assert_eq!(base64_decode("cHJvcCBvbmU=").unwrap(), b"prop one");
    assert_eq!(base64_decode("YQ==").unwrap(), b"a");
    assert!(base64_decode("a*").is_none());
}

// ---------------------------------------------------------------------------------------
// tenure campaigns in tasks
// ---------------------------------------------------------------------------------------

/// The next leader `observe` reports that satisfies `pred`, within `PROMPT`.
async fn observed(
    stream: &mut LeaderStream,
    pred: impl Fn(&Option<LeaderInfo>) -> bool,
) -> Option<LeaderInfo> {
    tenure_integration::next_leader_where(stream, PROMPT, pred).await
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

// ---------------------------------------------------------------------------------------
// etcdctl and tenure on one election
// ---------------------------------------------------------------------------------------

/// etcdctl leads; tenure waits behind it and reads its proposal as the leader's value,
/// its key's create revision as the token (Go's `Rev()`) and its lease as the id. An
/// interrupted etcdctl resigns, and tenure is granted within one notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_leads_then_tenure_takes_over_when_it_is_interrupted() {
    let prefix = run_prefix();
    let election = election("interrupt");
    let name = go_name(prefix, &election);
    let mut go = Etcdctl::campaign(&name, "go service a");
    let elected = go.next_key(PROMPT).await;
    assert_eq!(elected.key, format!("{name}/{:x}", elected.lease));
    assert_eq!(elected.value, "go service a");

    let session = session_under(prefix).await;
    let expect = LeaderInfo {
        id: format!("{:x}", elected.lease),
        value: "go service a".into(),
        token: tenure_core::FencingToken(elected.create_revision),
    };
    assert_eq!(
        session.leader(&election).await.expect("leader()"),
        Some(expect.clone())
    );
    let mut stream = session.observe(&election).await.expect("observe()");
    assert_eq!(observed(&mut stream, |_| true).await, Some(expect.clone()));

    let mut tenure = Campaign::spawn(&session, &election, candidate("tenure-a", "tenure a"));
    tokio::time::sleep(QUIET).await;
    assert!(
        !tenure.granted().await,
        "tenure was elected while etcdctl leads"
    );
    assert!(go.child.try_wait().expect("etcdctl status").is_none());
    assert_eq!(
        session.leader(&election).await.expect("leader()"),
        Some(expect)
    );

    let interrupted = Instant::now();
    go.interrupt();
    tenure.wait(NOTIFICATION).await;
    let leadership = tenure.into_leadership().expect("granted");
    eprintln!(
        "etcdctl interrupted -> tenure elected: {:.1} ms",
        millis(interrupted.elapsed())
    );
    assert!(leadership.is_leader());
    assert!(leadership.token().get() > elected.create_revision);
    let status = go.exit(PROMPT).await;
    assert!(
        status.success(),
        "etcdctl after SIGINT: {status}: {}",
        go.stderr_text()
    );
    let now = observed(&mut stream, |l| {
        l.as_ref().is_some_and(|l| l.value == "tenure a")
    })
    .await;
    assert_eq!(
        now.map(|l| (l.id, l.token)),
        Some((go_lease(&session), leadership.token()))
    );

    // Go reads tenure's key as the leader's.
    let mut listener = Etcdctl::listen(&name);
    let seen = listener.next_key(PROMPT).await;
    assert_eq!(seen.key, format!("{name}/{}", go_lease(&session)));
    assert_eq!(seen.value, "tenure a");
    assert_eq!(seen.create_revision, leadership.token().get());
    listener.interrupt();
    listener.exit(PROMPT).await;
    leadership.resign().await.expect("resign");
    session.close().await.expect("close");
}

/// etcdctl leads and is SIGKILLed: it cannot resign, so its key stays until etcd
/// expires its lease (Go's session TTL, 60 s); tenure is granted then, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_killed_then_tenure_takes_over_when_its_lease_expires() {
    let prefix = run_prefix();
    let election = election("kill");
    let name = go_name(prefix, &election);
    let mut go = Etcdctl::campaign(&name, "go service b");
    let elected = go.next_key(PROMPT).await;
    let session = session_under(prefix).await;
    let mut tenure = Campaign::spawn(&session, &election, candidate("tenure-b", "tenure b"));
    tokio::time::sleep(QUIET).await;
    assert!(
        !tenure.granted().await,
        "tenure was elected while etcdctl leads"
    );

    let killed = Instant::now();
    go.kill().await;
    tokio::time::sleep(QUIET).await;
    assert!(
        !tenure.granted().await,
        "tenure was elected before etcdctl's lease expired"
    );
    // Go renews every third of the TTL, so the lease goes 40-60 s after the kill, plus
    // up to 500 ms for etcd's expiry scan; then one notification.
    let bound = GO_SESSION_TTL + Duration::from_secs(1) + NOTIFICATION;
    tenure.wait(bound.saturating_sub(killed.elapsed())).await;
    let leadership = tenure.into_leadership().expect("granted");
    eprintln!(
        "etcdctl killed -> tenure elected: {:.1} s (Go session TTL {GO_SESSION_TTL:?})",
        killed.elapsed().as_secs_f64()
    );
    assert!(leadership.token().get() > elected.create_revision);
    let leader = session.leader(&election).await.expect("leader()");
    assert_eq!(leader.map(|l| l.value), Some("tenure b".to_string()));
    leadership.resign().await.expect("resign");
    session.close().await.expect("close");
}

/// tenure leads (under a prefix that starts with '/', as Go names often do); `etcdctl
/// elect` waits behind it and `etcdctl elect -l` shows tenure's value; when tenure
/// resigns, etcdctl is elected within one notification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenure_leads_then_etcdctl_takes_over_when_it_resigns() {
    let prefix = format!("/{}", run_prefix());
    let election = election("tenure-first");
    let name = go_name(&prefix, &election);
    let session = session_under(&prefix).await;
    let leadership = session
        .campaign(&election, &candidate("tenure-c", "tenure service c"))
        .await
        .expect("tenure leads an empty election");
    let token = leadership.token().get();

    let mut listener = Etcdctl::listen(&name);
    let seen = listener.next_key(PROMPT).await;
    assert_eq!(seen.key, format!("{name}/{}", go_lease(&session)));
    assert_eq!(seen.value, "tenure service c");
    assert_eq!(seen.create_revision, token, "Go's Rev() is tenure's token");

    let mut go = Etcdctl::campaign(&name, "go service c");
    assert!(
        go.silent_for(QUIET).await,
        "etcdctl was elected while tenure leads"
    );
    assert!(leadership.is_leader());
    assert!(
        listener.silent_for(Duration::ZERO).await,
        "the leader changed"
    );
    let mut stream = session.observe(&election).await.expect("observe()");
    let first = observed(&mut stream, |_| true).await;
    assert_eq!(first.map(|l| l.token.get()), Some(token));

    let resigned = Instant::now();
    leadership.resign().await.expect("resign");
    let elected = go.next_key(NOTIFICATION).await;
    eprintln!(
        "tenure resigned -> etcdctl elected: {:.1} ms",
        millis(resigned.elapsed())
    );
    assert_eq!(elected.value, "go service c");
    assert!(elected.create_revision > token);
    let seen = listener.next_key(PROMPT).await;
    assert_eq!(
        (seen.key, seen.value),
        (elected.key.clone(), "go service c".to_string())
    );
    let now = observed(&mut stream, |l| {
        l.as_ref().is_some_and(|l| l.value == "go service c")
    })
    .await;
    assert_eq!(
        now.map(|l| (l.id, l.token.get())),
        Some((format!("{:x}", elected.lease), elected.create_revision))
    );

    go.interrupt();
    let status = go.exit(PROMPT).await;
    assert!(
        status.success(),
        "etcdctl after SIGINT: {status}: {}",
        go.stderr_text()
    );
    listener.interrupt();
    listener.exit(PROMPT).await;
    session.close().await.expect("close");
}

/// etcdctl and tenure take turns, each campaigning while the other leads: the tenures
/// (etcdctl's from printing its key to the SIGINT that ends it, tenure's from grant to
/// resign) never overlap and the tokens (create revisions) grow with every grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_turns_never_show_two_leaders() {
    const ROUNDS: usize = 3;
    let prefix = run_prefix();
    let election = election("turns");
    let name = go_name(prefix, &election);
    let session = session_under(prefix).await;
    let (mut go_log, mut tenure_log) = (Vec::new(), Vec::new());
    let mut held: Option<Leadership> = None;
    // One leadership event of `who` with `token` at `at` (or now), in `log`.
    let note = |log: &mut Vec<Event>, kind: &str, who: &str, token: u64, at: Option<u64>| {
        let at = at.unwrap_or_else(monotonic_now_ns);
        log.push(Event::new(kind, &name, who, Some(token), at));
    };
    for round in 0..ROUNDS {
        let proposal = format!("go-{round}");
        let mut go = Etcdctl::campaign(&name, &proposal);
        if let Some(leadership) = held.take() {
            assert!(
                go.silent_for(QUIET / 4).await,
                "round {round}: etcdctl elected while tenure leads"
            );
            let token = leadership.token().get();
            note(&mut tenure_log, Event::RESIGNED, "tenure", token, None);
            leadership.resign().await.expect("resign");
        }
        let elected = go.next_key(NOTIFICATION).await;
        assert_eq!(elected.value, proposal);
        let (revision, seen) = (elected.create_revision, Some(elected.seen_ns));
        note(&mut go_log, Event::ELECTED, &proposal, revision, seen);

        let id = format!("tenure-{round}");
        let mut tenure = Campaign::spawn(&session, &election, candidate(&id, &id));
        tokio::time::sleep(QUIET / 4).await;
        assert!(
            !tenure.granted().await,
            "round {round}: tenure elected while etcdctl leads"
        );
        note(&mut go_log, Event::RESIGNED, &proposal, revision, None);
        go.interrupt();
        let granted = tenure.wait(NOTIFICATION).await.1;
        let leadership = tenure.into_leadership().expect("granted");
        let token = leadership.token().get();
        note(
            &mut tenure_log,
            Event::ELECTED,
            "tenure",
            token,
            Some(granted),
        );
        let status = go.exit(PROMPT).await;
        assert!(
            status.success(),
            "round {round}: etcdctl after SIGINT: {status}"
        );
        held = Some(leadership);
    }
    if let Some(leadership) = held {
        let token = leadership.token().get();
        note(&mut tenure_log, Event::RESIGNED, "tenure", token, None);
        leadership.resign().await.expect("resign");
    }
    assert_eq!(go_log.len(), 2 * ROUNDS);
    assert_eq!(tenure_log.len(), 2 * ROUNDS);
    let violations = check_fencing_at(&[go_log, tenure_log], monotonic_now_ns());
    assert!(
        violations.is_empty(),
        "{}",
        violations
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    );
    session.close().await.expect("close");
}

// ---------------------------------------------------------------------------------------
// The contract over the Go layout
// ---------------------------------------------------------------------------------------

/// The conformance env of `etcd_conformance.rs` with `layout=go`: TTL 2 s, a proxy to
/// cut a victim's connection, lease revocation for expiry.
async fn go_env() -> Env {
    let (endpoint, server) = shared_server();
    let prefix = run_prefix();
    tenure_integration::etcd_env(&endpoint, server, move |hosts| url(hosts, prefix)).await
}

// Every check that does not compare the leader's candidate id, which the Go layout does
// not store: clause 9 prints the reason the backend declares (the Go-layout version of
// it follows), and the batch and membership checks, which read the leader's id, are
// replaced below (batches) or not affected by the layout (members keep their keys; see
// etcd_conformance.rs).
tenure_core::conformance_tests!(@clauses_01_to_12 go_env());
tenure_core::conformance_tests!(@multi go_env();
    // Go's recipe has no priority: the layout does not declare clause 14, so this
    // checks that priorities and handovers are refused with Unsupported.
    clause_14_priority => check_priority,
    session_holds_many_elections => check_many_elections_one_session,
    session_resigns_seats_in_batches => check_batch_resign,
);

/// Clause 9 as the Go layout keeps it: `leader()` and `observe()` show the holder's
/// value, its token and, as the id, its lease id; an observer converges on the final
/// state and sees the seat free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clause_09_observe_with_the_lease_as_the_id() {
    let env = go_env().await;
    let election = env.election("observe-go");
    let s = env.session().await;
    assert_eq!(s.leader(&election).await.expect("leader"), None);
    let mut stream = s.observe(&election).await.expect("observe");
    assert_eq!(observed(&mut stream, |_| true).await, None);
    let mut last = None;
    for name in ["a", "b", "c"] {
        let si = env.session().await;
        let l = si
            .campaign(&election, &candidate(name, &format!("value-of-{name}")))
            .await
            .expect("campaign");
        if name == "c" {
            last = Some((l, si));
        } else {
            l.resign().await.expect("resign");
        }
    }
    let (c, sc) = last.expect("c leads");
    let expect = LeaderInfo {
        id: go_lease(&sc),
        value: "value-of-c".into(),
        token: c.token(),
    };
    let seen = observed(&mut stream, |l| {
        l.as_ref().is_some_and(|l| l.token >= c.token())
    })
    .await;
    assert_eq!(seen, Some(expect.clone()));
    assert_eq!(s.leader(&election).await.expect("leader"), Some(expect));
    c.resign().await.expect("resign");
    assert_eq!(observed(&mut stream, Option::is_none).await, None);
    drop(sc);
}

/// `try_campaign_many` over the Go layout: the free seats of a batch and only those,
/// each the holder's key (leader read back with this session's lease and the grant's
/// token), in few transactions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_takes_free_seats_in_batches_with_go_keys() {
    const SEATS: usize = 40;
    let env = go_env().await;
    let (sa, sb) = (env.session().await, env.session().await);
    let elections: Vec<ElectionName> = (0..SEATS)
        .map(|i| env.election(&format!("batch-go/{i:02}")))
        .collect();
    let taken = |i: usize| i % 7 == 3;
    let mut held = Vec::new();
    for (_, e) in elections.iter().enumerate().filter(|(i, _)| taken(*i)) {
        held.push(
            sa.campaign(e, &candidate("a", "va"))
                .await
                .expect("campaign"),
        );
    }
    let seats: Vec<(ElectionName, Candidate)> = elections
        .iter()
        .map(|e| (e.clone(), candidate("b", "vb")))
        .collect();
    let before = env.backend.election_requests().expect("counted");
    let got = sb
        .try_campaign_many(&seats)
        .await
        .expect("try_campaign_many");
    let used = env.backend.election_requests().expect("counted") - before;
    assert_eq!(got.len(), SEATS);
    for (i, answer) in got.iter().enumerate() {
        let leader = env.backend.leader(&elections[i]).await.expect("leader");
        match answer {
            None => {
                assert!(taken(i), "seat {i} was free but not granted");
                assert_eq!(leader.map(|l| l.id), Some(go_lease(&sa)), "seat {i}");
            }
            Some(l) => {
                assert!(!taken(i), "seat {i} is held by a but was granted to b");
                let expect = LeaderInfo {
                    id: go_lease(&sb),
                    value: "vb".into(),
                    token: l.token(),
                };
                assert_eq!(leader, Some(expect), "seat {i}");
            }
        }
    }
    assert!(
        used <= 4,
        "a batch of {SEATS} seats took {used} election requests"
    );
    for l in got.into_iter().flatten().chain(held) {
        l.resign().await.expect("resign");
    }
}

/// The names a user types, side by side: `etcdctl elect jobs-N/x` leads, and `tenure
/// campaign` with `layout=go` but no prefix and `--election jobs-N/x` is refused with
/// the way to name Go's election (with the default prefix it would have been Go's
/// `tenure/jobs-N/x`, and both would have led at once); with the prefix the message
/// gives (`prefix=jobs-N`, `--election x`) it waits while etcdctl leads and is elected
/// when etcdctl resigns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_with_layout_go_names_the_election_go_names() {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let jobs = format!(
        "jobs-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let go_election = format!("{jobs}/x");
    let mut go = Etcdctl::campaign(&go_election, "go worker");
    go.next_key(PROMPT).await;
    let host = shared_server().0.trim_start_matches("http://").to_string();
    let tenure = tenure_integration::cli_faults::tenure_bin();
    let args = |backend: String, election: &str| -> Vec<String> {
        [
            "campaign",
            "--backend",
            &backend,
            "--election",
            election,
            "--id",
            "t",
            "--ttl",
            "4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // What a user types first: refused, naming the prefix to set (before the fix it
    // campaigned in another key range and was elected beside etcdctl's leader).
    let mut first = tenure_integration::CandidateProcess::spawn(
        &tenure,
        &args(format!("etcd://{host}?layout=go"), &go_election),
        std::iter::empty::<(&str, &str)>(),
    )
    .expect("spawn tenure campaign");
    let status = first.wait_exit(PROMPT).await;
    assert!(
        !first.leads(),
        "tenure was elected beside etcdctl's leader of {go_election}"
    );
    let status = status.expect("tenure campaign exits");
    let stderr = first.stderr_tail();
    assert!(!status.success(), "layout=go without a prefix was taken");
    assert!(
        stderr.contains("layout=go needs the prefix set") && stderr.contains("prefix=jobs"),
        "{stderr}"
    );

    // What the message says to type: the same election as etcdctl's.
    let backend = format!("etcd://{host}?layout=go&prefix={jobs}");
    let mut ours = tenure_integration::CandidateProcess::spawn(
        &tenure,
        &args(backend, "x"),
        std::iter::empty::<(&str, &str)>(),
    )
    .expect("spawn tenure campaign");
    tokio::time::sleep(QUIET).await;
    assert!(
        !ours.leads(),
        "tenure was elected while etcdctl leads {go_election}"
    );
    go.interrupt();
    ours.wait_for_kind("elected", NOTIFICATION)
        .await
        .expect("tenure elected once etcdctl resigned");
    go.exit(PROMPT).await;
    ours.terminate().await.expect("stop tenure campaign");
}
