//! The Go layout's keys of one session in the elections' queues: creating them (one at
//! a time, or many seats per transaction), looking at the queue (is the key there,
//! which key is before it), watching a held key, and forgetting a candidacy.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

use tenure_core::backend::{lock, revision_token};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Result, Retry};
use tokio_util::sync::CancellationToken;

use super::{Candidacy, Inner, QueueState};
use crate::error::TAG;
use crate::ops::{self, op};
use crate::proto::{KeyValue, TxnRequest, TxnResponse};
use crate::watches::KeyWatch;

/// Whether `first` (an election's first key by creation) is `key`, created at
/// `revision`.
pub(super) fn leads(first: &[KeyValue], key: &str, revision: i64) -> bool {
    first
        .first()
        .is_some_and(|kv| kv.key == key.as_bytes() && kv.create_revision == revision)
}

/// The key among `kvs` created just before `key` (created at `revision`).
fn before(kvs: Vec<KeyValue>, key: &str, revision: i64) -> Option<String> {
    kvs.into_iter()
        .find(|kv| kv.create_revision < revision && kv.key != key.as_bytes())
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, HashMap<ElectionName, Candidacy>> {
        lock(&self.candidacies)
    }

    pub(super) fn key(&self, election: &ElectionName) -> String {
        self.shared.keys.candidate_key(election, self.lease)
    }

    pub(super) async fn txn(&self, what: &str, txn: TxnRequest) -> Result<TxnResponse> {
        self.shared.call(what, txn).await
    }

    /// Take the free seats of `chunk` (at most [`BATCH`]) in one transaction: it creates
    /// this session's key in each election and reads each election's first key; one more
    /// transaction withdraws the keys that are not first. `None`, with nothing written,
    /// if a key of this session already existed in one of the elections.
    pub(super) async fn try_chunk(
        self: &Arc<Self>,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Option<Vec<Option<FencingToken>>>> {
        let keys: Vec<String> = chunk.iter().map(|(e, _)| self.key(e)).collect();
        let mut txn = TxnRequest::default();
        for ((election, candidate), key) in chunk.iter().zip(&keys) {
            txn.compare.push(ops::created_at(key, 0));
            txn.success.push(op(ops::put(
                key,
                &self.shared.keys.candidate_value(candidate),
                self.lease,
            )));
            let range = self.shared.keys.election_range(election);
            txn.success.push(op(ops::first_by_create(&range)));
        }
        let resp = self.txn("try_campaign_many", txn).await?;
        if !resp.succeeded {
            return Ok(None);
        }
        // Every key of one transaction has its revision.
        let revision = ops::revision(&resp.header);
        let mut answers = Vec::with_capacity(chunk.len());
        let mut withdraw = TxnRequest::default();
        for (i, ((election, _), key)) in chunk.iter().zip(&keys).enumerate() {
            if leads(&ops::read_in(&resp.responses, i), key, revision) {
                let own_watch = self.watch_own(key, revision);
                self.granted(election, revision, own_watch);
                answers.push(Some(revision_token(revision)));
            } else {
                withdraw.success.push(op(ops::delete(key)));
                answers.push(None);
            }
        }
        if !withdraw.success.is_empty() {
            self.txn("try_campaign_many: withdraw", withdraw).await?;
        }
        Ok(Some(answers))
    }

    /// Make sure this session's key exists for a new (or continuing) candidacy and return
    /// its create revision. A key left from an earlier grant or candidacy is replaced, so
    /// every candidacy gets a new, higher token.
    pub(super) async fn ensure_candidacy(
        &self,
        election: &ElectionName,
        key: &str,
        value: &[u8],
        with_first: bool,
    ) -> Result<(i64, Vec<KeyValue>)> {
        let range = self.shared.keys.election_range(election);
        for _ in 0..4 {
            let mut then = vec![op(ops::put(key, value, self.lease))];
            if with_first {
                then.push(op(ops::first_by_create(&range)));
            }
            let txn = TxnRequest {
                compare: vec![ops::created_at(key, 0)],
                success: then,
                failure: vec![op(ops::get(key))],
            };
            let resp = self.txn("campaign", txn).await?;
            if resp.succeeded {
                let revision = ops::revision(&resp.header);
                self.queued(election, revision);
                let first = if with_first {
                    ops::read_in(&resp.responses, 0)
                } else {
                    Vec::new()
                };
                return Ok((revision, first));
            }
            let existing = ops::read_in(&resp.responses, 0)
                .first()
                .map_or(0, |kv| kv.create_revision);
            if existing == 0 {
                continue; // deleted in between: try again
            }
            let reusable = !with_first
                && self
                    .lock()
                    .get(election)
                    .is_some_and(|c| c.revision == existing && !c.granted);
            if reusable {
                return Ok((existing, Vec::new()));
            }
            let txn = ops::delete_if_created_at(key, existing);
            self.txn("campaign: replace an old key", txn).await?;
        }
        Err(TAG.own(
            ErrorKind::Backend,
            format!("campaign {election}: the candidate key keeps changing under us"),
        ))
    }

    /// Record this session's new key in `election`, created at `revision`, not granted.
    pub(super) fn queued(&self, election: &ElectionName, revision: i64) {
        let candidacy = Candidacy {
            revision,
            granted: false,
            monitor: None,
        };
        self.lock().insert(election.clone(), candidacy);
    }

    /// Join the queue of `election` with a new key, if this session has none there:
    /// the first look at the queue, at the key's create revision; `None` (nothing
    /// written) if a key of this session was already there:
    /// [`ensure_candidacy`](Self::ensure_candidacy) sorts that out.
    pub(super) async fn enqueue(
        &self,
        election: &ElectionName,
        key: &str,
        value: &[u8],
    ) -> Result<Option<QueueState>> {
        let range = self.shared.keys.election_range(election);
        let compare = vec![ops::created_at(key, 0)];
        let success = vec![
            op(ops::put(key, value, self.lease)),
            op(ops::newest_two(&range)),
        ];
        let creates = Some(key.to_string());
        let Some(answer) = self.enqueues.txn(compare, success, creates).await? else {
            return Ok(None);
        };
        let revision = answer.revision;
        self.queued(election, revision);
        Ok(Some(QueueState {
            own_present: true,
            predecessor: before(answer.read(0), key, revision),
            revision,
        }))
    }

    /// Is our key still there, and which key (if any) is just before it?
    pub(super) async fn look_at_queue(
        &self,
        range: &str,
        key: &str,
        revision: i64,
    ) -> Result<QueueState> {
        let reads = vec![
            op(ops::get_key_only(key)),
            op(ops::predecessor(range, revision)),
        ];
        let answer = self.looks.one(reads, None).await?;
        let own_present = answer
            .read(0)
            .first()
            .is_some_and(|kv| kv.create_revision == revision);
        Ok(QueueState {
            own_present,
            predecessor: before(answer.read(1), key, revision),
            revision: answer.revision,
        })
    }

    /// Watch this session's `key` for deletion. Served by the session's prefix watch
    /// (no request; see [`crate::watches`]), so not counted; a wake-up is.
    pub(super) fn watch_own(&self, key: &str, revision: i64) -> KeyWatch {
        self.watcher.watch_deletes(key, revision + 1)
    }

    /// Record the grant and watch the key while it is held.
    pub(super) fn granted(
        self: &Arc<Self>,
        election: &ElectionName,
        revision: i64,
        own_watch: KeyWatch,
    ) {
        let stop = self.life.child_token();
        self.lock().insert(
            election.clone(),
            Candidacy {
                revision,
                granted: true,
                monitor: Some(stop.clone()),
            },
        );
        tokio::spawn(
            self.clone()
                .monitor(election.clone(), revision, own_watch, stop),
        );
    }

    pub(super) fn still_held(&self, election: &ElectionName, revision: i64) -> bool {
        self.lock()
            .get(election)
            .is_some_and(|c| c.granted && c.revision == revision)
    }

    /// Report the held key's deletion by anyone (an operator, lease expiry) as a loss.
    pub(super) async fn monitor(
        self: Arc<Self>,
        election: ElectionName,
        revision: i64,
        mut watch: KeyWatch,
        stop: CancellationToken,
    ) {
        let key = self.key(&election);
        let retry = Retry::default();
        let mut attempt = 0u32;
        loop {
            let fired = tokio::select! {
                _ = stop.cancelled() => return,
                f = watch.fired() => f,
            };
            // A held seat is given up only on etcd's word: a delete reported by the
            // watch (or a watch that cannot tell) is checked by reading the key before
            // the leader is told. One read per loss, none otherwise; the reads of many
            // losses at once (a lease of 10,000 keys expiring) share transactions, as
            // looks at the queue do — one request each kept etcd from applying for
            // seconds. `None`: ask again after a pause.
            let gone = match fired {
                Ok(deleted) => {
                    let read = vec![op(ops::get_key_only(&key))];
                    self.looks.one(read, None).await.ok().map(|answer| {
                        let gone = answer
                            .read(0)
                            .first()
                            .is_none_or(|kv| kv.create_revision != revision);
                        if !gone && deleted {
                            tracing::warn!(%election, revision, "a watch reported the held key deleted, but etcd still has it");
                        }
                        gone
                    })
                }
                Err(_) => None,
            };
            match gone {
                Some(true) => {
                    if self.still_held(&election, revision) {
                        self.lock().remove(&election);
                        self.events.election_lost(
                            &election,
                            revision_token(revision),
                            "the candidate key was deleted in etcd",
                        );
                    }
                    return;
                }
                Some(false) => {}
                None => {
                    let delay = retry.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
            // Watch again from the key's creation: a delete meanwhile is replayed.
            watch = self.watch_own(&key, revision);
        }
    }

    /// Forget the candidacy in `election` (only the grant with `token` if given),
    /// stopping its monitor.
    pub(super) fn forget(&self, election: &ElectionName, token: Option<FencingToken>) {
        let mut candidacies = self.lock();
        let matches = candidacies
            .get(election)
            .is_some_and(|c| token.is_none_or(|t| revision_token(c.revision) == t));
        let gone = matches.then(|| candidacies.remove(election)).flatten();
        if let Some(monitor) = gone.and_then(|c| c.monitor) {
            monitor.cancel();
        }
    }
}
