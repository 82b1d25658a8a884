//! Every machine takes any message from anyone at any time without panicking.

mod common;

use common::{detected, guarded, plain, Machine};
use tenure_peer::sim::SimRng;
use tenure_peer::PeerAlgorithm;
use tenure_peer::{Instant, Message, PeerId};

fn small(rng: &mut SimRng) -> u64 {
    // Mostly plausible values, sometimes extremes.
    match rng.below(8) {
        0 => u64::MAX,
        1 => 0,
        _ => rng.below(12),
    }
}

fn peer(rng: &mut SimRng) -> PeerId {
    PeerId(small(rng))
}

fn peers(rng: &mut SimRng) -> Vec<PeerId> {
    let len = rng.below(8);
    (0..len).map(|_| peer(rng)).collect()
}

fn message(rng: &mut SimRng) -> Message {
    let epoch = small(rng);
    match rng.below(17) {
        0 => Message::Election { epoch },
        1 => Message::Alive { epoch },
        2 => Message::Nominate { epoch },
        3 => Message::Failover { epoch },
        4 => Message::Elected {
            leader: peer(rng),
            epoch,
            alternatives: peers(rng),
        },
        5 => Message::Invite {
            epoch,
            group_size: small(rng) as u32,
        },
        6 => Message::Accept {
            epoch,
            members: peers(rng),
        },
        7 => Message::Redirect { leader: peer(rng) },
        8 => Message::RingElection {
            initiator: peer(rng),
            epoch,
            hops: small(rng) as u32,
            live: peers(rng),
        },
        9 => Message::RingElected {
            initiator: peer(rng),
            leader: peer(rng),
            epoch,
            hops: small(rng) as u32,
            live: peers(rng),
        },
        10 => Message::Heartbeat { epoch },
        11 => Message::QuorumRequest { epoch },
        12 => Message::QuorumRenew {
            epoch,
            round: small(rng),
        },
        13 => Message::QuorumAck {
            epoch,
            round: small(rng),
        },
        14 => Message::QuorumNack { epoch },
        15 => Message::QuorumRelease { epoch },
        _ => Message::Candidacy {
            active: rng.below(2) == 1,
            priority: match rng.below(3) {
                0 => None,
                1 => Some(0),
                _ => Some(i16::try_from(rng.below(2001)).unwrap_or(0) - 1000),
            },
        },
    }
}

fn drain(m: &mut Machine) {
    let mut sent = 0;
    while m.poll_transmit().is_some() {
        sent += 1;
        assert!(sent < 100_000, "runaway output");
    }
    while m.poll_event().is_some() {}
}

fn hammer(mut m: Machine, seed: u64) {
    let mut rng = SimRng::new(seed);
    let mut now = Instant::ZERO;
    m.start(now);
    drain(&mut m);
    for _ in 0..300 {
        now = now + std::time::Duration::from_millis(rng.below(400));
        match rng.below(10) {
            0 => m.handle_timeout(now),
            1 => m.peer_unreachable(now, peer(&mut rng)),
            2 => m.start_election(now),
            3 => m.leader_conflict(now, peer(&mut rng)),
            _ => {
                let msg = message(&mut rng);
                m.handle_message(now, peer(&mut rng), msg);
            }
        }
        drain(&mut m);
        if let Some(at) = m.poll_timeout() {
            if at <= now {
                m.handle_timeout(now);
                drain(&mut m);
            }
        }
    }
}

#[test]
fn random_inputs_never_panic() {
    for algo in PeerAlgorithm::ALL {
        for seed in 0..40u64 {
            let n = 2 + seed % 5;
            let id = PeerId(1 + seed % n);
            hammer(plain(algo, id, n), seed);
            hammer(detected(algo, n)(id), seed);
            hammer(guarded(algo, n)(id), seed);
        }
    }
}

#[test]
fn a_single_member_elects_itself() {
    for algo in PeerAlgorithm::ALL {
        for mut m in [plain(algo, PeerId(1), 1), guarded(algo, 1)(PeerId(1))] {
            let mut now = Instant::ZERO;
            m.start(now);
            for _ in 0..50 {
                drain(&mut m);
                match m.poll_timeout() {
                    Some(at) if m.leader().is_none() => {
                        now = at.max(now);
                        m.handle_timeout(now);
                    }
                    _ => break,
                }
            }
            assert_eq!(m.leader().map(|l| l.id), Some(PeerId(1)), "{algo:?}");
        }
    }
}
