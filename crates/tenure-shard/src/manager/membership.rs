//! The controller following the member list: members that left (kept for their
//! grace), the view built from the list, and the plan computed from it.

use std::sync::Arc;

use tenure_core::Member;
use tokio::time::Instant;

use super::controller::Controller;
use super::lock;
use super::planning::{follows_plan, node_going, PLAN_KEPT_AT_MOST, PLAN_QUIET};
use crate::state::{Changed, View};
use crate::view::plan_after;

impl Controller {
    /// Compute the plan for the latest view, unless the last one was computed too
    /// recently for its cost; big plans run on the blocking pool so renewals and
    /// other tasks keep running meanwhile.
    pub(super) async fn refresh_plan(&mut self) {
        if self.plan.is_some() {
            return;
        }
        let now = Instant::now();
        if now < self.next_plan_at {
            let at = self.next_plan_at;
            self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            return;
        }
        let previous = lock(&self.picture).as_ref().map(|(_, p)| p.clone());
        let (layout, view) = (self.layout.clone(), self.view.clone());
        let started = std::time::Instant::now();
        let plan = if layout.shards.len() >= 20_000 {
            let previous = previous.clone();
            match tokio::task::spawn_blocking(move || {
                plan_after(previous.as_deref(), &layout, &view)
            })
            .await
            {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "computing the assignment failed");
                    return;
                }
            }
        } else {
            plan_after(previous.as_deref(), &layout, &view)
        };
        // Spend at most about a fifth of the time computing plans.
        self.plan_took = started.elapsed();
        self.next_plan_at = Instant::now() + self.plan_took * 4;
        self.kept_since = None;
        // Look again at the shards whose preferred node moved.
        match previous {
            Some(prev) if prev.shards() == plan.shards() => {
                for s in 0..plan.shards() {
                    if prev.preferred(s) != plan.preferred(s) {
                        self.view_dirty.mark(s);
                    }
                }
            }
            _ => self.view_dirty.mark_all(),
        }
        self.planned_view = self.view.clone();
        self.plan = Some(plan);
        self.balance_due = true;
    }

    /// Take in a member list from the store: a member of the last list that is not in
    /// this one and was not draining there is kept, with its last value, for the
    /// member grace (see `with_absent`); one that is back is no longer absent. Every
    /// list is noted, also those a pass then applies only the last of, so that a
    /// member that said it was leaving (draining) just before it went is let go.
    pub(super) fn note_list(&mut self, list: Vec<Member>) {
        let now = Instant::now();
        let present: std::collections::HashSet<&str> = list.iter().map(|m| m.id()).collect();
        if !self.member_grace.is_zero() {
            for m in &self.listed {
                if present.contains(m.id())
                    || self.absent.contains_key(m.id())
                    || crate::state::draining_in(m.value())
                {
                    continue;
                }
                tracing::debug!(member = m.id(), grace = ?self.member_grace, "member left the list; kept for the grace");
                self.absent.insert(m.id().to_string(), (m.clone(), now));
            }
        }
        if self.listed.iter().any(|m| m.id() == self.node_id) && !present.contains(&*self.node_id) {
            // This node's own member is gone, so its session is (the store ended it):
            // have the session find out now rather than at its next renewal, so that
            // it is re-opened, the member registered again and the shards campaigned
            // for at once.
            tracing::warn!("this node's member left the list; checking the session now");
            self.session.renew_now();
        }
        self.absent.retain(|id, _| !present.contains(id.as_str()));
        self.listed = list;
    }

    /// The member list the view is built from: the store's last list and the members
    /// that left it within their grace, with their last value. A member that leaves
    /// without draining stays in the plan for `member_grace`, so that a node whose
    /// session the store took away (and which is back at once: its session finds out
    /// and re-opens, registers again and campaigns, see `note_list` and
    /// `after_reopen`) keeps its shards: nobody else campaigns for them meanwhile, and
    /// nothing moves away and back. A crashed node's shards go to others once its
    /// grace ends.
    pub(super) fn with_absent(&mut self) -> Vec<Member> {
        let now = Instant::now();
        let grace = self.member_grace;
        self.absent.retain(|id, (_, since)| {
            let keep = now < *since + grace;
            if !keep {
                tracing::info!(member = %id, ?grace, "member gone for the grace; its shards go to others");
            }
            keep
        });
        self.grace_at = self.absent.values().map(|(_, since)| *since + grace).min();
        let mut all = self.listed.clone();
        all.extend(self.absent.values().map(|(m, _)| m.clone()));
        all
    }

    /// Whether node `n` of `view` is a member that left the list and is kept for its
    /// grace: it campaigns for nothing, whatever its last value says.
    pub(super) fn is_absent(&self, view: &View, n: u32) -> bool {
        !self.absent.is_empty()
            && view
                .nodes
                .get(n as usize)
                .is_some_and(|node| self.absent.contains_key(&node.id))
    }

    pub(super) fn set_members(&mut self, list: &[Member]) {
        if let Some(st) = &mut self.startup {
            let ids: Vec<String> = list.iter().map(|m| m.id().to_string()).collect();
            if ids != st.ids {
                st.ids = ids;
                st.since = Instant::now();
                let at = st.since + st.quiet;
                self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
            }
        }
        let (view, changed) = View::update(&self.view, list, self.layout.shards.len());
        if node_going(&self.view, &view) {
            // A node went (its shards may be leaderless until this plan names their
            // next leaders) or drains (it waits for this plan to hand its shards
            // over): plan at once, whatever the cost of the last plan. Joins and the
            // churn of holdings keep the pacing.
            self.next_plan_at = Instant::now();
        }
        // Under balance by load, a new move changes the plan where the move is (the
        // kept plan follows it, see `plan_with_new_moves`); a new figure alone changes
        // no leader the plan has chosen.
        let loads_same = view.moves.is_none() || view.load_epoch == self.view.load_epoch;
        if view.figures_epoch != self.view.figures_epoch {
            self.figures_changed_at = Instant::now();
            self.figures_pending_since
                .get_or_insert(self.figures_changed_at);
            self.figures_pending += view.figures_changed;
        }
        let mut moved = Vec::new();
        let keep = match (&changed, &self.plan) {
            (Changed::Shards(shards), Some(plan)) if loads_same => {
                follows_plan(&self.view, &view, plan, shards).then(|| plan.clone())
            }
            (Changed::Shards(shards), Some(plan)) => {
                crate::view::plan_with_new_moves(plan, &self.view, &view)
                    .filter(|(p, _)| follows_plan(&self.view, &view, p, shards))
                    .map(|(p, m)| {
                        moved = m;
                        p
                    })
            }
            _ => None,
        };
        match changed {
            Changed::All => self.view_dirty.mark_all(),
            Changed::Shards(shards) => shards.into_iter().for_each(|s| self.view_dirty.mark(s)),
        }
        moved.iter().for_each(|s| self.view_dirty.mark(*s));
        self.view = Arc::new(view);
        if let Some(plan) = keep {
            // The plan still holds for the new list (same node numbers); plan again
            // from the latest list once it has been quiet a while, so that every node
            // ends on the plan of the same list — and, by load, at the latest a while
            // after the first change it was kept across, for lists that never hold
            // still (10^6 shards whose moves go on for a minute).
            self.plan = Some(plan);
            self.planned_view = self.view.clone();
            let now = Instant::now();
            self.replan_at = Some(now + PLAN_QUIET);
            if self.view.moves.is_some() {
                // By load (by count, plans kept across handoffs were fine as they were).
                let kept_since = *self.kept_since.get_or_insert(now);
                let latest = kept_since + (self.plan_took * 8).max(PLAN_KEPT_AT_MOST);
                self.replan_at = self.replan_at.map(|at| at.min(latest));
            }
            if !loads_same || !self.my_moves.is_empty() || !self.to_issue.is_empty() {
                // New figures, or moves made or taken back: the balancer looks again.
                self.balance_due = true;
            }
        } else {
            self.plan = None;
            self.replan_at = None;
        }
    }
}
