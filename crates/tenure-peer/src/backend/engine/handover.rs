//! Handovers (clause 14): answers to a handover question, a pending one, taking an order.

use tenure_core::{ElectionName, FencingToken};
use tokio::time::Instant as TokioInstant;

use super::Engine;
use crate::machine::ElectionAlgorithm;
use crate::transport::Transport;
use crate::types::{Instant, PeerId};
use crate::wire::{Envelope, Holding};

/// What a node says about an election when a handover is asked for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct HandoverAnswer {
    /// The local holder: epoch, candidate id and value.
    pub(crate) holder: Option<Holding>,
    /// The priority of the waiter asked for (or of the best waiter), if it
    /// waits on this node.
    pub(crate) waiter: Option<i16>,
}

/// The request number of a handover question, this node's own answer, and
/// how many other members were asked.
pub(crate) struct HandoverAsked {
    pub(crate) request: u64,
    pub(crate) local: HandoverAnswer,
    pub(crate) asked: usize,
    /// The other node this node follows as leader of the election, if any.
    pub(crate) leader: Option<PeerId>,
}

/// A handover that was asked for and has not been used up yet.
pub(super) struct PendingHandover {
    /// The grant it ends.
    pub(super) epoch: u64,
    /// The node the next grant goes to, if named.
    pub(super) node: Option<PeerId>,
    /// The waiter on `node` the next grant goes to, if named.
    pub(super) to: Option<String>,
    /// When this node learnt of it.
    pub(super) since: Instant,
    /// When it lapses if nobody took the seat meanwhile.
    pub(super) until: TokioInstant,
}

/// Tells every other member that the grant `epoch` of `name` is to go to
/// `node` (and `to` there). The holder's node sends it before its release,
/// on the same connections, so every node defers before it can campaign.
pub(super) fn broadcast_handover(
    transport: &Transport,
    members: impl Iterator<Item = PeerId>,
    name: &ElectionName,
    epoch: u64,
    node: Option<PeerId>,
    to: Option<&str>,
) {
    for peer in members {
        let order = Envelope::Handover {
            channel: name.as_str().to_owned(),
            epoch,
            node,
            to: to.map(str::to_owned),
        };
        let _ = transport.send(peer, order);
    }
}

impl Engine {
    /// A handover of the grant `epoch` of `name` was asked for: the holder,
    /// if it is here, is told it is preempted (also one that opted out: a
    /// handover is asked for by name), and until the seat is taken again
    /// (at most two leases) every other node defers to `node`, whose next
    /// grant goes to `to` if it still waits then.
    pub(super) fn handover(
        &mut self,
        name: &ElectionName,
        epoch: u64,
        node: Option<PeerId>,
        to: Option<String>,
    ) {
        if !self.ensure_seat(name) {
            return;
        }
        let me = self.me();
        let now = self.clock.now();
        let until = TokioInstant::now() + self.config.timing.lease * 2;
        let Some(seat) = self.seats.get_mut(name) else {
            return;
        };
        // An order for a grant already superseded (a copy that came late).
        let stale = seat.machine.leader().is_some_and(|l| l.epoch > epoch)
            || seat.granted.is_some_and(|g| g > epoch);
        if stale {
            return;
        }
        if let Some(h) = seat.holder.as_mut().filter(|h| h.token == epoch) {
            if !h.preempted {
                // This is the holder's node: pass the order on to everyone
                // before the release can leave, then tell the holder.
                let others = self.config.members.keys().copied().filter(|p| *p != me);
                broadcast_handover(&self.transport, others, name, epoch, node, to.as_deref());
                h.preempted = true;
                if let Some(entry) = self.sessions.get(&h.session) {
                    tracing::debug!(election = %name, epoch, "handover: telling the holder");
                    entry.events.preempted(name, FencingToken(epoch));
                }
            }
        }
        seat.handover = Some(PendingHandover {
            epoch,
            node,
            to,
            since: now,
            until,
        });
        self.settle(name);
    }
}
