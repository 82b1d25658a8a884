//! The commands the backend's handles send the engine, and their dispatch.

use std::collections::BTreeSet;
use std::time::Duration;

use tenure_core::backend::{CampaignMode, SessionEvents};
use tenure_core::{Candidate, ElectionName, FencingToken, LeaderInfo, Result};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant as TokioInstant;

use super::handover::{broadcast_handover, HandoverAnswer, HandoverAsked};
use super::seat::CampaignReply;
use super::session::SessionEntry;
use super::Engine;
use crate::machine::ElectionAlgorithm;
use crate::types::PeerId;
use crate::wire::Envelope;

pub(crate) enum Command {
    OpenSession {
        ttl: Duration,
        events: SessionEvents,
        reply: oneshot::Sender<u64>,
    },
    KeepAlive {
        session: u64,
        reply: oneshot::Sender<Result<()>>,
    },
    Campaign {
        session: u64,
        election: ElectionName,
        candidate: Candidate,
        mode: CampaignMode,
        reply: CampaignReply,
    },
    Resign {
        session: u64,
        election: ElectionName,
        token: Option<FencingToken>,
        reply: oneshot::Sender<()>,
    },
    Close {
        session: u64,
        reply: oneshot::Sender<()>,
    },
    Leader {
        election: ElectionName,
        reply: oneshot::Sender<Option<LeaderInfo>>,
    },
    Observe {
        election: ElectionName,
        reply: oneshot::Sender<Result<watch::Receiver<Option<LeaderInfo>>>>,
    },
    Expire {
        session: u64,
        reply: oneshot::Sender<bool>,
    },
    /// Contract clause 14: ask every member about `election` for a handover
    /// (see [`HandoverAnswer`]); answers arrive on `answers`.
    HandoverAsk {
        election: ElectionName,
        to: Option<String>,
        answers: mpsc::UnboundedSender<(PeerId, HandoverAnswer)>,
        reply: oneshot::Sender<HandoverAsked>,
    },
    /// The answers of `request` are no longer wanted.
    HandoverDone { request: u64 },
    /// Contract clause 14: tell every member (this node included) that the
    /// holder of `epoch` is to step down, for `to` on `node` if named.
    Handover {
        election: ElectionName,
        epoch: u64,
        node: Option<PeerId>,
        to: Option<String>,
        reply: oneshot::Sender<()>,
    },
}

impl Engine {
    pub(super) fn command(&mut self, cmd: Command) {
        match cmd {
            Command::OpenSession { ttl, events, reply } => {
                self.next_session += 1;
                let n = self.next_session;
                self.sessions.insert(
                    n,
                    SessionEntry {
                        ttl,
                        events,
                        expires_at: TokioInstant::now() + ttl,
                        held: BTreeSet::new(),
                        keepalives: Vec::new(),
                    },
                );
                let _ = reply.send(n);
            }
            Command::KeepAlive { session, reply } => self.keep_alive(session, reply),
            Command::Campaign {
                session,
                election,
                candidate,
                mode,
                reply,
            } => self.campaign(session, election, candidate, mode, reply),
            Command::Resign {
                session,
                election,
                token,
                reply,
            } => {
                self.resign(session, &election, token);
                let _ = reply.send(());
            }
            Command::Close { session, reply } => {
                self.end_session(session, None);
                let _ = reply.send(());
            }
            Command::Leader { election, reply } => {
                let info = self.seats.get(&election).and_then(|s| self.info(s));
                let _ = reply.send(info);
            }
            Command::Observe { election, reply } => {
                let rx = if self.ensure_seat(&election) {
                    self.publish(&election);
                    self.seats
                        .get(&election)
                        .map(|s| s.watch.subscribe())
                        .ok_or_else(Engine::too_many)
                } else {
                    Err(Engine::too_many())
                };
                let _ = reply.send(rx);
            }
            Command::Expire { session, reply } => {
                let known = self.sessions.contains_key(&session);
                self.end_session(session, Some("expired by a test hook"));
                let _ = reply.send(known);
            }
            Command::HandoverAsk {
                election,
                to,
                answers,
                reply,
            } => {
                self.next_request += 1;
                let request = self.next_request;
                let local = self
                    .seats
                    .get(&election)
                    .map(|s| s.handover_answer(to.as_deref()))
                    .unwrap_or_default();
                let me = self.me();
                let mut asked = 0;
                for peer in self.config.members.keys().filter(|p| **p != me) {
                    let ask = Envelope::HandoverAsk {
                        channel: election.as_str().to_owned(),
                        request,
                        to: to.clone(),
                    };
                    if self.transport.send(*peer, ask).is_ok() {
                        asked += 1;
                    }
                }
                self.handover_requests.insert(request, answers);
                let leader = self
                    .seats
                    .get(&election)
                    .and_then(|s| s.machine.leader())
                    .map(|l| l.id)
                    .filter(|id| *id != me);
                let _ = reply.send(HandoverAsked {
                    request,
                    local,
                    asked,
                    leader,
                });
            }
            Command::HandoverDone { request } => {
                self.handover_requests.remove(&request);
            }
            Command::Handover {
                election,
                epoch,
                node,
                to,
                reply,
            } => {
                let me = self.me();
                // The holder's node passes the order on itself (in `handover`).
                let holds = self
                    .seats
                    .get(&election)
                    .and_then(|s| s.holder.as_ref())
                    .is_some_and(|h| h.token == epoch);
                let others = self
                    .config
                    .members
                    .keys()
                    .copied()
                    .filter(|p| *p != me && !holds);
                broadcast_handover(
                    &self.transport,
                    others,
                    &election,
                    epoch,
                    node,
                    to.as_deref(),
                );
                self.handover(&election, epoch, node, to);
                let _ = reply.send(());
            }
        }
    }
}
