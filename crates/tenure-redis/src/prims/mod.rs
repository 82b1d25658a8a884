//! The engine's primitives on Redis: a session is a key with its TTL, an election one
//! hash, a read or a conditional write one script call (for up to [`BATCH`]
//! elections). A write publishes the election as it leaves it to the channel of each
//! session in it (subscribed before the session's first write), so waiters and holders
//! need no read; a revocation is published on a store-wide channel, and the expiry of a
//! session waited on is timed from its PTTL.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use tenure_core::backend::primitive::{MemberStore, Primitives, Wake};
use tenure_core::backend::{lock, Capabilities, Clause, Purpose};
use tenure_core::engine::{Op, Record, Snapshot, Token, WaitFor, Write};
use tenure_core::{ElectionName, Error, Member, MemberStream, Result, Timing};
use tokio::time::Instant;

use crate::error::{session_gone, unexpected};
use crate::hub::{Handler, Registration};
use crate::keys::{ended_channel, jittered, millis_up, new_session_id, token_key};
use crate::members::{self, Known};
use crate::scripts::{
    COMMIT_MANY_SCRIPT, READ_MANY_SCRIPT, REGISTER_SCRIPT, RENEW_SESSIONS_SCRIPT, UNREGISTER_SCRIPT,
};
use crate::shared::{as_int, bytes, Shared};

mod member_store;
mod parse;

pub(crate) use member_store::unregister;
use parse::*;

/// The longest TTL accepted (about 34 years), far below what Redis can store.
const MAX_TTL: Duration = Duration::from_millis(1 << 40);

/// How many elections one script call reads or writes.
pub(crate) const BATCH: usize = 256;

/// Why clause 1 is declared with a condition.
const DATA_LOSS: &str = "holds while Redis keeps its data; after a restart without \
    persistence or a failover to a replica that missed writes, the seat can be granted again \
    before the old holder's deadline passes (fencing tokens keep increasing, so a guarded \
    resource refuses the old holder)";

/// How long an election pushed or answered is kept for the registrations after it.
const KEPT: Duration = Duration::from_secs(300);

pub(crate) struct RedisPrimitives {
    pub(crate) shared: Arc<Shared>,
    /// The namespaces each session registered members in, to remove them on revoke.
    registered: Mutex<HashMap<String, HashSet<ElectionName>>>,
    /// The subscription to the channel of each session opened here.
    channels: Mutex<HashMap<String, Registration>>,
    /// The subscription to the store-wide channel of revoked sessions.
    ended: OnceLock<Registration>,
    pushes: Arc<Mutex<Pushes>>,
}

/// A wait registered by [`Primitives::notify`], or by [`Primitives::changed`] for the
/// call.
struct Waiter {
    election: ElectionName,
    what: WaitFor,
    to: Wake,
}

/// What the pushes to this process's sessions feed.
#[derive(Default)]
struct Pushes {
    /// By election hash, then by the session waiting (or a `changed` call's own key):
    /// kept until the session's record is gone, the wake-up channel closes or the key
    /// registers again.
    waits: HashMap<String, HashMap<String, Waiter>>,
    /// The last election pushed or answered by hash, and when (cleared by a
    /// re-subscription): a registration behind it is woken at once.
    last: HashMap<String, (Instant, Snapshot)>,
    /// When each session seen ends unless renewed; `None` for a session key without a
    /// TTL (made persistent by hand), which ends only when revoked.
    ends: HashMap<String, Option<Instant>>,
    /// How many re-subscriptions there were: an answer to a request sent before one is
    /// not noted (a push after it may be lost).
    breaks: u64,
    /// The size of `last` and `ends` at which they are pruned next.
    prune_at: usize,
}

impl Pushes {
    /// A message on a session's channel (for every wait on the election), or on the
    /// election's own channel (for the wait `only`): the election as a write left it
    /// (an empty one, after a re-subscription, is handled by [`ended`](Self::ended)).
    fn pushed(&mut self, payload: &[u8], only: Option<&str>) {
        let Some((hash, (snap, pttls))) = unpack(payload) else {
            return;
        };
        self.note(&hash, &snap, &pttls);
        let Some(waiters) = self.waits.get_mut(&hash) else {
            return;
        };
        waiters.retain(|key, w| {
            if only.is_some_and(|o| o != key) {
                return true;
            }
            let after = snap.revision > w.what.seen;
            if after && w.what.met_by(&snap) {
                w.to.wake_with(&w.election, snap.clone());
            }
            let gone = w
                .what
                .me
                .as_deref()
                .is_some_and(|me| snap.record(me).is_none());
            !(w.to.is_closed() || after && gone)
        });
        if waiters.is_empty() {
            self.waits.remove(&hash);
        }
    }

    /// A message on the channel of revoked sessions: the id of one, whose own waits and
    /// those on it are woken. Empty after a re-subscription (of every channel at once):
    /// every wait is woken and what was pushed before is forgotten.
    fn ended(&mut self, payload: &[u8]) {
        if payload.is_empty() {
            self.last.clear();
            self.breaks += 1;
        }
        let id = String::from_utf8_lossy(payload);
        let id = id.as_ref();
        self.ends.remove(id);
        for w in self.waits.values().flat_map(HashMap::values) {
            if id.is_empty() || w.what.on.as_deref() == Some(id) || w.what.me.as_deref() == Some(id)
            {
                w.to.wake(&w.election);
            }
        }
        for waiters in self.waits.values_mut() {
            waiters.remove(id);
        }
    }

    /// Note an election pushed or answered, and when its sessions end unless renewed.
    fn note(&mut self, hash: &str, snap: &Snapshot, pttls: &HashMap<String, i64>) {
        let now = Instant::now();
        match self.last.get_mut(hash) {
            Some((_, had)) if had.revision >= snap.revision => {}
            Some(had) => *had = (now, snap.clone()),
            None => {
                self.last.insert(hash.to_string(), (now, snap.clone()));
            }
        }
        for (session, ms) in pttls {
            let end = match u64::try_from(*ms) {
                Ok(ms) => Some(now + Duration::from_millis(ms + 1)),
                // PTTL -1: the key has no TTL; -2: it is gone (the record shows it dead).
                Err(_) if *ms == -1 => None,
                Err(_) => continue,
            };
            self.ends.insert(session.clone(), end);
        }
        if self.ends.len() + self.last.len() > self.prune_at {
            self.ends.retain(|_, end| end.is_none_or(|end| end > now));
            self.last
                .retain(|_, (at, _)| now.duration_since(*at) < KEPT);
            self.waits.retain(|_, waiters| {
                waiters.retain(|_, w| !w.to.is_closed());
                !waiters.is_empty()
            });
            self.prune_at = 2 * (self.ends.len() + self.last.len()).max(1024);
        }
    }

    /// Register `to` as the wait `key` (the session waiting, or a `changed` call) on
    /// the election whose hash is `hash`. Woken at once if pushed past `what.seen`
    /// before, or not known since a re-subscription; then by the pushes and
    /// revocations after, and when the session waited on ends by its TTL (which pushes
    /// nothing; its end unknown, at once, and the waiter reads, which notes it).
    fn wait(&mut self, hash: &str, key: &str, election: &ElectionName, what: &WaitFor, to: &Wake) {
        match self.last.get(hash) {
            Some((_, last)) if last.revision > what.seen => {
                if what.met_by(last) {
                    to.wake_with(election, last.clone());
                }
            }
            Some(_) => {}
            None => {
                to.wake(election);
            }
        }
        if let Some(on) = &what.on {
            let end = self.ends.get(on).copied().unwrap_or(Some(Instant::now()));
            if let Some(end) = end {
                let (to, election) = (to.clone(), election.clone());
                tokio::spawn(async move {
                    tokio::time::sleep_until(end).await;
                    to.wake(&election);
                });
            }
        }
        let waiters = self.waits.entry(hash.to_string()).or_default();
        waiters.retain(|_, w| !w.to.is_closed());
        let waiter = Waiter {
            election: election.clone(),
            what: what.clone(),
            to: to.clone(),
        };
        waiters.insert(key.to_string(), waiter);
    }
}

/// The listener of a channel whose messages go to `pushes`.
fn feed(
    pushes: &Arc<Mutex<Pushes>>,
    each: impl Fn(&mut Pushes, &[u8]) + Send + Sync + 'static,
) -> Handler {
    let pushes = pushes.clone();
    Arc::new(move |payload: &[u8]| each(&mut lock(&pushes), payload))
}

impl std::fmt::Debug for RedisPrimitives {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisPrimitives")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

impl RedisPrimitives {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        RedisPrimitives {
            shared,
            registered: Mutex::default(),
            channels: Mutex::default(),
            ended: OnceLock::new(),
            pushes: Arc::default(),
        }
    }

    /// The subscription to the channel of revoked sessions, made on first use.
    fn ended(&self) -> &Registration {
        self.ended.get_or_init(|| {
            let channel = self.ended_channel();
            self.shared
                .hub
                .listener(&channel, feed(&self.pushes, Pushes::ended))
        })
    }

    fn ended_channel(&self) -> String {
        let config = &self.shared.config;
        ended_channel(config.key_prefix(), config.database())
    }

    fn session_key(&self, id: &str) -> String {
        format!("{}{id}", self.shared.sessions)
    }

    fn session_channel(&self, id: &str) -> String {
        format!("{}{id}", self.shared.session_channels)
    }

    /// Note the elections of an answer, unless the subscriptions broke since its request
    /// (`breaks` then); the answer without the PTTLs.
    fn noted<'a>(
        &self,
        breaks: u64,
        elections: impl Iterator<Item = &'a ElectionName>,
        answer: Vec<(bool, Read)>,
    ) -> Vec<(bool, Snapshot)> {
        let mut pushes = lock(&self.pushes);
        let note = pushes.breaks == breaks;
        let answered = elections.zip(answer);
        answered
            .map(|(e, (done, (snap, pttls)))| {
                if note {
                    pushes.note(&self.shared.keys(e).hash, &snap, &pttls);
                }
                (done, snap)
            })
            .collect()
    }
}

#[async_trait]
impl Primitives for RedisPrimitives {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let id = new_session_id();
        let (key, ms) = (self.session_key(&id), millis_up(ttl));
        // Subscribed before the session's first write, so no push to it is missed.
        let pushes = self.shared.hub.listener(
            &self.session_channel(&id),
            feed(&self.pushes, |p, message| p.pushed(message, None)),
        );
        let ended = self.ended();
        self.shared
            .conn
            .run(Purpose::Election, "open session", move |mut c| async move {
                let mut set = redis::cmd("SET");
                set.arg(&key).arg(ms).arg("PX").arg(ms);
                set.query_async::<Value>(&mut c).await
            })
            .await?;
        // Without the subscriptions confirmed, the session's waits fall back to
        // `changed` (see `notify`).
        let limit = self.shared.config.get_connect_timeout();
        let confirmed = async {
            pushes.subscribed().await;
            ended.subscribed().await;
        };
        let _ = tokio::time::timeout(limit, confirmed).await;
        lock(&self.channels).insert(id.clone(), pushes);
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
                let live: Vec<bool> = items.iter().map(|v| as_int(v) == Some(1)).collect();
                let mut channels = lock(&self.channels);
                for (s, _) in sessions.iter().zip(&live).filter(|(_, l)| !**l) {
                    channels.remove(s);
                }
                Ok(live)
            }
            _ => Err(unexpected("renew", format!("{reply:?}"))),
        }
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        lock(&self.channels).remove(session);
        let (key, channel) = (self.session_key(session), self.ended_channel());
        self.shared
            .conn
            .run(Purpose::Election, "end session", move |mut c| async move {
                let mut pipe = redis::pipe();
                pipe.del(&key).publish(&channel, session);
                pipe.query_async::<Value>(&mut c).await
            })
            .await?;
        let namespaces = lock(&self.registered).remove(session).unwrap_or_default();
        for namespace in namespaces {
            unregister(&self.shared, session, &namespace, None).await?;
        }
        Ok(())
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let mut all = self.read_many(std::slice::from_ref(election)).await?;
        all.pop()
            .ok_or_else(|| unexpected("read", "no election in the answer"))
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let one = [(election.clone(), write.clone())];
        let mut all = self.commit_many(&one).await?;
        all.pop()
            .ok_or_else(|| unexpected("commit", "no election in the answer"))
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let mut out = Vec::with_capacity(elections.len());
        let breaks = lock(&self.pushes).breaks;
        for chunk in elections.chunks(BATCH) {
            let mut invocation = READ_MANY_SCRIPT.prepare_invoke();
            for e in chunk {
                invocation.key(self.shared.keys(e).hash);
            }
            invocation.arg(&self.shared.sessions);
            let reply = self.shared.script("read", &invocation).await?;
            out.extend(parse_many(&reply, chunk.len(), false)?);
        }
        let answer = self.noted(breaks, elections.iter(), out);
        Ok(answer.into_iter().map(|(_, snap)| snap).collect())
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let mut out = Vec::with_capacity(writes.len());
        let breaks = lock(&self.pushes).breaks;
        for chunk in writes.chunks(BATCH) {
            let mut invocation = COMMIT_MANY_SCRIPT.prepare_invoke();
            invocation
                .key(token_key(self.shared.config.key_prefix()))
                .arg(&self.shared.sessions)
                .arg(&self.shared.session_channels);
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
        Ok(self.noted(breaks, writes.iter().map(|(e, _)| e), out))
    }

    fn batch(&self) -> Option<usize> {
        Some(BATCH)
    }

    /// The wait of [`notify`](Primitives::notify) under a key of the call's own, fed by
    /// the election's channel (which every commit publishes to) too; a read comes first
    /// and after every break of the link.
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        let keys = self.shared.keys(election);
        // No session's id: no push or revocation of a session names it.
        let key = format!("#{}", new_session_id());
        let mine = key.clone();
        let on_message = feed(&self.pushes, move |p, m| p.pushed(m, Some(&mine)));
        // Subscribe first, then look: a change after the look is heard.
        let channel = self.shared.hub.listener(&keys.channel, on_message);
        let registrations = [&channel, self.ended()];
        let poll = self.shared.config.get_poll_interval();
        loop {
            let all_subscribed = async {
                for r in registrations {
                    r.subscribed().await;
                }
            };
            // Without a subscription (the link is down), look at least every poll
            // interval.
            let subscribed = tokio::time::timeout(poll, all_subscribed).await.is_ok();
            if what.met_by(&self.read(election).await?) {
                return Ok(());
            }
            let (to, mut woken) = Wake::channel();
            lock(&self.pushes).wait(&keys.hash, &key, election, what, &to);
            // A push that does not show `what` (pushes wake a follower at every change)
            // does not end the wait.
            let heard = async {
                while let Some((_, now)) = woken.recv().await {
                    if now.is_none_or(|snap| what.met_by(&snap)) {
                        return;
                    }
                }
            };
            // Subscribed, every commit and revocation is heard, and a message lost to a
            // broken link is made up for by the read after the re-subscription (which
            // also wakes every wait).
            let broken = futures::future::select_all(
                registrations.iter().map(|r| Box::pin(r.unsubscribed())),
            );
            tokio::select! {
                () = heard => return Ok(()),
                () = tokio::time::sleep(jittered(poll)), if !subscribed => {}
                _ = broken, if subscribed => {}
            }
        }
    }

    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        let Some(me) = what.me.as_deref() else {
            return false;
        };
        // Both channels confirmed, no push or revocation after this is missed (a break
        // wakes every wait when they are confirmed again).
        let ended = self.ended.get().is_some_and(Registration::is_subscribed);
        if !ended
            || !lock(&self.channels)
                .get(me)
                .is_some_and(Registration::is_subscribed)
        {
            return false;
        }
        let hash = self.shared.keys(election).hash;
        lock(&self.pushes).wait(&hash, me, election, what, to);
        true
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

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ElectionName {
        ElectionName::new(n).expect("name")
    }

    /// A wait on a session is woken when the session's TTL runs out, at once when its
    /// end is unknown (the waiter reads and learns it), and not by a timer when its key
    /// has no TTL (made persistent by hand): that wait would otherwise wake, read and
    /// wait again without pause.
    #[tokio::test(start_paused = true)]
    async fn a_wait_on_a_session_wakes_when_its_ttl_runs_out() {
        let mut pushes = Pushes::default();
        let ttls = HashMap::from([("a".to_string(), 500), ("p".to_string(), -1)]);
        let snap = Snapshot::default();
        pushes.note("h", &snap, &ttls);
        let e = name("e");
        let on = |s: &str| WaitFor {
            me: Some("b".into()),
            on: Some(s.into()),
            seen: 0,
        };
        let woken = |pushes: &mut Pushes, session: &str| {
            let (to, mut woken) = Wake::channel();
            pushes.wait("h", session, &e, &on(session), &to);
            tokio::spawn(async move { woken.recv().await.is_some() })
        };
        let (ttl, unknown, persisted) = (
            woken(&mut pushes, "a"),
            woken(&mut pushes, "u"),
            woken(&mut pushes, "p"),
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(unknown.is_finished(), "an unknown end wakes at once");
        assert!(!ttl.is_finished(), "woken before the TTL ran out");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(ttl.is_finished(), "not woken when the TTL ran out");
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(
            !persisted.is_finished(),
            "a key without a TTL woke its waiter"
        );
    }
}
