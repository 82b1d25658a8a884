//! The conformance suite: one `async fn check_…` per clause of the election contract
//! (`docs/contract.md`). Every backend's tests call them all through [`conformance_tests!`](crate::conformance_tests),
//! passing an [`Env`]. A clause the backend declares unsupported in its
//! [`Capabilities`] is reported (printed with the reason), never silently passed.
//!
//! The checks panic on failure: they are test code.

pub mod config;
pub mod primitives;

mod lost_at_grant;
mod release;
pub use lost_at_grant::{LoseIf, LostAtGrant, LOST_AT_GRANT};
pub use release::check_failed_resign;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Capabilities, Clause};
use crate::{
    Candidate, DynBackend, ElectionName, ErrorKind, FencingToken, LeaderRunner, Leadership,
    LeadershipEvent, LeadershipWatch, LossReason, Member, MemberStream, MemoryBackend, ResignCause,
    Session, StepDownReason, Timing,
};

/// What a check needs: the backend, the timing to use, a random election prefix so
/// checks can run in parallel against one store, fault hooks and the slack a real
/// server needs on time bounds.
pub struct Env {
    /// The backend under test.
    pub backend: DynBackend,
    /// Timing for every session the checks open (short TTLs keep the suite fast).
    pub timing: Timing,
    /// A prefix unique to this run; every election name starts with it.
    pub prefix: String,
    /// Fault hooks.
    pub faults: Arc<dyn Faults>,
    /// Extra time allowed on liveness bounds (scheduling, server latency).
    pub slack: Duration,
    /// Anything that must live as long as the env (e.g. a server process).
    pub guard: Option<Box<dyn Any + Send + Sync>>,
}

impl Env {
    /// An env with no fault hooks, a random prefix and 200 ms of slack.
    pub fn new(backend: DynBackend, timing: Timing) -> Self {
        Env {
            backend,
            timing,
            prefix: random_prefix(),
            faults: Arc::new(NoFaults),
            slack: Duration::from_millis(200),
            guard: None,
        }
    }

    /// The in-memory backend with its own fault hooks and short timings
    /// (TTL 1 s, renew every 100 ms, deadline 600 ms).
    pub fn memory() -> Self {
        let backend = MemoryBackend::new();
        let mut env = Env::new(Arc::new(backend.clone()), memory_timing());
        env.faults = Arc::new(backend);
        env
    }

    /// The backend's election request count once it has stopped moving (unchanged over
    /// 150 ms, waiting 5 s at the most), so that a check's window of counted requests
    /// starts after the campaigns started before it have queued; `None` where the
    /// backend does not count.
    pub async fn quiet_election_requests(&self) -> Option<u64> {
        const STILL: Duration = Duration::from_millis(150);
        let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut last = self.backend.election_requests()?;
        loop {
            tokio::time::sleep(STILL).await;
            let now = self.backend.election_requests()?;
            if now == last || tokio::time::Instant::now() >= give_up {
                return Some(now);
            }
            last = now;
        }
    }

    /// An election name under this env's prefix.
    pub fn election(&self, name: &str) -> ElectionName {
        match ElectionName::new(format!("{}/{name}", self.prefix)) {
            Ok(e) => e,
            Err(e) => panic!("test election name: {e}"),
        }
    }

    /// Open a session with the env's timing on the env's backend.
    pub async fn session(&self) -> Session {
        self.session_on(self.backend.clone()).await
    }

    /// Open a session with the env's timing on `backend`.
    pub async fn session_on(&self, backend: DynBackend) -> Session {
        match Session::open(backend, self.timing.clone()).await {
            Ok(s) => s,
            Err(e) => panic!("open session: {e}"),
        }
    }

    fn caps(&self) -> Capabilities {
        self.backend.capabilities()
    }

    /// Print why a clause is skipped and return true if it is.
    /// [`election`](Self::election) `name` for a check of `clause`; `None` (reported)
    /// if the backend declares that the clause does not hold.
    fn election_for(&self, clause: Clause, name: &str) -> Option<ElectionName> {
        (!self.not_applicable(clause)).then(|| self.election(name))
    }

    fn not_applicable(&self, clause: Clause) -> bool {
        match self.caps().supports(clause) {
            Ok(()) => false,
            Err(why) => {
                eprintln!(
                    "contract clause {} ({clause:?}) not applicable on {}: {why}",
                    clause.number(),
                    self.backend.scheme()
                );
                true
            }
        }
    }

    /// How long a waiter may take to be granted after a resign.
    fn handover_bound(&self) -> Duration {
        self.caps().handover_poll.unwrap_or_default() + self.timing.ttl / 2 + self.slack
    }
}

/// Timings the in-memory suite uses.
pub fn memory_timing() -> Timing {
    let mut t = Timing::from_ttl(Duration::from_secs(1));
    t.renew_interval = Duration::from_millis(100);
    t.renew_deadline = Duration::from_millis(600);
    t.connect_timeout = Duration::from_secs(1);
    t
}

/// A random election prefix like `t-5f3a9c21d0e4b7a8`.
pub fn random_prefix() -> String {
    let a = (crate::backend::random_unit() * (1u64 << 52) as f64) as u64;
    let b = std::process::id() as u64;
    format!("t-{:013x}{:05x}", a, b & 0xfffff)
}

/// Ways to hurt a session, supplied per backend. A method returning `Err(reason)`
/// means the backend's tests cannot inject that fault; the check that needs it prints
/// the reason and stops.
#[async_trait]
pub trait Faults: Send + Sync {
    /// A backend instance whose connection [`disconnect`](Self::disconnect) can cut
    /// without affecting the env's main backend.
    async fn victim_backend(&self, env: &Env) -> Result<DynBackend, String> {
        Ok(env.backend.clone())
    }
    /// Make `session`'s requests stop reaching the store (a partition).
    async fn disconnect(&self, session: &Session) -> Result<(), String>;
    /// Undo [`disconnect`](Self::disconnect).
    async fn reconnect(&self, session: &Session) -> Result<(), String>;
    /// Make the store expire `session` now.
    async fn expire(&self, session: &Session) -> Result<(), String>;
}

/// No fault injection.
pub struct NoFaults;

#[async_trait]
impl Faults for NoFaults {
    async fn disconnect(&self, _: &Session) -> Result<(), String> {
        Err("this backend's tests inject no faults".into())
    }
    async fn reconnect(&self, _: &Session) -> Result<(), String> {
        Err("this backend's tests inject no faults".into())
    }
    async fn expire(&self, _: &Session) -> Result<(), String> {
        Err("this backend's tests inject no faults".into())
    }
}

#[async_trait]
impl Faults for MemoryBackend {
    async fn disconnect(&self, session: &Session) -> Result<(), String> {
        self.stall_session(&session.id())
            .then_some(())
            .ok_or_else(|| "no such session".into())
    }
    async fn reconnect(&self, session: &Session) -> Result<(), String> {
        // The session may have expired meanwhile, which is fine.
        self.unstall_session(&session.id());
        Ok(())
    }
    async fn expire(&self, session: &Session) -> Result<(), String> {
        self.expire_session(&session.id())
            .then_some(())
            .ok_or_else(|| "no such session".into())
    }
}

fn cand(id: &str) -> Candidate {
    match Candidate::with_value(id, format!("value-of-{id}")) {
        Ok(c) => c,
        Err(e) => panic!("candidate: {e}"),
    }
}

async fn campaign(s: &Session, e: &ElectionName, c: &Candidate) -> Leadership {
    match s.campaign(e, c).await {
        Ok(l) => l,
        Err(err) => panic!("campaign {e} as {}: {err}", c.id()),
    }
}

/// Candidate "a" holds `election` on one new session; candidate "b" waits for it on
/// another, in a task.
async fn held_and_awaited(
    env: &Env,
    election: &ElectionName,
) -> (Session, Leadership, tokio::task::JoinHandle<Leadership>) {
    let (sa, sb) = (env.session().await, env.session().await);
    let a = campaign(&sa, election, &cand("a")).await;
    let election = election.clone();
    let waiter = tokio::spawn(async move { campaign(&sb, &election, &cand("b")).await });
    (sa, a, waiter)
}

async fn within<T>(limit: Duration, what: &str, fut: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// One grant as seen by its holder: [granted, lost].
#[derive(Clone, Debug)]
pub struct Interval {
    /// Who held it.
    pub holder: String,
    /// The grant's token.
    pub token: FencingToken,
    /// When the holder received the grant.
    pub start: Instant,
    /// When its lost signal fired (for a missed deadline, the deadline).
    pub end: Instant,
}

/// Panics if two intervals overlap or tokens do not strictly increase in grant order.
pub fn assert_intervals_disjoint(mut intervals: Vec<Interval>) {
    intervals.sort_by_key(|i| i.start);
    for w in intervals.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        assert!(
            a.end <= b.start,
            "two holders at once: {a:?} ends after {b:?} starts (clause 1)"
        );
        assert!(
            a.token < b.token,
            "tokens do not increase: {a:?} then {b:?} (clause 2)"
        );
    }
}

/// Clause 1: concurrent candidates that campaign, hold and resign never overlap.
pub async fn check_at_most_one_holder(env: &Env) {
    let Some(election) = env.election_for(Clause::AtMostOneHolder, "one-holder") else {
        return;
    };
    let intervals = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let session = env.session().await;
        let election = election.clone();
        let intervals = intervals.clone();
        tasks.push(tokio::spawn(async move {
            let me = cand(&format!("c{i}"));
            for round in 0..3u64 {
                let l = campaign(&session, &election, &me).await;
                assert!(l.is_leader());
                let start = l.granted_at();
                tokio::time::sleep(Duration::from_millis(5 + (i * 7 + round * 3) % 20)).await;
                assert!(l.is_leader(), "lost the seat while holding it");
                let token = l.token();
                let state = l.state.clone();
                if round % 2 == 0 {
                    l.resign().await.expect("resign");
                } else {
                    drop(l);
                }
                let end = state
                    .reason()
                    .map(|(_, at)| *at)
                    .expect("lost signal fired");
                intervals.lock().unwrap().push(Interval {
                    holder: me.id().to_string(),
                    token,
                    start,
                    end,
                });
            }
            session.close().await.expect("close");
        }));
    }
    for t in tasks {
        within(Duration::from_secs(60), "candidates", t)
            .await
            .expect("candidate task");
    }
    let intervals = intervals.lock().unwrap().clone();
    assert_eq!(intervals.len(), 12);
    assert_intervals_disjoint(intervals);
}

/// Clause 2: tokens strictly increase across resigns, sessions, try-campaigns and
/// session closes.
pub async fn check_monotonic_tokens(env: &Env) {
    let Some(election) = env.election_for(Clause::MonotonicTokens, "tokens") else {
        return;
    };
    let (s1, s2) = (env.session().await, env.session().await);
    let (a, b) = (cand("a"), cand("b"));
    let mut tokens = Vec::new();
    let l = campaign(&s1, &election, &a).await;
    tokens.push(l.token());
    l.resign().await.expect("resign");
    let l = campaign(&s2, &election, &b).await;
    tokens.push(l.token());
    l.resign().await.expect("resign");
    let l = s1
        .try_campaign(&election, &a)
        .await
        .expect("try_campaign")
        .expect("seat is free");
    tokens.push(l.token());
    assert!(
        s2.try_campaign(&election, &b).await.expect("try").is_none(),
        "try_campaign took a held seat"
    );
    drop(l); // resigns in the background
    let l = campaign(&s2, &election, &b).await;
    tokens.push(l.token());
    s2.close().await.expect("close");
    assert!(!l.is_leader(), "leadership survived closing its session");
    let s3 = env.session().await;
    let l = campaign(&s3, &election, &a).await;
    tokens.push(l.token());
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not strictly increasing: {tokens:?}"
    );
    let info = s1.leader(&election).await.expect("leader");
    assert_eq!(info.map(|i| i.token), Some(l.token()));
}

/// Clause 3: once lost, a leadership never becomes valid again; a new grant has a new,
/// higher token.
pub async fn check_lost_is_final(env: &Env) {
    let Some(election) = env.election_for(Clause::LostIsFinal, "final") else {
        return;
    };
    let s = env.session().await;
    let me = cand("a");
    let first = campaign(&s, &election, &me).await;
    let first_state = first.state.clone();
    let lost = first.lost();
    first.resign().await.expect("resign");
    assert!(lost.is_cancelled());
    assert_eq!(
        first_state.reason().map(|r| r.0.clone()),
        Some(LossReason::Resigned)
    );
    let second = campaign(&s, &election, &me).await;
    assert!(second.token() > first_state.token);
    assert!(first_state.is_lost(), "an old grant came back to life");

    // After the store expires the session, the core opens a new one and the old grant
    // stays lost.
    let gen = s.generation();
    match env.faults.expire(&s).await {
        Err(why) => eprintln!(
            "clause 3 expiry part skipped on {}: {why}",
            env.backend.scheme()
        ),
        Ok(()) => {
            let reason = within(
                env.timing.ttl + env.slack,
                "lost after expiry",
                second.lost_wait(),
            )
            .await;
            assert!(
                matches!(reason, LossReason::SessionExpired | LossReason::Revoked(_)),
                "unexpected reason {reason:?}"
            );
            let third = within(
                env.timing.ttl * 2 + env.slack,
                "campaign after expiry",
                campaign(&s, &election, &me),
            )
            .await;
            assert!(s.generation() > gen, "session was not re-opened: gen {gen} now {} id {} tokens {:?} {:?} reason {reason:?}", s.generation(), s.id(), second.token(), third.token());
            assert!(third.token() > second.token());
            assert!(!second.is_leader());
            assert!(third.is_leader());
        }
    }
}

/// Clause 4: after a pause past the deadline (a GC-like stop of the whole thread),
/// `is_leader()` is false before any timer runs. Run on a current-thread runtime so
/// that the pause stops renewals too.
pub async fn check_is_leader_honest_without_io(env: &Env) {
    let Some(election) = env.election_for(Clause::HonestIsLeader, "honest") else {
        return;
    };
    let s = env.session().await;
    let l = campaign(&s, &election, &cand("a")).await;
    assert!(l.is_leader());
    let deadline = l.deadline();
    // Block the thread: no task, timer or renewal runs.
    std::thread::sleep(
        deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(30),
    );
    assert!(!l.is_leader(), "is_leader() true after the deadline passed");
    assert_eq!(l.loss_reason(), Some(LossReason::DeadlineExceeded));
    assert_eq!(l.lost_at(), Some(deadline));
    tokio::task::yield_now().await;
    tokio::time::sleep(env.timing.renew_interval).await;
    assert!(!l.is_leader(), "lost is not final");
    // The seat is released, so someone else gets it.
    let other = env.session().await;
    let o = within(
        env.timing.ttl + env.handover_bound(),
        "seat after a paused holder",
        campaign(&other, &election, &cand("b")),
    )
    .await;
    assert!(o.token() > l.token());
}

/// Clause 5: after `resign()`, a waiting candidate is granted quickly (far below a TTL).
pub async fn check_graceful_handover(env: &Env) {
    let Some(election) = env.election_for(Clause::GracefulHandover, "handover") else {
        return;
    };
    let (_sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiter.is_finished(),
        "waiter granted while the seat was held"
    );
    let a_state = a.state.clone();
    let t0 = Instant::now();
    a.resign().await.expect("resign");
    let b = within(env.handover_bound(), "handover after resign", waiter)
        .await
        .expect("waiter");
    let gap = b.granted_at() - t0;
    assert!(
        a_state.reason().map(|r| r.1) <= Some(b.granted_at()),
        "successor granted before the holder's lost signal"
    );
    assert!(b.token() > a_state.token);
    eprintln!("handover on {}: {gap:?}", env.backend.scheme());
}

/// Clause 6: a holder that dies without resigning is replaced within TTL + one
/// interval, and its lost signal fires before the successor is granted.
pub async fn check_crash_failover(env: &Env) {
    let Some(election) = env.election_for(Clause::CrashFailover, "crash") else {
        return;
    };
    let (sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t0 = Instant::now();
    sa.abandon();
    let bound = env.timing.ttl
        + env.timing.retry.max
        + env.caps().handover_poll.unwrap_or_default()
        + env.slack;
    let b = within(bound, "failover after crash", waiter)
        .await
        .expect("waiter");
    assert!(b.granted_at() - t0 <= bound);
    assert!(!a.is_leader());
    assert!(
        a.lost_at().is_some_and(|at| at <= b.granted_at()),
        "crashed holder's grant outlived the successor's start: {:?} vs {:?}",
        a.lost_at(),
        b.granted_at()
    );
    assert!(b.token() > a.token());
}

/// Clause 7: when the seat frees up, the number of store requests does not grow with
/// the number of waiters.
pub async fn check_no_herd(env: &Env) {
    if env.not_applicable(Clause::NoHerd) {
        return;
    }
    let Some(_) = env.backend.election_requests() else {
        eprintln!(
            "clause 7 not checked on {}: the backend does not count requests",
            env.backend.scheme()
        );
        return;
    };
    let election = env.election("herd");
    let sa = env.session().await;
    let a = campaign(&sa, &election, &cand("a")).await;
    let granted = Arc::new(AtomicU64::new(0));
    let mut waiters = Vec::new();
    for i in 0..8 {
        let s = env.session().await;
        let election = election.clone();
        let granted = granted.clone();
        waiters.push(tokio::spawn(async move {
            let l = campaign(&s, &election, &cand(&format!("w{i}"))).await;
            granted.fetch_add(1, Ordering::SeqCst);
            // Hold until the test ends.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop((l, s));
        }));
    }
    let before = env.quiet_election_requests().await.unwrap_or(0);
    a.resign().await.expect("resign");
    within(env.handover_bound(), "one waiter granted", async {
        while granted.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = env.backend.election_requests().unwrap_or(0);
    assert_eq!(
        granted.load(Ordering::SeqCst),
        1,
        "more than one waiter granted"
    );
    assert!(
        after - before <= 4,
        "{} store requests for one handover to one of 8 waiters (herd)",
        after - before
    );
    for w in waiters {
        w.abort();
    }
}

/// Clause 8: a short disconnect keeps leadership; a long one fires the lost signal
/// before anyone else is granted; after reconnecting, the campaign goes on by itself.
pub async fn check_connection_loss(env: &Env) {
    if env.not_applicable(Clause::ConnectionLoss) {
        return;
    }
    let victim = match env.faults.victim_backend(env).await {
        Ok(b) => b,
        Err(why) => return eprintln!("clause 8 not checked on {}: {why}", env.backend.scheme()),
    };
    let election = env.election("disconnect");
    let sa = env.session_on(victim).await;
    let mut runner = LeaderRunner::new(sa.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone(), |ctx| async move {
        ctx.cancelled().await;
        Ok::<(), String>(())
    }));
    let first_token = within(
        env.handover_bound(),
        "runner elected",
        next_elected(&mut events),
    )
    .await;

    // Short: well within the deadline.
    let short = (env.timing.renew_deadline - env.timing.renew_interval) / 3;
    if let Err(why) = env.faults.disconnect(&sa).await {
        stop.cancel();
        return eprintln!("clause 8 not checked on {}: {why}", env.backend.scheme());
    }
    tokio::time::sleep(short).await;
    env.faults.reconnect(&sa).await.expect("reconnect");
    tokio::time::sleep(env.timing.renew_interval * 2).await;
    assert!(
        events.try_recv().is_err(),
        "a disconnect of {short:?} (< renew deadline) ended leadership"
    );

    // Long: past the TTL, so the store frees the seat for a waiter.
    let sb = env.session().await;
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move { (campaign(&sb, &election, &cand("b")).await, sb) })
    };
    env.faults.disconnect(&sa).await.expect("disconnect");
    let lost_at = within(
        env.timing.ttl + env.slack,
        "lost signal after a long disconnect",
        async {
            loop {
                match events.recv().await {
                    Some(LeadershipEvent::Lost { at, .. }) => break at,
                    Some(_) => continue,
                    None => panic!("runner stopped"),
                }
            }
        },
    )
    .await;
    let (b, sb) = within(
        env.timing.ttl * 2 + env.slack,
        "waiter granted after holder disconnected",
        waiter,
    )
    .await
    .expect("waiter");
    assert!(
        lost_at <= b.granted_at(),
        "successor granted before the holder's lost signal"
    );
    env.faults.reconnect(&sa).await.expect("reconnect");
    b.resign().await.expect("resign");
    let again = within(
        env.timing.ttl * 2 + env.handover_bound(),
        "campaign goes on after reconnect",
        next_elected(&mut events),
    )
    .await;
    assert!(again > first_token);
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
    drop(sb);
}

async fn next_elected(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<LeadershipEvent>,
) -> FencingToken {
    loop {
        match events.recv().await {
            Some(LeadershipEvent::Elected { token, .. }) => return token,
            Some(_) => continue,
            None => panic!("runner stopped before being elected"),
        }
    }
}

/// Clause 9: `leader()` and `observe()` show the current holder; an observer converges
/// on the final state.
pub async fn check_observe(env: &Env) {
    let Some(election) = env.election_for(Clause::Observe, "observe") else {
        return;
    };
    let s = env.session().await;
    assert_eq!(s.leader(&election).await.expect("leader"), None);
    let mut stream = s.observe(&election).await.expect("observe");
    let first = within(env.handover_bound(), "first observed state", stream.next())
        .await
        .expect("stream ended")
        .expect("observe item");
    assert_eq!(first, None);
    let mut last = None;
    for name in ["a", "b", "c"] {
        let si = env.session().await;
        let l = campaign(&si, &election, &cand(name)).await;
        if name != "c" {
            l.resign().await.expect("resign");
        } else {
            last = Some((l, si));
        }
    }
    let (c, sc) = last.expect("c leads");
    let expect = crate::LeaderInfo {
        id: "c".into(),
        value: "value-of-c".into(),
        token: c.token(),
    };
    let bound = env.handover_bound() + env.caps().observe_poll.unwrap_or_default();
    within(bound, "observer sees the final leader", async {
        loop {
            let item = stream.next().await.expect("stream ended").expect("item");
            if item.as_ref() == Some(&expect) {
                break;
            }
            if let Some(i) = &item {
                assert!(
                    i.token <= expect.token,
                    "observed a token from the future: {i:?}"
                );
            }
        }
    })
    .await;
    assert_eq!(s.leader(&election).await.expect("leader"), Some(expect));
    c.resign().await.expect("resign");
    within(bound, "observer sees the seat free", async {
        while stream
            .next()
            .await
            .expect("stream ended")
            .expect("item")
            .is_some()
        {}
    })
    .await;
    drop(sc);
}

/// Clause 10: the runner campaigns, runs the task, resigns when it ends and campaigns
/// again; shutdown resigns promptly.
pub async fn check_run_when_leader(env: &Env) {
    let Some(election) = env.election_for(Clause::RunWhenLeader, "runner") else {
        return;
    };
    let s = env.session().await;
    let mut runner = LeaderRunner::new(s.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let runs = Arc::new(AtomicU64::new(0));
    let counter = runs.clone();
    let run = tokio::spawn(runner.run(stop.clone(), move |ctx| {
        let counter = counter.clone();
        async move {
            let n = counter.fetch_add(1, Ordering::SeqCst);
            if n < 2 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(())
            } else {
                ctx.cancelled().await;
                Ok::<(), String>(())
            }
        }
    }));
    let mut tokens = Vec::new();
    let mut finished = 0;
    within(env.handover_bound() * 4, "three terms", async {
        while tokens.len() < 3 {
            match events.recv().await.expect("events") {
                LeadershipEvent::Elected { token, .. } => tokens.push(token),
                LeadershipEvent::Resigned {
                    cause: ResignCause::TaskFinished,
                    ..
                } => finished += 1,
                LeadershipEvent::Lost { reason, .. } => panic!("lost: {reason}"),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(finished, 2);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    // A waiter gets the seat promptly after shutdown.
    let other = env.session().await;
    let waiter = {
        let election = election.clone();
        tokio::spawn(async move { (campaign(&other, &election, &cand("b")).await, other) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
    let resigned = loop {
        match events.recv().await {
            Some(LeadershipEvent::Resigned { cause, .. }) => break cause,
            Some(_) => continue,
            None => panic!("no resigned event"),
        }
    };
    assert_eq!(resigned, ResignCause::Shutdown);
    let (b, _other) = within(env.handover_bound(), "seat after runner shutdown", waiter)
        .await
        .expect("waiter");
    assert!(b.token() > tokens[2]);
}

/// Clause 11: a task that misses its heartbeat is cancelled and the runner resigns; a
/// task that heartbeats keeps the seat.
pub async fn check_stall_detection(env: &Env) {
    let Some(election) = env.election_for(Clause::StallDetection, "stall") else {
        return;
    };
    let s = env.session().await;
    let stall = Duration::from_millis(150);
    let mut runner = LeaderRunner::new(s.clone(), election.clone(), cand("a")).stall_timeout(stall);
    let mut events = runner.subscribe();
    let stop = CancellationToken::new();
    let terms = Arc::new(AtomicU64::new(0));
    let cancelled = Arc::new(AtomicU64::new(0));
    let (t, c) = (terms.clone(), cancelled.clone());
    let run = tokio::spawn(runner.run(stop.clone(), move |ctx| {
        let (t, c) = (t.clone(), c.clone());
        async move {
            let term = t.fetch_add(1, Ordering::SeqCst);
            if term == 0 {
                // Hung: never heartbeats.
                ctx.cancelled().await;
                c.fetch_add(1, Ordering::SeqCst);
            } else {
                // Healthy: heartbeats until cancelled.
                loop {
                    ctx.heartbeat();
                    tokio::select! {
                        _ = ctx.cancelled() => break,
                        _ = tokio::time::sleep(stall / 5) => {}
                    }
                }
            }
            Ok::<(), String>(())
        }
    }));
    let cause = within(stall * 4 + env.handover_bound(), "stall detected", async {
        loop {
            match events.recv().await.expect("events") {
                LeadershipEvent::Resigned { cause, .. } => break cause,
                LeadershipEvent::Lost { reason, .. } => panic!("lost: {reason}"),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(cause, ResignCause::Stalled);
    within(env.handover_bound(), "stalled task cancelled", async {
        while cancelled.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    within(
        env.handover_bound() * 2,
        "re-elected after a stall",
        next_elected(&mut events),
    )
    .await;
    tokio::time::sleep(stall * 4).await;
    while let Ok(ev) = events.try_recv() {
        assert!(
            !matches!(
                ev,
                LeadershipEvent::Resigned { .. } | LeadershipEvent::Lost { .. }
            ),
            "a heartbeating task was stopped: {ev:?}"
        );
    }
    stop.cancel();
    within(env.handover_bound(), "runner shutdown", run)
        .await
        .expect("runner task")
        .expect("runner");
}

/// Clause 12: bad input gives `InvalidArgument` naming the field; nothing panics.
pub async fn check_bad_input(env: &Env) {
    if env.not_applicable(Clause::Errors) {
        return;
    }
    for bad in [
        "",
        "/x",
        "x/",
        "a//b",
        "a/../b",
        "a b",
        "ü",
        &"n".repeat(300),
    ] {
        let e = ElectionName::new(bad).expect_err(bad);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    }
    for bad in ["", "a b", "tab\t"] {
        assert_eq!(
            Candidate::new(bad).expect_err(bad).kind(),
            ErrorKind::InvalidArgument
        );
    }
    let cases: Vec<(&str, Timing)> = vec![
        (
            "ttl",
            Timing {
                ttl: Duration::ZERO,
                ..env.timing.clone()
            },
        ),
        (
            "renew_interval",
            Timing {
                renew_interval: env.timing.ttl,
                ..env.timing.clone()
            },
        ),
        (
            "renew_deadline",
            Timing {
                renew_deadline: env.timing.ttl,
                ..env.timing.clone()
            },
        ),
        (
            "connect_timeout",
            Timing {
                connect_timeout: Duration::ZERO,
                ..env.timing.clone()
            },
        ),
    ];
    for (field, timing) in cases {
        let e = Session::open(env.backend.clone(), timing)
            .await
            .expect_err(field);
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    }
    // One candidacy per election per session.
    let election = env.election("bad-input");
    let s = env.session().await;
    let l = campaign(&s, &election, &cand("a")).await;
    let e = s
        .campaign(&election, &cand("a"))
        .await
        .expect_err("second campaign");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    l.resign().await.expect("resign");
}

/// Not a numbered clause but part of the session definition: one session holds many
/// elections and keeps them all with one renewal stream.
pub async fn check_many_elections_one_session(env: &Env) {
    let s = env.session().await;
    let me = cand("many");
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(campaign(&s, &env.election(&format!("many/{i:03}")), &me).await);
    }
    tokio::time::sleep(env.timing.renew_deadline + env.timing.renew_interval).await;
    assert!(
        held.iter().all(Leadership::is_leader),
        "a grant lapsed while the session renewed"
    );
    let tokens: Vec<_> = held.iter().map(Leadership::token).collect();
    for l in held {
        l.resign().await.expect("resign");
    }
    assert_eq!(tokens.len(), 100);
}

/// Not a numbered clause but part of the session definition: `try_campaign_many` takes
/// the free seats of a batch and only those (partial success: seats another session
/// holds stay its own), each grant a leadership with its own token as from
/// `try_campaign`; a store that declares [`Capabilities::batch`] asks in round trips,
/// not seat by seat; a bad batch is refused whole.
pub async fn check_batch_campaign(env: &Env) {
    const SEATS: usize = 40;
    let (sa, sb) = (env.session().await, env.session().await);
    let elections: Vec<ElectionName> = (0..SEATS)
        .map(|i| env.election(&format!("batch/{i:02}")))
        .collect();
    let taken = |i: usize| i % 7 == 3;
    let mut held = Vec::new();
    for (i, election) in elections.iter().enumerate().filter(|(i, _)| taken(*i)) {
        held.push((i, campaign(&sa, election, &cand("a")).await));
    }
    let seats: Vec<(ElectionName, Candidate)> =
        elections.iter().map(|e| (e.clone(), cand("b"))).collect();
    let before = env.backend.election_requests();
    let got = sb
        .try_campaign_many(&seats)
        .await
        .expect("try_campaign_many");
    let after = env.backend.election_requests();
    assert_eq!(got.len(), SEATS, "one answer per seat");
    for (i, answer) in got.iter().enumerate() {
        match answer {
            None => assert!(taken(i), "seat {i} was free but not granted"),
            Some(l) => {
                assert!(!taken(i), "seat {i} is held by a but was granted to b");
                assert!(l.is_leader(), "seat {i}: granted but not leading");
                assert_eq!(l.election(), &elections[i]);
                let leader = env.backend.leader(&elections[i]).await.expect("leader");
                assert_eq!(
                    leader.map(|info| (info.id, info.token)),
                    Some(("b".to_string(), l.token())),
                    "seat {i}: the store names another leader or token"
                );
            }
        }
    }
    for (i, l) in &held {
        assert!(l.is_leader(), "a lost seat {i} to b's batch");
        let leader = env.backend.leader(&elections[*i]).await.expect("leader");
        assert_eq!(
            leader.map(|info| info.id),
            Some("a".to_string()),
            "seat {i}"
        );
    }
    let granted = got.iter().flatten().count();
    if let (Some(batch), Some(before), Some(after)) = (env.caps().batch, before, after) {
        // A few round trips a chunk (ZooKeeper's are the most: read the queues, create,
        // read back, withdraw the losers, and two more to make missing directories),
        // plus at most one notification registration per grant; seat by seat would be
        // at least one request per seat and its registration.
        let bound = 6 * SEATS.div_ceil(batch) + granted;
        let used = usize::try_from(after - before).unwrap_or(usize::MAX);
        assert!(
            used <= bound,
            "a batch of {SEATS} seats took {used} election requests (at most {bound} with batches of {batch})"
        );
        eprintln!(
            "batch of {SEATS} on {}: {used} election requests",
            env.backend.scheme()
        );
    }
    // A seat b now holds, or the same election twice, refuses the whole batch.
    let free = env.election("batch/free");
    let again = [(elections[0].clone(), cand("b")), (free.clone(), cand("b"))];
    let err = sb.try_campaign_many(&again).await.err().map(|e| e.kind());
    assert_eq!(
        err,
        Some(ErrorKind::InvalidArgument),
        "a batch with a held seat"
    );
    let twice = [(free.clone(), cand("b")), (free.clone(), cand("b"))];
    let err = sb.try_campaign_many(&twice).await.err().map(|e| e.kind());
    assert_eq!(
        err,
        Some(ErrorKind::InvalidArgument),
        "a batch naming a seat twice"
    );
    assert_eq!(
        env.backend.leader(&free).await.expect("leader"),
        None,
        "a refused batch took a seat"
    );
    for l in got.into_iter().flatten() {
        l.resign().await.expect("resign");
    }
}

/// Not a numbered clause but part of the session definition: `resign_many` resigns a
/// batch as `resign` does each seat: every lost signal fires (`Resigned`), every seat is
/// free afterwards or granted to its waiter with a greater token, a store that declares
/// [`Capabilities::batch`] releases them in round trips, not seat by seat; a leadership
/// of another session in the batch is resigned through its own session.
pub async fn check_batch_resign(env: &Env) {
    const SEATS: usize = 24;
    let (sa, sb) = (env.session().await, env.session().await);
    let elections: Vec<ElectionName> = (0..SEATS)
        .map(|i| env.election(&format!("resign-batch/{i:02}")))
        .collect();
    let seats: Vec<(ElectionName, Candidate)> =
        elections.iter().map(|e| (e.clone(), cand("a"))).collect();
    let held: Vec<Leadership> = sa
        .try_campaign_many(&seats)
        .await
        .expect("try_campaign_many")
        .into_iter()
        .enumerate()
        .map(|(i, l)| l.unwrap_or_else(|| panic!("free seat {i} not granted")))
        .collect();
    let watches: Vec<LeadershipWatch> = held.iter().map(Leadership::watch).collect();
    let first_token = held[0].token();
    let waiter = {
        let (sb, e) = (sb.clone(), elections[0].clone());
        tokio::spawn(async move { campaign(&sb, &e, &cand("b")).await })
    };
    let foreign_seat = env.election("resign-batch/foreign");
    let foreign = campaign(&sb, &foreign_seat, &cand("b")).await;
    let foreign_watch = foreign.watch();
    let mut batch = held;
    batch.push(foreign);
    // The waiter queues beside the foreign campaign: its requests are not the batch's.
    let before = env.quiet_election_requests().await;
    sa.resign_many(batch).await.expect("resign_many");
    let after = env.backend.election_requests();
    for (i, w) in watches.iter().chain([&foreign_watch]).enumerate() {
        assert!(!w.is_leader(), "seat {i}: still leading after resign_many");
        assert_eq!(w.loss_reason(), Some(LossReason::Resigned), "seat {i}");
    }
    let next = within(env.timing.ttl, "the waiter of a resigned seat", waiter)
        .await
        .expect("waiter task");
    assert!(
        next.token() > first_token,
        "the waiter's token must be greater"
    );
    for (i, election) in elections
        .iter()
        .enumerate()
        .skip(1)
        .chain([(SEATS, &foreign_seat)])
    {
        let leader = env.backend.leader(election).await.expect("leader");
        assert_eq!(leader, None, "seat {i}: not free after resign_many");
    }
    if let (Some(batch), Some(before), Some(after)) = (env.caps().batch, before, after) {
        // One round trip a chunk, the foreign seat's own resign, and slack for the
        // waiter's wake-up.
        let bound = 2 * SEATS.div_ceil(batch) + 3;
        let used = usize::try_from(after - before).unwrap_or(usize::MAX);
        assert!(
            used <= bound,
            "resigning {SEATS} seats took {used} election requests (at most {bound} with batches of {batch})"
        );
    }
    next.resign().await.expect("resign");
}

fn member(id: &str, value: &str) -> Member {
    match Member::new(id, value) {
        Ok(m) => m,
        Err(e) => panic!("member: {e}"),
    }
}

fn ids_values(list: &[Member]) -> Vec<(String, String)> {
    list.iter()
        .map(|m| (m.id().to_string(), m.value().to_string()))
        .collect()
}

/// Read `stream` until a list equals `want` (as (id, value) pairs, sorted by id);
/// panics, saying `what`, if it does not within `bound` or the stream yields an error.
pub async fn watch_until(
    stream: &mut MemberStream,
    want: &[(&str, &str)],
    bound: Duration,
    what: &str,
) {
    watch_for(stream, want, bound, what, false).await
}

/// [`watch_until`] that reads past errors (while the store is unreachable, a stream
/// yields them and goes on).
async fn watch_for(
    stream: &mut MemberStream,
    want: &[(&str, &str)],
    bound: Duration,
    what: &str,
    errors_ok: bool,
) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect();
    let mut last = None;
    let found = tokio::time::timeout(bound, async {
        while let Some(item) = stream.next().await {
            let list = match item {
                Ok(l) => l,
                Err(e) if errors_ok => {
                    last = Some(vec![("error".to_string(), e.to_string())]);
                    continue;
                }
                Err(e) => panic!("{what}: member stream error: {e}"),
            };
            let got = ids_values(&list);
            if got == want {
                return true;
            }
            last = Some(got);
        }
        false
    })
    .await;
    match found {
        Ok(true) => {}
        Ok(false) => panic!("{what}: member stream ended; last list {last:?}, wanted {want:?}"),
        Err(_) => panic!("{what}: not seen within {bound:?}; last list {last:?}, wanted {want:?}"),
    }
}

/// Poll `members` until it equals `want` (reads may lag a watch for a moment).
async fn members_until(s: &Session, ns: &ElectionName, want: &[(&str, &str)], bound: Duration) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(i, v)| (i.to_string(), v.to_string()))
        .collect();
    let t0 = Instant::now();
    loop {
        let got = ids_values(&s.members(ns).await.expect("members"));
        if got == want {
            return;
        }
        assert!(
            t0.elapsed() <= bound,
            "members() is {got:?} after {bound:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Clause 13 (membership): members registered through sessions are listed and watched
/// (joins, value changes, unregistering, a closed session, a crashed session), the
/// latest registration of an id wins, namespaces are separate from each other and from
/// elections, and a session re-opened after expiry registers its members again.
pub async fn check_membership(env: &Env) {
    let Some(ns) = env.election_for(Clause::Membership, "ns") else {
        return;
    };
    let other = env.election("ns/other");
    let (sa, sb) = (env.session().await, env.session().await);
    let quick = env.caps().observe_poll.unwrap_or_default() * 2 + env.timing.ttl / 2 + env.slack;
    let crash = env.timing.ttl
        + env.timing.retry.max
        + env.caps().observe_poll.unwrap_or_default()
        + env.slack;
    assert!(sa.members(&ns).await.expect("members").is_empty());
    let mut w = sa.watch_members(&ns).await.expect("watch_members");
    watch_until(&mut w, &[], quick, "empty namespace").await;

    sa.register(&ns, &member("a", "1"))
        .await
        .expect("register a");
    sb.register(&ns, &member("b", "1"))
        .await
        .expect("register b");
    watch_until(&mut w, &[("a", "1"), ("b", "1")], quick, "two joins").await;
    members_until(&sa, &ns, &[("a", "1"), ("b", "1")], quick).await;

    // Separate from another namespace and from an election of the same name.
    assert!(sa.members(&other).await.expect("members").is_empty());
    let l = campaign(&sa, &ns, &cand("a")).await;
    assert_eq!(
        sb.leader(&ns).await.expect("leader").map(|i| i.id),
        Some("a".to_string())
    );
    l.resign().await.expect("resign");
    members_until(&sa, &ns, &[("a", "1"), ("b", "1")], quick).await;

    sa.register(&ns, &member("a", "2"))
        .await
        .expect("re-register a");
    watch_until(&mut w, &[("a", "2"), ("b", "1")], quick, "value change").await;

    // A value at the limit goes through whole, to watchers and to listings.
    let big: String = (0..crate::MAX_MEMBER_VALUE_LEN)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    sb.register(&ns, &member("b", &big))
        .await
        .expect("register a value at the limit");
    let whole = |list: &[Member]| list.iter().any(|m| m.id() == "b" && m.value() == big);
    within(quick, "a value at the limit, watched", async {
        while let Some(item) = w.next().await {
            if item.is_ok_and(|l| whole(&l)) {
                return;
            }
        }
        panic!("the member stream ended");
    })
    .await;
    assert!(
        whole(&sa.members(&ns).await.expect("members")),
        "a value at the limit, listed"
    );
    sb.register(&ns, &member("b", "1"))
        .await
        .expect("register b small again");
    watch_until(
        &mut w,
        &[("a", "2"), ("b", "1")],
        quick,
        "after the large value",
    )
    .await;

    sb.unregister(&ns, "b").await.expect("unregister b");
    sb.unregister(&ns, "b")
        .await
        .expect("unregister is idempotent");
    watch_until(&mut w, &[("a", "2")], quick, "unregister").await;

    sb.register(&ns, &member("b", "3"))
        .await
        .expect("register b again");
    watch_until(&mut w, &[("a", "2"), ("b", "3")], quick, "join again").await;
    sb.close().await.expect("close b");
    watch_until(&mut w, &[("a", "2")], quick, "closed session").await;

    let sc = env.session().await;
    sc.register(&ns, &member("c", "1"))
        .await
        .expect("register c");
    watch_until(&mut w, &[("a", "2"), ("c", "1")], quick, "third join").await;
    let t0 = Instant::now();
    sc.abandon();
    watch_until(&mut w, &[("a", "2")], crash, "crashed session").await;
    eprintln!("crashed member gone after {:?}", t0.elapsed());

    // Expiry: the core re-opens the session and registers again.
    let sd = env.session().await;
    sd.register(&ns, &member("d", "1"))
        .await
        .expect("register d");
    watch_until(&mut w, &[("a", "2"), ("d", "1")], quick, "fourth join").await;
    match env.faults.expire(&sd).await {
        Ok(()) => {
            watch_until(&mut w, &[("a", "2")], crash, "expired session").await;
            watch_until(
                &mut w,
                &[("a", "2"), ("d", "1")],
                crash + quick,
                "registered again after re-open",
            )
            .await;
        }
        Err(why) => eprintln!("membership after expiry not checked: {why}"),
    }
    sd.close().await.expect("close d");

    // The latest registration of an id wins across sessions, and only the session
    // that made it removes it: the earlier one unregistering or closing does not.
    let sf = env.session().await;
    sf.register(&ns, &member("x", "from f"))
        .await
        .expect("register x from f");
    watch_until(&mut w, &[("a", "2"), ("x", "from f")], quick, "x from f").await;
    sa.register(&ns, &member("x", "from a"))
        .await
        .expect("register x from a");
    watch_until(&mut w, &[("a", "2"), ("x", "from a")], quick, "x from a").await;
    sf.unregister(&ns, "x").await.expect("unregister x from f");
    let bad = sf
        .unregister(&ns, "a/b")
        .await
        .expect_err("a bad member id");
    assert_eq!(bad.kind(), ErrorKind::InvalidArgument, "{bad}");
    sf.close().await.expect("close f");
    let closed = sf
        .register(&ns, &member("z", ""))
        .await
        .expect_err("register on a closed session");
    assert_eq!(closed.kind(), ErrorKind::Closed, "{closed}");
    sa.register(&ns, &member("y", "1"))
        .await
        .expect("register y");
    watch_until(
        &mut w,
        &[("a", "2"), ("x", "from a"), ("y", "1")],
        quick,
        "the latest registration outlives the earlier session",
    )
    .await;
    members_until(&sa, &ns, &[("a", "2"), ("x", "from a"), ("y", "1")], quick).await;
    sa.close().await.expect("close a");
    watch_until(&mut w, &[], quick, "all gone").await;

    // A member that replaces its value quickly never drops out of a watcher's view.
    let churn = env.election("churn");
    let se = env.session().await;
    se.register(&churn, &member("e", "0"))
        .await
        .expect("register e");
    let mut w2 = se.watch_members(&churn).await.expect("watch_members");
    watch_until(&mut w2, &[("e", "0")], quick, "churn start").await;
    let reader = tokio::spawn(async move {
        let mut seen = Vec::new();
        while let Some(item) = w2.next().await {
            let got = ids_values(&item.expect("member stream"));
            let done = got == [("e".to_string(), "40".to_string())];
            seen.push(got);
            if done {
                break;
            }
        }
        seen
    });
    for i in 1..=40 {
        se.register(&churn, &member("e", &i.to_string()))
            .await
            .expect("replace e");
    }
    let seen = within(quick * 4, "the last value of a churning member", reader)
        .await
        .expect("reader");
    for list in &seen {
        assert!(
            list.len() == 1 && list[0].0 == "e",
            "a member re-registering its value dropped out of the list: {list:?}"
        );
    }
    se.close().await.expect("close e");
}

/// Clause 13 (membership) through a broken link: a watcher whose connection to the
/// store is cut while members change shows the current list once the link heals,
/// without being restarted.
pub async fn check_membership_after_a_cut(env: &Env) {
    if env.not_applicable(Clause::Membership) {
        return;
    }
    let victim = match env.faults.victim_backend(env).await {
        Ok(b) => b,
        Err(why) => return eprintln!("membership cut not checked: {why}"),
    };
    let quick = env.caps().observe_poll.unwrap_or_default() * 2 + env.timing.ttl / 2 + env.slack;
    let ns = env.election("cut");
    let watcher = env.session_on(victim).await;
    let s = env.session().await;
    s.register(&ns, &member("a", "1"))
        .await
        .expect("register a");
    let mut w = watcher.watch_members(&ns).await.expect("watch_members");
    watch_until(&mut w, &[("a", "1")], quick, "before the cut").await;
    if let Err(why) = env.faults.disconnect(&watcher).await {
        return eprintln!("membership cut not checked: {why}");
    }
    // Changes while the watcher hears nothing (shorter than its renew deadline).
    s.register(&ns, &member("a", "2")).await.expect("change a");
    s.register(&ns, &member("b", "1"))
        .await
        .expect("register b");
    tokio::time::sleep(Duration::from_millis(300)).await;
    env.faults.reconnect(&watcher).await.expect("reconnect");
    let healed = quick + env.timing.ttl * 2 + env.slack;
    watch_for(
        &mut w,
        &[("a", "2"), ("b", "1")],
        healed,
        "after the cut",
        true,
    )
    .await;
    s.close().await.expect("close");
    watch_for(
        &mut w,
        &[],
        quick + env.slack,
        "all gone after the cut",
        true,
    )
    .await;
    drop(watcher);
}

fn with_priority(c: Candidate, priority: i32) -> Candidate {
    match c.with_priority(priority) {
        Ok(c) => c,
        Err(e) => panic!("priority {priority}: {e}"),
    }
}

/// Let a campaign started in the background queue in the store before the next one.
async fn let_queue(env: &Env) {
    tokio::time::sleep(Duration::from_millis(100) + env.slack / 2).await;
}

/// Clause 14: the highest-priority waiter is granted next (ties: queue order); a
/// candidate that joins with a higher priority than a preemptible holder preempts it
/// (lost signal `Preempted` first, then the preferred candidate is granted within a
/// handover); an equal or lower priority, a holder that opted out, and a
/// `try_campaign` never preempt; no two holders. A backend that does not declare
/// [`Capabilities::priority`] must refuse a priority with `Unsupported` (checked here
/// instead).
pub async fn check_priority(env: &Env) {
    if let Err(why) = env.caps().supports(Clause::Priority) {
        eprintln!(
            "contract clause 14 (Priority) not applicable on {}: {why}; checking the rejection",
            env.backend.scheme()
        );
        check_priority_rejected(env).await;
        return;
    }
    check_priority_order(env).await;
    check_preemption(env).await;
    check_handover(env).await;
}

/// A backend without priorities refuses a candidate with one, on every way in, with an
/// `Unsupported` error that names the priority and the backend; priority 0 and the
/// opt-out alone campaign as before.
pub async fn check_priority_rejected(env: &Env) {
    let election = env.election("priority-rejected");
    // A backend that said why it cannot keep priorities must be quoted in the error.
    let declared = match env.caps().supports(Clause::Priority) {
        Err(why) if why != crate::backend::PRIORITY_NOT_YET => Some(why),
        _ => None,
    };
    let s = env.session().await;
    let c = with_priority(cand("a"), 7);
    let seats = [(election.clone(), c.clone())];
    let errors = [
        s.campaign(&election, &c).await.err(),
        s.try_campaign(&election, &c).await.err(),
        s.try_campaign_many(&seats).await.err(),
    ];
    for e in errors {
        let e = e.expect("a priority on a backend without priorities was accepted");
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
        let line = crate::one_line(&e);
        assert!(line.contains("priority 7"), "{line}");
        assert!(line.contains(env.backend.scheme()), "{line}");
        if let Some(why) = declared {
            assert!(line.contains(why), "{line}: the declared reason is missing");
        }
    }
    let plain = cand("a").never_preempted();
    let l = campaign(&s, &election, &plain).await;
    let e = s
        .observer()
        .handover(&election, None)
        .await
        .expect_err("a handover on a backend without priorities was accepted");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    if let Some(why) = declared {
        let line = crate::one_line(&e);
        assert!(line.contains(why), "{line}: the declared reason is missing");
    }
    assert!(l.is_leader());
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

/// Clause 14, handover: the leader (one that opted out of preemption, too) steps down
/// to the waiter asked for, ahead of a higher priority, within a handover; its lost
/// signal (`Preempted`) fires first; asking for a waiter that is not there is
/// `InvalidArgument` and leaves the leader alone.
async fn check_handover(env: &Env) {
    let election = env.election("handover");
    let (sa, sb, sc) = (
        env.session().await,
        env.session().await,
        env.session().await,
    );
    let a = campaign(&sa, &election, &cand("a").never_preempted()).await;
    let waiter = |s: &Session, c: Candidate| {
        let (s, e) = (s.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &c).await })
    };
    let high = waiter(&sb, with_priority(cand("b"), 9));
    let_queue(env).await;
    let low = waiter(&sc, cand("c"));
    let_queue(env).await;
    let observer = sa.observer();
    // The holder's work listens for a step-down.
    let stop = a.stepping_down();
    let e = observer.handover(&election, Some("nobody")).await;
    let e = e.expect_err("a handover to a waiter that is not there was accepted");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(a.is_leader());
    let t0 = Instant::now();
    let asked = observer
        .handover(&election, Some("c"))
        .await
        .expect("handover");
    assert_eq!((asked.id.as_str(), asked.token), ("a", a.token()));
    // The holder is asked to step down; it acknowledges by resigning.
    within(
        env.handover_bound(),
        "holder asked to step down",
        stop.cancelled(),
    )
    .await;
    assert_eq!(a.step_down_reason(), Some(StepDownReason::Preempted));
    let a_watch = a.watch();
    a.resign().await.expect("resign");
    let c = within(env.handover_bound(), "handover to c", low)
        .await
        .expect("c granted");
    eprintln!(
        "handover on {}: {:?}",
        env.backend.scheme(),
        c.granted_at() - t0
    );
    assert_eq!(a_watch.loss_reason(), Some(LossReason::Resigned));
    assert!(!high.is_finished(), "the handover went to b, not to c");
    assert_intervals_disjoint(vec![watch_interval(&a_watch), interval_open(&c)]);
    c.resign().await.expect("resign");
    within(env.handover_bound(), "b after c", high)
        .await
        .expect("b granted");
    for s in [sa, sb, sc] {
        s.close().await.expect("close");
    }
}

/// Clause 14, order: behind a holder that opted out, waiters joining with priorities
/// 0, 5, 5, 2 are granted 5, 5 (in queue order), 2, 0.
async fn check_priority_order(env: &Env) {
    let election = env.election("priority-order");
    let sa = env.session().await;
    let a = campaign(&sa, &election, &cand("a").never_preempted()).await;
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (id, priority) in [("b", 0), ("c", 5), ("d", 5), ("e", 2)] {
        let s = env.session().await;
        let (election, granted) = (election.clone(), granted.clone());
        let me = with_priority(cand(id), priority);
        waiters.push(tokio::spawn(async move {
            let l = campaign(&s, &election, &me).await;
            granted.lock().unwrap().push(me.id().to_string());
            let token = l.token();
            l.resign().await.expect("resign");
            s.close().await.expect("close");
            token
        }));
        let_queue(env).await;
    }
    assert!(a.is_leader(), "a holder that opted out was preempted");
    assert_eq!(a.loss_reason(), None);
    let first = a.token();
    a.resign().await.expect("resign");
    let mut tokens = Vec::new();
    for w in waiters {
        let bound = env.handover_bound() * 4;
        tokens.push(within(bound, "waiters granted", w).await.expect("waiter"));
    }
    assert_eq!(*granted.lock().unwrap(), ["c", "d", "e", "b"]);
    assert!(tokens.iter().all(|t| *t > first));
    sa.close().await.expect("close");
}

/// Clause 14, preemption: a higher priority joins → the holder's lost signal fires
/// (`Preempted`) before the preferred candidate is granted, within a handover of the
/// join; equal priority, lower priority and `try_campaign` do not preempt.
async fn check_preemption(env: &Env) {
    let election = env.election("preemption");
    let (sa, sb, sc) = (
        env.session().await,
        env.session().await,
        env.session().await,
    );
    let a = campaign(&sa, &election, &with_priority(cand("a"), 1)).await;
    // The holder's work: it acknowledges a step-down by dropping its guard.
    let work = a.work_guard();
    // try_campaign never queues, so it never preempts.
    let tried = sc
        .try_campaign(&election, &with_priority(cand("c"), 9))
        .await;
    assert!(
        tried.expect("try_campaign").is_none(),
        "seat taken by a try"
    );
    // A lower priority waits without preempting.
    let low = {
        let (s, e) = (sc.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("c"), 0)).await })
    };
    let_queue(env).await;
    assert!(a.is_leader(), "a lower priority preempted the holder");
    let t0 = Instant::now();
    let b = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("b"), 3)).await })
    };
    within(
        env.handover_bound(),
        "holder asked to step down",
        a.stepping_down().cancelled(),
    )
    .await;
    assert_eq!(a.step_down_reason(), Some(StepDownReason::Preempted));
    // Clause 15: the seat is held until the work acknowledges.
    assert!(a.is_leader(), "the seat ended before the work acknowledged");
    drop(work);
    let reason = within(env.handover_bound(), "holder preempted", a.lost_wait()).await;
    assert_eq!(reason, LossReason::Preempted);
    let b = within(env.handover_bound(), "preferred candidate granted", b)
        .await
        .expect("preferred candidate");
    let gap = b.granted_at() - t0;
    assert!(gap <= env.handover_bound(), "preemption took {gap:?}");
    eprintln!("preemption on {}: {gap:?}", env.backend.scheme());
    // Equal priority: b keeps the seat.
    let equal = {
        let (s, e) = (sa.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &with_priority(cand("a"), 3)).await })
    };
    let_queue(env).await;
    assert!(b.is_leader(), "an equal priority preempted the holder");
    assert!(!low.is_finished() && !equal.is_finished());
    let intervals = vec![interval(&a), interval_open(&b)];
    assert_intervals_disjoint(intervals);
    // The equal-priority waiter queued after the lower one but is granted first.
    b.resign().await.expect("resign");
    let next = within(env.handover_bound(), "next waiter", equal)
        .await
        .expect("equal waiter");
    assert!(!low.is_finished(), "a lower priority was granted first");
    next.resign().await.expect("resign");
    within(env.handover_bound(), "last waiter", low)
        .await
        .expect("low waiter");
    for s in [sa, sb, sc] {
        s.close().await.expect("close");
    }
}

/// Clause 15, planned transitions: a holder asked to step down keeps the seat (held,
/// renewed, still the leader observers see) until its work acknowledges, and only then
/// is the waiter granted, within a handover; a holder whose work never acknowledges
/// loses the seat at the step-down grace and the waiter is granted then; the runner,
/// shut down, stops its task before it releases the seat.
pub async fn check_planned_transitions(env: &Env) {
    check_step_down_waits_for_the_work(env).await;
    check_step_down_grace(env).await;
    check_runner_stops_before_release(env).await;
}

/// Clause 16, state transfer: a holder that resigns with a state leaves it to the
/// waiter its release grants, with its token; with nobody waiting, to the next grant
/// (once); a grant after a crash inherits nothing; a state over the limit is refused
/// with `InvalidArgument` and the seat is released all the same. A backend without
/// the clause answers `Unsupported` and still releases.
pub async fn check_state_transfer(env: &Env) {
    let election = env.election("state");
    if env.not_applicable(Clause::StateTransfer) {
        let (_sa, a, waiter) = held_and_awaited(env, &election).await;
        let err = a.resign_with(b"x".to_vec()).await.expect_err("unsupported");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        within(env.handover_bound(), "granted after the release", waiter)
            .await
            .expect("waiter");
        return;
    }
    let (_sa, a, waiter) = held_and_awaited(env, &election).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ta = a.token();
    a.resign_with(b"cursor=1".to_vec())
        .await
        .expect("resign_with");
    let b = within(env.handover_bound(), "granted after resign_with", waiter)
        .await
        .expect("waiter");
    assert_eq!(b.inherited(), Some((ta, &b"cursor=1"[..])));
    // Nobody waits: the next grant takes it, and only that one.
    let tb = b.token();
    let big = vec![7u8; crate::engine::MAX_STATE];
    b.resign_with(big.clone()).await.expect("the largest state");
    let sc = env.session().await;
    let c = campaign(&sc, &election, &cand("c")).await;
    assert_eq!(c.inherited(), Some((tb, &big[..])));
    let over = vec![0u8; crate::engine::MAX_STATE + 1];
    let err = c.resign_with(over).await.expect_err("over the limit");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let sd = env.session().await;
    let d = campaign(&sd, &election, &cand("d")).await;
    assert_eq!(d.inherited(), None, "a refused state was left after all");
    // A crash leaves nothing, even to a waiter.
    let se = env.session().await;
    let wait_e = {
        let election = election.clone();
        tokio::spawn(async move { campaign(&se, &election, &cand("e")).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    sd.abandon();
    let e = within(
        env.timing.ttl * 2 + env.slack,
        "granted after the holder crashed",
        wait_e,
    )
    .await
    .expect("waiter");
    assert_eq!(e.inherited(), None, "a crashed holder left a state");
    drop(d);
}

/// How long the checks of clause 15 let a step-down wait before they look again: long
/// enough that a seat released early would have been granted to the waiter.
fn drain_time(env: &Env) -> Duration {
    env.handover_bound().min(Duration::from_secs(2))
}

async fn check_step_down_waits_for_the_work(env: &Env) {
    let election = env.election("step-down");
    let (sa, a, waiter) = held_and_awaited(env, &election).await;
    let_queue(env).await;
    let work = a.work_guard();
    let second = work.clone();
    assert!(a.step_down(StepDownReason::Requested));
    assert!(!a.step_down(StepDownReason::Shutdown), "asked twice");
    assert!(a.stepping_down().is_cancelled() && work.stepping_down().is_cancelled());
    assert_eq!(work.step_down_reason(), Some(StepDownReason::Requested));
    // The work drains: the seat stays held and renewed, past renewals.
    tokio::time::sleep(drain_time(env)).await;
    assert!(a.is_leader(), "the seat ended while the work was draining");
    assert!(
        !waiter.is_finished(),
        "the waiter was granted before the work stopped"
    );
    let seen = sa.leader(&election).await.expect("leader").map(|l| l.id);
    assert_eq!(
        seen.as_deref(),
        Some("a"),
        "observers see the holder meanwhile"
    );
    // One guard of two is not an acknowledgement; the last one (done) is.
    drop(second);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(a.is_leader() && !waiter.is_finished());
    let acked = Instant::now();
    work.done();
    let b = within(
        env.handover_bound(),
        "waiter after the acknowledgement",
        waiter,
    )
    .await
    .expect("waiter");
    assert_eq!(a.loss_reason(), Some(LossReason::Resigned));
    let end = a.lost_at().expect("ended");
    assert!(
        end >= acked && end <= b.granted_at(),
        "released before the acknowledgement"
    );
    assert_intervals_disjoint(vec![interval(&a), interval_open(&b)]);
    eprintln!(
        "step-down on {}: acknowledged → successor granted in {:?}",
        env.backend.scheme(),
        b.granted_at() - acked
    );
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
}

async fn check_step_down_grace(env: &Env) {
    let election = env.election("step-down-grace");
    let grace = Duration::from_millis(600) + env.slack;
    let timing = Timing {
        step_down_grace: grace,
        ..env.timing.clone()
    };
    let sa = match Session::open(env.backend.clone(), timing).await {
        Ok(s) => s,
        Err(e) => panic!("open session: {e}"),
    };
    let a = campaign(&sa, &election, &cand("a")).await;
    let sb = env.session().await;
    let waiter = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &cand("b")).await })
    };
    let_queue(env).await;
    // Work that never acknowledges: the guard is kept and the holder never resigns.
    let work = a.work_guard();
    let asked = Instant::now();
    a.step_down(StepDownReason::Requested);
    let b = within(grace + env.handover_bound(), "waiter at the grace", waiter)
        .await
        .expect("waiter");
    let end = a.lost_at().expect("the seat ended at the grace");
    assert!(
        end >= asked + grace,
        "released {:?} after the ask, before the grace",
        end - asked
    );
    assert!(b.granted_at() >= end);
    assert!(!a.is_leader() && work.stepping_down().is_cancelled());
    drop(work);
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
    sb.close().await.expect("close");
}

async fn check_runner_stops_before_release(env: &Env) {
    let election = env.election("step-down-runner");
    let drain = Duration::from_millis(300);
    let sa = env.session().await;
    let task_ended = Arc::new(Mutex::new(None::<Instant>));
    let shutdown = CancellationToken::new();
    let mut runner = LeaderRunner::new(sa.clone(), election.clone(), cand("a"));
    let mut events = runner.subscribe();
    let run = {
        let (shutdown, ended) = (shutdown.clone(), task_ended.clone());
        tokio::spawn(runner.run(shutdown, move |ctx| {
            let ended = ended.clone();
            async move {
                ctx.cancelled().await;
                // The task flushes for a while after it was told to stop.
                tokio::time::sleep(drain).await;
                *ended.lock().unwrap() = Some(Instant::now());
                Ok::<(), String>(())
            }
        }))
    };
    loop {
        match within(env.handover_bound(), "elected", events.recv()).await {
            Some(LeadershipEvent::Elected { .. }) => break,
            Some(_) => continue,
            None => panic!("the runner stopped before it was elected"),
        }
    }
    let sb = env.session().await;
    let waiter = {
        let (s, e) = (sb.clone(), election.clone());
        tokio::spawn(async move { campaign(&s, &e, &cand("b")).await })
    };
    let_queue(env).await;
    shutdown.cancel();
    let b = within(
        drain + env.handover_bound(),
        "waiter after shutdown",
        waiter,
    )
    .await
    .expect("waiter");
    let ended = task_ended.lock().unwrap().expect("the task ended");
    assert!(
        b.granted_at() >= ended,
        "the successor was granted before the task ended"
    );
    within(env.handover_bound(), "runner returned", run)
        .await
        .expect("join")
        .expect("run");
    let mut seen = Vec::new();
    while let Ok(ev) = events.try_recv() {
        seen.push(ev);
    }
    assert!(
        matches!(
            seen.first(),
            Some(LeadershipEvent::SteppingDown {
                reason: StepDownReason::Shutdown,
                ..
            })
        ),
        "{seen:?}"
    );
    assert!(
        matches!(
            seen.get(1),
            Some(LeadershipEvent::Resigned {
                cause: ResignCause::Shutdown,
                aborted: false,
                ..
            })
        ),
        "{seen:?}"
    );
    b.resign().await.expect("resign");
    sa.close().await.expect("close");
    sb.close().await.expect("close");
}

/// The grant of `l`, which has ended, as an [`Interval`].
fn interval(l: &Leadership) -> Interval {
    Interval {
        holder: l.candidate().id().to_string(),
        token: l.token(),
        start: l.granted_at(),
        end: l.lost_at().expect("ended"),
    }
}

/// The grant behind `w`, which has ended, as an [`Interval`].
fn watch_interval(w: &LeadershipWatch) -> Interval {
    Interval {
        holder: w.candidate().id().to_string(),
        token: w.token(),
        start: w.granted_at(),
        end: w.lost_at().expect("ended"),
    }
}

/// The grant of `l`, still held, as an [`Interval`] that ends now.
fn interval_open(l: &Leadership) -> Interval {
    Interval {
        holder: l.candidate().id().to_string(),
        token: l.token(),
        start: l.granted_at(),
        end: l.lost_at().unwrap_or_else(Instant::now),
    }
}

/// Run every check against `env`'s backend, one `#[tokio::test]` per clause.
///
/// `$make_env` is an async expression evaluating to an [`Env`]. The calling crate needs
/// `tokio` (with `macros`, `rt-multi-thread`) in its dev-dependencies.
///
/// For a suite that runs only part of the contract: `conformance_tests!(@clauses_01_to_12
/// $make_env)` gives the tests of clauses 1 to 12, and `conformance_tests!(@multi
/// $make_env; test_name => check_fn, …)` one multi-threaded test per named check.
#[macro_export]
macro_rules! conformance_tests {
    ($make_env:expr) => {
        $crate::conformance_tests!(@clauses_01_to_12 $make_env);
        $crate::conformance_tests!(@multi $make_env;
            clause_13_membership => check_membership,
            clause_13_membership_after_a_cut => check_membership_after_a_cut,
            clause_14_priority => check_priority,
            clause_15_planned_transitions => check_planned_transitions,
            clause_16_state_transfer => check_state_transfer,
            session_holds_many_elections => check_many_elections_one_session,
            session_takes_free_seats_in_batches => check_batch_campaign,
            session_resigns_seats_in_batches => check_batch_resign
        );
    };
    (@clauses_01_to_12 $make_env:expr) => {
        $crate::conformance_tests!(@multi $make_env;
            clause_01_at_most_one_holder => check_at_most_one_holder,
            clause_02_monotonic_tokens => check_monotonic_tokens,
            clause_02_tokens_after_a_failed_resign => check_failed_resign,
            clause_03_lost_is_final => check_lost_is_final,
            clause_05_graceful_handover => check_graceful_handover,
            clause_06_crash_failover => check_crash_failover,
            clause_07_no_herd => check_no_herd,
            clause_08_connection_loss => check_connection_loss,
            clause_09_observe => check_observe,
            clause_10_run_when_leader => check_run_when_leader,
            clause_11_stall_detection => check_stall_detection,
            clause_12_bad_input => check_bad_input
        );
        #[tokio::test(flavor = "current_thread")]
        async fn clause_04_is_leader_honest_without_io() {
            let env = $make_env.await;
            $crate::testing::check_is_leader_honest_without_io(&env).await;
        }
    };
    (@multi $make_env:expr; $($name:ident => $check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let env = $make_env.await;
                $crate::testing::$check(&env).await;
            }
        )*
    };
}

/// The engine's backend cut off, healed and expired through its own gates and revocation.
#[async_trait]
impl Faults for crate::backend::DrivenBackend {
    async fn disconnect(&self, session: &crate::Session) -> std::result::Result<(), String> {
        self.set_gate(&session.id(), false)
            .then_some(())
            .ok_or_else(|| "no such session".into())
    }
    async fn reconnect(&self, session: &crate::Session) -> std::result::Result<(), String> {
        self.set_gate(&session.id(), true);
        Ok(())
    }
    async fn expire(&self, session: &crate::Session) -> std::result::Result<(), String> {
        self.revoke(&session.id()).await.map_err(|e| e.to_string())
    }
}
