//! The controller's campaigns and grants: campaigns and batches of tries for free
//! shards, their answers, the ends of grants (reported as `Lost` or `HandedOff`),
//! and the claims on shards lost to the store while the session is re-opened.

use std::cmp::Reverse;

use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, LossReason};
use tokio::time::Instant;

use super::controller::{Controller, Held, Internal};
use super::{lock, ShardEvent};
use crate::assign::Plan;
use crate::state::View;

/// Free shards asked for in one `try_campaign_many` (the session splits it further into
/// the backend's own batch size).
const TRY_BATCH: usize = 1024;

impl Controller {
    pub(super) fn handle(&mut self, msg: Internal) {
        match &msg {
            Internal::Started(s) | Internal::Granted(s, _) | Internal::Lost(s, ..) => {
                self.dirty.mark(*s)
            }
            Internal::Tried(shards, ..) => shards.iter().for_each(|s| self.dirty.mark(*s)),
            Internal::Rebalanced(..) => {}
        }
        match msg {
            Internal::Rebalanced(key, moves, took) => {
                self.rebalancing = false;
                self.next_rebalance_at = Instant::now() + took;
                // Moves for other members are dropped. Figures that changed meanwhile
                // make them a little stale, but they are asked for (each is checked
                // then) while the next rebalance is worked out for the new figures: at
                // 10^6 shards some figure changes during every rebalance.
                let same_members = key.1 == self.view.nodes;
                tracing::debug!(
                    moves = moves.len(),
                    same_members,
                    same_figures = key.0 == self.view.figures_epoch,
                    took_ms = took.as_millis() as u64,
                    "rebalance worked out"
                );
                if same_members {
                    self.to_issue = moves
                        .into_iter()
                        .filter_map(|(s, n)| key.1.get(n as usize).map(|m| (s, m.id.clone())))
                        .collect();
                    self.to_issue_for = Some(key);
                }
                self.balance_due = true;
            }
            Internal::Tried(shards, answers, generation) => {
                self.trying_in_flight = self.trying_in_flight.saturating_sub(shards.len());
                for &s in &shards {
                    self.trying.set(s, false);
                }
                match answers {
                    // Granted seats count as grants. The others were taken after all
                    // (the view was behind): queue for them now, rather than try
                    // again while the view still says they are free. The next look
                    // withdraws the campaign if the shard is no longer this node's.
                    Ok(answers) => {
                        for (s, answer) in shards.into_iter().zip(answers) {
                            match answer {
                                Some(leadership) => {
                                    self.handle(Internal::Granted(s, Ok(leadership)))
                                }
                                None if !self.held.contains_key(&s) => {
                                    // Taken: this node's claim on it (if it lost it to
                                    // the store) is over.
                                    self.end_claim(s);
                                    self.start_campaign(s)
                                }
                                None => {}
                            }
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::SessionExpired => {
                        // Sent through the session the store had just ended (the
                        // losses arrive before the re-open): no back-off, the batch goes
                        // again through the re-opened session, at once if that is open
                        // already, else as soon as it is (`after_reopen`).
                        tracing::debug!(shards = shards.len(), "a batch of tries met the ended session; trying again after the re-open");
                        if self.session.generation() != generation {
                            shards.into_iter().for_each(|s| self.dirty.mark(s));
                        } else {
                            self.after_reopen_try.extend(shards);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(shards = shards.len(), error = %e, "a batch of campaigns failed");
                        for s in shards {
                            self.campaign_failed(s);
                        }
                    }
                }
            }
            Internal::Started(s) => {
                if self.campaigning.contains_key(&s) {
                    self.set_campaigning(s, true);
                }
            }
            Internal::Granted(s, Ok(leadership)) => {
                // A second campaign for the same shard (started after the first was
                // withdrawn too late to stop its grant) can only fail now.
                if let Some(t) = self.campaigning.remove(&s) {
                    t.abort();
                }
                self.set_campaigning(s, false);
                self.failures.remove(&s);
                // Its loss arrives through the session's loss feed (no task per shard).
                let watch = leadership.watch();
                let token = leadership.token();
                if let Some(old) = self.held.get(&s) {
                    // A grant of the same shard still held with an older token: its
                    // seat is gone (tokens only grow); end it first.
                    let old = old.watch.token();
                    self.end_grant(
                        s,
                        old,
                        LossReason::Revoked("granted again".into()),
                        Instant::now(),
                    );
                }
                let work = leadership.work_guard();
                if let Some(hook) = &self.before_handoff {
                    // The hook is one more holder of the work: a handoff waits for it.
                    let hook = hook.clone();
                    let (shard, guard) = (self.layout.shards[s].clone(), leadership.work_guard());
                    let stop = leadership.stepping_down();
                    tokio::spawn(async move {
                        stop.cancelled().await;
                        // Only a planned transition waits for the hook; a loss does not.
                        if guard.step_down_reason().is_some() {
                            hook(&shard, token).await;
                        }
                        drop(guard);
                    });
                }
                let event = ShardEvent::Acquired {
                    shard: self.layout.shards[s].clone(),
                    token,
                    lost: leadership.lost(),
                    stop: leadership.stepping_down(),
                    work,
                    at: leadership.granted_at(),
                };
                let ended = leadership.loss_reason().zip(leadership.lost_at());
                lock(&self.held_watches).insert(s, watch.clone());
                self.claims.remove(&s);
                self.set_held(s, true);
                // A new leader starts from the last figure published for the shard.
                let last = self.view.loads.get(s);
                self.set_load(s, last);
                self.held.insert(
                    s,
                    Held {
                        watch,
                        leadership: Some(leadership),
                        handing_off: None,
                    },
                );
                tracing::debug!(shard = s, %token, "acquired");
                let _ = self.events.send(event);
                // Lost before it was registered here (its loss may have been read from
                // the session's feed first, and passed over): end it now, so that it
                // is not kept and published as held.
                if let Some((reason, at)) = ended {
                    self.end_grant(s, token, reason, at);
                }
            }
            Internal::Granted(s, Err(e)) => {
                if self.held.contains_key(&s) {
                    tracing::debug!(shard = s, error = %e, "a second campaign for a held shard ended");
                } else {
                    tracing::warn!(shard = s, error = %e, "campaign failed");
                }
                self.campaign_failed(s);
            }
            Internal::Lost(s, token, reason, at) => self.end_grant(s, token, reason, at),
        }
    }

    /// The grant `token` of shard `s` ended (at `at`): forget it and report its end
    /// once, as `HandedOff` if this node was handing it off, else as `Lost`. A report
    /// of a grant not held (an older one, or one already ended) is dropped.
    fn end_grant(&mut self, s: usize, token: FencingToken, reason: LossReason, at: Instant) {
        if self.held.get(&s).is_none_or(|h| h.watch.token() != token) {
            return;
        }
        let Some(held) = self.held.remove(&s) else {
            return;
        };
        if held.handing_off.is_none()
            && matches!(reason, LossReason::SessionExpired | LossReason::Revoked(_))
            && !self.draining
            && !self.member_grace.is_zero()
        {
            // The store ended this node's seat (or its whole session); the node
            // re-opens the session if need be and asks for the shard again at once. Until it has it again
            // (or finds it taken, or the member grace passes), its published state
            // still claims the shard, so that every node's plan keeps it here, as the
            // plan keeps a vanished member's shards for the grace: dropping the claim
            // had the plans give the shards whose best-ranked replica is another node
            // to that node, and 16 of 384 shards moved when etcd revoked 3 nodes' leases.
            self.claims.insert(s, Instant::now() + self.member_grace);
        } else {
            self.claims.remove(&s);
            self.set_held(s, false);
        }
        self.set_load(s, 0);
        self.misplaced.set(s, false);
        self.dirty.mark(s);
        lock(&self.held_watches).remove(&s);
        let shard = self.layout.shards[s].clone();
        let event = match held.handing_off {
            Some(to) => {
                tracing::debug!(shard = s, %token, to = ?to, "handed off");
                ShardEvent::HandedOff {
                    shard,
                    token,
                    to,
                    at,
                }
            }
            None => {
                tracing::info!(shard = s, %token, %reason, "leadership lost");
                ShardEvent::Lost {
                    shard,
                    token,
                    reason,
                    at,
                }
            }
        };
        let _ = self.events.send(event);
    }

    /// A campaign for shard `s` ended in an error: unless the shard is held after all,
    /// try again after the retry policy's delay for its attempts so far.
    fn campaign_failed(&mut self, s: usize) {
        self.campaigning.remove(&s);
        self.set_campaigning(s, false);
        if self.held.contains_key(&s) {
            return;
        }
        let (attempt, _) = self
            .failures
            .get(&s)
            .copied()
            .unwrap_or((0, Instant::now()));
        let at = Instant::now() + self.session.timing().retry.delay(attempt);
        self.failures.insert(s, (attempt.saturating_add(1), at));
        self.retries.push(Reverse((at, s)));
        self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
    }

    pub(super) fn start_campaign(&mut self, s: usize) {
        let session = self.session.clone();
        let election = self.layout.elections[s].clone();
        let candidate = self.candidate.clone();
        let tx = self.internal_tx.clone();
        let permits = self.permits.clone();
        let task = tokio::spawn(async move {
            let Ok(_permit) = permits.acquire_owned().await else {
                return;
            };
            let _ = tx.send(Internal::Started(s));
            let r = session.campaign(&election, &candidate).await;
            let _ = tx.send(Internal::Granted(s, r));
        });
        self.campaigning.insert(s, task);
    }

    /// Ask for the shards gathered in `to_try` in batches, each batch one task holding
    /// a campaign permit per seat (a batch is at most the limit): the session sends a batch in
    /// as few store round trips as the backend allows (`Session::try_campaign_many`).
    /// A batch counts its seats against the limit so that a node taking 10,000 free
    /// shards keeps one batch in flight rather than ten; with one permit per batch,
    /// ten nodes of 100,000 shards on Redis queued a hundred scripts ahead of their
    /// own renewals, which timed out, and the sessions expired.
    ///
    /// Batches leave `to_try` only while at most two limits' worth of seats are out
    /// (one in flight, one waiting for its permits), and each shard is checked against
    /// the current plan and view as its batch is made: a node that saw only itself
    /// for a moment at start queues every shard, and sending them all at once had it
    /// take 600,000 of 1,000,000 shards after the plan had given it 100,000, then hand
    /// 500,000 back at its handoff rate (a 23–29 s cold start instead of 5).
    pub(super) fn try_free_shards(&mut self, view: &View, plan: &Plan, now: Instant) {
        let size = TRY_BATCH.min(self.permit_count).max(1);
        while self.trying_in_flight < 2 * self.permit_count.max(1) && !self.to_try.is_empty() {
            let mut shards = Vec::with_capacity(size);
            while shards.len() < size {
                let Some(s) = self.to_try.pop_front() else {
                    break;
                };
                let still =
                    self.is_mine(s, plan) && !self.held.contains_key(&s) && self.free_in(view, s);
                if still {
                    shards.push(s);
                } else {
                    // No longer a free shard of this node's: look again (it may be
                    // this node's and taken, to queue for, or nobody's business here).
                    self.trying.set(s, false);
                    self.examine(s, view, plan, now);
                }
            }
            if shards.is_empty() {
                continue;
            }
            self.trying_in_flight += shards.len();
            let seats: Vec<(ElectionName, Candidate)> = shards
                .iter()
                .map(|&s| (self.layout.elections[s].clone(), self.candidate.clone()))
                .collect();
            let session = self.session.clone();
            let tx = self.internal_tx.clone();
            let permits = self.permits.clone();
            let count = u32::try_from(shards.len()).unwrap_or(1);
            tokio::spawn(async move {
                let Ok(_permit) = permits.acquire_many_owned(count).await else {
                    return;
                };
                let generation = session.generation();
                let answers = session.try_campaign_many(&seats).await;
                let _ = tx.send(Internal::Tried(shards, answers, generation));
            });
        }
    }

    /// After the session was re-opened (the store had expired or revoked it): the
    /// campaigns that failed on the old session are tried again now, not at their
    /// back-off, and as tries for free shards where the view has them free (a batch
    /// of tries sent through the revoked session failed as a whole).
    pub(super) fn after_reopen(&mut self) {
        let generation = self.session.generation();
        if generation == self.generation {
            return;
        }
        self.generation = generation;
        let failed: Vec<usize> = self.failures.keys().copied().collect();
        tracing::info!(
            retried = failed.len(),
            "session re-opened; campaigning again for this node's shards"
        );
        for s in failed {
            self.failures.remove(&s);
            self.dirty.mark(s);
        }
        for s in std::mem::take(&mut self.after_reopen_try) {
            self.dirty.mark(s);
        }
    }

    /// This node no longer claims shard `s` it lost to the store (see `end_grant`):
    /// unless it holds it again, it is published as not held.
    pub(super) fn end_claim(&mut self, s: usize) {
        if self.claims.remove(&s).is_some() && !self.held.contains_key(&s) {
            self.set_held(s, false);
            self.dirty.mark(s);
        }
    }

    /// End the claims whose member grace has passed.
    pub(super) fn end_claims_due(&mut self) {
        let now = Instant::now();
        let due: Vec<usize> = self
            .claims
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(s, _)| *s)
            .collect();
        if !due.is_empty() {
            tracing::info!(
                shards = due.len(),
                "shards lost to the store not led again within the member grace; no longer claimed"
            );
        }
        due.into_iter().for_each(|s| self.end_claim(s));
    }
}
