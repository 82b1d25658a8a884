//! Settling a seat after any input: flushing its machine, reconciling it with the sessions.

use std::time::Duration;

use tenure_core::{ElectionName, FencingToken};
use tokio::time::Instant as TokioInstant;

use super::handover::{broadcast_handover, PendingHandover};
use super::seat::{seat_envelope, wire_priority, Holder};
use super::session::preempt;
use super::{Engine, COVERED_SHARE};
use crate::machine::ElectionAlgorithm;
use crate::message::Message;
use crate::wire::Envelope;

impl Engine {
    /// After any input to the seat of `name`: send what its machine
    /// produced, hand the seat to a local waiter or take it back, follow the
    /// candidacy the local sessions want, publish, and re-arm its timer.
    pub(super) fn settle(&mut self, name: &ElectionName) {
        for _ in 0..16 {
            self.flush(name);
            if !self.reconcile(name) {
                break;
            }
        }
        self.flush(name);
        self.publish(name);
        self.reschedule(name);
        self.check_keepalives();
    }

    fn flush(&mut self, name: &ElectionName) {
        let Some(seat) = self.seats.get_mut(name) else {
            return;
        };
        if let Some(state) = self.state.as_mut() {
            // A promise is on disk before the acknowledgement carrying it
            // leaves.
            if let Err(e) = state.save(name, seat.machine.durable()) {
                tracing::error!(election = %name, error = %e, "could not save the promise; a restart of this node could acknowledge an epoch twice");
            }
        }
        for _ in 0..64 {
            let mut failed = Vec::new();
            while let Some((to, msg)) = seat.machine.poll_transmit() {
                if let (Message::QuorumRenew { epoch, .. }, Some(h)) = (&msg, &seat.holder) {
                    if *epoch == h.token {
                        // Renewals carry who holds the seat, for observers
                        // that joined late.
                        let _ = self.transport.send(to, seat_envelope(name, h));
                    }
                }
                tracing::trace!(election = %name, %to, ?msg, "sending");
                let envelope = Envelope::Routed {
                    channel: name.as_str().to_owned(),
                    msg,
                };
                if self.transport.send(to, envelope).is_err() {
                    failed.push(to);
                }
            }
            if failed.is_empty() {
                break;
            }
            let now = self.clock.now();
            for to in failed {
                seat.machine.forget_interest(now, to);
                seat.machine.peer_unreachable(now, to);
            }
        }
        while seat.machine.poll_event().is_some() {}
    }

    /// One step towards the state the local sessions want; true if the
    /// machine was given an input (so there is more to flush).
    fn reconcile(&mut self, name: &ElectionName) -> bool {
        let me = self.me();
        let now_t = TokioInstant::now();
        let now = self.clock.at(now_t);
        let Some(seat) = self.seats.get_mut(name) else {
            return false;
        };
        let leading = seat.machine.fencing_token();
        // The holder's grant ends with this node's leadership of its epoch.
        if let Some(h) = seat.holder.take_if(|h| leading != Some(h.token)) {
            tracing::debug!(election = %name, token = h.token, ?leading, "the grant ends with this node's leadership of its epoch");
            if let Some(entry) = self.sessions.get_mut(&h.session) {
                entry.held.remove(name);
                entry.events.election_lost(
                    name,
                    FencingToken(h.token),
                    "this node lost its quorum leadership",
                );
            }
        }
        {
            let sessions = &self.sessions;
            seat.waiters
                .retain(|w| !w.reply.is_closed() && sessions.contains_key(&w.session));
        }
        // A handover is used up once another node leads in a later epoch
        // (on the node it names: by the grant below), or lapses.
        let used_up = seat.handover.as_ref().is_some_and(|h| {
            h.until <= now_t
                || seat
                    .machine
                    .leader()
                    .is_some_and(|l| l.epoch > h.epoch && (l.id != me || h.node != Some(me)))
        });
        if used_up {
            seat.handover = None;
        }
        // Clause 14: tell the other members the best priority waiting here;
        // preempt the holder, once, when a higher priority joins on another
        // node: the best priority announced there rises above the holder's
        // (a join here preempts in `campaign`). A waiter that was there at
        // the grant (one passed over by a handover) does not.
        let interest = seat.interest();
        seat.machine.set_interest(now, interest);
        let best_rival = seat.machine.best_rival(now);
        let rival = best_rival.map(|(p, _)| p);
        if let Some(h) = seat.holder.as_mut() {
            let joined = rival > h.rival_floor;
            h.rival_floor = h.rival_floor.min(rival);
            let above = best_rival.filter(|(p, _)| *p > wire_priority(&h.candidate));
            if let (true, Some((_, node))) = (joined, above) {
                if !h.preempted && h.candidate.preemptible() {
                    // The other nodes may not have heard of the newcomer
                    // yet when this node's release reaches them: name its
                    // node to them first (as a handover does).
                    let others = self.config.members.keys().copied().filter(|p| *p != me);
                    broadcast_handover(&self.transport, others, name, h.token, Some(node), None);
                    seat.handover = Some(PendingHandover {
                        epoch: h.token,
                        node: Some(node),
                        to: None,
                        since: now,
                        until: now_t + self.config.timing.lease * 2,
                    });
                }
                preempt(&self.sessions, name, h);
            }
        }
        // Without a holder here, local waiters stand back while a higher
        // priority waits elsewhere, or while a handover names another node
        // that still has waiters; a handover naming this node (for a waiter
        // still here) puts it ahead of any priority.
        let best_here = seat
            .waiters
            .iter()
            .map(|w| wire_priority(&w.candidate))
            .max();
        let since = seat.handover.as_ref().map_or(now, |h| h.since);
        let named = seat
            .handover
            .as_ref()
            .and_then(|h| h.node.map(|n| (n, h.to.clone())));
        let deferring = match named {
            Some((node, to)) if node == me => {
                let here = to.is_none_or(|id| seat.waiters.iter().any(|w| w.candidate.id() == id));
                !here && rival.is_some_and(|r| best_here.is_none_or(|b| r > b))
            }
            Some((node, _)) if !seat.machine.withdrew_since(node, since) => true,
            _ => rival.is_some_and(|r| best_here.is_none_or(|b| r > b)),
        };
        let outranked = seat.holder.is_none() && !seat.waiters.is_empty() && deferring;
        if let (None, Some(epoch), false) = (&seat.holder, leading, outranked) {
            if seat.granted == Some(epoch) || seat.waiters.is_empty() {
                // That grant ended, or nobody here wants the seat: give the
                // epoch up; with waiters left, a campaign for a higher one
                // follows at once.
                seat.machine.relinquish(now);
                return true;
            }
            // A handover to a waiter here: it goes first.
            let preferred = seat
                .handover
                .as_ref()
                .filter(|h| h.node == Some(me))
                .and_then(|h| h.to.as_deref())
                .and_then(|id| seat.waiters.iter().position(|w| w.candidate.id() == id));
            if let Some(w) = preferred.and_then(|at| seat.waiters.remove(at)) {
                seat.waiters.push_front(w);
            }
            let expiry = seat.machine.lease_expiry();
            while let Some(w) = seat.waiters.pop_front() {
                let ttl = self
                    .sessions
                    .get(&w.session)
                    .map_or(Duration::ZERO, |s| s.ttl);
                // The core keeps the grant valid until at most a renewal's
                // send time plus COVERED_SHARE × TTL: the lease must last
                // that long, or wait for the next renewal round.
                let covered = expiry.is_some_and(|e| e >= now + ttl.mul_f64(COVERED_SHARE));
                if !covered {
                    seat.waiters.push_front(w);
                    break;
                }
                let token = FencingToken(epoch);
                tracing::debug!(election = %name, epoch, ?expiry, "granting the seat");
                if w.reply.send(Ok(Some(token))).is_ok() {
                    for peer in self.config.members.keys().filter(|p| **p != me) {
                        let h = Holder {
                            session: w.session,
                            candidate: w.candidate.clone(),
                            token: epoch,
                            preempted: false,
                            rival_floor: rival,
                        };
                        let _ = self.transport.send(*peer, seat_envelope(name, &h));
                    }
                    if let Some(entry) = self.sessions.get_mut(&w.session) {
                        entry.held.insert(name.clone());
                    }
                    seat.holder = Some(Holder {
                        session: w.session,
                        candidate: w.candidate,
                        token: epoch,
                        preempted: false,
                        rival_floor: rival,
                    });
                    seat.granted = Some(epoch);
                    seat.hold_off_until = None;
                    // The handover, if any, is used up by this grant.
                    seat.handover = None;
                    break;
                }
            }
        }
        let wanted = seat.holder.is_some() || (!seat.waiters.is_empty() && !outranked);
        if wanted && !seat.machine.is_candidate() {
            let other_leads = seat.machine.leader().is_some_and(|l| l.id != me);
            let held_off = seat.hold_off_until.is_some_and(|t| now_t < t)
                && seat.machine.known_candidates().next().is_some()
                && !other_leads;
            if !held_off {
                seat.hold_off_until = None;
                seat.machine.set_candidate(now, true);
                return true;
            }
        } else if !wanted && seat.machine.is_candidate() {
            seat.machine.set_candidate(now, false);
            return true;
        }
        false
    }
}
