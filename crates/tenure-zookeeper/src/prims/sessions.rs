//! Sessions: one ZooKeeper session each, holding its node `/:sessions/<id>`; renewals
//! through the session's own connection, the watchdog that ends a session whose
//! renewals went unanswered for a TTL, and its member registrations.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tenure_core::backend::primitive::MemberStore;
use tenure_core::backend::Purpose;
use tenure_core::{ElectionName, ErrorKind, Member, MemberStream, Result};
use zookeeper_client::{Client, CreateMode, Error as ZkError, MultiWriteError, SessionInfo};

use super::{session_path, ZkPrimitives, SESSIONS};
use crate::error::{map, TAG};
use crate::members::{self, Registrar};
use crate::shared::{close_session, live_client, open_session, ClientSlot, Shared};

/// A session's renewals as its watchdog sees them.
#[derive(Debug)]
struct Beat {
    /// When the last renewal that was answered was sent (at first: the open).
    confirmed: Instant,
    /// Set once the watchdog ended the session: later renewals are refused.
    ended: bool,
}

/// A session opened through this backend.
pub(super) struct Own {
    client: ClientSlot,
    info: SessionInfo,
    members: Registrar,
    beat: Mutex<Beat>,
    watchdog: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Own {
    pub(super) fn stop(&self) {
        if let Some(w) = self.watchdog.lock().ok().and_then(|mut w| w.take()) {
            w.abort();
        }
    }

    fn client(&self) -> Option<Client> {
        live_client(&self.client)
    }
}

/// Ends a session once its TTL has passed since the last renewal that was answered
/// was sent, as a store with server-side TTLs would: its holder's deadline (the renew
/// deadline after that renewal, below the TTL) has passed by then. The node goes and
/// the session is closed; should the connection be down, it is dropped and the server
/// expires the session after its timeout (no sooner than the TTL after its last sign
/// of life). A process that dies leaves it to the server the same way.
async fn watchdog(own: Arc<Own>, shared: Arc<Shared>, ttl: Duration, id: String) {
    let step = (ttl / 40).max(Duration::from_millis(10));
    loop {
        tokio::time::sleep(step).await;
        let due = match own.beat.lock() {
            Ok(mut b) if b.confirmed.elapsed() > ttl => {
                b.ended = true;
                true
            }
            Ok(_) => false,
            Err(_) => return,
        };
        if due {
            tracing::debug!(session = %id, "no renewal answered for a TTL: ending the ZooKeeper session");
            let _ = end(&shared, &own, &id).await;
            return;
        }
    }
}

/// End session `id` opened here: delete its node (readers count it ended at once),
/// then close the ZooKeeper session (its member nodes go with it).
async fn end(shared: &Shared, own: &Own, id: &str) -> Result<()> {
    let client = own.client.lock().ok().and_then(|mut c| c.take());
    let Some(client) = client.filter(|c| !c.state().is_terminated()) else {
        return Ok(());
    };
    let deleted = shared
        .requests
        .call("end session", client.delete(&session_path(id), None))
        .await;
    // The client is detached: dropping it only drops the connection.
    drop(client);
    close_session(&shared.config, own.info.clone()).await?;
    match deleted {
        Err(e) if !crate::shared::is_no_node(&e) => Err(e),
        _ => Ok(()),
    }
}

impl ZkPrimitives {
    /// Session `id`'s own connection renews it: a multi checking its node, a write
    /// the ensemble's leader answers only once committed with a quorum (a follower cut
    /// off from it would go on answering reads).
    async fn renew_own(&self, id: &str, own: &Own) -> Result<bool> {
        let sent = Instant::now();
        let ended = own.beat.lock().map(|b| b.ended).unwrap_or(true);
        let Some(client) = own.client().filter(|_| !ended) else {
            return Ok(false);
        };
        let mut writer = client.new_multi_writer();
        writer
            .add_check_version(&session_path(id), -1)
            .map_err(|e| map("keep alive", e))?;
        let commit = async { Ok::<_, ZkError>(writer.commit().await) };
        match self
            .shared
            .requests
            .call_as(Purpose::Renewal, "keep alive", commit)
            .await?
        {
            Ok(_) => Ok(own
                .beat
                .lock()
                .map(|mut b| {
                    if !b.ended && sent > b.confirmed {
                        b.confirmed = sent;
                    }
                    !b.ended
                })
                .unwrap_or(false)),
            Err(MultiWriteError::OperationFailed { .. }) => Ok(false),
            Err(MultiWriteError::RequestFailed { source }) => {
                let e = map("keep alive", source);
                match e.kind() {
                    ErrorKind::SessionExpired => Ok(false),
                    _ => Err(self.tag(e)),
                }
            }
        }
    }

    pub(super) async fn open_own(&self, ttl: Duration) -> Result<String> {
        let opened = Instant::now();
        let client = open_session(&self.shared.config, ttl).await?;
        let owner = client.session_id().0;
        let id = format!("{owner:016x}");
        let path = session_path(&id);
        let ephemeral = CreateMode::Ephemeral;
        let shared = &self.shared;
        shared
            .create_ephemeral(&client, "open", SESSIONS, &path, &[], ephemeral)
            .await?;
        let info = client.session().clone();
        let slot: ClientSlot = Arc::new(Mutex::new(Some(client)));
        self.shared.register(&id, info.clone(), slot.clone());
        let own = Arc::new(Own {
            client: slot,
            info,
            members: Registrar::new(owner),
            beat: Mutex::new(Beat {
                confirmed: opened,
                ended: false,
            }),
            watchdog: Mutex::new(None),
        });
        let task = watchdog(own.clone(), self.shared.clone(), ttl, id.clone());
        if let Ok(mut w) = own.watchdog.lock() {
            *w = Some(tokio::spawn(task));
        }
        if let Ok(mut o) = self.own.lock() {
            o.insert(id.clone(), own);
        }
        Ok(id)
    }

    pub(super) async fn renew_all(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let renewals = sessions.iter().map(|id| async move {
            match self.own(id) {
                Some(own) => self.renew_own(id, &own).await,
                None => {
                    let client = self.shared.reader().await?;
                    let stat = self
                        .shared
                        .requests
                        .call_as(
                            Purpose::Renewal,
                            "keep alive",
                            client.check_stat(&session_path(id)),
                        )
                        .await?;
                    Ok(stat.is_some())
                }
            }
        });
        futures::future::try_join_all(renewals).await
    }

    pub(super) async fn revoke_own(&self, session: &str) -> Result<()> {
        let own = self.own.lock().ok().and_then(|mut o| o.remove(session));
        self.shared.unregister(session);
        let path = session_path(session);
        let Some(own) = own else {
            let client = self.shared.reader().await?;
            return match self
                .shared
                .requests
                .call("revoke", client.delete(&path, None))
                .await
            {
                Err(e) if !crate::shared::is_no_node(&e) => Err(e),
                _ => Ok(()),
            };
        };
        own.stop();
        end(&self.shared, &own, session).await
    }
}

/// Members: ephemeral sequential nodes of the session's own ZooKeeper session (see
/// [`members`](crate::members)).
#[async_trait]
impl MemberStore for ZkPrimitives {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let own = self.own(session);
        let ended = || TAG.own(ErrorKind::SessionExpired, "ZooKeeper session ended");
        let own = own.ok_or_else(ended)?;
        let client = own.client().ok_or_else(ended)?;
        own.members
            .register(&self.shared, &client, namespace, member)
            .await
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        // Nothing is registered in a session that is gone.
        let Some(own) = self.own(session) else {
            return Ok(());
        };
        let Some(client) = own.client() else {
            return Ok(());
        };
        own.members
            .unregister(&self.shared, &client, namespace, id)
            .await
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        members::list(&self.shared, namespace).await
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        members::watch(&self.shared, namespace).await
    }
}
