//! The backend: connection, and in the default layout the election engine driven
//! over the store's primitives; with `layout=go`, Go's recipe (see [`crate::session`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::{MemberStore, Primitives};
use tenure_core::backend::{
    revision_token, Capabilities, Clause, DrivenBackend, DynSession, Published, SessionEvents,
};
use tenure_core::{
    Backend, ElectionName, Error, LeaderInfo, LeaderStream, Member, MemberStream, Result, Timing,
};

use crate::client::EtcdClient;
use crate::config::EtcdConfig;
use crate::config::SCHEME;
use crate::error::{map, TAG};
use crate::follow::{follow, Follower};
use crate::keys::{parse_lease_hex, EtcdLayout};
use crate::members::EtcdMembers;
use crate::ops;
use crate::primitives::EtcdPrimitives;
use crate::proto::{Event, KeyValue, LeaseRevokeRequest, RangeRequest};
use crate::session::EtcdSession;
use crate::shared::Shared;

/// An etcd v3 store as a tenure backend.
///
/// Each [`Session`](tenure_core::Session) is one etcd lease. In the default layout
/// the election engine of `tenure-core` decides, over this crate's primitives: an
/// election is the keys under `<prefix>/<election>/@` (a revision key every write
/// rewrites, and a record key per candidacy attached to its session's lease), written
/// by transactions that commit only at the revision they were decided on; a grant's
/// fencing token is the etcd revision of the write that made it. With `layout=go` the
/// keys are Go's `concurrency.Election`'s and the oldest key leads (no priorities). A
/// member is a key `<prefix>/@members/<namespace>/@<id>` attached to its session's
/// lease, so it goes with the session; member lists are range reads, watched on the
/// backend's one prefix watch.
///
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
    /// The default layout's engine and the primitives it runs on (`None` with
    /// `layout=go`).
    driven: Option<(DrivenBackend, Arc<EtcdPrimitives>)>,
}

impl EtcdBackend {
    /// Connect to etcd and check that it answers (and that the credentials are good)
    /// within the configured connect timeout: an unreachable endpoint gives
    /// `Unavailable` or `Timeout`, bad credentials `Unauthorized`, never a hang.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let shared = Arc::new(Shared::new(EtcdClient::connect(&config).await?, config));
        let client = &shared.client;
        let connecting = async {
            client.authenticate().await.map_err(|e| map("connect", e))?;
            // A read under the prefix: proves the server answers and that the user may
            // read there.
            let probe = RangeRequest {
                limit: 1,
                keys_only: true,
                ..ops::all_under(shared.keys.root())
            };
            client.call(probe).await.map_err(|e| map("connect", e))
        };
        let config = &shared.config;
        let endpoint = config.endpoints().join(",");
        TAG.connecting(config.get_connect_timeout(), &endpoint, connecting)
            .await?;
        tracing::debug!(%config, "connected to etcd");
        let driven = (shared.keys.layout() == EtcdLayout::Tenure).then(|| {
            let prims = Arc::new(EtcdPrimitives::new(shared.clone()));
            (DrivenBackend::new(prims.clone(), SCHEME), prims)
        });
        Ok(EtcdBackend { shared, driven })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// How many messages this backend has sent to etcd (each one round trip: unary
    /// calls, streams opened, keep-alives and watches sent on open streams; renewals,
    /// elections and members alike), for measurements.
    pub fn round_trips(&self) -> u64 {
        self.shared.client.sent.load(Ordering::Relaxed)
    }

    /// How many unary requests this backend has sent to etcd (transactions, reads,
    /// lease grants and revokes; not the keep-alives and watches sent on open streams),
    /// for measurements.
    pub fn unary_calls(&self) -> u64 {
        self.shared.client.unary.load(Ordering::Relaxed)
    }

    /// The member lists of the Go layout (the engine's are the primitives').
    fn go_members(&self) -> EtcdMembers {
        EtcdMembers {
            shared: self.shared.clone(),
        }
    }

    /// The engine's primitives over this backend's connection (for the primitive
    /// suite).
    pub fn primitives(&self) -> Arc<dyn Primitives> {
        match &self.driven {
            Some((_, prims)) => prims.clone(),
            None => Arc::new(EtcdPrimitives::new(self.shared.clone())),
        }
    }

    /// Revoke the lease of the session with id `session_id` (see
    /// [`Session::id`](tenure_core::Session::id)) now, as etcd does when its TTL passes
    /// without a keep-alive: its keys are deleted and its holder learns of the loss. For
    /// operators and fault tests. An unknown lease is `SessionExpired`.
    pub async fn revoke_session(&self, session_id: &str) -> Result<()> {
        let revoke = LeaseRevokeRequest {
            id: parse_lease_hex(session_id)?,
        };
        self.shared.call("revoke session", revoke).await.map(|_| ())
    }
}

tenure_core::store_constructors!(EtcdBackend, EtcdConfig);

#[async_trait]
impl Backend for EtcdBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        match &self.driven {
            Some((driven, _)) => driven.capabilities(),
            None => Capabilities::full()
                .batched(crate::session::BATCH)
                .except(Clause::Observe, GO_LEADER_ID)
                .except(Clause::Priority, GO_NO_PRIORITY),
        }
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        match &self.driven {
            Some((driven, _)) => driven.check_timing(timing),
            None => crate::config::check_ttl(timing),
        }
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        if let Some((driven, _)) = &self.driven {
            return driven.open_session(ttl, events).await;
        }
        let session = EtcdSession::open(self.shared.clone(), ttl, events).await?;
        Ok(Arc::new(session))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        if let Some((driven, _)) = &self.driven {
            return driven.leader(election).await;
        }
        let mut leader = Leader::of(&self.shared, election);
        Ok(leader.read(&self.shared).await?.0)
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        if let Some((driven, _)) = &self.driven {
            return driven.observe(election).await;
        }
        let mut leader = Leader::of(&self.shared, election);
        let (first, revision) = leader.read(&self.shared).await?;
        let (published, stream) = Published::new(first);
        let (shared, range) = (self.shared.clone(), leader.range.clone());
        tokio::spawn(follow(shared, range, revision, published, leader));
        Ok(stream)
    }

    fn election_requests(&self) -> Option<u64> {
        match &self.driven {
            Some((driven, _)) => driven.election_requests(),
            None => Some(self.shared.requests.election_requests()),
        }
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        match &self.driven {
            Some((driven, _)) => driven.handover(election, to).await,
            None => Err(Error::new(
                tenure_core::ErrorKind::Unsupported,
                format!("handover is not supported: {GO_NO_PRIORITY}"),
            )
            .with_backend(SCHEME)),
        }
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        if let Some((driven, _)) = &self.driven {
            return driven.members(namespace).await;
        }
        self.go_members().list(namespace).await
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        if let Some((driven, _)) = &self.driven {
            return driven.watch_members(namespace).await;
        }
        self.go_members().watch(namespace).await
    }
}

/// Why clause 14 is declared with the Go layout: the core names it when it refuses a
/// priority or a handover.
const GO_NO_PRIORITY: &str = "with layout=go the election is shared with Go's \
    concurrency.Election, which has no priority (the default layout keeps them)";

/// Why clause 9 is declared with the Go layout.
const GO_LEADER_ID: &str = "with layout=go the leader's candidate id is not stored (Go's \
    concurrency.Election keeps only the proposal, which is the candidate's value): leader() \
    and observe() report the value, the token and, as the id, the lease id in the leader's key";

/// One election's leader in the Go layout (the first key of the election range by
/// create revision), read again after every batch of events.
struct Leader {
    range: String,
}

impl Leader {
    fn of(shared: &Shared, election: &ElectionName) -> Self {
        Leader {
            range: shared.keys.election_range(election),
        }
    }
}

impl Follower for Leader {
    type State = Option<LeaderInfo>;

    async fn read(&mut self, shared: &Shared) -> Result<(Option<LeaderInfo>, i64)> {
        let read = ops::first_by_create(&self.range);
        let resp = shared.call("read leader", read).await?;
        let leader = resp.kvs.first().map(|kv| go_leader(&self.range, kv));
        Ok((leader, ops::revision(&resp.header)))
    }

    async fn apply(&mut self, shared: &Shared, _: &[Event]) -> Option<Option<LeaderInfo>> {
        self.read(shared).await.ok().map(|(state, _)| state)
    }
}

/// The Go layout's leader whose key (in the election `range`) is `kv`: its id is the
/// key's lease id, as written in the key (Go stores nothing else that names a
/// candidate), its value Go's proposal, its token the key's create revision.
fn go_leader(range: &str, kv: &KeyValue) -> LeaderInfo {
    let key = String::from_utf8_lossy(&kv.key);
    LeaderInfo {
        id: key.strip_prefix(range).unwrap_or(&key).to_string(),
        value: String::from_utf8_lossy(&kv.value).into_owned(),
        token: revision_token(kv.create_revision),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_go_leader_is_the_proposal_and_its_id_the_lease() {
        let range = "svc/billing/";
        let kv = KeyValue {
            key: format!("{range}694da216892faf05").into_bytes(),
            value: b"go proposal \xff".to_vec(),
            create_revision: 42,
            ..KeyValue::default()
        };
        let info = go_leader(range, &kv);
        assert_eq!(info.id, "694da216892faf05");
        assert_eq!(info.value, "go proposal \u{fffd}");
        assert_eq!(info.token.get(), 42);
    }
}
