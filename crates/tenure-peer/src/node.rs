//! Running one state machine over the TCP transport with the real clock.

use std::collections::BTreeMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::machine::ElectionAlgorithm;
use crate::transport::{Transport, TransportEvent, TransportOptions, TransportStats};
use crate::types::{Event, Instant, Leader, PeerId};
use crate::wire::Envelope;

/// Converts between Tokio's clock and the [`Instant`]s state machines use:
/// nanoseconds since the clock was made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock {
    origin: tokio::time::Instant,
}

impl Clock {
    pub(crate) fn new() -> Self {
        Clock {
            origin: tokio::time::Instant::now(),
        }
    }

    pub(crate) fn now(&self) -> Instant {
        self.at(tokio::time::Instant::now())
    }

    pub(crate) fn at(&self, t: tokio::time::Instant) -> Instant {
        let nanos = t.saturating_duration_since(self.origin).as_nanos();
        Instant::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    pub(crate) fn tokio(&self, at: Instant) -> tokio::time::Instant {
        self.origin + at.since_origin()
    }
}

/// Sleeps until `at`, or forever without one.
pub(crate) async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// One state machine on the TCP transport, driven by the real clock.
///
/// A task feeds the machine every frame that arrives (on the channel with the
/// empty name), reports envelopes the transport could not deliver as
/// [`peer_unreachable`](ElectionAlgorithm::peer_unreachable), fires its
/// timers at [`poll_timeout`](ElectionAlgorithm::poll_timeout), and after every
/// input sends what it produced and publishes its leader view. Dropping the
/// node (or [`shutdown`](Self::shutdown)) stops the task and closes the
/// transport, as a crash would.
///
/// The machine's [`durable`](ElectionAlgorithm::durable) state is not
/// persisted: for the quorum guard, restart a node only after a lease.
pub struct PeerNode {
    id: PeerId,
    local_addr: SocketAddr,
    view: watch::Receiver<Option<Leader>>,
    log: Arc<Mutex<Vec<(Duration, Event)>>>,
    transport: Arc<Transport>,
    stop: CancellationToken,
}

impl fmt::Debug for PeerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerNode")
            .field("id", &self.id)
            .field("local_addr", &self.local_addr)
            .field("leader", &*self.view.borrow())
            .finish()
    }
}

impl Drop for PeerNode {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl PeerNode {
    /// Binds `listen` and starts `machine` as member `machine.id()` of the
    /// cluster whose members listen at `peers`.
    pub async fn spawn<A>(
        machine: A,
        listen: SocketAddr,
        peers: &BTreeMap<PeerId, SocketAddr>,
        options: TransportOptions,
    ) -> io::Result<PeerNode>
    where
        A: ElectionAlgorithm + Send + 'static,
    {
        let listener = TcpListener::bind(listen).await?;
        PeerNode::with_listener(machine, listener, peers, options)
    }

    /// Like [`spawn`](Self::spawn) with a listener bound already.
    pub fn with_listener<A>(
        machine: A,
        listener: TcpListener,
        peers: &BTreeMap<PeerId, SocketAddr>,
        options: TransportOptions,
    ) -> io::Result<PeerNode>
    where
        A: ElectionAlgorithm + Send + 'static,
    {
        let id = machine.id();
        let (transport, events) = Transport::with_listener(id, listener, peers, options)?;
        let transport = Arc::new(transport);
        let (view_tx, view) = watch::channel(None);
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let local_addr = transport.local_addr();
        tokio::spawn(drive(
            machine,
            transport.clone(),
            events,
            view_tx,
            log.clone(),
            stop.clone(),
        ));
        Ok(PeerNode {
            id,
            local_addr,
            view,
            log,
            transport,
            stop,
        })
    }

    /// This process.
    pub fn id(&self) -> PeerId {
        self.id
    }

    /// The address the node listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The leader the machine follows now (possibly this node).
    pub fn leader(&self) -> Option<Leader> {
        *self.view.borrow()
    }

    /// A receiver of every change of [`leader`](Self::leader).
    pub fn watch(&self) -> watch::Receiver<Option<Leader>> {
        self.view.clone()
    }

    /// Every event the machine reported, with the time since the node
    /// started.
    pub fn events(&self) -> Vec<(Duration, Event)> {
        match self.log.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The transport's counters.
    pub fn stats(&self) -> TransportStats {
        self.transport.stats()
    }

    /// See [`Transport::set_isolated`].
    pub fn set_isolated(&self, isolated: bool) {
        self.transport.set_isolated(isolated);
    }

    /// Stops the node, as a crash would (nothing is said to the others).
    pub fn shutdown(self) {
        drop(self);
    }
}

async fn drive<A: ElectionAlgorithm>(
    mut machine: A,
    transport: Arc<Transport>,
    mut events: mpsc::Receiver<TransportEvent>,
    view: watch::Sender<Option<Leader>>,
    log: Arc<Mutex<Vec<(Duration, Event)>>>,
    stop: CancellationToken,
) {
    let clock = Clock::new();
    machine.start(clock.now());
    loop {
        flush(&mut machine, &transport, &clock, &view, &log);
        let wake = machine.poll_timeout().map(|at| clock.tokio(at));
        tokio::select! {
            ev = events.recv() => match ev {
                Some(TransportEvent::Received { from, envelope: Envelope::Routed { channel, msg } })
                    if channel.is_empty() =>
                {
                    machine.handle_message(clock.now(), from, msg);
                }
                Some(TransportEvent::Undelivered { to, envelope: Envelope::Routed { .. } }) => {
                    machine.peer_unreachable(clock.now(), to);
                }
                Some(_) => {}
                None => return,
            },
            _ = sleep_until(wake) => machine.handle_timeout(clock.now()),
            _ = stop.cancelled() => return,
        }
    }
}

/// Sends what `machine` produced; sends that fail at once count as
/// unreachable peers (which may produce more to send).
fn flush<A: ElectionAlgorithm>(
    machine: &mut A,
    transport: &Transport,
    clock: &Clock,
    view: &watch::Sender<Option<Leader>>,
    log: &Mutex<Vec<(Duration, Event)>>,
) {
    for _ in 0..64 {
        let mut failed = Vec::new();
        while let Some((to, msg)) = machine.poll_transmit() {
            let envelope = Envelope::Routed {
                channel: String::new(),
                msg,
            };
            if transport.send(to, envelope).is_err() {
                failed.push(to);
            }
        }
        if failed.is_empty() {
            break;
        }
        for to in failed {
            machine.peer_unreachable(clock.now(), to);
        }
    }
    let since = clock.now().since_origin();
    while let Some(event) = machine.poll_event() {
        match log.lock() {
            Ok(mut g) => g.push((since, event)),
            Err(p) => p.into_inner().push((since, event)),
        }
    }
    view.send_if_modified(|v| {
        let now = machine.leader();
        let changed = *v != now;
        *v = now;
        changed
    });
}
