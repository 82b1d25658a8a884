//! One fault suite for clustered stores (`etcd_cluster.rs`, `zookeeper_ensemble.rs`),
//! the way [`fault_suite`](crate::fault_suite) is one for single servers: each
//! scenario is an `async fn` over a [`StoreCluster`], and each store's file runs them
//! on its own cluster. A healthy leader must keep its seat through any one member's
//! crash, pause or restart; losing quorum loses it by the deadline, and quorum's
//! return elects again.
//!
//! The clusters run at the stores' production timing ([`ClusterTiming::Production`]:
//! etcd's defaults, ZooKeeper with `tickTime` 2000 ms, `initLimit` 5, `syncLimit` 2),
//! and the sessions use a TTL that rides out the store's own leader failover with the
//! core's default renewal shares ([`ETCD_TTL_FLOOR`], 5 s; [`ZOOKEEPER_TTL_FLOOR`], the
//! floor, 8 s). A labelled fast group (`fast_…` tests,
//! [`ClusterTiming::Fast`]) runs the same scenarios on clusters timed faster than
//! anyone runs them in production, with [`FAST_TTL`]. For measurements,
//! `TENURE_CLUSTER_TTL`, `TENURE_CLUSTER_RENEW_INTERVAL` and
//! `TENURE_CLUSTER_RENEW_DEADLINE` (seconds, e.g. `5`, `0.625`, `4.5`) change the
//! sessions' timing ([`session_timing`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tenure_core::testing::random_prefix;
use tenure_core::{
    Backend, Candidate, DynBackend, ElectionName, Leadership, LossReason, Session, Timing,
};

pub use crate::server::ClusterTiming;
use crate::{EtcdCluster, Members, Result, ZooKeeperEnsemble};

/// The session TTL of the fast group's scenarios ([`ClusterTiming::Fast`]).
pub const FAST_TTL: Duration = Duration::from_secs(5);

/// The sessions' TTL on a 3-member etcd cluster at etcd's default timing: 5 s, the TTL
/// issue 36 asks to ride out the raft leader's failover with. At the core's default
/// shares (every TTL/16, deadline TTL × 7/8), `renew_deadline − renew_interval` = 13/16
/// of the TTL must cover the longest time a renewal goes unanswered, measured up to
/// 2.57 s (`examples/store_failover.rs`: SIGSTOP 8 s and SIGKILL of the raft leader,
/// etcd 3.5.16 and 3.4.23): 3.2 s, so 5 s leaves 1.5 s of room. (The paused raft leader
/// may still revoke leases as it resumes after a pause past the TTL: etcd's own doing,
/// see [`StoreCluster::revokes_when_leader_resumes`].)
pub const ETCD_TTL_FLOOR: Duration = Duration::from_secs(5);

/// The same for a 3-server ZooKeeper ensemble at production timing (`tickTime` 2 s,
/// `syncLimit` 2): renewals (quorum writes) went unanswered up to 6.41 s when the
/// leader stopped (SIGSTOP 8 s, 15 runs of 6 sessions at TTL 7 and 8 s; the followers
/// wait `syncLimit` × `tickTime` before they elect, then the sessions re-attach), so
/// 13/16 of the TTL must be at least 6.41 s: 7.9 s; and a follower reports its sessions'
/// activity to the leader only every `tickTime` / 2 = 1 s, which the TTL's last eighth
/// must cover: 8 s.
/// So 8 s (with read renewals, a cut-off follower's 4 s had to fit there: 13 s with the
/// shares before).
pub const ZOOKEEPER_TTL_FLOOR: Duration = Duration::from_secs(8);

/// Runs the cluster tests of one test binary one at a time: each runs several store
/// processes, and two side by side on a 2-core machine starve each other's
/// heartbeats, which is not the fault under test.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The sessions' timing in the scenarios on `cluster`: [`Timing::from_ttl`] of its
/// [`ttl`](StoreCluster::ttl), with `TENURE_CLUSTER_TTL`,
/// `TENURE_CLUSTER_RENEW_INTERVAL` and `TENURE_CLUSTER_RENEW_DEADLINE` (seconds) in the
/// environment taking the place of the TTL, the renew interval and the renew deadline.
/// Panics on a value that is not a positive number of seconds or a timing that does
/// not validate.
pub fn session_timing(cluster: &dyn StoreCluster) -> Timing {
    let seconds = |name: &str| -> Option<Duration> {
        let value = std::env::var(name).ok()?;
        match value.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Some(Duration::from_secs_f64(s)),
            _ => panic!("{name}={value:?}: not a positive number of seconds"),
        }
    };
    let mut timing = Timing::from_ttl(seconds("TENURE_CLUSTER_TTL").unwrap_or(cluster.ttl()));
    if let Some(interval) = seconds("TENURE_CLUSTER_RENEW_INTERVAL") {
        timing.renew_interval = interval;
    }
    if let Some(deadline) = seconds("TENURE_CLUSTER_RENEW_DEADLINE") {
        timing.renew_deadline = deadline;
    }
    if let Err(e) = timing.validate() {
        panic!("the cluster sessions' timing {timing:?}: {e}");
    }
    timing
}

/// What the cluster scenarios need of a local store cluster: its members (faults on
/// one at a time), a backend over every member, and which member leads the store.
pub trait StoreCluster: std::ops::DerefMut<Target = Members> + Send + Sync {
    /// A backend over every member (the URL a user writes), default timeouts.
    fn connect(&self) -> BoxFuture<'_, DynBackend>;
    /// Waits until every running member serves and one leads; its index.
    fn wait_leader(&self) -> BoxFuture<'_, Result<usize>>;
    /// The members `session` talks to now (its renewals, its keep-alive stream).
    fn in_use<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<usize>>>;
    /// How the cluster is timed.
    fn cluster_timing(&self) -> ClusterTiming;
    /// The sessions' TTL on this cluster: the shortest that rides out the store's own
    /// leader failover at production timing, [`FAST_TTL`] in the fast group.
    fn ttl(&self) -> Duration;
    /// How long a member cut off from the quorum may go on answering.
    fn sync_window(&self) -> Duration {
        Duration::ZERO
    }
    /// Whether the store's raft leader, paused past the TTL, may delete a healthy
    /// session's seats as it resumes (by revoking leases it stopped counting for).
    fn revokes_when_leader_resumes(&self) -> bool {
        false
    }
    /// How many leases `member`'s own lessor revoked as expired so far, where the store
    /// says (etcd's `/metrics`); `None` elsewhere.
    fn leases_expired(&self, member: usize) -> BoxFuture<'_, Option<u64>> {
        let _ = member;
        Box::pin(async { None })
    }
}

/// The backend `url` gave, or a panic naming the URL.
fn connected<B: Backend + 'static>(url: &str, backend: tenure_core::Result<B>) -> DynBackend {
    match backend {
        Ok(b) => Arc::new(b),
        Err(e) => panic!("connect to {url}: {e}"),
    }
}

impl StoreCluster for EtcdCluster {
    /// The members this process is connected to: the scenarios run one client, so
    /// they are the session's (its requests go to one member and move on only when it
    /// does not answer).
    fn in_use<'a>(&'a self, _session: &'a Session) -> BoxFuture<'a, Result<Vec<usize>>> {
        Box::pin(async move { self.connected_from(std::process::id()) })
    }

    fn connect(&self) -> BoxFuture<'_, DynBackend> {
        Box::pin(async move {
            let url = format!("etcd://{}", self.hosts());
            connected(&url, tenure_etcd::EtcdBackend::from_url(&url).await)
        })
    }

    fn wait_leader(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(EtcdCluster::wait_leader(self))
    }

    fn cluster_timing(&self) -> ClusterTiming {
        self.timing()
    }

    fn ttl(&self) -> Duration {
        match self.timing() {
            ClusterTiming::Production => ETCD_TTL_FLOOR,
            ClusterTiming::Fast => FAST_TTL,
        }
    }

    /// Two election timeouts: a raft leader cut off from its quorum answers lease
    /// keep-alives from its own lessor until check-quorum steps it down, at the end of
    /// the first election timeout in which it heard from no quorum (seen at production
    /// timing: with the two other members stopped, no lost signal within the renew
    /// deadline and 1 s more, in 1 of 5 runs). A new leader extends every lease by the
    /// TTL and an election timeout as it takes over, so this costs liveness only.
    fn sync_window(&self) -> Duration {
        self.timing().etcd_election_timeout() * 2
    }

    /// etcd's raft leader, resumed after a pause past a lease's TTL, can revoke the
    /// lease although the new leader kept it alive (etcd issue 15247; seen here with
    /// 3.4.23 and 3.5.16: the session's key deleted at the next revision, within
    /// milliseconds of the resume, while every keep-alive had been answered).
    fn revokes_when_leader_resumes(&self) -> bool {
        true
    }

    fn leases_expired(&self, member: usize) -> BoxFuture<'_, Option<u64>> {
        Box::pin(async move { EtcdCluster::leases_expired(self, member).await.ok() })
    }
}

impl StoreCluster for ZooKeeperEnsemble {
    /// The server the session's connection is on (`cons`).
    fn in_use<'a>(&'a self, session: &'a Session) -> BoxFuture<'a, Result<Vec<usize>>> {
        Box::pin(async move { Ok(self.serving(&session.id()).await?.into_iter().collect()) })
    }

    fn connect(&self) -> BoxFuture<'_, DynBackend> {
        Box::pin(async move {
            let url = format!("zk://{}", self.hosts());
            connected(
                &url,
                tenure_zookeeper::ZooKeeperBackend::from_url(&url).await,
            )
        })
    }

    fn wait_leader(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(ZooKeeperEnsemble::wait_leader(self))
    }

    fn cluster_timing(&self) -> ClusterTiming {
        self.timing()
    }

    fn ttl(&self) -> Duration {
        match self.timing() {
            ClusterTiming::Production => ZOOKEEPER_TTL_FLOOR,
            ClusterTiming::Fast => FAST_TTL,
        }
    }

    /// (`syncLimit` + 1) × `tickTime`: a follower cut off from its leader goes on
    /// answering for `syncLimit` × `tickTime` (its read timeout on the leader), and a
    /// leader cut off from its followers until the first tick more than `syncLimit`
    /// ticks after their last acknowledgement (`Leader.lead`, `LearnerHandler.synced`),
    /// one tick more. (With a renew deadline of 7 s at TTL 11 s, production timing, the
    /// lost signal came more than `syncLimit` × `tickTime` + 1 s after the deadline.)
    fn sync_window(&self) -> Duration {
        self.timing().zookeeper_sync_window() + self.timing().zookeeper_tick()
    }
}

/// Runs the scenario named `scenario` (one of the six [`cluster_fault_tests!`](crate::cluster_fault_tests) stamps)
/// on `cluster`.
pub async fn run(scenario: &str, cluster: &mut dyn StoreCluster) {
    match scenario {
        "pausing_each_member" => pausing_each_member(cluster).await,
        "pausing_the_member_in_use" => pausing_the_member_in_use(cluster).await,
        "pausing_the_store_leader" => pausing_the_store_leader(cluster).await,
        "killing_the_store_leader" => killing_the_store_leader(cluster).await,
        "a_rolling_restart" => a_rolling_restart(cluster).await,
        "losing_quorum" => losing_quorum(cluster).await,
        other => panic!("no cluster fault scenario {other}"),
    }
}

/// Stamps the cluster scenarios as tests, each named after its scenario and run on a
/// fresh cluster, one at a time ([`SERIAL`]). `$start` starts a cluster at production
/// timing (its `.await` is a `Result` of a [`StoreCluster`]); `fast: $fast` adds the
/// labelled fast group, the same scenarios named `fast_<scenario>` on a cluster
/// `$fast` starts with [`ClusterTiming::Fast`].
#[macro_export]
macro_rules! cluster_fault_tests {
    ($start:expr) => {
        $crate::cluster_fault_tests!(@each $start,
            pausing_each_member => pausing_each_member,
            pausing_the_member_in_use => pausing_the_member_in_use,
            pausing_the_store_leader => pausing_the_store_leader,
            killing_the_store_leader => killing_the_store_leader,
            a_rolling_restart => a_rolling_restart,
            losing_quorum => losing_quorum);
    };
    ($start:expr, fast: $fast:expr) => {
        $crate::cluster_fault_tests!($start);
        $crate::cluster_fault_tests!(@each $fast,
            fast_pausing_each_member => pausing_each_member,
            fast_pausing_the_member_in_use => pausing_the_member_in_use,
            fast_pausing_the_store_leader => pausing_the_store_leader,
            fast_killing_the_store_leader => killing_the_store_leader,
            fast_a_rolling_restart => a_rolling_restart,
            fast_losing_quorum => losing_quorum);
    };
    (@each $start:expr, $($test:ident => $scenario:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let _serial = $crate::cluster_faults::SERIAL.lock().await;
            $crate::cluster_faults::logs();
            let mut cluster = $start.await.expect(concat!("start the cluster: ", stringify!($start)));
            $crate::cluster_faults::run(stringify!($scenario), &mut cluster).await;
        }
    )*};
}

/// With `RUST_LOG` set, logs to the test's output (shown when a test fails).
pub fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A fresh election name under `cluster/` (a random prefix, so runs never meet).
pub fn election(what: &str) -> ElectionName {
    match ElectionName::new(format!("cluster/{}/{what}", random_prefix())) {
        Ok(name) => name,
        Err(e) => panic!("election name for {what}: {e}"),
    }
}

/// A session with `ttl` and otherwise default timing on `backend`.
pub async fn session(backend: DynBackend, ttl: Duration) -> Session {
    session_with(backend, Timing::from_ttl(ttl)).await
}

/// A session with `timing` on `backend`.
pub async fn session_with(backend: DynBackend, timing: Timing) -> Session {
    match Session::open(backend, timing).await {
        Ok(s) => s,
        Err(e) => panic!("open a session: {e}"),
    }
}

/// Leadership of `election` as candidate `holder`.
pub async fn lead_in(session: &Session, election: &ElectionName) -> Leadership {
    match session
        .campaign(election, &Candidate::new("holder").expect("candidate"))
        .await
    {
        Ok(l) => l,
        Err(e) => panic!("campaign for {election}: {e}"),
    }
}

/// A campaign running in a task of its own, which gives its session back.
pub type Waiter = tokio::task::JoinHandle<(tenure_core::Result<Leadership>, Session)>;

/// `session` campaigning for `election` as `candidate` in a task of its own.
pub fn spawn_campaign(session: Session, election: &ElectionName, candidate: Candidate) -> Waiter {
    let election = election.clone();
    tokio::spawn(async move { (session.campaign(&election, &candidate).await, session) })
}

/// The grant `waiter` got within `within`, and its session; panics saying `what` if none.
pub async fn wait_grant(waiter: Waiter, within: Duration, what: &str) -> (Leadership, Session) {
    match tokio::time::timeout(within, waiter).await {
        Ok(Ok((Ok(l), s))) => (l, s),
        Ok(Ok((Err(e), _))) => panic!("{what}: campaign: {e}"),
        Ok(Err(e)) => panic!("{what}: task: {e}"),
        Err(_) => panic!("{what}: not within {within:?}"),
    }
}

/// Leadership of a fresh election named after `what`.
pub async fn lead(session: &Session, what: &str) -> Leadership {
    lead_in(session, &election(what)).await
}

/// A session on `backend` with `ttl` leads a fresh election named after `what`,
/// resigns and closes: the backend works end to end.
pub async fn elect_and_resign(backend: DynBackend, ttl: Duration, what: &str) {
    let s = session(backend, ttl).await;
    let l = lead(&s, what).await;
    assert!(l.is_leader(), "{what}: not leader after the grant");
    resign_and_close(l, s).await;
}

/// Resigns `l` and closes its session `s`.
pub async fn resign_and_close(l: Leadership, s: Session) {
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

/// Holds for `how_long`; panics if the lost signal fires meanwhile (`what` names the
/// fault) or if the leadership is not valid afterwards. A failure shows the end of
/// every member's log, where the store says what it did to the session.
pub async fn hold_through(
    cluster: &dyn StoreCluster,
    leadership: &Leadership,
    how_long: Duration,
    what: &str,
) {
    let lost = leadership.lost();
    let since = Instant::now();
    tokio::select! {
        _ = lost.cancelled() => panic!(
            "{what}: a healthy leader lost its seat ({:?}, {:.2} s into it; {:?})\n{}",
            leadership.loss_reason(),
            since.elapsed().as_secs_f64(),
            session_timing(cluster),
            member_logs(cluster)
        ),
        _ = tokio::time::sleep(how_long) => {}
    }
    assert!(leadership.is_leader(), "{what}: not leader afterwards");
}

/// The end of every member's log.
fn member_logs(cluster: &dyn StoreCluster) -> String {
    (0..cluster.len())
        .map(|i| format!("--- member {i}'s log ---\n{}", cluster.log_tail(i)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// After a member that was paused past the TTL resumed: `l` (of session `s`) holds
/// for `how_long` as in [`hold_through`], except where the member led the store when
/// it was paused (`was_store_leader`) and the store is one that may then delete a
/// healthy session's seat ([`StoreCluster::revokes_when_leader_resumes`]). There a
/// loss must be the store's revocation of the lease, which the client hears either as
/// the seat's deletion ([`LossReason::Revoked`], from the watch) or as the lease gone
/// ([`LossReason::SessionExpired`], from the next keep-alive), whichever comes first; a
/// renew deadline or anything else the client decided still fails. The store must say that
/// the paused member revoked it (its count of leases it revoked as expired,
/// `revoked_before` when it was paused, grew), and the seat must be granted again to a
/// new session, with a greater token, which is returned.
async fn hold_after_resume(
    cluster: &dyn StoreCluster,
    (s, l): (Session, Leadership),
    (member, was_store_leader, revoked_before): (usize, bool, Option<u64>),
    how_long: Duration,
    what: &str,
) -> (Session, Leadership) {
    if !(was_store_leader && cluster.revokes_when_leader_resumes()) {
        hold_through(cluster, &l, how_long, what).await;
        return (s, l);
    }
    let lost = l.lost();
    tokio::select! {
        _ = lost.cancelled() => {}
        _ = tokio::time::sleep(how_long) => {
            assert!(l.is_leader(), "{what}: not leader afterwards");
            return (s, l);
        }
    }
    let reason = l.loss_reason();
    if !matches!(
        reason,
        Some(LossReason::Revoked(_) | LossReason::SessionExpired)
    ) {
        panic!(
            "{what}: a healthy leader lost its seat ({reason:?}), not by the store's revocation\n{}",
            member_logs(cluster)
        );
    }
    let revoked_after = cluster.leases_expired(member).await;
    if let (Some(before), Some(after)) = (revoked_before, revoked_after) {
        assert!(
            after > before,
            "{what}: the seat was deleted ({reason:?}), but member {member}, which was \
             paused, revoked no lease as expired ({before} before its pause, {after} now)\n{}",
            member_logs(cluster)
        );
    }
    eprintln!(
        "{what}: the store deleted the seat as its paused raft leader resumed ({reason:?}; \
         leases member {member} revoked as expired: {revoked_before:?} before its pause, \
         {revoked_after:?} after); electing again"
    );
    let (token, election) = (l.token(), l.election().clone());
    drop(l);
    let _ = s.close().await;
    let s = cluster_session(cluster).await;
    let within = session_timing(cluster).ttl * 2;
    let l = match tokio::time::timeout(within, lead_in(&s, &election)).await {
        Ok(l) => l,
        Err(_) => panic!("{what}: the seat was not granted again within {within:?}"),
    };
    assert!(
        l.token() > token,
        "{what}: the new grant's token must be greater"
    );
    (s, l)
}

/// A session with [`session_timing`] over every member of `cluster`.
async fn cluster_session(cluster: &dyn StoreCluster) -> Session {
    session_with(cluster.connect().await, session_timing(cluster)).await
}

async fn leader_of(cluster: &dyn StoreCluster) -> usize {
    match cluster.wait_leader().await {
        Ok(i) => i,
        Err(e) => panic!("the store's leader: {e}"),
    }
}

/// Member `member` (`what` names it) paused for `paused` under the leadership `held`,
/// which must hold through it ([`hold_through`]), then resumed, after which it must hold
/// for `after` ([`hold_after_resume`]); the leadership afterwards.
async fn pause_member(
    cluster: &dyn StoreCluster,
    held: (Session, Leadership),
    member: usize,
    (paused, after): (Duration, Duration),
    what: &str,
) -> (Session, Leadership) {
    let store_leader = leader_of(cluster).await;
    let revoked_before = cluster.leases_expired(member).await;
    cluster.pause(member).expect("pause");
    let paused_what = format!("{what} paused for {paused:?}");
    hold_through(cluster, &held.1, paused, &paused_what).await;
    cluster.resume(member).expect("resume");
    let was_leader = member == store_leader;
    let (resumed, after_what) = (
        (member, was_leader, revoked_before),
        format!("{what} resumed"),
    );
    hold_after_resume(cluster, held, resumed, after, &after_what).await
}

/// Each member in turn paused past the TTL under one leadership, so the member the
/// session talks to (and whichever it moves to) is paused at least once.
pub async fn pausing_each_member(cluster: &dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let l = lead(&s, "pause-each").await;
    let mut held = (s, l);
    for member in 0..cluster.len() {
        let times = (
            session_timing(cluster).ttl + Duration::from_secs(1),
            Duration::from_secs(1),
        );
        held = pause_member(cluster, held, member, times, &format!("member {member}")).await;
    }
    resign_and_close(held.1, held.0).await;
}

/// The member the session talks to (for etcd, the one serving its lease keep-alives)
/// paused for 8 s (past the TTL of etcd's floor and the fast group's), then resumed:
/// the session moves to another member.
pub async fn pausing_the_member_in_use(cluster: &dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let l = lead(&s, "pause-in-use").await;
    let used = match cluster.in_use(&s).await {
        Ok(used) => used,
        Err(e) => panic!("which member the session uses: {e}"),
    };
    let Some(&member) = used.first() else {
        panic!("the session is connected to no member");
    };
    eprintln!("the session talks to member(s) {used:?}: pausing {member}");
    let times = (Duration::from_secs(8), Duration::from_secs(2));
    let (s, l) = pause_member(cluster, (s, l), member, times, "the member in use").await;
    let moved = cluster.in_use(&s).await.unwrap_or_default();
    eprintln!("after member {member}'s pause the session talks to {moved:?}");
    resign_and_close(l, s).await;
}

/// The store's own leader paused for 8 s, then resumed.
pub async fn pausing_the_store_leader(cluster: &dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let l = lead(&s, "pause-leader").await;
    let leader = leader_of(cluster).await;
    let times = (Duration::from_secs(8), Duration::from_secs(4));
    let (s, l) = pause_member(cluster, (s, l), leader, times, "store leader").await;
    resign_and_close(l, s).await;
}

/// The store's own leader killed (SIGKILL), down past the TTL, then restarted.
pub async fn killing_the_store_leader(cluster: &mut dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let l = lead(&s, "kill-leader").await;
    let leader = leader_of(cluster).await;
    cluster.kill(leader).await.expect("kill");
    // Past the TTL: a session given up while the rest keeps quorum would be gone.
    hold_through(
        cluster,
        &l,
        session_timing(cluster).ttl + Duration::from_secs(2),
        "store leader killed",
    )
    .await;
    cluster.restart(leader).await.expect("restart");
    hold_through(cluster, &l, Duration::from_secs(3), "store leader back").await;
    resign_and_close(l, s).await;
}

/// A rolling restart: one member at a time, each down for 2 s, the next only once
/// all serve again.
pub async fn a_rolling_restart(cluster: &mut dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let l = lead(&s, "rolling").await;
    for member in 0..cluster.len() {
        cluster.kill(member).await.expect("kill");
        hold_through(
            cluster,
            &l,
            Duration::from_secs(2),
            &format!("member {member} down"),
        )
        .await;
        cluster.restart(member).await.expect("restart");
        leader_of(cluster).await;
        hold_through(
            cluster,
            &l,
            Duration::from_secs(1),
            &format!("member {member} back"),
        )
        .await;
    }
    resign_and_close(l, s).await;
}

/// Two of three members stopped past the TTL: no renewal can be confirmed, so the
/// lost signal fires by the renew deadline (plus the window in which a member cut
/// off from the quorum may still answer); once quorum returns the same session is
/// elected again with a larger token.
pub async fn losing_quorum(cluster: &dyn StoreCluster) {
    let s = cluster_session(cluster).await;
    let election = election("quorum");
    let l = lead_in(&s, &election).await;
    let timing = session_timing(cluster);
    cluster.pause(0).expect("pause");
    cluster.pause(1).expect("pause");
    let paused = Instant::now();
    tokio::time::timeout(
        timing.renew_deadline + cluster.sync_window() + Duration::from_secs(1),
        l.lost().cancelled(),
    )
    .await
    .expect("the lost signal fires by the renew deadline without quorum");
    assert!(!l.is_leader());
    let waited = timing.ttl + Duration::from_secs(1);
    tokio::time::sleep(waited.saturating_sub(paused.elapsed())).await;
    cluster.resume(0).expect("resume");
    cluster.resume(1).expect("resume");
    let back = Instant::now();
    let again = tokio::time::timeout(
        timing.ttl + Duration::from_secs(5),
        s.campaign(&election, &Candidate::new("holder").expect("candidate")),
    )
    .await
    .expect("elected again within TTL + 5 s of quorum's return")
    .expect("campaign");
    assert!(again.token() > l.token(), "a new grant has a larger token");
    eprintln!("elected again {:?} after quorum returned", back.elapsed());
    resign_and_close(again, s).await;
}
