//! What local sessions ask: keep-alives, campaigns, resignations, closing; preemption.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

use tenure_core::backend::{CampaignMode, SessionEvents};
use tenure_core::{Candidate, ElectionName, FencingToken, Result};
use tokio::sync::oneshot;
use tokio::time::Instant as TokioInstant;

use super::seat::{queue_position, wire_priority, CampaignReply, Holder, Waiter};
use super::{expired_error, Engine, COVERED_SHARE};
use crate::machine::ElectionAlgorithm;

pub(super) struct SessionEntry {
    pub(super) ttl: Duration,
    pub(super) events: SessionEvents,
    pub(super) expires_at: TokioInstant,
    pub(super) held: BTreeSet<ElectionName>,
    pub(super) keepalives: Vec<(TokioInstant, oneshot::Sender<Result<()>>)>,
}

impl Engine {
    pub(super) fn keep_alive(&mut self, session: u64, reply: oneshot::Sender<Result<()>>) {
        let now_t = TokioInstant::now();
        let now = self.clock.at(now_t);
        let Some(entry) = self.sessions.get_mut(&session) else {
            let _ = reply.send(Err(expired_error()));
            return;
        };
        entry.expires_at = now_t + entry.ttl;
        if entry.held.is_empty() {
            let _ = reply.send(Ok(()));
            return;
        }
        entry.keepalives.push((now_t, reply));
        let held: Vec<ElectionName> = entry.held.iter().cloned().collect();
        for name in held {
            if let Some(seat) = self.seats.get_mut(&name) {
                // One round trip to a majority, started now.
                seat.machine.renew_now(now);
            }
            self.settle(&name);
        }
        self.check_keepalives();
    }

    pub(super) fn campaign(
        &mut self,
        session: u64,
        election: ElectionName,
        candidate: Candidate,
        mode: CampaignMode,
        reply: CampaignReply,
    ) {
        if !self.sessions.contains_key(&session) {
            let _ = reply.send(Err(expired_error()));
            return;
        }
        if !self.ensure_seat(&election) {
            let _ = reply.send(Err(Engine::too_many()));
            return;
        }
        let me = self.me();
        let window = self.config.timing.answer_timeout * 3;
        let Some(seat) = self.seats.get_mut(&election) else {
            return;
        };
        if let Some(h) = &seat.holder {
            if h.session == session {
                let _ = reply.send(Ok(Some(FencingToken(h.token))));
                return;
            }
        }
        seat.waiters.retain(|w| w.session != session);
        let give_up_at = if mode == CampaignMode::Wait {
            None
        } else {
            let now = self.clock.now();
            let taken = seat.holder.is_some()
                || !seat.waiters.is_empty()
                || seat.machine.leader().is_some_and(|l| l.id != me)
                || seat.machine.rival_interest(now).is_some();
            if taken {
                let _ = reply.send(Ok(None));
                return;
            }
            Some(TokioInstant::now() + window)
        };
        let priority = wire_priority(&candidate);
        if let (Some(h), None) = (seat.holder.as_mut(), give_up_at) {
            if priority > wire_priority(&h.candidate) {
                preempt(&self.sessions, &election, h);
            }
        }
        let at = queue_position(seat.waiters.iter().map(|w| &w.candidate), priority);
        seat.waiters.insert(
            at,
            Waiter {
                session,
                candidate,
                reply,
                give_up_at,
            },
        );
        self.settle(&election);
    }

    pub(super) fn resign(
        &mut self,
        session: u64,
        election: &ElectionName,
        token: Option<FencingToken>,
    ) {
        let hold_off = self.config.hold_off;
        let Some(seat) = self.seats.get_mut(election) else {
            return;
        };
        if token.is_none() {
            seat.waiters.retain(|w| w.session != session);
        }
        let resigned = seat
            .holder
            .as_ref()
            .is_some_and(|h| h.session == session && token.is_none_or(|t| t.0 == h.token));
        if resigned {
            seat.holder = None;
            if seat.waiters.is_empty() {
                seat.hold_off_until = Some(TokioInstant::now() + hold_off);
            }
            if let Some(entry) = self.sessions.get_mut(&session) {
                entry.held.remove(election);
            }
        }
        self.settle(election);
    }

    /// Closes (`reason` None) or expires a session: its seats are freed and
    /// its waiters fail.
    pub(super) fn end_session(&mut self, session: u64, reason: Option<&str>) {
        let Some(entry) = self.sessions.remove(&session) else {
            return;
        };
        let mut touched: Vec<ElectionName> = entry.held.iter().cloned().collect();
        for (name, seat) in &mut self.seats {
            let before = seat.waiters.len();
            let mut kept = VecDeque::new();
            for w in seat.waiters.drain(..) {
                if w.session == session {
                    let _ = w.reply.send(Err(expired_error()));
                } else {
                    kept.push_back(w);
                }
            }
            seat.waiters = kept;
            if seat.waiters.len() != before {
                touched.push(name.clone());
            }
            if seat.holder.as_ref().is_some_and(|h| h.session == session) {
                seat.holder = None;
            }
        }
        for (_, reply) in entry.keepalives {
            let _ = reply.send(Err(expired_error()));
        }
        if let Some(reason) = reason {
            entry.events.expired(reason);
        }
        for name in touched {
            self.settle(&name);
        }
    }

    /// Answers keep-alives whose every held seat has renewed since they were
    /// sent.
    pub(super) fn check_keepalives(&mut self) {
        for entry in self.sessions.values_mut() {
            if entry.keepalives.is_empty() {
                continue;
            }
            let need = entry.ttl.mul_f64(COVERED_SHARE);
            let mut pending = Vec::new();
            for (sent, reply) in entry.keepalives.drain(..) {
                if reply.is_closed() {
                    continue;
                }
                let from = self.clock.at(sent) + need;
                let renewed = entry.held.iter().all(|name| {
                    self.seats.get(name).is_some_and(|s| {
                        s.holder.is_some() && s.machine.lease_expiry().is_some_and(|e| e >= from)
                    })
                });
                if renewed {
                    let _ = reply.send(Ok(()));
                } else {
                    pending.push((sent, reply));
                }
            }
            entry.keepalives = pending;
        }
    }
}

/// Tells the session of `h` that a higher priority joined (once per grant,
/// and not a holder that opted out): the core ends the grant and resigns.
pub(super) fn preempt(sessions: &HashMap<u64, SessionEntry>, name: &ElectionName, h: &mut Holder) {
    if h.preempted || !h.candidate.preemptible() {
        return;
    }
    h.preempted = true;
    tracing::debug!(election = %name, token = h.token, "a higher priority joined: the holder is preempted");
    if let Some(entry) = sessions.get(&h.session) {
        entry.events.preempted(name, FencingToken(h.token));
    }
}
