//! One watch stream per session for "tell me when this key is deleted" (the session's
//! own candidate keys and the predecessor each waiter watches).
//!
//! Creating a watch costs etcd more than it looks: every create reads the store's
//! revision through a read transaction, which (etcd 3.4) copies the whole buffer of
//! uncommitted writes, and a watch from a past revision must be caught up from disk.
//! A node taking 10,000 shards watched 20,000 keys one by one, and that alone kept
//! etcd busy. So the session opens one watch on deletes under its key prefix and
//! serves every key watch from it:
//!
//! - the prefix watch starts at the store's current revision `H + 1`; from then on
//!   every delete under the prefix reaches the session in revision order;
//! - the session remembers the last [`LOG_LIMIT`] deletes, so a key watch from a
//!   revision the stream has already passed is answered from that log;
//! - a key watch from before what the log covers (say, a held key's creation, watched
//!   again after the stream broke) gets its own watch in etcd from its start revision,
//!   as every key watch did before.
//!
//! The cost: each session receives every delete under the prefix (keys only, a few
//! dozen bytes each), so N nodes receive each delete N times; creating watches no
//! longer grows with the number of seats.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tenure_core::{Error, ErrorKind};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::client::{EtcdClient, WatchStream};
use crate::error::{map, TAG};
use crate::ops::prefix_end;
use crate::proto::{FilterType, WatchCreateRequest, WatchResponse};

/// Deletes the session remembers, to answer key watches from revisions its prefix
/// watch has already passed (a few MB at most).
const LOG_LIMIT: usize = 32_768;

/// The prefix watch's id on the stream; key watches are numbered from 2.
const PREFIX_WATCH: i64 = 1;

/// What ended a key watch. Each watch reports once.
#[derive(Debug)]
pub(crate) enum Fired {
    /// The key was deleted (at or after the start revision).
    Deleted,
    /// The start revision was compacted away: the caller must read the key to know.
    Compacted,
    /// The watch stream failed; the caller decides whether to retry.
    Broken(Error),
}

enum Command {
    Watch(Request),
    Cancel { id: i64 },
}

/// One key watch asked for.
struct Request {
    id: i64,
    key: String,
    start_revision: i64,
    fire: oneshot::Sender<Fired>,
}

/// Handle to the session's watch task.
pub(crate) struct KeyWatcher {
    commands: mpsc::UnboundedSender<Command>,
    next_id: AtomicI64,
}

/// One registered watch; dropping it cancels the watch.
pub(crate) struct KeyWatch {
    id: i64,
    fired: Option<oneshot::Receiver<Fired>>,
    commands: mpsc::UnboundedSender<Command>,
}

impl KeyWatch {
    /// Wait until the watch reports. After it has reported once, reports `Broken`.
    pub(crate) async fn fired(&mut self) -> Fired {
        let Some(rx) = self.fired.as_mut() else {
            return Fired::Broken(TAG.own(ErrorKind::Backend, "key watch already reported"));
        };
        let result = rx.await;
        self.fired = None;
        result.unwrap_or_else(|_| {
            Fired::Broken(TAG.own(ErrorKind::Unavailable, "the session's watch task stopped"))
        })
    }
}

impl Drop for KeyWatch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

impl KeyWatcher {
    /// Start the task for the keys in the range `root` (a prefix that every key it is
    /// asked to watch starts with: `<prefix>/`); it opens its stream on the first watch
    /// and stops with `stop`.
    pub(crate) fn spawn(
        client: EtcdClient,
        root: &str,
        request_timeout: Duration,
        stop: CancellationToken,
    ) -> Self {
        let (commands, rx) = mpsc::unbounded_channel();
        let task = Task {
            client,
            request_timeout,
            range: root.to_string(),
            stream: None,
            prefix: Prefix::Off,
            log: DeleteLog::default(),
            waiting: HashMap::new(),
            key_of: HashMap::new(),
            exact: HashMap::new(),
        };
        tokio::spawn(task.run(rx, stop));
        KeyWatcher {
            commands,
            next_id: AtomicI64::new(PREFIX_WATCH + 1),
        }
    }

    /// Report when `key` (under the prefix) is deleted at or after `start_revision`.
    pub(crate) fn watch_deletes(&self, key: &str, start_revision: i64) -> KeyWatch {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (fire, fired) = oneshot::channel();
        let _ = self.commands.send(Command::Watch(Request {
            id,
            key: key.to_string(),
            start_revision,
            fire,
        }));
        KeyWatch {
            id,
            fired: Some(fired),
            commands: self.commands.clone(),
        }
    }
}

/// The state of the prefix watch.
enum Prefix {
    /// Not open (not needed yet, or the stream broke).
    Off,
    /// Asked for: key watches wait for etcd's answer, which names the revision the
    /// watch starts after.
    Creating(Vec<Request>),
    /// Open: every delete under the prefix after `DeleteLog::from - 1` arrives.
    On,
}

/// The deletes seen on the prefix watch, newest last, at most [`LOG_LIMIT`].
#[derive(Default)]
struct DeleteLog {
    /// Every delete at this revision or later has been recorded (or is yet to come).
    from: i64,
    entries: VecDeque<(i64, String)>,
    /// Each key's latest delete.
    latest: HashMap<String, i64>,
}

impl DeleteLog {
    fn reset(&mut self, from: i64) {
        self.from = from;
        self.entries.clear();
        self.latest.clear();
    }

    fn record(&mut self, key: &str, revision: i64) {
        self.entries.push_back((revision, key.to_string()));
        let latest = self.latest.entry(key.to_string()).or_insert(revision);
        *latest = (*latest).max(revision);
        while self.entries.len() > LOG_LIMIT {
            let Some((r, k)) = self.entries.pop_front() else {
                break;
            };
            // Other deletes at `r` may remain, but the log no longer holds them all.
            self.from = self.from.max(r + 1);
            if self.latest.get(&k) == Some(&r) {
                self.latest.remove(&k);
            }
        }
    }

    /// Whether `key` was deleted at or after `from`, as far as the stream has told;
    /// `None` when the log does not reach back to `from`.
    fn deleted_since(&self, key: &str, from: i64) -> Option<bool> {
        if from < self.from {
            return None;
        }
        Some(self.latest.get(key).is_some_and(|r| *r >= from))
    }
}

/// A key watch served from the prefix watch.
struct Waiter {
    id: i64,
    from: i64,
    fire: oneshot::Sender<Fired>,
}

struct Task {
    client: EtcdClient,
    request_timeout: Duration,
    /// `<prefix>/` (or `/`): the range of the prefix watch.
    range: String,
    stream: Option<WatchStream>,
    prefix: Prefix,
    log: DeleteLog,
    /// Key watches served by the prefix watch, by key.
    waiting: HashMap<String, Vec<Waiter>>,
    key_of: HashMap<i64, String>,
    /// Key watches with their own watch in etcd, by id.
    exact: HashMap<i64, oneshot::Sender<Fired>>,
}

async fn next_message(stream: &mut Option<WatchStream>) -> Result<Option<WatchResponse>, Error> {
    match stream {
        Some(s) => s.message().await.map_err(|e| map("watch", e)),
        None => std::future::pending().await,
    }
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
                    Some(Command::Watch(request)) => self.watch(request).await,
                    Some(Command::Cancel { id }) => self.cancel(id),
                },
                message = next_message(&mut self.stream) => match message {
                    Ok(Some(response)) => self.answer(response),
                    Ok(None) => self.fail_all("the watch stream ended"),
                    Err(e) => self.fail_all(&e.to_string()),
                },
            }
        }
    }

    async fn watch(&mut self, request: Request) {
        match &mut self.prefix {
            Prefix::On => self.place(request),
            Prefix::Creating(pending) => pending.push(request),
            Prefix::Off => {
                let create = WatchCreateRequest {
                    key: self.range.as_bytes().to_vec(),
                    range_end: prefix_end(self.range.as_bytes()),
                    filters: vec![FilterType::NoPut as i32],
                    watch_id: PREFIX_WATCH,
                    ..Default::default()
                };
                match self.send(create).await {
                    Ok(()) => self.prefix = Prefix::Creating(vec![request]),
                    Err(e) => {
                        let _ = request.fire.send(Fired::Broken(e));
                    }
                }
            }
        }
    }

    /// Serve `request` from the log and the prefix watch, or give it its own watch when
    /// it starts before what the log covers.
    fn place(&mut self, request: Request) {
        let Request {
            id,
            key,
            start_revision,
            fire,
        } = request;
        match self.log.deleted_since(&key, start_revision) {
            Some(true) => {
                let _ = fire.send(Fired::Deleted);
            }
            Some(false) => {
                self.key_of.insert(id, key.clone());
                self.waiting.entry(key).or_default().push(Waiter {
                    id,
                    from: start_revision,
                    fire,
                });
            }
            None => {
                let create = WatchCreateRequest {
                    key: key.into_bytes(),
                    start_revision,
                    filters: vec![FilterType::NoPut as i32],
                    watch_id: id,
                    ..Default::default()
                };
                let sent = match self.stream.as_ref() {
                    Some(s) => s.create(create).map_err(|e| map("watch", e)),
                    None => Err(TAG.own(ErrorKind::Unavailable, "the watch stream closed")),
                };
                match sent {
                    Ok(()) => {
                        self.exact.insert(id, fire);
                    }
                    Err(e) => {
                        let _ = fire.send(Fired::Broken(e));
                        self.fail_all("the watch stream closed");
                    }
                }
            }
        }
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
        match tokio::time::timeout(self.request_timeout, self.client.watch(create)).await {
            Ok(Ok(s)) => {
                self.stream = Some(s);
                Ok(())
            }
            Ok(Err(e)) => Err(map("watch", e)),
            Err(_) => Err(TAG.timed_out("watch", self.request_timeout)),
        }
    }

    fn cancel(&mut self, id: i64) {
        if let Some(key) = self.key_of.remove(&id) {
            if let Some(waiters) = self.waiting.get_mut(&key) {
                waiters.retain(|w| w.id != id);
                if waiters.is_empty() {
                    self.waiting.remove(&key);
                }
            }
        } else if self.exact.remove(&id).is_some() {
            if let Some(s) = self.stream.as_ref() {
                let _ = s.cancel(id);
            }
        } else if let Prefix::Creating(pending) = &mut self.prefix {
            pending.retain(|r| r.id != id);
        }
    }

    fn answer(&mut self, response: WatchResponse) {
        if response.watch_id == PREFIX_WATCH {
            return self.prefix_answer(response);
        }
        let id = response.watch_id;
        if response.canceled {
            if let Some(fire) = self.exact.remove(&id) {
                let _ = fire.send(cancelled(&response));
            }
        } else if !response.events.is_empty() {
            // Puts are filtered out on the server: every event is a delete.
            if let Some(fire) = self.exact.remove(&id) {
                let _ = fire.send(Fired::Deleted);
                if let Some(s) = self.stream.as_ref() {
                    let _ = s.cancel(id);
                }
            }
        }
    }

    fn prefix_answer(&mut self, response: WatchResponse) {
        if response.canceled {
            let why = response.cancel_reason.clone();
            tracing::warn!(reason = %why, "etcd cancelled the session's prefix watch");
            return self.fail_prefix(|| cancelled(&response));
        }
        if response.created {
            let started_after = response.header.as_ref().map(|h| h.revision);
            // Without the revision nothing can be answered from the log: every key
            // watch gets its own.
            self.log.reset(started_after.map_or(i64::MAX, |r| r + 1));
            if let Prefix::Creating(pending) = std::mem::replace(&mut self.prefix, Prefix::On) {
                for request in pending {
                    self.place(request);
                }
            }
        }
        for event in &response.events {
            let Some(kv) = &event.kv else { continue };
            let Ok(key) = std::str::from_utf8(&kv.key) else {
                continue;
            };
            let revision = kv.mod_revision;
            self.log.record(key, revision);
            let Some(waiters) = self.waiting.get_mut(key) else {
                continue;
            };
            let (due, rest): (Vec<Waiter>, Vec<Waiter>) =
                waiters.drain(..).partition(|w| w.from <= revision);
            *waiters = rest;
            if waiters.is_empty() {
                self.waiting.remove(key);
            }
            for w in due {
                self.key_of.remove(&w.id);
                let _ = w.fire.send(Fired::Deleted);
            }
        }
    }

    /// The prefix watch ended: every key watch it served reports `why`.
    fn fail_prefix(&mut self, why: impl Fn() -> Fired) {
        if let Prefix::Creating(pending) = std::mem::replace(&mut self.prefix, Prefix::Off) {
            for request in pending {
                let _ = request.fire.send(why());
            }
        }
        self.key_of.clear();
        for (_, waiters) in self.waiting.drain() {
            for w in waiters {
                let _ = w.fire.send(why());
            }
        }
    }

    /// The stream failed: every key watch reports `Broken`.
    fn fail_all(&mut self, why: &str) {
        self.stream = None;
        let broken = || Fired::Broken(TAG.own(ErrorKind::Unavailable, why.to_string()));
        self.fail_prefix(broken);
        for (_, fire) in self.exact.drain() {
            let _ = fire.send(broken());
        }
    }
}

/// What a watch that etcd cancelled reports.
fn cancelled(response: &WatchResponse) -> Fired {
    if response.compact_revision > 0 {
        Fired::Compacted
    } else {
        Fired::Broken(TAG.own(
            ErrorKind::Unavailable,
            format!("watch cancelled by etcd: {}", response.cancel_reason),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::{DeleteLog, LOG_LIMIT};

    #[test]
    fn the_log_answers_for_revisions_it_covers_and_only_those() {
        let mut log = DeleteLog::default();
        log.reset(10);
        assert_eq!(log.deleted_since("a", 9), None, "before the watch started");
        assert_eq!(log.deleted_since("a", 10), Some(false));
        log.record("a", 12);
        log.record("b", 12);
        assert_eq!(log.deleted_since("a", 12), Some(true));
        assert_eq!(
            log.deleted_since("a", 13),
            Some(false),
            "deleted before the watch asked"
        );
        assert_eq!(log.deleted_since("c", 10), Some(false));
        // The same key deleted again later: the latest delete counts.
        log.record("a", 20);
        assert_eq!(log.deleted_since("a", 15), Some(true));
    }

    #[test]
    fn a_full_log_forgets_its_oldest_revisions_and_says_so() {
        let mut log = DeleteLog::default();
        log.reset(1);
        // Two deletes per revision, so pruning splits a revision.
        for i in 0..=LOG_LIMIT {
            let revision = 1 + (i / 2) as i64;
            log.record(&format!("k{i}"), revision);
        }
        // k0 (revision 1) is gone, k1 (also revision 1) is not: revision 1 is no longer
        // covered as a whole.
        assert_eq!(log.deleted_since("k0", 1), None);
        assert_eq!(log.deleted_since("k1", 1), None);
        assert_eq!(log.deleted_since("k2", 2), Some(true));
        assert_eq!(log.deleted_since("k0", 2), Some(false));
        assert_eq!(log.entries.len(), LOG_LIMIT);
        assert_eq!(log.latest.len(), LOG_LIMIT);
    }
}
