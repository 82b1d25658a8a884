//! What a session keeps beside its grants: the losses reported before a grant
//! was registered, and one lock per election.

use super::*;

/// Losses the backend reported for grants the session has not registered (yet): by
/// election, the token, the reason and when the report came (see
/// [`SessionCore::grant_lost`]). Reports older than a TTL are swept once the map has
/// doubled since the last sweep, as [`ElectionLocks`] does: they are of grants the
/// session gave up before the report came.
#[derive(Default)]
pub(super) struct EarlyLosses {
    pub(super) map: HashMap<ElectionName, (FencingToken, Early, Instant)>,
    pub(super) sweep_at: usize,
}

/// What the backend reported of a grant before it was registered: its loss, or a
/// request to step down (a preemption or handover that reached the holder's session
/// before the campaign's answer was read).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Early {
    Lost(LossReason),
    StepDown(StepDownReason),
}

impl EarlyLosses {
    pub(super) fn insert(
        &mut self,
        election: ElectionName,
        token: FencingToken,
        report: Early,
        ttl: Duration,
    ) {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, (_, _, at)| at.elapsed() < ttl);
            self.sweep_at = (self.map.len() * 2).max(1024);
        }
        // A loss outranks a step-down request of the same grant.
        if let Some((t, Early::Lost(_), _)) = self.map.get(&election) {
            if *t == token && matches!(report, Early::StepDown(_)) {
                return;
            }
        }
        self.map.insert(election, (token, report, Instant::now()));
    }

    /// The report for `election`, if any: it is used up by the grant registered now.
    pub(super) fn take(&mut self, election: &ElectionName) -> Option<(FencingToken, Early)> {
        self.map.remove(election).map(|(t, r, _)| (t, r))
    }
}

/// The per-election locks of a session's campaigns. Locks nobody holds are dropped
/// once the map has doubled since the last sweep, so the map does not grow with every
/// election ever seen and a sweep's cost is paid for by the entries added since: with
/// thousands of campaigns in flight, taking a lock stays O(1) (a sweep on every call
/// above a fixed size made a batch of n seats cost O(n²)).
#[derive(Default)]
pub(super) struct ElectionLocks {
    pub(super) map: HashMap<ElectionName, Arc<tokio::sync::Mutex<()>>>,
    pub(super) sweep_above: usize,
    pub(super) sweeps: usize,
}

impl ElectionLocks {
    pub(super) fn get(&mut self, election: &ElectionName) -> Arc<tokio::sync::Mutex<()>> {
        if self.map.len() > self.sweep_above.max(64) {
            self.map.retain(|_, l| Arc::strong_count(l) > 1);
            self.sweep_above = self.map.len() * 2;
            self.sweeps += 1;
        }
        self.map.entry(election.clone()).or_default().clone()
    }
}
