//! The engine's reads and conditional writes, many per etcd transaction: each is one
//! operation of an outer transaction without compares (a range read, or a nested
//! transaction with its own compare and branches, etcd 3.3+), so each commits or fails
//! on its own election while they share one round trip. The first goes out at once;
//! those asked for while a transaction is in flight go out together when it returns
//! (a node taking thousands of seats sends thousands at once, and each transaction
//! costs etcd a copy of its buffer of uncommitted writes). No timer: a lone write
//! waits for nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prost::Message;
use tenure_core::backend::lock;
use tenure_core::{ErrorKind, Result};
use tokio::sync::oneshot;

use crate::error::TAG;
use crate::proto::{Request, RequestOp, ResponseOp, TxnRequest};
use crate::shared::Shared;

/// Operations per transaction: etcd's default `--max-txn-ops` is 128, and a nested
/// transaction may have only what its outer one leaves.
const MAX_OPS: usize = 128;

/// Parts per transaction at most: half of [`MAX_OPS`], so each nested write may have
/// as many operations.
pub(crate) const MAX_PARTS: usize = MAX_OPS / 2;

/// Bytes per transaction, within etcd's default `--max-request-bytes` of 1.5 MiB.
const MAX_BYTES: usize = 1024 * 1024;

/// One caller's operation.
struct Part {
    op: RequestOp,
    /// The key no other part of the same transaction may write (an election's revision
    /// key: etcd refuses a transaction that puts one key twice).
    owns: Option<String>,
    reply: oneshot::Sender<Result<ResponseOp>>,
}

impl Part {
    /// The operations the part takes from a transaction's budget (a nested
    /// transaction's largest list, since its branches share the outer budget).
    fn ops(&self) -> usize {
        match &self.op.request {
            Some(Request::Txn(t)) => t.compare.len().max(t.success.len()).max(t.failure.len()),
            _ => 0,
        }
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
    queue: Mutex<Queue>,
}

impl Gather {
    pub(crate) fn new(shared: Arc<Shared>) -> Arc<Self> {
        Arc::new(Gather {
            shared,
            queue: Mutex::new(Queue::default()),
        })
    }

    /// Run `ops` (each with the key it owns), in as few transactions as the limits
    /// allow; one answer per operation, in order. The transaction's error is each of
    /// its operations' error.
    pub(crate) async fn run(
        self: &Arc<Self>,
        ops: Vec<(RequestOp, Option<String>)>,
    ) -> Vec<Result<ResponseOp>> {
        let mut answers = Vec::with_capacity(ops.len());
        let start = {
            let mut q = lock(&self.queue);
            for (op, owns) in ops {
                let (reply, answer) = oneshot::channel();
                q.parts.push(Part { op, owns, reply });
                answers.push(answer);
            }
            !std::mem::replace(&mut q.sending, true)
        };
        if start {
            // A task of its own, so that a caller dropped half-way does not strand the
            // others' parts.
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

    async fn send_all(self: Arc<Self>) {
        loop {
            let parts = {
                let mut q = lock(&self.queue);
                q.parts.retain(|p| !p.reply.is_closed());
                if q.parts.is_empty() {
                    q.sending = false;
                    return;
                }
                take(&mut q.parts)
            };
            self.send(parts).await;
        }
    }

    async fn send(&self, parts: Vec<Part>) {
        let (ops, replies): (Vec<RequestOp>, Vec<_>) =
            parts.into_iter().map(|p| (p.op, p.reply)).unzip();
        let txn = TxnRequest {
            success: ops,
            ..Default::default()
        };
        let shared = &self.shared;
        match shared.requests.call("commit", shared.client.txn(txn)).await {
            Ok(resp) => {
                let mut responses = resp.responses.into_iter();
                for reply in replies {
                    let answer = responses.next().ok_or_else(|| {
                        TAG.own(
                            ErrorKind::Backend,
                            "etcd answered fewer operations than sent",
                        )
                    });
                    let _ = reply.send(answer);
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

/// The parts of the next transaction, in order, within etcd's limits; a part whose key
/// another part of it owns waits for the next one.
fn take(queue: &mut Vec<Part>) -> Vec<Part> {
    let (mut taken, mut rest) = (Vec::new(), Vec::new());
    let (mut widest, mut bytes) = (0, 0);
    let mut owned = HashSet::new();
    for p in queue.drain(..) {
        let size = p.op.encoded_len();
        let fits = taken.is_empty()
            || (taken.len() < MAX_PARTS
                && taken.len() + 1 + widest.max(p.ops()) <= MAX_OPS
                && bytes + size <= MAX_BYTES);
        let free = p.owns.as_ref().is_none_or(|k| !owned.contains(k));
        if fits && free {
            widest = widest.max(p.ops());
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

    fn part(owns: Option<&str>, nested: usize) -> (Part, oneshot::Receiver<Result<ResponseOp>>) {
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
        (Part { op, owns, reply }, rx)
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
        let first = take(&mut queue);
        let owned: Vec<_> = first.iter().map(|p| p.owns.clone()).collect();
        let name = |s: &str| Some(s.to_string());
        assert_eq!(owned, vec![name("a"), name("b"), None, name("c")]);
        assert_eq!(queue.len(), 1, "the second write of a waits");
        for _ in 0..100 {
            let (p, rx) = part(None, 0);
            queue.push(p);
            keep.push(rx);
        }
        assert_eq!(take(&mut queue).len(), MAX_PARTS);
        let (wide, rx) = part(None, 100);
        keep.push(rx);
        let mut queue = vec![wide];
        for _ in 0..40 {
            let (p, rx) = part(None, 0);
            queue.push(p);
            keep.push(rx);
        }
        // 100 nested operations leave room for 27 more parts beside it.
        assert_eq!(take(&mut queue).len(), 28);
    }
}
