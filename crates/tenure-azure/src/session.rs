//! A session: the election leases and member blobs it holds. Azure has no session
//! object; the session lives in this process and in the leases it renews.
//!
//! Each election's campaigns propose a lease id of their own, kept across campaign calls
//! (an acquire that timed out but took effect is then ours on the next try) and never
//! used again once a release was sent with it. A release that was sent, timed out and
//! reached the store later (a stalled server works through its backlog when it
//! resumes) can therefore only free the lease it was meant for, never a later grant of
//! the same election to this session. Member blobs use the session's own lease id.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tenure_core::backend::{lock, BackendSession, Lifetime, SessionEvents};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Member, Result};
use tokio_util::sync::DropGuard;

use crate::error::{Failure, TAG};
use crate::names::{grant_metadata, jittered, new_lease_id, parse_notice, token_of};
use crate::queue::{entry_metadata, entry_name, HolderCandidacy, Queue, HANDOVER};
use crate::shared::Shared;
use crate::store::{lease_lost, Listed};

/// How many renewals one keep-alive sends at once.
const RENEW_CONCURRENCY: usize = 32;

/// The session handed to the core.
pub(crate) struct AzureSession {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

/// A seat held (or being given back): its token and the lease id it is held with.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seat {
    token: FencingToken,
    lease: String,
}

struct Inner {
    shared: Arc<Shared>,
    /// The session's id, and the lease id of its member blobs.
    lease_id: String,
    /// The lease duration in seconds (15–60).
    secs: i32,
    /// Elections held, with their tokens and lease ids.
    held: Mutex<HashMap<ElectionName, Seat>>,
    /// Grants given up whose lease release has not been confirmed yet.
    releasing: Mutex<HashMap<ElectionName, Seat>>,
    /// The lease id campaigns for each election propose until a grant or a release
    /// retires it; also what `resign(election, None)` gives back for a campaign the
    /// core withdrew (it may have taken the lease without being told).
    campaigning: Mutex<HashMap<ElectionName, String>>,
    /// Member registrations: (namespace, id) → blob name.
    members: Mutex<HashMap<(ElectionName, String), String>>,
    /// This session's entries in waiting queues: election → entry blob name, leased
    /// with the session's lease id and renewed with its elections.
    waiting: Mutex<HashMap<ElectionName, String>>,
    /// Set by `abandon` (a crash, for tests): campaigns stop and nothing is removed
    /// from the store; queue entries lapse as a crashed process's would.
    abandoned: AtomicBool,
    /// Set at the first grant: only a session that held a seat can have notices, so
    /// only it lists them at `close`.
    ever_held: AtomicBool,
    events: SessionEvents,
    life: Lifetime,
}

impl fmt::Debug for AzureSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.life.fmt(f)
    }
}

/// The outcome of one attempt to take a seat.
enum Attempt {
    Granted(FencingToken),
    Held,
}

impl AzureSession {
    pub(crate) fn new(shared: Arc<Shared>, secs: i32, events: SessionEvents) -> Self {
        let lease_id = new_lease_id();
        let inner = Arc::new(Inner {
            shared,
            life: Lifetime::new(crate::config::SCHEME, lease_id.clone()),
            lease_id,
            secs,
            held: Mutex::new(HashMap::new()),
            releasing: Mutex::new(HashMap::new()),
            campaigning: Mutex::new(HashMap::new()),
            members: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            abandoned: AtomicBool::new(false),
            ever_held: AtomicBool::new(false),
            events,
        });
        // Outside a runtime (never the case: sessions are opened by async code) the
        // holder learns of a preemption at its next renewal only.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(watch_notices(inner.clone()));
        }
        AzureSession {
            _stop: inner.life.guard(),
            inner,
        }
    }
}

impl Inner {
    /// Take the lease on blob `name` with `lease`, creating the blob (and the
    /// container, if allowed) when missing. `Ok(false)` if someone else holds it.
    /// Acquire `lease` on `name` (creating the blob or container if missing): when
    /// the acquire that succeeded was sent, or `None` if another lease holds the blob.
    async fn take_lease(&self, name: &str, lease: &str, what: &str) -> Result<Option<Instant>> {
        let store = &self.shared.store;
        for _ in 0..4 {
            let sent = Instant::now();
            let failure = match store.acquire(name, lease, self.secs).await {
                Ok(()) => return Ok(Some(sent)),
                Err(f) => f,
            };
            // Held; or breaking (a holder asked to step down still holds it).
            if failure.code_is("LeaseAlreadyPresent")
                || failure.code_is("LeaseIsBreakingAndCannotBeAcquired")
            {
                return Ok(None);
            } else if failure.code_is("BlobNotFound") {
                self.create_blob(name, what).await?;
            } else if failure.code_is("ContainerNotFound") {
                self.create_container(what).await?;
            } else {
                return Err(failure.into_error(what));
            }
        }
        Err(TAG.own(
            ErrorKind::Unavailable,
            format!("{what}: the blob keeps disappearing; trying again later"),
        ))
    }

    async fn create_blob(&self, name: &str, what: &str) -> Result<()> {
        match self.shared.store.create_blob(name).await {
            Ok(()) => Ok(()),
            Err(f) if f.code_is("ContainerNotFound") => self.create_container(what).await,
            Err(f) => Err(f.into_error(what)),
        }
    }

    async fn create_container(&self, what: &str) -> Result<()> {
        let config = &self.shared.store.config;
        if !config.creates_container() {
            return Err(TAG.own(
                ErrorKind::InvalidArgument,
                format!(
                    "{what}: container {:?} does not exist and create_container is false",
                    config.container()
                ),
            ));
        }
        self.shared
            .store
            .create_container()
            .await
            .map_err(|f| f.into_error(what))
    }

    /// The lease id campaigns for `election` propose: the one in use, or a new one
    /// after a grant or a release retired it.
    fn campaign_lease(&self, election: &ElectionName) -> String {
        lock(&self.campaigning)
            .entry(election.clone())
            .or_insert_with(new_lease_id)
            .clone()
    }

    /// Campaigns for `election` no longer propose `lease` (it was granted, or a release
    /// was sent with it).
    fn retire(&self, election: &ElectionName, lease: &str) {
        let mut campaigning = lock(&self.campaigning);
        if campaigning.get(election).map(String::as_str) == Some(lease) {
            campaigning.remove(election);
        }
    }

    /// One attempt with `lease`: acquire it, then write the next token under it. After
    /// an error the lease was given back, so `lease` must not be used again. With
    /// `yield_to_queue` (a `try_campaign`, which never queues), a lease taken while
    /// candidates wait in the election's queue is given back at once: the seat is
    /// theirs.
    async fn attempt(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        lease: &str,
        yield_to_queue: bool,
    ) -> Result<Attempt> {
        self.life.check_open()?;
        let name = self.shared.layout.election(election);
        let Some(acquired) = self.take_lease(&name, lease, "campaign").await? else {
            return Ok(Attempt::Held);
        };
        if yield_to_queue {
            let queued = self.shared.read_queue(election).await;
            if !matches!(queued, Ok(ref q) if !q.others_wait(None)) {
                self.retire(election, lease);
                self.give_back(&name, lease).await;
                return queued.map(|_| Attempt::Held);
            }
        }
        match self.write_token(&name, candidate, lease).await {
            Ok(token) if grant_too_old(acquired.elapsed(), self.secs) => {
                // The lease runs from the acquire, but the core counts a grant valid
                // from the session's last renewal, which may have been sent after the
                // acquire without this lease (a process stopped between the two). A
                // grant that comes back late is given up rather than reported.
                tracing::warn!(election = %election, token = token.0, age = ?acquired.elapsed(), "grant came back too late to be safe; giving it back");
                self.retire(election, lease);
                self.give_back(&name, lease).await;
                Err(TAG.own(
                    ErrorKind::Unavailable,
                    "campaign: the grant came back too late to be safe (given back)",
                ))
            }
            Ok(token) => {
                if let Err(closed) = self.life.check_open() {
                    self.retire(election, lease);
                    self.give_back(&name, lease).await;
                    return Err(closed);
                }
                let seat = Seat {
                    token,
                    lease: lease.to_owned(),
                };
                lock(&self.held).insert(election.clone(), seat);
                lock(&self.releasing).remove(election);
                self.ever_held.store(true, Ordering::SeqCst);
                self.retire(election, lease);
                Ok(Attempt::Granted(token))
            }
            Err(e) => {
                // A holder that cannot write its token gives the lease up and tries
                // again later (with another lease id).
                self.retire(election, lease);
                self.give_back(&name, lease).await;
                Err(e)
            }
        }
    }

    async fn write_token(
        &self,
        name: &str,
        candidate: &Candidate,
        lease: &str,
    ) -> Result<FencingToken> {
        let store = &self.shared.store;
        let props = store
            .properties(name)
            .await
            .map_err(|f| f.into_error("campaign: read token"))?
            .ok_or_else(|| TAG.own(ErrorKind::Unavailable, "campaign: the blob vanished"))?;
        let previous = token_of(&props.metadata).ok_or_else(|| {
            TAG.own(
                ErrorKind::Backend,
                format!("campaign: blob {name:?} holds a fencing counter tenure did not write"),
            )
        })?;
        let next = previous.checked_add(1).ok_or_else(|| {
            TAG.own(
                ErrorKind::Backend,
                "campaign: the fencing counter is exhausted",
            )
        })?;
        let metadata = grant_metadata(next, candidate, &self.lease_id);
        match store.set_metadata(name, lease, &metadata).await {
            Ok(()) => Ok(FencingToken(next)),
            Err(f) if lease_lost(&f) => Err(TAG.own(
                ErrorKind::Unavailable,
                format!(
                    "campaign: lost the lease before the token was written ({})",
                    f.error.text
                ),
            )),
            Err(f) => Err(f.into_error("campaign: write token")),
        }
    }

    /// Release `lease` on `name`, ignoring errors (best effort).
    async fn give_back(&self, name: &str, lease: &str) {
        if let Err(f) = self.shared.store.release(name, lease).await {
            if !lease_lost(&f) {
                tracing::debug!(blob = %name, error = %f.error.text, "could not give a lease back");
            }
        }
    }

    /// Make sure this session's candidacy waits in `election`'s queue as `queue`
    /// listed it: the entry's name below the queue prefix, and whether it was joined
    /// (or taken again) just now, so `queue` does not show it as live yet.
    async fn ensure_entry(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        queue: &Queue,
    ) -> Result<(String, bool)> {
        let store = &self.shared.store;
        let prefix = self.shared.layout.queue(election);
        let what = "campaign: join the queue";
        let known = lock(&self.waiting).get(election).cloned();
        if let Some(full) = known {
            let rel = full.strip_prefix(&prefix).unwrap_or_default().to_string();
            match queue.entry(&rel) {
                Some(e) if e.live => return Ok((rel, false)),
                // Its lease lapsed (this session was cut off for a lease duration):
                // take it again, keeping the place.
                Some(_) => match store.acquire(&full, &self.lease_id, self.secs).await {
                    Ok(()) => return Ok((rel, true)),
                    Err(f) if lease_lost(&f) || f.code_is("LeaseAlreadyPresent") => {}
                    Err(f) => return Err(f.into_error(what)),
                },
                None => {}
            }
            let mut waiting = lock(&self.waiting);
            if waiting.get(election) == Some(&full) {
                waiting.remove(election);
            }
        }
        // A taken arrival number (a racing joiner) means try the next one.
        let first = queue.next_seq();
        for seq in first..first.saturating_add(8) {
            let rel = entry_name(seq);
            let full = format!("{prefix}{rel}");
            match store
                .create_with_metadata(&full, entry_metadata(candidate))
                .await
            {
                Ok(true) => {}
                Ok(false) => continue,
                Err(f) if f.code_is("ContainerNotFound") => {
                    self.create_container(what).await?;
                    continue;
                }
                Err(f) => return Err(f.into_error(what)),
            }
            // Known as this session's entry before its lease is asked for. A campaign
            // withdrawn while the acquire is under way (its answer not read yet, or
            // timed out) may have had it take effect: `leave_queue` must find the entry
            // to delete it. Left unknown, it stayed leased for the rest of a lease
            // duration by a session that no longer waits, ahead in the queue: every
            // later waiter queued behind it, and a seat freed meanwhile stayed free
            // until the entry lapsed.
            lock(&self.waiting).insert(election.clone(), full.clone());
            match store.acquire(&full, &self.lease_id, self.secs).await {
                Ok(()) => {
                    // Again: a renewal that reached the entry before its lease did
                    // found nothing to renew and forgot it.
                    lock(&self.waiting).insert(election.clone(), full);
                    return Ok((rel, true));
                }
                // Removed (as lapsed) by another waiter before the lease was taken.
                Err(f) if f.status == Some(404) || f.code_is("LeaseAlreadyPresent") => {
                    let mut waiting = lock(&self.waiting);
                    if waiting.get(election) == Some(&full) {
                        waiting.remove(election);
                    }
                    continue;
                }
                // It may have taken effect: the entry stays known (the next poll takes
                // its lease again or finds it live; leaving the queue deletes it).
                Err(f) => return Err(f.into_error(what)),
            }
        }
        Err(TAG.own(
            ErrorKind::Unavailable,
            format!("{what}: its entries keep disappearing; trying again later"),
        ))
    }

    /// Take this session's candidacy for `election` out of its queue (best effort:
    /// an entry not deleted lapses one lease duration later, as it is no longer
    /// renewed).
    async fn leave_queue(&self, election: &ElectionName) {
        let Some(full) = lock(&self.waiting).remove(election) else {
            return;
        };
        if self.abandoned.load(Ordering::SeqCst) {
            return;
        }
        if let Err(f) = self.shared.store.delete(&full, Some(&self.lease_id)).await {
            if !lease_lost(&f) {
                tracing::debug!(blob = %full, error = %f.error.text, "could not leave the queue; the entry lapses");
            }
        }
    }

    /// Remove queue entries of waiters that went away: those `queue` lists without a
    /// lease that the previous listing (`before`) also showed so (a joining waiter
    /// takes its entry's lease right after creating it). Best effort; Azure refuses to
    /// delete a blob a lease holds again meanwhile.
    async fn clear_lapsed(
        &self,
        election: &ElectionName,
        queue: &Queue,
        own: &str,
        before: &mut Vec<(String, String)>,
    ) {
        let prefix = self.shared.layout.queue(election);
        for (name, etag) in &queue.unleased {
            if name != own && before.contains(&(name.clone(), etag.clone())) {
                let full = format!("{prefix}{name}");
                if let Err(f) = self.shared.store.delete_if_unchanged(&full, etag).await {
                    tracing::debug!(blob = %full, error = %f.error.text, "could not remove a lapsed queue entry");
                }
            }
        }
        before.clone_from(&queue.unleased);
    }

    /// The best waiter's turn: take the seat if it is free; if it is held, tell a
    /// holder this candidate preempts (once per grant: `told` keeps the etag of the
    /// grant already judged). `Some(token)` when granted.
    async fn try_seat(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        lease: &str,
        queue: &Queue,
        told: &mut Option<String>,
    ) -> Result<Option<FencingToken>> {
        let store = &self.shared.store;
        let name = self.shared.layout.election(election);
        let props = store
            .properties(&name)
            .await
            .map_err(|f| f.into_error("campaign: read the seat"))?;
        let handover = queue.handover.as_ref();
        let request = format!("{}{HANDOVER}", self.shared.layout.queue(election));
        match props {
            Some(p) if p.leased => {
                // A handover request a grant did not use up (its delete failed).
                if let (Some(h), Some(current)) = (handover, token_of(&p.metadata)) {
                    if h.for_token < current {
                        let _ = store.delete_if_unchanged(&request, &h.etag).await;
                    }
                }
                if p.breaking || told.as_deref() == Some(p.etag.as_str()) {
                    return Ok(None);
                }
                *told = Some(p.etag.clone());
                if HolderCandidacy::of(&p.metadata).preempted_by(candidate.priority()) {
                    match store.break_lease_at_expiry(&name, &p.etag).await {
                        Ok(()) => {
                            tracing::debug!(election = %election, candidate = %candidate.id(), "asked the holder to step down (higher priority)");
                            self.shared.notify(election, &p.metadata).await;
                        }
                        // The grant changed or ended meanwhile: judged again next poll.
                        Err(f) if f.status == Some(412) || lease_lost(&f) => *told = None,
                        Err(f) => return Err(f.into_error("campaign: preempt the holder")),
                    }
                }
                Ok(None)
            }
            _ => match self.attempt(election, candidate, lease, false).await? {
                Attempt::Granted(token) => {
                    // Out of the queue, and the handover request (if any) used up, in
                    // the background: the grant need not wait for it, and until then
                    // the entry only keeps the others waiting, as they would anyway.
                    let entry = lock(&self.waiting).remove(election);
                    let shared = self.shared.clone();
                    let lease_id = self.lease_id.clone();
                    let used = handover.map(|h| h.etag.clone());
                    tokio::spawn(async move {
                        if let Some(full) = entry {
                            if let Err(f) = shared.store.delete(&full, Some(&lease_id)).await {
                                tracing::debug!(blob = %full, error = %f.error.text, "could not leave the queue; the entry lapses");
                            }
                        }
                        if let Some(etag) = used {
                            let _ = shared.store.delete_if_unchanged(&request, &etag).await;
                        }
                    });
                    Ok(Some(token))
                }
                Attempt::Held => Ok(None),
            },
        }
    }

    /// Read this session's notices (`prefix`, one listing): a notice naming a seat
    /// held with the token it names is reported as a preemption (the seat moves to
    /// `releasing`, as when a renewal finds the lease broken); every notice read is
    /// deleted, including those for a grant no longer held (a notice never ends a
    /// grant made after it: the tokens differ). Best effort: a listing that fails
    /// leaves the broken lease to tell the holder at its next renewal.
    async fn read_notices(&self, prefix: &str) {
        let store = &self.shared.store;
        let listed = match store.list_notices(prefix).await {
            Ok(listed) => listed,
            Err(f) => {
                tracing::debug!(prefix = %prefix, error = %f.error.text, "could not list notices; a preemption is learnt at the next renewal");
                return;
            }
        };
        for blob in &listed {
            let Some(rel) = blob.name.strip_prefix(prefix) else {
                continue;
            };
            if let Some((election, token)) = parse_notice(rel) {
                self.step_down(&election, |seat| seat.token.0 == token, "a notice");
            }
        }
        self.delete_notices(listed).await;
    }

    /// The seat of `election`, if held and `is_it` says it is the one asked for, moves
    /// to `releasing` and is reported preempted (the core then fires the lost signal
    /// and releases it). `told_by` is for the log. True if it moved.
    fn step_down(
        &self,
        election: &ElectionName,
        is_it: impl FnOnce(&Seat) -> bool,
        told_by: &str,
    ) -> bool {
        let seat = {
            let mut held = lock(&self.held);
            if !held.get(election).is_some_and(is_it) {
                return false;
            }
            let Some(seat) = held.remove(election) else {
                return false;
            };
            lock(&self.releasing).insert(election.clone(), seat.clone());
            seat
        };
        tracing::info!(election = %election, token = seat.token.0, told_by, "asked to step down (a higher priority waits, or a handover)");
        self.events.preempted(election, seat.token);
        true
    }

    /// Delete the notices `listed` (read, or left at `close`; best effort).
    async fn delete_notices(&self, listed: Vec<Listed>) {
        for blob in listed {
            if let Err(f) = self.shared.store.delete(&blob.name, None).await {
                tracing::debug!(blob = %blob.name, error = %f.error.text, "could not delete a notice");
            }
        }
    }

    /// Delete every notice to this session (at `close`; best effort).
    async fn clear_notices(&self) {
        if !self.ever_held.load(Ordering::SeqCst) {
            return;
        }
        let store = &self.shared.store;
        let prefix = self.shared.layout.notices(&self.lease_id);
        match store.list_notices(&prefix).await {
            Ok(listed) => self.delete_notices(listed).await,
            Err(f) => {
                tracing::debug!(prefix = %prefix, error = %f.error.text, "could not list notices to delete them");
            }
        }
    }

    /// Whether the lease of `election` is breaking: a waiter of a higher priority, or
    /// a handover, asks its holder to step down.
    async fn breaking(&self, election: &ElectionName) -> bool {
        let name = self.shared.layout.election(election);
        matches!(self.shared.store.properties(&name).await, Ok(Some(p)) if p.breaking)
    }

    async fn release(&self, election: &ElectionName, lease: &str) -> Result<()> {
        let name = self.shared.layout.election(election);
        match self.shared.store.release(&name, lease).await {
            Ok(()) => Ok(()),
            Err(f) if lease_lost(&f) => Ok(()),
            Err(f) => Err(f.into_error("resign")),
        }
    }
}

#[async_trait]
impl BackendSession for AzureSession {
    fn id(&self) -> &str {
        &self.inner.lease_id
    }

    async fn keep_alive(&self) -> Result<()> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let elections: Vec<(ElectionName, Seat)> = lock(&inner.held)
            .iter()
            .map(|(e, seat)| (e.clone(), seat.clone()))
            .collect();
        let members: Vec<((ElectionName, String), String)> = lock(&inner.members)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let waiting: Vec<(ElectionName, String)> = lock(&inner.waiting)
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        enum Item {
            Election(ElectionName, Seat),
            Member((ElectionName, String), String),
            Entry(ElectionName, String),
        }
        let items = elections
            .into_iter()
            .map(|(e, seat)| Item::Election(e, seat))
            .chain(members.into_iter().map(|(k, n)| Item::Member(k, n)))
            .chain(waiting.into_iter().map(|(e, n)| Item::Entry(e, n)));
        let shared = &inner.shared;
        let results: Vec<(Item, std::result::Result<(), Failure>)> = futures::stream::iter(items)
            .map(|item| async move {
                let (name, lease) = match &item {
                    Item::Election(e, seat) => (shared.layout.election(e), seat.lease.as_str()),
                    Item::Member(_, n) | Item::Entry(_, n) => (n.clone(), inner.lease_id.as_str()),
                };
                let r = shared.store.renew(&name, lease).await;
                (item, r)
            })
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect()
            .await;
        let mut first_error = None;
        for (item, result) in results {
            match (item, result) {
                (_, Ok(())) => {}
                (Item::Election(e, seat), Err(f)) if lease_lost(&f) => {
                    let token = seat.token;
                    // A lease broken without a break period is "breaking" until it
                    // runs out: a waiter of a higher priority, or a handover, asks the
                    // holder to step down. The seat stays ours until the core, told
                    // it is preempted, releases it (from `releasing`).
                    let broken = f
                        .code
                        .as_deref()
                        .is_some_and(|c| c.contains("Broken") || c.contains("Breaking"));
                    if broken && inner.breaking(&e).await {
                        inner.step_down(&e, |held| *held == seat, "the broken lease");
                        continue;
                    }
                    let removed = {
                        let mut held = lock(&inner.held);
                        if held.get(&e) == Some(&seat) {
                            held.remove(&e);
                            true
                        } else {
                            false
                        }
                    };
                    if removed {
                        let reason = format!("the lease is no longer ours ({})", f.error.text);
                        tracing::warn!(election = %e, token = token.0, %reason, "seat lost");
                        inner.events.election_lost(&e, token, &reason);
                    }
                }
                (Item::Entry(e, name), Err(f)) if lease_lost(&f) => {
                    // Removed as lapsed by another waiter: the campaign joins again.
                    let mut waiting = lock(&inner.waiting);
                    if waiting.get(&e) == Some(&name) {
                        waiting.remove(&e);
                    }
                }
                (Item::Member(key, name), Err(f)) if lease_lost(&f) => {
                    let mut members = lock(&inner.members);
                    if members.get(&key) == Some(&name) {
                        members.remove(&key);
                        tracing::warn!(namespace = %key.0, id = %key.1, reason = %f.error.text, "member registration lost (taken over or deleted)");
                    }
                }
                (_, Err(f)) => {
                    if first_error.is_none() {
                        first_error = Some(f.into_error("renew"));
                    }
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        // Every poll: list the queue (joining it the first time); only the best waiter
        // (a handover's target, else the highest priority, then the earliest) reads
        // the seat and takes it when free, or tells a holder it preempts.
        let inner = &self.inner;
        let poll = inner.shared.store.config.get_poll_interval();
        let mut lease = inner.campaign_lease(election);
        if !lock(&inner.waiting).contains_key(election) {
            // Not queued yet: a free seat nobody queues for is taken at once (as
            // `try_campaign` does), without joining the queue first.
            if let Attempt::Granted(token) =
                inner.attempt(election, candidate, &lease, true).await?
            {
                return Ok(token);
            }
            // A lease taken while others queue was given back (and retired).
            lease = inner.campaign_lease(election);
        }
        let mut told = None;
        let mut lapsed = Vec::new();
        let mut read_again = false;
        loop {
            inner.life.check_open()?;
            if inner.abandoned.load(Ordering::SeqCst) {
                return Err(inner.life.closed_error());
            }
            let queue = inner.shared.read_queue(election).await?;
            let (me, joined) = inner.ensure_entry(election, candidate, &queue).await?;
            if joined && !read_again {
                // The listing does not show the entry yet: read again at once.
                read_again = true;
                continue;
            }
            read_again = false;
            inner.clear_lapsed(election, &queue, &me, &mut lapsed).await;
            if queue.best().is_some_and(|b| b.name == me) {
                if let Some(token) = inner
                    .try_seat(election, candidate, &lease, &queue, &mut told)
                    .await?
                {
                    return Ok(token);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(jittered(poll)) => {}
                _ = inner.life.stopped() => return Err(inner.life.closed_error()),
            }
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let lease = self.inner.campaign_lease(election);
        match self
            .inner
            .attempt(election, candidate, &lease, true)
            .await?
        {
            Attempt::Granted(token) => Ok(Some(token)),
            Attempt::Held => Ok(None),
        }
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let inner = &self.inner;
        if token.is_none() {
            // A withdrawn campaign leaves the queue.
            inner.leave_queue(election).await;
        }
        let ours = {
            let mut held = lock(&inner.held);
            match (held.get(election), token) {
                (Some(seat), Some(want)) if seat.token != want => None,
                (Some(_), _) => held.remove(election),
                (None, _) => None,
            }
        };
        // The lease to give back, if any.
        let lease = match (ours, token) {
            (Some(seat), _) => {
                let lease = seat.lease.clone();
                lock(&inner.releasing).insert(election.clone(), seat);
                Some(lease)
            }
            (None, Some(want)) => lock(&inner.releasing)
                .get(election)
                .filter(|seat| seat.token == want)
                .map(|seat| seat.lease.clone()),
            // A withdrawn campaign may have taken the lease without being told: give
            // back its call's lease (a lease that is not ours is left alone by Azure),
            // else finish a release that did not complete.
            (None, None) => lock(&inner.campaigning).get(election).cloned().or_else(|| {
                lock(&inner.releasing)
                    .get(election)
                    .map(|seat| seat.lease.clone())
            }),
        };
        let Some(lease) = lease else {
            return Ok(());
        };
        inner.retire(election, &lease);
        inner.release(election, &lease).await?;
        {
            let mut releasing = lock(&inner.releasing);
            if releasing
                .get(election)
                .is_some_and(|seat| seat.lease == lease)
            {
                releasing.remove(election);
            }
        }
        Ok(())
    }

    async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        if !inner.life.close() {
            return Ok(());
        }
        let mut elections: Vec<(ElectionName, String)> = lock(&inner.held)
            .drain()
            .map(|(e, seat)| (e, seat.lease))
            .collect();
        // Releases that did not complete, and campaigns that may hold a lease unknown
        // to the core: given back too.
        elections.extend(
            lock(&inner.releasing)
                .drain()
                .map(|(e, seat)| (e, seat.lease)),
        );
        elections.extend(lock(&inner.campaigning).drain());
        let mut members: Vec<String> = lock(&inner.members).drain().map(|(_, n)| n).collect();
        // Queue entries go the same way as member blobs (deleted under the lease).
        members.extend(lock(&inner.waiting).drain().map(|(_, n)| n));
        let shared = &inner.shared;
        let lease = &inner.lease_id;
        let work = elections
            .into_iter()
            .map(Ok)
            .chain(members.into_iter().map(Err));
        let results: Vec<Result<()>> = futures::stream::iter(work)
            .map(|w| async move {
                match w {
                    Ok((e, l)) => inner.release(&e, &l).await,
                    Err(n) => match shared.store.delete(&n, Some(lease)).await {
                        Ok(()) => Ok(()),
                        Err(f) if lease_lost(&f) => Ok(()),
                        Err(f) => Err(f.into_error("close: remove member")),
                    },
                }
            })
            .buffer_unordered(RENEW_CONCURRENCY)
            .collect()
            .await;
        inner.clear_notices().await;
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
    }

    fn abandon(&self) {
        // As in a crash: waiting campaigns stop and their queue entries are left to
        // lapse; leases are left to run out.
        self.inner.abandoned.store(true, Ordering::SeqCst);
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let key = (namespace.clone(), member.id().to_string());
        let name = inner.shared.layout.member(namespace, member.id());
        let registered = lock(&inner.members).contains_key(&key);
        if !registered {
            let mut taken = false;
            for _ in 0..3 {
                if inner
                    .take_lease(&name, &inner.lease_id, "register member")
                    .await?
                    .is_some()
                {
                    taken = true;
                    break;
                }
                // Another session registered this id: the latest registration wins.
                match inner.shared.store.break_lease(&name).await {
                    Ok(()) => {}
                    Err(f) if lease_lost(&f) => {}
                    Err(f) => return Err(f.into_error("register member: take over")),
                }
            }
            if !taken {
                return Err(TAG.own(
                    ErrorKind::Unavailable,
                    "register member: another session keeps taking this id",
                ));
            }
        }
        let body = member.value().as_bytes().to_vec();
        if let Err(f) = inner
            .shared
            .store
            .write_body(&name, &inner.lease_id, body)
            .await
        {
            if !registered {
                inner.give_back(&name, &inner.lease_id).await;
            }
            return Err(f.into_error("register member: write value"));
        }
        lock(&inner.members).insert(key, name);
        Ok(())
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        let inner = &self.inner;
        Member::check_id(id)?;
        let key = (namespace.clone(), id.to_string());
        let Some(name) = lock(&inner.members).get(&key).cloned() else {
            return Ok(());
        };
        match inner
            .shared
            .store
            .delete(&name, Some(&inner.lease_id))
            .await
        {
            Ok(()) => {}
            Err(f) if lease_lost(&f) => {}
            Err(f) => return Err(f.into_error("unregister member")),
        }
        let mut members = lock(&inner.members);
        if members.get(&key) == Some(&name) {
            members.remove(&key);
        }
        Ok(())
    }
}

/// The session's notice poll: while it holds at least one seat, one listing of its
/// notice prefix per poll interval (however many seats), so a holder asked to step
/// down learns it within about a poll interval rather than at its next renewal. Ends
/// when the session closes, is dropped or is abandoned.
async fn watch_notices(inner: Arc<Inner>) {
    let poll = inner.shared.store.config.get_poll_interval();
    let prefix = inner.shared.layout.notices(&inner.lease_id);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(jittered(poll)) => {}
            _ = inner.life.stopped() => return,
        }
        if inner.abandoned.load(Ordering::SeqCst) {
            return;
        }
        if lock(&inner.held).is_empty() {
            continue;
        }
        tokio::select! {
            _ = inner.read_notices(&prefix) => {}
            _ = inner.life.stopped() => return,
        }
    }
}

/// Whether a grant whose lease was acquired `age` ago (send time of the acquire) is
/// too old to report, for leases of `lease_secs`. The core counts a grant valid until
/// the send time of the session's last confirmed renewal plus the renew deadline
/// (at most `lease × (1 − CLOCK_DRIFT_MARGIN)`), and that renewal may have been sent
/// after the acquire; the lease itself ends one lease after the acquire reached the
/// store. Reported only within half the drift margin of the acquire, the grant's
/// deadline always comes before the lease's end, with the other half left for clock
/// drift.
fn grant_too_old(age: Duration, lease_secs: i32) -> bool {
    let lease = Duration::from_secs(u64::try_from(lease_secs).unwrap_or(0));
    age > lease.mul_f64(tenure_core::CLOCK_DRIFT_MARGIN / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_reported_only_soon_after_its_acquire() {
        // 15 s leases: within 375 ms (half of 5 %) of the acquire.
        assert!(!grant_too_old(Duration::from_millis(100), 15));
        assert!(!grant_too_old(Duration::from_millis(375), 15));
        assert!(grant_too_old(Duration::from_millis(400), 15));
        // The chaos run that showed it: the acquire sent, the process stopped for
        // 25.7 s, the grant reported after the lease had ended and another holder
        // had the seat.
        assert!(grant_too_old(Duration::from_millis(25_900), 15));
        assert!(!grant_too_old(Duration::from_millis(1_400), 60));
    }
}
