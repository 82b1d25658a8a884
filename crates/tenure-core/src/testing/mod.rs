//! The conformance suite: one `async fn check_…` per clause of the election contract
//! (`docs/contract.md`). Every backend's tests call them all through [`conformance_tests!`](crate::conformance_tests),
//! passing an [`Env`]. A clause the backend declares unsupported in its
//! [`Capabilities`] is reported (printed with the reason), never silently passed.
//!
//! The checks panic on failure: they are test code.

pub mod config;
pub mod primitives;

mod batch;
mod liveness;
mod lost_at_grant;
mod membership;
mod priority;
mod release;
mod runner;
mod safety;
mod transitions;
pub use batch::{check_batch_campaign, check_batch_resign, check_many_elections_one_session};
pub use liveness::{
    check_connection_loss, check_crash_failover, check_graceful_handover, check_no_herd,
    check_observe,
};
pub use lost_at_grant::{LoseIf, LostAtGrant, LOST_AT_GRANT};
pub use membership::{check_membership, check_membership_after_a_cut, watch_until};
pub use priority::{check_priority, check_priority_rejected};
pub use release::check_failed_resign;
pub use runner::{check_bad_input, check_run_when_leader, check_stall_detection};
pub use safety::{
    check_at_most_one_holder, check_is_leader_honest_without_io, check_lost_is_final,
    check_monotonic_tokens,
};
pub use transitions::{check_planned_transitions, check_state_transfer};

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

/// Let a campaign started in the background queue in the store before the next one.
async fn let_queue(env: &Env) {
    tokio::time::sleep(Duration::from_millis(100) + env.slack / 2).await;
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
