//! The wire codec: round trips, and no panic on any input.

use proptest::collection::vec;
use proptest::prelude::*;
use tenure_peer::wire::{
    decode, encode, frame_len, DecodeError, MAX_FRAME_LEN, MAX_PEERS_PER_LIST, WIRE_VERSION,
};
use tenure_peer::{Message, MessageKind, PeerId};

fn peer() -> impl Strategy<Value = PeerId> {
    any::<u64>().prop_map(PeerId)
}

fn peers() -> impl Strategy<Value = Vec<PeerId>> {
    prop_oneof![vec(peer(), 0..8), vec(peer(), 0..=MAX_PEERS_PER_LIST)]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        any::<u64>().prop_map(|epoch| Message::Election { epoch }),
        any::<u64>().prop_map(|epoch| Message::Alive { epoch }),
        any::<u64>().prop_map(|epoch| Message::Nominate { epoch }),
        any::<u64>().prop_map(|epoch| Message::Failover { epoch }),
        (peer(), any::<u64>(), peers()).prop_map(|(leader, epoch, alternatives)| {
            Message::Elected {
                leader,
                epoch,
                alternatives,
            }
        }),
        (any::<u64>(), any::<u32>())
            .prop_map(|(epoch, group_size)| Message::Invite { epoch, group_size }),
        (any::<u64>(), peers()).prop_map(|(epoch, members)| Message::Accept { epoch, members }),
        peer().prop_map(|leader| Message::Redirect { leader }),
        (peer(), any::<u64>(), any::<u32>(), peers()).prop_map(|(initiator, epoch, hops, live)| {
            Message::RingElection {
                initiator,
                epoch,
                hops,
                live,
            }
        }),
        (peer(), peer(), any::<u64>(), any::<u32>(), peers()).prop_map(
            |(initiator, leader, epoch, hops, live)| Message::RingElected {
                initiator,
                leader,
                epoch,
                hops,
                live,
            }
        ),
        any::<u64>().prop_map(|epoch| Message::Heartbeat { epoch }),
        any::<u64>().prop_map(|epoch| Message::QuorumRequest { epoch }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(epoch, round)| Message::QuorumRenew { epoch, round }),
        (any::<u64>(), any::<u64>()).prop_map(|(epoch, round)| Message::QuorumAck { epoch, round }),
        any::<u64>().prop_map(|epoch| Message::QuorumNack { epoch }),
        any::<u64>().prop_map(|epoch| Message::QuorumRelease { epoch }),
        any::<bool>().prop_map(|active| Message::Candidacy { active }),
    ]
}

proptest! {
    #[test]
    fn encode_then_decode_round_trips(msg in message()) {
        let frame = encode(&msg).expect("messages within the bounds encode");
        prop_assert!(frame.len() <= MAX_FRAME_LEN);
        prop_assert_eq!(frame_len(&frame), Ok(Some(frame.len())));
        prop_assert_eq!(frame[4], WIRE_VERSION);
        prop_assert_eq!(usize::from(frame[5]), msg.kind().index());
        prop_assert_eq!(decode(&frame), Ok(msg));
    }

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..512)) {
        let _ = frame_len(&bytes);
        let _ = decode(&bytes);
    }

    #[test]
    fn random_bodies_behind_a_valid_prefix_never_panic(
        version in prop_oneof![Just(WIRE_VERSION), any::<u8>()],
        kind in 0u8..20,
        body in vec(any::<u8>(), 0..256),
    ) {
        let mut frame = Vec::new();
        frame.extend_from_slice(&((body.len() + 2) as u32).to_be_bytes());
        frame.push(version);
        frame.push(kind);
        frame.extend_from_slice(&body);
        match decode(&frame) {
            Ok(msg) => prop_assert_eq!(encode(&msg).expect("decoded messages encode"), frame),
            Err(e) => prop_assert!(!e.label().is_empty()),
        }
    }

    #[test]
    fn damaged_frames_fail_cleanly(msg in message(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let frame = encode(&msg).expect("encodes");
        // Any strict prefix is an error, never a panic or a wrong message.
        let short = &frame[..cut.index(frame.len())];
        prop_assert!(decode(short).is_err());
        // A flipped bit either fails or still decodes to some message that
        // re-encodes to exactly those bytes.
        let mut damaged = frame.clone();
        let at = flip.index(damaged.len());
        damaged[at] ^= 1 << bit;
        if let Ok(other) = decode(&damaged) {
            prop_assert_eq!(encode(&other).expect("encodes"), damaged);
        }
        // Extra bytes after the frame are refused.
        let mut long = frame.clone();
        long.push(0);
        prop_assert!(decode(&long).is_err());
    }
}

#[test]
fn oversized_frames_are_refused_from_the_prefix() {
    let prefix = ((MAX_FRAME_LEN - 4 + 1) as u32).to_be_bytes();
    assert_eq!(
        frame_len(&prefix),
        Err(DecodeError::FrameTooLarge {
            len: MAX_FRAME_LEN + 1
        })
    );
    let largest = Message::RingElected {
        initiator: PeerId(1),
        leader: PeerId(2),
        epoch: 3,
        hops: 4,
        live: vec![PeerId(u64::MAX); MAX_PEERS_PER_LIST],
    };
    let frame = encode(&largest).expect("the largest message fits");
    assert!(frame.len() <= MAX_FRAME_LEN);
    assert_eq!(decode(&frame), Ok(largest));
}

#[test]
fn every_kind_has_a_distinct_tag() {
    for (i, kind) in MessageKind::ALL.iter().enumerate() {
        assert_eq!(kind.index(), i);
        assert_eq!(MessageKind::from_index(i), Some(*kind));
    }
    assert_eq!(MessageKind::from_index(MessageKind::ALL.len()), None);
}
