//! The transport's [`Envelope`]s: their kinds, bounds, encoding and decoding.

use super::error::{DecodeError, EncodeError};
use super::field::{put_optional_text, put_priority, put_text, put_u64};
use super::frame::{finish_frame, open_frame, start_frame};
use super::message::{put_message_body, read_message_body, tag};
use crate::message::Message;
use crate::types::PeerId;

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

/// What a stream transport sends: the frames of [`encode`](super::encode)
/// with a few more kinds. Same header (length,
/// [`WIRE_VERSION`](super::WIRE_VERSION), kind byte), kind bytes from `0x40`
/// on, so they never collide with a [`MessageKind`](crate::MessageKind):
///
/// | kind | body |
/// |---|---|
/// | `0x40` `Hello` | `from: u64`, `cluster: u64` |
/// | `0x41` `Routed` | `channel: text`, message kind byte, message body as in [`encode`](super::encode) |
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
