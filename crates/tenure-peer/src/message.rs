//! The messages processes exchange, shared by every algorithm.

use std::fmt;

use crate::types::PeerId;

/// A message between two processes.
///
/// One enum serves every algorithm so that a transport (and the [`wire`]
/// codec) handles a single type; each algorithm ignores the kinds it does not
/// use. Lists of peers are bounded by
/// [`MAX_MEMBERS`](crate::MAX_MEMBERS) when a state machine builds them and by
/// [`wire::MAX_PEERS_PER_LIST`](crate::wire::MAX_PEERS_PER_LIST) when decoded.
///
/// [`wire`]: crate::wire
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Bully family and candidate/ordinary: "an election for `epoch` is on;
    /// answer if you are alive".
    Election {
        /// The election's epoch.
        epoch: u64,
    },
    /// The answer to `Election` or `Failover`: "I am alive".
    Alive {
        /// The epoch being answered.
        epoch: u64,
    },
    /// Bully: the initiator tells the highest process that answered to
    /// announce itself.
    Nominate {
        /// The election's epoch.
        epoch: u64,
    },
    /// Next-in-line: a process that saw the leader fail asks the next
    /// alternative to take over.
    Failover {
        /// The epoch the alternative should lead in.
        epoch: u64,
    },
    /// An announcement: `leader` leads in `epoch`. Next-in-line leaders attach
    /// their ordered failover alternatives.
    Elected {
        /// The new leader.
        leader: PeerId,
        /// Its epoch.
        epoch: u64,
        /// Ordered failover alternatives (empty outside next-in-line).
        alternatives: Vec<PeerId>,
    },
    /// Invitation: a group leader invites the receiver's group to merge.
    Invite {
        /// The inviting group's epoch.
        epoch: u64,
        /// How many processes the inviting group has.
        group_size: u32,
    },
    /// Invitation: the receiver's group joins the sender's; `members` lists
    /// the joining group.
    Accept {
        /// The joining group's epoch.
        epoch: u64,
        /// Every member of the joining group, its leader included.
        members: Vec<PeerId>,
    },
    /// Invitation: "I am not a leader; talk to `leader`".
    Redirect {
        /// The leader of the sender's group.
        leader: PeerId,
    },
    /// Ring: the election round started by `initiator`. `live` is the set of
    /// processes visited so far (alive-set variant) or the one highest rank
    /// seen so far (max-only variant).
    RingElection {
        /// The process that started the round.
        initiator: PeerId,
        /// The round's epoch.
        epoch: u64,
        /// How many processes the round has reached.
        hops: u32,
        /// Visited processes, or the single maximum.
        live: Vec<PeerId>,
    },
    /// Ring: the second round, announcing `leader`. In the alive-set variant
    /// `live` is the set found by the first round and the announcement travels
    /// only through it; in the max-only variant it is empty.
    RingElected {
        /// The process that started the election.
        initiator: PeerId,
        /// The elected leader.
        leader: PeerId,
        /// The election's epoch.
        epoch: u64,
        /// How many processes the announcement has reached.
        hops: u32,
        /// The live set of the first round (alive-set variant only).
        live: Vec<PeerId>,
    },
    /// Failure detector: the sender leads in `epoch` and is alive.
    Heartbeat {
        /// The sender's leadership epoch.
        epoch: u64,
    },
    /// Quorum mode: the sender wants to lead in `epoch`.
    QuorumRequest {
        /// The epoch (fencing token) asked for.
        epoch: u64,
    },
    /// Quorum mode: the leader of `epoch` renews its majority.
    QuorumRenew {
        /// The leader's epoch.
        epoch: u64,
        /// The renewal round, counting up from 1.
        round: u64,
    },
    /// Quorum mode: acknowledgement of a request (`round` 0) or a renewal.
    QuorumAck {
        /// The acknowledged epoch.
        epoch: u64,
        /// The acknowledged round.
        round: u64,
    },
    /// Quorum mode: refusal; `epoch` is the highest the sender has promised.
    QuorumNack {
        /// The sender's promised epoch.
        epoch: u64,
    },
    /// Quorum mode: the sender stopped leading (or campaigning) in `epoch` of
    /// its own accord; members bound to it for `epoch` are free at once.
    QuorumRelease {
        /// The epoch given up.
        epoch: u64,
    },
    /// Candidacy gate: whether the sender takes part in elections. Sent to
    /// every member when it changes, and by a process that stands by as the
    /// answer to election traffic, which the receiver then treats as if the
    /// sender were unreachable.
    Candidacy {
        /// True while the sender is a candidate.
        active: bool,
        /// The best priority among the sender's waiting sessions, if any
        /// wait (contract clause 14); sent again whenever it changes and,
        /// while set, every refresh period, so that a crashed sender's
        /// interest fades. It only decides who stands for election, never
        /// who may lead.
        priority: Option<i16>,
    },
}

impl Message {
    /// The message's kind, for counting and for the wire tag.
    pub fn kind(&self) -> MessageKind {
        match self {
            Message::Election { .. } => MessageKind::Election,
            Message::Alive { .. } => MessageKind::Alive,
            Message::Nominate { .. } => MessageKind::Nominate,
            Message::Failover { .. } => MessageKind::Failover,
            Message::Elected { .. } => MessageKind::Elected,
            Message::Invite { .. } => MessageKind::Invite,
            Message::Accept { .. } => MessageKind::Accept,
            Message::Redirect { .. } => MessageKind::Redirect,
            Message::RingElection { .. } => MessageKind::RingElection,
            Message::RingElected { .. } => MessageKind::RingElected,
            Message::Heartbeat { .. } => MessageKind::Heartbeat,
            Message::QuorumRequest { .. } => MessageKind::QuorumRequest,
            Message::QuorumRenew { .. } => MessageKind::QuorumRenew,
            Message::QuorumAck { .. } => MessageKind::QuorumAck,
            Message::QuorumNack { .. } => MessageKind::QuorumNack,
            Message::QuorumRelease { .. } => MessageKind::QuorumRelease,
            Message::Candidacy { .. } => MessageKind::Candidacy,
        }
    }
}

/// The kind of a [`Message`], without its fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MessageKind {
    /// [`Message::Election`]
    Election,
    /// [`Message::Alive`]
    Alive,
    /// [`Message::Nominate`]
    Nominate,
    /// [`Message::Failover`]
    Failover,
    /// [`Message::Elected`]
    Elected,
    /// [`Message::Invite`]
    Invite,
    /// [`Message::Accept`]
    Accept,
    /// [`Message::Redirect`]
    Redirect,
    /// [`Message::RingElection`]
    RingElection,
    /// [`Message::RingElected`]
    RingElected,
    /// [`Message::Heartbeat`]
    Heartbeat,
    /// [`Message::QuorumRequest`]
    QuorumRequest,
    /// [`Message::QuorumRenew`]
    QuorumRenew,
    /// [`Message::QuorumAck`]
    QuorumAck,
    /// [`Message::QuorumNack`]
    QuorumNack,
    /// [`Message::QuorumRelease`]
    QuorumRelease,
    /// [`Message::Candidacy`]
    Candidacy,
}

impl MessageKind {
    /// Every kind, in tag order.
    pub const ALL: [MessageKind; 17] = [
        MessageKind::Election,
        MessageKind::Alive,
        MessageKind::Nominate,
        MessageKind::Failover,
        MessageKind::Elected,
        MessageKind::Invite,
        MessageKind::Accept,
        MessageKind::Redirect,
        MessageKind::RingElection,
        MessageKind::RingElected,
        MessageKind::Heartbeat,
        MessageKind::QuorumRequest,
        MessageKind::QuorumRenew,
        MessageKind::QuorumAck,
        MessageKind::QuorumNack,
        MessageKind::QuorumRelease,
        MessageKind::Candidacy,
    ];

    /// A dense index in `0..ALL.len()`, also the wire tag.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The kind whose [`index`](Self::index) is `index`.
    pub fn from_index(index: usize) -> Option<MessageKind> {
        Self::ALL.get(index).copied()
    }

    /// The kind's name, as written in the variant.
    pub const fn name(self) -> &'static str {
        match self {
            MessageKind::Election => "Election",
            MessageKind::Alive => "Alive",
            MessageKind::Nominate => "Nominate",
            MessageKind::Failover => "Failover",
            MessageKind::Elected => "Elected",
            MessageKind::Invite => "Invite",
            MessageKind::Accept => "Accept",
            MessageKind::Redirect => "Redirect",
            MessageKind::RingElection => "RingElection",
            MessageKind::RingElected => "RingElected",
            MessageKind::Heartbeat => "Heartbeat",
            MessageKind::QuorumRequest => "QuorumRequest",
            MessageKind::QuorumRenew => "QuorumRenew",
            MessageKind::QuorumAck => "QuorumAck",
            MessageKind::QuorumNack => "QuorumNack",
            MessageKind::QuorumRelease => "QuorumRelease",
            MessageKind::Candidacy => "Candidacy",
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
