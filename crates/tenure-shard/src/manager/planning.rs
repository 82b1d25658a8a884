//! When the controller plans again and which plan it acts on: pure rules over views
//! and plans, without the controller's state.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::assign::Plan;
use crate::state::View;

/// How long the member list must hold still before a plan kept across changes (see
/// [`follows_plan`]) is computed again from it.
pub(super) const PLAN_QUIET: Duration = Duration::from_millis(100);

/// A plan kept across changes is computed again at the latest this long (or eight
/// times what the last plan took, if more) after the first of them.
pub(super) const PLAN_KEPT_AT_MOST: Duration = Duration::from_secs(2);

/// Whether going from `old` to `new` (the same nodes; `changed` the shards whose claims
/// changed) only did what `plan` asked: every new holder of a changed shard is its
/// preferred node, the holder it had, or none. Such a change leaves the plan as it is,
/// and computing it again (O(P) or more) is work for nothing. Anything else (a node's
/// weight or drain flag, a shard taken by another node) calls for a new plan.
pub(super) fn follows_plan(old: &View, new: &View, plan: &Plan, changed: &[usize]) -> bool {
    old.nodes == new.nodes
        && changed.iter().all(|&s| {
            let h = new.holders.get(s);
            h.is_none() || h == old.holders.get(s) || h == plan.preferred(s)
        })
}

/// When the controller must wake by itself: for a retry (failed campaigns, the end of
/// the startup quiet, a paced plan), for the plan kept across member changes to be
/// computed again from the latest list, or for the next queued handoff. The replan
/// has a wake-up of its own: when it shared the retry's, a retry due earlier used it
/// up, the replan never came, and a node could keep a plan of an older list than the
/// others' while nothing else changed — nodes that disagree on a shard's preferred
/// node wait on each other for ever.
pub(super) fn next_wake(
    retry: Option<Instant>,
    replan: Option<Instant>,
    handoff: Option<Instant>,
) -> Option<Instant> {
    [retry, replan, handoff].into_iter().flatten().min()
}

/// The member list a reconcile acts on and the plan it follows, and whether that list
/// is the latest (so its changes since the last plan are looked at now).
///
/// Node numbers in a plan index the list it was computed for. With a plan for the
/// latest list (`plan`, computed for `planned`), that pair. While a new plan is on its
/// way (`plan` is `None`; planning is paced by its cost, seconds at 10^5 shards), the
/// last plan still indexes the latest list if the nodes are the same, so it is used
/// with the latest list: a holder hands a shard over as soon as the shard's node
/// campaigns for it, rather than after the next plan. When the nodes changed, the last
/// pair (`picture`) stands until the new plan comes.
pub(super) fn acting_on(
    plan: Option<&Arc<Plan>>,
    planned: &Arc<View>,
    picture: Option<&(Arc<View>, Arc<Plan>)>,
    latest: &Arc<View>,
) -> Option<(Arc<View>, Arc<Plan>, bool)> {
    match (plan, picture) {
        (Some(p), _) => Some((planned.clone(), p.clone(), true)),
        (None, Some((v, p))) if v.nodes == latest.nodes => Some((latest.clone(), p.clone(), true)),
        (None, Some((v, p))) => Some((v.clone(), p.clone(), false)),
        (None, None) => None,
    }
}

/// Whether a node of `old` is missing from `new` or has started to drain (both sorted
/// by id): its shards need new leaders soon.
pub(super) fn node_going(old: &View, new: &View) -> bool {
    old.nodes
        .iter()
        .any(|n| match new.nodes.binary_search_by(|m| m.id.cmp(&n.id)) {
            Ok(i) => new.nodes[i].draining && !n.draining,
            Err(_) => true,
        })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tenure_core::Member;

    use std::time::Duration;

    use super::{acting_on, next_wake};
    use crate::config::Layout;
    use crate::state::{OwnState, View};
    use crate::view::plan_after;

    const SHARDS: usize = 12;

    fn list(nodes: &mut [(&str, &mut OwnState)]) -> Vec<Member> {
        let mut members = Vec::new();
        for (id, state) in nodes.iter_mut() {
            members.push(Member::new(*id, state.value()).expect("member"));
        }
        members
    }

    #[test]
    fn a_pending_replan_wakes_the_controller_whatever_else_is_due() {
        let now = tokio::time::Instant::now();
        let (early, late) = (
            now + Duration::from_millis(10),
            now + Duration::from_millis(100),
        );
        assert_eq!(next_wake(None, Some(late), None), Some(late));
        assert_eq!(next_wake(Some(early), Some(late), None), Some(early));
        // After the retry's wake-up the retry is gone; the replan still wakes.
        assert_eq!(next_wake(None, Some(late), None), Some(late));
        assert_eq!(next_wake(Some(late), None, Some(early)), Some(early));
        assert_eq!(next_wake(None, None, None), None);
    }

    #[test]
    fn while_a_plan_is_pending_for_the_same_nodes_the_latest_claims_count() {
        let layout = Layout::new("ns", SHARDS, 1).expect("layout");
        let (mut a, mut b) = (OwnState::new(SHARDS, 1, 1), OwnState::new(SHARDS, 1, 2));
        let first = list(&mut [("a", &mut a), ("b", &mut b)]);
        let (v1, _) = View::update(&View::default(), &first, SHARDS);
        let v1 = Arc::new(v1);
        let plan = plan_after(None, &layout, &v1);
        let b_index = v1.index_of("b").expect("b");
        let shard = (0..SHARDS)
            .find(|&s| plan.preferred(s) == Some(b_index))
            .expect("a shard for b");
        // b starts to campaign for its shard; a new plan is on its way.
        b.set_campaigning(shard, true);
        let second = list(&mut [("a", &mut a), ("b", &mut b)]);
        let (v2, _) = View::update(&v1, &second, SHARDS);
        let v2 = Arc::new(v2);
        let picture = (v1.clone(), plan.clone());
        let (view, used, current) =
            acting_on(None, &v1, Some(&picture), &v2).expect("something to act on");
        assert!(current, "the latest list's changes count now");
        assert!(Arc::ptr_eq(&used, &plan));
        assert!(
            view.states[b_index as usize].campaigning.contains(shard),
            "the campaign is seen before the next plan"
        );

        // A node joins: the last plan's numbers do not index the new list.
        let mut c = OwnState::new(SHARDS, 1, 3);
        let third = list(&mut [("a", &mut a), ("b", &mut b), ("c", &mut c)]);
        let (v3, _) = View::update(&v2, &third, SHARDS);
        let v3 = Arc::new(v3);
        let (view, _, current) =
            acting_on(None, &v1, Some(&picture), &v3).expect("something to act on");
        assert!(!current && Arc::ptr_eq(&view, &v1), "the last pair stands");

        // With a plan for the latest list, that pair.
        let fresh = plan_after(Some(&plan), &layout, &v3);
        let (view, used, current) =
            acting_on(Some(&fresh), &v3, Some(&picture), &v3).expect("something to act on");
        assert!(current && Arc::ptr_eq(&view, &v3) && Arc::ptr_eq(&used, &fresh));
        assert!(acting_on(None, &v1, None, &v2).is_none());
    }
}
