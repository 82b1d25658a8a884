//! Why bytes did not decode, or a message could not be encoded.

use std::fmt;

use super::{MAX_FRAME_LEN, MAX_PEERS_PER_LIST};

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
