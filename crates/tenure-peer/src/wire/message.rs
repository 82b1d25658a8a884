//! The frames of a bare [`Message`]: encoding and decoding its body.

use super::error::{DecodeError, EncodeError};
use super::field::{put_peers, put_priority, put_u64, Reader};
use super::frame::{finish_frame, open_frame, start_frame};
use crate::message::{Message, MessageKind};

/// Encodes `msg` as one frame.
///
/// Fails only for messages no state machine of this crate builds: a peer
/// list longer than [`MAX_PEERS_PER_LIST`](super::MAX_PEERS_PER_LIST).
pub fn encode(msg: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = start_frame(tag(msg.kind()));
    put_message_body(&mut out, msg)?;
    finish_frame(out)
}

pub(super) fn put_message_body(out: &mut Vec<u8>, msg: &Message) -> Result<(), EncodeError> {
    match msg {
        Message::Election { epoch }
        | Message::Alive { epoch }
        | Message::Nominate { epoch }
        | Message::Failover { epoch }
        | Message::Heartbeat { epoch }
        | Message::QuorumRequest { epoch }
        | Message::QuorumNack { epoch }
        | Message::QuorumRelease { epoch } => put_u64(out, *epoch),
        Message::Elected {
            leader,
            epoch,
            alternatives,
        } => {
            put_u64(out, leader.get());
            put_u64(out, *epoch);
            put_peers(out, alternatives)?;
        }
        Message::Invite { epoch, group_size } => {
            put_u64(out, *epoch);
            out.extend_from_slice(&group_size.to_be_bytes());
        }
        Message::Accept { epoch, members } => {
            put_u64(out, *epoch);
            put_peers(out, members)?;
        }
        Message::Redirect { leader } => put_u64(out, leader.get()),
        Message::RingElection {
            initiator,
            epoch,
            hops,
            live,
        } => {
            put_u64(out, initiator.get());
            put_u64(out, *epoch);
            out.extend_from_slice(&hops.to_be_bytes());
            put_peers(out, live)?;
        }
        Message::RingElected {
            initiator,
            leader,
            epoch,
            hops,
            live,
        } => {
            put_u64(out, initiator.get());
            put_u64(out, leader.get());
            put_u64(out, *epoch);
            out.extend_from_slice(&hops.to_be_bytes());
            put_peers(out, live)?;
        }
        Message::QuorumRenew { epoch, round } | Message::QuorumAck { epoch, round } => {
            put_u64(out, *epoch);
            put_u64(out, *round);
        }
        Message::Candidacy { active, priority } => {
            out.push(u8::from(*active));
            put_priority(out, *priority);
        }
    }
    Ok(())
}

/// Decodes one whole frame (prefix included, nothing after it).
pub fn decode(frame: &[u8]) -> Result<Message, DecodeError> {
    let (mut r, tag_byte) = open_frame(frame)?;
    let msg = read_message_body(&mut r, tag_byte)?;
    r.finish()?;
    Ok(msg)
}

pub(super) fn read_message_body(r: &mut Reader<'_>, tag_byte: u8) -> Result<Message, DecodeError> {
    let kind =
        MessageKind::from_index(usize::from(tag_byte)).ok_or(DecodeError::UnknownKind(tag_byte))?;
    Ok(match kind {
        MessageKind::Election => Message::Election { epoch: r.u64()? },
        MessageKind::Alive => Message::Alive { epoch: r.u64()? },
        MessageKind::Nominate => Message::Nominate { epoch: r.u64()? },
        MessageKind::Failover => Message::Failover { epoch: r.u64()? },
        MessageKind::Heartbeat => Message::Heartbeat { epoch: r.u64()? },
        MessageKind::QuorumRequest => Message::QuorumRequest { epoch: r.u64()? },
        MessageKind::QuorumNack => Message::QuorumNack { epoch: r.u64()? },
        MessageKind::QuorumRelease => Message::QuorumRelease { epoch: r.u64()? },
        MessageKind::Elected => Message::Elected {
            leader: r.peer()?,
            epoch: r.u64()?,
            alternatives: r.peers()?,
        },
        MessageKind::Invite => Message::Invite {
            epoch: r.u64()?,
            group_size: r.u32()?,
        },
        MessageKind::Accept => Message::Accept {
            epoch: r.u64()?,
            members: r.peers()?,
        },
        MessageKind::Redirect => Message::Redirect { leader: r.peer()? },
        MessageKind::RingElection => Message::RingElection {
            initiator: r.peer()?,
            epoch: r.u64()?,
            hops: r.u32()?,
            live: r.peers()?,
        },
        MessageKind::RingElected => Message::RingElected {
            initiator: r.peer()?,
            leader: r.peer()?,
            epoch: r.u64()?,
            hops: r.u32()?,
            live: r.peers()?,
        },
        MessageKind::QuorumRenew => Message::QuorumRenew {
            epoch: r.u64()?,
            round: r.u64()?,
        },
        MessageKind::QuorumAck => Message::QuorumAck {
            epoch: r.u64()?,
            round: r.u64()?,
        },
        MessageKind::Candidacy => Message::Candidacy {
            active: r.flag()?,
            priority: r.priority()?,
        },
    })
}

pub(super) fn tag(kind: MessageKind) -> u8 {
    u8::try_from(kind.index()).unwrap_or(u8::MAX)
}
