//! The TCP transport: [`Envelope`] frames between the members of a cluster.

mod inbound;
mod outbound;
mod stats;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::types::PeerId;
use crate::wire::Envelope;

use inbound::accept_loop;
use outbound::{write_loop, Outgoing};
use stats::Counters;
pub use stats::TransportStats;

/// How the transport connects, in one place; the defaults are documented next
/// to the fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportOptions {
    /// How long one connection attempt may take. Default 1 s.
    pub connect_timeout: Duration,
    /// The first pause after a failed connection attempt. Default 50 ms.
    pub backoff_initial: Duration,
    /// The longest pause between attempts; the pause doubles up to it.
    /// Default 2 s.
    pub backoff_max: Duration,
    /// How many frames may wait for one peer; past it, sends fail at once.
    /// Default 4096.
    pub queue_len: usize,
    /// How long an accepted connection may take to say who it is. Default 5 s.
    pub hello_timeout: Duration,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            connect_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            queue_len: 4096,
            hello_timeout: Duration::from_secs(5),
        }
    }
}

/// What the transport hands to its driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransportEvent {
    /// A frame from `from` (never a `Hello`: those are consumed).
    Received {
        /// The sending member.
        from: PeerId,
        /// What it sent.
        envelope: Envelope,
    },
    /// `envelope` could not be handed to `to`: no connection could be made
    /// (refused, timed out, or the peer is in back-off after failures), or
    /// the connection broke while writing. Drivers report the peer
    /// unreachable to the state machine the envelope came from.
    Undelivered {
        /// The peer.
        to: PeerId,
        /// What was not delivered.
        envelope: Envelope,
    },
}

/// A digest of a membership, sent in every `Hello`: processes configured with
/// different member lists refuse each other. FNV-1a over the sorted ids, so
/// it is the same on every platform and build.
pub fn cluster_digest(members: impl IntoIterator<Item = PeerId>) -> u64 {
    let mut ids: Vec<u64> = members.into_iter().map(PeerId::get).collect();
    ids.sort_unstable();
    ids.dedup();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for byte in id.to_be_bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

struct Shared {
    id: PeerId,
    cluster: u64,
    members: Vec<PeerId>,
    options: TransportOptions,
    counters: Counters,
    isolated: AtomicBool,
    events: mpsc::Sender<TransportEvent>,
    stop: CancellationToken,
}

impl Shared {
    fn isolated(&self) -> bool {
        self.isolated.load(Ordering::SeqCst)
    }

    async fn undelivered(&self, to: PeerId, envelope: Envelope) {
        Counters::bump(&self.counters.undelivered);
        let _ = self
            .events
            .send(TransportEvent::Undelivered { to, envelope })
            .await;
    }
}

/// A process's end of the TCP mesh of its cluster.
///
/// It listens on one address and keeps one outgoing connection per peer,
/// made on first use and made again after failures with exponential back-off
/// ([`TransportOptions`]). Every outgoing connection starts with a `Hello`
/// naming this process and a digest of the membership ([`cluster_digest`]);
/// accepted connections that do not start with a valid one from a member are
/// closed. Frames are [`Envelope`]s in the [`wire`](crate::wire) format, at
/// most [`wire::MAX_FRAME_LEN`](crate::wire::MAX_FRAME_LEN) bytes. A frame
/// that does not decode is dropped and counted by cause, and the connection
/// goes on; a length prefix over the bound closes the connection (a stream
/// cannot be resynchronised). Nothing a peer sends makes the transport panic.
///
/// Sends never wait: each peer has a bounded queue. Envelopes that cannot be
/// delivered (queue full, connection refused or timed out, peer in back-off,
/// connection broken while writing) come back as
/// [`TransportEvent::Undelivered`] or as the `Err` of [`send`](Self::send), so
/// that the driver can tell its state machine the peer is unreachable. An
/// envelope written to a connection that the peer then drops is lost
/// silently; the algorithms' timeouts cover that.
///
/// Dropping the transport stops its tasks and closes its connections.
pub struct Transport {
    shared: Arc<Shared>,
    queues: HashMap<PeerId, mpsc::Sender<Outgoing>>,
    local_addr: SocketAddr,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("id", &self.shared.id)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Drop for Transport {
    fn drop(&mut self) {
        self.shared.stop.cancel();
    }
}

impl Transport {
    /// Listens on `listen` as member `id` of a cluster whose members are
    /// reached at `peers` (every member; the entry for `id` itself is only
    /// used for the digest). Returns the transport and the channel of what
    /// it receives. Must be called inside a Tokio runtime.
    pub async fn bind(
        id: PeerId,
        listen: SocketAddr,
        peers: &BTreeMap<PeerId, SocketAddr>,
        options: TransportOptions,
    ) -> io::Result<(Transport, mpsc::Receiver<TransportEvent>)> {
        let listener = TcpListener::bind(listen).await?;
        Transport::with_listener(id, listener, peers, options)
    }

    /// Like [`bind`](Self::bind) with a listener bound already (tests bind
    /// every member's listener on port 0 first, then build the address map).
    pub fn with_listener(
        id: PeerId,
        listener: TcpListener,
        peers: &BTreeMap<PeerId, SocketAddr>,
        options: TransportOptions,
    ) -> io::Result<(Transport, mpsc::Receiver<TransportEvent>)> {
        let local_addr = listener.local_addr()?;
        let mut members: Vec<PeerId> = peers.keys().copied().collect();
        if !members.contains(&id) {
            members.push(id);
        }
        members.sort_unstable();
        let (events, events_rx) = mpsc::channel(4096);
        let shared = Arc::new(Shared {
            id,
            cluster: cluster_digest(members.iter().copied()),
            members,
            options,
            counters: Counters::default(),
            isolated: AtomicBool::new(false),
            events,
            stop: CancellationToken::new(),
        });
        let mut queues = HashMap::new();
        for (peer, addr) in peers {
            if *peer == id {
                continue;
            }
            let (tx, rx) = mpsc::channel(shared.options.queue_len.max(1));
            queues.insert(*peer, tx);
            tokio::spawn(write_loop(shared.clone(), *peer, *addr, rx));
        }
        tokio::spawn(accept_loop(shared.clone(), listener));
        Ok((
            Transport {
                shared,
                queues,
                local_addr,
            },
            events_rx,
        ))
    }

    /// The address this transport listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This process.
    pub fn id(&self) -> PeerId {
        self.shared.id
    }

    /// Queues `envelope` for `to`. Fails at once, handing the envelope back,
    /// if `to` is no peer or its queue is full.
    pub fn send(&self, to: PeerId, envelope: Envelope) -> Result<(), Envelope> {
        let Some(queue) = self.queues.get(&to) else {
            return Err(envelope);
        };
        match queue.try_send(Outgoing::Envelope(envelope)) {
            Ok(()) => Ok(()),
            Err(
                mpsc::error::TrySendError::Full(Outgoing::Envelope(e))
                | mpsc::error::TrySendError::Closed(Outgoing::Envelope(e)),
            ) => {
                Counters::bump(&self.shared.counters.undelivered);
                Err(e)
            }
            Err(_) => Ok(()),
        }
    }

    /// Waits until everything queued so far has been written to its
    /// connection (or given up as undelivered). A process about to exit
    /// calls it so that its last words (a release) leave.
    pub async fn flush(&self) {
        let mut waits = Vec::new();
        for queue in self.queues.values() {
            let (tx, rx) = oneshot::channel();
            if queue.send(Outgoing::Flush(tx)).await.is_ok() {
                waits.push(rx);
            }
        }
        for rx in waits {
            let _ = rx.await;
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> TransportStats {
        self.shared.counters.snapshot()
    }

    /// A fault for tests: while isolated, every frame in or out is dropped
    /// silently (and counted), as in a network partition that blackholes
    /// packets; connections stay open.
    pub fn set_isolated(&self, isolated: bool) {
        self.shared.isolated.store(isolated, Ordering::SeqCst);
    }
}
