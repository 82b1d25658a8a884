//! A randomized model test of the engine alone: a simulated store (its own code, not the
//! engine's), candidates that drive the engine as an adapter would, and a scheduler
//! that crashes sessions, loses answers, delays, duplicates and reorders notifications
//! and writes, hands over and preempts. Checked after every write: at most one holder,
//! strictly increasing tokens, grants in priority order, exactly the granted waiter
//! woken by a release, a state left by a release inherited by the next grant and
//! nothing else inherited; and at quiescence: no waiter left waiting on a free seat and no
//! holder that does not know it (no lost wake-up).

use std::collections::{BTreeMap, BTreeSet};

use super::rules::broken::{self, Rule};
use super::{campaign, handover, resign, Candidacy, Inherited, Op, Record, Snapshot, Step};

/// xorshift64*: reproducible from a seed, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// The model store keeps records as the engine names them (`live` unused: it keeps
/// the ended sessions apart).
type Rec = Record;

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// Not campaigning.
    Idle,
    /// Must read and step (woken, or its answer was lost).
    Step,
    /// A write of its is in flight.
    InFlight,
    /// Waiting on the record of session `on`, or its own record, to change after
    /// `seen` (the store revision it stepped on).
    Waiting { on: String, seen: u64 },
    /// Leads with this token.
    Leader(u64),
    /// Releasing (a write in flight, or to be sent).
    Resigning(u64),
    /// Its session ended.
    Dead,
}

struct Cand {
    me: Candidacy,
    state: State,
}

/// Where a record's session stands.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Records vanish with their session; waiters are woken by watches (etcd, ZooKeeper).
    Watch,
    /// Dead sessions' records stay until a write deletes them; waiters are woken by the
    /// writes' wake lists and by timers on the expiry of the session they wait on
    /// (PostgreSQL, Redis).
    Notify,
}

struct Flight {
    who: usize,
    write: super::Write,
    /// The token of the grant this write releases, for a release.
    releasing: Option<u64>,
}

struct Model {
    mode: Mode,
    rng: Rng,
    revision: u64,
    last_token: u64,
    records: BTreeMap<String, Rec>,
    /// The state the store keeps for the next grant (as the writes set it).
    left: Option<Inherited>,
    /// The state the next grant must inherit, by the model's own reckoning.
    owed: Option<Inherited>,
    dead: BTreeSet<String>,
    cands: Vec<Cand>,
    flights: Vec<Flight>,
    wakes: Vec<usize>,
    became: Vec<u64>,
    writes: u64,
    /// Grants, of them by a release, handovers, step-down asks, crashes, lost answers.
    counts: [u64; 6],
    /// What happened, for the report of a violation.
    log: Vec<String>,
}

type Violation = String;

/// The model's own grant order (kept apart from the engine's).
fn outranks(a: &Rec, b: &Rec) -> bool {
    (a.chosen, a.candidacy.priority, std::cmp::Reverse(a.arrival))
        > (b.chosen, b.candidacy.priority, std::cmp::Reverse(b.arrival))
}

impl Model {
    fn new(seed: u64, mode: Mode, n: usize) -> Model {
        let mut rng = Rng(seed.max(1));
        let cands = (0..n)
            .map(|i| Cand {
                me: Candidacy {
                    session: format!("s{i}"),
                    candidate: format!("c{i}"),
                    value: String::new(),
                    priority: [0, 0, 0, 5, 10][rng.below(5)],
                    preemptible: !rng.chance(20),
                },
                state: State::Idle,
            })
            .collect();
        Model {
            mode,
            rng,
            revision: 1,
            last_token: 0,
            records: BTreeMap::new(),
            left: None,
            owed: None,
            dead: BTreeSet::new(),
            cands,
            flights: Vec::new(),
            wakes: Vec::new(),
            became: Vec::new(),
            writes: 0,
            counts: [0; 6],
            log: Vec::new(),
        }
    }

    fn live(&self, session: &str) -> bool {
        !self.dead.contains(session)
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            revision: self.revision,
            records: self
                .records
                .values()
                .map(|r| Record {
                    live: self.live(&r.candidacy.session),
                    ..r.clone()
                })
                .collect(),
            left: self.left.clone(),
        }
    }

    fn holders(&self) -> Vec<&Rec> {
        self.records
            .values()
            .filter(|r| r.token.is_some() && self.live(&r.candidacy.session))
            .collect()
    }

    /// Commit `w` as the store would; `Ok(false)` if a compare failed.
    /// `releasing`: the token of the grant the writer releases with this write, if any.
    fn commit(&mut self, w: &super::Write, releasing: Option<u64>) -> Result<bool, Violation> {
        self.writes += 1;
        let holds = w.revision == self.revision;
        // A store refuses a put for a session that has ended (a revoked lease).
        let for_dead = w.ops.iter().any(|op| match op {
            Op::Put { candidacy, .. } => !self.live(&candidacy.session),
            Op::Touch(s) => !self.live(s),
            Op::Delete(_) => false,
        });
        self.log.push(format!(
            "r{} commit {w:?} -> {}",
            self.revision,
            holds && !for_dead
        ));
        if !holds || for_dead {
            return Ok(false);
        }
        let before_queue: Vec<Rec> = self
            .records
            .values()
            .filter(|r| r.token.is_none() && self.live(&r.candidacy.session))
            .cloned()
            .collect();
        let released_holder = w.ops.iter().any(|op| {
            matches!(op, Op::Delete(s) if self.records.get(s).is_some_and(|r| r.token.is_some()))
        });
        // What a release by the latest grant leaves is owed to the next grant (this
        // write's, or a later one). (Its session may have expired meanwhile: with
        // nothing written to the election since, it still is the grant before the next.)
        if let Some(t) = releasing.filter(|t| *t == self.last_token) {
            if let Some(state) = state_left_by(t) {
                self.owed = Some(Inherited { token: t, state });
            }
        }
        if let Some(left) = &w.left {
            self.left.clone_from(left);
        }
        self.revision += 1;
        let rev = self.revision;
        let mut changed = BTreeSet::new();
        let mut deleted = BTreeSet::new();
        let mut minted = None;
        for op in &w.ops {
            match op {
                Op::Delete(s) => {
                    if self.records.remove(s).is_some() {
                        deleted.insert(s.clone());
                    }
                }
                Op::Touch(s) => {
                    if let Some(r) = self.records.get_mut(s) {
                        r.version = rev;
                        changed.insert(s.clone());
                    }
                }
                Op::Put { .. } => {
                    let session = op.session().to_string();
                    let arrival = self.records.get(&session).map_or(rev, |r| r.arrival);
                    let mut new_token = None;
                    let mint = || {
                        self.last_token += 1;
                        new_token = Some(self.last_token);
                        self.last_token
                    };
                    if let Some(rec) = op.record(arrival, rev, mint) {
                        self.records.insert(session.clone(), rec);
                    }
                    if let Some(t) = new_token {
                        minted = Some((session.clone(), t));
                    }
                    changed.insert(session);
                }
            }
        }
        if self.holders().len() > 1 {
            return Err(format!("two holders: {:?}", self.holders()));
        }
        let mut woken = self.notify(&changed, &deleted, &w.wake);
        self.counts[3] += u64::from(w.tell.is_some());
        if let Some((granted, token)) = minted {
            self.counts[0] += 1;
            let owed = self.owed.take();
            let got = self.records.get(&granted).and_then(|r| r.inherited.clone());
            if got != owed {
                return Err(format!(
                    "grant {token} to {granted} inherited {got:?}, owed {owed:?}"
                ));
            }
            self.counts[1] += u64::from(released_holder);
            // Ranked as it stood before this write (a grant clears `chosen`).
            let before = before_queue.iter().find(|r| r.candidacy.session == granted);
            let Some(g) = before.or(self.records.get(&granted)) else {
                return Err("a minted record vanished".into());
            };
            if let Some(better) = before_queue
                .iter()
                .find(|r| r.candidacy.session != granted && outranks(r, g))
            {
                return Err(format!(
                    "granted {granted} (priority {}) while {} (priority {}, chosen {}) waited",
                    g.candidacy.priority,
                    better.candidacy.session,
                    better.candidacy.priority,
                    better.chosen
                ));
            }
            if released_holder {
                let granted_waits = self
                    .cands
                    .iter()
                    .any(|c| c.me.session == granted && matches!(c.state, State::Waiting { .. }));
                woken.retain(|s| *s != granted);
                if !woken.is_empty() {
                    return Err(format!(
                        "a release granting {granted} (token {token}) woke {woken:?} as well"
                    ));
                }
                let heard = self
                    .wakes
                    .iter()
                    .any(|&i| self.cands[i].me.session == granted);
                if granted_waits && !heard {
                    return Err(format!("a release granted {granted} and did not wake it"));
                }
            }
        }
        Ok(true)
    }

    /// Queue the wake-ups a write causes; returns the sessions of waiting candidates it
    /// woke that had no wake-up pending.
    fn notify(
        &mut self,
        changed: &BTreeSet<String>,
        deleted: &BTreeSet<String>,
        wake: &[String],
    ) -> Vec<String> {
        let mut woken = Vec::new();
        for i in 0..self.cands.len() {
            let s = self.cands[i].me.session.clone();
            let hit = match (&self.cands[i].state, self.mode) {
                (State::Waiting { on, .. }, Mode::Watch) => {
                    deleted.contains(on) || changed.contains(&s)
                }
                (State::Waiting { .. }, Mode::Notify) => wake.contains(&s),
                (State::Leader(_), Mode::Watch) => changed.contains(&s),
                (State::Leader(_), Mode::Notify) => wake.contains(&s),
                _ => false,
            };
            if hit {
                // A waiter with a wake-up pending already looks again: this write
                // wakes it no more than that.
                let pending = self.wakes.contains(&i);
                if matches!(self.cands[i].state, State::Waiting { .. }) && !pending {
                    woken.push(s);
                }
                self.wakes.push(i);
            }
        }
        woken
    }

    /// Candidate `i` acts on step `st` (taken on the store's revision `seen`).
    fn act(&mut self, i: usize, st: Step, seen: u64) -> Result<(), Violation> {
        self.log
            .push(format!("{} at r{seen}: {st:?}", self.cands[i].me.session));
        match st {
            Step::Leader { token, told } => {
                if self.cands[i].state != State::Leader(token) {
                    if self.became.last().is_some_and(|&t| t >= token) {
                        return Err(format!("token {token} after {:?}", self.became));
                    }
                    self.became.push(token);
                }
                self.cands[i].state = if told {
                    State::Resigning(token)
                } else {
                    State::Leader(token)
                };
            }
            Step::Commit(write) => {
                self.cands[i].state = State::InFlight;
                self.flights.push(Flight {
                    who: i,
                    write,
                    releasing: None,
                });
            }
            Step::Wait { on } => {
                // A watch from `seen` reports what changed since, so nothing is missed.
                let own = &self.cands[i].me.session;
                let missed = match self.mode {
                    Mode::Watch => {
                        !self.records.contains_key(&on)
                            || self.records.get(own).is_none_or(|r| r.version > seen)
                    }
                    Mode::Notify => {
                        !self.live(&on)
                            || !self.records.contains_key(&on)
                            || self.records.get(own).is_none_or(|r| r.version > seen)
                    }
                };
                self.cands[i].state = State::Waiting { on, seen };
                if missed {
                    self.wakes.push(i);
                }
            }
            Step::Busy | Step::Gone => self.cands[i].state = State::Idle,
        }
        Ok(())
    }

    fn step_cand(&mut self, i: usize) -> Result<(), Violation> {
        let snap = self.snapshot();
        match self.cands[i].state.clone() {
            State::Resigning(token) => self.release(i, &snap, token),
            State::Dead | State::InFlight => Ok(()),
            _ => {
                let st = campaign(&snap, &self.cands[i].me);
                self.act(i, st, snap.revision)
            }
        }
    }

    fn release(&mut self, i: usize, snap: &Snapshot, token: u64) -> Result<(), Violation> {
        let state = state_left_by(token);
        match resign(
            snap,
            &self.cands[i].me.session,
            Some(token),
            state.as_deref(),
        ) {
            Some(write) => {
                self.cands[i].state = State::Resigning(token);
                self.flights.push(Flight {
                    who: i,
                    write,
                    releasing: Some(token),
                });
            }
            None => self.cands[i].state = State::Idle,
        }
        Ok(())
    }

    fn deliver(&mut self, at: usize) -> Result<(), Violation> {
        let f = self.flights.swap_remove(at);
        let ok = self.commit(&f.write, f.releasing)?;
        let lost = self.rng.chance(15);
        self.counts[5] += u64::from(lost);
        let c = &mut self.cands[f.who];
        if c.state == State::Dead {
            return Ok(());
        }
        match c.state.clone() {
            State::Resigning(token) => {
                // Done, or (compare failed, answer lost) look again.
                if ok && !lost {
                    c.state = State::Idle;
                } else {
                    let snap = self.snapshot();
                    self.release(f.who, &snap, token)?;
                }
            }
            _ if lost => c.state = State::Step,
            _ => {
                let snap = self.snapshot();
                let st = campaign(&snap, &self.cands[f.who].me);
                self.act(f.who, st, snap.revision)?;
            }
        }
        Ok(())
    }

    fn crash(&mut self, i: usize) {
        let s = self.cands[i].me.session.clone();
        self.log.push(format!("crash {s}"));
        self.counts[4] += 1;
        self.cands[i].state = State::Dead;
        self.dead.insert(s.clone());
        let mut deleted = BTreeSet::new();
        // (The records vanish without moving the election's revision, as etcd's lease
        // expiry deletes keys without touching the election's revision key.)
        if self.mode == Mode::Watch && self.records.remove(&s).is_some() {
            deleted.insert(s.clone());
        }
        for j in 0..self.cands.len() {
            if let State::Waiting { on, .. } = &self.cands[j].state {
                // A watch sees the deletion; a notify store's waiter has a timer on the
                // expiry of the session it waits on.
                if *on == s {
                    self.wakes.push(j);
                }
            }
        }
    }

    /// A new candidate in place of a dead one (a new session).
    fn restart(&mut self, i: usize, gen: u64) {
        let me = &mut self.cands[i].me;
        me.session = format!("s{i}g{gen}");
        me.priority = [0, 0, 0, 5, 10][self.rng.below(5)];
        self.cands[i].state = State::Idle;
    }

    fn handover(&mut self) -> Result<(), Violation> {
        let snap = self.snapshot();
        let waiting: Vec<String> = super::queue(&snap)
            .iter()
            .map(|r| r.candidacy.candidate.clone())
            .collect();
        let to = if waiting.is_empty() || self.rng.chance(30) {
            None
        } else {
            Some(waiting[self.rng.below(waiting.len())].clone())
        };
        if let Ok(w) = handover(&snap, to.as_deref()) {
            self.counts[2] += u64::from(self.commit(&w, None)?);
        }
        Ok(())
    }

    fn run(&mut self, steps: usize) -> Result<(), Violation> {
        let mut gen = 0;
        for _ in 0..steps {
            let i = self.rng.below(self.cands.len());
            match self.rng.below(100) {
                0..=24 => {
                    let idle = matches!(
                        self.cands[i].state,
                        State::Idle | State::Step | State::Resigning(_)
                    );
                    if idle && !self.flights.iter().any(|f| f.who == i) {
                        self.step_cand(i)?;
                    }
                }
                25..=49 if !self.flights.is_empty() => {
                    let at = self.rng.below(self.flights.len());
                    self.deliver(at)?;
                }
                50..=69 if !self.wakes.is_empty() => {
                    let at = self.rng.below(self.wakes.len());
                    let j = self.wakes[at];
                    if self.rng.chance(80) {
                        self.wakes.swap_remove(at); // else: delivered twice
                    }
                    if matches!(
                        self.cands[j].state,
                        State::Waiting { .. } | State::Leader(_)
                    ) {
                        self.step_cand(j)?;
                    }
                }
                70..=74 => {
                    if let State::Leader(t) = self.cands[i].state {
                        self.cands[i].state = State::Resigning(t);
                        self.step_cand(i)?;
                    }
                }
                75..=77 => {
                    if self.cands[i].state == State::Dead {
                        gen += 1;
                        self.restart(i, gen);
                    } else {
                        self.crash(i);
                    }
                }
                78..=80 => self.handover()?,
                _ => {}
            }
            self.check_beliefs()?;
        }
        self.quiesce()
    }

    /// A live candidate that believes it leads holds the seat with that token.
    fn check_beliefs(&self) -> Result<(), Violation> {
        for c in &self.cands {
            if let State::Leader(t) = c.state {
                let rec = self.records.get(&c.me.session);
                if rec.and_then(|r| r.token) != Some(t) {
                    return Err(format!("{} believes it leads with {t}", c.me.session));
                }
            }
        }
        Ok(())
    }

    /// Deliver everything, then: no live waiter waits on a free seat, and the holder
    /// knows it holds.
    fn quiesce(&mut self) -> Result<(), Violation> {
        for _ in 0..10_000 {
            if !self.flights.is_empty() {
                self.deliver(0)?;
            } else if let Some(j) = self.wakes.pop() {
                if matches!(
                    self.cands[j].state,
                    State::Waiting { .. } | State::Leader(_)
                ) {
                    self.step_cand(j)?;
                }
            } else if let Some(i) = self
                .cands
                .iter()
                .position(|c| matches!(c.state, State::Step | State::Resigning(_)))
            {
                self.step_cand(i)?;
            } else {
                break;
            }
        }
        let snap = self.snapshot();
        let waiting = super::queue(&snap);
        let holder = self.holders().first().map(|r| r.candidacy.session.clone());
        match holder {
            None if !waiting.is_empty() => Err(format!(
                "lost wake-up: the seat is free and {} waits",
                waiting[0].candidacy.session
            )),
            Some(h) => {
                let knows = self
                    .cands
                    .iter()
                    .any(|c| c.me.session == h && matches!(c.state, State::Leader(_)));
                if knows {
                    Ok(())
                } else {
                    Err(format!(
                        "lost wake-up: {h} holds the seat and does not know"
                    ))
                }
            }
            None => Ok(()),
        }
    }
}

/// The state the holder with `token` leaves when it resigns: some holders leave one
/// (its bytes name the token), the others none.
fn state_left_by(token: u64) -> Option<Vec<u8>> {
    (!token.is_multiple_of(3)).then(|| token.to_le_bytes().to_vec())
}

/// Runs `seeds` random histories in both modes; the first violation, with its seed.
fn explore(seeds: u64, steps: usize) -> Option<String> {
    let mut counts = [0u64; 6];
    for seed in 1..=seeds {
        for mode in [Mode::Watch, Mode::Notify] {
            let mut m = Model::new(seed * 7919, mode, 2 + (seed % 5) as usize);
            if let Err(v) = m.run(steps) {
                let mode = if mode == Mode::Watch {
                    "watch"
                } else {
                    "notify"
                };
                let tail = m.log[m.log.len().saturating_sub(25)..].join("\n  ");
                return Some(format!("seed {seed} ({mode}): {v}\n  {tail}"));
            }
            for (sum, n) in counts.iter_mut().zip(m.counts) {
                *sum += n;
            }
        }
    }
    let [grants, by_release, handovers, asks, crashes, lost] = counts;
    eprintln!(
        "{} histories: {grants} grants ({by_release} by a release), {handovers} handovers, \
         {asks} step-down asks, {crashes} crashes, {lost} answers lost",
        seeds * 2
    );
    None
}

#[test]
fn the_rules_keep_every_invariant() {
    broken::set(None);
    // ENGINE_SEEDS=N explores more (the suite runs 1,500 histories of each mode).
    let seeds = std::env::var("ENGINE_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok());
    if let Some(v) = explore(seeds.unwrap_or(1500), 400) {
        panic!("{v}");
    }
}

#[test]
fn each_broken_rule_is_caught() {
    let cases = [
        (Rule::IgnoreHolder, "two holders"),
        (Rule::ArrivalOnly, "waited"),
        (Rule::WaitOnHead, "woke"),
        (Rule::SilentRelease, "did not wake"),
        (Rule::DropLeft, "owed"),
    ];
    for (rule, expect) in cases {
        broken::set(Some(rule));
        let found = explore(1500, 400);
        broken::set(None);
        match found {
            Some(v) if v.contains(expect) => {}
            other => panic!("{rule:?}: expected a violation with {expect:?}, got {other:?}"),
        }
    }
}
