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
use crate::proto::{KeyValue, Request, RequestOp, Response, ResponseOp, TxnRequest, TxnResponse};
use crate::watches::KeyWatch;

/// The key among `kvs` created just before `key` (created at `revision`).
fn before(kvs: Vec<KeyValue>, key: &str, revision: i64) -> Option<String> {
    kvs.into_iter()
        .find(|kv| kv.create_revision < revision && kv.key != key.as_bytes())
        .map(|kv| String::from_utf8_lossy(&kv.key).into_owned())
}

/// What creating this session's key in an election found.
pub(super) enum Created {
    /// The key is new, created at this revision; with the first look at its queue, from
    /// the same transaction (`None`: see [`first_look`]).
    New(i64, Option<QueueState>),
    /// A key of this session was there already, created at this revision.
    Exists(i64),
}

/// The first look at the queue of `key`, created at `revision`, from the election's
/// newest two keys read in the same transaction. `None` when a key of a nested election
/// created in that transaction too may hide the one before it.
fn first_look(newest: Vec<KeyValue>, key: &str, revision: i64) -> Option<QueueState> {
    let mine = |kv: &KeyValue| kv.key == key.as_bytes();
    if newest
        .iter()
        .any(|kv| !mine(kv) && kv.create_revision == revision)
    {
        return None;
    }
    Some(QueueState {
        own_present: true,
        predecessor: before(newest, key, revision),
        revision,
    })
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

    /// Send the deletions of the keys of tries not granted, in one transaction.
    pub(super) async fn withdraw(&self, what: &str, deletes: Vec<RequestOp>) -> Result<()> {
        if !deletes.is_empty() {
            let txn = TxnRequest {
                success: deletes,
                ..Default::default()
            };
            self.txn(what, txn).await?;
        }
        Ok(())
    }

    /// Create this session's key in each election of `seats` where it has none (many
    /// per transaction), reading in the same transaction the election's newest keys (the
    /// first look at the queue) or, where a key of this session was there, that key.
    pub(super) async fn create(&self, seats: &[(ElectionName, Candidate)]) -> Result<Vec<Created>> {
        let keys = &self.shared.keys;
        let parts = seats
            .iter()
            .map(|(election, candidate)| {
                let key = self.key(election);
                let put = ops::put(&key, candidate.value().as_bytes(), self.lease);
                let txn = TxnRequest {
                    compare: vec![ops::created_at(&key, 0)],
                    success: vec![op(put), op(ops::newest_two(&keys.election_range(election)))],
                    failure: vec![op(ops::get_key_only(&key))],
                };
                (vec![op(Request::Txn(txn))], Some(key))
            })
            .collect();
        let got = self.enqueues.run(parts, true).await;
        let mut created = Vec::with_capacity(seats.len());
        for ((election, _), got) in seats.iter().zip(got) {
            let answer = got?;
            let Some(ResponseOp {
                response: Some(Response::Txn(txn)),
            }) = answer.responses.first()
            else {
                return Err(TAG.own(ErrorKind::Backend, "campaign: etcd answered another kind"));
            };
            let read = ops::read_in(&txn.responses, 0);
            if !txn.succeeded {
                let existing = read.first().map_or(0, |kv| kv.create_revision);
                created.push(Created::Exists(existing));
                continue;
            }
            self.queued(election, answer.revision);
            let key = self.key(election);
            created.push(Created::New(
                answer.revision,
                first_look(read, &key, answer.revision),
            ));
        }
        Ok(created)
    }

    /// This session's key in `election` for a new (or continuing) candidacy: created, or
    /// with `reuse` the key of its candidacy there not yet granted. A key left from an
    /// earlier grant or candidacy is replaced, so every grant gets a new, higher token.
    /// The key's create revision, and the first look at the queue if creating it gave
    /// one.
    pub(super) async fn join(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
        reuse: bool,
    ) -> Result<(i64, Option<QueueState>)> {
        let seat = [(election.clone(), candidate.clone())];
        for _ in 0..4 {
            let existing = match self.create(&seat).await?.pop() {
                Some(Created::New(revision, look)) => return Ok((revision, look)),
                Some(Created::Exists(revision)) if revision > 0 => revision,
                _ => continue, // deleted in between: try again
            };
            let reusable = reuse
                && self
                    .lock()
                    .get(election)
                    .is_some_and(|c| c.revision == existing && !c.granted);
            if reusable {
                return Ok((existing, None));
            }
            let txn = ops::delete_if_created_at(&self.key(election), existing);
            self.txn("campaign: replace an old key", txn).await?;
        }
        Err(TAG.own(
            ErrorKind::Backend,
            format!("campaign {election}: the candidate key keeps changing under us"),
        ))
    }

    /// A try's answer for this session's new key in `election`, created at `revision`
    /// (`look`: the first look at the queue, if creating it gave one): granted if it is
    /// first in the queue; otherwise forgotten, and its deletion added to `withdraw`.
    pub(super) async fn settle(
        self: &Arc<Self>,
        election: &ElectionName,
        revision: i64,
        look: Option<QueueState>,
        withdraw: &mut Vec<RequestOp>,
    ) -> Result<Option<FencingToken>> {
        let key = self.key(election);
        let look = match look {
            Some(look) => look,
            None => {
                let range = self.shared.keys.election_range(election);
                self.look_at_queue(&range, &key, revision).await?
            }
        };
        if look.own_present && look.predecessor.is_none() {
            let own_watch = self.watch_own(&key, revision);
            self.granted(election, revision, own_watch);
            return Ok(Some(revision_token(revision)));
        }
        self.forget(election, None);
        withdraw.push(op(Request::Txn(ops::delete_if_created_at(&key, revision))));
        Ok(None)
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

    /// Watch this session's `key` for deletion. Served by the backend's prefix watch
    /// (no request; see [`crate::watches`]), so not counted; a wake-up is.
    pub(super) fn watch_own(&self, key: &str, revision: i64) -> KeyWatch {
        self.shared.watches.watch_deletes(key, revision + 1)
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
