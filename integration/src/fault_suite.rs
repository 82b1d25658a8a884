//! One fault suite for every store, the way the conformance suite is one list of
//! checks: each scenario is a plain `async fn` taking a [`FaultSpec`] (how candidates
//! reach the store and the bounds that differ between stores), and each store's test
//! file calls the scenarios with its spec. The candidates are real `tenure campaign`
//! processes writing their token to a [`GuardedResource`].

use std::time::Duration;

use crate::cli_faults::{
    assert_fenced, assert_no_stale_write_accepted, campaign_args, is, ms, next_leader, refused,
    stop_all, tenure_bin, wait,
};
use crate::{monotonic_now_ns, CandidateProcess, Event, GuardedResource, StoreServer};

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
    /// The candidates' renew deadline (the CLI's default: two thirds of the TTL).
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
            renew_deadline: ttl * 2 / 3,
        }
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
    assert!(
        refused(&resource, "a", a_token) > 0,
        "the dead holder's writes were not refused: {:?}",
        resource.writes()
    );
    assert_no_stale_write_accepted(&resource);
    assert_fenced(&[&a, &b, &c]);
    stop_all(vec![a, b, c]).await;
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
    assert!(
        refused(&resource, "a", a_token) > 0,
        "stale writes were not refused: {:?}",
        resource.writes()
    );
    assert_no_stale_write_accepted(&resource);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}

/// SIGSTOP of the store itself: the holder's lost signal fires by its renew deadline,
/// counted from its last confirmed renewal (before the pause), well before the store
/// could expire the session; once the store runs again the campaigns go on by
/// themselves and the next grant has a larger token. Needs a local server: with an
/// external one it says so and does nothing.
pub async fn sigstop_of_the_store(spec: &FaultSpec, store: &dyn StoreServer) {
    if store.is_external() {
        eprintln!(
            "sigstop of {}: not run: it stops the server, and {} names an external one",
            store.name(),
            store.env_var()
        );
        return;
    }
    let resource = GuardedResource::start().await.expect("resource");
    let election = "faults/sigstop-store";
    let a = spec.candidate(election, "a", &resource);
    let b = spec.candidate(election, "b", &resource);
    let (first, elected) = next_leader(&[&a, &b], 0, spec.start_bound).await;
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
    assert_no_stale_write_accepted(&resource);
    assert_fenced(&[&a, &b]);
    stop_all(vec![a, b]).await;
}
