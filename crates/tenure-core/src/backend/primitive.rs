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

    /// Commit `write` atomically if `election` is still at `write.revision`, minting
    /// tokens for its [`Token::Mint`](engine::Token::Mint) puts; returns whether it
    /// committed and the election as it stands after (one round trip). A write that
    /// puts or touches a record of an ended session does not commit.
    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)>;

    /// Return once what `what` names happened after the election was at revision
    /// `what.seen`: the record of `what.me` changed or is gone, or the record of
    /// `what.on` is gone or its session ended; with neither named, the election moved
    /// past `seen`. At once if that happened already; spurious returns are allowed,
    /// missed ones are not.
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()>;

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
pub async fn campaign(
    store: &dyn Primitives,
    election: &ElectionName,
    me: &Candidacy,
) -> Result<(u64, Snapshot)> {
    let mut snap = store.read(election).await?;
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
                store.changed(election, &what).await?;
                snap = store.read(election).await?;
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

/// Take the seat only if nobody else holds it or waits for it; the token if taken, with
/// the election as the grant was learnt.
pub async fn try_take(
    store: &dyn Primitives,
    election: &ElectionName,
    me: &Candidacy,
) -> Result<Option<(u64, Snapshot)>> {
    let mut snap = store.read(election).await?;
    loop {
        match engine::try_take(&snap, me) {
            Step::Leader { token, .. } => return Ok(Some((token, snap))),
            Step::Commit(write) => snap = commit(store, election, &write, &me.session).await?,
            Step::Busy | Step::Wait { .. } => return Ok(None),
            Step::Gone => return Err(expired()),
        }
    }
}

/// Withdraw `session`'s candidacy in `election` (with `token`, only that grant); a
/// holder's release grants the next waiter in the same write, and leaves it `state`.
pub async fn resign(
    store: &dyn Primitives,
    election: &ElectionName,
    session: &str,
    token: Option<u64>,
    state: Option<&[u8]>,
) -> Result<()> {
    let mut snap = store.read(election).await?;
    while let Some(write) = engine::resign(&snap, session, token, state) {
        let (done, after) = store.commit(election, &write).await?;
        if done {
            return Ok(());
        }
        snap = after;
    }
    Ok(())
}

/// Ask the holder of `election` to step down to `to` (or the next waiter).
pub async fn handover(
    store: &dyn Primitives,
    election: &ElectionName,
    to: Option<&str>,
) -> Result<()> {
    let mut snap = store.read(election).await?;
    loop {
        let write = engine::handover(&snap, to).map_err(|r| refused(election, &r))?;
        let (done, after) = store.commit(election, &write).await?;
        if done {
            return Ok(());
        }
        snap = after;
    }
}

/// The refusal of a handover as an error (written once for every store).
pub fn refused(election: &ElectionName, why: &Refusal) -> Error {
    Error::invalid(format!("election {election}: {why}"))
}

/// Commit `write` for `session`; if it did not commit and the session has ended,
/// `SessionExpired` (so a campaign of an ended session does not retry for ever).
async fn commit(
    store: &dyn Primitives,
    election: &ElectionName,
    write: &Write,
    session: &str,
) -> Result<Snapshot> {
    let (done, snap) = store.commit(election, write).await?;
    if !done
        && !store
            .renew(&[session.to_string()])
            .await?
            .first()
            .copied()
            .unwrap_or(false)
    {
        return Err(expired());
    }
    Ok(snap)
}

fn expired() -> Error {
    Error::new(ErrorKind::SessionExpired, "the session has expired")
}
