//! Many callers' reads and writes, many per etcd transaction: each caller's part is
//! operations of an outer transaction without compares (range reads, or a nested
//! transaction with its own compares and branches, etcd 3.3+), so each commits or fails
//! on its own while they share one round trip. The first goes out at once; those asked for while a
//! transaction is in flight go out together when it returns (a node taking thousands
//! of seats sends thousands at once, and each transaction costs etcd a copy of its
//! buffer of uncommitted writes). No timer: a lone write waits for nothing. The
//! election engine's reads and commits share one; a Go-layout session has one for its
//! new keys and one for its looks at the queues, so a read-only transaction stays one.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prost::Message;
use tenure_core::backend::lock;
use tenure_core::{ErrorKind, Result};
use tokio::sync::oneshot;

use crate::error::TAG;
use crate::ops::{self, op};
use crate::proto::{KeyValue, Request, RequestOp, Response, ResponseOp, TxnRequest};
use crate::shared::Shared;

/// Operations per transaction: etcd's default `--max-txn-ops` is 128, and a nested
/// transaction may have only what its outer one leaves.
pub(crate) const MAX_OPS: usize = 128;

/// Parts per transaction of writes: half of [`MAX_OPS`], so each nested write may have
/// as many operations.
pub(crate) const MAX_PARTS: usize = MAX_OPS / 2;

/// Bytes per transaction, within etcd's default `--max-request-bytes` of 1.5 MiB.
const MAX_BYTES: usize = 1024 * 1024;

type Reply = Result<Answer>;

/// One caller's operations, sent together.
struct Part {
    ops: Vec<RequestOp>,
    /// The key no other part of the same transaction may write (an election's revision
    /// key, a created key: etcd refuses a transaction that puts one key twice, nested
    /// ones included).
    owns: Option<String>,
    /// Whether the part creates `owns`: deleted again if the write succeeded but its
    /// caller has gone by the time the answer comes, so that a withdrawn campaign
    /// leaves no key in a queue that nobody waits on.
    creates: bool,
    reply: oneshot::Sender<Reply>,
}

impl Part {
    /// The operations its nested transactions take from what the outer one leaves
    /// (the largest list of the widest, since the branches share the outer budget).
    fn nested(&self) -> usize {
        let width = |o: &RequestOp| match &o.request {
            Some(Request::Txn(t)) => t.compare.len().max(t.success.len()).max(t.failure.len()),
            _ => 0,
        };
        self.ops.iter().map(width).max().unwrap_or(0)
    }
}

/// What a part got back.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The revision of the transaction (of the keys it created, if it wrote).
    pub(crate) revision: i64,
    /// The answers to the part's operations (a nested transaction's: to its branch's),
    /// in order.
    pub(crate) responses: Vec<ResponseOp>,
}

impl Answer {
    /// The keys read by the part's `n`th range operation.
    pub(crate) fn read(&self, n: usize) -> Vec<KeyValue> {
        ops::read_in(&self.responses, n)
    }
}

#[derive(Default)]
struct Queue {
    parts: Vec<Part>,
    /// Whether a task is sending (it takes the parts queued meanwhile).
    sending: bool,
}

/// Gathers operations into transactions.
pub(crate) struct Gather {
    shared: Arc<Shared>,
    /// The request's name in counts and errors.
    what: &'static str,
    /// Parts per transaction at most (within [`MAX_OPS`] in any case).
    max_parts: usize,
    queue: Mutex<Queue>,
}

impl Gather {
    pub(crate) fn new(shared: Arc<Shared>, what: &'static str, max_parts: usize) -> Arc<Self> {
        Arc::new(Gather {
            shared,
            what,
            max_parts,
            queue: Mutex::new(Queue::default()),
        })
    }

    /// Run `parts` (each operations sent together, with the key they own, which they
    /// `creates` or not), in as few transactions as the limits allow; one answer per
    /// part, in order. The transaction's error is each of its parts' error. A part
    /// whose caller has gone before it is sent is not sent.
    pub(crate) async fn run(
        self: &Arc<Self>,
        parts: Vec<(Vec<RequestOp>, Option<String>)>,
        creates: bool,
    ) -> Vec<Reply> {
        let mut answers = Vec::with_capacity(parts.len());
        let start = {
            let mut q = lock(&self.queue);
            for (ops, owns) in parts {
                let (reply, answer) = oneshot::channel();
                q.parts.push(Part {
                    ops,
                    owns,
                    creates,
                    reply,
                });
                answers.push(answer);
            }
            !std::mem::replace(&mut q.sending, true)
        };
        if start {
            // A task of its own, so that a caller dropped half-way (a campaign
            // withdrawn) does not strand the others' parts.
            tokio::spawn(self.clone().send_all());
        }
        let mut out = Vec::with_capacity(answers.len());
        for answer in answers {
            out.push(answer.await.unwrap_or_else(|_| {
                Err(TAG.own(ErrorKind::Unavailable, "the batch was dropped unsent"))
            }));
        }
        out
    }

    /// Run `ops` together, as one part that creates the key `creates` names (if any).
    pub(crate) async fn one(
        self: &Arc<Self>,
        ops: Vec<RequestOp>,
        creates: Option<String>,
    ) -> Result<Answer> {
        let creating = creates.is_some();
        let mut got = self.run(vec![(ops, creates)], creating).await;
        got.pop().unwrap_or_else(|| Err(self.odd("no answer")))
    }

    fn odd(&self, what: &str) -> tenure_core::Error {
        TAG.own(ErrorKind::Backend, format!("{}: {what}", self.what))
    }

    async fn send_all(self: Arc<Self>) {
        loop {
            let parts = {
                let mut q = lock(&self.queue);
                q.parts.retain(|p| !p.reply.is_closed());
                if q.parts.is_empty() {
                    q.sending = false;
                    return;
                }
                take(&mut q.parts, self.max_parts)
            };
            self.send(parts).await;
        }
    }

    async fn send(&self, parts: Vec<Part>) {
        let mut txn = TxnRequest::default();
        let mut replies = Vec::with_capacity(parts.len());
        for p in parts {
            replies.push((p.ops.len(), p.owns.filter(|_| p.creates), p.reply));
            txn.success.extend(p.ops);
        }
        let shared = &self.shared;
        let resp = match shared.call(self.what, txn).await {
            Ok(resp) => resp,
            Err(e) => {
                for (_, _, reply) in replies {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        let revision = ops::revision(&resp.header);
        let mut responses = resp.responses.into_iter();
        let mut orphans = TxnRequest::default();
        for (n, creates, reply) in replies {
            let answer = Some(Answer {
                revision,
                responses: responses.by_ref().take(n).collect(),
            })
            .filter(|a| a.responses.len() == n)
            .ok_or_else(|| self.odd("etcd answered fewer operations than sent"));
            // The caller has gone: a key its write created is nobody's.
            if let (Err(Ok(answer)), Some(key)) = (reply.send(answer), creates) {
                if wrote(&answer.responses) {
                    let delete = ops::delete_if_created_at(&key, revision);
                    orphans.success.push(op(Request::Txn(delete)));
                }
            }
        }
        if !orphans.success.is_empty() {
            // Each on its own (a key changed meanwhile stays); best effort: a key left
            // over goes with the session.
            let _ = shared.call("withdraw", orphans).await;
        }
    }
}

/// Whether a part's writes were applied (no nested transaction's compares failed).
fn wrote(answers: &[ResponseOp]) -> bool {
    !answers
        .iter()
        .any(|a| matches!(&a.response, Some(Response::Txn(t)) if !t.succeeded))
}

/// The parts of the next transaction, in order, within etcd's limits and `max_parts`;
/// a part whose key another part of it owns waits for the next one.
fn take(queue: &mut Vec<Part>, max_parts: usize) -> Vec<Part> {
    let (mut taken, mut rest) = (Vec::new(), Vec::new());
    let (mut count, mut widest, mut bytes) = (0, 0, 0);
    let mut owned = HashSet::new();
    for p in queue.drain(..) {
        let size: usize = p.ops.iter().map(Message::encoded_len).sum();
        let fits = taken.is_empty()
            || (taken.len() < max_parts
                && count + p.ops.len() + widest.max(p.nested()) <= MAX_OPS
                && bytes + size <= MAX_BYTES);
        let free = p.owns.as_ref().is_none_or(|k| !owned.contains(k));
        if fits && free {
            count += p.ops.len();
            widest = widest.max(p.nested());
            bytes += size;
            if let Some(k) = &p.owns {
                owned.insert(k.clone());
            }
            taken.push(p);
        } else {
            rest.push(p);
        }
    }
    *queue = rest;
    taken
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{self, op};

    fn part(owns: Option<&str>, nested: usize) -> (Part, oneshot::Receiver<Reply>) {
        let (reply, rx) = oneshot::channel();
        let op = if nested == 0 {
            op(ops::get("k"))
        } else {
            op(Request::Txn(TxnRequest {
                success: (0..nested).map(|_| op(ops::get("k"))).collect(),
                ..Default::default()
            }))
        };
        let owns = owns.map(str::to_string);
        let creates = false;
        let ops = vec![op];
        (
            Part {
                ops,
                owns,
                creates,
                reply,
            },
            rx,
        )
    }

    #[test]
    fn a_transaction_writes_each_election_once_and_keeps_within_the_limits() {
        let mut keep = Vec::new();
        let mut queue = Vec::new();
        for owns in [Some("a"), Some("b"), Some("a"), None, Some("c")] {
            let (p, rx) = part(owns, 3);
            queue.push(p);
            keep.push(rx);
        }
        let first = take(&mut queue, MAX_PARTS);
        let owned: Vec<_> = first.iter().map(|p| p.owns.clone()).collect();
        let name = |s: &str| Some(s.to_string());
        assert_eq!(owned, vec![name("a"), name("b"), None, name("c")]);
        assert_eq!(queue.len(), 1, "the second write of a waits");
        for _ in 0..100 {
            let (p, rx) = part(None, 0);
            queue.push(p);
            keep.push(rx);
        }
        assert_eq!(take(&mut queue, MAX_PARTS).len(), MAX_PARTS);
        let (wide, rx) = part(None, 100);
        keep.push(rx);
        let mut queue = vec![wide];
        for _ in 0..40 {
            let (p, rx) = part(None, 0);
            queue.push(p);
            keep.push(rx);
        }
        // 100 nested operations leave room for 27 more parts beside it.
        assert_eq!(take(&mut queue, MAX_PARTS).len(), 28);
        // Reads alone: as many as etcd takes.
        let mut queue = Vec::new();
        for _ in 0..200 {
            let (p, rx) = part(None, 0);
            queue.push(p);
            keep.push(rx);
        }
        assert_eq!(take(&mut queue, MAX_OPS).len(), MAX_OPS);
    }

    #[test]
    fn a_write_counts_as_applied_unless_its_compares_failed() {
        let txn = |succeeded| ResponseOp {
            response: Some(Response::Txn(crate::proto::TxnResponse {
                succeeded,
                ..Default::default()
            })),
        };
        assert!(wrote(&[txn(true), ResponseOp::default()]));
        assert!(!wrote(&[txn(true), txn(false)]));
    }
}
