//! The election engine: the rules of one election, written once for every store.
//!
//! The engine is sans-IO. It is given a [`Snapshot`] of one election's records as a
//! store holds them (one [`Record`] per candidacy, with the store's revisions) and
//! answers with a [`Step`]: the conditional [`Write`] to commit, what to wait for, or
//! that the seat is held. A store adapter supplies only primitives — sessions, one
//! atomic conditional write that returns the records it leaves, ordered change
//! notification and a token source — and drives the engine in a thin loop:
//!
//! ```text
//! loop {
//!     match engine::campaign(&snapshot, &me) {
//!         Step::Leader { token, .. } => return token,
//!         Step::Commit(write) => snapshot = store.commit(&write)?.snapshot,
//!         Step::Wait { on } => snapshot = store.wait_for_deletion_or_own_change(on)?,
//!         Step::Busy | Step::Gone => ...,
//!     }
//! }
//! ```
//!
//! # The records
//! Each candidacy in an election is one record, owned by the session that campaigns
//! (at most one per session and election). A record with a token holds the seat; the
//! others wait. A record's *arrival* comes from the store (a create revision, a
//! sequence) and orders waiters of equal rank; its *version* changes with every write
//! to it, so a write can compare it. A store whose records vanish with their session
//! (etcd leases, ZooKeeper ephemeral nodes) reports every record live; a store that
//! keeps them until cleared away (PostgreSQL, Redis) reports a dead session's records
//! with `live: false`, and the engine's writes delete them.
//!
//! # The rules
//! - **Queue order**: the waiter a handover chose first, then higher priority, then
//!   earlier arrival ([`queue`]).
//! - **The grant**: a waiter is granted when no live record holds the seat and no live
//!   waiter is ahead of it; the write compares the whole election's revision, so it
//!   commits only on what it decided from.
//! - **Release grants the next waiter in the same write**: the successor only has to
//!   learn of it, so a handover costs one write.
//! - **Preemption**: a joining candidate of a higher priority than a preemptible
//!   holder's marks the holder `told`, once.
//! - **Handover**: to a named live waiter (marked `chosen`) or to the next one; refused
//!   when nobody leads, nobody waits, or the named candidate does not wait
//!   ([`Refusal`]).
//! - **Adoption**: a candidate whose grant committed but whose answer was lost finds
//!   its token in its own record and leads with it.
//! - **State transfer**: a holder that resigns with a state leaves it to the waiter its
//!   release grants, in the same write; with nobody waiting, the election keeps it for
//!   the next grant. A grant after a crash inherits nothing.
//! - **One wake-up per release**: each waiter waits for the deletion of the live record
//!   directly ahead of it (the first waiter: the holder) or a change to its own record;
//!   a write that puts a record ahead of a waiter touches that waiter so it looks again.
//!   A release therefore wakes exactly the waiter it grants.

mod codec;
#[cfg(test)]
mod model;
mod rules;

pub use rules::{campaign, handover, holder, queue, resign, step, try_take};

use std::fmt;

/// What a candidate asks for in one election: who it is and how it ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidacy {
    /// The session that campaigns; its record lives and dies with it.
    pub session: String,
    /// The candidate's id (what observers and handovers name).
    pub candidate: String,
    /// The value observers are shown.
    pub value: String,
    /// Higher goes first.
    pub priority: i32,
    /// Whether a higher-priority candidate that joins asks it to step down.
    pub preemptible: bool,
}

/// The most state a holder may leave its successor.
pub const MAX_STATE: usize = 64 * 1024;

/// `InvalidArgument` for a state over [`MAX_STATE`] bytes (`what`: who was given it).
pub fn check_state(what: &str, state: &[u8]) -> crate::Result<()> {
    if state.len() > MAX_STATE {
        return Err(crate::Error::invalid(format!(
            "{what}: a state of {} bytes is over the {MAX_STATE} a successor may inherit",
            state.len()
        )));
    }
    Ok(())
}

/// A state a holder left its successor, with the token of the grant that left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inherited {
    /// The token of the grant that left it.
    pub token: u64,
    /// The state, at most [`MAX_STATE`] bytes.
    pub state: Vec<u8>,
}

/// One candidacy as the store holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The candidacy.
    pub candidacy: Candidacy,
    /// Orders waiters of equal rank: the store's create revision or sequence.
    pub arrival: u64,
    /// The store's version of this record; changes with every write to it.
    pub version: u64,
    /// The token of the grant this record holds; `None` for a waiter.
    pub token: Option<u64>,
    /// The holder was asked to step down (a preemption or a handover).
    pub told: bool,
    /// A handover chose this waiter to go next.
    pub chosen: bool,
    /// Whether the store still counts the record's session alive.
    pub live: bool,
    /// What the grant this record holds inherited from the holder before it.
    pub inherited: Option<Inherited>,
}

impl Record {
    /// The session that owns the record.
    pub fn session(&self) -> &str {
        &self.candidacy.session
    }
}

/// One election's records as read at one store revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The election's revision when read. Every [`Write`] moves it on, so a write
    /// conditional on it commits only on the records it was decided from. (Records that
    /// vanish with their session need not move it: a write that puts a record of an
    /// ended session fails in the store anyway.)
    pub revision: u64,
    /// The records, in any order.
    pub records: Vec<Record>,
    /// A state a holder left with nobody waiting, for the next grant to take.
    pub left: Option<Inherited>,
}

impl Snapshot {
    /// The record of `session`, if any.
    pub fn record(&self, session: &str) -> Option<&Record> {
        self.records.iter().find(|r| r.session() == session)
    }
}

/// The token a put leaves in a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Token {
    /// A waiter.
    None,
    /// The holder keeps this token.
    Keep(u64),
    /// A new grant: the store's token source gives the next token (the write's
    /// revision, or the next value of a sequence), larger than every token minted
    /// before in the same election (contract clause 2). A store-wide revision or
    /// sequence gives more (larger than every token of the store); a counter kept in
    /// the election's own record, as Azure keeps one, gives exactly this.
    Mint,
}

impl Token {
    /// The token a record holds once the put is applied: none, the kept one, or the
    /// one `mint` gives.
    pub fn resolve(self, mint: impl FnOnce() -> u64) -> Option<u64> {
        match self {
            Token::None => None,
            Token::Keep(t) => Some(t),
            Token::Mint => Some(mint()),
        }
    }
}

/// One change a [`Write`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create or replace the session's record; a new record takes its arrival from the
    /// store, a replaced one keeps it.
    Put {
        /// The candidacy (its session names the record).
        candidacy: Candidacy,
        /// The token left in it.
        token: Token,
        /// Whether the holder was asked to step down.
        told: bool,
        /// Whether a handover chose it.
        chosen: bool,
        /// What its grant inherited.
        inherited: Option<Inherited>,
    },
    /// Rewrite the session's record unchanged, so that its owner looks again.
    Touch(String),
    /// Delete the session's record.
    Delete(String),
}

impl Op {
    /// The session whose record the op changes.
    pub fn session(&self) -> &str {
        match self {
            Op::Put { candidacy, .. } => &candidacy.session,
            Op::Touch(s) | Op::Delete(s) => s,
        }
    }

    /// The record a put leaves, with the store's `arrival` (the old record's, or a new
    /// one) and `version`, a minted token taken from `mint`; `None` for a touch or a
    /// delete.
    pub fn record(&self, arrival: u64, version: u64, mint: impl FnOnce() -> u64) -> Option<Record> {
        let Op::Put {
            candidacy,
            token,
            told,
            chosen,
            inherited,
        } = self
        else {
            return None;
        };
        Some(Record {
            candidacy: candidacy.clone(),
            arrival,
            version,
            token: token.resolve(mint),
            told: *told,
            chosen: *chosen,
            live: true,
            inherited: inherited.clone(),
        })
    }
}

/// The conditional write the engine asks a store to commit atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Write {
    /// The election's revision the write was decided on: it commits only if the
    /// election is still at it (and then moves it on), else nothing is written.
    pub revision: u64,
    /// Changes, applied together.
    pub ops: Vec<Op>,
    /// Sessions to notify, for stores that notify explicitly (a watch-based store
    /// needs none: each owner watches its own record and the one ahead).
    pub wake: Vec<String>,
    /// The holder this write asks to step down, with its token, if any.
    pub tell: Option<(String, u64)>,
    /// Whether the holder changes (observers of the leader look again).
    pub leader_changed: bool,
    /// `Some`: replace the state the election keeps for its next grant (`Some(None)`
    /// clears it); `None`: leave it.
    pub left: Option<Option<Inherited>>,
}

/// What a candidate waits for after stepping on the election at revision `seen`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitFor {
    /// A change to (or the deletion of) this session's own record; a store that keeps
    /// records after their session ends returns at that end too where it can (else
    /// the holder learns of it from its next renewal).
    pub me: Option<String>,
    /// The deletion of this session's record, or the end of the session.
    pub on: Option<String>,
    /// The election's revision the wait was decided on. With neither `me` nor `on`:
    /// any move of the election past it.
    pub seen: u64,
}

impl WaitFor {
    /// Whether `now`, the election as a store learnt it after the wait began (later
    /// than `seen`), shows what the wait waits for: `me`'s record changed since `seen`,
    /// gone or dead; `on`'s record gone or dead; with no `on`, any move past `seen`
    /// (a holder waiting on its own record returns on any move, so that its release
    /// is decided on the election as it stands). A store that hears elections pushed
    /// wakes a wait with it, without a read; waking early is allowed, late is not.
    pub fn met_by(&self, now: &Snapshot) -> bool {
        let seen = self.seen;
        let mine = |me: &str| now.record(me).is_none_or(|r| r.version > seen || !r.live);
        let gone = |on: &str| now.record(on).is_none_or(|r| !r.live);
        match (self.me.as_deref(), self.on.as_deref()) {
            (_, None) => now.revision > seen,
            (me, Some(on)) => me.is_some_and(mine) || gone(on),
        }
    }
}

/// What a candidate does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its record holds the seat with this token (also when the answer to the write
    /// that granted it was lost); `told`: it was asked to step down.
    Leader {
        /// The token of the grant.
        token: u64,
        /// Asked to step down.
        told: bool,
    },
    /// Commit this write, then step again on the records the store returns (whether it
    /// committed or a compare failed).
    Commit(Write),
    /// Nothing to write: wait until the record of session `on` is deleted (or, in a
    /// store that keeps dead records, its session expires) or the candidate's own
    /// record changes, then step again on a fresh read.
    Wait {
        /// The session whose record is directly ahead.
        on: String,
    },
    /// [`try_take`]: another live candidacy holds or waits; nothing was written.
    Busy,
    /// The candidate's record is gone (its session expired, or it was withdrawn).
    Gone,
}

/// Why a handover was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No live holder.
    NobodyLeads,
    /// No live waiter; the holder (named) keeps the seat.
    NobodyWaits(String),
    /// The named candidate does not wait.
    NotWaiting(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::NobodyLeads => write!(f, "nobody leads it, nothing to hand over"),
            Refusal::NobodyWaits(holder) => {
                write!(f, "nobody waits for it, {holder:?} keeps it")
            }
            Refusal::NotWaiting(id) => write!(f, "no candidate {id:?} waits for it"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(session: &str, version: u64, live: bool) -> Record {
        Record {
            candidacy: Candidacy {
                session: session.to_owned(),
                candidate: session.to_owned(),
                value: String::new(),
                priority: 0,
                preemptible: true,
            },
            arrival: version,
            version,
            token: None,
            told: false,
            chosen: false,
            live,
            inherited: None,
        }
    }

    fn wait(me: Option<&str>, on: Option<&str>, seen: u64) -> WaitFor {
        let (me, on) = (me.map(str::to_owned), on.map(str::to_owned));
        WaitFor { me, on, seen }
    }

    /// The one rule of what wakes a wait, for every store that hears elections pushed.
    #[test]
    fn a_wait_is_met_by_what_it_names_and_nothing_else() {
        let at = |revision, records| Snapshot {
            revision,
            records,
            left: None,
        };
        let both = vec![record("a", 3, true), record("b", 4, true)];
        // A waiter `b` behind `a`: not by a move that leaves both as they were.
        let waiter = wait(Some("b"), Some("a"), 4);
        assert!(!waiter.met_by(&at(9, both.clone())));
        assert!(waiter.met_by(&at(9, vec![record("b", 4, true)])), "a gone");
        let a_dead = vec![record("a", 3, false), record("b", 4, true)];
        assert!(waiter.met_by(&at(9, a_dead)), "a's session ended");
        let b_moved = vec![record("a", 3, true), record("b", 7, true)];
        assert!(waiter.met_by(&at(9, b_moved)), "its own record written");
        assert!(
            waiter.met_by(&at(9, vec![record("a", 3, true)])),
            "its own gone"
        );
        // A holder waiting on its own record, or a wait on nothing: any move.
        let holder = wait(Some("a"), None, 4);
        assert!(!holder.met_by(&at(4, both.clone())));
        assert!(holder.met_by(&at(5, both.clone())));
        assert!(!wait(None, None, 4).met_by(&at(4, both.clone())));
        assert!(wait(None, None, 4).met_by(&at(5, both)));
    }
}
