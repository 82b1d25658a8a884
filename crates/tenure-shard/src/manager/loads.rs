//! The controller's side of balance by load: load reports and their publication, and,
//! on the balancer, the moves worked out and asked for.

use std::sync::Arc;

use tokio::time::Instant;

use super::controller::{Controller, Internal};
use super::{lock, ASKED_KEPT};
use crate::assign::Plan;
use crate::balance;
use crate::state::View;
use crate::view::plan_by_load_with;

impl Controller {
    /// Publish `code` as shard `s`'s load (0: none).
    pub(super) fn set_load(&mut self, s: usize, code: u8) {
        if self.mine.set_load(s, code) {
            self.mine_changed = true;
        }
        if code == 0 {
            self.pending_loads.remove(&s);
        }
    }

    /// A load report for shard `s`: kept until the next publication of loads, at
    /// most one per `load_interval`.
    pub(super) fn report(&mut self, s: usize, load: f64) {
        if !self.held.contains_key(&s) {
            tracing::trace!(
                shard = s,
                load,
                "load report for a shard not led here; dropped"
            );
            return;
        }
        self.pending_loads.insert(s, load);
        if self.load_flush_at.is_none() {
            self.load_flush_at = Some((self.last_flush + self.load_interval).max(Instant::now()));
        }
    }

    /// Publish the pending load reports if it is time: each only if it moved out of
    /// the deadband around the published figure.
    pub(super) fn flush_loads(&mut self, now: Instant) {
        if self.load_flush_at.is_none_or(|at| at > now) {
            return;
        }
        self.load_flush_at = None;
        self.last_flush = now;
        let pending: Vec<(usize, f64)> = self.pending_loads.drain().collect();
        for (s, load) in pending {
            if !self.held.contains_key(&s) {
                continue;
            }
            if let Some(code) = balance::republish(self.mine.load(s), load, balance::DEADBAND) {
                self.set_load(s, code);
            }
        }
    }

    /// As the balancer (the first active node of the view, balancing by load): drop
    /// the moves done, impossible or stale, and ask for the moves that bring the nodes
    /// back within the tolerance, as far as the window's budget allows. Any other
    /// node withdraws moves it asked for while it was the balancer.
    pub(super) fn balance_step(&mut self, view: &Arc<View>, plan: &Arc<Plan>, now: Instant) {
        self.balance_due = false;
        let Some(policy) = self.balance.clone() else {
            return;
        };
        let balancer = view
            .nodes
            .iter()
            .position(|n| !n.draining && n.weight > 0)
            .map(|b| b as u32);
        let levels_known = view.loads.reported > 0;
        if self.draining || balancer.is_none() || balancer != self.me || !levels_known {
            self.to_issue.clear();
            self.to_issue_for = None;
            self.balancing = 0;
            if !self.my_moves.is_empty() {
                self.my_moves.clear();
                self.publish_moves();
            }
            return;
        }
        // A move is dropped when it was not made within two TTLs and a window while
        // none was: moves are made as fast as the cluster can, which at 10^6 shards
        // on this machine is a hundred or so a second, and dropping them for being
        // slow only cancelled them in flight.
        let stale = self.session.timing().ttl * 2 + policy.window;
        let before = self.my_moves.len();
        let made = self.my_moves.iter().any(|(&s, (to, _))| {
            view.index_of(to)
                .is_some_and(|n| view.holders.get(s) == Some(n))
        });
        if made {
            self.moves_progressed_at = now;
        }
        let progressed = self.moves_progressed_at;
        let mut expired = false;
        self.my_moves.retain(|&s, (to, at)| {
            let due = view
                .index_of(to)
                .is_some_and(|n| view.holders.get(s) != Some(n) && plan.replicas(s).contains(&n));
            let late = now >= (*at).max(progressed) + stale;
            expired |= due && late;
            due && !late
        });
        let mut changed = self.my_moves.len() != before;
        // A rebalance is worked out once for the same figures and members: carried
        // out, its result is its own fixpoint. It is worked out again when the leaders
        // may not be where it left them: a move was not made, or shards went without
        // a leader (placed anew by the plan) since it was; the latter once all of its
        // moves are done, as handoffs leave shards leaderless for a moment.
        let vacant = view.leads.iter().sum::<usize>() < self.layout.shards.len();
        self.vacancy_seen |= vacant;
        let done = self.to_issue.is_empty() && self.my_moves.is_empty() && !self.rebalancing;
        if expired || (self.vacancy_seen && !vacant && done) {
            tracing::debug!(expired, "rebalancing again: leaders may have moved");
            self.vacancy_seen = false;
            self.to_issue_for = None;
        }
        while self
            .issued
            .front()
            .is_some_and(|t| *t + policy.window <= now)
        {
            self.issued.pop_front();
        }
        // Nodes publish their figures up to a load interval apart: a rebalance waits
        // until the figures have held still that long, so that a shift is acted on
        // once, whole. Among many shards some figure may always be changing, so where
        // few have (at most a tenth of the shards: a trickle or a shift, not a cold
        // start whose figures come in for seconds) it waits no longer than two
        // intervals after the first change since the last one began.
        let still_at = self.figures_changed_at + self.load_interval;
        let trickle = self.figures_pending <= (self.layout.shards.len() / 10).max(1);
        let ready_at = match self.figures_pending_since {
            Some(t) if trickle => still_at.min(t + self.load_interval * 2),
            _ => still_at,
        };
        let ready = now >= ready_at;
        // The whole rebalance is worked out once for the figures and members it saw,
        // and its moves are asked for as the budget allows. Working it out again after
        // each budget's worth moved went back and forth: a partial rebalance is not
        // on the way to the whole one (on Redis, 200 shards at 5 moves a second,
        // max/mean swung between 1.57 and 1.61 for 30 s).
        // It runs on the blocking pool (0.2 s at 10^5 shards on 10 nodes, 3.5 s at
        // 10^6, 23 s at 10^6 on 100 nodes), and its moves come back as
        // `Internal::Rebalanced`.
        let key = (view.figures_epoch, view.nodes.clone());
        let fresh = self.to_issue_for.as_ref() == Some(&key);
        if self.to_issue_for.as_ref().is_none_or(|k| k.1 != key.1) {
            self.to_issue.clear();
        }
        // The last rebalance's moves are asked for while its figures are the latest,
        // or once the new ones are ready to be worked out too; at most `max_moves` in
        // a window, and no more than that many not made yet (at 10^6 shards moves
        // were asked for faster than this machine made them, went stale after two
        // TTLs and had the whole rebalance worked out again, over and over).
        let budget = if fresh || ready {
            policy
                .max_moves
                .saturating_sub(self.issued.len())
                .min(policy.max_moves.saturating_sub(self.my_moves.len()))
        } else {
            0
        };
        let mut new = 0;
        while new < budget {
            let Some((s, to)) = self.to_issue.pop_front() else {
                break;
            };
            // Still a move to make (the target a replica that does not hold it)?
            let due = view
                .index_of(&to)
                .is_some_and(|n| view.holders.get(s) != Some(n) && plan.replicas(s).contains(&n));
            if due {
                self.my_moves.insert(s, (to, now));
                self.issued.push_back(now);
                let mut asked = lock(&self.asked);
                if asked.len() == ASKED_KEPT {
                    asked.pop_front();
                }
                asked.push_back(now);
                new += 1;
            }
        }
        if new > 0 {
            tracing::debug!(
                moves = new,
                left = self.to_issue.len(),
                budget,
                "balancing by load"
            );
            changed = true;
        }
        // The next rebalance starts from the moves asked for so far, these included
        // (started before them, it undid none of them: a move of the last rebalance,
        // for older figures, was then made after a new one had found nothing to do).
        let moves: Vec<(usize, u32)> = self
            .my_moves
            .iter()
            .filter_map(|(s, (to, _))| view.index_of(to).map(|n| (*s, n)))
            .collect();
        let paced = now < self.next_rebalance_at;
        if ready && !fresh && !self.rebalancing && !paced {
            self.rebalancing = true;
            self.figures_pending_since = None;
            self.figures_pending = 0;
            let (plan, layout, view) = (plan.clone(), self.layout.clone(), view.clone());
            let (tx, policy, key) = (self.internal_tx.clone(), policy.clone(), key.clone());
            tokio::task::spawn_blocking(move || {
                let started = std::time::Instant::now();
                let current = plan_by_load_with(Some(&plan), &layout, &view, &moves);
                let levels = view.loads.levels(layout.shards.len());
                let all = balance::rebalance(&current, &view.nodes, &levels, &policy, usize::MAX);
                let _ = tx.send(Internal::Rebalanced(key, all, started.elapsed()));
            });
        }
        // While moves of the window count against the budget, look again when the
        // oldest leaves it: a step the budget cut short (a chain of two that did not
        // fit counts too) has more to do, and nothing else may wake the balancer.
        let refill = if !fresh && !ready {
            Some(ready_at)
        } else {
            self.issued.front().map(|t| *t + policy.window)
        };
        let expiry = self
            .my_moves
            .values()
            .map(|(_, at)| (*at).max(self.moves_progressed_at) + stale)
            .min();
        let pacing = (!fresh && paced).then_some(self.next_rebalance_at);
        self.balance_at = [refill, expiry, pacing].into_iter().flatten().min();
        // Moves not made yet, and one while the latest figures and members have no
        // rebalance yet (waiting for the figures to hold still, or working it out).
        let worked_out = self.to_issue_for.as_ref() == Some(&key);
        self.balancing = self.to_issue.len() + self.my_moves.len() + usize::from(!worked_out);
        if changed {
            self.publish_moves();
        }
        crate::metrics::record_load_imbalance(
            &self.layout,
            &self.node_id,
            crate::view::load_imbalance(view),
        );
    }

    fn publish_moves(&mut self) {
        let list = self
            .my_moves
            .iter()
            .map(|(s, (to, _))| (*s as u32, to.clone()))
            .collect();
        if self.mine.set_moves(Some(list)) {
            self.mine_changed = true;
        }
    }
}
