//! The wire codec: round trips, and no panic on any input.

use proptest::collection::vec;
use proptest::prelude::*;
use tenure_peer::wire::{
    decode, decode_envelope, encode, encode_envelope, frame_len, DecodeError, Envelope, Holding,
    MAX_FRAME_LEN, MAX_PEERS_PER_LIST, WIRE_VERSION,
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
        (any::<bool>(), proptest::option::of(any::<i16>()))
            .prop_map(|(active, priority)| Message::Candidacy { active, priority }),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9/._-]{0,12}",
        proptest::string::string_regex(&format!(".{{0,{}}}", max.min(64))).expect("regex"),
    ]
}

fn holding() -> impl Strategy<Value = Holding> {
    (any::<u64>(), text(1024), text(4096)).prop_map(|(epoch, holder, value)| Holding {
        epoch,
        holder,
        value,
    })
}

/// A frame of `body` behind a valid length prefix, `version` and `kind`.
fn raw_frame(version: u8, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&((body.len() + 2) as u32).to_be_bytes());
    frame.push(version);
    frame.push(kind);
    frame.extend_from_slice(body);
    frame
}

fn envelope() -> impl Strategy<Value = Envelope> {
    prop_oneof![
        (peer(), any::<u64>()).prop_map(|(from, cluster)| Envelope::Hello { from, cluster }),
        (text(256), message()).prop_map(|(channel, msg)| Envelope::Routed { channel, msg }),
        (text(256), holding()).prop_map(
            |(
                channel,
                Holding {
                    epoch,
                    holder,
                    value,
                },
            )| Envelope::Seat {
                channel,
                epoch,
                holder,
                value
            }
        ),
        (text(256), any::<u64>(), proptest::option::of(text(1024))).prop_map(
            |(channel, request, to)| Envelope::HandoverAsk {
                channel,
                request,
                to
            }
        ),
        (
            text(256),
            any::<u64>(),
            holding(),
            proptest::option::of(any::<i16>())
        )
            .prop_map(|(channel, request, holding, waiter)| {
                Envelope::HandoverAnswer {
                    channel,
                    request,
                    holding,
                    waiter,
                }
            }),
        (
            text(256),
            any::<u64>(),
            proptest::option::of(peer()),
            proptest::option::of(text(1024))
        )
            .prop_map(|(channel, epoch, node, to)| Envelope::Handover {
                channel,
                epoch,
                node,
                to
            }),
    ]
}

proptest! {
    #[test]
    fn envelopes_round_trip(envelope in envelope()) {
        let frame = encode_envelope(&envelope).expect("envelopes within the bounds encode");
        prop_assert!(frame.len() <= MAX_FRAME_LEN);
        prop_assert_eq!(frame_len(&frame), Ok(Some(frame.len())));
        prop_assert_eq!(frame[4], WIRE_VERSION);
        prop_assert_eq!(decode_envelope(&frame), Ok(envelope));
    }

    #[test]
    fn random_envelope_bodies_never_panic(
        kind in 0x40u8..0x48,
        body in vec(any::<u8>(), 0..256),
    ) {
        let frame = raw_frame(WIRE_VERSION, kind, &body);
        match decode_envelope(&frame) {
            Ok(e) => prop_assert_eq!(encode_envelope(&e).expect("decoded envelopes encode"), frame),
            Err(e) => prop_assert!(!e.label().is_empty()),
        }
    }

    #[test]
    fn damaged_envelopes_fail_cleanly(envelope in envelope(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let frame = encode_envelope(&envelope).expect("encodes");
        prop_assert!(decode_envelope(&frame[..cut.index(frame.len())]).is_err());
        let mut damaged = frame.clone();
        let at = flip.index(damaged.len());
        damaged[at] ^= 1 << bit;
        if let Ok(other) = decode_envelope(&damaged) {
            prop_assert_eq!(encode_envelope(&other).expect("encodes"), damaged);
        }
    }
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
        let frame = raw_frame(version, kind, &body);
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
fn a_candidacy_carries_an_optional_priority() {
    // Kind 16, the active flag, then a flag and the i16 if there is one.
    let with = encode(&Message::Candidacy {
        active: true,
        priority: Some(-1000),
    })
    .expect("encodes");
    assert_eq!(with, [0, 0, 0, 6, WIRE_VERSION, 16, 1, 1, 0xfc, 0x18]);
    let without = encode(&Message::Candidacy {
        active: false,
        priority: None,
    })
    .expect("encodes");
    assert_eq!(without, [0, 0, 0, 4, WIRE_VERSION, 16, 0, 0]);
    // A set flag without the priority, or a flag that is neither 0 nor 1.
    assert_eq!(
        decode(&[0, 0, 0, 4, WIRE_VERSION, 16, 0, 1]),
        Err(DecodeError::Truncated)
    );
    assert_eq!(
        decode(&[0, 0, 0, 6, WIRE_VERSION, 16, 0, 2, 0, 0]),
        Err(DecodeError::InvalidFlag(2))
    );
    // Version 2 frames (no priority) are refused.
    assert_eq!(
        decode(&[0, 0, 0, 3, 2, 16, 1]),
        Err(DecodeError::UnsupportedVersion(2))
    );
}

#[test]
fn a_handover_names_an_optional_node_and_waiter() {
    let order = Envelope::Handover {
        channel: "e".into(),
        epoch: 7,
        node: Some(PeerId(3)),
        to: Some("c".into()),
    };
    let frame = encode_envelope(&order).expect("encodes");
    let mut expected = vec![0, 0, 0, 0, WIRE_VERSION, 0x45, 0, 1, b'e'];
    expected.extend_from_slice(&7u64.to_be_bytes());
    expected.push(1);
    expected.extend_from_slice(&3u64.to_be_bytes());
    expected.extend_from_slice(&[1, 0, 1, b'c']);
    let len = (expected.len() - 4) as u32;
    expected[..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(frame, expected);
    let too_long = Envelope::HandoverAsk {
        channel: "e".into(),
        request: 1,
        to: Some("x".repeat(1025)),
    };
    assert!(encode_envelope(&too_long).is_err());
}

#[test]
fn every_kind_has_a_distinct_tag() {
    for (i, kind) in MessageKind::ALL.iter().enumerate() {
        assert_eq!(kind.index(), i);
        assert_eq!(MessageKind::from_index(i), Some(*kind));
    }
    assert_eq!(MessageKind::from_index(MessageKind::ALL.len()), None);
}
