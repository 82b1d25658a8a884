//! The backend: connection, leader reads and observation.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::{BackendSession, Capabilities, SessionEvents};
use tenure_core::{
    Backend, ElectionName, Error, LeaderInfo, LeaderStream, Member, MemberStream, Result, Retry,
    Timing,
};
use tokio::sync::watch;

use crate::client::EtcdClient;
use crate::config::EtcdConfig;
use crate::config::SCHEME;
use crate::error::{map, timed_out};
use crate::keys::{decode_leader, election_range, member_range, parse_lease_hex};
use crate::members::{self, Listed};
use crate::ops::{self, prefix_end};
use crate::proto::WatchCreateRequest;
use crate::session::EtcdSession;
use crate::shared::Shared;

/// etcd's shortest lease.
const MIN_TTL: Duration = Duration::from_secs(1);

/// An etcd v3 store as a tenure backend.
///
/// Each [`Session`](tenure_core::Session) is one etcd lease, kept alive over one
/// keep-alive stream whatever the number of elections it holds; each candidacy is a key
/// `<prefix>/<election>/@<lease-id>` attached to the lease; the key with the lowest
/// create revision leads and its create revision is the fencing token. A waiter watches
/// only the key just before its own, so a resign wakes exactly one waiter. A member is
/// a key `<prefix>/@members/<namespace>/@<id>` attached to its session's lease, so it
/// goes with the session; member lists are range reads and prefix watches.
///
/// Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct EtcdBackend {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.shared.config)
            .finish()
    }
}

impl EtcdBackend {
    /// Connect to etcd and check that it answers (and that the credentials are good)
    /// within the configured connect timeout: an unreachable endpoint gives
    /// `Unavailable` or `Timeout`, bad credentials `Unauthorized`, never a hang.
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let client = EtcdClient::connect(&config).await?;
        let limit = config.get_connect_timeout();
        let probe_key = format!("{}/", config.key_prefix());
        let connecting = async {
            client.authenticate().await?;
            // A read under the prefix: proves the server answers and that the user may
            // read there.
            let probe = ops::page(
                probe_key.clone().into_bytes(),
                prefix_end(probe_key.as_bytes()),
                1,
                0,
            );
            client
                .range(crate::proto::RangeRequest {
                    keys_only: true,
                    ..probe
                })
                .await
        };
        let endpoint = config.endpoints().join(",");
        match tokio::time::timeout(limit, connecting).await {
            Ok(r) => r.map_err(|e| map("connect", e).with_endpoint(&endpoint))?,
            Err(_) => return Err(timed_out("connect", limit).with_endpoint(&endpoint)),
        };
        tracing::debug!(%config, "connected to etcd");
        Ok(EtcdBackend {
            shared: Arc::new(Shared::new(client, config)),
        })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &EtcdConfig {
        &self.shared.config
    }

    /// Revoke the lease of the session with id `session_id` (see
    /// [`Session::id`](tenure_core::Session::id)) now, as etcd does when its TTL passes
    /// without a keep-alive: its keys are deleted and its holder learns of the loss. For
    /// operators and fault tests. An unknown lease is `SessionExpired`.
    pub async fn revoke_session(&self, session_id: &str) -> Result<()> {
        let lease = parse_lease_hex(session_id).ok_or_else(|| {
            Error::invalid(format!(
                "session id {session_id:?}: expected the 16 hex digits of an etcd lease id"
            ))
        })?;
        self.shared
            .call("revoke session", self.shared.client.lease_revoke(lease))
            .await
            .map(|_| ())
    }
}

/// One observed state, or the error shared by every observer.
type Observed = Result<Option<LeaderInfo>>;

tenure_core::store_constructors!(EtcdBackend, EtcdConfig);

#[async_trait]
impl Backend for EtcdBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::full()
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        if timing.ttl < MIN_TTL {
            return Err(Error::invalid(format!(
                "ttl: {:?} is below etcd's shortest lease of 1 s",
                timing.ttl
            )));
        }
        if timing.ttl.as_secs() > i64::MAX as u64 / 2 {
            return Err(Error::invalid(format!("ttl: {:?} is too long", timing.ttl)));
        }
        Ok(())
    }

    async fn open_session(
        &self,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Arc<dyn BackendSession>> {
        let session = EtcdSession::open(self.shared.clone(), ttl, events).await?;
        Ok(Arc::new(session))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        let range = election_range(self.shared.prefix(), election);
        let (first, _) = self.shared.first_candidate(&range).await?;
        Ok(first.map(|kv| decode_leader(&kv.value, kv.create_revision)))
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        let range = election_range(self.shared.prefix(), election);
        let (first, revision) = self.shared.first_candidate(&range).await?;
        let first = first.map(|kv| decode_leader(&kv.value, kv.create_revision));
        let (tx, rx) = watch::channel::<Observed>(Ok(first.clone()));
        tokio::spawn(observe_task(
            self.shared.clone(),
            range,
            first,
            revision,
            tx,
        ));
        Ok(tenure_core::backend::watch_stream(rx, |v| v))
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.shared.requests.election_requests())
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let range = member_range(self.shared.prefix(), namespace);
        let (members, _) = members::list(&self.shared, &range).await?;
        Ok(members.into_values().collect())
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let range = member_range(self.shared.prefix(), namespace);
        let (members, revision) = members::list(&self.shared, &range).await?;
        let first: Vec<Member> = members.values().cloned().collect();
        let (tx, rx) = watch::channel::<Listed>(Ok(first));
        tokio::spawn(members::watch_task(
            self.shared.clone(),
            range,
            members,
            revision,
            tx,
        ));
        Ok(tenure_core::backend::watch_stream(rx, |v| v))
    }
}

/// Follows one election for its observers: a watch on the election's range; after every
/// event (and after the watch breaks or is compacted) it re-reads the first key and
/// publishes it when it changed. Ends when every observer is gone.
async fn observe_task(
    shared: Arc<Shared>,
    range: String,
    mut last: Option<LeaderInfo>,
    revision: i64,
    tx: watch::Sender<Observed>,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut from = revision + 1;
    let mut failed = false;
    let publish = |state: Observed| {
        let _ = tx.send_replace(state);
    };
    loop {
        if tx.is_closed() {
            return;
        }
        shared.count();
        let create = WatchCreateRequest {
            key: range.as_bytes().to_vec(),
            range_end: prefix_end(range.as_bytes()),
            start_revision: from,
            ..Default::default()
        };
        let opened = shared.call("observe", shared.client.watch(create)).await;
        let mut stream = match opened {
            Ok(s) => {
                attempt = 0;
                Some(s)
            }
            Err(e) => {
                if !failed {
                    publish(Err(e));
                    failed = true;
                }
                None
            }
        };
        // Follow the stream until it breaks.
        while let Some(s) = stream.as_mut() {
            let message = tokio::select! {
                _ = tx.closed() => return,
                m = s.message() => m,
            };
            match message {
                Ok(Some(response)) if response.canceled => stream = None,
                Ok(Some(response)) if response.events.is_empty() => {}
                Ok(Some(_)) => {
                    shared.count();
                    match shared.first_candidate(&range).await {
                        Ok((kv, at)) => {
                            let state = kv.map(|kv| decode_leader(&kv.value, kv.create_revision));
                            from = from.max(at + 1);
                            if state != last || failed {
                                last = state.clone();
                                failed = false;
                                publish(Ok(state));
                            }
                        }
                        Err(_) => stream = None,
                    }
                }
                Ok(None) | Err(_) => stream = None,
            }
        }
        // The watch broke, was cancelled (compaction) or never opened: read the state
        // again and watch from there.
        let delay = retry.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(if attempt > 1 { delay } else { Duration::ZERO }) => {}
        }
        match shared.first_candidate(&range).await {
            Ok((kv, at)) => {
                let state = kv.map(|kv| decode_leader(&kv.value, kv.create_revision));
                from = at + 1;
                if state != last || failed {
                    last = state.clone();
                    failed = false;
                    publish(Ok(state));
                }
            }
            Err(e) => {
                if !failed {
                    publish(Err(e));
                    failed = true;
                }
            }
        }
    }
}
