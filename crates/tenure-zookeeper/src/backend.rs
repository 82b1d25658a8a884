//! The backend: connection, the reader session, leader reads and observation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{
    Capabilities, Clause, DrivenBackend, DynSession, FailoverFloor, Primitives, Published,
    SessionEvents,
};
use tenure_core::{
    Backend, ElectionName, Error, ErrorKind, LeaderInfo, LeaderStream, Member, MemberStream,
    Result, Retry, Timing,
};
use zookeeper_client::{Acls, CreateMode};

use crate::config::ZooKeeperConfig;
use crate::config::ZooKeeperLayout;
use crate::curator::{curator_refuses, ZkSession, CURATOR_NO_PRIORITY};
use crate::error::{map, TAG};
use crate::members;
use crate::nodes::election_dir;
use crate::prims::ZkPrimitives;
use crate::shared::{connect_client, is_no_node, Shared};
use crate::SCHEME;

/// ZooKeeper (an ensemble or one server) as a tenure backend.
///
/// Each [`Session`](tenure_core::Session) is one ZooKeeper session whose timeout is the
/// session's TTL. In the default layout the election engine
/// ([`DrivenBackend`]) runs over the crate's ZooKeeper primitives: an election is the
/// data of its node, written by one conditional `multi` per step, and the fencing token
/// is the zxid of the write that granted the seat. With `layout=curator` each candidacy
/// is an ephemeral sequential node `<chroot>/<election>/_c_<uuid>-latch-<sequence>` as
/// Curator's `LeaderLatch` names them; the lowest sequence leads and its creation zxid
/// (`czxid`) is the fencing token, and a waiter watches only the node just before its
/// own. Leader reads, observers and member lists use one extra reader session per
/// backend; members are ephemeral sequential nodes under `<chroot>/:members`.
///
/// Cheap to clone: clones share the reader session.
#[derive(Clone)]
pub struct ZooKeeperBackend {
    pub(crate) shared: Arc<Shared>,
    prims: Arc<ZkPrimitives>,
    /// The election engine over `prims` (the default layout).
    driven: DrivenBackend,
}

tenure_core::store_constructors!(ZooKeeperBackend, ZooKeeperConfig);

impl ZooKeeperBackend {
    /// Connect to ZooKeeper, create the chroot if it is missing and check that it can be
    /// read, all within the configured connect timeout: an unreachable ensemble gives
    /// `Unavailable` or `Timeout`, a chroot the credentials may not use `Unauthorized`,
    /// never a hang.
    pub async fn connect(config: ZooKeeperConfig) -> Result<Self> {
        config.validate()?;
        let limit = config.get_connect_timeout();
        let setup = async {
            let chroot = config.chroot_or_root();
            if chroot != "/" {
                let root = connect_client(
                    &config.clone().chroot("/"),
                    config.get_session_timeout(),
                    None,
                    false,
                )
                .await?;
                let missing = tokio::time::timeout(limit, root.check_stat(chroot))
                    .await
                    .map_err(|_| TAG.timed_out("connect", limit))?
                    .map_err(|e| map("connect: check chroot", e))?
                    .is_none();
                if missing {
                    let options = CreateMode::Persistent.with_acls(Acls::anyone_all());
                    tokio::time::timeout(limit, root.mkdir(chroot, &options))
                        .await
                        .map_err(|_| TAG.timed_out("connect", limit))?
                        .map_err(|e| map(&format!("connect: create chroot {chroot}"), e))?;
                }
            }
            let reader = connect_client(&config, config.get_session_timeout(), None, false).await?;
            tokio::time::timeout(limit, reader.list_children("/"))
                .await
                .map_err(|_| TAG.timed_out("connect", limit))?
                .map_err(|e| map(&format!("connect: read chroot {chroot}"), e))?;
            Ok::<_, Error>(reader)
        };
        let hosts = config.connect_string();
        let reader = TAG.connecting(limit, &hosts, setup).await?;
        tracing::debug!(%config, "connected to ZooKeeper");
        let shared = Arc::new(Shared::new(config, reader));
        let prims = Arc::new(ZkPrimitives::new(shared.clone()));
        let driven = DrivenBackend::new(prims.clone(), SCHEME);
        Ok(ZooKeeperBackend {
            shared,
            prims,
            driven,
        })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &ZooKeeperConfig {
        &self.shared.config
    }

    /// The store primitives the election engine runs on, over this backend's reader
    /// session (for the primitive suite and store tools).
    pub fn primitives(&self) -> Arc<dyn Primitives> {
        self.prims.clone()
    }

    fn curator(&self) -> bool {
        self.shared.config.get_layout() == ZooKeeperLayout::Curator
    }

    /// The ZooKeeper requests this backend sent so far (renewals included).
    pub fn round_trips(&self) -> u64 {
        self.shared.requests.election_requests() + self.shared.requests.renewals()
    }

    /// The session timeout the server granted the reader session (the configured one,
    /// clamped by the server to its `[minSessionTimeout, maxSessionTimeout]`).
    pub async fn negotiated_session_timeout(&self) -> Duration {
        self.shared.reader_session_timeout().await
    }

    /// End the ZooKeeper session with id `session_id` (see
    /// [`Session::id`](tenure_core::Session::id), 16 hex digits) now, from a second
    /// connection to the same session, as the server does when its timeout passes: its
    /// ephemeral nodes go and its holder learns that the session expired. Only sessions
    /// opened through this backend (or its clones) are known. For operators and fault
    /// tests.
    pub async fn expire_session(&self, session_id: &str) -> Result<()> {
        let (info, _) = self.shared.session(session_id).ok_or_else(|| {
            TAG.own(
                ErrorKind::SessionExpired,
                format!("session {session_id}: not open through this backend"),
            )
        })?;
        // Closing from a second connection races with the owner re-attaching (the server
        // drops the owner's connection when another one takes the session over), so
        // close until a new connection to the session finds it gone.
        let mut last = None;
        for _ in 0..10 {
            match connect_client(
                &self.shared.config,
                Duration::from_secs(10),
                Some(info.clone()),
                false,
            )
            .await
            {
                Ok(other) => {
                    drop(other);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) if e.kind() == ErrorKind::SessionExpired => return Ok(()),
                // The owner re-attached while this connection was being set up, and
                // the server dropped this one: the session lives; close it again.
                Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Unavailable) => {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(TAG.own(
            ErrorKind::Backend,
            format!(
                "session {session_id}: still open after 10 attempts to close it{}",
                last.map(|e| format!(" (last: {e})")).unwrap_or_default()
            ),
        ))
    }
}

impl ZooKeeperBackend {
    /// Drop the connection of the session with id `session_id` (opened through this
    /// backend) without closing the session, as a crashed process would: the server
    /// expires the session after its timeout and deletes its nodes. The tenure session
    /// learns nothing until then. For fault tests and benchmarks (`Session::abandon`
    /// followed by this is a crash; `abandon` alone leaves it to the renewal watchdog).
    pub fn drop_connection(&self, session_id: &str) -> Result<()> {
        let (_, slot) = self.shared.session(session_id).ok_or_else(|| {
            TAG.own(
                ErrorKind::SessionExpired,
                format!("session {session_id}: not open through this backend"),
            )
        })?;
        let client = slot.lock().ok().and_then(|mut c| c.take());
        drop(client);
        Ok(())
    }
}

#[async_trait]
impl Backend for ZooKeeperBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        match self.curator() {
            true => Capabilities::full()
                .batched(crate::curator::BATCH)
                .except(Clause::Priority, CURATOR_NO_PRIORITY),
            false => self.driven.capabilities(),
        }
    }

    /// Errors where a TTL cannot work at all (the server's own range, by default
    /// [2, 20] × `tickTime`, is checked when the session opens: the negotiated timeout
    /// must be the TTL); a warning (once per timing and process) where the TTL works
    /// but is below the floor that rides out an ensemble leader's failure at production
    /// timing (`tickTime` 2000 ms, `syncLimit` 2, as Kafka's operations guide configures
    /// ZooKeeper): a renewal sent just before the leader stops has `renew_deadline −
    /// renew_interval` to be answered, and renewals went unanswered up to 6.41 s then
    /// (the followers wait `syncLimit` × `tickTime` before they elect, then the sessions
    /// re-attach; `integration/examples/store_failover.rs`, SIGSTOP 8 s of the leader,
    /// 15 runs of 6 sessions at TTL 7 and 8 s).
    ///
    /// A renewal is a write the leader commits with a quorum, so no member cut off from
    /// the quorum confirms one (a read renewal, confirmed by a cut-off follower for
    /// `syncLimit` × `tickTime`, needed 4 s of `ttl − renew_deadline`). What is left
    /// is the follower's report: the leader, which expires sessions, learns of a
    /// follower's sessions' activity only when the follower answers its ping, every
    /// `tickTime` / 2, so it may count the session's last sign of life up to 1 s before
    /// a renewal the holder saw confirmed, and `ttl − renew_deadline` must cover that.
    /// With the default shares (TTL/16, TTL × 7/8) the floor is 8 s (see the README,
    /// *The shortest TTL*).
    fn check_timing(&self, timing: &Timing) -> Result<()> {
        /// The longest a renewal went unanswered while the ensemble replaced a stopped
        /// leader.
        const FAILOVER: Duration = Duration::from_millis(6410);
        /// `tickTime` / 2 at production timing: how late a follower reports a session's
        /// activity to the leader.
        const REPORT_LAG: Duration = Duration::from_secs(1);
        if timing.ttl.as_millis() > i32::MAX as u128 {
            return Err(Error::invalid(format!("ttl: {:?} is too long", timing.ttl)));
        }
        if timing.renew_interval * 2 >= timing.ttl {
            return Err(Error::invalid(format!(
                "renew_interval: {:?} must be below half the ttl ({:?}): a ZooKeeper session \
                 whose renewals stop for half its ttl is treated as abandoned and left to expire",
                timing.renew_interval, timing.ttl
            )));
        }
        if timing.ttl < Duration::from_millis(100) {
            return Err(Error::invalid(format!(
                "ttl: {:?} is below any ZooKeeper session timeout (the server's minimum is 2 × tickTime)",
                timing.ttl
            )));
        }
        let floor = FailoverFloor {
            failover: FAILOVER,
            sync_window: REPORT_LAG,
        };
        floor.warn_below("zookeeper", timing, |shortest| {
            format!(
                "ttl {:?} is below the floor for a ZooKeeper ensemble at production timing \
                 (tickTime 2000 ms, syncLimit 2): a renewal sent just before the ensemble \
                 leader stops has renew_deadline - renew_interval = {:?} to be answered, and \
                 renewals went unanswered up to {FAILOVER:?} then (syncLimit x tickTime \
                 before the followers elect, then the sessions re-attach), so a healthy \
                 leader can lose its seat then; and a follower reports its sessions' \
                 activity to the leader only every tickTime / 2 = {REPORT_LAG:?}, which must \
                 stay within ttl - renew_deadline = {:?} lest the seat be granted elsewhere \
                 while this holder still counts itself leader. With these renewal shares \
                 the shortest ttl for that ensemble is {shortest} (8 s with the default \
                 shares; shorter with a shorter tickTime or syncLimit; see the \
                 tenure-zookeeper README)",
                timing.ttl,
                timing.renew_deadline.saturating_sub(timing.renew_interval),
                timing.ttl.saturating_sub(timing.renew_deadline),
            )
        });
        Ok(())
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        if !self.curator() {
            return self.driven.open_session(ttl, events).await;
        }
        let session = ZkSession::open(self.shared.clone(), ttl, events).await?;
        Ok(Arc::new(session))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        if !self.curator() {
            return self.driven.leader(election).await;
        }
        let client = self.shared.reader().await?;
        self.shared
            .read_leader(&client, &election_dir(election))
            .await
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        if !self.curator() {
            return self.driven.observe(election).await;
        }
        let client = self.shared.reader().await?;
        let dir = election_dir(election);
        let first = self.shared.read_leader(&client, &dir).await?;
        let (published, stream) = Published::new(first);
        tokio::spawn(observe_task(self.shared.clone(), dir, published));
        Ok(stream)
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        match self.curator() {
            true => Err(curator_refuses("handover")),
            false => self.driven.handover(election, to).await,
        }
    }

    fn election_requests(&self) -> Option<u64> {
        match self.curator() {
            true => Some(self.shared.requests.election_requests()),
            false => self.driven.election_requests(),
        }
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        members::list(&self.shared, namespace).await
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        members::watch(&self.shared, namespace).await
    }
}

/// Follows one election for its observers: a child watch on the election's node (an
/// existence watch while it does not exist); after each trigger, re-read the leader and
/// publish it when it changed. Ends when every observer is gone.
async fn observe_task(
    shared: Arc<Shared>,
    dir: String,
    mut published: Published<Option<LeaderInfo>>,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    loop {
        if published.is_closed() {
            return;
        }
        let step = async {
            let client = shared.reader().await?;
            // Arm the watch first, then read, so no change falls between.
            let watcher = match shared
                .requests
                .call("observe", client.list_and_watch_children(&dir))
                .await
            {
                Ok((_, w)) => w,
                Err(e) if is_no_node(&e) => {
                    let (_, w) = shared
                        .requests
                        .call("observe", client.check_and_watch_stat(&dir))
                        .await?;
                    w
                }
                Err(e) => return Err(e),
            };
            let state = shared.read_leader(&client, &dir).await?;
            Ok::<_, Error>((state, watcher))
        };
        match step.await {
            Ok((state, watcher)) => {
                attempt = 0;
                published.publish(Ok(state));
                tokio::select! {
                    _ = published.closed() => return,
                    _ = watcher.changed() => {}
                }
            }
            Err(e) => {
                published.publish(Err(e));
                let delay = retry.delay(attempt);
                attempt = attempt.saturating_add(1);
                tokio::select! {
                    _ = published.closed() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}
