//! The controller's handoffs: which held shards go to which node, and the queued
//! handoffs started as the token bucket allows.

use tenure_core::StepDownReason;

use super::controller::Controller;
use crate::assign::Plan;
use crate::state::View;

impl Controller {
    /// Whether held shard `s` should go now: `Some(to)` when its preferred node `to`
    /// campaigns for it, or `Some(None)` when draining and the plan (which already
    /// sees this node draining) has nobody else for it.
    pub(super) fn handoff_of(&self, s: usize, view: &View, plan: &Plan) -> Option<Option<String>> {
        match plan.preferred(s) {
            Some(t)
                if Some(t) != self.me
                    && view.states[t as usize].campaigning.contains(s)
                    && !self.is_absent(view, t) =>
            {
                Some(Some(view.nodes[t as usize].id.clone()))
            }
            None if self.draining => Some(None),
            _ => None,
        }
    }

    /// Start the queued handoffs the token bucket allows, each checked again first:
    /// each grant is asked to step down (contract clause 15), and its seat is released
    /// once the shard's work acknowledged (its `Acquired` event's work guard is gone)
    /// or at the step-down grace; its end comes through the session's loss feed and is
    /// reported as `HandedOff`. Releases that come due together go out in one batch.
    pub(super) fn run_handoffs(&mut self, view: &View, plan: &Plan) {
        while let Some(&s) = self.pending.front() {
            // Still held, not already stepping down, and still to hand over (the plan
            // or the claims may have moved since it was queued)?
            let due = self
                .held
                .get(&s)
                .filter(|h| h.handing_off.is_none())
                .and_then(|_| self.handoff_of(s, view, plan));
            if due.is_some() && !self.bucket.take() {
                break;
            }
            self.pending.pop_front();
            self.queued.set(s, false);
            // Only a handoff still due lets go of the shard: one the plan no longer
            // asks for stays held (and published as held).
            let Some(to) = due else {
                continue;
            };
            let draining = self.draining;
            let Some(held) = self.held.get_mut(&s) else {
                continue;
            };
            let token = held.watch.token();
            tracing::debug!(shard = s, %token, to = ?to, "handing off");
            held.handing_off = Some(to.clone());
            let reason = if draining && to.is_none() {
                StepDownReason::Drain
            } else {
                StepDownReason::Handoff(to)
            };
            if let Some(l) = &held.leadership {
                l.step_down(reason);
            }
        }
    }
}
