//! Message counts per kind: sent, delivered, dropped.

use std::fmt;

use crate::message::MessageKind;

/// Messages counted per kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageStats {
    pub(super) sent: [u64; MessageKind::ALL.len()],
    pub(super) delivered: [u64; MessageKind::ALL.len()],
    pub(super) dropped: [u64; MessageKind::ALL.len()],
}

impl MessageStats {
    /// Messages of `kind` that state machines emitted.
    pub fn sent(&self, kind: MessageKind) -> u64 {
        self.sent.get(kind.index()).copied().unwrap_or(0)
    }

    /// Messages of `kind` handed to their receiver.
    pub fn delivered(&self, kind: MessageKind) -> u64 {
        self.delivered.get(kind.index()).copied().unwrap_or(0)
    }

    /// Messages of `kind` that never arrived.
    pub fn dropped(&self, kind: MessageKind) -> u64 {
        self.dropped.get(kind.index()).copied().unwrap_or(0)
    }

    /// All messages emitted.
    pub fn total_sent(&self) -> u64 {
        self.sent.iter().sum()
    }

    /// All messages delivered.
    pub fn total_delivered(&self) -> u64 {
        self.delivered.iter().sum()
    }

    /// All messages dropped.
    pub fn total_dropped(&self) -> u64 {
        self.dropped.iter().sum()
    }

    pub(super) fn bump(counts: &mut [u64; MessageKind::ALL.len()], kind: MessageKind) {
        if let Some(slot) = counts.get_mut(kind.index()) {
            *slot = slot.saturating_add(1);
        }
    }
}

impl fmt::Display for MessageStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for kind in MessageKind::ALL {
            let sent = self.sent(kind);
            if sent == 0 {
                continue;
            }
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(
                f,
                "{kind}: {sent} sent/{} delivered/{} dropped",
                self.delivered(kind),
                self.dropped(kind)
            )?;
        }
        if first {
            f.write_str("no messages")?;
        }
        Ok(())
    }
}
