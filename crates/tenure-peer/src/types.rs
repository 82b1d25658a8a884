//! Small value types shared by every state machine.

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// Identity and rank of a process. A larger number is a higher rank.
///
/// Every algorithm in this crate orders processes by this number: the bully
/// family elects the highest live rank, the ring lays processes out in
/// ascending order, and tie-breaks that need an order use it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId(pub u64);

impl PeerId {
    /// The raw number.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for PeerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl From<u64> for PeerId {
    fn from(value: u64) -> Self {
        PeerId(value)
    }
}

/// A point in time, in nanoseconds since an origin chosen by whoever drives
/// the state machine (the simulator starts at zero; a transport would use the
/// time since it started).
///
/// State machines never read a clock: every input carries the current
/// `Instant`, and `poll_timeout` answers with one. Arithmetic saturates
/// instead of overflowing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The origin.
    pub const ZERO: Instant = Instant(0);

    /// The instant `nanos` nanoseconds after the origin.
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The time elapsed since the origin.
    pub const fn since_origin(self) -> Duration {
        Duration::from_nanos(self.0)
    }

    /// `self - earlier`, or zero when `earlier` is later than `self`.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    fn add(self, rhs: Duration) -> Instant {
        let nanos = u64::try_from(rhs.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = self.0 / 1_000;
        write!(f, "{}.{:06}s", micros / 1_000_000, micros % 1_000_000)
    }
}

/// Who leads, and in which epoch.
///
/// For the plain algorithms the epoch numbers election rounds; under
/// [`QuorumGuard`](crate::QuorumGuard) it is the fencing token, strictly
/// increasing across successive leaders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Leader {
    /// The leading process.
    pub id: PeerId,
    /// The epoch of its leadership.
    pub epoch: u64,
}

/// What a state machine reports to its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// This process now follows `leader` (possibly itself) in `epoch`.
    LeaderChanged {
        /// The process this one now considers leader.
        leader: PeerId,
        /// The epoch of that leadership.
        epoch: u64,
    },
    /// This process no longer knows of a leader: it suspects the one it had,
    /// or (quorum mode) its leader's lease lapsed or it stepped down itself.
    LeaderLost {
        /// The epoch of the leadership that ended.
        epoch: u64,
    },
}

/// State that must survive a crash.
///
/// A driver persists it (before sending what the machine produced) and hands
/// it back through `restore` after a restart. Only the quorum guard needs it:
/// forgetting a promised epoch would let a restarted process acknowledge the
/// same epoch twice.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    /// The highest epoch this process has promised (or campaigned for).
    pub epoch: u64,
    /// The process that promise went to (this process when it campaigned).
    pub holder: Option<PeerId>,
}
