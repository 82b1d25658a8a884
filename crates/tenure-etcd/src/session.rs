//! A session of the Go layout (`layout=go`): one etcd lease, its keep-alive stream,
//! and the candidacies held through it, as Go's `concurrency.Election` keeps them (a
//! key per candidate under the election's prefix; the oldest key leads; a waiter
//! watches the key just before its own). The default layout is the election engine's
//! ([`crate::primitives`]).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::MemberStore;
use tenure_core::backend::{revision_token, BackendSession, Lifetime, SessionEvents};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Member, Result};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::TAG;
use crate::gather::{Gather, MAX_OPS, MAX_PARTS};
use crate::keys::lease_hex;
use crate::members::EtcdMembers;
use crate::ops::{self, op};
use crate::proto::{Request, TxnRequest};
use crate::shared::Shared;

mod queue;

use queue::Created;

/// Seats per transaction of a batch ([`MAX_PARTS`]): a nested transaction each, within
/// etcd's default limit of 128 operations per transaction (`--max-txn-ops`).
pub(crate) const BATCH: usize = MAX_PARTS;

/// The session handed to the core. Dropping it stops its background tasks.
pub(crate) struct EtcdSession {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

struct Inner {
    shared: Arc<Shared>,
    lease: i64,
    /// How long a keep-alive waits for one member's answer before it asks the next
    /// member as well: short enough that a renewal that needs the next member still
    /// lands within the renew deadline.
    answer_limit: Duration,
    /// New candidacies (create the key, read the one before it), many seats per
    /// transaction when many campaign at once.
    enqueues: Arc<Gather>,
    /// Looks at queues (is our key there, which key is before it), likewise, and in a
    /// read-only transaction.
    looks: Arc<Gather>,
    candidacies: Mutex<HashMap<ElectionName, Candidacy>>,
    events: SessionEvents,
    life: Lifetime,
}

/// This session's key in one election.
struct Candidacy {
    /// The key's create revision (the token once granted).
    revision: i64,
    /// Whether the core was handed this key's token.
    granted: bool,
    /// Stops the task that reports the key's deletion while held.
    monitor: Option<CancellationToken>,
}

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.life.fmt(f)
    }
}

/// What one look at the queue found.
struct QueueState {
    own_present: bool,
    predecessor: Option<String>,
    revision: i64,
}

impl EtcdSession {
    /// Grant a lease of `ttl` (rounded up to whole seconds).
    pub(crate) async fn open(
        shared: Arc<Shared>,
        ttl: Duration,
        events: SessionEvents,
    ) -> Result<Self> {
        let lease = shared.grant_lease(ttl).await?;
        let answer_limit = shared.answer_limit(ttl);
        let life = Lifetime::new(crate::config::SCHEME, lease_hex(lease));
        let inner = Arc::new(Inner {
            enqueues: Gather::new(shared.clone(), "campaign", MAX_PARTS),
            looks: Gather::new(shared.clone(), "campaign: look at the queue", MAX_OPS),
            shared,
            lease,
            answer_limit,
            candidacies: Mutex::new(HashMap::new()),
            events,
            life,
        });
        Ok(EtcdSession {
            _stop: inner.life.guard(),
            inner,
        })
    }

    /// The member lists, for this session's registrations (its id is its lease id).
    fn members(&self) -> EtcdMembers {
        EtcdMembers {
            shared: self.inner.shared.clone(),
        }
    }
}

#[async_trait]
impl BackendSession for EtcdSession {
    fn id(&self) -> &str {
        self.inner.life.id()
    }

    async fn keep_alive(&self) -> Result<()> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let ttls = inner
            .shared
            .renew(&[inner.lease], inner.answer_limit)
            .await?;
        if ttls.first().is_none_or(|ttl| *ttl <= 0) {
            return Err(TAG.own(
                ErrorKind::SessionExpired,
                format!("keep-alive: etcd no longer has lease {}", inner.life.id()),
            ));
        }
        Ok(())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let key = inner.key(election);
        let range = inner.shared.keys.election_range(election);
        // A new key's transaction also reads the key before it: the first look at the
        // queue comes with it.
        let (mut revision, mut first_look) = inner.join(election, candidate, true).await?;
        let mut own_watch = inner.watch_own(&key, revision);
        loop {
            inner.life.check_open()?;
            let queue = match first_look.take() {
                Some(look) => look,
                None => inner.look_at_queue(&range, &key, revision).await?,
            };
            if !queue.own_present {
                // Our key is gone (lease expired, or deleted by someone): queue again.
                // With the lease gone this fails with SessionExpired.
                (revision, first_look) = inner.join(election, candidate, true).await?;
                own_watch = inner.watch_own(&key, revision);
                continue;
            }
            let Some(predecessor) = queue.predecessor else {
                inner.granted(election, revision, own_watch);
                return Ok(revision_token(revision));
            };
            let mut before = inner
                .shared
                .watches
                .watch_deletes(&predecessor, queue.revision + 1);
            tokio::select! {
                fired = before.fired() => {
                    inner.shared.count();
                    fired?;
                }
                fired = own_watch.fired() => {
                    inner.shared.count();
                    fired?;
                    // Look again; the key may be gone.
                    own_watch = inner.watch_own(&key, revision);
                }
                _ = inner.life.stopped() => return Err(inner.life.closed_error()),
            }
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let (revision, look) = inner.join(election, candidate, false).await?;
        let mut withdraw = Vec::new();
        let answer = inner
            .settle(election, revision, look, &mut withdraw)
            .await?;
        inner.withdraw("try_campaign: withdraw", withdraw).await?;
        Ok(answer)
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let mut answers = Vec::with_capacity(seats.len());
        for chunk in seats.chunks(BATCH) {
            let mut withdraw = Vec::new();
            for ((election, candidate), created) in chunk.iter().zip(inner.create(chunk).await?) {
                answers.push(match created {
                    Created::New(revision, look) => {
                        inner
                            .settle(election, revision, look, &mut withdraw)
                            .await?
                    }
                    // A key of this session was already there (an earlier candidacy).
                    Created::Exists(_) => self.try_campaign(election, candidate).await?,
                });
            }
            inner
                .withdraw("try_campaign_many: withdraw", withdraw)
                .await?;
        }
        Ok(answers)
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let inner = &self.inner;
        for chunk in grants.chunks(BATCH) {
            let mut txn = TxnRequest::default();
            for (election, token) in chunk {
                inner.forget(election, *token);
                let key = inner.key(election);
                // Each seat in a nested transaction of its own: only a grant with its
                // token goes, whatever happened to the others.
                let compare = token.map(|t| {
                    let revision = i64::try_from(t.0).unwrap_or(i64::MAX);
                    ops::created_at(&key, revision)
                });
                let delete = TxnRequest {
                    compare: compare.into_iter().collect(),
                    success: vec![op(ops::delete(&key))],
                    failure: Vec::new(),
                };
                txn.success.push(op(Request::Txn(delete)));
            }
            inner.txn("resign", txn).await?;
        }
        Ok(())
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.resign_many(&[(election.clone(), token)]).await
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        self.inner.life.check_open()?;
        self.members().register(self.id(), namespace, member).await
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        self.members().unregister(self.id(), namespace, id).await
    }

    async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        if !inner.life.close() {
            return Ok(());
        }
        inner.lock().clear();
        inner.shared.revoke("close session", inner.lease).await
    }
}
