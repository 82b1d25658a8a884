//! Campaigns, grants and releases in the tenure layout: a queue key per candidacy,
//! ordered by priority then arrival, and a seat key that the best waiter takes by a
//! transaction (see [`crate::queue`] and [`SeatKeys`]).

use std::sync::Arc;

use tenure_core::backend::revision_token;
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Result, Retry};
use tokio_util::sync::CancellationToken;

use super::{created_at, pause, Candidacy, Inner};
use crate::error::TAG;
use crate::keys::{decode_entry, encode_entry, SeatKeys};
use crate::ops::{self, op};
use crate::proto::{Compare, KeyValue, RequestOp, TxnRequest};
use crate::queue::{ahead_of, next_step, Handover, Look, SeatState, Step};
use crate::watcher::Fired;

/// Seats per transaction of a batch (try_campaign_many, resign_many): up to three
/// operations and two compares each, within etcd's default limit of 128 operations.
pub(crate) const SEAT_BATCH: usize = 32;

impl Inner {
    fn seat_keys(&self, election: &ElectionName, candidate: &Candidate) -> SeatKeys {
        self.shared
            .keys
            .seat_keys(election, self.lease, candidate.priority())
    }

    /// Campaign in the tenure layout: queue, wait on the key just ahead (or on the seat
    /// when first), and take the seat when it is free and no key is ahead.
    pub(super) async fn campaign_seat(
        self: &Arc<Self>,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let keys = self.seat_keys(election, candidate);
        let value = encode_entry(candidate);
        let (mut revision, first) = self.join_seat(election, &keys, &value, candidate).await?;
        let mut next = Some(first);
        let mut own_watch = self.watch_own(&keys.queue, revision);
        loop {
            self.life.check_open()?;
            let look = match next.take() {
                Some(look) => look,
                None => self.look_seat(&keys, revision).await?,
            };
            match next_step(&look, &keys, revision, self.lease) {
                Step::Held(token) => {
                    let queue = look.own.then(|| (keys.queue.clone(), revision));
                    self.granted_seat(election, &keys, token, queue);
                    return Ok(revision_token(token));
                }
                Step::ClearStale(create) => {
                    let txn = TxnRequest {
                        compare: vec![ops::created_at(&keys.seat, create)],
                        success: vec![op(ops::delete(&keys.seat)), op(ops::delete(&keys.notice))],
                        failure: Vec::new(),
                    };
                    self.txn("campaign: clear an old seat", txn).await?;
                }
                Step::Requeue => {
                    let (again, look) = self.join_seat(election, &keys, &value, candidate).await?;
                    revision = again;
                    next = Some(look);
                    own_watch = self.watch_own(&keys.queue, revision);
                }
                Step::Take { in_order, handover } => {
                    let taken = self
                        .take_seat(&keys, &value, revision, in_order, handover)
                        .await?;
                    if let Some(token) = taken {
                        return Ok(self.granted_queued(election, &keys, token, revision));
                    }
                }
                Step::HandOver(request) => {
                    if let Some(token) = self.hand_seat(&keys, &value, revision, request).await? {
                        return Ok(self.granted_queued(election, &keys, token, revision));
                    }
                }
                Step::Wait { key, then_take } => {
                    let mut before = self.watcher.watch_deletes(&key, look.revision + 1);
                    tokio::select! {
                        fired = before.fired() => {
                            self.shared.count();
                            if let Fired::Broken(e) = fired {
                                return Err(e);
                            }
                            if then_take {
                                // The seat (or its holder's key) went and nobody was
                                // ahead: take it now; the transaction checks the rest.
                                if let Some(token) = self
                                    .take_seat(&keys, &value, revision, true, None)
                                    .await?
                                {
                                    return Ok(self.granted_queued(election, &keys, token, revision));
                                }
                            }
                        }
                        fired = own_watch.fired() => {
                            self.shared.count();
                            if let Fired::Broken(e) = fired {
                                return Err(e);
                            }
                            // Look again: the key may be gone, or the seat handed to us.
                            own_watch = self.watch_own(&keys.queue, revision);
                        }
                        _ = self.life.stopped() => return Err(self.life.closed_error()),
                    }
                }
            }
        }
    }

    /// The reads that come with a new queue key: the seat (with its entry), the two
    /// newest keys of the bucket, the last key of the buckets ahead, the handover
    /// request.
    fn join_reads(keys: &SeatKeys) -> Vec<RequestOp> {
        vec![
            op(ops::get(&keys.seat)),
            op(ops::newest_two(&keys.bucket)),
            op(ops::last_key_in(&keys.range, keys.bucket.as_bytes())),
            op(ops::get(&keys.handover)),
        ]
    }

    /// A look from the reads of [`join_reads`](Self::join_reads) or of a look
    /// (`read(n)`: the `n`th range answer), for the queue key created at `revision`.
    fn look_from(
        keys: &SeatKeys,
        revision: i64,
        own: bool,
        at: i64,
        read: impl Fn(usize) -> Vec<KeyValue>,
    ) -> Look {
        let seat = read(0).first().map(SeatState::from_kv);
        let ahead = ahead_of(&keys.queue, revision, &read(1), &read(2));
        let handover = read(3).first().map(Handover::from_kv);
        Look {
            own,
            ahead,
            seat,
            handover,
            revision: at,
        }
    }

    /// Create this session's queue key in `election` (replacing one left from an
    /// earlier candidacy), and tell the holder to step down if `candidate` has a higher
    /// priority than a holder that may be preempted. Returns the key's create revision
    /// and the first look, read in the same transaction.
    async fn join_seat(
        &self,
        election: &ElectionName,
        keys: &SeatKeys,
        value: &[u8],
        candidate: &Candidate,
    ) -> Result<(i64, Look)> {
        // The core retries a campaign whose watch broke without withdrawing it: keep
        // the queue key of the earlier attempt, and its place, if it is still there.
        let earlier = self
            .lock()
            .get(election)
            .filter(|c| !c.granted)
            .and_then(|c| c.queue.clone())
            .and_then(|(key, revision)| (key == keys.queue && revision > 0).then_some(revision));
        let kept = match earlier {
            Some(revision) => self.rejoin_seat(keys, value, revision).await?,
            None => None,
        };
        let (revision, look) = match kept {
            Some(kept) => kept,
            None => self.enqueue_seat(election, keys, value).await?,
        };
        self.lock().insert(
            election.clone(),
            Candidacy {
                revision,
                granted: false,
                monitor: None,
                queue: Some((keys.queue.clone(), revision)),
            },
        );
        if let Some(seat) = &look.seat {
            let holder = decode_entry(&seat.value);
            if seat.lease != self.lease
                && holder.preemptible
                && candidate.priority() > holder.priority
            {
                // Tell the holder (its session watches the notice key), if it still
                // holds the seat it held when we read it.
                let txn = TxnRequest {
                    compare: vec![
                        ops::created_at(&keys.seat, seat.create),
                        ops::created_at(&keys.notice, seat.create),
                    ],
                    success: vec![op(ops::delete(&keys.notice))],
                    failure: Vec::new(),
                };
                self.txn("campaign: preempt the holder", txn).await?;
            }
        }
        Ok((revision, look))
    }

    /// Keep this session's queue key created at `revision` if it is still there with
    /// the same entry: the key's revision and a look, or `None`.
    async fn rejoin_seat(
        &self,
        keys: &SeatKeys,
        value: &[u8],
        revision: i64,
    ) -> Result<Option<(i64, Look)>> {
        let txn = TxnRequest {
            compare: vec![
                ops::created_at(&keys.queue, revision),
                ops::value_is(&keys.queue, value),
            ],
            success: vec![
                op(ops::get(&keys.seat)),
                op(ops::predecessor(&keys.bucket, revision)),
                op(ops::last_key_in(&keys.range, keys.bucket.as_bytes())),
                op(ops::get(&keys.handover)),
            ],
            failure: Vec::new(),
        };
        let resp = self.txn("campaign: keep the queue key", txn).await?;
        if !resp.succeeded {
            return Ok(None);
        }
        let at = ops::revision(&resp.header);
        let look = Self::look_from(keys, revision, true, at, |n| ops::read_result(&resp, n));
        Ok(Some((revision, look)))
    }

    /// Create the queue key (with the reads of [`join_reads`](Self::join_reads)), in a
    /// shared transaction if others are asked for at the same time.
    async fn enqueue_seat(
        &self,
        election: &ElectionName,
        keys: &SeatKeys,
        value: &[u8],
    ) -> Result<(i64, Look)> {
        // Known before it is written, so that a resign of this campaign withdraws the
        // key even if the campaign is dropped while the transaction is out.
        self.lock().insert(
            election.clone(),
            Candidacy {
                revision: 0,
                granted: false,
                monitor: None,
                queue: Some((keys.queue.clone(), 0)),
            },
        );
        let mut success = vec![op(ops::put(&keys.queue, value, self.lease))];
        success.extend(Self::join_reads(keys));
        let compare = vec![ops::created_at(&keys.queue, 0)];
        let creates = vec![keys.queue.clone()];
        let batched = self
            .enqueues
            .run(compare.clone(), success.clone(), creates)
            .await?;
        match batched {
            Some(answer) => {
                let r = answer.revision;
                Ok((r, Self::look_from(keys, r, true, r, |n| answer.read(n))))
            }
            None => self.join_alone(election, keys, compare, success).await,
        }
    }

    /// [`join_seat`](Self::join_seat)'s transaction on its own, when the batch it was
    /// in failed: replaces a queue key of this session left from before.
    async fn join_alone(
        &self,
        election: &ElectionName,
        keys: &SeatKeys,
        compare: Vec<Compare>,
        success: Vec<RequestOp>,
    ) -> Result<(i64, Look)> {
        for _ in 0..4 {
            let txn = TxnRequest {
                compare: compare.clone(),
                success: success.clone(),
                failure: vec![op(ops::get_key_only(&keys.queue))],
            };
            let resp = self.txn("campaign", txn).await?;
            if resp.succeeded {
                let r = ops::revision(&resp.header);
                return Ok((
                    r,
                    Self::look_from(keys, r, true, r, |n| ops::read_result(&resp, n)),
                ));
            }
            let existing = ops::read_result(&resp, 0)
                .first()
                .map_or(0, |kv| kv.create_revision);
            if existing != 0 {
                let txn = ops::delete_if_created_at(&keys.queue, existing);
                self.txn("campaign: replace an old key", txn).await?;
            }
        }
        Err(TAG.own(
            ErrorKind::Backend,
            format!("campaign {election}: the queue key keeps changing under us"),
        ))
    }

    /// Read where this candidacy (queue key created at `revision`) stands.
    async fn look_seat(&self, keys: &SeatKeys, revision: i64) -> Result<Look> {
        let reads = vec![
            op(ops::get_key_only(&keys.queue)),
            op(ops::get_key_only(&keys.seat)),
            op(ops::predecessor(&keys.bucket, revision)),
            op(ops::last_key_in(&keys.range, keys.bucket.as_bytes())),
            op(ops::get(&keys.handover)),
        ];
        let answer = self.look(reads).await?;
        let own = created_at(&answer.read(0), revision);
        Ok(Self::look_from(keys, revision, own, answer.revision, |n| {
            answer.read(n + 1)
        }))
    }

    /// Take the free seat for the queue key created at `revision`: the transaction
    /// checks that the seat is free, the key still there, and (`in_order`) that no key
    /// is ahead of it, and that the handover request is the one read (`handover`: its
    /// mod revision, used up here) or none. The seat's create revision, or `None` if a
    /// check failed.
    async fn take_seat(
        &self,
        keys: &SeatKeys,
        value: &[u8],
        revision: i64,
        in_order: bool,
        handover: Option<i64>,
    ) -> Result<Option<i64>> {
        let mut compare = vec![
            ops::created_at(&keys.seat, 0),
            ops::created_at(&keys.queue, revision),
        ];
        if in_order {
            compare.push(ops::none_in(&keys.range, keys.bucket.as_bytes()));
            compare.push(ops::none_older_under(&keys.bucket, revision));
        }
        let mut success = vec![
            op(ops::put(&keys.seat, value, self.lease)),
            op(ops::put(&keys.notice, b"", self.lease)),
        ];
        match handover {
            Some(modified) => {
                compare.push(ops::modified_at(&keys.handover, modified));
                success.push(op(ops::delete(&keys.handover)));
            }
            None => compare.push(ops::created_at(&keys.handover, 0)),
        }
        let creates = vec![keys.seat.clone(), keys.notice.clone()];
        if let Some(answer) = self
            .takes
            .run(compare.clone(), success.clone(), creates)
            .await?
        {
            return Ok(Some(answer.revision));
        }
        // The batch failed, maybe on another seat's check: on our own.
        let txn = TxnRequest {
            compare,
            success,
            failure: Vec::new(),
        };
        let resp = self.txn("campaign: take the seat", txn).await?;
        Ok(resp.succeeded.then(|| ops::revision(&resp.header)))
    }

    /// First in line with a handover asked for another waiter: give that waiter the
    /// seat (on its lease, with its entry, its queue key deleted so that its campaign
    /// wakes up and finds the seat its own). If it has gone, take the seat in order,
    /// using the request up. Returns our token if we took the seat.
    async fn hand_seat(
        &self,
        keys: &SeatKeys,
        value: &[u8],
        revision: i64,
        request: Handover,
    ) -> Result<Option<i64>> {
        let target = if request.key.starts_with(&keys.range) {
            let read = self.shared.client.range(ops::get(&request.key));
            let resp = self
                .shared
                .requests
                .call("campaign: read the handover target", read)
                .await?;
            resp.kvs
                .into_iter()
                .find(|kv| kv.create_revision == request.revision)
        } else {
            None
        };
        let Some(target) = target else {
            return self
                .take_seat(keys, value, revision, true, Some(request.modified))
                .await;
        };
        let txn = TxnRequest {
            compare: vec![
                ops::created_at(&keys.seat, 0),
                ops::modified_at(&keys.handover, request.modified),
                ops::created_at(&request.key, request.revision),
            ],
            success: vec![
                op(ops::put(&keys.seat, &target.value, target.lease)),
                op(ops::put(&keys.notice, b"", target.lease)),
                op(ops::delete(&keys.handover)),
                op(ops::delete(&request.key)),
            ],
            failure: Vec::new(),
        };
        self.txn("campaign: hand the seat over", txn).await?;
        Ok(None)
    }

    /// Take each free seat of `chunk` (at most [`SEAT_BATCH`]): free means no holder and
    /// nobody queued. One transaction when all are free; else one read to see which
    /// are, one transaction for those, and seat by seat if that fails too.
    pub(super) async fn try_seats(
        self: &Arc<Self>,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let keys: Vec<SeatKeys> = chunk.iter().map(|(e, c)| self.seat_keys(e, c)).collect();
        let all: Vec<usize> = (0..chunk.len()).collect();
        if let Some(revision) = self.try_take(chunk, &keys, &all).await? {
            return Ok(self.record_takes(chunk, &keys, &all, revision));
        }
        if chunk.len() == 1 {
            return Ok(vec![None]);
        }
        let mut reads = TxnRequest::default();
        for k in &keys {
            reads.success.push(op(ops::get_key_only(&k.seat)));
            reads.success.push(op(ops::any_under(&k.range)));
        }
        let resp = self.txn("try_campaign_many: read", reads).await?;
        let free: Vec<usize> = (0..chunk.len())
            .filter(|i| {
                ops::read_result(&resp, 2 * i).is_empty()
                    && ops::read_result(&resp, 2 * i + 1).is_empty()
            })
            .collect();
        if free.is_empty() {
            return Ok(vec![None; chunk.len()]);
        }
        if let Some(revision) = self.try_take(chunk, &keys, &free).await? {
            return Ok(self.record_takes(chunk, &keys, &free, revision));
        }
        let mut answers = vec![None; chunk.len()];
        for i in free {
            if let Some(revision) = self.try_take(chunk, &keys, &[i]).await? {
                answers[i] = self.record_takes(chunk, &keys, &[i], revision)[i];
            }
        }
        Ok(answers)
    }

    /// One transaction taking the seats `which` of `chunk` if all are free; its
    /// revision if it did.
    async fn try_take(
        &self,
        chunk: &[(ElectionName, Candidate)],
        keys: &[SeatKeys],
        which: &[usize],
    ) -> Result<Option<i64>> {
        let mut txn = TxnRequest::default();
        for &i in which {
            let (k, (_, candidate)) = (&keys[i], &chunk[i]);
            txn.compare.push(ops::created_at(&k.seat, 0));
            txn.compare.push(ops::none_in(&k.range, &k.range_end));
            txn.success
                .push(op(ops::put(&k.seat, &encode_entry(candidate), self.lease)));
            txn.success.push(op(ops::put(&k.notice, b"", self.lease)));
            // A handover asked while nobody queues is used up by this grant.
            txn.success.push(op(ops::delete(&k.handover)));
        }
        let resp = self.txn("try_campaign", txn).await?;
        Ok(resp.succeeded.then(|| ops::revision(&resp.header)))
    }

    /// Record the seats `which` of `chunk` taken at `revision`; the answers for the
    /// whole chunk.
    fn record_takes(
        self: &Arc<Self>,
        chunk: &[(ElectionName, Candidate)],
        keys: &[SeatKeys],
        which: &[usize],
        revision: i64,
    ) -> Vec<Option<FencingToken>> {
        let mut answers = vec![None; chunk.len()];
        for &i in which {
            self.granted_seat(&chunk[i].0, &keys[i], revision, None);
            answers[i] = Some(revision_token(revision));
        }
        answers
    }

    /// Record the grant of the seat created at `token` and watch it while held.
    fn granted_seat(
        self: &Arc<Self>,
        election: &ElectionName,
        keys: &SeatKeys,
        token: i64,
        queue: Option<(String, i64)>,
    ) {
        let stop = self.life.child_token();
        self.lock().insert(
            election.clone(),
            Candidacy {
                revision: token,
                granted: true,
                monitor: Some(stop.clone()),
                queue,
            },
        );
        let (seat, notice) = (keys.seat.clone(), keys.notice.clone());
        tokio::spawn(
            self.clone()
                .monitor_seat(election.clone(), seat, notice, token, stop),
        );
    }

    /// [`granted_seat`](Self::granted_seat) to the candidacy whose queue key (created
    /// at `revision`) stays in the store while it holds the seat; its fencing token.
    fn granted_queued(
        self: &Arc<Self>,
        election: &ElectionName,
        keys: &SeatKeys,
        token: i64,
        revision: i64,
    ) -> FencingToken {
        self.granted_seat(election, keys, token, Some((keys.queue.clone(), revision)));
        revision_token(token)
    }

    /// While the seat created at `token` is held: report its deletion by anyone (an
    /// operator, lease expiry) as a loss, and the deletion of the notice key (a
    /// higher priority queued, or a handover was asked) as a preemption. Each is read
    /// back from etcd before it is reported; the reads of many seats share
    /// transactions.
    async fn monitor_seat(
        self: Arc<Self>,
        election: ElectionName,
        seat: String,
        notice: String,
        token: i64,
        stop: CancellationToken,
    ) {
        let retry = Retry::default();
        let mut attempt = 0u32;
        loop {
            let mut seat_watch = self.watcher.watch_deletes(&seat, token + 1);
            let mut notice_watch = self.watcher.watch_deletes(&notice, token + 1);
            let fired = tokio::select! {
                _ = stop.cancelled() => return,
                f = seat_watch.fired() => f,
                f = notice_watch.fired() => f,
            };
            let state = match fired {
                Fired::Deleted | Fired::Compacted => {
                    let reads = vec![op(ops::get_key_only(&seat)), op(ops::get_key_only(&notice))];
                    let answer = self.looks.run(Vec::new(), reads, Vec::new()).await;
                    answer.ok().flatten().map(|answer| {
                        let here = |n| created_at(&answer.read(n), token);
                        (here(0), here(1))
                    })
                }
                Fired::Broken(_) => None,
            };
            match state {
                Some((false, _)) => {
                    if self.still_held(&election, token) {
                        let queue = self
                            .take_candidacy(&election, Some(revision_token(token)))
                            .and_then(|c| c.queue);
                        self.events.election_lost(
                            &election,
                            revision_token(token),
                            "the seat key was deleted in etcd",
                        );
                        if let Some((key, revision)) = queue {
                            // Our place in the queue goes with the seat.
                            let txn = ops::delete_if_created_at(&key, revision);
                            let _ = self.txn("release: withdraw", txn).await;
                        }
                    }
                    return;
                }
                Some((true, false)) => {
                    if self.still_held(&election, token) {
                        self.events.preempted(&election, revision_token(token));
                    }
                    return;
                }
                Some((true, true)) => attempt = 0,
                None => {
                    if !pause(&retry, &mut attempt, &stop).await {
                        return;
                    }
                }
            }
        }
    }

    /// Give up `grants` (at most [`SEAT_BATCH`]): with a token, only the seat created
    /// at it; without, whatever this session has in the election (a seat on its lease,
    /// its queue key). One transaction for all; seat by seat if a check fails.
    pub(super) async fn release_seats(
        &self,
        grants: &[(ElectionName, Option<FencingToken>)],
    ) -> Result<()> {
        let mut parts = Vec::with_capacity(grants.len());
        for (election, token) in grants {
            let queue = self.take_candidacy(election, *token).and_then(|c| c.queue);
            let keys = self.shared.keys.seat_keys(election, self.lease, 0);
            parts.push((keys, *token, queue));
        }
        if parts.len() > 1 {
            let mut txn = TxnRequest::default();
            for (keys, token, queue) in &parts {
                txn.compare.push(self.seat_is_ours(keys, *token));
                txn.success.push(op(ops::delete(&keys.seat)));
                txn.success.push(op(ops::delete(&keys.notice)));
                if let Some((key, _)) = queue {
                    txn.success.push(op(ops::delete(key)));
                }
            }
            if self.txn("resign", txn).await?.succeeded {
                return Ok(());
            }
        }
        for (keys, token, queue) in &parts {
            let withdraw: Vec<RequestOp> =
                queue.iter().map(|(key, _)| op(ops::delete(key))).collect();
            let mut success = vec![op(ops::delete(&keys.seat)), op(ops::delete(&keys.notice))];
            success.extend(withdraw.iter().cloned());
            let txn = TxnRequest {
                compare: vec![self.seat_is_ours(keys, *token)],
                success,
                failure: if token.is_none() {
                    withdraw
                } else {
                    Vec::new()
                },
            };
            let resp = self.txn("resign", txn).await?;
            if !resp.succeeded && token.is_some() {
                if let Some((key, revision)) = queue {
                    let txn = ops::delete_if_created_at(key, *revision);
                    self.txn("resign: withdraw", txn).await?;
                }
            }
        }
        Ok(())
    }

    /// "The seat is this grant's" (created at `token`), or with no token "the seat is
    /// on this session's lease".
    fn seat_is_ours(&self, keys: &SeatKeys, token: Option<FencingToken>) -> Compare {
        match token {
            Some(t) => ops::created_at(&keys.seat, i64::try_from(t.0).unwrap_or(i64::MAX)),
            None => ops::on_lease(&keys.seat, self.lease),
        }
    }
}
