//! The invitation algorithm (Garcia-Molina 1982).

use std::collections::BTreeSet;
use std::time::Duration;

use crate::config::Config;
use crate::machine::{outbox_outputs, ElectionAlgorithm, Outbox, Timer};
use crate::message::Message;
use crate::types::{Event, Instant, Leader, PeerId};

/// Invitation election: groups merge, and every group has its own leader.
///
/// Every process starts as the leader of a group holding only itself. A
/// leader whose group is incomplete invites one outsider at a time: first
/// after `tie_break_step × (1 + position)` (position in ascending rank order,
/// so lower ranks invite first), then every `invite_interval`, each time the
/// next process after the previous one in ring order that is not in its
/// group.
///
/// * An invited leader compares the groups: the larger one wins, and on equal
///   sizes the lower rank (as in figure 10-4, where 1 ends up leading). If the
///   inviter wins, the invited leader answers `Accept` with its member list
///   and follows the inviter; otherwise it sends a counter-`Invite`, which the
///   other side then accepts.
/// * An invited member answers `Redirect` with its leader, so the two leaders
///   talk directly; a member invited by its own leader re-`Accept`s.
/// * On `Accept`, the winner tells only the joining group's other members of
///   their new leader (`Elected`); its own members are not told.
///
/// Several leaders coexist by design until the groups have merged. Merging
/// two groups costs `Invite + Accept + (size of the smaller group − 1)`
/// messages (one more `Invite` when the invited side wins, one more `Redirect`
/// and `Invite` when a member was invited).
#[derive(Debug)]
pub struct Invitation {
    config: Config,
    out: Outbox,
    group_leader: PeerId,
    /// The group when leading (this process included).
    members: BTreeSet<PeerId>,
    epoch: u64,
    max_epoch: u64,
    cursor: PeerId,
    invite_timer: Timer,
}

impl Invitation {
    /// An invitation machine for `config`.
    pub fn new(config: Config) -> Self {
        let me = config.id();
        Invitation {
            config,
            out: Outbox::default(),
            group_leader: me,
            members: BTreeSet::from([me]),
            epoch: 0,
            max_epoch: 0,
            cursor: me,
            invite_timer: Timer::default(),
        }
    }

    /// Whether this process leads its group.
    pub fn is_group_leader(&self) -> bool {
        self.group_leader == self.config.id()
    }

    /// The group this process leads (only itself when it follows another).
    pub fn group(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.members.iter().copied()
    }

    fn first_invite_delay(&self) -> Duration {
        let position = self.config.position(self.config.id()).unwrap_or(0);
        let factor = u32::try_from(position.saturating_add(1)).unwrap_or(u32::MAX);
        self.config.timing().tie_break_step.saturating_mul(factor)
    }

    fn complete(&self) -> bool {
        self.members.len() >= self.config.members().len()
    }

    fn lead_alone(&mut self, now: Instant) {
        let me = self.config.id();
        self.group_leader = me;
        self.members = BTreeSet::from([me]);
        self.cursor = me;
        self.max_epoch = self.max_epoch.saturating_add(1);
        self.epoch = self.max_epoch;
        self.out.set_leader(Some(Leader {
            id: me,
            epoch: self.epoch,
        }));
        if self.complete() {
            self.invite_timer.clear();
        } else {
            self.invite_timer.set(now + self.first_invite_delay());
        }
    }

    fn follow(&mut self, leader: PeerId, epoch: u64) {
        let me = self.config.id();
        self.group_leader = leader;
        self.members = BTreeSet::from([me]);
        self.epoch = epoch;
        self.max_epoch = self.max_epoch.max(epoch);
        self.invite_timer.clear();
        self.out.set_leader(Some(Leader { id: leader, epoch }));
    }

    /// The next outsider after the cursor in ring order.
    fn next_outsider(&self) -> Option<PeerId> {
        let ring = self.config.members();
        let start = ring.iter().position(|p| *p > self.cursor).unwrap_or(0);
        ring.iter()
            .cycle()
            .skip(start)
            .take(ring.len())
            .copied()
            .find(|p| !self.members.contains(p))
    }

    fn invite(&mut self, peer: PeerId) {
        let group_size = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
        self.out.send(
            peer,
            Message::Invite {
                epoch: self.epoch,
                group_size,
            },
        );
    }

    fn invite_round(&mut self, now: Instant) {
        if !self.is_group_leader() || self.complete() {
            self.invite_timer.clear();
            return;
        }
        if let Some(peer) = self.next_outsider() {
            self.cursor = peer;
            self.invite(peer);
        }
        self.invite_timer
            .set(now + self.config.timing().invite_interval);
    }

    fn on_invite(&mut self, from: PeerId, epoch: u64, group_size: u32) {
        let me = self.config.id();
        self.max_epoch = self.max_epoch.max(epoch);
        if !self.is_group_leader() {
            if self.group_leader == from {
                self.out.send(
                    from,
                    Message::Accept {
                        epoch: self.epoch,
                        members: vec![me],
                    },
                );
            } else {
                self.out.send(
                    from,
                    Message::Redirect {
                        leader: self.group_leader,
                    },
                );
            }
            return;
        }
        // The inviter leads its own group now, so it has left this one.
        self.members.remove(&from);
        let mine = self.members.len();
        let theirs = usize::try_from(group_size).unwrap_or(usize::MAX);
        let inviter_wins = theirs > mine || (theirs == mine && from < me);
        if inviter_wins {
            let members: Vec<PeerId> = self.members.iter().copied().collect();
            self.out.send(
                from,
                Message::Accept {
                    epoch: self.epoch,
                    members,
                },
            );
            let merged = self.epoch.max(epoch).saturating_add(1);
            self.follow(from, merged);
        } else {
            self.invite(from);
        }
    }

    fn on_accept(&mut self, from: PeerId, epoch: u64, joined: Vec<PeerId>) {
        let me = self.config.id();
        self.max_epoch = self.max_epoch.max(epoch);
        let joined: Vec<PeerId> = joined
            .into_iter()
            .filter(|p| self.config.is_member(*p) && *p != me)
            .collect();
        if !self.is_group_leader() {
            // Joined another group meanwhile: send the newcomers there.
            for peer in joined {
                self.out.send(
                    peer,
                    Message::Elected {
                        leader: self.group_leader,
                        epoch: self.epoch,
                        alternatives: Vec::new(),
                    },
                );
            }
            return;
        }
        let newcomers: Vec<PeerId> = joined
            .iter()
            .copied()
            .filter(|p| !self.members.contains(p))
            .collect();
        if newcomers.is_empty() {
            return;
        }
        self.epoch = self.epoch.max(epoch).saturating_add(1);
        self.max_epoch = self.max_epoch.max(self.epoch);
        // `from` led the joining group: it knows its new leader.
        self.welcome(&newcomers, Some(from));
    }

    /// Takes `newcomers` into the group at the current epoch: tells each but
    /// `knows` that this process leads, and takes the new epoch itself.
    fn welcome(&mut self, newcomers: &[PeerId], knows: Option<PeerId>) {
        let me = self.config.id();
        for peer in newcomers {
            self.members.insert(*peer);
            if Some(*peer) != knows {
                self.out.send(
                    *peer,
                    Message::Elected {
                        leader: me,
                        epoch: self.epoch,
                        alternatives: Vec::new(),
                    },
                );
            }
        }
        self.out.set_leader(Some(Leader {
            id: me,
            epoch: self.epoch,
        }));
        if self.complete() {
            self.invite_timer.clear();
        }
    }
}

impl ElectionAlgorithm for Invitation {
    fn config(&self) -> &Config {
        &self.config
    }

    fn start(&mut self, now: Instant) {
        self.lead_alone(now);
    }

    fn handle_message(&mut self, _now: Instant, from: PeerId, msg: Message) {
        if !self.config.is_other_member(from) {
            return;
        }
        let me = self.config.id();
        match msg {
            Message::Invite { epoch, group_size } => self.on_invite(from, epoch, group_size),
            Message::Accept { epoch, members } => self.on_accept(from, epoch, members),
            Message::Redirect { leader }
                if self.is_group_leader()
                    && self.config.is_member(leader)
                    && !self.members.contains(&leader) =>
            {
                self.invite(leader);
            }
            Message::Redirect { leader }
                if self.is_group_leader()
                    && leader != from
                    && self.members.contains(&leader)
                    && !self.members.contains(&from) =>
            {
                // `from` still follows a leader that has joined this group
                // (the news missed it): take it in directly, with an epoch
                // above anything this process has seen.
                self.epoch = self.max_epoch.max(self.epoch).saturating_add(1);
                self.max_epoch = self.epoch;
                self.welcome(&[from], None);
            }
            Message::Elected { leader, epoch, .. } => {
                self.max_epoch = self.max_epoch.max(epoch);
                if !self.config.is_member(leader) || leader == me {
                    return;
                }
                // This process's own leader telling where its group went is
                // authoritative whatever the epochs: it may have joined the
                // other group at a lower epoch than the one this process
                // took when it joined it.
                let from_own_leader = !self.is_group_leader() && from == self.group_leader;
                if epoch < self.epoch && !from_own_leader {
                    return;
                }
                self.follow(leader, epoch.max(self.epoch));
            }
            _ => {}
        }
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.invite_timer.fire(now) {
            self.invite_round(now);
        }
    }

    fn peer_unreachable(&mut self, _now: Instant, _peer: PeerId) {
        // The next round invites the next outsider anyway.
    }

    fn start_election(&mut self, now: Instant) {
        if self.is_group_leader() {
            self.invite_round(now);
        } else {
            self.lead_alone(now);
        }
    }

    fn leader_conflict(&mut self, _now: Instant, other: PeerId) {
        if self.is_group_leader() && !self.members.contains(&other) && self.config.is_member(other)
        {
            self.invite(other);
        }
    }

    outbox_outputs!(out);

    fn poll_timeout(&self) -> Option<Instant> {
        self.invite_timer.at()
    }
}
