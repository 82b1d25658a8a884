//! Many seats' small transactions sent as one: a campaign's first write (create the
//! key, read the key before it) and its looks at the queue are the same few operations
//! for every seat, and a node taking thousands of shards sends thousands of them at
//! once. Each costs etcd (3.4) a copy of its buffer of uncommitted writes, whatever its
//! size, so they are gathered: the first goes out at once, and those asked for while a
//! transaction is in flight go out together when it returns, up to [`MAX_OPS`]
//! operations. No timer: a lone campaign waits for nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tenure_core::backend::lock;
use tenure_core::{ErrorKind, Result};
use tokio::sync::oneshot;

use crate::error::TAG;
use crate::proto::{Compare, RequestOp, ResponseOp, TxnRequest};
use crate::shared::Shared;

/// Operations per transaction, within etcd's default `--max-txn-ops` of 128.
const MAX_OPS: usize = 128;

/// One caller's part of a transaction.
struct Part {
    compare: Vec<Compare>,
    success: Vec<RequestOp>,
    /// Keys the part creates: deleted again (if still of this transaction) when the
    /// caller has gone by the time the answer comes, so that a withdrawn campaign
    /// leaves no key in a queue that nobody waits on.
    creates: Vec<String>,
    reply: oneshot::Sender<Result<Option<Answer>>>,
}

/// What one part got back when the transaction succeeded.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The revision of the transaction (of the keys it created, if it wrote).
    pub(crate) revision: i64,
    /// The answers to the part's operations, in order.
    pub(crate) responses: Vec<ResponseOp>,
}

#[derive(Default)]
struct Queue {
    parts: Vec<Part>,
    /// Whether a task is sending (it takes the parts queued meanwhile).
    sending: bool,
}

/// Gathers parts into transactions; one per kind of part (write or read-only), so a
/// read-only transaction stays one.
pub(crate) struct Batcher {
    shared: Arc<Shared>,
    what: &'static str,
    queue: Mutex<Queue>,
}

impl Batcher {
    pub(crate) fn new(shared: Arc<Shared>, what: &'static str) -> Arc<Self> {
        Arc::new(Batcher {
            shared,
            what,
            queue: Mutex::new(Queue::default()),
        })
    }

    /// Run `compare` → `success` as part of a transaction; `creates` names the keys
    /// it creates. `Ok(None)` when a compare of the transaction failed: nothing of it
    /// was applied, and since it may have been another part's compare, the caller does
    /// the work on its own. A part whose caller has gone before it is sent is not sent.
    pub(crate) async fn run(
        self: &Arc<Self>,
        compare: Vec<Compare>,
        success: Vec<RequestOp>,
        creates: Vec<String>,
    ) -> Result<Option<Answer>> {
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut q = lock(&self.queue);
            q.parts.push(Part {
                compare,
                success,
                creates,
                reply,
            });
            !std::mem::replace(&mut q.sending, true)
        };
        if start {
            // A task of its own, so that a caller dropped half-way (a campaign
            // withdrawn) does not strand the others' parts.
            tokio::spawn(self.clone().send_all());
        }
        answer.await.unwrap_or_else(|_| {
            Err(TAG.own(ErrorKind::Unavailable, "the batch was dropped unsent"))
        })
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
                // etcd bounds the compares and the operations of a transaction each.
                let (mut compares, mut ops, mut take) = (0, 0, 0);
                for p in &q.parts {
                    compares += p.compare.len();
                    ops += p.success.len();
                    if take > 0 && (compares > MAX_OPS || ops > MAX_OPS) {
                        break;
                    }
                    take += 1;
                }
                q.parts.drain(..take).collect::<Vec<_>>()
            };
            self.send(parts).await;
        }
    }

    async fn send(&self, parts: Vec<Part>) {
        let mut txn = TxnRequest::default();
        let mut sizes = Vec::with_capacity(parts.len());
        let mut rest = Vec::with_capacity(parts.len());
        for p in parts {
            txn.compare.extend(p.compare);
            sizes.push(p.success.len());
            txn.success.extend(p.success);
            rest.push((p.creates, p.reply));
        }
        let shared = &self.shared;
        let result = shared
            .requests
            .call(self.what, shared.client.txn(txn))
            .await;
        let resp = match result {
            Ok(resp) => resp,
            Err(e) => {
                for (_, reply) in rest {
                    let _ = reply.send(Err(e.clone()));
                }
                return;
            }
        };
        if !resp.succeeded {
            for (_, reply) in rest {
                let _ = reply.send(Ok(None));
            }
            return;
        }
        let revision = crate::ops::revision(&resp.header);
        let mut responses = resp.responses.into_iter();
        let mut delivered = Vec::with_capacity(sizes.len());
        for ((creates, reply), n) in rest.into_iter().zip(sizes) {
            let answer = Answer {
                revision,
                responses: responses.by_ref().take(n).collect(),
            };
            delivered.push((creates, reply.send(Ok(Some(answer))).is_ok()));
        }
        let mut orphans = TxnRequest::default();
        for key in &orphaned(delivered) {
            orphans.compare.push(crate::ops::created_at(key, revision));
            orphans
                .success
                .push(crate::ops::op(crate::ops::delete(key)));
        }
        if !orphans.success.is_empty() {
            // One by one if the keys changed meanwhile; best effort: a key left over
            // goes with the session.
            if let Ok(r) = shared
                .requests
                .call("withdraw", shared.client.txn(orphans.clone()))
                .await
            {
                if !r.succeeded {
                    for (c, op) in orphans.compare.into_iter().zip(orphans.success) {
                        let one = TxnRequest {
                            compare: vec![c],
                            success: vec![op],
                            failure: Vec::new(),
                        };
                        let _ = shared
                            .requests
                            .call("withdraw", shared.client.txn(one))
                            .await;
                    }
                }
            }
        }
    }
}

/// The keys to delete again after a transaction: those created by parts whose caller
/// had gone (`false`), except a key another part also created and got (a campaign
/// withdrawn and started again, both parts sent together): it is that part's now.
fn orphaned(parts: Vec<(Vec<String>, bool)>) -> Vec<String> {
    let kept: HashSet<&String> = parts
        .iter()
        .filter(|(_, got)| *got)
        .flat_map(|(keys, _)| keys)
        .collect();
    let mut orphans: Vec<String> = parts
        .iter()
        .filter(|(_, got)| !*got)
        .flat_map(|(keys, _)| keys)
        .filter(|k| !kept.contains(k))
        .cloned()
        .collect();
    orphans.sort();
    orphans.dedup();
    orphans
}

impl Answer {
    /// The keys read by the part's `n`th range operation.
    pub(crate) fn read(&self, n: usize) -> Vec<crate::proto::KeyValue> {
        crate::ops::read_in(&self.responses, n)
    }
}

#[cfg(test)]
mod tests {
    use super::orphaned;

    #[test]
    fn a_key_another_part_got_is_not_withdrawn() {
        let part = |keys: &[&str], got| (keys.iter().map(|k| k.to_string()).collect(), got);
        let orphans = orphaned(vec![
            part(&["a/@1"], false),
            part(&["a/@1"], true),
            part(&["b/@1"], false),
            part(&["b/@1"], false),
            part(&["c/@1"], true),
        ]);
        assert_eq!(orphans, vec!["b/@1".to_string()]);
        assert!(orphaned(vec![part(&["c/@1"], true)]).is_empty());
    }
}
