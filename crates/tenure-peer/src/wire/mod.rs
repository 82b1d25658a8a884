//! The wire encoding of [`Message`](crate::Message): versioned, bounded,
//! length-prefixed frames.
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
//! [`WIRE_VERSION`], `kind` is
//! [`MessageKind::index`](crate::MessageKind::index), and the body holds the
//! message's fields in declaration order: `u64` and `u32` big-endian, a
//! [`PeerId`](crate::PeerId) as its `u64`, a list of peers as a `u16` count
//! followed by the peers, a flag as one byte 0 or 1, an optional value as a
//! flag then the value if the flag is 1 (a priority is an `i16`). A whole
//! frame is at most [`MAX_FRAME_LEN`] bytes, a list at most
//! [`MAX_PEERS_PER_LIST`] peers.
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

mod envelope;
mod error;
mod field;
mod frame;
mod message;

use crate::config::MAX_MEMBERS;

pub use envelope::{
    decode_envelope, encode_envelope, Envelope, Holding, MAX_CHANNEL_LEN, MAX_HOLDER_LEN,
    MAX_VALUE_LEN,
};
pub use error::{DecodeError, EncodeError};
pub use frame::frame_len;
pub use message::{decode, encode};

/// The version byte this codec writes and accepts. Version 2 added
/// `QuorumRelease`, `Candidacy` and the transport [`Envelope`]s; version 3
/// the priority in `Candidacy` and the handover envelopes (contract clause
/// 14). Nodes of different versions refuse each other's frames.
pub const WIRE_VERSION: u8 = 3;

/// The largest frame, length prefix included: 64 KiB.
pub const MAX_FRAME_LEN: usize = 64 * 1024;

/// The most peers one list may hold.
pub const MAX_PEERS_PER_LIST: usize = MAX_MEMBERS;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Message;
    use crate::types::PeerId;

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
