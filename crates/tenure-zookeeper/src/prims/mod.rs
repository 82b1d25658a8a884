//! The election engine's primitives over ZooKeeper (the default layout); the crate
//! README's table of primitives gives each mapping at length.
//!
//! A session is a ZooKeeper session holding its node `/:sessions/<id>` ([`sessions`]);
//! an election is the data of its node `/<election>`, its revision the node's data
//! version ([`election`]); a write is one `multi` whose `setData` stat is the election
//! after ([`write`]); a minted token is the zxid of the write that minted it, so tokens
//! grow across the ensemble. Each record has a node `:r-<session>` that exists while
//! it does and a node `:c-<session>` rewritten by every write to it: a waiter watches
//! its own `:c-` node and the `:r-` and session nodes of the record ahead, a holder and
//! an observer the election node; each watch is set and then checked against what the
//! caller saw, so nothing is missed.

mod election;
mod sessions;
mod write;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::{MemberStore, Wake};
use tenure_core::backend::{Inflight, Primitives};
use tenure_core::engine::{Snapshot, WaitFor, Write};
use tenure_core::{ElectionName, Error, Result};
use zookeeper_client::Stat;

use crate::nodes::election_dir;
use crate::shared::Shared;

use election::{change, presence, Known};
use sessions::Own;

/// The directory of the session nodes.
pub(crate) const SESSIONS: &str = "/:sessions";

/// The node that says session `id` lives.
pub(crate) fn session_path(id: &str) -> String {
    format!("{SESSIONS}/{id}")
}

/// Writes per `multi` of a batch, and elections per multi-read.
pub(crate) const BATCH: usize = 64;

/// The most data one batched `multi` carries (ZooKeeper refuses requests over
/// `jute.maxbuffer`, 1 MiB by default).
const BATCH_BYTES: usize = 512 * 1024;

/// The engine's primitives over one ZooKeeper ensemble.
pub(crate) struct ZkPrimitives {
    shared: Arc<Shared>,
    own: Mutex<HashMap<String, Arc<Own>>>,
    cache: Arc<Cache>,
}

/// The elections as last read or written here, and the writes to them on their way.
#[derive(Default)]
struct Cache {
    known: Mutex<HashMap<ElectionName, Known>>,
    /// The writes on their way, whose answers a wake-up may wait for.
    writing: Inflight,
}

impl Cache {
    fn remember(&self, election: &ElectionName, known: &Known) {
        if let Ok(mut k) = self.known.lock() {
            if k.len() > 100_000 {
                k.clear();
            }
            k.insert(election.clone(), known.clone());
        }
    }

    fn get(&self, election: &ElectionName) -> Option<Known> {
        self.known
            .lock()
            .ok()
            .and_then(|k| k.get(election).cloned())
    }

    fn revision(&self, election: &ElectionName) -> u64 {
        self.get(election).map_or(0, |k| k.revision())
    }

    /// The election as this process last knew it past revision `floor`, once the
    /// writes to it on their way have ended (each remembers its answer before it
    /// ends); `None` if it knows none.
    async fn past(&self, election: &ElectionName, floor: u64) -> Option<Snapshot> {
        self.writing.settled(std::slice::from_ref(election)).await;
        self.get(election)
            .filter(|k| k.revision() > floor)
            .map(|k| k.snapshot())
    }
}

impl fmt::Debug for ZkPrimitives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkPrimitives")
            .field("config", &self.shared.config)
            .finish()
    }
}

impl Drop for ZkPrimitives {
    fn drop(&mut self) {
        if let Ok(own) = self.own.lock() {
            own.values().for_each(|o| o.stop());
        }
    }
}

/// The revision of the election node with `stat` (none: 0).
fn revision_of(stat: Option<&Stat>) -> u64 {
    match stat {
        Some(s) if s.data_length > 0 => u64::try_from(s.version).unwrap_or(0),
        _ => 0,
    }
}

impl ZkPrimitives {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        ZkPrimitives {
            shared,
            own: Mutex::new(HashMap::new()),
            cache: Arc::default(),
        }
    }

    fn own(&self, id: &str) -> Option<Arc<Own>> {
        self.own.lock().ok().and_then(|o| o.get(id).cloned())
    }

    fn tag(&self, e: Error) -> Error {
        e.with_endpoint(self.shared.config.connect_string())
    }
}

#[async_trait]
impl Primitives for ZkPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.open_own(ttl).await
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.renew_all(sessions).await
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        self.revoke_own(session).await
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let k = self.read_known(std::slice::from_ref(election)).await?;
        Ok(k.into_iter().next().unwrap_or_default().snapshot())
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let mut snaps = Vec::with_capacity(elections.len());
        for chunk in elections.chunks(BATCH) {
            snaps.extend(self.read_known(chunk).await?.iter().map(Known::snapshot));
        }
        Ok(snaps)
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        self.commit_one(election, write).await
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        self.commit_batch(writes).await
    }

    fn batch(&self) -> Option<usize> {
        Some(BATCH)
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        changed(&self.shared, election, what).await
    }

    /// A waiter's wake-up carries the election when a write of this process caused
    /// it: a release's write is answered on the connection the waiter's watch fires on,
    /// right behind the watch's event, and its answer is the election after it, so the
    /// woken waiter needs no read. Holders and observers are followed by `changed`.
    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        if what.on.is_none() {
            return false;
        }
        // Only what this process learns after the watch is set counts.
        let floor = what.seen.max(self.cache.revision(election));
        let (shared, cache, to) = (self.shared.clone(), self.cache.clone(), to.clone());
        let (election, what) = (election.clone(), what.clone());
        tokio::spawn(async move {
            let woken = tokio::select! {
                r = changed(&shared, &election, &what) => r,
                () = to.closed() => return,
            };
            // An error is met again by the read that follows a wake-up without news.
            let now = match woken {
                Ok(()) => cache.past(&election, floor).await,
                Err(_) => None,
            };
            match now {
                Some(now) => to.wake_with(&election, now),
                None => to.wake(&election),
            };
        });
        true
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(self)
    }
}

/// The watches of the module's note, sent together (one round trip) and checked
/// against what the caller saw (every write to a record writes the election node too).
async fn changed(shared: &Shared, election: &ElectionName, what: &WaitFor) -> Result<()> {
    let client = shared.reader().await?;
    let dir = election_dir(election);
    let call = |f| shared.requests.call("wait", f);
    if what.on.is_none() {
        // An observer's wait, or a holder's: a holder wakes on any move of the
        // election (its own record moves only with it), reads after each and
        // decides its release on the election as it stands, one multi, where a
        // view from before a waiter joined cost a failed one first.
        let (stat, w) = call(client.check_and_watch_stat(&dir)).await?;
        if revision_of(stat.as_ref()) == what.seen {
            w.changed().await;
        }
        return Ok(());
    }
    let mine = what.me.as_deref().map(|m| change(&dir, m));
    let ahead = what
        .on
        .as_deref()
        .map(|o| (presence(&dir, o), session_path(o)));
    let mine = mine.as_deref().map(|p| client.get_and_watch_data(p));
    let ahead = ahead.as_ref().map(|(r, s)| {
        (
            client.check_and_watch_stat(r),
            client.check_and_watch_stat(s),
        )
    });
    let mut watches = Vec::new();
    if let Some(f) = mine {
        // Gone, or written after the revision seen (its data: that revision).
        match shared.requests.call("wait", f).await {
            Err(e) if crate::shared::is_no_node(&e) => return Ok(()),
            Err(e) => return Err(e),
            Ok((data, _, w)) => {
                let stamp = String::from_utf8_lossy(&data).parse::<u64>();
                if stamp.map_or(true, |s| s > what.seen) {
                    return Ok(());
                }
                watches.push(w);
            }
        }
    }
    if let Some((record, session)) = ahead {
        let (record, session) = (call(record).await?, call(session).await?);
        if record.0.is_none() || session.0.is_none() {
            return Ok(());
        }
        watches.push(record.1);
        watches.push(session.1);
    }
    let fired = watches.into_iter().map(|w| Box::pin(w.changed()));
    futures::future::select_all(fired).await;
    Ok(())
}
