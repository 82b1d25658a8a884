//! The engine's primitives on Redis: a session is a key with its TTL (the server's
//! clock decides), an election is one hash, the conditional write and the read are one
//! Lua script call each (for any number of elections), and a change is heard on the
//! election's pub/sub channel (a session's end that is not a TTL passing, on the
//! session's channel), with the expiry of the session waited on timed from its PTTL.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use tenure_core::backend::primitive::{MemberStore, Primitives};
use tenure_core::backend::{lock, Capabilities, Clause, Purpose};
use tenure_core::engine::{Op, Record, Snapshot, Token, WaitFor, Write};
use tenure_core::{ElectionName, Error, Member, MemberStream, Result, Timing};
use tokio::sync::Notify;

use crate::error::{session_gone, unexpected};
use crate::keys::{jittered, millis_up, new_session_id, token_key};
use crate::members::{self, Known};
use crate::scripts::{
    COMMIT_MANY_SCRIPT, READ_MANY_SCRIPT, REGISTER_SCRIPT, RENEW_SESSIONS_SCRIPT, UNREGISTER_SCRIPT,
};
use crate::shared::{as_int, Shared};

/// The longest TTL accepted (about 34 years), far below what Redis can store.
const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// How many elections one script call reads or writes.
pub(crate) const BATCH: usize = 256;

/// Why clause 1 is declared with a condition.
const DATA_LOSS: &str = "holds while Redis keeps its data; after a restart without \
    persistence or a failover to a replica that missed writes, the seat can be granted again \
    before the old holder's deadline passes (fencing tokens keep increasing, so a guarded \
    resource refuses the old holder)";

/// The primitives of one Redis backend.
pub(crate) struct RedisPrimitives {
    pub(crate) shared: Arc<Shared>,
    /// The namespaces each session of this process registered members in, to remove
    /// them (and tell their watchers) when the session is revoked.
    registered: std::sync::Mutex<HashMap<String, HashSet<ElectionName>>>,
}

impl std::fmt::Debug for RedisPrimitives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPrimitives")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// An election as read: the snapshot and each record's session PTTL in ms (-2: gone).
type Read = (Snapshot, HashMap<String, i64>);

impl RedisPrimitives {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        RedisPrimitives {
            shared,
            registered: std::sync::Mutex::default(),
        }
    }

    fn session_key(&self, id: &str) -> String {
        format!("{}{id}", self.shared.sessions)
    }

    fn session_channel(&self, id: &str) -> String {
        format!("{}{id}", self.shared.session_channels)
    }

    async fn read_all(&self, elections: &[ElectionName]) -> Result<Vec<Read>> {
        let mut out = Vec::with_capacity(elections.len());
        for chunk in elections.chunks(BATCH) {
            let mut invocation = READ_MANY_SCRIPT.prepare_invoke();
            for e in chunk {
                invocation.key(self.shared.keys(e).hash);
            }
            invocation.arg(&self.shared.sessions);
            let reply = self.shared.script("read", &invocation).await?;
            out.extend(
                parse_many(&reply, chunk.len(), false)?
                    .into_iter()
                    .map(|(_, r)| r),
            );
        }
        Ok(out)
    }

    async fn commit_all(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Read)>> {
        let mut out = Vec::with_capacity(writes.len());
        for chunk in writes.chunks(BATCH) {
            let mut invocation = COMMIT_MANY_SCRIPT.prepare_invoke();
            invocation
                .key(token_key(self.shared.config.key_prefix()))
                .arg(&self.shared.sessions);
            for (e, write) in chunk {
                let keys = self.shared.keys(e);
                invocation
                    .key(keys.hash)
                    .arg(keys.channel)
                    .arg(write.revision);
                let mut left = b"-".to_vec();
                if let Some(bytes) = write.left_body() {
                    left = [&b"="[..], &bytes].concat();
                }
                invocation.arg(left).arg(write.ops.len());
                for op in &write.ops {
                    let (kind, token) = match op {
                        Op::Delete(_) => ("d", String::new()),
                        Op::Touch(_) => ("t", String::new()),
                        Op::Put { token, .. } => match token {
                            Token::Mint => ("m", String::new()),
                            Token::Keep(t) => ("p", t.to_string()),
                            Token::None => ("p", String::new()),
                        },
                    };
                    let body = op.body().unwrap_or_default();
                    invocation.arg(kind).arg(op.session()).arg(token).arg(body);
                }
            }
            let reply = self
                .shared
                .guarded_script(Purpose::Election, "commit", &invocation)
                .await?;
            out.extend(parse_many(&reply, chunk.len(), true)?);
        }
        Ok(out)
    }

    async fn read_one(&self, election: &ElectionName) -> Result<Read> {
        let mut all = self.read_all(std::slice::from_ref(election)).await?;
        all.pop()
            .ok_or_else(|| unexpected("read", "no election in the answer"))
    }
}

/// The answer of the read or commit script for `n` elections (each `{committed,
/// snapshot}` if `committed`, else the snapshot).
fn parse_many(reply: &Value, n: usize, committed: bool) -> Result<Vec<(bool, Read)>> {
    let bad = || unexpected("election script", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    if items.len() != n {
        return Err(bad());
    }
    items
        .iter()
        .map(|item| match (committed, item) {
            (false, snap) => Ok((false, parse_election(snap)?)),
            (true, Value::Array(pair)) => match &pair[..] {
                [done, snap] => Ok((as_int(done) == Some(1), parse_election(snap)?)),
                _ => Err(bad()),
            },
            _ => Err(bad()),
        })
        .collect()
}

/// Bytes of a reply (a nil or an integer holds none).
fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn parse_election(reply: &Value) -> Result<Read> {
    let bad = || unexpected("read", format!("{reply:?}"));
    let Value::Array(items) = reply else {
        return Err(bad());
    };
    let (Some(revision), Some(left)) = (items.first().and_then(as_int), items.get(1)) else {
        return Err(bad());
    };
    let number = |v: &Value| -> Result<Option<u64>> {
        match bytes(v).unwrap_or_default() {
            b"" => Ok(None),
            digits => std::str::from_utf8(digits)
                .ok()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(bad),
        }
    };
    let mut records = Vec::new();
    let mut pttls = HashMap::new();
    for r in items.get(2..).unwrap_or_default().chunks(6) {
        let [session, arrival, version, token, pttl, body] = r else {
            return Err(bad());
        };
        let session = String::from_utf8_lossy(bytes(session).ok_or_else(bad)?).into_owned();
        let pttl = as_int(pttl).ok_or_else(bad)?;
        records.push(Record::from_store(
            session.clone(),
            number(arrival)?.unwrap_or(0),
            number(version)?.unwrap_or(0),
            number(token)?,
            pttl != -2,
            bytes(body).unwrap_or_default(),
        ));
        pttls.insert(session, pttl);
    }
    let revision = u64::try_from(revision).map_err(|_| bad())?;
    let left = bytes(left).unwrap_or_default();
    Ok((Snapshot::from_store(revision, left, records), pttls))
}

/// Whether what `what` waits for happened, as `snap` shows.
fn happened(snap: &Snapshot, what: &WaitFor) -> bool {
    let mine = what
        .me
        .as_deref()
        .is_some_and(|me| snap.record(me).is_none_or(|r| r.version > what.seen));
    let on = what
        .on
        .as_deref()
        .is_some_and(|on| snap.record(on).is_none_or(|r| !r.live));
    let moved = what.me.is_none() && what.on.is_none() && snap.revision != what.seen;
    mine || on || moved
}

/// Whether a commit message (`<revision> <op>:<session>…`) may be what `what` waits for.
fn concerns(payload: &[u8], what: &WaitFor) -> bool {
    let text = String::from_utf8_lossy(payload);
    let mut words = text.split(' ');
    let revision = words.next().and_then(|r| r.parse::<u64>().ok());
    if what.me.is_none() && what.on.is_none() {
        return revision != Some(what.seen);
    }
    words.any(|w| {
        let (kind, session) = w.split_once(':').unwrap_or(("", w));
        what.me.as_deref() == Some(session) || (kind == "d" && what.on.as_deref() == Some(session))
    })
}

#[async_trait]
impl Primitives for RedisPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let id = new_session_id();
        let (key, ms) = (self.session_key(&id), millis_up(ttl));
        self.shared
            .conn
            .run(Purpose::Election, "open session", |mut c| {
                let key = key.clone();
                async move {
                    redis::cmd("SET")
                        .arg(&key)
                        .arg(ms)
                        .arg("PX")
                        .arg(ms)
                        .query_async::<Value>(&mut c)
                        .await
                }
            })
            .await?;
        Ok(id)
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let mut invocation = RENEW_SESSIONS_SCRIPT.prepare_invoke();
        for s in sessions {
            invocation.key(self.session_key(s));
        }
        let reply = self
            .shared
            .guarded_script(Purpose::Renewal, "renew", &invocation)
            .await?;
        match &reply {
            Value::Array(items) if items.len() == sessions.len() => {
                Ok(items.iter().map(|v| as_int(v) == Some(1)).collect())
            }
            _ => Err(unexpected("renew", format!("{reply:?}"))),
        }
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        let (key, channel) = (self.session_key(session), self.session_channel(session));
        self.shared
            .conn
            .run(Purpose::Election, "end session", |mut c| {
                let (key, channel) = (key.clone(), channel.clone());
                async move {
                    redis::pipe()
                        .del(&key)
                        .publish(&channel, "end")
                        .query_async::<Value>(&mut c)
                        .await
                }
            })
            .await?;
        let namespaces = lock(&self.registered).remove(session).unwrap_or_default();
        for namespace in namespaces {
            unregister(&self.shared, session, &namespace, None).await?;
        }
        Ok(())
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        Ok(self.read_one(election).await?.0)
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let mut all = self
            .commit_all(&[(election.clone(), write.clone())])
            .await?;
        let (done, (snap, _)) = all
            .pop()
            .ok_or_else(|| unexpected("commit", "no election in the answer"))?;
        Ok((done, snap))
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let all = self.read_all(elections).await?;
        Ok(all.into_iter().map(|(snap, _)| snap).collect())
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let all = self.commit_all(writes).await?;
        Ok(all
            .into_iter()
            .map(|(done, (snap, _))| (done, snap))
            .collect())
    }

    fn batch(&self) -> Option<usize> {
        Some(BATCH)
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let hub = &self.shared.hub;
        let heard = Arc::new(Notify::new());
        let on_message = {
            let (heard, what) = (heard.clone(), what.clone());
            Arc::new(move |payload: &[u8]| {
                if concerns(payload, &what) {
                    heard.notify_one();
                }
            })
        };
        // Subscribe first, then look: a change after the look is heard.
        let mut registrations = vec![hub.listener(&self.shared.keys(election).channel, on_message)];
        if let Some(on) = &what.on {
            let heard = heard.clone();
            let end = Arc::new(move |_: &[u8]| heard.notify_one());
            registrations.push(hub.listener(&self.session_channel(on), end));
        }
        let poll = self.shared.config.get_poll_interval();
        loop {
            let all_subscribed = async {
                for r in &registrations {
                    r.subscribed().await;
                }
            };
            // Without a subscription (the link is down), look at least every poll
            // interval.
            let subscribed = tokio::time::timeout(poll, all_subscribed).await.is_ok();
            let (snap, pttls) = self.read_one(election).await?;
            if happened(&snap, what) {
                return Ok(());
            }
            // The session waited on ends by itself when its TTL passes.
            let expiry = what
                .on
                .as_ref()
                .and_then(|on| pttls.get(on))
                .and_then(|ms| u64::try_from(*ms).ok())
                .map(|ms| Duration::from_millis(ms + 1));
            // A waiter or an observer also looks every poll interval (a change made
            // without the script publishes nothing); a holder hears of changes to its
            // own record by message, or looks again after a re-subscription.
            let polls = !subscribed || what.on.is_some() || what.me.is_none();
            let lost = async {
                let poll = async {
                    match polls {
                        true => tokio::time::sleep(jittered(poll)).await,
                        false => std::future::pending().await,
                    }
                };
                let broken = async {
                    match subscribed {
                        true => {
                            let each = registrations.iter().map(|r| Box::pin(r.unsubscribed()));
                            futures::future::select_all(each).await;
                        }
                        false => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = poll => {}
                    () = broken => {}
                }
            };
            let ends = async {
                match expiry {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = heard.notified() => return Ok(()),
                () = ends => return Ok(()),
                () = lost => {}
            }
        }
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(self)
    }

    fn check_timing(&self, timing: &Timing) -> Result<()> {
        if timing.ttl > MAX_TTL {
            return Err(Error::invalid(format!(
                "ttl: {:?} is too long (at most {MAX_TTL:?})",
                timing.ttl
            )));
        }
        Ok(())
    }

    fn capabilities(&self, offered: Capabilities) -> Capabilities {
        offered
            .except(Clause::AtMostOneHolder, DATA_LOSS)
            .batched(BATCH)
    }
}

/// Remove `session`'s members `id` (every one if `None`) of `namespace`.
async fn unregister(
    shared: &Shared,
    session: &str,
    namespace: &ElectionName,
    id: Option<&str>,
) -> Result<()> {
    let keys = shared.member_keys(namespace);
    let mut invocation = UNREGISTER_SCRIPT.key(&keys.hash);
    invocation.arg(session).arg(&keys.channel);
    if let Some(id) = id {
        invocation.arg(id);
    }
    shared.script("unregister member", &invocation).await?;
    Ok(())
}

#[async_trait]
impl MemberStore for RedisPrimitives {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let keys = self.shared.member_keys(namespace);
        lock(&self.registered)
            .entry(session.to_string())
            .or_default()
            .insert(namespace.clone());
        let mut invocation = REGISTER_SCRIPT.key(self.session_key(session));
        invocation
            .key(&keys.hash)
            .arg(session)
            .arg(member.id())
            .arg(member.value())
            .arg(&keys.channel);
        let reply = self.shared.script("register member", &invocation).await?;
        match as_int(&reply) {
            Some(-1) => Err(session_gone("register member", session)),
            Some(0 | 1) => Ok(()),
            _ => Err(unexpected("register member", format!("{reply:?}"))),
        }
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        Member::check_id(id)?;
        unregister(&self.shared, session, namespace, Some(id)).await
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        let keys = self.shared.member_keys(namespace);
        let (members, _) = members::list(&self.shared, &keys.hash, &mut Known::new()).await?;
        Ok(members)
    }

    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        members::watch(self.shared.clone(), namespace).await
    }
}
