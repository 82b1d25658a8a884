//! The backend: connecting, and the election engine over [`AzurePrimitives`].

use std::sync::Arc;

use tenure_core::backend::primitive::{self, Primitives, Release};
use tenure_core::backend::DrivenBackend;
use tenure_core::{engine, ElectionName, ErrorKind, Result};

use crate::config::{AzureConfig, SCHEME};
use crate::error::TAG;
use crate::names::Layout;
use crate::prims::AzurePrimitives;
use crate::store::Store;

/// Azure Blob Storage as a tenure backend: the election engine over blobs (an election
/// is a blob of records written with `If-Match`, a session a blob its renewals rewrite).
/// See the crate docs.
///
/// Cheap to clone: clones share the HTTP client.
#[derive(Clone)]
pub struct AzureBackend {
    driven: DrivenBackend,
    prims: Arc<AzurePrimitives>,
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
            let exists = store.container_exists().await;
            if exists.map_err(|f| f.into_error(what))? {
                return Ok(());
            }
            if !config.creates_container() {
                return Err(TAG.own(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{what}: container {:?} does not exist and create_container is false",
                        config.container()
                    ),
                ));
            }
            let created = store.create_container().await;
            created.map_err(|f| f.into_error(what))
        };
        TAG.connecting(limit, &url, probe).await?;
        tracing::debug!(%config, "connected to Azure Blob Storage");
        let prims = Arc::new(AzurePrimitives::new(
            store,
            Layout::new(config.blob_prefix()),
        ));
        let driven = DrivenBackend::new(prims.clone(), SCHEME).with_endpoint(&url);
        Ok(AzureBackend { driven, prims })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &AzureConfig {
        &self.prims.sessions.store.config
    }

    /// The election engine's primitives this backend runs on (for the primitive
    /// suite).
    pub fn primitives(&self) -> Arc<dyn Primitives> {
        self.prims.clone()
    }

    /// End the grant of `election` now, as an operator would: the holder's record is
    /// removed (and the next waiter granted) in one conditional write, and the holder
    /// learns of the loss at its next poll. Nothing to do if nobody holds it.
    pub async fn break_lease(&self, election: &ElectionName) -> Result<()> {
        let snap = self.prims.read(election).await?;
        let Some(holder) = engine::holder(&snap) else {
            return Ok(());
        };
        let release = Release {
            session: holder.session(),
            token: holder.token,
            state: None,
        };
        let last = Some(snap.clone());
        primitive::resign(&*self.prims, election, release, last).await
    }

    /// End session `id` now, as its expiry would: its blob is deleted, so every reader
    /// counts it ended at once, and its owner's next renewal fails. Its records stay,
    /// dead, until the engine's next write clears them. For operators and tests.
    pub async fn expire_session(&self, id: &str) -> Result<()> {
        self.driven.revoke(id).await
    }

    /// Every request sent so far, renewals included.
    pub fn requests(&self) -> u64 {
        self.prims.sessions.store.requests()
    }
}

tenure_core::store_constructors!(AzureBackend, AzureConfig);
tenure_core::driven_backend!(AzureBackend, driven);
