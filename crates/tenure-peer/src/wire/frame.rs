//! A frame's prefix and header: starting, finishing, measuring and opening frames.

use super::error::{DecodeError, EncodeError};
use super::field::Reader;
use super::{MAX_FRAME_LEN, WIRE_VERSION};

const PREFIX_LEN: usize = 4;

pub(super) fn start_frame(kind: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&[0; PREFIX_LEN]);
    out.push(WIRE_VERSION);
    out.push(kind);
    out
}

pub(super) fn finish_frame(mut out: Vec<u8>) -> Result<Vec<u8>, EncodeError> {
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

/// Checks the prefix and the version; returns a reader over the body and the
/// kind byte.
pub(super) fn open_frame(frame: &[u8]) -> Result<(Reader<'_>, u8), DecodeError> {
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

fn frame_len_declared(frame: &[u8]) -> usize {
    let mut bytes = [0u8; PREFIX_LEN];
    if let Some(prefix) = frame.get(..PREFIX_LEN) {
        bytes.copy_from_slice(prefix);
    }
    usize::try_from(u32::from_be_bytes(bytes)).unwrap_or(usize::MAX)
}
