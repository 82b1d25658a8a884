//! Membership and timing, validated once.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use crate::types::PeerId;

/// The largest membership a [`Config`] accepts. It keeps every message a
/// state machine builds (the ring's live set is the largest) well inside
/// [`wire::MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN).
pub const MAX_MEMBERS: usize = 4096;

/// Every timing parameter of every algorithm, in one place.
///
/// The defaults suit a network whose one-way delay is at most a few tens of
/// milliseconds (the simulator's default is 1–10 ms).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long an election initiator waits for `Alive` answers before it
    /// decides with what it has. It decides earlier once every peer it asked
    /// has answered or been reported unreachable. Default 200 ms.
    pub answer_timeout: Duration,
    /// How long a process that was asked to take part in an election (or that
    /// handed it on) waits for the announcement before it starts one of its
    /// own. Default 600 ms.
    pub announce_timeout: Duration,
    /// The unit of process-specific delays: the candidate/ordinary tie-break
    /// delay δ is a multiple of it, and so are the invitation algorithm's
    /// first invitations and the quorum guard's retry stagger. Must exceed a
    /// round trip. Default 250 ms.
    pub tie_break_step: Duration,
    /// How often an invitation-group leader invites one more process while
    /// its group is incomplete. Default 1 s.
    pub invite_interval: Duration,
    /// How long a ring initiator waits for its round to come back before
    /// starting again. Default 1 s.
    pub round_timeout: Duration,
    /// How often a leader sends heartbeats. Default 100 ms.
    pub heartbeat_interval: Duration,
    /// How long a follower waits without a heartbeat from its leader before
    /// it starts an election. Default 500 ms.
    pub leader_timeout: Duration,
    /// Quorum mode: how long an acknowledgement stays valid. A leader steps
    /// down when it has not renewed its majority within this period, counted
    /// from when it sent the renewal; a process that acknowledged refuses
    /// other would-be leaders for this long. Default 1 s.
    pub lease: Duration,
    /// Quorum mode: how often a leader renews its majority. Default 250 ms.
    pub renew_interval: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            answer_timeout: Duration::from_millis(200),
            announce_timeout: Duration::from_millis(600),
            tie_break_step: Duration::from_millis(250),
            invite_interval: Duration::from_secs(1),
            round_timeout: Duration::from_secs(1),
            heartbeat_interval: Duration::from_millis(100),
            leader_timeout: Duration::from_millis(500),
            lease: Duration::from_secs(1),
            renew_interval: Duration::from_millis(250),
        }
    }
}

impl Timing {
    /// Checks the relations the algorithms rely on: every period is non-zero,
    /// heartbeats come more often than the leader timeout, and renewals more
    /// often than the lease.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let named = [
            ("answer_timeout", self.answer_timeout),
            ("announce_timeout", self.announce_timeout),
            ("tie_break_step", self.tie_break_step),
            ("invite_interval", self.invite_interval),
            ("round_timeout", self.round_timeout),
            ("heartbeat_interval", self.heartbeat_interval),
            ("leader_timeout", self.leader_timeout),
            ("lease", self.lease),
            ("renew_interval", self.renew_interval),
        ];
        for (name, value) in named {
            if value.is_zero() {
                return Err(ConfigError::new(format!("{name} must be non-zero")));
            }
        }
        if self.heartbeat_interval >= self.leader_timeout {
            return Err(ConfigError::new(
                "heartbeat_interval must be shorter than leader_timeout",
            ));
        }
        if self.renew_interval >= self.lease {
            return Err(ConfigError::new(
                "renew_interval must be shorter than lease",
            ));
        }
        Ok(())
    }
}

/// Who this process is, who the members are, and the timing.
///
/// Built through [`Config::new`], which validates it; every state machine
/// takes one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    id: PeerId,
    members: Vec<PeerId>,
    timing: Timing,
}

impl Config {
    /// A configuration for process `id` among `members` (which must contain
    /// `id`, hold no duplicates and at most [`MAX_MEMBERS`] entries) with
    /// default timing.
    pub fn new(
        id: PeerId,
        members: impl IntoIterator<Item = PeerId>,
    ) -> Result<Config, ConfigError> {
        Config::with_timing(id, members, Timing::default())
    }

    /// Like [`Config::new`] with the given timing, which is validated too.
    pub fn with_timing(
        id: PeerId,
        members: impl IntoIterator<Item = PeerId>,
        timing: Timing,
    ) -> Result<Config, ConfigError> {
        timing.validate()?;
        let mut seen = BTreeSet::new();
        for member in members {
            if !seen.insert(member) {
                return Err(ConfigError::new(format!("member {member} is listed twice")));
            }
            if seen.len() > MAX_MEMBERS {
                return Err(ConfigError::new(format!("more than {MAX_MEMBERS} members")));
            }
        }
        if !seen.contains(&id) {
            return Err(ConfigError::new(format!("{id} is not among the members")));
        }
        Ok(Config {
            id,
            members: seen.into_iter().collect(),
            timing,
        })
    }

    /// This process.
    pub fn id(&self) -> PeerId {
        self.id
    }

    /// All members including this process, in ascending rank order.
    pub fn members(&self) -> &[PeerId] {
        &self.members
    }

    /// The timing.
    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// How many acknowledgements (counting one's own) make a majority of the
    /// full membership.
    pub fn majority(&self) -> usize {
        self.members.len() / 2 + 1
    }

    /// Every member but this process, ascending.
    pub(crate) fn others(&self) -> impl Iterator<Item = PeerId> + '_ {
        let me = self.id;
        self.members.iter().copied().filter(move |p| *p != me)
    }

    pub(crate) fn is_member(&self, peer: PeerId) -> bool {
        self.members.binary_search(&peer).is_ok()
    }

    /// Whether `peer` is a member other than this process: the only senders
    /// a machine takes messages from.
    pub(crate) fn is_other_member(&self, peer: PeerId) -> bool {
        peer != self.id && self.is_member(peer)
    }

    /// Position of `peer` in ascending order, if it is a member.
    pub(crate) fn position(&self, peer: PeerId) -> Option<usize> {
        self.members.binary_search(&peer).ok()
    }
}

/// A configuration was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    message: String,
}

impl ConfigError {
    fn new(message: impl Into<String>) -> Self {
        ConfigError {
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid peer configuration: {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_members_exclude_self_and_strangers() {
        let c = Config::new(PeerId(2), [PeerId(1), PeerId(2), PeerId(3)]).unwrap();
        assert!(c.is_other_member(PeerId(1)));
        assert!(c.is_other_member(PeerId(3)));
        assert!(!c.is_other_member(PeerId(2)));
        assert!(!c.is_other_member(PeerId(4)));
    }

    #[test]
    fn rejects_bad_membership_and_timing() {
        assert!(Config::new(PeerId(9), [PeerId(1), PeerId(2)]).is_err());
        assert!(Config::new(PeerId(1), [PeerId(1), PeerId(1)]).is_err());
        let timing = Timing {
            renew_interval: Duration::from_secs(2),
            ..Timing::default()
        };
        assert!(Config::with_timing(PeerId(1), [PeerId(1)], timing).is_err());
        let ok = Config::new(PeerId(2), [PeerId(3), PeerId(1), PeerId(2)]).unwrap();
        assert_eq!(ok.members(), &[PeerId(1), PeerId(2), PeerId(3)]);
        assert_eq!(ok.majority(), 2);
    }
}
