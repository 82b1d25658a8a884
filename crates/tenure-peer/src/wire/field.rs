//! The fields of a frame's body: writing them, and a bounded reader for them.

use super::error::{DecodeError, EncodeError};
use super::MAX_PEERS_PER_LIST;
use crate::types::PeerId;

pub(super) fn put_optional_text(
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

pub(super) fn put_text(
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

pub(super) fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_be_bytes());
}

/// An optional priority: a flag byte, then the `i16` big-endian if set.
pub(super) fn put_priority(out: &mut Vec<u8>, priority: Option<i16>) {
    match priority {
        None => out.push(0),
        Some(p) => {
            out.push(1);
            out.extend_from_slice(&p.to_be_bytes());
        }
    }
}

pub(super) fn put_peers(out: &mut Vec<u8>, peers: &[PeerId]) -> Result<(), EncodeError> {
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

pub(super) struct Reader<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let (head, rest) = self.buf.split_at_checked(N).ok_or(DecodeError::Truncated)?;
        let mut bytes = [0u8; N];
        bytes.copy_from_slice(head);
        self.buf = rest;
        Ok(bytes)
    }

    pub(super) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(u8::from_be_bytes(self.take::<1>()?))
    }

    pub(super) fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.take::<4>()?))
    }

    pub(super) fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.take::<8>()?))
    }

    pub(super) fn flag(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(DecodeError::InvalidFlag(other)),
        }
    }

    pub(super) fn priority(&mut self) -> Result<Option<i16>, DecodeError> {
        if self.flag()? {
            Ok(Some(i16::from_be_bytes(self.take::<2>()?)))
        } else {
            Ok(None)
        }
    }

    pub(super) fn optional_text(
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

    pub(super) fn text(&mut self, field: &'static str, max: usize) -> Result<String, DecodeError> {
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

    pub(super) fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::TrailingBytes {
                extra: self.buf.len(),
            })
        }
    }

    pub(super) fn peer(&mut self) -> Result<PeerId, DecodeError> {
        self.u64().map(PeerId)
    }

    pub(super) fn peers(&mut self) -> Result<Vec<PeerId>, DecodeError> {
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
