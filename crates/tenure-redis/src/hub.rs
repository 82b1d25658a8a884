//! A pub/sub connection (one per backend, shared by every waiter and observer of the
//! process; one per sentinel for its announcements), with fan-out in-process to the
//! registrations of each channel. It is opened
//! on first use, pinged every [`PING_INTERVAL`], and re-opened (with back-off) when it
//! breaks; after re-subscribing it wakes every registration, since messages may have
//! been missed meanwhile.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tenure_core::backend::{lock, Requests};
use tenure_core::Retry;

use crate::target::Target;
use tokio::sync::{mpsc, watch};

/// How often the subscriber connection is checked with a `PING`.
const PING_INTERVAL: Duration = Duration::from_secs(1);

/// How many channels one `SUBSCRIBE` names when re-subscribing.
const SUBSCRIBE_BATCH: usize = 500;

/// The shared subscriber of a backend. Dropping the last handle stops its task.
pub(crate) struct Hub {
    state: Arc<Mutex<HubState>>,
    /// Channels whose registrations came or went, for the task to subscribe or not.
    commands: mpsc::UnboundedSender<String>,
    /// What the task needs, kept until the first registration starts it.
    start: Mutex<Option<Starter>>,
}

struct Starter {
    commands: mpsc::UnboundedReceiver<String>,
    target: Arc<Target>,
    connect_timeout: Duration,
    /// Counts, bounds and tags the requests (the pings are bounded only).
    requests: Arc<Requests<redis::RedisError>>,
}

#[derive(Default)]
struct HubState {
    channels: HashMap<String, Channel>,
    next_id: u64,
}

/// What a registration does with each message of its channel, and with an empty one
/// after a re-subscription (called on the hub's task, under the hub's lock: it must not
/// block or register).
pub(crate) type Handler = Arc<dyn Fn(&[u8]) + Send + Sync>;

struct Channel {
    handlers: HashMap<u64, Handler>,
    /// Whether the current connection has confirmed the subscription.
    subscribed: watch::Sender<bool>,
}

/// A registration on a channel; unregisters on drop.
pub(crate) struct Registration {
    state: Arc<Mutex<HubState>>,
    commands: mpsc::UnboundedSender<String>,
    channel: String,
    id: u64,
    subscribed: watch::Receiver<bool>,
}

impl Registration {
    /// Whether the channel's subscription is confirmed on the current connection.
    pub(crate) fn is_subscribed(&self) -> bool {
        *self.subscribed.borrow()
    }

    /// Wait until the subscription is lost (at once if it is not confirmed).
    pub(crate) async fn unsubscribed(&self) {
        self.wait_for(false).await
    }

    /// Wait until the subscription is confirmed.
    pub(crate) async fn subscribed(&self) {
        self.wait_for(true).await
    }

    async fn wait_for(&self, state: bool) {
        let mut rx = self.subscribed.clone();
        if rx.wait_for(|s| *s == state).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut st = lock(&self.state);
        let Some(ch) = st.channels.get_mut(&self.channel) else {
            return;
        };
        ch.handlers.remove(&self.id);
        if ch.handlers.is_empty() {
            st.channels.remove(&self.channel);
            let _ = self.commands.send(self.channel.clone());
        }
    }
}

impl Hub {
    pub(crate) fn new(
        target: Arc<Target>,
        connect_timeout: Duration,
        requests: Arc<Requests<redis::RedisError>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Hub {
            state: Arc::default(),
            commands: tx,
            start: Mutex::new(Some(Starter {
                commands: rx,
                target,
                connect_timeout,
                requests,
            })),
        }
    }

    /// Register `handler` for every message on `channel`.
    pub(crate) fn listener(&self, channel: &str, handler: Handler) -> Registration {
        if let Some(s) = lock(&self.start).take() {
            tokio::spawn(run(self.state.clone(), s));
        }
        let mut st = lock(&self.state);
        st.next_id += 1;
        let id = st.next_id;
        let ch = st.channels.entry(channel.to_string()).or_insert_with(|| {
            let _ = self.commands.send(channel.to_string());
            Channel {
                handlers: HashMap::new(),
                subscribed: watch::Sender::new(false),
            }
        });
        ch.handlers.insert(id, handler);
        let subscribed = ch.subscribed.subscribe();
        drop(st);
        Registration {
            state: self.state.clone(),
            commands: self.commands.clone(),
            channel: channel.to_string(),
            id,
            subscribed,
        }
    }
}

/// The subscriber task: connect, subscribe, dispatch, ping; reconnect when broken.
async fn run(state: Arc<Mutex<HubState>>, mut s: Starter) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut reconnected = false;
    loop {
        if attempt > 0 {
            let pause = tokio::time::sleep(retry.delay(attempt - 1));
            if unless_stopped(&mut s.commands, pause).await.is_none() {
                return;
            }
        }
        attempt = attempt.saturating_add(1);
        let target = s.target.clone();
        let connect = tokio::time::timeout(s.connect_timeout, async move {
            let client = target.client().await.map_err(|e| e.to_string())?;
            client.get_async_pubsub().await.map_err(|e| e.to_string())
        });
        let pubsub = match unless_stopped(&mut s.commands, connect).await {
            None => return,
            Some(Ok(Ok(p))) => p,
            Some(Ok(Err(e))) => {
                tracing::debug!(error = %e, "Redis subscriber: cannot connect");
                continue;
            }
            Some(Err(_)) => {
                tracing::debug!("Redis subscriber: connecting timed out");
                continue;
            }
        };
        let (mut sink, mut stream) = pubsub.split();
        // Commands that came while disconnected are covered by subscribing to every
        // channel registered now.
        while s.commands.try_recv().is_ok() {}
        let channels: Vec<String> = lock(&state).channels.keys().cloned().collect();
        if let Err(why) = sync(&state, &s, &mut sink, channels).await {
            tracing::warn!(error = %why, "Redis subscriber: subscribing failed; reconnecting");
            continue;
        }
        // After a break, messages may have been missed. (On the first connection,
        // waiters that registered before it look again once it is confirmed.)
        if reconnected {
            let st = lock(&state);
            for h in st.channels.values().flat_map(|ch| ch.handlers.values()) {
                h(b"");
            }
        }
        let served = tokio::time::Instant::now();
        reconnected = true;
        let stop = serve(&state, &mut s, &mut sink, &mut stream).await;
        for ch in lock(&state).channels.values() {
            ch.subscribed.send_replace(false);
        }
        if stop {
            return;
        }
        // Broken after working for a while: reconnect at once; else keep backing off.
        if served.elapsed() > PING_INTERVAL * 2 {
            attempt = 0;
        }
    }
}

/// Dispatch messages and handle commands until the connection breaks (returns false)
/// or the hub is gone (returns true).
async fn serve(
    state: &Mutex<HubState>,
    s: &mut Starter,
    sink: &mut PubSubSink,
    stream: &mut PubSubStream,
) -> bool {
    let mut ping = tokio::time::interval(PING_INTERVAL);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ping.tick().await;
    loop {
        tokio::select! {
            msg = stream.next() => {
                let Some(msg) = msg else {
                    tracing::debug!("Redis subscriber: connection closed; reconnecting");
                    return false;
                };
                dispatch(state, msg.get_channel_name(), msg.get_payload_bytes());
            }
            channel = s.commands.recv() => {
                let Some(channel) = channel else {
                    return true;
                };
                // Each channel queued now, once.
                let mut channels = vec![channel];
                while let Ok(c) = s.commands.try_recv() {
                    channels.push(c);
                }
                channels.sort();
                channels.dedup();
                if sync(state, s, sink, channels).await.is_err() {
                    return false;
                }
            }
            // Subscribed, Redis answers `PING` with `["pong", ""]`: any answer will do.
            _ = ping.tick() => {
                let answered = tokio::time::timeout(s.requests.timeout(), sink.ping::<redis::Value>()).await;
                if !matches!(answered, Ok(Ok(_))) {
                    tracing::debug!("Redis subscriber: no answer to PING; reconnecting");
                    return false;
                }
            }
        }
    }
}

/// Subscribe the connection to those of `channels` that have registrations (confirming
/// them) and unsubscribe it from the others. A channel whose last registration leaves
/// meanwhile is queued again, so it is unsubscribed next.
async fn sync(
    state: &Mutex<HubState>,
    s: &Starter,
    sink: &mut PubSubSink,
    channels: Vec<String>,
) -> tenure_core::Result<()> {
    let (on, off): (Vec<String>, Vec<String>) = {
        let st = lock(state);
        channels
            .into_iter()
            .partition(|c| st.channels.contains_key(c))
    };
    for batch in on.chunks(SUBSCRIBE_BATCH) {
        s.requests.call("subscribe", sink.subscribe(batch)).await?;
    }
    if !off.is_empty() {
        s.requests
            .call("unsubscribe", sink.unsubscribe(off))
            .await?;
    }
    let st = lock(state);
    for ch in on.iter().filter_map(|name| st.channels.get(name)) {
        ch.subscribed.send_replace(true);
    }
    Ok(())
}

/// `f`'s output, or `None` if the hub is gone first (other commands need no action
/// while disconnected: every channel registered once connected is subscribed then).
async fn unless_stopped<T>(
    commands: &mut mpsc::UnboundedReceiver<String>,
    f: impl Future<Output = T>,
) -> Option<T> {
    tokio::pin!(f);
    loop {
        tokio::select! {
            out = &mut f => return Some(out),
            c = commands.recv() => { c?; }
        }
    }
}

/// Give a message to its channel's registrations.
fn dispatch(state: &Mutex<HubState>, channel: &str, payload: &[u8]) {
    if let Some(ch) = lock(state).channels.get(channel) {
        for h in ch.handlers.values() {
            h(payload);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Notify;

    #[tokio::test]
    async fn a_message_goes_to_its_channel_only() {
        let state = Arc::new(Mutex::new(HubState::default()));
        let heard = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let observer = Arc::new(Notify::new());
        for (name, listen) in [("c1", true), ("c2", false)] {
            let heard = heard.clone();
            let mut st = lock(&state);
            let ch = st.channels.entry(name.into()).or_insert(Channel {
                handlers: HashMap::new(),
                subscribed: watch::Sender::new(true),
            });
            let observer = observer.clone();
            let handler: Handler = if listen {
                Arc::new(move |p: &[u8]| lock(&heard).push(p.to_vec()))
            } else {
                Arc::new(move |_: &[u8]| observer.notify_one())
            };
            ch.handlers.insert(1, handler);
        }
        dispatch(&state, "c1", b"7 d:s1");
        assert_eq!(*lock(&heard), vec![b"7 d:s1".to_vec()]);
        let woken = tokio::time::timeout(Duration::from_millis(10), observer.notified());
        assert!(
            woken.await.is_err(),
            "an observer of another channel was woken"
        );
        dispatch(&state, "c2", b"8");
        observer.notified().await;
        assert_eq!(lock(&heard).len(), 1);
        // Unknown channels and payloads do not panic.
        dispatch(&state, "nope", b"free s1");
        dispatch(&state, "c1", b"\xff\xfe");
    }
}
