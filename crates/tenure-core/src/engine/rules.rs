//! The decisions: pure functions from a snapshot to the next step or write.

use std::cmp::Ordering;

use super::{Candidacy, Inherited, Op, Record, Refusal, Snapshot, Step, Token, Write};

/// Grant order among waiters: the handover's choice, then higher priority, then
/// earlier arrival.
fn rank(a: &Record, b: &Record) -> Ordering {
    #[cfg(test)]
    if broken::is(broken::Rule::ArrivalOnly) {
        return a.arrival.cmp(&b.arrival);
    }
    b.chosen
        .cmp(&a.chosen)
        .then(b.candidacy.priority.cmp(&a.candidacy.priority))
        .then(a.arrival.cmp(&b.arrival))
}

/// The live record holding the seat, if any.
pub fn holder(snap: &Snapshot) -> Option<&Record> {
    snap.records.iter().find(|r| r.live && r.token.is_some())
}

/// The live waiters in the order they will be granted.
pub fn queue(snap: &Snapshot) -> Vec<&Record> {
    let mut q: Vec<&Record> = snap
        .records
        .iter()
        .filter(|r| r.live && r.token.is_none())
        .collect();
    q.sort_by(|a, b| rank(a, b));
    q
}

/// The holder (if live) followed by the queue: each record waits on the one before it.
fn line(snap: &Snapshot) -> Vec<&Record> {
    holder(snap).into_iter().chain(queue(snap)).collect()
}

/// The session of the record directly ahead of `session` in the line.
fn ahead<'a>(line: &[&'a Record], session: &str) -> Option<&'a str> {
    let at = line.iter().position(|r| r.session() == session)?;
    #[cfg(test)]
    if broken::is(broken::Rule::WaitOnHead) && at > 0 {
        return Some(line[0].session());
    }
    at.checked_sub(1).map(|i| line[i].session())
}

/// Join (or, with a record already there, continue) the election as `me`.
///
/// A new candidacy is queued; if the seat is free and nobody live would be ahead of
/// it, the same write grants it. A preemptible holder of a lower priority is asked to
/// step down (once).
pub fn campaign(snap: &Snapshot, me: &Candidacy) -> Step {
    match snap.record(&me.session) {
        Some(mine) if mine.live => {
            if mine.token.is_none() && mine.candidacy != *me {
                // The candidate's rank changed: rewrite it in place, keeping its arrival.
                let put = put(me, Token::None, false, mine.chosen);
                return Step::Commit(write(snap, &me.session, vec![put]));
            }
            step(snap, &me.session)
        }
        Some(_) => Step::Gone,
        None => Step::Commit(join(snap, me)),
    }
}

fn join(snap: &Snapshot, me: &Candidacy) -> Write {
    let first = holder(snap).is_none()
        && queue(snap)
            .first()
            .is_none_or(|w| !w.chosen && w.candidacy.priority < me.priority);
    if first {
        let w = write(snap, &me.session, vec![put(me, Token::Mint, false, false)]);
        return granting(snap, w);
    }
    let mut ops = vec![put(me, Token::None, false, false)];
    let mut tell = None;
    if let Some(h) = holder(snap) {
        let due = h.candidacy.preemptible && !h.told && h.candidacy.priority < me.priority;
        if due {
            ops.push(told(h));
            tell = h.token.map(|t| (h.session().to_string(), t));
        }
    }
    let mut w = write(snap, &me.session, ops);
    w.tell = tell;
    w
}

/// The next step of a candidate whose record is in the store.
pub fn step(snap: &Snapshot, session: &str) -> Step {
    let Some(mine) = snap.record(session).filter(|r| r.live) else {
        return Step::Gone;
    };
    if let Some(token) = mine.token {
        return Step::Leader {
            token,
            told: mine.told,
        };
    }
    let line = line(snap);
    match ahead(&line, session) {
        Some(on) if !broken_ignores_holder(snap, session) => Step::Wait { on: on.to_string() },
        _ => {
            let w = Write {
                revision: snap.revision,
                ops: vec![put(&mine.candidacy, Token::Mint, false, false)],
                leader_changed: true,
                ..Write::default()
            };
            Step::Commit(granting(snap, w))
        }
    }
}

/// The broken rule [`broken::Rule::IgnoreHolder`]: the first waiter takes the seat.
fn broken_ignores_holder(snap: &Snapshot, session: &str) -> bool {
    #[cfg(test)]
    if broken::is(broken::Rule::IgnoreHolder) {
        return queue(snap).first().is_some_and(|w| w.session() == session);
    }
    let _ = (snap, session);
    false
}

/// Take the seat only if no other live candidacy holds it or waits for it.
pub fn try_take(snap: &Snapshot, me: &Candidacy) -> Step {
    if let Some(token) = snap
        .record(&me.session)
        .filter(|r| r.live)
        .and_then(|r| r.token)
    {
        let told = snap.record(&me.session).is_some_and(|r| r.told);
        return Step::Leader { token, told };
    }
    if snap
        .records
        .iter()
        .any(|r| r.live && r.session() != me.session)
    {
        return Step::Busy;
    }
    let w = Write {
        revision: snap.revision,
        ops: vec![put(me, Token::Mint, false, false)],
        leader_changed: true,
        ..Write::default()
    };
    Step::Commit(granting(snap, w))
}

/// Withdraw `session`'s candidacy (with `token`, only the grant with that token). A
/// holder's release grants the first live waiter in the same write, leaving it `state`
/// if given; with nobody waiting, the election keeps `state` for its next grant.
/// `None`: nothing to withdraw.
pub fn resign(
    snap: &Snapshot,
    session: &str,
    token: Option<u64>,
    state: Option<&[u8]>,
) -> Option<Write> {
    let mine = snap.record(session)?;
    if token.is_some_and(|t| mine.token != Some(t)) {
        return None;
    }
    let mut ops = vec![Op::Delete(session.to_string())];
    let held = mine.live && mine.token.is_some();
    let left = match (held, mine.token, state) {
        (true, Some(token), Some(state)) => Some(Inherited {
            token,
            state: state.to_vec(),
        }),
        _ => None,
    };
    let next = if held {
        queue(snap).first().copied()
    } else {
        None
    };
    if let Some(n) = next {
        let mut grant = put(&n.candidacy, Token::Mint, false, false);
        if let Op::Put { inherited, .. } = &mut grant {
            inherited.clone_from(&left);
        }
        ops.push(grant);
    }
    let mut w = write(snap, session, ops);
    if next.is_some() {
        w = granting(snap, w);
    } else if left.is_some() {
        w.left = Some(left);
    }
    #[cfg(test)]
    if broken::is(broken::Rule::SilentRelease) {
        w.wake.clear();
    }
    Some(w)
}

/// Ask the holder to step down in favour of the waiting candidate `to` (or whoever
/// waits first): the holder is marked told and `to` chosen, so the holder's release
/// grants it.
pub fn handover(snap: &Snapshot, to: Option<&str>) -> Result<Write, Refusal> {
    let h = holder(snap).ok_or(Refusal::NobodyLeads)?;
    let q = queue(snap);
    let mut ops = vec![told(h)];
    match to {
        Some(id) => {
            let target = q
                .iter()
                .find(|w| w.candidacy.candidate == id)
                .ok_or_else(|| Refusal::NotWaiting(id.to_string()))?;
            for w in &q {
                let chosen = w.session() == target.session();
                if chosen != w.chosen {
                    ops.push(put(&w.candidacy, Token::None, false, chosen));
                }
            }
        }
        None if q.is_empty() => return Err(Refusal::NobodyWaits(h.candidacy.candidate.clone())),
        None => {}
    }
    let mut w = write(snap, "", ops);
    w.tell = h.token.map(|t| (h.session().to_string(), t));
    Ok(w)
}

fn put(c: &Candidacy, token: Token, told: bool, chosen: bool) -> Op {
    Op::Put {
        candidacy: c.clone(),
        token,
        told,
        chosen,
        inherited: None,
    }
}

/// The holder `h`'s record, asked to step down (its grant and what it inherited kept).
fn told(h: &Record) -> Op {
    Op::Put {
        candidacy: h.candidacy.clone(),
        token: h.token.map_or(Token::None, Token::Keep),
        told: true,
        chosen: false,
        inherited: h.inherited.clone(),
    }
}

/// A write by `writer` ("" for none) of `ops`, each compared against the record it
/// replaces, plus the touches and wake-ups its changes to the line call for: every
/// waiter whose record-ahead changes looks again, woken by the deletion of the record
/// it waited on or by a touch of its own record.
fn write(snap: &Snapshot, writer: &str, ops: Vec<Op>) -> Write {
    let after = applied(snap, &ops);
    let (old, new) = (line(snap), line(&after));
    let written = |s: &str| ops.iter().any(|op| op.session() == s);
    let deleted = |s: &str| ops.iter().any(|op| matches!(op, Op::Delete(d) if d == s));
    let mut w = Write {
        revision: snap.revision,
        ..Write::default()
    };
    for op in &ops {
        let s = op.session();
        if s != writer && !matches!(op, Op::Delete(_)) {
            w.wake.push(s.to_string());
        }
    }
    let mut touches = Vec::new();
    for r in &new {
        let s = r.session();
        if written(s) {
            continue;
        }
        let (before, now) = (ahead(&old, s), ahead(&new, s));
        if before == now {
            continue;
        }
        if before.is_some_and(deleted) {
            w.wake.push(s.to_string());
        } else {
            touches.push(Op::Touch(s.to_string()));
            w.wake.push(s.to_string());
        }
    }
    w.ops = ops;
    w.ops.extend(touches);
    w.leader_changed = holder(snap).map(Record::session) != holder(&after).map(Record::session);
    w
}

/// `w`, a write that grants the seat, completed: a state the election kept for its
/// next grant goes to this one (unless the release in `w` left it one of its own), and
/// the records of dead sessions are deleted (they are not in the line, so nobody waits
/// on them).
fn granting(snap: &Snapshot, mut w: Write) -> Write {
    if let Some(kept) = &snap.left {
        for op in &mut w.ops {
            if let Op::Put {
                token: Token::Mint,
                inherited,
                ..
            } = op
            {
                if inherited.is_none() && !drops_left() {
                    *inherited = Some(kept.clone());
                }
            }
        }
        w.left = Some(None);
    }
    for r in snap.records.iter().filter(|r| !r.live) {
        w.ops.push(Op::Delete(r.session().to_string()));
    }
    w
}

/// The broken rule [`broken::Rule::DropLeft`]: a grant ignores the state kept for it.
fn drops_left() -> bool {
    #[cfg(test)]
    if broken::is(broken::Rule::DropLeft) {
        return true;
    }
    false
}

/// `snap` with `ops` applied as the store would (a new record arrives last; a minted
/// token stands for the holder).
fn applied(snap: &Snapshot, ops: &[Op]) -> Snapshot {
    let mut after = snap.clone();
    for op in ops {
        match op {
            Op::Delete(s) => after.records.retain(|r| r.session() != s),
            Op::Touch(_) => {}
            Op::Put { .. } => {
                let at = after
                    .records
                    .iter()
                    .position(|r| r.session() == op.session());
                let arrival = at.map_or(u64::MAX, |i| after.records[i].arrival);
                let Some(rec) = op.record(arrival, 0, || u64::MAX) else {
                    continue;
                };
                match at {
                    Some(i) => after.records[i] = rec,
                    None => after.records.push(rec),
                }
            }
        }
    }
    after
}

/// Deliberately broken rules, for the model test to show it catches them.
#[cfg(test)]
pub(super) mod broken {
    use std::cell::Cell;

    /// A rule broken on purpose.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Rule {
        /// The first waiter takes the seat even while a live holder has it.
        IgnoreHolder,
        /// Waiters are ranked by arrival only (priority and handover ignored).
        ArrivalOnly,
        /// Every waiter waits on the holder instead of the record directly ahead.
        WaitOnHead,
        /// A release names nobody to wake (a store that notifies explicitly never
        /// tells the waiter it granted).
        SilentRelease,
        /// A grant ignores the state a holder left with nobody waiting.
        DropLeft,
    }

    thread_local! {
        static BROKEN: Cell<Option<Rule>> = const { Cell::new(None) };
    }

    pub fn is(rule: Rule) -> bool {
        BROKEN.with(|b| b.get() == Some(rule))
    }

    pub fn set(rule: Option<Rule>) {
        BROKEN.with(|b| b.set(rule));
    }
}
