//! A TCP proxy that can cut or black-hole the link to a server.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};

use crate::error::{HarnessError, Result};
use crate::os::listen_loopback;

/// What the proxy currently does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Bytes are forwarded both ways.
    Healthy,
    /// Every connection is closed and new ones are refused (the listening
    /// socket is closed, so connecting fails with "connection refused").
    Cut,
    /// Connections stay open and new ones are accepted, but no byte passes in
    /// either direction: they are held back, in order, and delivered late once the
    /// link heals (as TCP retransmits across a dead route that comes back).
    Blackhole,
}

/// A request from the handle to the accept task.
struct Command {
    state: LinkState,
    done: oneshot::Sender<Result<()>>,
}

/// Counters shared between the handle and the tasks.
#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    open: AtomicUsize,
}

/// A loopback TCP proxy in front of one upstream address, with fault
/// injection.
///
/// Clients connect to [`addr`](Self::addr); each accepted connection opens
/// its own connection to the upstream. [`cut`](Self::cut),
/// [`blackhole`](Self::blackhole) and [`heal`](Self::heal) change what happens
/// to traffic and return once the change is in force. Dropping the proxy
/// closes its listener and every connection.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    commands: mpsc::Sender<Command>,
    state: watch::Receiver<LinkState>,
    counters: Arc<Counters>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy on a free loopback port that forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let (listener, addr) = listen_loopback("the proxy listener").await?;
        let (commands, command_rx) = mpsc::channel(4);
        let (state_tx, state) = watch::channel(LinkState::Healthy);
        let counters = Arc::new(Counters::default());
        let task = tokio::spawn(accept_loop(AcceptLoop {
            listener: Some(listener),
            addr,
            upstream,
            commands: command_rx,
            state: state_tx,
            counters: Arc::clone(&counters),
            connections: JoinSet::new(),
        }));
        Ok(TcpProxy {
            addr,
            upstream,
            commands,
            state,
            counters,
            task,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address traffic is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// What the proxy does with traffic right now.
    pub fn state(&self) -> LinkState {
        *self.state.borrow()
    }

    /// How many client connections the proxy has accepted since it started.
    pub fn connections_accepted(&self) -> u64 {
        self.counters.accepted.load(Ordering::SeqCst)
    }

    /// How many client connections are open right now.
    pub fn open_connections(&self) -> usize {
        self.counters.open.load(Ordering::SeqCst)
    }

    /// Closes every open connection and refuses new ones until
    /// [`heal`](Self::heal). Returns once all connections are closed.
    pub async fn cut(&self) -> Result<()> {
        self.command(LinkState::Cut).await
    }

    /// Keeps connections open (and accepts new ones) but lets no byte through in
    /// either direction until [`heal`](Self::heal): what was sent meanwhile is held
    /// back and delivered late, in order.
    pub async fn blackhole(&self) -> Result<()> {
        self.command(LinkState::Blackhole).await
    }

    /// Restores normal forwarding; after a cut the listener is opened again on
    /// the same port. Bytes held back while black-holed are delivered now.
    pub async fn heal(&self) -> Result<()> {
        self.command(LinkState::Healthy).await
    }

    async fn command(&self, state: LinkState) -> Result<()> {
        let stopped = || HarnessError::not_running(format!("the proxy on {}", self.addr));
        let (done, reply) = oneshot::channel();
        self.commands
            .send(Command { state, done })
            .await
            .map_err(|_| stopped())?;
        reply.await.map_err(|_| stopped())?
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Aborting the accept task drops its listener and its JoinSet, which
        // aborts every connection task and so closes every socket.
        self.task.abort();
    }
}

struct AcceptLoop {
    listener: Option<TcpListener>,
    addr: SocketAddr,
    upstream: SocketAddr,
    commands: mpsc::Receiver<Command>,
    state: watch::Sender<LinkState>,
    counters: Arc<Counters>,
    connections: JoinSet<()>,
}

async fn accept_loop(mut this: AcceptLoop) {
    loop {
        tokio::select! {
            command = this.commands.recv() => {
                let Some(command) = command else { return };
                let result = this.apply(command.state).await;
                let _ = command.done.send(result);
            }
            accepted = accept(this.listener.as_ref()) => {
                let Ok((client, _)) = accepted else {
                    // Out of descriptors or similar: back off instead of spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                    continue;
                };
                {
                    this.counters.accepted.fetch_add(1, Ordering::SeqCst);
                    this.counters.open.fetch_add(1, Ordering::SeqCst);
                    let guard = OpenGuard(Arc::clone(&this.counters));
                    let state = this.state.subscribe();
                    let upstream = this.upstream;
                    this.connections.spawn(async move {
                        let _guard = guard;
                        forward(client, upstream, state).await;
                    });
                }
            }
            Some(_) = this.connections.join_next(), if !this.connections.is_empty() => {}
        }
    }
}

/// Accepts on the listener, or waits forever while there is none (cut).
async fn accept(listener: Option<&TcpListener>) -> std::io::Result<(TcpStream, SocketAddr)> {
    match listener {
        Some(listener) => listener.accept().await,
        None => std::future::pending().await,
    }
}

impl AcceptLoop {
    async fn apply(&mut self, state: LinkState) -> Result<()> {
        match state {
            LinkState::Cut => {
                self.state.send_replace(LinkState::Cut);
                self.listener = None;
                self.connections.abort_all();
                while self.connections.join_next().await.is_some() {}
            }
            LinkState::Blackhole | LinkState::Healthy => {
                if self.listener.is_none() {
                    self.listener = Some(rebind(self.addr)?);
                }
                self.state.send_replace(state);
            }
        }
        Ok(())
    }
}

/// Opens the listener again on the same address after a cut.
fn rebind(addr: SocketAddr) -> Result<TcpListener> {
    let listen = || {
        let socket = TcpSocket::new_v4()?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(128)
    };
    listen().map_err(|e| HarnessError::io(format!("reopening the proxy listener on {addr}"), e))
}

/// Decrements the open-connection count when a connection task ends or is
/// aborted.
struct OpenGuard(Arc<Counters>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn forward(client: TcpStream, upstream: SocketAddr, state: watch::Receiver<LinkState>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, state.clone()),
        pump(server_read, client_write, state),
    );
}

/// Copies one direction in order, holding bytes back while the link is black-holed:
/// nothing is read from the sender then (its socket buffers fill and its writes
/// block, as behind a dead route) and what was read just before is written only
/// once the link heals. A real network cannot drop bytes out of the middle of a TCP
/// stream: they are retransmitted and arrive late, or the connection breaks.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut state: watch::Receiver<LinkState>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !passing(&mut state).await {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !passing(&mut state).await || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    // The end of the stream is held back as well, until the link heals.
    if passing(&mut state).await {
        let _ = to.shutdown().await;
    }
}

/// Waits while the link is black-holed; false if the proxy is gone.
async fn passing(state: &mut watch::Receiver<LinkState>) -> bool {
    while *state.borrow_and_update() == LinkState::Blackhole {
        if state.changed().await.is_err() {
            return false;
        }
    }
    true
}
