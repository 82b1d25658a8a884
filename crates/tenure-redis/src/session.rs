//! A session: a key with the session TTL, the seats held through it, and its waiting
//! campaigns.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, Weak};

use async_trait::async_trait;
use redis::Value;
use tenure_core::backend::Purpose;
use tenure_core::backend::{lock, BackendSession, CampaignMode, Lifetime, SessionEvents};
use tenure_core::{Candidate, ElectionName, ErrorKind, FencingToken, Member, Result};
use tokio_util::sync::DropGuard;

use crate::error::{session_gone, unexpected, TAG};
use crate::hub::Registration;
use crate::keys::{
    millis_up, new_session_id, queue_band, session_key, waiter_tag, ElectionKeys, SeatTerms, BAND,
};
use crate::scripts::{
    ACQUIRE_MANY_SCRIPT, ACQUIRE_SCRIPT, CLOSE_SCRIPT, LEAVE_SCRIPT, REGISTER_SCRIPT,
    RELEASE_MANY_SCRIPT, RENEW_SCRIPT, UNREGISTER_SCRIPT,
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
    held: Mutex<HashMap<ElectionName, Held>>,
    /// The subscription to this session's own channel (preemptions and handovers),
    /// made at its first campaign.
    listener: Mutex<Option<Registration>>,
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

/// A seat handed to the core.
#[derive(Clone, Copy, Debug)]
struct Held {
    token: FencingToken,
    /// Whether the core was told to give it up (reported once).
    told: bool,
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
                        listener: Mutex::new(None),
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

/// Removes an election from the waiting set when its campaign ends in any way; a
/// campaign given up (its future dropped while it waited) also leaves the queue in
/// Redis, in the background, so that the seat is not kept for it.
struct Waiting<'a> {
    inner: &'a Inner,
    election: ElectionName,
    keys: &'a ElectionKeys,
    /// Set when the campaign returns (granted, or an error): nothing to leave then.
    ended: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        lock(&self.inner.waiting).remove(&self.election);
        if self.ended || self.inner.life.check_open().is_err() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = self.inner.shared.clone();
        let keys = self.keys.clone();
        let id = self.inner.id.clone();
        runtime.spawn(async move {
            let mut invocation = LEAVE_SCRIPT.key(&keys.seat);
            invocation
                .key(&keys.queue)
                .key(&keys.next)
                .arg(&id)
                .arg(&keys.channel)
                .arg(&keys.waits)
                .arg(shared.grace_ms());
            if let Err(e) = shared.script("leave the queue", &invocation).await {
                tracing::debug!(error = %e, "a campaign given up could not leave the queue");
            }
        });
    }
}

/// The election and token of a message on a session's channel: `preempt <token>
/// <election>`; `None` for anything else.
fn parse_preempt(payload: &[u8]) -> Option<(ElectionName, FencingToken)> {
    let text = std::str::from_utf8(payload).ok()?;
    let mut words = text.split(' ');
    if words.next()? != "preempt" {
        return None;
    }
    let token = words.next()?.parse::<u64>().ok()?;
    let election = ElectionName::new(words.next()?).ok()?;
    if words.next().is_some() {
        return None;
    }
    Some((election, FencingToken(token)))
}

/// Subscribe `inner`'s session to its own channel, once: a preemption or a handover
/// published there is reported to the core.
fn listen(inner: &Arc<Inner>) {
    let mut listener = lock(&inner.listener);
    if listener.is_some() {
        return;
    }
    let weak: Weak<Inner> = Arc::downgrade(inner);
    let channel = format!("{}{}", inner.shared.session_channels, inner.id);
    let handler: crate::hub::Handler = Arc::new(move |payload: &[u8]| {
        if let (Some(inner), Some((election, token))) = (weak.upgrade(), parse_preempt(payload)) {
            inner.told(&election, token);
        }
    });
    *listener = Some(inner.shared.hub.listener(&channel, handler));
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
        let band = queue_band(candidate.priority());
        let mut invocation = ACQUIRE_SCRIPT.key(&keys.seat);
        invocation
            .key(&keys.counter)
            .key(&keys.queue)
            .key(&self.key)
            .key(&keys.next)
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
            .arg(keep_ms)
            .arg(candidate.priority())
            .arg(SeatTerms::of(candidate).encode())
            .arg(band)
            .arg(band + BAND)
            .arg(shared.grace_ms())
            .arg(&shared.session_channels)
            .arg(&keys.election)
            .arg(waiter_tag(candidate));
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
        invocation
            .arg(&self.id)
            .arg(self.ttl_ms)
            .arg(shared.grace_ms());
        for (election, candidate) in chunk {
            let keys = shared.keys(election);
            invocation
                .key(&keys.seat)
                .key(&keys.counter)
                .key(&keys.queue)
                .key(&keys.next)
                .arg(candidate.id())
                .arg(candidate.value())
                .arg(SeatTerms::of(candidate).encode())
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
        lock(&self.held).insert(election.clone(), Held { token, told: false });
    }

    /// The store says the holder of `election` with `token` is to give the seat up (a
    /// preemption or a handover): report it to the core once, if this session still
    /// holds that grant.
    fn told(&self, election: &ElectionName, token: FencingToken) {
        let mut held = lock(&self.held);
        match held.get_mut(election) {
            Some(h) if h.token == token && !h.told => h.told = true,
            _ => return,
        }
        drop(held);
        self.events.preempted(election, token);
    }

    /// Report the seats a renewal found gone or taken.
    fn report_lost(&self, lost: &[(ElectionName, FencingToken)]) {
        for (election, token) in lost {
            let mut held = lock(&self.held);
            if held.get(election).map(|h| h.token) == Some(*token) {
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

    /// Renew a batch of seats: the positions of those gone or taken, then of those
    /// whose holder was told to give them up.
    async fn renew_batch(
        &self,
        batch: &[(ElectionName, FencingToken)],
    ) -> Result<(Vec<usize>, Vec<usize>)> {
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
        parse_renew(&reply, batch.len(), &self.id)
    }
}

/// The renewal script's answer for `seats` seats: the 0-based positions of the seats
/// gone or taken, and of the seats whose holder was told to give them up.
fn parse_renew(reply: &Value, seats: usize, id: &str) -> Result<(Vec<usize>, Vec<usize>)> {
    let items = match reply {
        Value::Int(-1) => return Err(session_gone("keep-alive", id)),
        Value::Array(items) => items,
        other => return Err(unexpected("keep-alive", format!("{other:?}"))),
    };
    let (mut lost, mut told) = (Vec::new(), Vec::new());
    for v in items {
        let at = as_int(v)
            .filter(|i| *i != 0 && i.unsigned_abs() <= seats as u64)
            .ok_or_else(|| unexpected("keep-alive", format!("{v:?}")))?;
        let position = (at.unsigned_abs() - 1) as usize;
        if at > 0 {
            lost.push(position);
        } else {
            told.push(position);
        }
    }
    Ok((lost, told))
}

/// A resign's token argument: the token, or "" for whatever this session has.
fn token_arg(token: Option<FencingToken>) -> String {
    token.map(|t| t.0.to_string()).unwrap_or_default()
}

/// The batch script's answer for `seats` seats: a token per granted seat.
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
            .map(|(e, h)| (e.clone(), h.token))
            .collect();
        let batches: Vec<&[(ElectionName, FencingToken)]> = if snapshot.is_empty() {
            vec![&[]]
        } else {
            snapshot.chunks(RENEW_BATCH).collect()
        };
        // Sent together on the multiplexed connection: one round trip for all.
        let answers = futures::future::join_all(batches.iter().map(|b| inner.renew_batch(b))).await;
        let mut lost = Vec::new();
        let mut told = Vec::new();
        for (batch, answer) in batches.iter().zip(answers) {
            let (gone, asked) = answer?;
            lost.extend(gone.iter().filter_map(|i| batch.get(*i)).cloned());
            told.extend(asked.iter().filter_map(|i| batch.get(*i)).cloned());
        }
        inner.report_lost(&lost);
        // A preemption or handover published while this session's subscriber was away
        // is heard here, once the renewal gets through.
        for (election, token) in told {
            inner.told(&election, token);
        }
        Ok(())
    }

    async fn campaign(
        &self,
        election: &ElectionName,
        candidate: &Candidate,
    ) -> Result<FencingToken> {
        let inner = &self.inner;
        inner.life.check_open()?;
        listen(inner);
        let keys = inner.shared.keys(election);
        let registration = inner.shared.hub.waiter(&keys.channel, &inner.id);
        lock(&inner.waiting).insert(election.clone());
        let mut waiting = Waiting {
            inner,
            election: election.clone(),
            keys: &keys,
            ended: false,
        };
        loop {
            inner.life.check_open()?;
            let was_subscribed = registration.is_subscribed();
            let acquired = inner.acquire(&keys, candidate, CampaignMode::Wait).await;
            if !matches!(acquired, Ok(Acquired::Held { .. })) {
                waiting.ended = true;
            }
            let next = match acquired? {
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
        listen(inner);
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
        listen(inner);
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
                    .is_some_and(|h| token.is_none_or(|want| h.token == want))
                {
                    held.remove(election);
                }
            }
        }
        let shared = &inner.shared;
        for chunk in grants.chunks(BATCH) {
            let mut invocation = RELEASE_MANY_SCRIPT.arg(&inner.id);
            invocation.arg(shared.grace_ms());
            for (election, token) in chunk {
                let keys = shared.keys(election);
                invocation
                    .key(&keys.seat)
                    .key(&keys.queue)
                    .key(&keys.next)
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
        drop(lock(&inner.listener).take());
        let registered: Vec<(ElectionName, Vec<String>)> = lock(&inner.members)
            .drain()
            .map(|(ns, ids)| (ns, ids.into_iter().collect()))
            .collect();
        let mut elections: Vec<ElectionName> = lock(&inner.held).drain().map(|(e, _)| e).collect();
        elections.extend(lock(&inner.waiting).iter().cloned());
        let shared = &inner.shared;
        let mut invocation = CLOSE_SCRIPT.key(&inner.key);
        invocation.arg(&inner.id).arg(shared.grace_ms());
        for election in &elections {
            let keys = shared.keys(election);
            invocation
                .key(keys.seat)
                .key(keys.queue)
                .key(keys.next)
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
    fn renew_replies() {
        let reply = Value::Array(vec![Value::Int(2), Value::Int(-1), Value::Int(-3)]);
        assert_eq!(parse_renew(&reply, 3, "s").unwrap(), (vec![1], vec![0, 2]));
        assert_eq!(
            parse_renew(&Value::Array(vec![]), 3, "s").unwrap(),
            (vec![], vec![])
        );
        assert_eq!(
            parse_renew(&Value::Int(-1), 3, "s").err().map(|e| e.kind()),
            Some(ErrorKind::SessionExpired)
        );
        for bad in [
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Int(4)]),
            Value::Array(vec![Value::Int(-4)]),
            Value::Nil,
        ] {
            assert_eq!(
                parse_renew(&bad, 3, "s").err().map(|e| e.kind()),
                Some(ErrorKind::Backend),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn preempt_messages() {
        let (e, t) = parse_preempt(b"preempt 1780000000000001 billing/shard-1").unwrap();
        assert_eq!(e.as_str(), "billing/shard-1");
        assert_eq!(t, FencingToken(1_780_000_000_000_001));
        for bad in [
            &b""[..],
            b"preempt",
            b"preempt 1",
            b"preempt x e",
            b"preempt 1 e extra",
            b"preempt 1 bad:name",
            b"free s1",
            b"\xff",
        ] {
            assert!(parse_preempt(bad).is_none(), "{bad:?}");
        }
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
