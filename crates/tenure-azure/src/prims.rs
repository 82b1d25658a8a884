//! The election engine's primitives on Azure Blob Storage: an election is one blob
//! holding the engine's records ([`Stored`]), written only with `If-Match` on the etag
//! it was read with (`If-None-Match: *` for a new one); sessions are blobs of their own
//! ([`Sessions`]). Azure cannot notify, so `changed` polls.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tenure_core::backend::primitive::{MemberStore, Primitives};
use tenure_core::backend::{lock, Capabilities, Clause, Purpose};
use tenure_core::engine::{Op, Snapshot, WaitFor, Write};
use tenure_core::{ElectionName, Error, ErrorKind, Result, Timing};

use crate::error::TAG;
use crate::members::AzureMembers;
use crate::names::{jittered, Layout};
use crate::record::Stored;
use crate::sessions::Sessions;
use crate::store::{Store, When};

/// The shortest session TTL this backend accepts, in seconds.
pub const MIN_LEASE_SECS: u64 = 15;
/// The longest session TTL this backend accepts, in seconds.
pub const MAX_LEASE_SECS: u64 = 60;

/// How many requests of a batch are in flight at once, which is also what the backend
/// declares one round trip to carry (Blob Storage has no batch of conditional writes: a
/// batch of 64 seats is 64 requests, 8 round trips' time). Declaring more made the
/// session give a batch too short a deadline (one round trip's for 40 seats: 2 s ran
/// out under load). Azurite (one Node process) answered 40 at once on a loaded 2-core
/// machine later than a 1 s request timeout.
const IN_FLIGHT: usize = 8;

const NO_HERD: &str = "Azure Blob Storage cannot notify: every waiter reads the election \
    once per poll interval, so the request rate grows with the number of waiters \
    (waiters / poll interval), though it does not burst when the seat frees up (the \
    release grants the next waiter in the same write)";

/// An election as this process last read or wrote it.
struct Known {
    etag: String,
    stored: Stored,
    at: Instant,
}

/// The engine's primitives over one container (and prefix).
pub(crate) struct AzurePrimitives {
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) members: AzureMembers,
    elections: Mutex<HashMap<ElectionName, Known>>,
    /// The last token this process minted: tokens it mints later, in any election,
    /// are larger.
    floor: AtomicU64,
    poll: Duration,
}

impl fmt::Debug for AzurePrimitives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzurePrimitives")
            .field("container", &self.store().config.container())
            .finish_non_exhaustive()
    }
}

impl AzurePrimitives {
    pub(crate) fn new(store: Arc<Store>, layout: Layout) -> Self {
        let poll = store.config.get_poll_interval();
        let sessions = Arc::new(Sessions::new(store, layout, poll / 2));
        AzurePrimitives {
            members: AzureMembers::new(sessions.clone(), poll),
            sessions,
            elections: Mutex::default(),
            floor: AtomicU64::new(0),
            poll,
        }
    }

    fn store(&self) -> &Store {
        &self.sessions.store
    }

    fn remember(&self, election: &ElectionName, etag: String, stored: Stored) {
        let mut known = lock(&self.elections);
        if known.len() > 100_000 {
            known.clear();
        }
        let at = Instant::now();
        known.insert(election.clone(), Known { etag, stored, at });
    }

    /// Read the election blob: its etag (`None`: there is none) and records.
    async fn fetch(&self, election: &ElectionName) -> Result<(Option<String>, Stored)> {
        let name = self.sessions.layout.election(election);
        let got = self.store().download(&name).await;
        match got.map_err(|f| f.into_error("read election"))? {
            None => {
                lock(&self.elections).remove(election);
                Ok((None, Stored::default()))
            }
            // An empty blob (an election of the lease-based layout) holds no records.
            Some((body, etag)) if body.is_empty() => {
                self.remember(election, etag.clone(), Stored::default());
                Ok((Some(etag), Stored::default()))
            }
            Some((body, etag)) => {
                let stored = Stored::decode(&body).ok_or_else(|| {
                    TAG.own(
                        ErrorKind::Backend,
                        format!("blob {name:?} holds something tenure did not write"),
                    )
                })?;
                self.remember(election, etag.clone(), stored.clone());
                Ok((Some(etag), stored))
            }
        }
    }

    /// The snapshot of `stored`, reading the sessions of its records as needed.
    async fn snapshot(&self, stored: &Stored) -> Result<Snapshot> {
        let ids: Vec<String> = stored.sessions().map(str::to_string).collect();
        let live = self.sessions.live(&ids).await?;
        let live: HashMap<&str, bool> = ids.iter().map(String::as_str).zip(live).collect();
        Ok(stored.snapshot(|s| live.get(s).copied().unwrap_or(true)))
    }

    /// The snapshot of `stored` with the liveness this process knows, without a request.
    fn known_snapshot(&self, stored: &Stored) -> Snapshot {
        stored.snapshot(|s| self.sessions.cached(s))
    }

    /// Whether what `what` waits for happened, on `stored`.
    async fn happened(&self, stored: &Stored, what: &WaitFor) -> Result<bool> {
        let rec = |s: &str| stored.recs.iter().find(|r| r.s == s);
        if let Some(me) = what.me.as_deref() {
            let ended = self.sessions.known(me) == Some(false);
            if ended || rec(me).is_none_or(|r| r.v > what.seen) {
                return Ok(true);
            }
        }
        match what.on.as_deref() {
            Some(on) if rec(on).is_none() => Ok(true),
            Some(on) => Ok(!self.sessions.live(&[on.to_string()]).await?[0]),
            None => Ok(what.me.is_none() && stored.rev > what.seen),
        }
    }
}

#[async_trait]
impl Primitives for AzurePrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.sessions.open(ttl).await
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.sessions.renew(sessions).await
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        self.sessions.revoke(session).await?;
        self.members.drop_session(session).await
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let (_, stored) = self.fetch(election).await?;
        self.snapshot(&stored).await
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let for_ended = write.ops.iter().any(|op| {
            !matches!(op, Op::Delete(_)) && self.sessions.known(op.session()) == Some(false)
        });
        let known = lock(&self.elections)
            .get(election)
            .map(|k| (k.etag.clone(), k.stored.clone()));
        // Decided on the election as this process knows it, or on a new election (an
        // optimistic first write, which fails if one exists): no read before it.
        let (etag, current) = match known {
            Some((etag, stored)) if stored.rev == write.revision => (Some(etag), stored),
            None if write.revision == 0 => (None, Stored::default()),
            _ => self.fetch(election).await?,
        };
        // A write that did not commit returns the election with the liveness this
        // process knows (no request): a session never seen counts live, as a first
        // read of it would show too; `changed` reads the one waited on.
        if current.rev != write.revision || for_ended {
            return Ok((false, self.known_snapshot(&current)));
        }
        let next = current.apply(write, self.floor.load(Ordering::SeqCst));
        let name = self.sessions.layout.election(election);
        let when = etag.as_deref().map_or(When::Absent, When::Is);
        let put = self.store().put(
            &name,
            next.encode(),
            HashMap::new(),
            when,
            Purpose::Election,
        );
        match put.await.map_err(|f| f.into_error("write election"))? {
            Some(etag) => {
                self.floor.fetch_max(next.tok, Ordering::SeqCst);
                let after = self.known_snapshot(&next);
                self.remember(election, etag, next);
                Ok((true, after))
            }
            None => {
                let (_, current) = self.fetch(election).await?;
                Ok((false, self.known_snapshot(&current)))
            }
        }
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let reads: Vec<Result<Snapshot>> = futures::stream::iter(elections.iter().cloned())
            .map(|e| async move { self.read(&e).await })
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        reads.into_iter().collect()
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let commits: Vec<Result<(bool, Snapshot)>> = futures::stream::iter(writes.iter().cloned())
            .map(|(e, w)| async move { self.commit(&e, &w).await })
            .buffered(IN_FLIGHT)
            .collect()
            .await;
        commits.into_iter().collect()
    }

    fn batch(&self) -> Option<usize> {
        Some(IN_FLIGHT)
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        // Known at `seen` within the last half poll: the first look is a poll away.
        let fresh = lock(&self.elections)
            .get(election)
            .is_some_and(|k| k.stored.rev == what.seen && k.at.elapsed() < self.poll / 2);
        if fresh {
            tokio::time::sleep(jittered(self.poll)).await;
        }
        loop {
            let (_, stored) = self.fetch(election).await?;
            if self.happened(&stored, what).await? {
                return Ok(());
            }
            tokio::time::sleep(jittered(self.poll)).await;
        }
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(&self.members)
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        let ttl = timing.ttl;
        let whole = ttl.subsec_nanos() == 0;
        if !whole || !(MIN_LEASE_SECS..=MAX_LEASE_SECS).contains(&ttl.as_secs()) {
            return Err(Error::invalid(format!(
                "ttl: {ttl:?} is not a session TTL this backend keeps: a whole number of \
                 seconds from {MIN_LEASE_SECS} to {MAX_LEASE_SECS}"
            )));
        }
        Ok(())
    }

    fn capabilities(&self, offered: Capabilities) -> Capabilities {
        offered.except(Clause::NoHerd, NO_HERD).polling(self.poll)
    }
}
