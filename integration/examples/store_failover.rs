//! How long a clustered store leaves a renewal unanswered when its own leader fails, at
//! the stores' production timing, and the shortest session TTL that rides that out.
//!
//! ```text
//! cargo run --release -p tenure-integration --example store_failover -- \
//!     [etcd|zookeeper|both] [--runs 5] [--ttl 5] [--pause 8] [--probes 6] [--faults stop,kill] \
//!     [--holders 3]
//! ```
//!
//! Each run starts a fresh 3-member cluster ([`ClusterTiming::Production`]: etcd at its
//! defaults, heartbeat 100 ms and election timeout 1 s; ZooKeeper with `tickTime`
//! 2000 ms, `initLimit` 5, `syncLimit` 2), opens `--probes` sessions with `--ttl` over
//! every member through the tenure backend (the URL a user writes), and has each renew
//! back to back (an etcd lease keep-alive; a ZooKeeper `exists` on the session's
//! connection, which is what a renewal is), each attempt cut after 1 s and sent again at
//! once. Then the store's leader is stopped (SIGSTOP for `--pause` seconds, then
//! SIGCONT) or killed (SIGKILL, restarted 10 s later). A probe's *unanswered time* is the
//! longest stretch between two answered renewals in the 20 s after the fault; the table
//! gives it per run (the worst probe; for ZooKeeper, the worst probe connected to the
//! leader and the worst connected to a follower) and when it began after the fault.
//!
//! For etcd stop runs it also reports whether a probe's lease was revoked, and the
//! paused member's own evidence: its count of leases it revoked as expired
//! (`etcd_debugging_server_lease_expired_total`) before and after, and its log lines
//! about revoking (the members log at `debug` here).
//!
//! Beside the probes, `--holders` elections are each held by a session of their own
//! through the core (`Session` with [`Timing::from_ttl`]`(--ttl)`, the default renewal
//! shares, or `--renew-interval` / `--renew-deadline` in seconds), campaigned for before
//! the fault; the holders table says per run how many kept their seat through the
//! fault and the 20 s after it, and for each loss its reason and when it fired after
//! the fault (for ZooKeeper, whether the holder's session was on the leader).
//!
//! The last table derives the shortest TTL whose renewal rule leaves the worst
//! unanswered time inside `renew_deadline − renew_interval` (a renewal sent just before
//! the fault is the last confirmed one; the deadline then falls `renew_deadline −
//! renew_interval` after the fault), for the core's defaults (every TTL/16, deadline
//! TTL × 7/8), the shares before them (TTL/4, TTL × 2/3) and one between.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tenure_core::backend::{BackendSession, SessionEvents};
use tenure_core::{Backend, Candidate, ElectionName, ErrorKind, Leadership, Session, Timing};
use tenure_integration::cluster_faults::ClusterTiming;
use tenure_integration::{EtcdCluster, Members, ZooKeeperEnsemble};

/// How long each renewal attempt may take before it is sent again.
const ATTEMPT: Duration = Duration::from_secs(1);
/// How long after the fault the probes are watched.
const WATCH: Duration = Duration::from_secs(20);
/// What an etcd member logs about revoking leases (etcd 3.5: `debug` and `warn`), and
/// the revocations it applied.
const REVOKE_LINES: [&str; 6] = [
    "The member is active, skip checking leadership",
    "Ignore the lease revoking request",
    "Current member isn't a leader",
    "Failed to check current member's leadership",
    "failed to revoke lease",
    "lease_revoke:<",
];

/// How long a killed leader stays down.
const KILLED_FOR: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Store {
    Etcd,
    ZooKeeper,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Fault {
    Stop,
    Kill,
}

struct Options {
    stores: Vec<Store>,
    faults: Vec<Fault>,
    runs: usize,
    ttl: Duration,
    pause: Duration,
    probes: usize,
    holders: usize,
    renew_interval: Option<Duration>,
    renew_deadline: Option<Duration>,
}

impl Options {
    /// The holders' timing: the core's defaults for `--ttl`, or the given shares.
    fn timing(&self) -> Timing {
        let mut t = Timing::from_ttl(self.ttl);
        if let Some(i) = self.renew_interval {
            t.renew_interval = i;
        }
        if let Some(d) = self.renew_deadline {
            t.renew_deadline = d;
        }
        if let Err(e) = t.validate() {
            usage(&format!("holders' timing {t:?}: {e}"));
        }
        t
    }
}

/// What became of one election holder over a run.
struct HolderResult {
    on_leader: Option<bool>,
    /// The loss: its reason and when it fired after the fault (negative: before).
    lost: Option<(String, f64)>,
}

/// One probe's record: (sent, answered) of each answered renewal, and the errors.
#[derive(Default)]
struct Record {
    answers: Vec<(Instant, Instant)>,
    /// The store's answer that the session is gone: when, and what it said.
    expired: Option<(Instant, String)>,
    errors: usize,
}

/// The result of one probe over one run.
struct ProbeResult {
    on_leader: Option<bool>,
    /// The longest stretch without an answer in the window, and when it began
    /// relative to the fault (negative: before it).
    gap: Duration,
    gap_from: f64,
    expired: Option<String>,
}

struct RunResult {
    store: Store,
    fault: Fault,
    run: usize,
    probes: Vec<ProbeResult>,
    version: String,
    /// etcd, stop runs: leases the paused member revoked as expired (before, after),
    /// and its log lines about revoking.
    revoked: Option<(u64, u64)>,
    revoke_lines: Vec<String>,
    holders: Vec<HolderResult>,
}

fn usage(why: &str) -> ! {
    eprintln!("store_failover: {why}");
    eprintln!(
        "usage: store_failover [etcd|zookeeper|both] [--runs N] [--ttl S] [--pause S] \
         [--probes N] [--faults stop,kill] [--holders N] [--renew-interval S] \
         [--renew-deadline S]"
    );
    std::process::exit(2)
}

fn parse() -> Options {
    let mut o = Options {
        stores: vec![Store::Etcd, Store::ZooKeeper],
        faults: vec![Fault::Stop, Fault::Kill],
        runs: 5,
        ttl: Duration::from_secs(5),
        pause: Duration::from_secs(8),
        probes: 6,
        holders: 3,
        renew_interval: None,
        renew_deadline: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{arg} needs a value")))
        };
        let number = |v: String| -> f64 {
            match v.parse::<f64>() {
                Ok(n) if n > 0.0 && n.is_finite() => n,
                _ => usage(&format!("{arg}: {v:?} is not a positive number")),
            }
        };
        match arg.as_str() {
            "etcd" => o.stores = vec![Store::Etcd],
            "zookeeper" => o.stores = vec![Store::ZooKeeper],
            "both" => o.stores = vec![Store::Etcd, Store::ZooKeeper],
            "--runs" => o.runs = number(value()) as usize,
            "--ttl" => o.ttl = Duration::from_secs_f64(number(value())),
            "--pause" => o.pause = Duration::from_secs_f64(number(value())),
            "--probes" => o.probes = number(value()) as usize,
            "--holders" => o.holders = number(value()) as usize,
            "--renew-interval" => o.renew_interval = Some(Duration::from_secs_f64(number(value()))),
            "--renew-deadline" => o.renew_deadline = Some(Duration::from_secs_f64(number(value()))),
            "--faults" => {
                o.faults = value()
                    .split(',')
                    .map(|f| match f {
                        "stop" => Fault::Stop,
                        "kill" => Fault::Kill,
                        other => usage(&format!("unknown fault {other:?} (stop, kill)")),
                    })
                    .collect()
            }
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    o
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let o = parse();
    let mut results = Vec::new();
    for &store in &o.stores {
        for &fault in &o.faults {
            for run in 1..=o.runs {
                let r = one_run(store, fault, run, &o).await;
                print_run(&r);
                results.push(r);
            }
        }
    }
    print_tables(&results, &o);
}

/// A cluster of either store, with what a run needs of it.
enum Cluster {
    Etcd(EtcdCluster),
    ZooKeeper(ZooKeeperEnsemble),
}

impl Cluster {
    async fn start(store: Store) -> Cluster {
        let timing = ClusterTiming::Production;
        match store {
            Store::Etcd => Cluster::Etcd(
                EtcdCluster::start_logging(3, timing, "debug")
                    .await
                    .unwrap_or_else(|e| panic!("start the etcd cluster: {e}")),
            ),
            Store::ZooKeeper => Cluster::ZooKeeper(
                ZooKeeperEnsemble::start_with(3, timing)
                    .await
                    .unwrap_or_else(|e| panic!("start the ZooKeeper ensemble: {e}")),
            ),
        }
    }

    fn members(&mut self) -> &mut Members {
        match self {
            Cluster::Etcd(c) => c,
            Cluster::ZooKeeper(e) => e,
        }
    }

    async fn leader(&self) -> usize {
        let leader = match self {
            Cluster::Etcd(c) => c.wait_leader().await,
            Cluster::ZooKeeper(e) => e.wait_leader().await,
        };
        leader.unwrap_or_else(|e| panic!("the store's leader: {e}"))
    }

    async fn backend(&self) -> Arc<dyn Backend> {
        match self {
            Cluster::Etcd(c) => {
                let url = format!("etcd://{}?prefix=failover", c.hosts());
                Arc::new(
                    tenure_etcd::EtcdBackend::from_url(&url)
                        .await
                        .unwrap_or_else(|e| panic!("connect {url}: {e}")),
                )
            }
            Cluster::ZooKeeper(e) => {
                let url = format!("zk://{}/failover", e.hosts());
                Arc::new(
                    tenure_zookeeper::ZooKeeperBackend::from_url(&url)
                        .await
                        .unwrap_or_else(|e| panic!("connect {url}: {e}")),
                )
            }
        }
    }

    async fn version(&self) -> String {
        match self {
            Cluster::Etcd(c) => c.version(0).await.unwrap_or_else(|e| e.to_string()),
            Cluster::ZooKeeper(e) => {
                let srvr = e.srvr(0).await.unwrap_or_else(|e| e.to_string());
                let line = srvr.lines().next().unwrap_or("");
                let version = line.trim_start_matches("Zookeeper version: ");
                version
                    .split([',', '-'])
                    .next()
                    .unwrap_or(version)
                    .to_string()
            }
        }
    }

    /// Which member serves `session` now (ZooKeeper; etcd's keep-alives go to whichever
    /// member answers first).
    async fn serving(&self, session: &str) -> Option<usize> {
        match self {
            Cluster::Etcd(_) => None,
            Cluster::ZooKeeper(e) => e.serving(session).await.ok().flatten(),
        }
    }
}

async fn one_run(store: Store, fault: Fault, run: usize, o: &Options) -> RunResult {
    let mut cluster = Cluster::start(store).await;
    let backend = cluster.backend().await;
    let mut sessions = Vec::new();
    for _ in 0..o.probes {
        let (events, _rx) = SessionEvents::channel();
        let session = backend
            .open_session(o.ttl, events)
            .await
            .unwrap_or_else(|e| panic!("open a session with TTL {:?}: {e}", o.ttl));
        sessions.push((session, _rx));
    }
    // The election holders, each on a session of its own through the core.
    let mut holders: Vec<(Session, Leadership)> = Vec::new();
    for h in 0..o.holders {
        let session = Session::open(backend.clone(), o.timing())
            .await
            .unwrap_or_else(|e| panic!("open a holder's session: {e}"));
        let election = ElectionName::new(format!("failover/holder-{h}")).expect("name");
        let candidate = Candidate::new(format!("holder-{h}")).expect("candidate");
        let leadership = session
            .campaign(&election, &candidate)
            .await
            .unwrap_or_else(|e| panic!("campaign for {election}: {e}"));
        holders.push((session, leadership));
    }
    let leader = cluster.leader().await;
    // Settle: every probe renews for 2 s first.
    let records: Vec<Arc<Mutex<Record>>> = sessions
        .iter()
        .map(|_| Arc::new(Mutex::new(Record::default())))
        .collect();
    let stop = tenure_core::CancellationToken::new();
    let mut tasks = Vec::new();
    for ((session, _), record) in sessions.iter().zip(&records) {
        tasks.push(tokio::spawn(probe(
            session.clone(),
            record.clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut on_leader = Vec::new();
    for (session, _) in &sessions {
        on_leader.push(cluster.serving(session.id()).await.map(|m| m == leader));
    }
    let mut holder_on_leader = Vec::new();
    for (session, _) in &holders {
        holder_on_leader.push(cluster.serving(&session.id()).await.map(|m| m == leader));
    }
    let version = cluster.version().await;
    let revoked_before = match &cluster {
        Cluster::Etcd(c) => c.leases_expired(leader).await.ok(),
        Cluster::ZooKeeper(_) => None,
    };
    let fault_at = Instant::now();
    let fault_at_tokio = tokio::time::Instant::now();
    let mut resumed_at = None;
    match fault {
        Fault::Stop => {
            cluster.members().pause(leader).expect("pause the leader");
            tokio::time::sleep(o.pause).await;
            cluster.members().resume(leader).expect("resume the leader");
            resumed_at = Some(second_of_day(std::time::SystemTime::now()));
            tokio::time::sleep(WATCH.saturating_sub(fault_at.elapsed())).await;
        }
        Fault::Kill => {
            cluster
                .members()
                .kill(leader)
                .await
                .expect("kill the leader");
            tokio::time::sleep(KILLED_FOR).await;
            cluster
                .members()
                .restart(leader)
                .await
                .expect("restart the leader");
            tokio::time::sleep(WATCH.saturating_sub(fault_at.elapsed())).await;
        }
    }
    stop.cancel();
    for t in tasks {
        let _ = t.await;
    }
    let (revoked, revoke_lines) = match (&cluster, fault) {
        (Cluster::Etcd(c), Fault::Stop) => {
            let after = c.leases_expired(leader).await.ok();
            // What the paused member's log says about revoking from half a second
            // before its resume to 3 s after (read before the probes close their
            // sessions, which revokes their leases too): each kind of line with its
            // count, the first and the last.
            let mut lines = Vec::new();
            for needle in REVOKE_LINES {
                let found: Vec<String> = c
                    .log_lines(leader, &[needle])
                    .into_iter()
                    .filter(|line| {
                        let (Some(at), Some(resumed)) = (logged_at(line), resumed_at) else {
                            return false;
                        };
                        at >= resumed - 0.5 && at <= resumed + 3.0
                    })
                    .collect();
                match found.as_slice() {
                    [] => {}
                    [one] => lines.push(format!("1× {one}")),
                    [first, .., last] => {
                        lines.push(format!("{}× first {first}", found.len()));
                        lines.push(format!("   last {last}"));
                    }
                }
            }
            if let Some(resumed) = resumed_at {
                // The member's id: etcd's request ids (the `header:<ID:…>` of a
                // proposal) start with its low 16 bits, so they say which member
                // proposed a revocation.
                let id = c
                    .log_lines(leader, &["\"starting local member\""])
                    .first()
                    .and_then(|line| line.split("\"local-member-id\":\"").nth(1))
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or("?")
                    .to_string();
                lines.insert(
                    0,
                    format!(
                        "(member {leader}, id {id}, resumed at {} UTC)",
                        clock(resumed)
                    ),
                );
            }
            (revoked_before.zip(after), lines)
        }
        _ => (None, Vec::new()),
    };
    let probes = records
        .iter()
        .zip(on_leader)
        .map(|(record, on_leader)| {
            let record = record.lock().expect("record");
            let (gap, gap_from) = longest_gap(&record.answers, fault_at, record.expired.is_some());
            ProbeResult {
                on_leader,
                gap,
                gap_from,
                expired: record.expired.as_ref().map(|(at, why)| {
                    format!(
                        "{why} ({:+.2} s after the fault)",
                        secs_since(*at, fault_at)
                    )
                }),
            }
        })
        .collect();
    let holders = holders
        .into_iter()
        .zip(holder_on_leader)
        .map(|((session, leadership), on_leader)| {
            let lost = leadership.loss_reason().map(|why| {
                let at = leadership.lost_at().unwrap_or(fault_at_tokio);
                let after = if at >= fault_at_tokio {
                    (at - fault_at_tokio).as_secs_f64()
                } else {
                    -(fault_at_tokio - at).as_secs_f64()
                };
                (format!("{why:?}"), after)
            });
            drop(leadership);
            drop(session);
            HolderResult { on_leader, lost }
        })
        .collect();
    for (session, _) in &sessions {
        let _ = tokio::time::timeout(Duration::from_secs(2), session.close()).await;
    }
    RunResult {
        store,
        fault,
        run,
        probes,
        version,
        revoked,
        revoke_lines,
        holders,
    }
}

/// Seconds since midnight UTC of `at`.
fn second_of_day(at: std::time::SystemTime) -> f64 {
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    since % 86_400.0
}

/// `HH:MM:SS.ffffff` of seconds since midnight.
fn clock(second: f64) -> String {
    let whole = second as u64;
    format!(
        "{:02}:{:02}:{:09.6}",
        whole / 3600,
        whole / 60 % 60,
        second % 60.0
    )
}

/// Seconds since midnight UTC of an etcd zap log line's `"ts":"…THH:MM:SS.ffffffZ"`.
fn logged_at(line: &str) -> Option<f64> {
    let ts = line.split("\"ts\":\"").nth(1)?;
    let (_, time) = ts.split_once('T')?;
    let (time, _) = time.split_once('Z')?;
    let mut parts = time.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// Renews `session` back to back until `stop`, each attempt cut after [`ATTEMPT`].
async fn probe(
    session: Arc<dyn BackendSession>,
    record: Arc<Mutex<Record>>,
    stop: tenure_core::CancellationToken,
) {
    while !stop.is_cancelled() {
        let sent = Instant::now();
        match tokio::time::timeout(ATTEMPT, session.keep_alive()).await {
            Ok(Ok(())) => {
                let answered = Instant::now();
                record
                    .lock()
                    .expect("record")
                    .answers
                    .push((sent, answered));
            }
            Ok(Err(e)) if e.kind() == ErrorKind::SessionExpired => {
                let mut record = record.lock().expect("record");
                // The store answered: the stretch without an answer ends here.
                record.answers.push((sent, Instant::now()));
                record.expired = Some((Instant::now(), e.to_string()));
                return;
            }
            Ok(Err(_)) => {
                record.lock().expect("record").errors += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(_) => record.lock().expect("record").errors += 1,
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The longest stretch from one answer to the next (from the send of the last
/// answered renewal before it, which is what the renew deadline counts from), among
/// answers from 2 s before `fault` to [`WATCH`] after it, and when it began relative
/// to `fault`. A probe whose session `ended` is not counted past its end.
fn longest_gap(answers: &[(Instant, Instant)], fault: Instant, ended: bool) -> (Duration, f64) {
    let from = fault - Duration::from_secs(2);
    let until = fault + WATCH;
    let window: Vec<&(Instant, Instant)> = answers
        .iter()
        .filter(|(_, a)| *a >= from && *a <= until)
        .collect();
    let mut best = (Duration::ZERO, 0.0);
    for pair in window.windows(2) {
        let (sent, _) = pair[0];
        let (_, answered) = pair[1];
        let gap = answered.saturating_duration_since(*sent);
        if gap > best.0 {
            best = (gap, secs_since(*sent, fault));
        }
    }
    // A probe that never answered again after the fault: its gap runs to the end.
    if let Some((sent, _)) = window.last() {
        let open = until.saturating_duration_since(*sent);
        if !ended && open > best.0 && until <= Instant::now() {
            best = (open, secs_since(*sent, fault));
        }
    }
    best
}

/// Seconds from `since` to `at` (negative when `at` is earlier).
fn secs_since(at: Instant, since: Instant) -> f64 {
    if at >= since {
        at.duration_since(since).as_secs_f64()
    } else {
        -since.duration_since(at).as_secs_f64()
    }
}

fn store_name(s: Store) -> &'static str {
    match s {
        Store::Etcd => "etcd",
        Store::ZooKeeper => "ZooKeeper",
    }
}

fn fault_name(f: Fault, o: &Options) -> String {
    match f {
        Fault::Stop => format!("SIGSTOP {} s", o.pause.as_secs_f64()),
        Fault::Kill => "SIGKILL".to_string(),
    }
}

fn print_run(r: &RunResult) {
    let gaps: Vec<String> = r
        .probes
        .iter()
        .map(|p| {
            let place = match p.on_leader {
                Some(true) => "L",
                Some(false) => "F",
                None => "",
            };
            let expired = if p.expired.is_some() { " ENDED" } else { "" };
            format!(
                "{place}{:.2}s@{:+.2}{expired}",
                p.gap.as_secs_f64(),
                p.gap_from
            )
        })
        .collect();
    println!(
        "{} {} {:?} run {}: probes (longest unanswered @ its start after the fault): {}",
        store_name(r.store),
        r.version,
        r.fault,
        r.run,
        gaps.join("  ")
    );
    if let Some((before, after)) = r.revoked {
        println!("  paused member revoked as expired: {before} before, {after} after");
    }
    for p in &r.probes {
        if let Some(why) = &p.expired {
            println!("  a probe's session ended: {why}");
        }
    }
    for line in &r.revoke_lines {
        println!("  log: {line}");
    }
    for h in &r.holders {
        if let Some((why, after)) = &h.lost {
            println!(
                "  a holder{} lost its seat: {why} ({after:+.2} s after the fault)",
                place(h.on_leader)
            );
        }
    }
}

/// Where a ZooKeeper session was when the fault came.
fn place(on_leader: Option<bool>) -> &'static str {
    match on_leader {
        Some(true) => " on the leader",
        Some(false) => " on a follower",
        None => "",
    }
}

fn worst<'a>(probes: impl Iterator<Item = &'a ProbeResult>) -> Option<&'a ProbeResult> {
    probes.max_by(|a, b| a.gap.cmp(&b.gap))
}

fn cell(p: Option<&ProbeResult>) -> String {
    match p {
        Some(p) => format!(
            "{:.2} s (from {:+.1} s){}",
            p.gap.as_secs_f64(),
            p.gap_from,
            if p.expired.is_some() {
                ", then ended"
            } else {
                ""
            }
        ),
        None => "–".to_string(),
    }
}

fn print_tables(results: &[RunResult], o: &Options) {
    println!();
    println!(
        "Longest time a renewal went unanswered after a fault on the store's leader \
         (3 members at production timing, {} probe sessions, TTL {} s, attempts cut after {} s):",
        o.probes,
        o.ttl.as_secs_f64(),
        ATTEMPT.as_secs_f64()
    );
    println!();
    println!("| store | fault | run | worst probe | worst on the leader | worst on a follower | sessions ended | leases the paused member revoked |");
    println!("|---|---|---:|---|---|---|---:|---|");
    for r in results {
        let on = |leader: bool| worst(r.probes.iter().filter(move |p| p.on_leader == Some(leader)));
        let split = r.store == Store::ZooKeeper;
        let revoked = match r.revoked {
            Some((b, a)) => format!("{}", a.saturating_sub(b)),
            None => "–".to_string(),
        };
        let ended = r.probes.iter().filter(|p| p.expired.is_some()).count();
        println!(
            "| {} {} | {} | {} | {} | {} | {} | {ended} of {} | {} |",
            store_name(r.store),
            r.version,
            fault_name(r.fault, o),
            r.run,
            cell(worst(r.probes.iter())),
            if split { cell(on(true)) } else { "–".into() },
            if split { cell(on(false)) } else { "–".into() },
            r.probes.len(),
            revoked
        );
    }
    if o.holders > 0 {
        let t = o.timing();
        println!();
        println!(
            "Election holders through the core ({} per run, each on its own session; TTL {:?}, \
             renew every {:?}, deadline {:?}):",
            o.holders, t.ttl, t.renew_interval, t.renew_deadline
        );
        println!();
        println!("| store | fault | run | kept their seat | losses (reason, when after the fault) | leases the paused member revoked |");
        println!("|---|---|---:|---:|---|---|");
        for r in results {
            let kept = r.holders.iter().filter(|h| h.lost.is_none()).count();
            let losses: Vec<String> = r
                .holders
                .iter()
                .filter_map(|h| {
                    h.lost
                        .as_ref()
                        .map(|(why, after)| format!("{why}{} {after:+.2} s", place(h.on_leader)))
                })
                .collect();
            let revoked = match r.revoked {
                Some((b, a)) => format!("{}", a.saturating_sub(b)),
                None => "–".to_string(),
            };
            println!(
                "| {} {} | {} | {} | {kept} of {} | {} | {revoked} |",
                store_name(r.store),
                r.version,
                fault_name(r.fault, o),
                r.run,
                r.holders.len(),
                if losses.is_empty() {
                    "–".to_string()
                } else {
                    losses.join("; ")
                }
            );
        }
    }
    println!();
    println!("Shortest TTL whose renewals ride out the worst unanswered time U (renew_deadline − renew_interval ≥ U):");
    println!();
    println!("| store | fault | U (worst of the runs) | TTL/4, deadline 2/3 (the shares before) | TTL/8, deadline 7/8 | TTL/16, deadline 7/8 (the core's defaults) |");
    println!("|---|---|---|---:|---:|---:|");
    for &store in &o.stores {
        for &fault in &o.faults {
            let u = results
                .iter()
                .filter(|r| r.store == store && r.fault == fault)
                .flat_map(|r| r.probes.iter())
                .map(|p| p.gap)
                .max()
                .unwrap_or_default()
                .as_secs_f64();
            let floor =
                |interval: f64, deadline: f64| format!("{:.1} s", u / (deadline - interval));
            println!(
                "| {} | {} | {u:.2} s | {} | {} | {} |",
                store_name(store),
                fault_name(fault, o),
                floor(0.25, 2.0 / 3.0),
                floor(0.125, 0.875),
                floor(1.0 / 16.0, 0.875)
            );
        }
    }
}
