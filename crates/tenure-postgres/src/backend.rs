//! The backend: connecting (and creating or upgrading the schema), and the engine
//! driven over the store's primitives.

use std::sync::Arc;

use tenure_core::backend::primitive::Primitives;
use tenure_core::backend::{DrivenBackend, Requests};
use tenure_core::{CancellationToken, ErrorKind, Result};
use tokio_postgres::Client;

use crate::config::{PostgresConfig, SCHEME};
use crate::error::{map, TAG};
use crate::link::{Hub, Opener, Requester};
use crate::store::{PostgresStore, SCHEMA};

/// A PostgreSQL database as a tenure backend.
///
/// The election engine of `tenure-core` decides; this crate supplies its primitives:
/// sessions are rows whose expiry the server's clock decides, an election is a row with
/// a revision and its records are rows with an opaque body, written by one function
/// that commits a write only at the revision it was decided on, with tokens from a
/// sequence; waiters and followers are woken by `NOTIFY`. See the crate docs.
///
/// Cheap to clone: clones share the connections.
#[derive(Clone)]
pub struct PostgresBackend {
    store: Arc<PostgresStore>,
    driven: DrivenBackend,
}

tenure_core::store_constructors!(PostgresBackend, PostgresConfig);

impl PostgresBackend {
    /// Connect, create or upgrade tenure's schema if needed (under an advisory lock, so
    /// several processes starting at once do it once), and start listening, all
    /// within the connect timeout: an unreachable server gives `Unavailable` or
    /// `Timeout`, bad credentials `Unauthorized`, a schema of a newer tenure `Backend`.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        let opener = Opener::new(&config)?;
        let limit = config.get_connect_timeout();
        let endpoint = config.to_string();
        let setup = async {
            let (client, _) = opener.open().await.map_err(|e| map("connect", e))?;
            install(&client, &config.schema).await
        };
        TAG.connecting(limit, &endpoint, setup).await?;
        let requests = Requests::new(TAG, endpoint, config.get_request_timeout(), map);
        let channel = format!("tenure_{:032x}", tenure_core::backend::random_id());
        let (hub, stop) = (Arc::new(Hub::default()), CancellationToken::new());
        let listen = hub
            .clone()
            .listen(opener.clone(), channel.clone(), limit, stop.clone());
        tokio::spawn(listen);
        tracing::debug!(%config, "connected to PostgreSQL");
        let requester = Requester::new(opener, &config.schema, requests);
        let store = Arc::new_cyclic(|me| PostgresStore {
            config,
            requester,
            hub,
            channel,
            stop,
            me: me.clone(),
        });
        let driven = DrivenBackend::new(store.clone(), SCHEME);
        Ok(PostgresBackend { store, driven })
    }

    /// The settings this backend was connected with.
    pub fn config(&self) -> &PostgresConfig {
        &self.store.config
    }

    /// The engine's primitives this backend runs on (for the primitive suite).
    pub fn primitives(&self) -> Arc<dyn Primitives> {
        self.store.clone()
    }

    /// How many statements this backend has sent on its request connection (each one
    /// round trip: renewals, elections and members alike), for measurements.
    pub fn round_trips(&self) -> u64 {
        let requests = &self.store.requester.requests;
        requests.election_requests() + requests.renewals()
    }

    /// End the session with id `session_id` now, as the server does when its TTL
    /// passes without a renewal: what it holds counts for nothing from here on (the
    /// next waiters are woken) and its members are removed; its owner learns at its
    /// next renewal. For operators and fault tests.
    pub async fn expire_session(&self, session_id: &str) -> Result<()> {
        self.store.revoke(session_id).await
    }
}

/// Create tenure's schema, or bring it to the crate's version, under an advisory lock.
/// The file drops and re-creates the schema's functions, so it runs once: a backend
/// that finds the version current under the lock (another one's upgrade committed
/// meanwhile) leaves it be, else it would drop the functions under the feet of the
/// backends already using them.
async fn install(client: &Client, schema: &str) -> Result<()> {
    let latest = SCHEMA.0;
    let ddl = SCHEMA
        .1
        .replace("{S}", schema)
        .replace("{V}", &latest.to_string());
    if current(client, schema)
        .await
        .map_err(|e| map("connect: read the schema version", e))?
        == Some(latest)
    {
        // The common case takes no lock and needs no right to create anything (a
        // schema installed by an administrator serves a role that may only use it).
        return Ok(());
    }
    let upgrade = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('tenure schema'), hashtext('{schema}'));\n\
         DO $guard$ DECLARE v int := 0; BEGIN\n\
           IF to_regclass('{schema}.meta') IS NOT NULL THEN\n\
             EXECUTE 'SELECT coalesce(max(version), 0) FROM {schema}.meta' INTO v;\n\
           END IF;\n\
           IF v > {latest} THEN\n\
             RAISE EXCEPTION USING ERRCODE = 'TN003', MESSAGE = v::text;\n\
           ELSIF v = {latest} THEN\n\
             RAISE EXCEPTION USING ERRCODE = 'TN002', MESSAGE = 'current';\n\
           END IF;\n\
         END $guard$;\n{ddl}\nCOMMIT;"
    );
    let Err(e) = client.batch_execute(&upgrade).await else {
        return Ok(());
    };
    let _ = client.batch_execute("ROLLBACK").await;
    match e.as_db_error().map(|db| (db.code().code(), db.message())) {
        Some(("TN002", _)) => Ok(()),
        Some(("TN003", version)) => Err(TAG.own(
            ErrorKind::Backend,
            format!(
                "connect: schema {schema} is at version {version}, newer than this tenure \
                 knows ({latest}): upgrade tenure, or use another ?schema="
            ),
        )),
        _ => Err(map("connect: read or create the schema", e)),
    }
}

/// The version `schema` is at, if it has tenure's tables.
async fn current(
    client: &Client,
    schema: &str,
) -> std::result::Result<Option<i32>, tokio_postgres::Error> {
    let meta = format!("SELECT to_regclass('{schema}.meta')::text");
    if client
        .query_one(&meta, &[])
        .await?
        .get::<_, Option<String>>(0)
        .is_none()
    {
        return Ok(None);
    }
    let version = format!("SELECT coalesce(max(version), 0) FROM {schema}.meta");
    Ok(Some(client.query_one(&version, &[]).await?.get(0)))
}

tenure_core::driven_backend!(PostgresBackend, driven);
