//! Sending: a peer's queue, connecting with back-off, writing batches of frames.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::stats::Counters;
use super::{Shared, TransportOptions};
use crate::types::PeerId;
use crate::wire::{self, Envelope};

/// What waits in a peer's queue.
pub(super) enum Outgoing {
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
pub(super) async fn write_loop(
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
