//! One fault suite for every store, the way the conformance suite is one list of
//! checks: each scenario is a plain `async fn` taking a [`FaultSpec`] (how candidates
//! reach the store and the bounds that differ between stores), and each store's test
//! file calls the scenarios with its spec. The candidates are real `tenure campaign`
//! processes writing their token to a [`GuardedResource`]. Each test starts its own
//! server (the scenarios pause and restart it: with an external `TENURE_TEST_*` server
//! those fail, saying so) and two or three candidates, so run the fault test files with
//! `--test-threads=2` or fewer on small machines.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::cli_faults::{
    assert_fenced, assert_no_stale_write_accepted, assert_refused, campaign_args, finish, is, ms,
    next_leader, stop_all, tenure_bin, wait,
};
use crate::{
    check_fencing, free_port, monotonic_now_ns, CandidateProcess, Event, FencingViolation,
    GuardedResource, StoreServer, TcpProxy,
};

/// Runs the shared scenario named `scenario` (one of the five [`fault_tests!`](crate::fault_tests) stamps)
/// on `store`; `spec_in(endpoint, namespace)` says how candidates reach it, the
/// namespace (key prefix, chroot or container) being one random name for the test.
pub async fn run_shared(
    scenario: &str,
    store: &StoreServer,
    spec_in: &dyn Fn(&str, &str) -> FaultSpec,
) {
    let namespace = tenure_core::testing::random_prefix();
    let spec_at = |endpoint: &str| spec_in(endpoint, &namespace);
    let spec = spec_at(store.endpoint());
    match scenario {
        "sigkill_of_the_holder" => sigkill_of_the_holder(&spec).await,
        "sigstop_of_the_holder" => sigstop_of_the_holder(&spec).await,
        "sigstop_of_the_store" => sigstop_of_the_store(&spec, store).await,
        "cut_connection" => cut_connection(store, &spec_at).await,
        "unreachable_store" => unreachable_store(store, &spec_at).await,
        other => panic!("no shared fault scenario {other}"),
    }
}

/// [`store_restart`] on `store`, its candidates reaching it by `spec_in` (as in
/// [`run_shared`]).
pub async fn run_restart(
    store: &mut StoreServer,
    spec_in: &dyn Fn(&str, &str) -> FaultSpec,
    expect: Restart,
) {
    let spec = spec_in(store.endpoint(), &tenure_core::testing::random_prefix());
    store_restart(&spec, store, expect).await;
}

/// Stamps a store's tests of the five scenarios every store shares, each named after
/// its scenario and run on a store of its own: `$start` starts the store (an
/// expression whose `.await` is a `Result` of a handle that derefs to a [`StoreServer`]), `$spec_in` is as in
/// [`run_shared`]. With `restart: expect`, also `store_restart` ([`run_restart`]).
#[macro_export]
macro_rules! fault_tests {
    ($start:expr, $spec_in:expr, restart: $restart:expr) => {
        $crate::fault_tests!($start, $spec_in);

        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn store_restart() {
            let mut store = $start.await.expect("start the store");
            $crate::fault_suite::run_restart(&mut store, &$spec_in, $restart).await;
        }
    };
    ($start:expr, $spec_in:expr) => {
        $crate::fault_tests!(@each $start, $spec_in, sigkill_of_the_holder sigstop_of_the_holder
            sigstop_of_the_store cut_connection unreachable_store);
    };
    (@each $start:expr, $spec_in:expr, $($scenario:ident)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $scenario() {
            let store = $start.await.expect("start the store");
            $crate::fault_suite::run_shared(stringify!($scenario), &store, &$spec_in).await;
        }
    )*};
}

/// The query of 1 s connect and request timeouts, in every backend's URL grammar.
pub const TIMEOUTS: &str = "connect_timeout=1s&request_timeout=1s";

/// How often a leader's command writes its token to the guarded resource.
pub const WRITE_EVERY: Duration = Duration::from_millis(100);

/// What differs between stores in the fault scenarios.
#[derive(Debug, Clone)]
pub struct FaultSpec {
    /// The backend URL the candidates get.
    pub url: String,
    /// Extra environment for the candidates (credentials that do not go in the URL).
    pub env: Vec<(&'static str, String)>,
    /// The candidates' session TTL.
    pub ttl: Duration,
    /// The candidates' connect timeout.
    pub connect_timeout: Duration,
    /// How long a candidate may take to be elected or to start campaigning.
    pub start_bound: Duration,
    /// The longest a successor may take after the holder is SIGKILLed: the TTL plus
    /// the store's expiry granularity and wake-up (or poll) delay.
    pub failover_bound: Duration,
    /// How long the holder is stopped (SIGSTOP): past the TTL, so the store frees the
    /// seat while it is stopped.
    pub holder_pause: Duration,
    /// The longest a waiter may take to be granted after the holder was stopped.
    pub successor_bound: Duration,
    /// The candidates' renew deadline (the CLI's default, the core's:
    /// [`Timing::from_ttl`](tenure_core::Timing::from_ttl)).
    pub renew_deadline: Duration,
}

impl FaultSpec {
    /// A spec for `url` with a TTL of `ttl`: 1 s connect timeout, 10 s to start, the
    /// holder stopped for two TTLs, failover within the TTL plus `failover_slack`.
    pub fn new(url: impl Into<String>, ttl: Duration, failover_slack: Duration) -> Self {
        FaultSpec {
            url: url.into(),
            env: Vec::new(),
            ttl,
            connect_timeout: Duration::from_secs(1),
            start_bound: Duration::from_secs(10),
            failover_bound: ttl + failover_slack,
            holder_pause: ttl * 2,
            successor_bound: ttl * 2,
            renew_deadline: tenure_core::Timing::from_ttl(ttl).renew_deadline,
        }
    }

    /// The same spec with the session TTL `ttl` (and the bounds that follow from it).
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        let slack = self.failover_bound.saturating_sub(self.ttl);
        self.failover_bound = ttl + slack;
        self.holder_pause = ttl * 2;
        self.successor_bound = ttl * 2;
        self.renew_deadline = tenure_core::Timing::from_ttl(ttl).renew_deadline;
        self.ttl = ttl;
        self
    }

    /// `tenure campaign` for `a` in election `x` on this spec's URL, TTL and
    /// environment, plus `extra` arguments, run to its exit: its exit code, its stderr
    /// and how long it took. For inputs that must fail before any leadership.
    fn campaign_to_exit(&self, extra: &[&str]) -> (Option<i32>, String, Duration) {
        let ttl = self.ttl.as_secs_f64().to_string();
        // Found (and built, the first time) before the clock starts.
        let bin = tenure_bin();
        let started = Instant::now();
        let out = Command::new(bin)
            .args([
                "campaign",
                "--backend",
                &self.url,
                "--election",
                "x",
                "--id",
                "a",
            ])
            .args(["--ttl", &ttl])
            .args(extra)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run tenure");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code(), stderr, started.elapsed())
    }

    /// `tenure campaign` for `id` in `election`, writing its token to `resource` every
    /// [`WRITE_EVERY`] while it leads (for at most a minute and a half).
    pub fn candidate(
        &self,
        election: &str,
        id: &str,
        resource: &GuardedResource,
    ) -> CandidateProcess {
        let writes = resource.write_loop_command(WRITE_EVERY);
        let args = campaign_args(
            &self.url,
            election,
            id,
            self.ttl,
            self.connect_timeout,
            Duration::from_secs(90),
            &writes,
        );
        let mut env = vec![("RUST_LOG", "warn".to_string())];
        env.extend(self.env.iter().cloned());
        match CandidateProcess::spawn(&tenure_bin(), &args, env) {
            Ok(c) => c,
            Err(e) => panic!("starting candidate {id}: {e}"),
        }
    }
}

/// SIGKILL of the holder with two waiters: one of them is granted within the failover
/// bound with a larger token, the dead holder's command (still writing) is refused, no
/// stale write is accepted and no two candidates' leaderships overlap.
pub async fn sigkill_of_the_holder(spec: &FaultSpec) {
    let resource = GuardedResource::start().await.expect("resource");
    let election = "faults/sigkill";
    let mut a = spec.candidate(election, "a", &resource);
    let a_token = wait(&a, is(Event::ELECTED), spec.start_bound)
        .await
        .token
        .expect("token");
    let b = spec.candidate(election, "b", &resource);
    let c = spec.candidate(election, "c", &resource);
    wait(&b, is("campaigning"), spec.start_bound).await;
    wait(&c, is("campaigning"), spec.start_bound).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = a.kill().await.expect("kill a");
    let (_, next) = next_leader(&[&b, &c], killed, spec.failover_bound).await;
    eprintln!(
        "SIGKILL of the holder: successor after {:.0} ms (TTL {:?})",
        ms(next.mono_ns - killed),
        spec.ttl
    );
    assert!(next.token.expect("token") > a_token);
    // The dead holder's command goes on writing with its old token: refused.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_refused(&resource, "a", a_token, "the dead holder's writes");
    finish(&resource, vec![a, b, c]).await;
}

/// SIGSTOP of the holder past the TTL: the waiter is granted while the holder is
/// stopped; once resumed, the holder reports `lost` stamped no later than the
/// successor's grant, for its own token; the writes its command made meanwhile are
/// refused once the successor wrote.
pub async fn sigstop_of_the_holder(spec: &FaultSpec) {
    let resource = GuardedResource::start().await.expect("resource");
    let election = "faults/sigstop-holder";
    let a = spec.candidate(election, "a", &resource);
    let a_token = wait(&a, is(Event::ELECTED), spec.start_bound)
        .await
        .token
        .expect("token");
    let b = spec.candidate(election, "b", &resource);
    wait(&b, is("campaigning"), spec.start_bound).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paused = monotonic_now_ns();
    a.pause().expect("pause a");
    let b_elected = wait(&b, is(Event::ELECTED), spec.successor_bound).await;
    let left = spec
        .holder_pause
        .saturating_sub(Duration::from_nanos(monotonic_now_ns() - paused));
    tokio::time::sleep(left).await;
    a.resume().expect("resume a");
    let lost = wait(&a, is(Event::LOST), Duration::from_secs(5)).await;
    eprintln!(
        "paused holder: lost stamped {:.0} ms after the pause, successor elected after {:.0} ms",
        ms(lost.mono_ns.saturating_sub(paused)),
        ms(b_elected.mono_ns - paused)
    );
    assert_eq!(lost.token, Some(a_token));
    assert!(
        lost.mono_ns <= b_elected.mono_ns,
        "lost after the successor"
    );
    let b_token = b_elected.token.expect("token");
    assert!(b_token > a_token);
    // While the holder's process was stopped its command kept writing the old token:
    // once the successor wrote, those writes were refused.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_refused(&resource, "a", a_token, "stale writes");
    finish(&resource, vec![a, b]).await;
}

/// A guarded resource and two candidates `a` and `b` in `election`, once one of them
/// leads: which one (0 or 1) and its `elected` event.
async fn two_candidates(
    spec: &FaultSpec,
    election: &str,
) -> (
    GuardedResource,
    CandidateProcess,
    CandidateProcess,
    usize,
    Event,
) {
    let resource = GuardedResource::start().await.expect("resource");
    let a = spec.candidate(election, "a", &resource);
    let b = spec.candidate(election, "b", &resource);
    let (first, elected) = next_leader(&[&a, &b], 0, spec.start_bound).await;
    (resource, a, b, first, elected)
}

/// SIGSTOP of the store itself: the holder's lost signal fires by its renew deadline,
/// counted from its last confirmed renewal (before the pause), well before the store
/// could expire the session; once the store runs again the campaigns go on by
/// themselves and the next grant has a larger token. Needs a local server: with an
/// external one it fails, saying so.
pub async fn sigstop_of_the_store(spec: &FaultSpec, store: &StoreServer) {
    store.require_local("it stops the server");
    let (resource, a, b, first, elected) = two_candidates(spec, "faults/sigstop-store").await;
    let holder = [&a, &b][first];
    tokio::time::sleep(Duration::from_millis(700)).await;
    let paused = monotonic_now_ns();
    store.pause().expect("pause the store");
    let lost = wait(
        holder,
        is(Event::LOST),
        spec.renew_deadline + Duration::from_secs(2),
    )
    .await;
    let noticed = monotonic_now_ns();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.resume().expect("resume the store");
    eprintln!(
        "{} paused: lost stamped {:.0} ms after the pause (deadline {:?}, TTL {:?})",
        store.name(),
        ms(lost.mono_ns - paused),
        spec.renew_deadline,
        spec.ttl
    );
    assert_eq!(lost.token, elected.token);
    // The deadline runs from the last confirmed renewal, sent before the pause.
    assert!(lost.mono_ns <= paused + spec.renew_deadline.as_nanos() as u64);
    assert!(
        noticed < paused + spec.ttl.as_nanos() as u64,
        "lost reported late"
    );
    let (_, again) = next_leader(&[&a, &b], lost.mono_ns, spec.ttl * 5).await;
    assert!(again.token > elected.token);
    finish(&resource, vec![a, b]).await;
}

/// A cut connection: the holder reaches the store through a proxy, a waiter directly.
/// Once the link is cut the holder reports `lost` by its renew deadline and before
/// the waiter's grant; after the link heals the old holder campaigns again by itself
/// and, once the waiter resigns, leads with a larger token.
pub async fn cut_connection(store: &StoreServer, spec_at: &dyn Fn(&str) -> FaultSpec) {
    let resource = GuardedResource::start().await.expect("resource");
    let proxy = TcpProxy::start(store.addr()).await.expect("proxy");
    let direct = spec_at(store.endpoint());
    let through_proxy = spec_at(&store.endpoint_at(proxy.addr()));
    let election = "faults/cut";
    let a = through_proxy.candidate(election, "a", &resource);
    let a_elected = wait(&a, is(Event::ELECTED), direct.start_bound).await;
    let mut b = direct.candidate(election, "b", &resource);
    wait(&b, is("campaigning"), direct.start_bound).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cut = monotonic_now_ns();
    proxy.cut().await.expect("cut");
    let lost = wait(
        &a,
        is(Event::LOST),
        direct.renew_deadline + Duration::from_secs(2),
    )
    .await;
    let b_elected = wait(&b, is(Event::ELECTED), direct.successor_bound).await;
    assert!(
        lost.mono_ns <= b_elected.mono_ns,
        "lost after the successor"
    );
    assert!(lost.mono_ns <= cut + direct.renew_deadline.as_nanos() as u64);
    proxy.heal().await.expect("heal");
    // a campaigns again by itself; once b leaves, a leads with a new token.
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.terminate().await.expect("terminate b");
    let again = wait(
        &a,
        |e| e.is(Event::ELECTED) && e.mono_ns > lost.mono_ns,
        direct.start_bound,
    )
    .await;
    eprintln!(
        "{} cut: lost {:.0} ms after the cut, b elected after {:.0} ms",
        store.name(),
        ms(lost.mono_ns - cut),
        ms(b_elected.mono_ns - cut)
    );
    assert!(b_elected.token > a_elected.token);
    assert!(again.token > b_elected.token);
    finish(&resource, vec![a, b]).await;
}

/// What a store's restart (SIGKILL, then the same port and data directory) does to
/// the election, which differs by store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restart {
    /// The store is down longer than the TTL: the holder gives up at its deadline and
    /// once the store is back someone leads again with a larger token (etcd).
    DownPastTheTtl,
    /// The store comes straight back within the session timeout: the holder keeps its
    /// seat and no waiter is elected (ZooKeeper: sessions outlive a restart).
    KeepsTheSeat,
    /// The store comes back without its data: the holder learns at its next renewal,
    /// the next grant still has a larger token, the tenures may overlap (the documented
    /// limit of a store without persistence) but no stale write is accepted (Redis).
    LosesItsData,
}

/// A restart of the store with two candidates, checked as `expect` says (a seat kept
/// across the restart needs a session that outlives it: [`Restart::KeepsTheSeat`] runs
/// with a TTL of at least 10 s). Needs a local server: with an external one it fails,
/// saying so.
pub async fn store_restart(spec: &FaultSpec, store: &mut StoreServer, expect: Restart) {
    store.require_local("it restarts the server");
    let longer = spec.clone().with_ttl(spec.ttl.max(Duration::from_secs(10)));
    let spec = if expect == Restart::KeepsTheSeat {
        &longer
    } else {
        spec
    };
    let (resource, a, b, first, elected) = two_candidates(spec, "faults/restart").await;
    let holder = [&a, &b][first];
    tokio::time::sleep(Duration::from_millis(600)).await;
    let down = monotonic_now_ns();
    store.kill().await.expect("kill the store");
    if expect == Restart::DownPastTheTtl {
        tokio::time::sleep(spec.ttl + Duration::from_millis(500)).await;
    }
    store.restart().await.expect("restart the store");
    let up = monotonic_now_ns();
    match expect {
        Restart::DownPastTheTtl => {
            let (_, again) = next_leader(&[&a, &b], down, spec.ttl * 5).await;
            eprintln!(
                "{} restart: leader again {:.0} ms after the store came back",
                store.name(),
                ms(again.mono_ns.saturating_sub(up))
            );
            assert!(
                again.token > elected.token,
                "tokens continue after a restart"
            );
            assert_fenced(&[&a, &b]);
        }
        Restart::KeepsTheSeat => {
            // Well past reconnecting, still within the deadline had renewals failed.
            tokio::time::sleep(Duration::from_secs(3)).await;
            eprintln!("{} restart: down for {:.0} ms", store.name(), ms(up - down));
            assert!(
                !holder.events().iter().any(|e| e.is(Event::LOST)),
                "the holder lost its seat across a {:.0} ms restart: {:?}\n{}",
                ms(up - down),
                holder.events(),
                holder.stderr_tail()
            );
            let waiter = [&a, &b][1 - first];
            assert!(
                !waiter.events().iter().any(|e| e.is(Event::ELECTED)),
                "the waiter was elected"
            );
            assert_fenced(&[&a, &b]);
        }
        Restart::LosesItsData => {
            let renewal = tenure_core::Timing::from_ttl(spec.ttl).renew_interval;
            let lost = wait(
                holder,
                |e| e.is(Event::LOST) && e.mono_ns > elected.mono_ns,
                renewal + Duration::from_secs(2),
            )
            .await;
            // From the kill, not from `up`: `up` is taken once the harness's readiness
            // probe (every 20 ms) sees the server, and a candidate can be elected
            // before that; nobody can be elected while the server is down.
            let (who, next) = next_leader(&[&a, &b], down, spec.ttl * 3).await;
            eprintln!(
                "{} restarted without data: the holder lost {:.0} ms after ({:?}); {} elected after {:.0} ms",
                store.name(),
                ms(lost.mono_ns.saturating_sub(up)),
                lost.reason,
                ["a", "b"][who],
                ms(next.mono_ns.saturating_sub(up)),
            );
            let (old, new) = (elected.token.expect("token"), next.token.expect("token"));
            assert!(new > old, "token {new} after {old}");
            assert!(
                lost.mono_ns <= up + (renewal + Duration::from_millis(500)).as_nanos() as u64,
                "lost {:.0} ms after the restart",
                ms(lost.mono_ns.saturating_sub(up))
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
            assert!(resource.accepted().iter().any(|w| w.token == new));
            let logs: Vec<Vec<Event>> = [&a, &b].iter().map(|c| c.events()).collect();
            for v in check_fencing(&logs) {
                match v {
                    FencingViolation::Overlap { .. } => {
                        eprintln!("overlap after data loss (allowed): {v}")
                    }
                    other => panic!("fencing violation: {other}\n{logs:#?}"),
                }
            }
        }
    }
    assert_no_stale_write_accepted(&resource);
    stop_all(vec![a, b]).await;
}

/// An unreachable store, as a user meets it: `tenure campaign` against an address
/// where nothing listens, and against one that accepts but never answers (a black
/// hole), exits 1 within its connect timeout with one `unavailable` or `timeout` line.
pub async fn unreachable_store(store: &StoreServer, spec_at: &dyn Fn(&str) -> FaultSpec) {
    let port = free_port().expect("port");
    let nothing = store.endpoint_at(format!("127.0.0.1:{port}"));
    let proxy = TcpProxy::start(store.addr()).await.expect("proxy");
    proxy.blackhole().await.expect("blackhole");
    for (endpoint, what) in [
        (nothing, "nothing listens"),
        (store.endpoint_at(proxy.addr()), "black hole"),
    ] {
        let spec = spec_at(&endpoint);
        let limit = Duration::from_millis(700);
        let (code, stderr, took) =
            spec.campaign_to_exit(&["--connect-timeout", &limit.as_secs_f64().to_string()]);
        eprintln!("{} unreachable ({what}): exit after {took:?}", store.name());
        assert_eq!(code, Some(1), "{what}: {stderr}");
        assert!(
            stderr.starts_with("tenure: unavailable") || stderr.starts_with("tenure: timeout"),
            "{what}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "{what}: {stderr}");
        assert!(
            took <= limit + Duration::from_millis(800),
            "{what}: took {took:?}"
        );
    }
}

/// Credentials the store refuses, as a user meets them: for each spec `tenure
/// campaign` exits 1 with one `unauthorized` line that does not show `secret`; and
/// `right` campaigns and resigns end to end.
pub async fn wrong_credentials(wrong: &[FaultSpec], right: &FaultSpec, secret: &str) {
    for spec in wrong {
        let (code, stderr, _) = spec.campaign_to_exit(&[]);
        assert_eq!(code, Some(1), "{}: {stderr}", spec.url);
        assert!(stderr.starts_with("tenure: unauthorized"), "{stderr}");
        assert!(!stderr.contains(secret), "{stderr}");
    }
    let resource = GuardedResource::start().await.expect("resource");
    let a = right.candidate("faults/credentials", "a", &resource);
    wait(&a, is(Event::ELECTED), right.start_bound).await;
    stop_all(vec![a]).await;
}
