//! The engine's primitives over tenure's functions in `schema.sql`, each one
//! statement (one round trip), and the member lists beside them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tenure_core::backend::primitive::{MemberStore, Primitives, Wake};
use tenure_core::backend::{Capabilities, Published, Purpose};
use tenure_core::engine::{Op, Snapshot, Token, WaitFor, Write};
use tenure_core::{CancellationToken, ElectionName, Member, MemberStream, Result, Retry};
use tokio::time::Instant;
use tokio_postgres::types::FromSql;
use tokio_postgres::Row;

use crate::config::PostgresConfig;
use crate::link::{decode, unexpected, Arg, Hub, Registered, Requester};

/// Elections per statement of [`PostgresStore::commit_many`] and
/// [`PostgresStore::read_many`].
pub(crate) const BATCH: usize = 64;

/// How long a follower of a member list with nothing due to expire waits before it
/// reads again anyway (a safety net: changes come by notification).
const IDLE: Duration = Duration::from_secs(60);

/// How long a follower's channel stays listened to after its last wait, so that the
/// next wait of the same follower costs no LISTEN.
const LINGER: Duration = Duration::from_secs(30);

/// How long a wait waits for the hub to hear of the write it was decided on (this
/// backend's own, usually on its way) before it asks the server instead.
const CATCH_UP: Duration = Duration::from_millis(50);

/// The schema version this crate's `schema.sql` creates, and the file.
pub(crate) const SCHEMA: (i32, &str) = (3, include_str!("schema.sql"));

/// The engine's primitives in one PostgreSQL schema.
pub(crate) struct PostgresStore {
    pub(crate) config: PostgresConfig,
    pub(crate) requester: Requester,
    pub(crate) hub: Arc<Hub>,
    /// The channel this backend LISTENs on for its sessions' waits.
    pub(crate) channel: String,
    /// Stops the listening connection when the store goes.
    pub(crate) stop: CancellationToken,
    /// This store, for the tasks that follow member lists.
    pub(crate) me: std::sync::Weak<PostgresStore>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresStore({})", self.config)
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Column `i` of `row`.
pub(crate) fn get<'a, T: FromSql<'a>>(what: &str, row: &'a Row, i: usize) -> Result<T> {
    row.try_get(i).map_err(|e| unexpected(what, e))
}

/// A number of milliseconds the server computed, as a wait.
fn millis(ms: i64) -> Duration {
    Duration::from_millis(ms.max(0).unsigned_abs())
}

/// A sequence value (never negative).
fn unsigned(n: i64) -> u64 {
    n.max(0).unsigned_abs()
}

fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The elections in the rows `read` and `commit` return, `(n, [done,] revision, snap)`
/// with `skip` columns before the revision, in the order of `n` in `1..=count`.
fn snapshots(what: &str, rows: &[Row], count: usize, skip: usize) -> Result<Vec<(bool, Snapshot)>> {
    if rows.len() != count {
        return Err(unexpected(what, "not one answer per election"));
    }
    let mut answers = Vec::with_capacity(count);
    for (n, row) in (1..).zip(rows) {
        if get::<i32>(what, row, 0)? != n {
            return Err(unexpected(what, "answers out of order"));
        }
        let done = skip > 0 && get::<bool>(what, row, 1)?;
        let revision = unsigned(get(what, row, 1 + skip)?);
        let (snap, _) = decode(revision, get(what, row, 2 + skip)?)
            .ok_or_else(|| unexpected(what, "a malformed election"))?;
        answers.push((done, snap));
    }
    Ok(answers)
}

impl PostgresStore {
    /// The channel followers of `name` of `kind` ('e' an election, 'm' a namespace)
    /// LISTEN on, as `chan` in `schema.sql` names it.
    fn chan(&self, kind: &str, name: &ElectionName) -> String {
        use md5::Digest;
        let text = format!("{}:{kind}:{}", self.config.schema, name.as_str());
        let digest = md5::Md5::digest(text.as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        format!("t{hex}")
    }

    async fn call(&self, what: &str, sql: &str, args: &[&dyn Arg]) -> Result<Vec<Row>> {
        self.requester
            .call(Purpose::Election, what, sql, args)
            .await
    }

    /// Whether what `what` waits for in `election` happened (`None`), else how long
    /// until the session ahead expires, as the server reckons it.
    async fn check(
        &self,
        election: &ElectionName,
        what: &WaitFor,
    ) -> Result<Option<Option<Duration>>> {
        let (me, on, seen) = (what.me.as_deref(), what.on.as_deref(), signed(what.seen));
        let sql = "SELECT done, wait_ms FROM {S}.changed($1, $2, $3, $4)";
        let args: [&dyn Arg; 4] = [&election.as_str(), &me, &on, &seen];
        let rows = self.call("wait", sql, &args).await?;
        let row = rows.first().ok_or_else(|| unexpected("wait", "no row"))?;
        if get::<Option<bool>>("wait", row, 0)?.unwrap_or(true) {
            return Ok(None);
        }
        Ok(Some(get::<Option<i64>>("wait", row, 1)?.map(millis)))
    }

    /// Register a wait for what `what` names in `election`, woken through `to`, and
    /// look at the server where the hub cannot be sure to hear of it: until the hub
    /// heard the election at the revision the wait was decided on, and when the
    /// session ahead may have expired (an expiry sends no note). The wait's id, while
    /// it waits.
    fn watch(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> Option<u64> {
        let Registered { id, done, sure } = self.hub.register(election, what, to)?;
        let sure = sure && what.me.is_some();
        if sure && what.on.is_none() {
            return Some(id);
        }
        let Some(store) = self.me.upgrade() else {
            return Some(id);
        };
        let (election, what) = (election.clone(), what.clone());
        tokio::spawn(async move { store.guard(&election, &what, id, done, sure).await });
        Some(id)
    }

    /// The looks at the server a registered wait needs (see [`Self::watch`]).
    async fn guard(
        &self,
        election: &ElectionName,
        what: &WaitFor,
        id: u64,
        done: CancellationToken,
        mut sure: bool,
    ) {
        let e = election.as_str();
        let now = Instant::now;
        // After the hub heard the election at `seen`, only the session ahead's expiry
        // is left to look for, when the notes last put it.
        let next = |sure: bool| match (&what.on, sure) {
            (_, false) => Some(now()),
            (None, true) => None,
            (Some(on), true) => Some(self.hub.ends(on).unwrap_or_else(now)),
        };
        let unheard = !sure && what.me.is_some();
        let mut at = if unheard {
            Some(now() + CATCH_UP)
        } else {
            next(sure)
        };
        while let Some(t) = at {
            tokio::select! {
                () = done.cancelled() => return,
                () = tokio::time::sleep_until(t) => {}
            }
            if !sure && what.me.is_some() && self.hub.heard(e).is_some_and(|h| h >= what.seen) {
                (sure, at) = (true, next(true));
                continue;
            }
            match self.check(election, what).await {
                Ok(Some(expiry)) => {
                    sure = true;
                    at = expiry.map(|d| now() + d + Duration::from_millis(1));
                }
                // An error wakes the wait too: its follower reads, and meets it.
                Ok(None) | Err(_) => {
                    if let Some(to) = self.hub.take(e, id) {
                        to.wake(election);
                    }
                    return;
                }
            }
        }
    }

    async fn commit_batch(
        &self,
        writes: &[(ElectionName, Write)],
    ) -> Result<Vec<(bool, Snapshot)>> {
        let names: Vec<&str> = writes.iter().map(|(e, _)| e.as_str()).collect();
        let revs: Vec<i64> = writes.iter().map(|(_, w)| signed(w.revision)).collect();
        let keeps: Vec<Option<Vec<u8>>> = writes.iter().map(|(_, w)| w.left_body()).collect();
        let (mut ws, mut kinds, mut sids) = (Vec::new(), Vec::new(), Vec::new());
        let (mut toks, mut bodies) = (Vec::new(), Vec::new());
        for (i, (_, w)) in (1i32..).zip(writes) {
            for op in &w.ops {
                ws.push(i);
                let (kind, token) = match op {
                    Op::Put { token, .. } => match token {
                        Token::None => (b'n', None),
                        Token::Keep(t) => (b'k', Some(signed(*t))),
                        Token::Mint => (b'm', None),
                    },
                    Op::Touch(_) => (b't', None),
                    Op::Delete(_) => (b'd', None),
                };
                kinds.push(i8::try_from(kind).unwrap_or(0));
                sids.push(op.session());
                toks.push(token);
                bodies.push(op.body().unwrap_or_default());
            }
        }
        let sql = "SELECT * FROM {S}.commit($1, $2, $3, $4, $5, $6, $7, $8)";
        let args: [&dyn Arg; 8] = [&names, &revs, &keeps, &ws, &kinds, &sids, &toks, &bodies];
        let rows = self.call("commit", sql, &args).await?;
        snapshots("commit", &rows, writes.len(), 1)
    }
}

#[async_trait]
impl Primitives for PostgresStore {
    async fn open(&self, ttl: Duration) -> Result<String> {
        let id = format!("{:032x}", tenure_core::backend::random_id());
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        let sql = "SELECT {S}.open($1, $2, $3)";
        let args: [&dyn Arg; 3] = [&id, &self.channel, &ttl_ms];
        self.requester
            .call(Purpose::Renewal, "open session", sql, &args)
            .await?;
        Ok(id)
    }

    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        let ids: Vec<&str> = sessions.iter().map(String::as_str).collect();
        let sql = "SELECT {S}.renew($1)";
        let rows = self
            .requester
            .call(Purpose::Renewal, "renew session", sql, &[&ids])
            .await?;
        let row = rows.first().ok_or_else(|| unexpected("renew", "no row"))?;
        let live: Vec<bool> = get("renew", row, 0)?;
        if live.len() != sessions.len() {
            return Err(unexpected("renew", "not one answer per session"));
        }
        Ok(live)
    }

    async fn revoke(&self, session: &str) -> Result<()> {
        let sql = "SELECT {S}.revoke($1)";
        self.requester
            .call(Purpose::Renewal, "close session", sql, &[&session])
            .await?;
        Ok(())
    }

    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        let mut snaps = self.read_many(std::slice::from_ref(election)).await?;
        snaps.pop().ok_or_else(|| unexpected("read", "no election"))
    }

    async fn commit(&self, election: &ElectionName, write: &Write) -> Result<(bool, Snapshot)> {
        let mut answers = self
            .commit_batch(&[(election.clone(), write.clone())])
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("commit", "no election"))
    }

    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        let mut snaps = Vec::with_capacity(elections.len());
        for batch in elections.chunks(BATCH) {
            let names: Vec<&str> = batch.iter().map(ElectionName::as_str).collect();
            let sql = "SELECT * FROM {S}.read($1)";
            let rows = self.call("read", sql, &[&names]).await?;
            let read = snapshots("read", &rows, batch.len(), 0)?;
            snaps.extend(read.into_iter().map(|(_, s)| s));
        }
        Ok(snaps)
    }

    async fn commit_many(&self, writes: &[(ElectionName, Write)]) -> Result<Vec<(bool, Snapshot)>> {
        let mut answers = Vec::with_capacity(writes.len());
        for batch in writes.chunks(BATCH) {
            answers.extend(self.commit_batch(batch).await?);
        }
        Ok(answers)
    }

    fn batch(&self) -> Option<usize> {
        Some(BATCH)
    }

    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        // An observer (no record of its own here) hears of writes on the election's
        // channel; the rest is a registered wait, as `notify` takes it.
        let channel = self.chan("e", election);
        let mut followed = match what.me {
            None => Some(self.hub.subscribe(&channel).await),
            Some(_) => None,
        };
        let (to, mut woken) = Wake::channel();
        let id = self.watch(election, what, &to);
        let follower = async {
            match &mut followed {
                Some(rx) => {
                    let _ = rx.changed().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = woken.recv() => {}
            () = follower => {}
        }
        if let Some(id) = id {
            self.hub.take(election.as_str(), id);
        }
        if followed.take().is_some() {
            let hub = self.hub.clone();
            tokio::spawn(async move {
                tokio::time::sleep(LINGER).await;
                hub.unsubscribe(&channel).await;
            });
        }
        Ok(())
    }

    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        if what.me.is_none() {
            return false;
        }
        self.watch(election, what, to);
        true
    }

    fn members(&self) -> Option<&dyn MemberStore> {
        Some(self)
    }

    fn capabilities(&self, offered: Capabilities) -> Capabilities {
        offered.batched(BATCH)
    }
}

#[async_trait]
impl MemberStore for PostgresStore {
    async fn register(
        &self,
        session: &str,
        namespace: &ElectionName,
        member: &Member,
    ) -> Result<()> {
        let sql = "SELECT {S}.register($1, $2, $3, $4)";
        let args: [&dyn Arg; 4] = [&namespace.as_str(), &session, &member.id(), &member.value()];
        self.call("register member", sql, &args).await?;
        Ok(())
    }

    async fn unregister(&self, session: &str, namespace: &ElectionName, id: &str) -> Result<()> {
        let sql = "SELECT {S}.unregister($1, $2, $3)";
        let args: [&dyn Arg; 3] = [&namespace.as_str(), &session, &id];
        self.call("unregister member", sql, &args).await?;
        Ok(())
    }

    async fn list(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        Ok(read_members(self, namespace).await?.0)
    }

    /// Follow the members for the readers of the returned stream: read again on each
    /// notification on the namespace's channel, at each reconnection of the listening
    /// connection, and when a member's session may have expired.
    async fn watch(&self, namespace: &ElectionName) -> Result<MemberStream> {
        let store = self.me.upgrade().ok_or_else(tenure_core::Error::closed)?;
        let (namespace, channel) = (namespace.clone(), self.chan("m", namespace));
        let mut changes = store.hub.subscribe(&channel).await;
        let mut generation = store.hub.generation();
        generation.borrow_and_update();
        let (first, mut next) = match read_members(&store, &namespace).await {
            Ok(first) => first,
            Err(e) => {
                drop(changes);
                store.hub.unsubscribe(&channel).await;
                return Err(e);
            }
        };
        let (mut published, stream) = Published::new(first);
        tokio::spawn(async move {
            let (retry, mut failures) = (Retry::default(), 0u32);
            loop {
                tokio::select! {
                    _ = published.closed() => break,
                    _ = changes.changed() => {}
                    _ = generation.changed() => {}
                    _ = tokio::time::sleep(next.unwrap_or(IDLE)) => {}
                }
                let read = read_members(&store, &namespace).await;
                (next, failures) = match &read {
                    Ok((_, next)) => (next.map(|d| d + Duration::from_millis(1)), 0),
                    Err(_) => (Some(retry.delay(failures)), failures.saturating_add(1)),
                };
                published.publish(read.map(|(members, _)| members));
            }
            drop(changes);
            store.hub.unsubscribe(&channel).await;
        });
        Ok(stream)
    }
}

/// The live members of `namespace`, and how long until the first of their sessions
/// expires.
async fn read_members(
    store: &PostgresStore,
    namespace: &ElectionName,
) -> Result<(Vec<Member>, Option<Duration>)> {
    let sql = "SELECT m.id, m.value, \
        ceil(extract(epoch FROM s.expires_at - clock_timestamp()) * 1000)::int8 \
        FROM {S}.members m JOIN {S}.sessions s ON s.id = m.session \
        WHERE m.namespace = $1 AND s.expires_at > clock_timestamp() ORDER BY m.id";
    let rows = store
        .call("list members", sql, &[&namespace.as_str()])
        .await?;
    let (mut members, mut first) = (Vec::with_capacity(rows.len()), None::<Duration>);
    for row in &rows {
        members.push(Member::new(
            get::<&str>("list members", row, 0)?,
            get::<&str>("list members", row, 1)?,
        )?);
        let expires = millis(get("list members", row, 2)?);
        first = Some(first.map_or(expires, |f| f.min(expires)));
    }
    Ok((members, first))
}
#[cfg(test)]
mod tests {
    use super::SCHEMA;

    /// FNV-1a, 64 bits: a hash that stays the same across Rust versions.
    fn fnv(text: &str) -> u64 {
        text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    /// A database keeps the functions of the version it was created or upgraded with:
    /// a changed `schema.sql` under the same version would never reach it. Change the
    /// file, bump the version, and record the new hash here.
    #[test]
    fn schema_sql_changes_with_its_version() {
        let recorded: &[(i32, u64)] = &[
            (1, 0x05dd_e894_22ee_6164),
            (2, 0x6449_2ff0_ba92_9dc8),
            (3, 0x8b0f_ac46_85fb_a0bd),
        ];
        let (version, sql) = SCHEMA;
        let hash = fnv(sql);
        assert!(
            recorded.contains(&(version, hash)),
            "schema.sql (version {version}) hashes to {hash:#x}, not what is recorded for \
             its version: bump SCHEMA's version and record ({}, {hash:#x})",
            version + 1
        );
    }
}
