//! Receiving: accepting connections, checking their `Hello`, reading frames.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use super::stats::Counters;
use super::{Shared, TransportEvent};
use crate::wire::{self, DecodeError, Envelope};

pub(super) async fn accept_loop(shared: Arc<Shared>, listener: TcpListener) {
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
