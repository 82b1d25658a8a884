//! Shared helpers for the simulation tests.
#![allow(dead_code)]

use tenure_peer::sim::{Simulation, Term};
use tenure_peer::{Config, ElectionAlgorithm, Heartbeat, PeerAlgorithm, PeerId, QuorumGuard};

pub type Machine = Box<dyn ElectionAlgorithm>;

pub fn ids(n: u64) -> Vec<PeerId> {
    (1..=n).map(PeerId).collect()
}

/// The plain algorithm for `id` among `1..=n`; candidates are the odd ranks
/// plus the highest.
pub fn plain(algo: PeerAlgorithm, id: PeerId, n: u64) -> Machine {
    let config = Config::new(id, ids(n)).expect("valid config");
    let candidates: Vec<PeerId> = ids(n)
        .into_iter()
        .filter(|p| p.get() % 2 == 1 || p.get() == n)
        .collect();
    algo.machine(config, &candidates)
}

/// The algorithm with heartbeat failure detection.
pub fn detected(algo: PeerAlgorithm, n: u64) -> impl FnMut(PeerId) -> Machine + 'static {
    move |id| Box::new(Heartbeat::new(plain(algo, id, n))) as Machine
}

/// The algorithm with heartbeat failure detection under the quorum guard.
pub fn guarded(algo: PeerAlgorithm, n: u64) -> impl FnMut(PeerId) -> Machine + 'static {
    move |id| Box::new(QuorumGuard::new(Heartbeat::new(plain(algo, id, n)))) as Machine
}

/// Checks the quorum guard's promises over a whole run: one leader per epoch,
/// epochs strictly increasing in the order leaderships began, and no two
/// leaderships at the same instant.
pub fn check_terms(terms: &[Term]) -> Result<(), String> {
    for (i, a) in terms.iter().enumerate() {
        for b in terms.iter().skip(i + 1) {
            if a.epoch == b.epoch {
                return Err(format!(
                    "two leaderships in epoch {}: {a:?} and {b:?}",
                    a.epoch
                ));
            }
            if a.overlaps(b) {
                return Err(format!("overlapping leaderships: {a:?} and {b:?}"));
            }
        }
    }
    for pair in terms.windows(2) {
        if pair[1].epoch <= pair[0].epoch {
            return Err(format!(
                "epochs not strictly increasing: {:?} then {:?}",
                pair[0], pair[1]
            ));
        }
    }
    Ok(())
}

/// Every up host follows the same leader, which is up and leads itself.
pub fn check_agreement(sim: &Simulation<Machine>) -> Result<PeerId, String> {
    let up: Vec<PeerId> = sim.hosts().filter(|h| sim.is_up(*h)).collect();
    let views: Vec<_> = up.iter().map(|h| (*h, sim.leader_of(*h))).collect();
    let first = views
        .first()
        .and_then(|(_, v)| *v)
        .ok_or_else(|| format!("no leader known: {views:?}"))?;
    if views.iter().any(|(_, v)| v.map(|l| l.id) != Some(first.id)) {
        return Err(format!("no agreement: {views:?}"));
    }
    if !sim.is_up(first.id) {
        return Err(format!("agreed leader {} is down", first.id));
    }
    Ok(first.id)
}
