//! The primitive store surface the [election engine](crate::engine) runs on, and the
//! thin driver that runs the engine over it.
//!
//! A store supplies sessions (open, renew many at once, revoke), one atomic write
//! conditional on an election's revision that returns the election as it left it, and
//! change notification from a revision. Everything an election decides is the
//! engine's; the driver only moves snapshots and writes between the two.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use super::{Capabilities, MemberStream};
use crate::engine::{self, Candidacy, Refusal, Snapshot, Step, WaitFor, Write};
use crate::error::{Error, ErrorKind, Result};
use crate::name::{ElectionName, Member};
use crate::timing::Timing;

/// What a store supplies for the engine to run on.
#[async_trait]
pub trait Primitives: Send + Sync + fmt::Debug + 'static {
    /// Open a session that lives `ttl` unless renewed; returns its id.
    async fn open(&self, ttl: Duration) -> Result<String>;

    /// Renew `sessions` in one round trip; for each, whether it still lives.
    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>>;

    /// End a session now: its records are gone (or dead) for every reader.
    async fn revoke(&self, session: &str) -> Result<()>;

    /// One election's records and revision.
    async fn read(&self, election: &ElectionName) -> Result<Snapshot>;

    /// Commit `write` atomically if `election` is still at `write.revision` (an
    /// election never written is at revision 0), minting tokens for its
    /// [`Token::Mint`](engine::Token::Mint) puts; returns whether it committed and the
    /// election as it stands after (one round trip). A write that puts or touches a
    /// record of an ended session does not commit.
    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)>;

    /// [`read`](Self::read) many elections, in one round trip where the store can
    /// (declared by [`batch`](Self::batch)); the default reads one by one.
    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let mut snaps = Vec::with_capacity(elections.len());
        for e in elections {
            snaps.push(self.read(e).await?);
        }
        Ok(snaps)
    }

    /// [`commit`](Self::commit) many writes, each conditional and atomic on its own
    /// election (not together), in one round trip where the store can; one answer per
    /// write, in order. The default commits one by one.
    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let mut answers = Vec::with_capacity(writes.len());
        for (e, w) in writes {
            answers.push(self.commit(e, w).await?);
        }
        Ok(answers)
    }

    /// How many reads or writes one round trip of [`read_many`](Self::read_many) and
    /// [`commit_many`](Self::commit_many) carries; `None` (the default): one.
    fn batch(&self) -> Option<usize> {
        None
    }

    /// Return once what `what` names happened after the election was at revision
    /// `what.seen`: the record of `what.me` changed or is gone, or the record of
    /// `what.on` is gone or its session ended; with neither named, the election moved
    /// past `seen`. At once if that happened already; spurious returns are allowed,
    /// missed ones are not.
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()>;

    /// Push `election` to `to`, once, when what `what` names happens (as
    /// [`changed`](Self::changed) would return, at once if it happened already); true if
    /// the store took the registration. A push may carry the election as it stands
    /// ([`Wake::wake_with`]): then the follower needs no read, and a store that carries
    /// it may push on every change of the election (spurious pushes are allowed, as
    /// spurious returns of `changed` are), which keeps a holder's view fresh for its
    /// release. A store that pushes keeps no task per follower; one that returns false
    /// (the default) is followed by a waiting `changed` per held seat. A registration
    /// whose [`Wake`] is closed may be dropped at any time.
    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        let _ = (election, what, to);
        false
    }

    /// The store's member lists, if it keeps them.
    fn members(&self) -> Option<&dyn MemberStore> {
        None
    }

    /// What the store says of `timing` (a TTL it cannot keep, say); by default nothing.
    fn check_timing(&self, timing: &Timing) -> Result<()> {
        let _ = timing;
        Ok(())
    }

    /// The contract clauses the store keeps, given what the engine offers over it.
    fn capabilities(&self, offered: Capabilities) -> Capabilities {
        offered
    }
}

/// Where a store pushes the wake-ups of [`Primitives::notify`]: the follower of one
/// session (which reads the elections it is woken for together, where the store
/// batches reads), or one waiting candidate.
#[derive(Clone, Debug)]
pub struct Wake(UnboundedSender<(ElectionName, Option<Snapshot>)>);

/// The follower's end of a [`Wake`]: each election woken for, with the election as it
/// stood if the push carried it.
pub type Woken = UnboundedReceiver<(ElectionName, Option<Snapshot>)>;

impl Wake {
    /// A wake-up channel and the follower's end of it.
    pub fn channel() -> (Self, Woken) {
        let (tx, rx) = unbounded_channel();
        (Wake(tx), rx)
    }

    /// Wake the follower for `election`; false once nobody follows.
    pub fn wake(&self, election: &ElectionName) -> bool {
        self.0.send((election.clone(), None)).is_ok()
    }

    /// Wake the follower for `election`, as it stands after the change; false once
    /// nobody follows.
    pub fn wake_with(&self, election: &ElectionName, now: Snapshot) -> bool {
        self.0.send((election.clone(), Some(now))).is_ok()
    }

    /// Whether nobody follows any more (the registration can go).
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Once nobody follows any more: a store's task waiting on behalf of the follower
    /// can stop then, without looking from time to time.
    pub async fn closed(&self) {
        self.0.closed().await;
    }
}

/// Member lists (a namespace's live members, each owned by a session and gone with
/// it), for stores that keep them beside the elections.
#[async_trait]
pub trait MemberStore: Send + Sync {
    /// Register (or replace) `member` in `namespace` for `session`.
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()>;
    /// Remove `session`'s member `id` from `namespace`.
    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()>;
    /// The live members of `namespace`.
    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>>;
    /// The members of `namespace` as they change.
    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream>;
}

/// Campaign as `me` until granted; returns the token and the election as the grant was
/// learnt (to follow the seat from). Ends with `SessionExpired` once the session is gone.
///
/// The first write is decided on an empty election, without a read: on a free seat the
/// campaign costs one round trip, and otherwise the failed write brings the election
/// back, as a read would have.
pub async fn campaign(
    store: &dyn Primitives,
    election: &ElectionName,
    me: &Candidacy,
) -> Result<(u64, Snapshot)> {
    campaign_from(store, election, me, Snapshot::default()).await
}

/// [`campaign`] with the first write decided on `start`, the election as last seen: on
/// a view still current, a campaign behind a holder costs one round trip too. `start`
/// must hold no record of `me`'s session (one there may have gone since).
pub async fn campaign_from(
    store: &dyn Primitives,
    election: &ElectionName,
    me: &Candidacy,
    start: Snapshot,
) -> Result<(u64, Snapshot)> {
    let mut snap = start;
    loop {
        match engine::campaign(&snap, me) {
            Step::Leader { token, .. } => return Ok((token, snap)),
            Step::Commit(write) => snap = commit(store, election, &write, &me.session).await?,
            Step::Wait { on } => {
                let what = WaitFor {
                    me: Some(me.session.clone()),
                    on: Some(on),
                    seen: snap.revision,
                };
                snap = wait(store, election, &what).await?;
            }
            Step::Busy => {
                return Err(Error::new(
                    ErrorKind::Backend,
                    "campaign: the engine answered busy",
                ))
            }
            Step::Gone => return Err(expired()),
        }
    }
}

/// Wait for what `what` names in `election`; the election after it. A push that
/// carries the election saves the read.
async fn wait(store: &dyn Primitives, election: &ElectionName, what: &WaitFor) -> Result<Snapshot> {
    let (to, mut woken) = Wake::channel();
    if store.notify(election, what, &to) {
        if let Some((_, Some(now))) = woken.recv().await {
            if now.revision > what.seen {
                return Ok(now);
            }
        }
    } else {
        store.changed(election, what).await?;
    }
    store.read(election).await
}

/// Take the seat only if nobody else holds it or waits for it; the token if taken, with
/// the election as the grant was learnt. Decided first on an empty election, as
/// [`campaign`] is.
pub async fn try_take(
    store: &dyn Primitives,
    election: &ElectionName,
    me: &Candidacy,
) -> Result<Option<(u64, Snapshot)>> {
    let mut snap = Snapshot::default();
    loop {
        match engine::try_take(&snap, me) {
            Step::Leader { token, .. } => return Ok(Some((token, snap))),
            Step::Commit(write) => snap = commit(store, election, &write, &me.session).await?,
            Step::Busy | Step::Wait { .. } => return Ok(None),
            Step::Gone => return Err(expired()),
        }
    }
}

/// What a session gives up in one election: with `token`, only that grant; a holder's
/// release leaves `state` to the next grant.
#[derive(Clone, Copy, Debug)]
pub struct Release<'a> {
    /// The session whose candidacy goes.
    pub session: &'a str,
    /// Only the grant with this token.
    pub token: Option<u64>,
    /// The state left to the next grant.
    pub state: Option<&'a [u8]>,
}

/// Withdraw a candidacy in `election` ([`Release`]); a holder's release grants the next
/// waiter in the same write. `last`: the election as last seen, to decide the first
/// write on without a read (a stale one costs the failed write, which brings the
/// election back).
pub async fn resign(
    store: &dyn Primitives,
    election: &ElectionName,
    release: Release<'_>,
    last: Option<Snapshot>,
) -> Result<()> {
    let mut snap = match last {
        Some(s) => s,
        None => store.read(election).await?,
    };
    let Release {
        session,
        token,
        state,
    } = release;
    while let Some(write) = engine::resign(&snap, session, token, state) {
        let (done, after) = store.commit(election, &write).await?;
        if done {
            return Ok(());
        }
        snap = after;
    }
    Ok(())
}

/// Ask the holder of `election` to step down to `to` (or the next waiter); the
/// election the asking write was decided on (its holder is the one asked).
pub async fn handover(
    store: &dyn Primitives,
    election: &ElectionName,
    to: Option<&str>,
) -> Result<Snapshot> {
    let mut snap = store.read(election).await?;
    loop {
        let write = engine::handover(&snap, to).map_err(|r| refused(election, &r))?;
        let (done, after) = store.commit(election, &write).await?;
        if done {
            return Ok(snap);
        }
        snap = after;
    }
}

/// The refusal of a handover as an error (written once for every store).
pub fn refused(election: &ElectionName, why: &Refusal) -> Error {
    Error::invalid(format!("election {election}: {why}"))
}

/// Commit `write` for `session`; the election after.
async fn commit(
    store: &dyn Primitives,
    election: &ElectionName,
    write: &Write,
    session: &str,
) -> Result<Snapshot> {
    let (done, snap) = store.commit(election, write).await?;
    check_refused(store, done, write, &snap, session).await?;
    Ok(snap)
}

/// A write that did not commit although the election was still at its revision put or
/// touched an ended session: if it is `session`'s own, `SessionExpired` (so a campaign
/// of an ended session does not retry for ever). A compare that failed needs no check.
async fn check_refused(
    store: &dyn Primitives,
    done: bool,
    write: &Write,
    after: &Snapshot,
    session: &str,
) -> Result<()> {
    if done || after.revision != write.revision {
        return Ok(());
    }
    let live = store.renew(&[session.to_string()]).await?;
    if live.first().copied().unwrap_or(false) {
        Ok(())
    } else {
        Err(expired())
    }
}

/// [`try_take`] for many seats of one session, each write decided first on an empty
/// election and sent [`Primitives::commit_many`] at a time; one answer per seat, in
/// order.
pub async fn try_take_many(
    store: &dyn Primitives,
    seats: &[(ElectionName, Candidacy)],
) -> Result<Vec<Option<(u64, Snapshot)>>> {
    let mut answers = vec![None; seats.len()];
    let mut snaps = vec![Snapshot::default(); seats.len()];
    let mut open: Vec<usize> = (0..seats.len()).collect();
    while !open.is_empty() {
        let mut writes = Vec::new();
        let mut sent = Vec::new();
        for i in open {
            let (election, me) = &seats[i];
            match engine::try_take(&snaps[i], me) {
                Step::Leader { token, .. } => answers[i] = Some((token, snaps[i].clone())),
                Step::Commit(w) => {
                    writes.push((election.clone(), w));
                    sent.push(i);
                }
                Step::Busy | Step::Wait { .. } => {}
                Step::Gone => return Err(expired()),
            }
        }
        if writes.is_empty() {
            break;
        }
        let results = store.commit_many(&writes).await?;
        for ((i, (_, w)), (done, after)) in sent.iter().zip(&writes).zip(results) {
            check_refused(store, done, w, &after, &seats[*i].1.session).await?;
            snaps[*i] = after;
        }
        open = sent;
    }
    Ok(answers)
}

/// [`resign`] for many elections of one session, [`Primitives::commit_many`] at a
/// time; `last` as for [`resign`], one per election.
pub async fn resign_many(
    store: &dyn Primitives,
    releases: &[(ElectionName, Release<'_>)],
    last: Vec<Option<Snapshot>>,
) -> Result<()> {
    let unknown: Vec<ElectionName> = releases
        .iter()
        .zip(&last)
        .filter(|(_, l)| l.is_none())
        .map(|((e, _), _)| e.clone())
        .collect();
    let mut read = match unknown.is_empty() {
        true => Vec::new().into_iter(),
        false => store.read_many(&unknown).await?.into_iter(),
    };
    let mut snaps: Vec<Snapshot> = last
        .into_iter()
        .map(|l| l.or_else(|| read.next()).unwrap_or_default())
        .collect();
    let mut open: Vec<usize> = (0..releases.len()).collect();
    while !open.is_empty() {
        let mut writes = Vec::new();
        let mut sent = Vec::new();
        for i in open {
            let r = &releases[i].1;
            if let Some(w) = engine::resign(&snaps[i], r.session, r.token, r.state) {
                writes.push((releases[i].0.clone(), w));
                sent.push(i);
            }
        }
        if writes.is_empty() {
            break;
        }
        let results = store.commit_many(&writes).await?;
        open = Vec::new();
        for (i, (done, after)) in sent.into_iter().zip(results) {
            if !done {
                open.push(i);
            }
            snaps[i] = after;
        }
    }
    Ok(())
}

fn expired() -> Error {
    Error::new(ErrorKind::SessionExpired, "the session has expired")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store's task waiting for a follower ends when the follower goes, not at a
    /// later look.
    #[tokio::test(start_paused = true)]
    async fn a_wake_is_closed_when_its_follower_goes() {
        let (to, woken) = Wake::channel();
        let waiting = tokio::spawn({
            let to = to.clone();
            async move { to.closed().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "closed while followed");
        drop(woken);
        let ended = tokio::time::timeout(Duration::from_millis(1), waiting).await;
        assert!(
            matches!(ended, Ok(Ok(()))),
            "still waiting after the follower went"
        );
        assert!(to.is_closed());
    }
}
