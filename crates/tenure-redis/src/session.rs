//! A session: a key with the session TTL, the seats held through it, and its waiting
//! campaigns.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use redis::Value;
use tenure_core::backend::Purpose;
use tenure_core::backend::{lock, BackendSession, CampaignMode, Lifetime, SessionEvents};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Member, Result};
use tokio_util::sync::DropGuard;

use crate::error::{session_gone, unexpected, TAG};
use crate::keys::{millis_up, new_session_id, session_key, ElectionKeys};
use crate::scripts::{
    ACQUIRE_MANY_SCRIPT, ACQUIRE_SCRIPT, CLOSE_SCRIPT, REGISTER_SCRIPT, RELEASE_MANY_SCRIPT,
    RENEW_SCRIPT, UNREGISTER_SCRIPT,
};
use crate::shared::{as_int, Shared};

/// How many seats one renewal script call covers; more are renewed by further calls
/// sent at the same time on the same connection (still one round trip).
const RENEW_BATCH: usize = 20_000;

/// Seats taken per call of the batch acquire script: kept short, since Redis runs
/// nothing else while a script runs.
pub(crate) const BATCH: usize = 256;

/// The session handed to the core. Dropping it ends its waiting campaigns.
pub(crate) struct RedisSession {
    inner: Arc<Inner>,
    _stop: DropGuard,
}

struct Inner {
    shared: Arc<Shared>,
    id: String,
    key: String,
    ttl_ms: u64,
    /// Seats handed to the core and not given back, with their tokens.
    held: Mutex<HashMap<ElectionName, FencingToken>>,
    /// Elections this session is waiting for.
    waiting: Mutex<HashSet<ElectionName>>,
    /// The member ids this session registered, by namespace (removed on close).
    members: Mutex<HashMap<ElectionName, HashSet<String>>>,
    events: SessionEvents,
    life: Lifetime,
}

impl fmt::Debug for RedisSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.life.fmt(f)
    }
}

/// The answer of the acquire script.
enum Acquired {
    Granted(FencingToken),
    /// Someone else holds the seat: its remaining TTL (ms) and this session's place in
    /// the queue (0 = next; -1 = not queued).
    Held {
        pttl: i64,
        rank: i64,
    },
    SessionGone,
}

impl RedisSession {
    /// Create the session key with a TTL of `ttl_ms`.
    pub(crate) async fn open(
        shared: Arc<Shared>,
        ttl_ms: u64,
        events: SessionEvents,
    ) -> Result<Self> {
        for _ in 0..3 {
            let id = new_session_id();
            let key = session_key(shared.config.key_prefix(), &id);
            let created = shared
                .conn
                .run(Purpose::Election, "open session", |mut c| {
                    let key = key.clone();
                    async move {
                        redis::cmd("SET")
                            .arg(&key)
                            .arg(format!("ttl_ms={ttl_ms}"))
                            .arg("PX")
                            .arg(ttl_ms)
                            .arg("NX")
                            .query_async::<Value>(&mut c)
                            .await
                    }
                })
                .await?;
            match created {
                Value::Okay | Value::SimpleString(_) => {
                    let inner = Arc::new(Inner {
                        shared,
                        life: Lifetime::new(crate::config::SCHEME, id.clone()),
                        id,
                        key,
                        ttl_ms,
                        held: Mutex::new(HashMap::new()),
                        waiting: Mutex::new(HashSet::new()),
                        members: Mutex::new(HashMap::new()),
                        events,
                    });
                    return Ok(RedisSession {
                        _stop: inner.life.guard(),
                        inner,
                    });
                }
                // The id is taken (never expected with 128 random bits): draw again.
                Value::Nil => continue,
                other => return Err(unexpected("open session", format!("{other:?}"))),
            }
        }
        Err(TAG.own(
            ErrorKind::Backend,
            "open session: could not find a free session id",
        ))
    }
}

/// Removes an election from the waiting set when its campaign ends in any way.
struct Waiting<'a> {
    inner: &'a Inner,
    election: ElectionName,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.inner.waiting).remove(&self.election);
    }
}

impl Inner {
    /// Run the acquire script once; with [`CampaignMode::Wait`] it joins the queue if
    /// the seat is taken.
    async fn acquire(
        &self,
        keys: &ElectionKeys,
        candidate: &Candidate,
        mode: CampaignMode,
    ) -> Result<Acquired> {
        let shared = &self.shared;
        let keep_ms = millis_up(shared.config.get_poll_interval() * 2).saturating_add(self.ttl_ms);
        let mut invocation = ACQUIRE_SCRIPT.key(&keys.seat);
        invocation
            .key(&keys.counter)
            .key(&keys.queue)
            .key(&self.key)
            .arg(&self.id)
            .arg(self.ttl_ms)
            .arg(candidate.id())
            .arg(candidate.value())
            .arg(match mode {
                CampaignMode::Wait => "1",
                CampaignMode::TryOnce => "0",
            })
            .arg(&keys.channel)
            .arg(&keys.waits)
            .arg(keep_ms);
        let reply = shared
            .guarded_script(Purpose::Election, "campaign", &invocation)
            .await?;
        parse_acquire(&reply)
    }

    /// Run the batch acquire script once for `chunk`: one answer per seat.
    async fn acquire_many(
        &self,
        chunk: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let shared = &self.shared;
        let mut invocation = ACQUIRE_MANY_SCRIPT.key(&self.key);
        invocation.arg(&self.id).arg(self.ttl_ms);
        for (election, candidate) in chunk {
            let keys = shared.keys(election);
            invocation
                .key(&keys.seat)
                .key(&keys.counter)
                .key(&keys.queue)
                .arg(candidate.id())
                .arg(candidate.value())
                .arg(&keys.channel)
                .arg(&keys.waits);
        }
        let reply = shared
            .guarded_script(Purpose::Election, "try_campaign_many", &invocation)
            .await?;
        parse_acquire_many(&reply, chunk.len(), &self.id)
    }

    /// Remove this session's entries `ids` of `namespace` (all of them if `ids` is
    /// empty).
    async fn unregister(&self, namespace: &ElectionName, ids: &[String]) -> Result<()> {
        let keys = self.shared.member_keys(namespace);
        let mut invocation = UNREGISTER_SCRIPT.key(&keys.hash);
        invocation.arg(&self.id).arg(&keys.channel);
        for id in ids {
            invocation.arg(id);
        }
        self.shared.script("unregister member", &invocation).await?;
        Ok(())
    }

    fn granted(&self, election: &ElectionName, token: FencingToken) {
        lock(&self.held).insert(election.clone(), token);
    }

    /// Report the seats a renewal found gone or taken.
    fn report_lost(&self, lost: &[(ElectionName, FencingToken)]) {
        for (election, token) in lost {
            let mut held = lock(&self.held);
            if held.get(election) == Some(token) {
                held.remove(election);
                drop(held);
                self.events.election_lost(
                    election,
                    *token,
                    "the seat is gone from Redis or held by another session",
                );
            }
        }
    }

    async fn renew_batch(&self, batch: &[(ElectionName, FencingToken)]) -> Result<Vec<usize>> {
        let shared = &self.shared;
        let mut invocation = RENEW_SCRIPT.key(&self.key);
        invocation.arg(self.ttl_ms).arg(&self.id);
        for (election, token) in batch {
            invocation
                .key(shared.keys(election).seat)
                .arg(token.0.to_string());
        }
        let reply = shared
            .guarded_script(Purpose::Renewal, "keep-alive", &invocation)
            .await?;
        match reply {
            Value::Int(-1) => Err(session_gone("keep-alive", &self.id)),
            Value::Array(items) => items
                .iter()
                .map(|v| {
                    as_int(v)
                        .and_then(|i| usize::try_from(i).ok())
                        .filter(|i| (1..=batch.len()).contains(i))
                        .map(|i| i - 1)
                        .ok_or_else(|| unexpected("keep-alive", format!("{v:?}")))
                })
                .collect(),
            other => Err(unexpected("keep-alive", format!("{other:?}"))),
        }
    }
}

/// The batch script's answer for `seats` seats: a token per granted seat.
/// A resign's token argument: the token, or "" for whatever this session has.
fn token_arg(token: Option<FencingToken>) -> String {
    token.map(|t| t.0.to_string()).unwrap_or_default()
}

fn parse_acquire_many(reply: &Value, seats: usize, id: &str) -> Result<Vec<Option<FencingToken>>> {
    let bad = || unexpected("try_campaign_many", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.first().and_then(as_int) == Some(-1) {
        return Err(session_gone("try_campaign_many", id));
    }
    if items.len() != seats {
        return Err(bad());
    }
    items
        .iter()
        .map(|item| match as_int(item) {
            Some(0) => Ok(None),
            Some(t) if t > 0 => Ok(Some(FencingToken(t as u64))),
            _ => Err(bad()),
        })
        .collect()
}

fn parse_acquire(reply: &Value) -> Result<Acquired> {
    let bad = || unexpected("campaign", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    match items.first().and_then(as_int) {
        Some(-1) => Ok(Acquired::SessionGone),
        Some(1) => {
            let token = items
                .get(1)
                .and_then(as_int)
                .and_then(|t| u64::try_from(t).ok())
                .ok_or_else(bad)?;
            Ok(Acquired::Granted(FencingToken(token)))
        }
        Some(0) => Ok(Acquired::Held {
            pttl: items.get(1).and_then(as_int).unwrap_or(-1),
            rank: items.get(2).and_then(as_int).unwrap_or(-1),
        }),
        _ => Err(bad()),
    }
}

#[async_trait]
impl BackendSession for RedisSession {
    fn id(&self) -> &str {
        &self.inner.id
    }

    async fn keep_alive(&self) -> Result<()> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let snapshot: Vec<(ElectionName, FencingToken)> = lock(&inner.held)
            .iter()
            .map(|(e, t)| (e.clone(), *t))
            .collect();
        let batches: Vec<&[(ElectionName, FencingToken)]> = if snapshot.is_empty() {
            vec![&[]]
        } else {
            snapshot.chunks(RENEW_BATCH).collect()
        };
        // Sent together on the multiplexed connection: one round trip for all.
        let answers = futures::future::join_all(batches.iter().map(|b| inner.renew_batch(b))).await;
        let mut lost = Vec::new();
        for (batch, answer) in batches.iter().zip(answers) {
            for i in answer? {
                if let Some(entry) = batch.get(i) {
                    lost.push(entry.clone());
                }
            }
        }
        inner.report_lost(&lost);
        Ok(())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let keys = inner.shared.keys(election);
        let registration = inner.shared.hub.waiter(&keys.channel, &inner.id);
        lock(&inner.waiting).insert(election.clone());
        let _waiting = Waiting {
            inner,
            election: election.clone(),
        };
        loop {
            inner.life.check_open()?;
            let was_subscribed = registration.is_subscribed();
            let next = match inner.acquire(&keys, candidate, CampaignMode::Wait).await? {
                Acquired::Granted(token) => {
                    inner.granted(election, token);
                    return Ok(token);
                }
                Acquired::SessionGone => return Err(session_gone("campaign", &inner.id)),
                // Next in line: look again when the holder's TTL would run out.
                Acquired::Held { pttl, rank: 0 } => inner.shared.next_look(pttl),
                Acquired::Held { .. } => inner.shared.next_look(-1),
            };
            tokio::select! {
                _ = registration.woken() => {}
                _ = tokio::time::sleep(next) => {}
                // A release published before the subscription was confirmed was missed.
                _ = registration.subscribed(), if !was_subscribed => {}
                _ = inner.life.stopped() => return Err(inner.life.closed_error()),
            }
        }
    }

    async fn try_campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<Option<FencingToken>> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let keys = inner.shared.keys(election);
        match inner
            .acquire(&keys, candidate, CampaignMode::TryOnce)
            .await?
        {
            Acquired::Granted(token) => {
                inner.granted(election, token);
                Ok(Some(token))
            }
            Acquired::Held { .. } => Ok(None),
            Acquired::SessionGone => Err(session_gone("try_campaign", &inner.id)),
        }
    }

    async fn try_campaign_many(
        &self,
        seats: &[(ElectionName, Candidate)],
    ) -> Result<Vec<Option<FencingToken>>> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let mut answers = Vec::with_capacity(seats.len());
        for chunk in seats.chunks(BATCH) {
            let taken = inner.acquire_many(chunk).await?;
            for ((election, _), token) in chunk.iter().zip(&taken) {
                if let Some(token) = token {
                    inner.granted(election, *token);
                }
            }
            answers.extend(taken);
        }
        Ok(answers)
    }

    async fn resign(&self, election: &ElectionName, token: Option<FencingToken>) -> Result<()> {
        self.resign_many(&[(election.clone(), token)]).await
    }

    async fn resign_many(&self, grants: &[(ElectionName, Option<FencingToken>)]) -> Result<()> {
        let inner = &self.inner;
        {
            let mut held = lock(&inner.held);
            for (election, token) in grants {
                if held
                    .get(election)
                    .is_some_and(|t| token.is_none_or(|want| *t == want))
                {
                    held.remove(election);
                }
            }
        }
        let shared = &inner.shared;
        for chunk in grants.chunks(BATCH) {
            let mut invocation = RELEASE_MANY_SCRIPT.arg(&inner.id);
            for (election, token) in chunk {
                let keys = shared.keys(election);
                invocation
                    .key(&keys.seat)
                    .key(&keys.queue)
                    .arg(token_arg(*token))
                    .arg(&keys.channel)
                    .arg(&keys.waits);
            }
            shared.script("resign", &invocation).await?;
        }
        Ok(())
    }

    async fn register_member(&self, namespace: &ElectionName, member: &Member) -> Result<()> {
        let inner = &self.inner;
        inner.life.check_open()?;
        let keys = inner.shared.member_keys(namespace);
        lock(&inner.members)
            .entry(namespace.clone())
            .or_default()
            .insert(member.id().to_string());
        let mut invocation = REGISTER_SCRIPT.key(&inner.key);
        invocation
            .key(&keys.hash)
            .arg(&inner.id)
            .arg(member.id())
            .arg(member.value())
            .arg(&keys.channel);
        let reply = inner.shared.script("register member", &invocation).await?;
        match as_int(&reply) {
            Some(-1) => Err(session_gone("register member", &inner.id)),
            Some(0 | 1) => Ok(()),
            _ => Err(unexpected("register member", format!("{reply:?}"))),
        }
    }

    async fn unregister_member(&self, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        let inner = &self.inner;
        {
            let mut members = lock(&inner.members);
            if let Some(ids) = members.get_mut(namespace) {
                ids.remove(id);
                if ids.is_empty() {
                    members.remove(namespace);
                }
            }
        }
        inner.unregister(namespace, &[id.to_string()]).await
    }

    async fn close(&self) -> Result<()> {
        let inner = &self.inner;
        if !inner.life.close() {
            return Ok(());
        }
        let registered: Vec<(ElectionName, Vec<String>)> = lock(&inner.members)
            .drain()
            .map(|(ns, ids)| (ns, ids.into_iter().collect()))
            .collect();
        let mut elections: Vec<ElectionName> = lock(&inner.held).drain().map(|(e, _)| e).collect();
        elections.extend(lock(&inner.waiting).iter().cloned());
        let shared = &inner.shared;
        let mut invocation = CLOSE_SCRIPT.key(&inner.key);
        invocation.arg(&inner.id);
        for election in &elections {
            let keys = shared.keys(election);
            invocation
                .key(keys.seat)
                .key(keys.queue)
                .arg(keys.channel)
                .arg(keys.waits);
        }
        // Sent together on the multiplexed connection: one round trip for all. Watchers
        // hear of the members that went; the session key's deletion ends any the list
        // missed.
        let unregistering =
            futures::future::join_all(registered.iter().map(|(ns, ids)| inner.unregister(ns, ids)));
        let closing = shared.script("close session", &invocation);
        let (unregistered, closed) = futures::join!(unregistering, closing);
        closed?;
        unregistered.into_iter().collect::<Result<Vec<()>>>()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::bulk;

    #[test]
    fn batch_acquire_replies() {
        let reply = Value::Array(vec![bulk("1780000000000001"), Value::Int(0), bulk("17")]);
        let got = parse_acquire_many(&reply, 3, "s").unwrap();
        assert_eq!(
            got,
            [
                Some(FencingToken(1_780_000_000_000_001)),
                None,
                Some(FencingToken(17))
            ]
        );
        let gone = parse_acquire_many(&Value::Array(vec![Value::Int(-1)]), 3, "s");
        assert_eq!(
            gone.err().map(|e| e.kind()),
            Some(ErrorKind::SessionExpired)
        );
        let short = parse_acquire_many(&Value::Array(vec![Value::Int(0)]), 2, "s");
        assert_eq!(short.err().map(|e| e.kind()), Some(ErrorKind::Backend));
    }

    #[test]
    fn acquire_replies() {
        let granted = Value::Array(vec![Value::Int(1), bulk("1780000000000001")]);
        assert!(matches!(
            parse_acquire(&granted).unwrap(),
            Acquired::Granted(FencingToken(1_780_000_000_000_001))
        ));
        let held = Value::Array(vec![Value::Int(0), Value::Int(850), Value::Int(0)]);
        assert!(matches!(
            parse_acquire(&held).unwrap(),
            Acquired::Held { pttl: 850, rank: 0 }
        ));
        let gone = Value::Array(vec![Value::Int(-1)]);
        assert!(matches!(
            parse_acquire(&gone).unwrap(),
            Acquired::SessionGone
        ));
        for bad in [
            Value::Nil,
            Value::Array(vec![]),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Int(1), bulk("-5")]),
            Value::Array(vec![Value::Int(7)]),
        ] {
            assert_eq!(
                parse_acquire(&bad).err().map(|e| e.kind()),
                Some(ErrorKind::Backend),
                "{bad:?}"
            );
        }
    }
}
