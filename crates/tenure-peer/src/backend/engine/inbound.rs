//! What the engine does with what the transport delivered, or could not.

use tenure_core::ElectionName;

use super::handover::HandoverAnswer;
use super::seat::RemoteSeat;
use super::Engine;
use crate::machine::ElectionAlgorithm;
use crate::transport::TransportEvent;
use crate::wire::Envelope;

impl Engine {
    pub(super) fn transport_event(&mut self, ev: TransportEvent) {
        match ev {
            TransportEvent::Received { from, envelope } => match envelope {
                Envelope::Routed { channel, msg } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        tracing::debug!(%from, "message for an invalid election name dropped");
                        return;
                    };
                    if !self.ensure_seat(&name) {
                        return;
                    }
                    let now = self.clock.now();
                    tracing::trace!(election = %name, %from, ?msg, "received");
                    if let Some(seat) = self.seats.get_mut(&name) {
                        seat.machine.handle_message(now, from, msg);
                    }
                    self.settle(&name);
                }
                Envelope::Seat {
                    channel,
                    epoch,
                    holder,
                    value,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    if !self.config.members.contains_key(&from) || !self.ensure_seat(&name) {
                        return;
                    }
                    if let Some(seat) = self.seats.get_mut(&name) {
                        let newer = seat.remote.as_ref().is_none_or(|r| epoch >= r.epoch);
                        if newer {
                            seat.remote = Some(RemoteSeat {
                                leader: from,
                                epoch,
                                holder,
                                value,
                            });
                        }
                    }
                    self.publish(&name);
                }
                Envelope::HandoverAsk {
                    channel,
                    request,
                    to,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    let answer = self
                        .seats
                        .get(&name)
                        .map(|s| s.handover_answer(to.as_deref()))
                        .unwrap_or_default();
                    let _ = self.transport.send(
                        from,
                        Envelope::HandoverAnswer {
                            channel,
                            request,
                            holding: answer.holder.unwrap_or_default(),
                            waiter: answer.waiter,
                        },
                    );
                }
                Envelope::HandoverAnswer {
                    request,
                    holding,
                    waiter,
                    ..
                } => {
                    if let Some(answers) = self.handover_requests.get(&request) {
                        let answer = HandoverAnswer {
                            holder: (holding.epoch > 0).then_some(holding),
                            waiter,
                        };
                        if answers.send((from, answer)).is_err() {
                            self.handover_requests.remove(&request);
                        }
                    }
                }
                Envelope::Handover {
                    channel,
                    epoch,
                    node,
                    to,
                } => {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    if self.config.members.contains_key(&from) {
                        self.handover(&name, epoch, node, to);
                    }
                }
                Envelope::Hello { .. } => {}
            },
            TransportEvent::Undelivered { to, envelope } => {
                if let Envelope::Routed { channel, .. } = envelope {
                    let Ok(name) = ElectionName::new(&channel) else {
                        return;
                    };
                    let now = self.clock.now();
                    if let Some(seat) = self.seats.get_mut(&name) {
                        seat.machine.forget_interest(now, to);
                        seat.machine.peer_unreachable(now, to);
                        self.settle(&name);
                    }
                }
            }
        }
    }
}
