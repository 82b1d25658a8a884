//! The election engine's primitives on etcd (the default layout): sessions are
//! leases, an election is the keys under `<prefix>/<election>/@`, and one transaction
//! commits a write only at the election's revision and reads the election back.
//!
//! | engine | etcd |
//! |---|---|
//! | session (open / renew many / revoke) | lease (LeaseGrant / keep-alives of many leases on one stream / LeaseRevoke) |
//! | the election's revision | the mod revision of `…/@rev` (absent: 0), which every commit rewrites; its value is the state kept for the next grant |
//! | record of a session | `…/@r/<lease>` on that lease: `<token>\n<body>`, the token `-` (a waiter), a number (kept), or `M` (minted by the put that wrote it: the key's mod revision); arrival = create revision, version = mod revision |
//! | touch | a put of `…/@t/<lease>` on that lease (the record, and a minted token read from its mod revision, stay as they are) |
//! | commit | a transaction comparing `…/@rev`'s mod revision, whose branches end with a range read of the election; many go as nested transactions of one |
//! | a put or touch of an ended session | the write also compares each session it puts or touches on: its key `<prefix>/@sessions/<lease>`, put on the lease when the session opens, is gone with the lease, so the write fails on its own (etcd would refuse a whole transaction that puts a key on an ended lease, every write that shares it included) |
//! | changed | a watch on the election's keys from the revision seen + 1 |
//!
//! A record of an ended session is deleted by etcd with the lease, without a commit:
//! the election's revision does not move. That is safe: such a deletion only removes a
//! record, so a write decided while it was there either still holds (the engine treats
//! a record of an ended session as gone) or puts or touches that session's keys and is
//! refused; new records, grants and tokens come only through commits, which compare
//! the revision. Waiters see the deletion on their watch.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::lock;
use tenure_core::backend::primitive::{MemberStore, Primitives};
use tenure_core::engine::{Op, Record, Snapshot, Token, WaitFor, Write};
use tenure_core::{ElectionName, ErrorKind, Result, Timing};

use crate::error::TAG;
use crate::gather::{Gather, MAX_PARTS};
use crate::keys::{lease_hex, parse_lease_hex, KeySpace};
use crate::members::EtcdMembers;
use crate::ops::{self, op};
use crate::proto::{
    Event, EventType, KeyValue, PutRequest, Request, Response, ResponseOp, TxnRequest,
};
use crate::shared::Shared;
use crate::watches::Seen;

/// The engine's primitives over one etcd connection.
pub(crate) struct EtcdPrimitives {
    shared: Arc<Shared>,
    gather: Arc<Gather>,
    members: EtcdMembers,
    /// Each open lease's TTL, for how long a renewal waits for one member.
    ttls: Mutex<HashMap<i64, Duration>>,
    /// For each election, its revision in the latest answer and the earliest store
    /// revision an answer showed it at (see [`EtcdPrimitives::seen_at`]).
    seen: Mutex<HashMap<ElectionName, (u64, i64)>>,
}

impl fmt::Debug for EtcdPrimitives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EtcdPrimitives({})", self.shared.config)
    }
}

/// One election's keys.
#[derive(Clone)]
struct Keys {
    /// Every key of the election starts with it: `<prefix>/<election>/@`.
    range: String,
    rev: String,
    records: String,
    pokes: String,
}

impl Keys {
    fn of(shared: &Shared, election: &ElectionName) -> Keys {
        let range = shared.keys.election_range(election);
        Keys {
            rev: format!("{range}rev"),
            records: format!("{range}r/"),
            pokes: format!("{range}t/"),
            range,
        }
    }

    fn record(&self, session: &str) -> String {
        format!("{}{session}", self.records)
    }

    fn poke(&self, session: &str) -> String {
        format!("{}{session}", self.pokes)
    }
}

fn revision(r: i64) -> u64 {
    u64::try_from(r).unwrap_or(0)
}

/// What a record key holds: the token, a newline, the engine's body.
fn encode(token: Token, body: &[u8]) -> Vec<u8> {
    let mut value = match token {
        Token::None => b"-".to_vec(),
        Token::Mint => b"M".to_vec(),
        Token::Keep(t) => t.to_string().into_bytes(),
    };
    value.push(b'\n');
    value.extend_from_slice(body);
    value
}

fn decode(session: &str, kv: &KeyValue) -> Record {
    let (token, body) = match kv.value.iter().position(|b| *b == b'\n') {
        Some(at) => (&kv.value[..at], &kv.value[at + 1..]),
        None => (&b"-"[..], &kv.value[..]),
    };
    let token = match token {
        b"-" => None,
        b"M" => Some(revision(kv.mod_revision)),
        n => std::str::from_utf8(n).ok().and_then(|n| n.parse().ok()),
    };
    let (arrival, version) = (revision(kv.create_revision), revision(kv.mod_revision));
    Record::from_store(session.to_string(), arrival, version, token, true, body)
}

/// The election as the keys `kvs` (a read of its range) hold it.
fn snapshot(keys: &Keys, kvs: &[KeyValue]) -> Snapshot {
    let (mut rev, mut left, mut records) = (0, &[][..], Vec::new());
    for kv in kvs {
        if kv.key == keys.rev.as_bytes() {
            rev = revision(kv.mod_revision);
            left = &kv.value;
        } else if let Some(session) = kv.key.strip_prefix(keys.records.as_bytes()) {
            if let Ok(session) = std::str::from_utf8(session) {
                records.push(decode(session, kv));
            }
        }
    }
    Snapshot::from_store(rev, left, records)
}

/// The sessions `write` puts or touches keys of, each once, as leases.
fn leases(write: &Write) -> Result<Vec<i64>> {
    let mut leases = Vec::new();
    for o in &write.ops {
        if matches!(o, Op::Put { .. } | Op::Touch(_)) {
            let l = parse_lease_hex(o.session())?;
            if !leases.contains(&l) {
                leases.push(l);
            }
        }
    }
    Ok(leases)
}

/// The transaction that commits `write` at its revision, only while the sessions it
/// puts or touches keys of live (their keys in `space` are still on their leases);
/// either branch reads the election back.
fn write_txn(keys: &Keys, space: &KeySpace, write: &Write) -> Result<TxnRequest> {
    let mut success = Vec::with_capacity(write.ops.len() + 2);
    for o in &write.ops {
        let s = o.session();
        match o {
            Op::Put { token, .. } => {
                let value = encode(*token, &o.body().unwrap_or_default());
                success.push(op(ops::put(&keys.record(s), &value, parse_lease_hex(s)?)));
            }
            Op::Touch(_) => success.push(op(ops::put(&keys.poke(s), b"", parse_lease_hex(s)?))),
            Op::Delete(_) => {
                success.push(op(ops::delete(&keys.record(s))));
                success.push(op(ops::delete(&keys.poke(s))));
            }
        }
    }
    let rev = match write.left_body() {
        Some(left) => ops::put(&keys.rev, &left, 0),
        None if write.revision == 0 => ops::put(&keys.rev, b"", 0),
        // Keep the state kept for the next grant; only the revision moves.
        None => PutRequest {
            ignore_value: true,
            ..ops::put(&keys.rev, b"", 0)
        },
    };
    success.push(op(rev));
    success.push(op(ops::all_under(&keys.range)));
    let at = i64::try_from(write.revision).unwrap_or(i64::MAX);
    let mut compare = vec![ops::modified_at(&keys.rev, at)];
    for l in leases(write)? {
        compare.push(ops::on_lease(&space.session_key(l), l));
    }
    Ok(TxnRequest {
        compare,
        success,
        failure: vec![op(ops::all_under(&keys.range))],
    })
}

/// The range read among `responses` (a branch's answers, or a read's): its keys and
/// the store revision it was read at (0 if etcd did not say).
fn kvs(responses: &[ResponseOp]) -> (Vec<KeyValue>, i64) {
    responses
        .iter()
        .find_map(|r| match &r.response {
            Some(Response::Range(range)) => Some((range.kvs.clone(), ops::revision(&range.header))),
            _ => None,
        })
        .unwrap_or_default()
}

/// Whether `event` is what a wait for `me` and `on` waits for.
fn wakes(event: &Event, me: Option<&(String, String)>, on: Option<&String>) -> bool {
    let Some(kv) = &event.kv else {
        return false;
    };
    // Any change wakes a wait that names no record ahead: an observer's, and a
    // holder's (its own record alone). etcd delivers every event of the range anyway;
    // a holder that reads after each decides its release on the election as it stands,
    // one transaction, where a view from before a waiter joined cost a failed one first.
    if on.is_none() {
        return true;
    }
    let key = kv.key.as_slice();
    let mine = me.is_some_and(|(record, poke)| key == record.as_bytes() || key == poke.as_bytes());
    let ahead_gone =
        on.is_some_and(|r| key == r.as_bytes() && event.r#type == EventType::Delete as i32);
    mine || ahead_gone
}

impl EtcdPrimitives {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        EtcdPrimitives {
            gather: Gather::new(shared.clone(), "commit", MAX_PARTS),
            members: EtcdMembers {
                shared: shared.clone(),
            },
            shared,
            ttls: Mutex::new(HashMap::new()),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// `snap`, read at store revision `at`, as answered for `election`: remembered.
    fn answered(&self, election: &ElectionName, snap: Snapshot, at: i64) -> Snapshot {
        if at > 0 {
            let mut seen = lock(&self.seen);
            let entry = seen.entry(election.clone()).or_insert((snap.revision, at));
            if entry.0 != snap.revision {
                *entry = (snap.revision, at);
            } else {
                entry.1 = entry.1.min(at);
            }
        }
        snap
    }

    /// The store revision from which a wait decided on `election` at revision
    /// `revision` must watch. Every snapshot at that revision answered here was read at
    /// or after the earliest store revision one was, and a change between `revision`
    /// and that one (only a deletion with a lease: commits move the revision) is in
    /// every such snapshot; so watching from just after it misses nothing, and a wait
    /// on a quiet election need not replay history (or find it compacted).
    fn seen_at(&self, election: &ElectionName, revision: u64) -> i64 {
        let from = i64::try_from(revision).unwrap_or(i64::MAX);
        match lock(&self.seen).get(election) {
            Some((r, at)) if *r == revision => from.max(*at),
            _ => from,
        }
    }

    /// How long a renewal of `leases` waits for one member: see
    /// [`Shared::answer_limit`], for the shortest TTL renewed.
    fn answer_limit(&self, leases: &[i64]) -> Duration {
        let ttls = lock(&self.ttls);
        let shortest = leases.iter().filter_map(|l| ttls.get(l)).min();
        self.shared
            .answer_limit(shortest.copied().unwrap_or(Duration::MAX))
    }

    /// Send the writes `sent` (nested transactions of as few as etcd takes); one answer
    /// per write, in order.
    async fn send(&self, sent: &[Sent<'_>]) -> Result<Vec<(bool, Snapshot)>> {
        let parts = sent
            .iter()
            .map(|w| {
                (
                    vec![op(Request::Txn(w.txn.clone()))],
                    Some(w.keys.rev.clone()),
                )
            })
            .collect();
        let got = self.gather.run(parts, false).await;
        let mut answers = Vec::with_capacity(sent.len());
        for (w, got) in sent.iter().zip(got) {
            let resp = match got?.responses.into_iter().next() {
                Some(ResponseOp {
                    response: Some(Response::Txn(resp)),
                }) => resp,
                _ => return Err(TAG.own(ErrorKind::Backend, "commit: etcd answered another kind")),
            };
            let (read, at) = kvs(&resp.responses);
            let snap = self.answered(w.election, snapshot(&w.keys, &read), at);
            answers.push((resp.succeeded, snap));
        }
        Ok(answers)
    }

    /// Which of `leases` live, each with its session key: a key gone while its lease
    /// lives (deleted by hand) is put again, and etcd refuses that put for a lease it
    /// no longer has. One request per lease, all at once.
    async fn live(&self, leases: &[i64]) -> Result<Vec<i64>> {
        let checks = leases.iter().map(|&l| async move {
            let key = self.shared.keys.session_key(l);
            let txn = TxnRequest {
                compare: vec![ops::on_lease(&key, l)],
                success: Vec::new(),
                failure: vec![op(ops::put(&key, b"", l))],
            };
            match self.shared.call("commit: check a session", txn).await {
                Ok(resp) => {
                    if !resp.succeeded {
                        tracing::warn!(session = %lease_hex(l), "a live session's key was gone; put again");
                    }
                    Ok(Some(l))
                }
                Err(e) if e.kind() == ErrorKind::SessionExpired => Ok(None),
                Err(e) => Err(e),
            }
        });
        let live = futures::future::try_join_all(checks).await?;
        Ok(live.into_iter().flatten().collect())
    }
}

/// A write on its way: its election, the write, its keys, its transaction.
#[derive(Clone)]
struct Sent<'a> {
    election: &'a ElectionName,
    write: &'a Write,
    keys: Keys,
    txn: TxnRequest,
}

#[async_trait]
impl Primitives for EtcdPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let lease = self.shared.grant_lease(ttl).await?;
        // The session's key, which every write that puts or touches its keys compares.
        let key = self.shared.keys.session_key(lease);
        let mark = TxnRequest {
            success: vec![op(ops::put(&key, b"", lease))],
            ..Default::default()
        };
        if let Err(e) = self.shared.call("open session", mark).await {
            let _ = self.shared.revoke("open session", lease).await;
            return Err(e);
        }
        lock(&self.ttls).insert(lease, ttl);
        Ok(lease_hex(lease))
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let ids: Vec<Option<i64>> = sessions.iter().map(|s| parse_lease_hex(s).ok()).collect();
        let leases: Vec<i64> = ids.iter().flatten().copied().collect();
        if leases.is_empty() {
            return Ok(vec![false; sessions.len()]);
        }
        let limit = self.answer_limit(&leases);
        let mut ttls = self.shared.renew(&leases, limit).await?.into_iter();
        let live: Vec<bool> = ids
            .iter()
            .map(|id| id.is_some() && ttls.next().is_some_and(|ttl| ttl > 0))
            .collect();
        let mut known = lock(&self.ttls);
        for (lease, _) in leases.iter().zip(&live).filter(|(_, l)| !**l) {
            known.remove(lease);
        }
        Ok(live)
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        let id = parse_lease_hex(session)?;
        lock(&self.ttls).remove(&id);
        self.shared.revoke("close session", id).await
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let mut snaps = self.read_many(std::slice::from_ref(election)).await?;
        snaps
            .pop()
            .ok_or_else(|| TAG.own(ErrorKind::Backend, "read: no answer"))
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let keys: Vec<Keys> = elections
            .iter()
            .map(|e| Keys::of(&self.shared, e))
            .collect();
        let reads = keys
            .iter()
            .map(|k| (vec![op(ops::all_under(&k.range))], None))
            .collect();
        let mut snaps = Vec::with_capacity(keys.len());
        let got = self.gather.run(reads, false).await;
        for ((e, k), got) in elections.iter().zip(&keys).zip(got) {
            let (read, at) = kvs(&got?.responses);
            snaps.push(self.answered(e, snapshot(k, &read), at));
        }
        Ok(snaps)
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let mut answers = self
            .commit_many(&[(election.clone(), write.clone())])
            .await?;
        answers
            .pop()
            .ok_or_else(|| TAG.own(ErrorKind::Backend, "commit: no answer"))
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let mut sent = Vec::with_capacity(writes.len());
        for (election, write) in writes {
            let keys = Keys::of(&self.shared, election);
            let txn = write_txn(&keys, &self.shared.keys, write)?;
            sent.push(Sent {
                election,
                write,
                keys,
                txn,
            });
        }
        let mut answers = self.send(&sent).await?;
        // A write that failed with the election still at its revision failed on a
        // session's key: the session ended (etcd deleted the key with the lease), or
        // the key was deleted by hand. Ask once for the sessions of all such writes,
        // and send again those whose sessions all live.
        let failed: Vec<usize> = (0..sent.len())
            .filter(|&i| !answers[i].0 && answers[i].1.revision == sent[i].write.revision)
            .collect();
        if failed.is_empty() {
            return Ok(answers);
        }
        let mut asked = Vec::new();
        for &i in &failed {
            asked.extend(leases(sent[i].write)?);
        }
        asked.sort_unstable();
        asked.dedup();
        let live = self.live(&asked).await?;
        let mut again = Vec::new();
        for i in failed {
            if leases(sent[i].write)?.iter().all(|l| live.contains(l)) {
                again.push(i);
            }
        }
        if again.is_empty() {
            return Ok(answers);
        }
        let resend: Vec<Sent<'_>> = again.iter().map(|&i| sent[i].clone()).collect();
        for (i, answer) in again.into_iter().zip(self.send(&resend).await?) {
            answers[i] = answer;
        }
        Ok(answers)
    }

    fn batch(&self) -> Option<usize> {
        Some(MAX_PARTS)
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let keys = Keys::of(&self.shared, election);
        let me = what.me.as_deref().map(|s| (keys.record(s), keys.poke(s)));
        let on = what.on.as_deref().map(|s| keys.record(s));
        let mut from = self.seen_at(election, what.seen).saturating_add(1);
        loop {
            let mut watch = self.shared.watches.watch(&keys.range, from);
            loop {
                match watch.next().await {
                    Seen::Events(events) => {
                        if events.iter().any(|e| wakes(e, me.as_ref(), on.as_ref())) {
                            return Ok(());
                        }
                    }
                    Seen::Compacted => break,
                    Seen::Broken(e) => return Err(e),
                }
            }
            // The revisions since the one seen are compacted away: look at the election
            // now, and watch on from there if what is waited for has not happened.
            let read = ops::all_under(&keys.range);
            let resp = self.shared.call("wait", read).await?;
            let now = snapshot(&keys, &resp.kvs);
            let gone = |s: &Option<String>| s.as_ref().is_some_and(|s| now.record(s).is_none());
            if now.revision != what.seen || gone(&what.me) || gone(&what.on) {
                return Ok(());
            }
            from = ops::revision(&resp.header).saturating_add(1);
        }
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(&self.members)
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        crate::config::check_ttl(timing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tenure_core::engine::Candidacy;

    fn keys() -> Keys {
        Keys {
            range: "p/e/@".into(),
            rev: "p/e/@rev".into(),
            records: "p/e/@r/".into(),
            pokes: "p/e/@t/".into(),
        }
    }

    fn kv(key: &str, value: &[u8], create: i64, modified: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: create,
            mod_revision: modified,
            value: value.to_vec(),
            lease: 0,
        }
    }

    #[test]
    fn records_keep_their_tokens_and_a_minted_one_is_the_put_revision() {
        let body = br#"{"id":"a","value":""}"#;
        let k = keys();
        let snap = snapshot(
            &k,
            &[
                kv("p/e/@rev", b"", 3, 9),
                kv("p/e/@r/000000000000000a", &encode(Token::Mint, body), 4, 7),
                kv(
                    "p/e/@r/000000000000000b",
                    &encode(Token::Keep(5), body),
                    5,
                    9,
                ),
                kv("p/e/@r/000000000000000c", &encode(Token::None, body), 6, 6),
                kv("p/e/@t/000000000000000c", b"", 9, 9),
            ],
        );
        assert_eq!(snap.revision, 9);
        let tokens: Vec<_> = snap.records.iter().map(|r| r.token).collect();
        assert_eq!(tokens, vec![Some(7), Some(5), None]);
        assert_eq!(snap.records[0].arrival, 4);
        assert_eq!(snap.records[0].candidacy.candidate, "a");
        assert_eq!(snapshot(&k, &[]), Snapshot::default());
    }

    #[test]
    fn a_write_compares_the_revision_key_and_reads_the_election_back() {
        let c = Candidacy {
            session: "000000000000000a".into(),
            candidate: "a".into(),
            value: String::new(),
            priority: 0,
            preemptible: false,
        };
        let w = Write {
            revision: 0,
            ops: vec![
                Op::Put {
                    candidacy: c,
                    token: Token::Mint,
                    told: false,
                    chosen: false,
                    inherited: None,
                },
                Op::Touch("000000000000000b".into()),
                Op::Delete("000000000000000c".into()),
            ],
            ..Write::default()
        };
        let space = KeySpace::new("p", crate::keys::EtcdLayout::Tenure);
        let txn = write_txn(&keys(), &space, &w).expect("a valid write");
        // The revision, and the sessions put (a) and touched (b) still live.
        assert_eq!(
            txn.compare,
            vec![
                ops::modified_at("p/e/@rev", 0),
                ops::on_lease("p/@sessions/000000000000000a", 10),
                ops::on_lease("p/@sessions/000000000000000b", 11),
            ]
        );
        // put, touch, two deletes, the revision key, the read.
        assert_eq!(txn.success.len(), 6);
        assert_eq!(txn.failure, vec![op(ops::all_under("p/e/@"))]);
        let kept = Write {
            revision: 4,
            ..Write::default()
        };
        let txn = write_txn(&keys(), &space, &kept).expect("a valid write");
        assert!(matches!(
            &txn.success[0].request,
            Some(Request::Put(p)) if p.ignore_value && p.key == b"p/e/@rev"
        ));
        let bad = Write {
            ops: vec![Op::Touch("nope".into())],
            ..Write::default()
        };
        assert!(write_txn(&keys(), &space, &bad).is_err());
    }

    #[test]
    fn waits_wake_on_their_own_keys_and_the_deletion_ahead() {
        let event = |key: &str, t: EventType| Event {
            r#type: t as i32,
            kv: Some(kv(key, b"", 1, 1)),
        };
        let me = ("p/e/@r/a".to_string(), "p/e/@t/a".to_string());
        let on = "p/e/@r/b".to_string();
        let w = |e: &Event| wakes(e, Some(&me), Some(&on));
        assert!(w(&event("p/e/@t/a", EventType::Put)));
        assert!(w(&event("p/e/@r/a", EventType::Put)));
        assert!(w(&event("p/e/@r/b", EventType::Delete)));
        assert!(!w(&event("p/e/@r/b", EventType::Put)));
        assert!(!w(&event("p/e/@rev", EventType::Put)));
        assert!(wakes(&event("p/e/@rev", EventType::Put), None, None));
    }
}
