//! What a transport counts: the public stats and the counters behind them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::wire::DecodeError;

/// Counters of a transport, as of a [`Transport::stats`](super::Transport::stats)
/// call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Frames written to a connection.
    pub frames_sent: u64,
    /// Frames received and handed to the driver.
    pub frames_received: u64,
    /// Frames dropped because they did not decode, by
    /// [`DecodeError::label`] (and `unexpected_hello` for a second `Hello`);
    /// the connection goes on.
    pub malformed: BTreeMap<&'static str, u64>,
    /// Connections closed because a length prefix announced more than
    /// [`wire::MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN) bytes (a stream
    /// cannot be resynchronised).
    pub oversized: u64,
    /// Accepted connections refused at the handshake: no `Hello` in time, a
    /// sender that is no member (or this process), or another cluster.
    pub rejected_connections: u64,
    /// Failed connection attempts.
    pub connect_failures: u64,
    /// Envelopes reported back as undelivered.
    pub undelivered: u64,
    /// Envelopes that could not be encoded (texts or lists over their
    /// bounds); never sent.
    pub encode_failures: u64,
    /// Frames dropped in or out while the transport was isolated by
    /// [`Transport::set_isolated`](super::Transport::set_isolated).
    pub dropped_isolated: u64,
}

impl TransportStats {
    /// All malformed frames, whatever the cause.
    pub fn malformed_total(&self) -> u64 {
        self.malformed.values().sum()
    }
}

impl fmt::Display for TransportStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sent {} received {} malformed {:?} oversized {} rejected {} connect_failures {} undelivered {} encode_failures {} dropped_isolated {}",
            self.frames_sent,
            self.frames_received,
            self.malformed,
            self.oversized,
            self.rejected_connections,
            self.connect_failures,
            self.undelivered,
            self.encode_failures,
            self.dropped_isolated
        )
    }
}

#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) frames_sent: AtomicU64,
    pub(super) frames_received: AtomicU64,
    pub(super) malformed: Mutex<BTreeMap<&'static str, u64>>,
    pub(super) oversized: AtomicU64,
    pub(super) rejected_connections: AtomicU64,
    pub(super) connect_failures: AtomicU64,
    pub(super) undelivered: AtomicU64,
    pub(super) encode_failures: AtomicU64,
    pub(super) dropped_isolated: AtomicU64,
}

impl Counters {
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn malformed(&self, error: &DecodeError) {
        self.malformed_label(error.label());
    }

    pub(super) fn malformed_label(&self, label: &'static str) {
        let mut map = match self.malformed.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *map.entry(label).or_insert(0) += 1;
    }

    pub(super) fn snapshot(&self) -> TransportStats {
        let malformed = match self.malformed.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        TransportStats {
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            malformed,
            oversized: self.oversized.load(Ordering::Relaxed),
            rejected_connections: self.rejected_connections.load(Ordering::Relaxed),
            connect_failures: self.connect_failures.load(Ordering::Relaxed),
            undelivered: self.undelivered.load(Ordering::Relaxed),
            encode_failures: self.encode_failures.load(Ordering::Relaxed),
            dropped_isolated: self.dropped_isolated.load(Ordering::Relaxed),
        }
    }
}
