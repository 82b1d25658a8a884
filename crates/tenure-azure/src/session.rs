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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use tenure_core::backend::{lock, BackendSession, Lifetime, SessionEvents};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Member, Result};
use tokio_util::sync::DropGuard;

use crate::error::{Failure, TAG};
use crate::names::{grant_metadata, jittered, new_lease_id, token_of};
use crate::shared::Shared;
use crate::store::lease_lost;

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
            events,
        });
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
            if failure.code_is("LeaseAlreadyPresent") {
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
    /// an error the lease was given back, so `lease` must not be used again.
    async fn attempt(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        lease: &str,
    ) -> Result<Attempt> {
        self.life.check_open()?;
        let name = self.shared.layout.election(election);
        let Some(acquired) = self.take_lease(&name, lease, "campaign").await? else {
            return Ok(Attempt::Held);
        };
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
        let metadata = grant_metadata(next, candidate.id(), candidate.value());
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
        enum Item {
            Election(ElectionName, Seat),
            Member((ElectionName, String), String),
        }
        let items = elections
            .into_iter()
            .map(|(e, seat)| Item::Election(e, seat))
            .chain(members.into_iter().map(|(k, n)| Item::Member(k, n)));
        let shared = &inner.shared;
        let results: Vec<(Item, std::result::Result<(), Failure>)> = futures::stream::iter(items)
            .map(|item| async move {
                let (name, lease) = match &item {
                    Item::Election(e, seat) => (shared.layout.election(e), seat.lease.as_str()),
                    Item::Member(_, n) => (n.clone(), inner.lease_id.as_str()),
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
        let poll = self.inner.shared.store.config.get_poll_interval();
        let lease = self.inner.campaign_lease(election);
        loop {
            match self.inner.attempt(election, candidate, &lease).await? {
                Attempt::Granted(token) => return Ok(token),
                Attempt::Held => {
                    tokio::select! {
                        _ = tokio::time::sleep(jittered(poll)) => {}
                        _ = self.inner.life.stopped() => return Err(self.inner.life.closed_error()),
                    }
                }
            }
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let lease = self.inner.campaign_lease(election);
        match self.inner.attempt(election, candidate, &lease).await? {
            Attempt::Granted(token) => Ok(Some(token)),
            Attempt::Held => Ok(None),
        }
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        let inner = &self.inner;
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
        let members: Vec<String> = lock(&inner.members).drain().map(|(_, n)| n).collect();
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
        results.into_iter().collect::<Result<Vec<()>>>().map(|_| ())
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
