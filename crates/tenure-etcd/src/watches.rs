//! Waits on one watch stream per backend, served from one watch on every key under the
//! prefix: the engine's (a wait per election range), the observers' (an election's
//! range with `layout=go`, a member namespace's) and, with `layout=go`, a session's
//! "tell me when this key is deleted".
//!
//! Creating a watch costs etcd more than it looks (each create reads the store's
//! revision through a read transaction, which in etcd 3.4 copies the buffer of
//! uncommitted writes), and a node taking 10,000 seats waits on 10,000 records. So the
//! backend opens one watch on the whole prefix, from the revision current when it is
//! created, and serves each wait from it:
//!
//! - every change under the prefix reaches the backend in revision order, and the
//!   last [`LOG_LIMIT`] are remembered, so a wait from a revision the stream has
//!   already passed replays them at once;
//! - a wait from before what the log covers (a revision older than the prefix watch)
//!   gets a watch of its own in etcd, from its revision, on the same stream.
//!
//! The price: each backend receives every change under the prefix (the engine's keys
//! are small; a state left for a successor is at most 64 KiB).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tenure_core::{Error, ErrorKind};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::client::{EtcdClient, WatchStream};
use crate::error::{map, TAG};
use crate::ops::prefix_end;
use crate::proto::{Event, EventType, WatchCreateRequest, WatchResponse};

/// Changes remembered to serve waits from revisions the prefix watch has passed.
const LOG_LIMIT: usize = 8192;

/// The prefix watch's id on the stream; waits are numbered from 2.
const PREFIX: i64 = 1;

/// What a watch reports.
pub(crate) enum Seen {
    /// Changes under the range, in revision order.
    Events(Vec<Event>),
    /// The start revision was compacted away: the caller reads to know.
    Compacted,
    /// The stream failed.
    Broken(Error),
}

/// One wait from revision `from`: on every key that starts with `range` (an election's
/// range, a member namespace; it ends with `/` or `/@`), or on one key (with `key`).
struct Wait {
    id: i64,
    range: Vec<u8>,
    key: bool,
    from: i64,
    tx: mpsc::UnboundedSender<Seen>,
}

impl Wait {
    /// Whether a change of `key` is this wait's.
    fn covers(&self, key: &[u8]) -> bool {
        match self.key {
            true => key == self.range,
            false => key.starts_with(&self.range),
        }
    }
}

/// A watch for the deletion of one key; dropping it cancels it.
pub(crate) struct KeyWatch(Watch);

impl KeyWatch {
    /// Wait until the key is deleted (at or after the start revision: `true`) or the
    /// watch cannot tell (the start revision was compacted away: `false`, the caller
    /// reads the key); `Err` when the stream failed (the caller decides whether to
    /// retry).
    pub(crate) async fn fired(&mut self) -> Result<bool, Error> {
        loop {
            match self.0.next().await {
                Seen::Events(events) => {
                    if events.iter().any(|e| e.r#type == EventType::Delete as i32) {
                        return Ok(true);
                    }
                }
                Seen::Compacted => return Ok(false),
                Seen::Broken(e) => return Err(e),
            }
        }
    }
}

enum Command {
    Add(Wait),
    Cancel(i64),
}

/// Handle to the backend's watch task.
pub(crate) struct Watches {
    commands: mpsc::UnboundedSender<Command>,
    next: AtomicI64,
    _stop: tokio_util::sync::DropGuard,
}

/// One watch; dropping it cancels it.
pub(crate) struct Watch {
    id: i64,
    seen: mpsc::UnboundedReceiver<Seen>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Watch {
    /// The next report.
    pub(crate) async fn next(&mut self) -> Seen {
        self.seen.recv().await.unwrap_or_else(|| {
            Seen::Broken(TAG.own(ErrorKind::Unavailable, "the watch task stopped"))
        })
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel(self.id));
    }
}

impl Watches {
    /// Start the task for the keys under `root` (`<prefix>/`); it opens its stream on
    /// the first wait (giving up after `timeout`), and stops with the handle.
    pub(crate) fn spawn(client: EtcdClient, timeout: Duration, root: &str) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let stop = CancellationToken::new();
        let task = Task {
            client,
            timeout,
            root: root.as_bytes().to_vec(),
            stream: None,
            prefix: Prefix::Off,
            log: VecDeque::new(),
            log_from: i64::MAX,
            served: HashMap::new(),
            ranges: HashMap::new(),
            own: HashMap::new(),
        };
        tokio::spawn(task.run(rx, stop.clone()));
        Watches {
            commands,
            next: AtomicI64::new(PREFIX + 1),
            _stop: stop.drop_guard(),
        }
    }

    /// Watch every key that starts with `range` from `revision` on.
    pub(crate) fn watch(&self, range: &str, revision: i64) -> Watch {
        self.add(range, false, revision)
    }

    /// Report when `key` (under the prefix) is deleted at or after `revision`.
    pub(crate) fn watch_deletes(&self, key: &str, revision: i64) -> KeyWatch {
        KeyWatch(self.add(key, true, revision))
    }

    fn add(&self, range: &str, key: bool, revision: i64) -> Watch {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, seen) = mpsc::unbounded_channel();
        let wait = Wait {
            id,
            range: range.as_bytes().to_vec(),
            key,
            from: revision,
            tx,
        };
        let _ = self.commands.send(Command::Add(wait));
        Watch {
            id,
            seen,
            commands: self.commands.clone(),
        }
    }
}

/// The state of the prefix watch.
enum Prefix {
    Off,
    /// Asked for: waits wait for etcd's answer, which names where it starts.
    Creating(Vec<Wait>),
    On,
}

struct Task {
    client: EtcdClient,
    timeout: Duration,
    root: Vec<u8>,
    stream: Option<WatchStream>,
    prefix: Prefix,
    /// The changes under the prefix from `log_from` on.
    log: VecDeque<Event>,
    log_from: i64,
    /// Waits served by the prefix watch, by id, and their ids by range.
    served: HashMap<i64, Wait>,
    ranges: HashMap<Vec<u8>, Vec<i64>>,
    /// Waits with a watch of their own in etcd, by id.
    own: HashMap<i64, mpsc::UnboundedSender<Seen>>,
}

async fn next_message(stream: &mut Option<WatchStream>) -> Result<Option<WatchResponse>, Error> {
    match stream {
        Some(s) => s.message().await.map_err(|e| map("watch", e)),
        None => std::future::pending().await,
    }
}

/// What a wait that covers `key` may be on: the key itself, and each of its prefixes
/// that ends with `/` or `/@`.
fn ranges_of(key: &[u8]) -> impl Iterator<Item = &[u8]> {
    let ends = move |n: usize| n == key.len() || key[n - 1] == b'/' || key[..n].ends_with(b"/@");
    (1..=key.len())
        .filter(move |&n| ends(n))
        .map(move |n| &key[..n])
}

fn revision_of(event: &Event) -> i64 {
    event.kv.as_ref().map_or(0, |kv| kv.mod_revision)
}

impl Task {
    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        stop: CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Add(wait)) => self.add(wait).await,
                    Some(Command::Cancel(id)) => self.cancel(id),
                },
                message = next_message(&mut self.stream) => match message {
                    Ok(Some(response)) => self.answer(response),
                    Ok(None) => self.fail_all("the watch stream ended"),
                    Err(e) => self.fail_all(&e.to_string()),
                },
            }
        }
    }

    async fn add(&mut self, wait: Wait) {
        if wait.tx.is_closed() {
            return;
        }
        match &mut self.prefix {
            Prefix::On => self.place(wait),
            Prefix::Creating(pending) => pending.push(wait),
            Prefix::Off => {
                let create = WatchCreateRequest {
                    key: self.root.clone(),
                    range_end: prefix_end(&self.root),
                    watch_id: PREFIX,
                    ..Default::default()
                };
                match self.send(create).await {
                    Ok(()) => self.prefix = Prefix::Creating(vec![wait]),
                    Err(e) => {
                        let _ = wait.tx.send(Seen::Broken(e));
                    }
                }
            }
        }
    }

    /// Serve `wait` from the log and the prefix watch, or give it a watch of its own
    /// when it starts before what the log covers.
    fn place(&mut self, wait: Wait) {
        if wait.from < self.log_from {
            let range_end = match wait.key {
                true => Vec::new(),
                false => prefix_end(&wait.range),
            };
            let create = WatchCreateRequest {
                key: wait.range.clone(),
                range_end,
                start_revision: wait.from,
                watch_id: wait.id,
            };
            match self.stream.as_ref().map(|s| s.create(create)) {
                Some(Ok(())) => {
                    self.own.insert(wait.id, wait.tx);
                }
                _ => {
                    let e = TAG.own(ErrorKind::Unavailable, "the watch stream closed");
                    let _ = wait.tx.send(Seen::Broken(e));
                    self.fail_all("the watch stream closed");
                }
            }
            return;
        }
        let past: Vec<Event> = self
            .log
            .iter()
            .filter(|e| revision_of(e) >= wait.from)
            .filter(|e| e.kv.as_ref().is_some_and(|kv| wait.covers(&kv.key)))
            .cloned()
            .collect();
        if !past.is_empty() && wait.tx.send(Seen::Events(past)).is_err() {
            return;
        }
        self.ranges
            .entry(wait.range.clone())
            .or_default()
            .push(wait.id);
        self.served.insert(wait.id, wait);
    }

    /// Send a watch request, opening the stream with it if there is none.
    async fn send(&mut self, create: WatchCreateRequest) -> Result<(), Error> {
        if let Some(s) = self.stream.as_ref() {
            if let Err(e) = s.create(create) {
                self.fail_all("the watch stream closed");
                return Err(map("watch", e));
            }
            return Ok(());
        }
        match tokio::time::timeout(self.timeout, self.client.watch(create)).await {
            Ok(Ok(s)) => {
                self.stream = Some(s);
                Ok(())
            }
            Ok(Err(e)) => Err(map("watch", e)),
            Err(_) => Err(TAG.timed_out("watch", self.timeout)),
        }
    }

    fn cancel(&mut self, id: i64) {
        if let Some(wait) = self.served.remove(&id) {
            if let Some(ids) = self.ranges.get_mut(&wait.range) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    self.ranges.remove(&wait.range);
                }
            }
        } else if self.own.remove(&id).is_some() {
            if let Some(s) = &self.stream {
                let _ = s.cancel(id);
            }
        } else if let Prefix::Creating(pending) = &mut self.prefix {
            pending.retain(|w| w.id != id);
        }
    }

    fn answer(&mut self, response: WatchResponse) {
        if response.watch_id == PREFIX {
            return self.prefix_answer(response);
        }
        let id = response.watch_id;
        if response.canceled {
            if let Some(tx) = self.own.remove(&id) {
                let _ = tx.send(cancelled(&response));
            }
        } else if !response.events.is_empty() {
            let gone = self
                .own
                .get(&id)
                .is_some_and(|tx| tx.send(Seen::Events(response.events)).is_err());
            if gone {
                self.cancel(id);
            }
        }
    }

    fn prefix_answer(&mut self, response: WatchResponse) {
        if response.canceled {
            tracing::warn!(reason = %response.cancel_reason, "etcd cancelled the prefix watch");
            return self.fail_prefix(|| cancelled(&response));
        }
        if response.created {
            // Without the revision nothing can be served from the log.
            let after = response.header.as_ref().map(|h| h.revision);
            self.log.clear();
            self.log_from = after.map_or(i64::MAX, |r| r + 1);
            if let Prefix::Creating(pending) = std::mem::replace(&mut self.prefix, Prefix::On) {
                for wait in pending {
                    self.place(wait);
                }
            }
        }
        let mut due: HashMap<i64, Vec<Event>> = HashMap::new();
        for event in response.events {
            let key = event
                .kv
                .as_ref()
                .map(|kv| kv.key.as_slice())
                .unwrap_or_default();
            let ids = ranges_of(key).filter_map(|r| self.ranges.get(r)).flatten();
            for id in ids {
                if self.served.get(id).is_some_and(|w| w.covers(key)) {
                    due.entry(*id).or_default().push(event.clone());
                }
            }
            self.log.push_back(event);
            while self.log.len() > LOG_LIMIT {
                // The log no longer holds every change of that revision.
                if let Some(old) = self.log.pop_front() {
                    self.log_from = self.log_from.max(revision_of(&old) + 1);
                }
            }
        }
        for (id, events) in due {
            let gone = self
                .served
                .get(&id)
                .is_some_and(|w| w.tx.send(Seen::Events(events)).is_err());
            if gone {
                self.cancel(id);
            }
        }
    }

    /// The prefix watch ended: every wait it served reports `why`.
    fn fail_prefix(&mut self, why: impl Fn() -> Seen) {
        if let Prefix::Creating(pending) = std::mem::replace(&mut self.prefix, Prefix::Off) {
            for wait in pending {
                let _ = wait.tx.send(why());
            }
        }
        self.ranges.clear();
        for (_, wait) in self.served.drain() {
            let _ = wait.tx.send(why());
        }
        self.log.clear();
        self.log_from = i64::MAX;
    }

    /// The stream failed: every wait reports `Broken`.
    fn fail_all(&mut self, why: &str) {
        self.stream = None;
        let broken = || Seen::Broken(TAG.own(ErrorKind::Unavailable, why.to_string()));
        self.fail_prefix(broken);
        for (_, tx) in self.own.drain() {
            let _ = tx.send(broken());
        }
    }
}

/// What a watch that etcd cancelled reports.
fn cancelled(response: &WatchResponse) -> Seen {
    if response.compact_revision > 0 {
        Seen::Compacted
    } else {
        Seen::Broken(TAG.own(
            ErrorKind::Unavailable,
            format!("watch cancelled by etcd: {}", response.cancel_reason),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{ranges_of, Wait};

    #[test]
    fn a_wait_covers_its_range_or_its_key() {
        let wait = |range: &str, key| Wait {
            id: 2,
            range: range.as_bytes().to_vec(),
            key,
            from: 1,
            tx: tokio::sync::mpsc::unbounded_channel().0,
        };
        let election = wait("p/a/@", false);
        assert!(election.covers(b"p/a/@r/00ff") && election.covers(b"p/a/@rev"));
        assert!(!election.covers(b"p/a/b/@rev"));
        // Go's election prefix covers what Go's would, nested elections' keys too.
        let go = wait("p/a/", false);
        assert!(go.covers(b"p/a/694d") && go.covers(b"p/a/b/1f") && !go.covers(b"p/ab/1"));
        let key = wait("p/a/694d", true);
        assert!(key.covers(b"p/a/694d") && !key.covers(b"p/a/694d0"));
    }

    #[test]
    fn a_key_is_looked_up_under_each_range_that_may_cover_it() {
        let ranges = |key: &'static [u8]| ranges_of(key).collect::<Vec<_>>();
        let want: Vec<&[u8]> = vec![b"p/", b"p/a/", b"p/a/@", b"p/a/@r/", b"p/a/@r/00ff"];
        assert_eq!(ranges(b"p/a/@r/00ff"), want);
        let want: Vec<&[u8]> = vec![b"/", b"/svc/", b"/svc/1f"];
        assert_eq!(ranges(b"/svc/1f"), want);
    }
}
