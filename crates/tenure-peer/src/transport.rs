//! The TCP transport: [`Envelope`] frames between the members of a cluster.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::types::PeerId;
use crate::wire::{self, DecodeError, Envelope};

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

/// Counters of a transport, as of a [`Transport::stats`] call.
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
    /// [`wire::MAX_FRAME_LEN`] bytes (a stream cannot be resynchronised).
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
    /// [`Transport::set_isolated`].
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
struct Counters {
    frames_sent: AtomicU64,
    frames_received: AtomicU64,
    malformed: Mutex<BTreeMap<&'static str, u64>>,
    oversized: AtomicU64,
    rejected_connections: AtomicU64,
    connect_failures: AtomicU64,
    undelivered: AtomicU64,
    encode_failures: AtomicU64,
    dropped_isolated: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn malformed(&self, error: &DecodeError) {
        self.malformed_label(error.label());
    }

    fn malformed_label(&self, label: &'static str) {
        let mut map = match self.malformed.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        *map.entry(label).or_insert(0) += 1;
    }

    fn snapshot(&self) -> TransportStats {
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
/// closed. Frames are [`Envelope`]s in the [`wire`] format, at most
/// [`wire::MAX_FRAME_LEN`] bytes. A frame that does not decode is dropped and
/// counted by cause, and the connection goes on; a length prefix over the
/// bound closes the connection (a stream cannot be resynchronised). Nothing a
/// peer sends makes the transport panic.
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

/// What waits in a peer's queue.
enum Outgoing {
    Envelope(Envelope),
    /// Answered once everything queued before it was written or given up.
    Flush(oneshot::Sender<()>),
}

/// The back-off between connection attempts to one peer.
struct Backoff {
    next: Duration,
    initial: Duration,
    max: Duration,
    /// No attempt before this.
    until: Option<Instant>,
}

impl Backoff {
    fn new(options: &TransportOptions) -> Self {
        Backoff {
            next: options.backoff_initial,
            initial: options.backoff_initial,
            max: options.backoff_max.max(options.backoff_initial),
            until: None,
        }
    }

    fn waiting(&self) -> bool {
        self.until.is_some_and(|t| Instant::now() < t)
    }

    fn failed(&mut self) {
        self.until = Some(Instant::now() + self.next);
        self.next = self.next.saturating_mul(2).min(self.max);
    }

    fn succeeded(&mut self) {
        self.next = self.initial;
        self.until = None;
    }
}

async fn connect(shared: &Shared, addr: SocketAddr) -> io::Result<TcpStream> {
    let attempt = tokio::time::timeout(shared.options.connect_timeout, TcpStream::connect(addr));
    let mut stream = match attempt.await {
        Ok(r) => r?,
        Err(_) => return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out")),
    };
    stream.set_nodelay(true)?;
    let hello = wire::encode_envelope(&Envelope::Hello {
        from: shared.id,
        cluster: shared.cluster,
    })
    .map_err(io::Error::other)?;
    stream.write_all(&hello).await?;
    Ok(stream)
}

/// Waits until the peer closes (or breaks) a connection it never writes on.
async fn closed(stream: &mut Option<TcpStream>) {
    let Some(s) = stream.as_mut() else {
        return std::future::pending().await;
    };
    let mut byte = [0u8; 1];
    loop {
        match s.read(&mut byte).await {
            // The peer never writes on this connection; ignore it if it does.
            Ok(n) if n > 0 => continue,
            _ => return,
        }
    }
}

/// Owns the outgoing connection to one peer.
async fn write_loop(
    shared: Arc<Shared>,
    peer: PeerId,
    addr: SocketAddr,
    mut queue: mpsc::Receiver<Outgoing>,
) {
    let mut stream: Option<TcpStream> = None;
    let mut backoff = Backoff::new(&shared.options);
    loop {
        let first = tokio::select! {
            next = queue.recv() => match next {
                Some(e) => e,
                None => return,
            },
            _ = closed(&mut stream) => {
                tracing::debug!(%peer, "peer closed the connection");
                stream = None;
                continue;
            }
            _ = shared.stop.cancelled() => return,
        };
        // Take what else is queued (up to a flush), to write it in one go.
        let mut batch = Vec::new();
        let mut flushes = Vec::new();
        match first {
            Outgoing::Envelope(e) => batch.push(e),
            Outgoing::Flush(tx) => flushes.push(tx),
        }
        while batch.len() < 256 && flushes.is_empty() {
            match queue.try_recv() {
                Ok(Outgoing::Envelope(e)) => batch.push(e),
                Ok(Outgoing::Flush(tx)) => flushes.push(tx),
                Err(_) => break,
            }
        }
        if !batch.is_empty()
            && !deliver(&shared, peer, addr, &mut stream, &mut backoff, batch).await
        {
            return;
        }
        for tx in flushes {
            let _ = tx.send(());
        }
    }
}

/// Writes `batch` to the peer, connecting first if needed; false when the
/// transport stops meanwhile.
async fn deliver(
    shared: &Shared,
    peer: PeerId,
    addr: SocketAddr,
    stream: &mut Option<TcpStream>,
    backoff: &mut Backoff,
    batch: Vec<Envelope>,
) -> bool {
    if shared.isolated() {
        for _ in &batch {
            Counters::bump(&shared.counters.dropped_isolated);
        }
        return true;
    }
    if stream.is_none() {
        if backoff.waiting() {
            for e in batch {
                shared.undelivered(peer, e).await;
            }
            return true;
        }
        let attempt = tokio::select! {
            r = connect(shared, addr) => r,
            _ = shared.stop.cancelled() => return false,
        };
        match attempt {
            Ok(s) => {
                backoff.succeeded();
                *stream = Some(s);
            }
            Err(e) => {
                tracing::debug!(%peer, %addr, error = %e, "could not connect");
                Counters::bump(&shared.counters.connect_failures);
                backoff.failed();
                for e in batch {
                    shared.undelivered(peer, e).await;
                }
                return true;
            }
        }
    }
    let mut bytes = Vec::new();
    let mut written = Vec::new();
    for e in batch {
        match wire::encode_envelope(&e) {
            Ok(frame) => {
                bytes.extend_from_slice(&frame);
                written.push(e);
            }
            Err(err) => {
                tracing::warn!(%peer, error = %err, "envelope not encodable; dropped");
                Counters::bump(&shared.counters.encode_failures);
            }
        }
    }
    let Some(s) = stream.as_mut() else {
        return true;
    };
    let result = tokio::select! {
        r = s.write_all(&bytes) => r,
        _ = shared.stop.cancelled() => return false,
    };
    match result {
        Ok(()) => {
            shared
                .counters
                .frames_sent
                .fetch_add(written.len() as u64, Ordering::Relaxed);
        }
        Err(e) => {
            tracing::debug!(%peer, error = %e, "connection broke while writing");
            *stream = None;
            backoff.failed();
            for e in written {
                shared.undelivered(peer, e).await;
            }
        }
    }
    true
}

async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shared.stop.cancelled() => return,
        };
        match accepted {
            Ok((stream, remote)) => {
                let _ = stream.set_nodelay(true);
                tokio::spawn(read_loop(shared.clone(), stream, remote));
            }
            Err(e) => {
                // E.g. too many open files: pause rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    _ = shared.stop.cancelled() => return,
                }
            }
        }
    }
}

/// Reads frames from `stream` into `buf` until one whole frame is there;
/// returns its length. `Ok(None)` at a clean end of stream.
async fn next_frame(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<usize>, FrameError> {
    loop {
        match wire::frame_len(buf) {
            Ok(Some(total)) => return Ok(Some(total)),
            Ok(None) => {}
            Err(e) => return Err(FrameError::Oversized(e)),
        }
        let mut chunk = [0u8; 8192];
        let n = stream.read(&mut chunk).await.map_err(FrameError::Io)?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into()))
            };
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
    }
}

enum FrameError {
    Oversized(DecodeError),
    Io(io::Error),
}

async fn read_loop(shared: Arc<Shared>, mut stream: TcpStream, remote: SocketAddr) {
    let mut buf = Vec::new();
    let hello = tokio::select! {
        r = tokio::time::timeout(shared.options.hello_timeout, next_frame(&mut stream, &mut buf)) => r,
        _ = shared.stop.cancelled() => return,
    };
    let (from, hello_len) = match hello {
        Ok(Ok(Some(total))) => {
            let frame = buf.get(..total).unwrap_or(&[]);
            match wire::decode_envelope(frame) {
                Ok(Envelope::Hello { from, cluster })
                    if cluster == shared.cluster
                        && from != shared.id
                        && shared.members.binary_search(&from).is_ok() =>
                {
                    (from, total)
                }
                other => {
                    if let Err(e) = &other {
                        shared.counters.malformed(e);
                    }
                    tracing::debug!(%remote, ?other, "connection refused at the handshake");
                    Counters::bump(&shared.counters.rejected_connections);
                    return;
                }
            }
        }
        Ok(Err(FrameError::Oversized(_))) => {
            Counters::bump(&shared.counters.oversized);
            Counters::bump(&shared.counters.rejected_connections);
            return;
        }
        _ => {
            Counters::bump(&shared.counters.rejected_connections);
            return;
        }
    };
    buf.drain(..hello_len.min(buf.len()));
    loop {
        let next = tokio::select! {
            r = next_frame(&mut stream, &mut buf) => r,
            _ = shared.stop.cancelled() => return,
        };
        let total = match next {
            Ok(Some(total)) => total,
            Ok(None) => return,
            Err(FrameError::Oversized(e)) => {
                tracing::warn!(%from, error = %e, "oversized frame; closing the connection");
                Counters::bump(&shared.counters.oversized);
                return;
            }
            Err(FrameError::Io(e)) => {
                tracing::debug!(%from, error = %e, "connection ended");
                return;
            }
        };
        let decoded = wire::decode_envelope(buf.get(..total).unwrap_or(&[]));
        buf.drain(..total.min(buf.len()));
        if shared.isolated() {
            Counters::bump(&shared.counters.dropped_isolated);
            continue;
        }
        match decoded {
            Ok(Envelope::Hello { .. }) => {
                // Only the first frame may be a Hello.
                shared.counters.malformed_label("unexpected_hello");
            }
            Ok(envelope) => {
                Counters::bump(&shared.counters.frames_received);
                let event = TransportEvent::Received { from, envelope };
                let sent = tokio::select! {
                    r = shared.events.send(event) => r,
                    _ = shared.stop.cancelled() => return,
                };
                if sent.is_err() {
                    return;
                }
            }
            Err(e) => {
                tracing::debug!(%from, error = %e, "malformed frame dropped");
                shared.counters.malformed(&e);
            }
        }
    }
}
