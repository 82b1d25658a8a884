//! The wire encoding of [`Message`]: versioned, bounded, length-prefixed
//! frames.
//!
//! A frame is
//!
//! ```text
//! +----------------+---------+------+------------------+
//! | length: u32 BE | version | kind | body             |
//! +----------------+---------+------+------------------+
//!   4 bytes          1 byte    1 byte  length − 2 bytes
//! ```
//!
//! where `length` counts every byte after itself, `version` is
//! [`WIRE_VERSION`], `kind` is [`MessageKind::index`], and the body holds the
//! message's fields in declaration order: `u64` and `u32` big-endian, a
//! [`PeerId`] as its `u64`, a list of peers as a `u16` count followed by the
//! peers, a flag as one byte 0 or 1, an optional value as a flag then the
//! value if the flag is 1 (a priority is an `i16`). A whole frame is at most
//! [`MAX_FRAME_LEN`] bytes, a list at most [`MAX_PEERS_PER_LIST`] peers.
//!
//! The TCP transport sends [`Envelope`]s: the same frames with kind bytes
//! from `0x40` on, which add a handshake, a channel (election) name in front
//! of a message, and the seat holder's identity for observers.
//!
//! [`decode`] and [`decode_envelope`] never panic: any byte string either
//! decodes to the value whose encoding it is, or yields a [`DecodeError`] whose
//! [`label`](DecodeError::label) a transport can count. A transport reading a
//! stream calls [`frame_len`] to learn when a whole frame has arrived, and it
//! rejects an oversized frame from its first four bytes, before buffering it.

use std::fmt;

use crate::config::MAX_MEMBERS;
use crate::message::{Message, MessageKind};
use crate::types::PeerId;

/// The version byte this codec writes and accepts. Version 2 added
/// `QuorumRelease`, `Candidacy` and the transport [`Envelope`]s; version 3
/// the priority in `Candidacy` and the handover envelopes (contract clause
/// 14). Nodes of different versions refuse each other's frames.
pub const WIRE_VERSION: u8 = 3;

/// The largest frame, length prefix included: 64 KiB.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// The most peers one list may hold.
pub const MAX_PEERS_PER_LIST: usize = MAX_MEMBERS;

const PREFIX_LEN: usize = 4;

/// Why bytes did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// The bytes end before the frame or a field does.
    Truncated,
    /// The length prefix announces more than [`MAX_FRAME_LEN`] bytes.
    FrameTooLarge {
        /// The frame length the prefix announces, prefix included.
        len: usize,
    },
    /// The length prefix disagrees with the number of bytes given.
    LengthMismatch {
        /// Bytes after the prefix, as announced.
        declared: usize,
        /// Bytes after the prefix, as given.
        actual: usize,
    },
    /// A version byte this codec does not speak.
    UnsupportedVersion(u8),
    /// A kind byte that names no message.
    UnknownKind(u8),
    /// A list longer than [`MAX_PEERS_PER_LIST`].
    ListTooLong {
        /// The announced count.
        len: usize,
    },
    /// Bytes left over after the message's last field.
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// A flag byte other than 0 or 1.
    InvalidFlag(u8),
    /// A text field that is not UTF-8 or is longer than its bound.
    InvalidText {
        /// Which field.
        field: &'static str,
    },
}

impl DecodeError {
    /// A short, stable name for counting errors by cause.
    pub fn label(&self) -> &'static str {
        match self {
            DecodeError::Truncated => "truncated",
            DecodeError::FrameTooLarge { .. } => "frame_too_large",
            DecodeError::LengthMismatch { .. } => "length_mismatch",
            DecodeError::UnsupportedVersion(_) => "unsupported_version",
            DecodeError::UnknownKind(_) => "unknown_kind",
            DecodeError::ListTooLong { .. } => "list_too_long",
            DecodeError::TrailingBytes { .. } => "trailing_bytes",
            DecodeError::InvalidFlag(_) => "invalid_flag",
            DecodeError::InvalidText { .. } => "invalid_text",
        }
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated => write!(f, "frame truncated"),
            DecodeError::FrameTooLarge { len } => {
                write!(f, "frame of {len} bytes exceeds {MAX_FRAME_LEN}")
            }
            DecodeError::LengthMismatch { declared, actual } => {
                write!(f, "frame declares {declared} bytes but has {actual}")
            }
            DecodeError::UnsupportedVersion(v) => write!(f, "unsupported wire version {v}"),
            DecodeError::UnknownKind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::ListTooLong { len } => {
                write!(f, "list of {len} peers exceeds {MAX_PEERS_PER_LIST}")
            }
            DecodeError::TrailingBytes { extra } => {
                write!(f, "{extra} bytes after the message")
            }
            DecodeError::InvalidFlag(b) => write!(f, "flag byte {b} is neither 0 nor 1"),
            DecodeError::InvalidText { field } => {
                write!(f, "{field} is not UTF-8 text within its bound")
            }
        }
    }
}

impl std::error::Error for DecodeError {}

/// Why a message could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// A list longer than [`MAX_PEERS_PER_LIST`].
    ListTooLong {
        /// Its length.
        len: usize,
    },
    /// The frame would exceed [`MAX_FRAME_LEN`].
    FrameTooLarge {
        /// Its length, prefix included.
        len: usize,
    },
    /// A text field longer than its bound.
    TextTooLong {
        /// Which field.
        field: &'static str,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::ListTooLong { len } => {
                write!(f, "list of {len} peers exceeds {MAX_PEERS_PER_LIST}")
            }
            EncodeError::FrameTooLarge { len } => {
                write!(f, "frame of {len} bytes exceeds {MAX_FRAME_LEN}")
            }
            EncodeError::TextTooLong { field } => write!(f, "{field} exceeds its bound"),
        }
    }
}

impl std::error::Error for EncodeError {}

/// Encodes `msg` as one frame.
///
/// Fails only for messages no state machine of this crate builds: a peer
/// list longer than [`MAX_PEERS_PER_LIST`].
pub fn encode(msg: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut out = start_frame(tag(msg.kind()));
    put_message_body(&mut out, msg)?;
    finish_frame(out)
}

fn start_frame(kind: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&[0; PREFIX_LEN]);
    out.push(WIRE_VERSION);
    out.push(kind);
    out
}

fn finish_frame(mut out: Vec<u8>) -> Result<Vec<u8>, EncodeError> {
    if out.len() > MAX_FRAME_LEN {
        return Err(EncodeError::FrameTooLarge { len: out.len() });
    }
    let body = u32::try_from(out.len() - PREFIX_LEN)
        .map_err(|_| EncodeError::FrameTooLarge { len: out.len() })?;
    if let Some(prefix) = out.get_mut(..PREFIX_LEN) {
        prefix.copy_from_slice(&body.to_be_bytes());
    }
    Ok(out)
}

fn put_message_body(out: &mut Vec<u8>, msg: &Message) -> Result<(), EncodeError> {
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

/// How long the frame at the start of `buf` is, prefix included, once all of
/// it is in `buf`; `Ok(None)` while more bytes are needed.
///
/// Fails as soon as the prefix announces more than [`MAX_FRAME_LEN`] bytes.
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, DecodeError> {
    let Some(prefix) = buf.get(..PREFIX_LEN) else {
        return Ok(None);
    };
    let mut bytes = [0u8; PREFIX_LEN];
    bytes.copy_from_slice(prefix);
    let declared = usize::try_from(u32::from_be_bytes(bytes)).unwrap_or(usize::MAX);
    let total = declared.saturating_add(PREFIX_LEN);
    if total > MAX_FRAME_LEN {
        return Err(DecodeError::FrameTooLarge { len: total });
    }
    Ok((buf.len() >= total).then_some(total))
}

/// Decodes one whole frame (prefix included, nothing after it).
pub fn decode(frame: &[u8]) -> Result<Message, DecodeError> {
    let (mut r, tag_byte) = open_frame(frame)?;
    let msg = read_message_body(&mut r, tag_byte)?;
    r.finish()?;
    Ok(msg)
}

/// Checks the prefix and the version; returns a reader over the body and the
/// kind byte.
fn open_frame(frame: &[u8]) -> Result<(Reader<'_>, u8), DecodeError> {
    let total = match frame_len(frame)? {
        Some(total) => total,
        None => {
            if frame.len() < PREFIX_LEN {
                return Err(DecodeError::Truncated);
            }
            return Err(DecodeError::LengthMismatch {
                declared: frame_len_declared(frame),
                actual: frame.len() - PREFIX_LEN,
            });
        }
    };
    if frame.len() != total {
        return Err(DecodeError::LengthMismatch {
            declared: total - PREFIX_LEN,
            actual: frame.len() - PREFIX_LEN,
        });
    }
    let mut r = Reader {
        buf: frame.get(PREFIX_LEN..).unwrap_or(&[]),
    };
    let version = r.u8()?;
    if version != WIRE_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let tag_byte = r.u8()?;
    Ok((r, tag_byte))
}

/// The longest channel name an [`Envelope`] carries, in bytes.
pub const MAX_CHANNEL_LEN: usize = 256;

/// The longest holder id a [`Envelope::Seat`] carries, in bytes.
pub const MAX_HOLDER_LEN: usize = 1024;

/// The longest holder value a [`Envelope::Seat`] carries, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

const HELLO_TAG: u8 = 0x40;
const ROUTED_TAG: u8 = 0x41;
const SEAT_TAG: u8 = 0x42;
const HANDOVER_ASK_TAG: u8 = 0x43;
const HANDOVER_ANSWER_TAG: u8 = 0x44;
const HANDOVER_TAG: u8 = 0x45;

/// What a stream transport sends: the frames of [`encode`] with a few more
/// kinds. Same header (length, [`WIRE_VERSION`], kind byte), kind bytes from
/// `0x40` on, so they never collide with a [`MessageKind`]:
///
/// | kind | body |
/// |---|---|
/// | `0x40` `Hello` | `from: u64`, `cluster: u64` |
/// | `0x41` `Routed` | `channel: text`, message kind byte, message body as in [`encode`] |
/// | `0x42` `Seat` | `channel: text`, `epoch: u64`, `holder: text`, `value: text` |
/// | `0x43` `HandoverAsk` | `channel: text`, `request: u64`, `to: optional text` |
/// | `0x44` `HandoverAnswer` | `channel: text`, `request: u64`, `epoch: u64`, `holder: text`, `value: text`, `waiter: optional i16` |
/// | `0x45` `Handover` | `channel: text`, `epoch: u64`, `node: optional u64`, `to: optional text` |
///
/// where `text` is a `u16` byte count and UTF-8 bytes, at most
/// [`MAX_CHANNEL_LEN`], [`MAX_HOLDER_LEN`] (also for `to`) and
/// [`MAX_VALUE_LEN`] bytes, and an optional field a flag byte followed by the
/// value when the flag is 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// The first frame on every connection: who is calling, and a digest of
    /// the membership it was configured with, so that processes of different
    /// clusters refuse each other.
    Hello {
        /// The calling process.
        from: PeerId,
        /// Digest of the caller's membership.
        cluster: u64,
    },
    /// A message for the state machine of `channel` (one per election).
    Routed {
        /// Which state machine, e.g. the election name; empty for a process
        /// with a single machine.
        channel: String,
        /// The message.
        msg: Message,
    },
    /// The sender leads `channel` in `epoch` and its seat is held by
    /// `holder` with `value` (what observers report).
    Seat {
        /// The election.
        channel: String,
        /// The sender's epoch (fencing token).
        epoch: u64,
        /// The holding candidate's id.
        holder: String,
        /// The holding candidate's value.
        value: String,
    },
    /// Contract clause 14: the sender asks every member about `channel`
    /// before a handover: who holds the seat here, and whether the waiter
    /// `to` (or, without `to`, any waiter) waits here.
    HandoverAsk {
        /// The election.
        channel: String,
        /// The asker's request number, repeated in the answers.
        request: u64,
        /// The waiter the seat is to go to (a candidate id), if named.
        to: Option<String>,
    },
    /// The answer to [`Envelope::HandoverAsk`].
    HandoverAnswer {
        /// The election.
        channel: String,
        /// The request answered.
        request: u64,
        /// Who holds the seat on the sender (epoch 0 if nobody does).
        holding: Holding,
        /// The priority of the waiter asked for (or of the best waiter) if it
        /// waits on the sender.
        waiter: Option<i16>,
    },
    /// Contract clause 14: the holder of `epoch` is to step down, and the
    /// next grant is to go to the waiter `to` on `node` (if named).
    Handover {
        /// The election.
        channel: String,
        /// The grant to end.
        epoch: u64,
        /// The node the next grant should go to, if named.
        node: Option<PeerId>,
        /// The waiter on `node` the next grant should go to, if named.
        to: Option<String>,
    },
}

/// Who holds a seat on a node, as an [`Envelope::HandoverAnswer`] carries
/// it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// The epoch a session of the node holds the seat with; 0 if none.
    pub epoch: u64,
    /// The holding candidate's id (empty if none).
    pub holder: String,
    /// The holding candidate's value (empty if none).
    pub value: String,
}

/// Encodes an [`Envelope`] as one frame.
pub fn encode_envelope(envelope: &Envelope) -> Result<Vec<u8>, EncodeError> {
    match envelope {
        Envelope::Hello { from, cluster } => {
            let mut out = start_frame(HELLO_TAG);
            put_u64(&mut out, from.get());
            put_u64(&mut out, *cluster);
            finish_frame(out)
        }
        Envelope::Routed { channel, msg } => {
            let mut out = start_channel_frame(ROUTED_TAG, channel)?;
            out.push(tag(msg.kind()));
            put_message_body(&mut out, msg)?;
            finish_frame(out)
        }
        Envelope::Seat {
            channel,
            epoch,
            holder,
            value,
        } => {
            let mut out = start_channel_frame(SEAT_TAG, channel)?;
            put_seat(&mut out, *epoch, holder, value)?;
            finish_frame(out)
        }
        Envelope::HandoverAsk {
            channel,
            request,
            to,
        } => {
            let mut out = start_channel_frame(HANDOVER_ASK_TAG, channel)?;
            put_u64(&mut out, *request);
            put_optional_text(&mut out, to.as_deref(), "to", MAX_HOLDER_LEN)?;
            finish_frame(out)
        }
        Envelope::HandoverAnswer {
            channel,
            request,
            holding,
            waiter,
        } => {
            let mut out = start_channel_frame(HANDOVER_ANSWER_TAG, channel)?;
            put_u64(&mut out, *request);
            put_seat(&mut out, holding.epoch, &holding.holder, &holding.value)?;
            put_priority(&mut out, *waiter);
            finish_frame(out)
        }
        Envelope::Handover {
            channel,
            epoch,
            node,
            to,
        } => {
            let mut out = start_channel_frame(HANDOVER_TAG, channel)?;
            put_u64(&mut out, *epoch);
            match node {
                None => out.push(0),
                Some(n) => {
                    out.push(1);
                    put_u64(&mut out, n.get());
                }
            }
            put_optional_text(&mut out, to.as_deref(), "to", MAX_HOLDER_LEN)?;
            finish_frame(out)
        }
    }
}

/// A frame of `kind` whose body starts with `channel`.
fn start_channel_frame(kind: u8, channel: &str) -> Result<Vec<u8>, EncodeError> {
    let mut out = start_frame(kind);
    put_text(&mut out, channel, "channel", MAX_CHANNEL_LEN)?;
    Ok(out)
}

/// Who holds a seat: `epoch`, `holder` and `value`, as [`Envelope::Seat`] and
/// [`Envelope::HandoverAnswer`] carry them.
fn put_seat(out: &mut Vec<u8>, epoch: u64, holder: &str, value: &str) -> Result<(), EncodeError> {
    put_u64(out, epoch);
    put_text(out, holder, "holder", MAX_HOLDER_LEN)?;
    put_text(out, value, "value", MAX_VALUE_LEN)
}

fn put_optional_text(
    out: &mut Vec<u8>,
    text: Option<&str>,
    field: &'static str,
    max: usize,
) -> Result<(), EncodeError> {
    match text {
        None => {
            out.push(0);
            Ok(())
        }
        Some(t) => {
            out.push(1);
            put_text(out, t, field, max)
        }
    }
}

/// Decodes one whole envelope frame (prefix included, nothing after it).
/// Never panics; a frame of a bare [`Message`] is
/// [`DecodeError::UnknownKind`] here.
pub fn decode_envelope(frame: &[u8]) -> Result<Envelope, DecodeError> {
    let (mut r, tag_byte) = open_frame(frame)?;
    let envelope = match tag_byte {
        HELLO_TAG => Envelope::Hello {
            from: r.peer()?,
            cluster: r.u64()?,
        },
        ROUTED_TAG => {
            let channel = r.text("channel", MAX_CHANNEL_LEN)?;
            let kind = r.u8()?;
            Envelope::Routed {
                channel,
                msg: read_message_body(&mut r, kind)?,
            }
        }
        SEAT_TAG => Envelope::Seat {
            channel: r.text("channel", MAX_CHANNEL_LEN)?,
            epoch: r.u64()?,
            holder: r.text("holder", MAX_HOLDER_LEN)?,
            value: r.text("value", MAX_VALUE_LEN)?,
        },
        HANDOVER_ASK_TAG => Envelope::HandoverAsk {
            channel: r.text("channel", MAX_CHANNEL_LEN)?,
            request: r.u64()?,
            to: r.optional_text("to", MAX_HOLDER_LEN)?,
        },
        HANDOVER_ANSWER_TAG => Envelope::HandoverAnswer {
            channel: r.text("channel", MAX_CHANNEL_LEN)?,
            request: r.u64()?,
            holding: Holding {
                epoch: r.u64()?,
                holder: r.text("holder", MAX_HOLDER_LEN)?,
                value: r.text("value", MAX_VALUE_LEN)?,
            },
            waiter: r.priority()?,
        },
        HANDOVER_TAG => Envelope::Handover {
            channel: r.text("channel", MAX_CHANNEL_LEN)?,
            epoch: r.u64()?,
            node: if r.flag()? { Some(r.peer()?) } else { None },
            to: r.optional_text("to", MAX_HOLDER_LEN)?,
        },
        other => return Err(DecodeError::UnknownKind(other)),
    };
    r.finish()?;
    Ok(envelope)
}

fn put_text(
    out: &mut Vec<u8>,
    text: &str,
    field: &'static str,
    max: usize,
) -> Result<(), EncodeError> {
    let bytes = text.as_bytes();
    if bytes.len() > max {
        return Err(EncodeError::TextTooLong { field });
    }
    let len = u16::try_from(bytes.len()).map_err(|_| EncodeError::TextTooLong { field })?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn read_message_body(r: &mut Reader<'_>, tag_byte: u8) -> Result<Message, DecodeError> {
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

fn frame_len_declared(frame: &[u8]) -> usize {
    let mut bytes = [0u8; PREFIX_LEN];
    if let Some(prefix) = frame.get(..PREFIX_LEN) {
        bytes.copy_from_slice(prefix);
    }
    usize::try_from(u32::from_be_bytes(bytes)).unwrap_or(usize::MAX)
}

fn tag(kind: MessageKind) -> u8 {
    u8::try_from(kind.index()).unwrap_or(u8::MAX)
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

/// An optional priority: a flag byte, then the `i16` big-endian if set.
fn put_priority(out: &mut Vec<u8>, priority: Option<i16>) {
    match priority {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
}

fn put_peers(out: &mut Vec<u8>, peers: &[PeerId]) -> Result<(), EncodeError> {
    if peers.len() > MAX_PEERS_PER_LIST {
        return Err(EncodeError::ListTooLong { len: peers.len() });
    }
    let count =
        u16::try_from(peers.len()).map_err(|_| EncodeError::ListTooLong { len: peers.len() })?;
    out.extend_from_slice(&count.to_be_bytes());
    for peer in peers {
        put_u64(out, peer.get());
    }
    Ok(())
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.buf.split_at_checked(N).ok_or(DecodeError::Truncated)?;
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(head);
        self.buf = rest;
        Ok(bytes)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.take::<1>()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take::<4>()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take::<8>()?))
    }

    fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidFlag(other)),
        }
    }

    fn priority(&mut self) -> Result<Option<i16>, DecodeError> {
        if self.flag()? {
            Ok(Some(i16::from_be_bytes(self.take::<2>()?)))
        } else {
            Ok(None)
        }
    }

    fn optional_text(
        &mut self,
        field: &'static str,
        max: usize,
    ) -> Result<Option<String>, DecodeError> {
        if self.flag()? {
            Ok(Some(self.text(field, max)?))
        } else {
            Ok(None)
        }
    }

    fn text(&mut self, field: &'static str, max: usize) -> Result<String, DecodeError> {
        let len = usize::from(u16::from_be_bytes(self.take::<2>()?));
        if len > max {
            return Err(DecodeError::InvalidText { field });
        }
        let (head, rest) = self
            .buf
            .split_at_checked(len)
            .ok_or(DecodeError::Truncated)?;
        let text = std::str::from_utf8(head).map_err(|_| DecodeError::InvalidText { field })?;
        self.buf = rest;
        Ok(text.to_owned())
    }

    fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                extra: self.buf.len(),
            })
        }
    }

    fn peer(&mut self) -> Result<PeerId, DecodeError> {
        self.u64().map(PeerId)
    }

    fn peers(&mut self) -> Result<Vec<PeerId>, DecodeError> {
        let len = usize::from(u16::from_be_bytes(self.take::<2>()?));
        if len > MAX_PEERS_PER_LIST {
            return Err(DecodeError::ListTooLong { len });
        }
        // The frame bound keeps this allocation small; check the bytes are
        // there before allocating anyway.
        if self.buf.len() < len.saturating_mul(8) {
            return Err(DecodeError::Truncated);
        }
        let mut peers = Vec::with_capacity(len);
        for _ in 0..len {
            peers.push(self.peer()?);
        }
        Ok(peers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_layout_is_as_documented() {
        let bytes = encode(&Message::Alive { epoch: 7 }).unwrap();
        assert_eq!(
            bytes,
            [0, 0, 0, 10, WIRE_VERSION, 1, 0, 0, 0, 0, 0, 0, 0, 7]
        );
        let routed = encode_envelope(&Envelope::Routed {
            channel: "e".into(),
            msg: Message::Alive { epoch: 7 },
        })
        .unwrap();
        assert_eq!(
            routed,
            [
                0,
                0,
                0,
                14,
                WIRE_VERSION,
                0x41,
                0,
                1,
                b'e',
                1,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                7
            ]
        );
        assert_eq!(frame_len(&bytes[..3]), Ok(None));
        assert_eq!(frame_len(&bytes), Ok(Some(14)));
        assert_eq!(decode(&bytes), Ok(Message::Alive { epoch: 7 }));
    }

    #[test]
    fn rejects_malformed_frames() {
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(
            frame_len(&[0xff, 0xff, 0xff, 0xff]),
            Err(DecodeError::FrameTooLarge {
                len: 0xffff_ffff + 4
            })
        );
        let mut bytes = encode(&Message::Alive { epoch: 7 }).unwrap();
        bytes[4] = 9;
        assert_eq!(decode(&bytes), Err(DecodeError::UnsupportedVersion(9)));
        bytes[4] = WIRE_VERSION;
        bytes[5] = 200;
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownKind(200)));
        let too_long = Message::Accept {
            epoch: 1,
            members: vec![PeerId(1); MAX_PEERS_PER_LIST + 1],
        };
        assert!(matches!(
            encode(&too_long),
            Err(EncodeError::ListTooLong { .. })
        ));
    }
}
