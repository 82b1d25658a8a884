//! The candidate/ordinary optimisation of the bully algorithm (Murshed 2012).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::config::Config;
use crate::machine::{earliest, outbox_outputs, Ballot, ElectionAlgorithm, Outbox, Timer, Watch};
use crate::message::Message;
use crate::types::{Event, Instant, Leader, PeerId};

/// Candidate/ordinary election: only candidates may lead.
///
/// A process that suspects the leader first waits its tie-break delay δ
/// ([`tie_break_delay`](Self::tie_break_delay)); if no announcement arrived
/// meanwhile it sends `Election` to every candidate except itself and the
/// suspected leader, collects `Alive` answers (until all asked have answered
/// or been reported unreachable, or `answer_timeout`), chooses the
/// highest-ranked live candidate (itself included, if it is one) and sends
/// `Elected` for it to every other process. Candidates that answered start an
/// election themselves if no announcement follows within `announce_timeout`.
///
/// δ is `tie_break_step × position`, where positions order the candidates
/// first (highest rank first), then the ordinary processes (highest rank
/// first): higher priority, smaller δ. With `tie_break_step` above the time an
/// election takes, the first process to start finishes before the next one's δ
/// runs out, so concurrent detections cost one election. Messages for one
/// election asking `c` candidates of which `a` answer: `c + a + (n − 1)`.
#[derive(Debug)]
pub struct CandidateOrdinary {
    config: Config,
    candidates: BTreeSet<PeerId>,
    out: Outbox,
    max_epoch: u64,
    suspected: Option<PeerId>,
    /// The election this process runs, while it collects answers.
    ballot: Option<Ballot>,
    delay_timer: Timer,
    answer_timer: Timer,
    watch: Watch,
}

impl CandidateOrdinary {
    /// A machine for `config` in which only `candidates` may lead. Candidates
    /// that are not members are ignored.
    pub fn new(config: Config, candidates: impl IntoIterator<Item = PeerId>) -> Self {
        let candidates = candidates
            .into_iter()
            .filter(|p| config.is_member(*p))
            .collect();
        CandidateOrdinary {
            config,
            candidates,
            out: Outbox::default(),
            max_epoch: 0,
            suspected: None,
            ballot: None,
            delay_timer: Timer::default(),
            answer_timer: Timer::default(),
            watch: Watch::default(),
        }
    }

    /// The processes that may lead.
    pub fn candidates(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.candidates.iter().copied()
    }

    /// Whether this process may lead.
    pub fn is_candidate(&self) -> bool {
        self.candidates.contains(&self.config.id())
    }

    /// This process's tie-break delay δ (see the type's documentation).
    pub fn tie_break_delay(&self) -> Duration {
        let me = self.config.id();
        let position = self
            .candidates
            .iter()
            .rev()
            .copied()
            .chain(
                self.config
                    .members()
                    .iter()
                    .rev()
                    .copied()
                    .filter(|p| !self.candidates.contains(p)),
            )
            .position(|p| p == me)
            .unwrap_or(0);
        let factor = u32::try_from(position).unwrap_or(u32::MAX);
        self.config.timing().tie_break_step.saturating_mul(factor)
    }

    fn next_epoch(&mut self) -> u64 {
        self.max_epoch = self.max_epoch.saturating_add(1);
        self.max_epoch
    }

    fn begin(&mut self, now: Instant) {
        if self.out.leader().is_some() || self.ballot.is_some() {
            return;
        }
        let epoch = self.next_epoch();
        let me = self.config.id();
        let suspected = self.suspected;
        let asked: BTreeSet<PeerId> = self
            .candidates
            .iter()
            .copied()
            .filter(|p| *p != me && Some(*p) != suspected)
            .collect();
        let ballot = Ballot::open(&mut self.out, epoch, asked);
        let complete = ballot.is_complete();
        self.ballot = Some(ballot);
        self.answer_timer
            .set(now + self.config.timing().answer_timeout);
        if complete {
            self.decide(now);
        }
    }

    fn decide(&mut self, now: Instant) {
        let Some(ballot) = self.ballot.take() else {
            return;
        };
        self.answer_timer.clear();
        let (epoch, mut alive) = ballot.close();
        let me = self.config.id();
        if self.is_candidate() {
            alive.insert(me);
        }
        let Some(winner) = alive.last().copied() else {
            // No candidate is alive: try again later, the suspected one included.
            self.suspected = None;
            self.delay_timer
                .set(now + self.config.timing().announce_timeout);
            return;
        };
        let targets: Vec<PeerId> = self.config.others().collect();
        for peer in targets {
            self.out.send(
                peer,
                Message::Elected {
                    leader: winner,
                    epoch,
                    alternatives: Vec::new(),
                },
            );
        }
        self.out.set_leader(Some(Leader { id: winner, epoch }));
    }
}

impl ElectionAlgorithm for CandidateOrdinary {
    fn config(&self) -> &Config {
        &self.config
    }

    fn handle_message(&mut self, now: Instant, from: PeerId, msg: Message) {
        if !self.config.is_other_member(from) {
            return;
        }
        match msg {
            Message::Election { epoch } => {
                self.max_epoch = self.max_epoch.max(epoch);
                if self.is_candidate() {
                    self.out.send(from, Message::Alive { epoch });
                    let settled = self.out.leader().is_some_and(|l| l.epoch >= epoch);
                    if !settled {
                        self.watch
                            .set(now + self.config.timing().announce_timeout, epoch);
                    }
                }
            }
            Message::Alive { epoch }
                if self.ballot.as_mut().is_some_and(|b| b.alive(epoch, from)) =>
            {
                self.decide(now);
            }
            Message::Elected { leader, epoch, .. } => {
                self.max_epoch = self.max_epoch.max(epoch);
                if !self.candidates.contains(&leader) {
                    return;
                }
                if let Some(view) = self.out.leader() {
                    if (epoch, leader) < (view.epoch, view.id) {
                        return;
                    }
                }
                self.ballot = None;
                self.delay_timer.clear();
                self.answer_timer.clear();
                self.watch.clear();
                self.suspected = None;
                self.out.set_leader(Some(Leader { id: leader, epoch }));
            }
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.delay_timer.fire(now) {
            self.begin(now);
        }
        if self.answer_timer.fire(now) {
            self.decide(now);
        }
        if self.watch.lapsed(now, self.out.leader()) {
            self.start_election(now);
        }
    }

    fn peer_unreachable(&mut self, now: Instant, peer: PeerId) {
        if self.ballot.as_mut().is_some_and(|b| b.unreachable(peer)) {
            self.decide(now);
        }
    }

    fn start_election(&mut self, now: Instant) {
        let me = self.config.id();
        if let Some(view) = self.out.leader() {
            if view.id != me {
                self.suspected = Some(view.id);
            }
        }
        self.out.set_leader(None);
        if self.ballot.is_some() || self.delay_timer.is_set() {
            return;
        }
        let delay = self.tie_break_delay();
        if delay.is_zero() {
            self.begin(now);
        } else {
            self.delay_timer.set(now + delay);
        }
    }

    outbox_outputs!(out);

    fn poll_timeout(&self) -> Option<Instant> {
        earliest([
            self.delay_timer.at(),
            self.answer_timer.at(),
            self.watch.at(),
        ])
    }
}
