//! The backend: connecting, leader reads, observation and member listings.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::Stream;
use tenure_core::backend::{poll_stream, Capabilities, Clause, DynSession, SessionEvents};
use tenure_core::{
    Backend, ElectionName, Error, ErrorKind, LeaderInfo, LeaderStream, Member, MemberStream,
    Result, Timing,
};

use crate::config::AzureConfig;
use crate::config::SCHEME;
use crate::error::TAG;
use crate::names::Layout;
use crate::session::AzureSession;
use crate::shared::Shared;
use crate::store::Store;

/// The shortest lease Azure grants, in seconds.
pub const MIN_LEASE_SECS: u64 = 15;
/// The longest finite lease Azure grants, in seconds.
pub const MAX_LEASE_SECS: u64 = 60;

const NO_HERD: &str = "Azure Blob Storage cannot notify: every waiter lists the election's \
    queue once per poll interval, so the request rate grows with the number of waiters \
    (waiters / poll interval), though it does not burst when the seat frees up (only the \
    first waiter reads and takes the seat)";

/// Azure Blob Storage as a tenure backend: an election is a blob, the seat its lease,
/// the fencing token a counter in its metadata. See the crate docs.
///
/// Cheap to clone: clones share the HTTP client.
#[derive(Clone)]
pub struct AzureBackend {
    pub(crate) shared: Arc<Shared>,
}

impl AzureBackend {
    /// Check, within the connect timeout, that the container can be reached with the
    /// credentials (creating it if missing and allowed): an unreachable endpoint gives
    /// `Unavailable` or `Timeout`, rejected credentials `Unauthorized`, a missing
    /// container that may not be created `InvalidArgument`.
    pub async fn connect(config: AzureConfig) -> Result<Self> {
        config.validate()?;
        let limit = config.get_connect_timeout();
        let store = Store::new(config.clone())?;
        let url = format!("{}/{}", config.blob_endpoint(), config.container());
        let what = "connect";
        let probe = async {
            let exists = store
                .container_exists()
                .await
                .map_err(|f| f.into_error(what))?;
            if !exists {
                if config.creates_container() {
                    store
                        .create_container()
                        .await
                        .map_err(|f| f.into_error(what))?;
                } else {
                    return Err(TAG.own(
                        ErrorKind::InvalidArgument,
                        format!(
                            "{what}: container {:?} does not exist and create_container is false",
                            config.container()
                        ),
                    ));
                }
            }
            Ok(())
        };
        TAG.connecting(limit, &url, probe).await?;
        tracing::debug!(%config, "connected to Azure Blob Storage");
        Ok(AzureBackend {
            shared: Arc::new(Shared::new(store, Layout::new(config.blob_prefix()))),
        })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &AzureConfig {
        &self.shared.store.config
    }

    /// Break the lease of `election` now (as an operator would with `az storage blob
    /// lease break`): the seat is free at once and its holder learns of the loss at its
    /// next renewal. For operators and fault tests.
    pub async fn break_lease(&self, election: &ElectionName) -> Result<()> {
        let name = self.shared.layout.election(election);
        match self.shared.store.break_lease(&name).await {
            Ok(()) => Ok(()),
            Err(f) if f.status == Some(404) || f.code_is("LeaseNotPresentWithLeaseOperation") => {
                Ok(())
            }
            Err(f) => Err(f.into_error("break lease")),
        }
    }

    /// Leave the notice a preempting waiter or a handover leaves (without breaking
    /// any lease): the grant `token` of `election`, held by the session `session`
    /// (its id), is asked to step down. For tests.
    #[doc(hidden)]
    pub async fn leave_notice(
        &self,
        session: &str,
        election: &ElectionName,
        token: u64,
    ) -> Result<()> {
        let notice = self.shared.layout.notice(session, election, token);
        self.shared
            .store
            .put_metadata_blob(&notice, std::collections::HashMap::new())
            .await
            .map_err(|f| f.into_error("leave notice"))
    }

    /// The names of the notices waiting for the session `session` (below its notice
    /// prefix). For tests.
    #[doc(hidden)]
    pub async fn notices(&self, session: &str) -> Result<Vec<String>> {
        let prefix = self.shared.layout.notices(session);
        let listed = self
            .shared
            .store
            .list(&prefix)
            .await
            .map_err(|f| f.into_error("list notices"))?;
        Ok(listed
            .into_iter()
            .filter_map(|b| b.name.strip_prefix(&prefix).map(str::to_string))
            .collect())
    }

    /// Every request sent so far, renewals included.
    pub fn requests(&self) -> u64 {
        self.shared.store.requests()
    }
}

impl AzureBackend {
    /// `read` of `name` now, then again every poll interval (Azure cannot notify), as a
    /// stream of the changes.
    async fn polled<T, F, Fut>(
        &self,
        name: &ElectionName,
        read: F,
    ) -> Result<Pin<Box<dyn Stream<Item = Result<T>> + Send>>>
    where
        T: PartialEq + Clone + Send + Sync + 'static,
        F: Fn(Arc<Shared>, ElectionName) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T>> + Send + 'static,
    {
        let (shared, name) = (self.shared.clone(), name.clone());
        let first = read(shared.clone(), name.clone()).await?;
        let poll = shared.store.config.get_poll_interval();
        Ok(poll_stream(first, poll, move || {
            read(shared.clone(), name.clone())
        }))
    }
}

tenure_core::store_constructors!(AzureBackend, AzureConfig);

#[async_trait]
impl Backend for AzureBackend {
    fn scheme(&self) -> &'static str {
        SCHEME
    }

    fn capabilities(&self) -> Capabilities {
        let poll = self.shared.store.config.get_poll_interval();
        Capabilities::full()
            .except(Clause::NoHerd, NO_HERD)
            .polling(poll)
            .prioritized()
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        let ttl = timing.ttl;
        let whole = ttl.subsec_nanos() == 0;
        if !whole || !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&ttl.as_secs()) {
            return Err(Error::invalid(format!(
                "ttl: {ttl:?} is not a lease Azure grants; blob leases last a whole number of \
                 seconds from {MIN_LEASE_SECS} to {MAX_LEASE_SECS}"
            )));
        }
        Ok(())
    }

    async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
        let secs = ttl.as_secs();
        if !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&secs) || ttl.subsec_nanos() != 0 {
            return Err(Error::invalid(format!(
                "ttl: {ttl:?} is not a whole number of seconds from {MIN_LEASE_SECS} to {MAX_LEASE_SECS}"
            )));
        }
        Ok(Arc::new(AzureSession::new(
            self.shared.clone(),
            secs as i32,
            events,
        )))
    }

    async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.shared.read_leader(election).await
    }

    async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.polled(election, |s, e| async move { s.read_leader(&e).await })
            .await
    }

    async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        self.shared.hand_over(election, to).await
    }

    fn election_requests(&self) -> Option<u64> {
        Some(self.shared.store.requests.election_requests())
    }

    async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.shared.read_members(namespace).await
    }

    async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.polled(namespace, |s, n| async move { s.read_members(&n).await })
            .await
    }
}
