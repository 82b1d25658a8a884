//! Connections to the server: how one is opened (plain or TLS), the request
//! connection the backend and its sessions share, and the listening connection whose
//! notifications wake waiters and followers.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tenure_core::backend::primitive::Wake;
use tenure_core::backend::{lock, Purpose, Requests};
use tenure_core::engine::{Record, Snapshot, WaitFor};
use tenure_core::{CancellationToken, ElectionName, Result, Retry};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{AsyncMessage, Client, Connection, NoTls, Notification, Row};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::PostgresConfig;
use crate::error::TAG;

/// How often the listening connection is checked while nothing arrives on it, so that
/// a connection cut without a reset is noticed (not a poll of any state).
const PING_EVERY: Duration = Duration::from_secs(5);

/// A query parameter that knows its PostgreSQL type, so that a query is sent with its
/// types and needs no round trip to prepare.
pub(crate) trait Arg: Sync {
    fn pg(&self) -> (&(dyn ToSql + Sync), Type);
}

macro_rules! typed {
    ($($t:ty => $pg:ident),*) => {$(
        impl Arg for $t {
            fn pg(&self) -> (&(dyn ToSql + Sync), Type) {
                (self, Type::$pg)
            }
        }
    )*};
}

typed!(&str => TEXT, String => TEXT, Option<&str> => TEXT, i64 => INT8,
    Vec<&str> => TEXT_ARRAY, Vec<i32> => INT4_ARRAY, Vec<i64> => INT8_ARRAY,
    Vec<Option<i64>> => INT8_ARRAY, Vec<i8> => CHAR_ARRAY, Vec<Vec<u8>> => BYTEA_ARRAY,
    Vec<Option<Vec<u8>>> => BYTEA_ARRAY);

/// How to open a connection.
#[derive(Clone)]
pub(crate) struct Opener {
    pg: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
}

impl Opener {
    pub(crate) fn new(config: &PostgresConfig) -> Result<Self> {
        let mut pg = tokio_postgres::Config::new();
        pg.host(&config.host)
            .port(config.port)
            .user(config.user())
            .dbname(config.database())
            .application_name("tenure")
            .connect_timeout(config.get_connect_timeout())
            .keepalives_idle(Duration::from_secs(10));
        if let Some(password) = config.credentials.password() {
            pg.password(password);
        }
        let tls = match config.tls {
            false => None,
            true => {
                pg.ssl_mode(tokio_postgres::config::SslMode::Require);
                Some(tls_connector(config)?)
            }
        };
        Ok(Opener { pg, tls })
    }

    /// A new connection and the notifications that arrive on it (the receiver ends
    /// when the connection does).
    pub(crate) async fn open(
        &self,
    ) -> std::result::Result<(Client, mpsc::UnboundedReceiver<Notification>), tokio_postgres::Error>
    {
        match &self.tls {
            None => drive(self.pg.connect(NoTls).await?),
            Some(tls) => drive(self.pg.connect(tls.clone()).await?),
        }
    }
}

fn drive<S, T>(
    (client, mut connection): (Client, Connection<S, T>),
) -> std::result::Result<(Client, mpsc::UnboundedReceiver<Notification>), tokio_postgres::Error>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = tx.send(n);
            }
        }
    });
    Ok((client, rx))
}

fn tls_connector(config: &PostgresConfig) -> Result<MakeRustlsConnect> {
    let bad = |what: &str, path: &Path, e: &dyn std::fmt::Display| {
        let why = format!("{what}: cannot read {}: {e}", path.display());
        tenure_core::Error::invalid(why).with_backend(crate::config::SCHEME)
    };
    let certs = |what: &str, path: &Path| {
        let read =
            CertificateDer::pem_file_iter(path).and_then(|c| c.collect::<Result<Vec<_>, _>>());
        read.map_err(|e| bad(what, path, &e))
    };
    let (ca, identity) = config.files.paths();
    let mut roots = rustls::RootCertStore::empty();
    if let Some(ca) = ca {
        for cert in certs("ca", ca)? {
            roots.add(cert).map_err(|e| bad("ca", ca, &e))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tenure_core::Error::invalid(format!("tls: {e}")))?
        .with_root_certificates(roots);
    let tls = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = certs("cert", cert)?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| bad("key", key, &e))?;
            let tls = builder.with_client_auth_cert(chain, key);
            tls.map_err(|e| bad("cert", cert, &e))?
        }
    };
    Ok(MakeRustlsConnect::new(tls))
}

/// The request connection, opened again when it fails, and the request layer.
pub(crate) struct Requester {
    opener: Opener,
    schema: String,
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    pub(crate) requests: Requests<tokio_postgres::Error>,
}

impl Requester {
    pub(crate) fn new(
        opener: Opener,
        schema: &str,
        requests: Requests<tokio_postgres::Error>,
    ) -> Self {
        let (schema, client) = (schema.to_owned(), tokio::sync::Mutex::new(None));
        Requester {
            opener,
            schema,
            client,
            requests,
        }
    }

    async fn client(&self) -> std::result::Result<Arc<Client>, tokio_postgres::Error> {
        let mut slot = self.client.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        let (client, _) = self.opener.open().await?;
        Ok(slot.insert(Arc::new(client)).clone())
    }

    /// Run `sql` (`{S}` standing for the schema) with `args`, as `purpose`, in one round
    /// trip; a failure that may have left the connection out of step (no answer in
    /// time, a broken link) makes the next request connect again.
    pub(crate) async fn call(
        &self,
        purpose: Purpose,
        what: &str,
        sql: &str,
        args: &[&dyn Arg],
    ) -> Result<Vec<Row>> {
        let sql = sql.replace("{S}", &self.schema);
        let params: Vec<_> = args.iter().map(|a| a.pg()).collect();
        let mut used = None;
        let request = async {
            let client = self.client().await?;
            used = Some(client.clone());
            client.query_typed(&sql, &params).await
        };
        let answer = self.requests.call_as(purpose, what, request).await;
        if let (Err(e), Some(client)) = (&answer, used) {
            let mut slot = self.client.lock().await;
            if e.is_retryable() && slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &client)) {
                *slot = None;
            }
        }
        answer
    }
}

/// What the listening connection delivers to: the registered waits of this backend's
/// sessions and its observers, the channels of its followers, and a generation that
/// grows whenever it (re)connects (notifications sent while it was down are lost, so
/// every wait registered then is woken, and every follower looks again).
#[derive(Default)]
pub(crate) struct Hub {
    state: Mutex<HubState>,
    generation: watch::Sender<u64>,
    listening: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct HubState {
    client: Option<Arc<Client>>,
    /// Whether the listening connection is up and listening: else every wait
    /// registered is woken at the next connection.
    up: bool,
    /// The waits by election, each by its id.
    waits: HashMap<String, HashMap<u64, Wait>>,
    next_wait: u64,
    channels: HashMap<String, watch::Sender<u64>>,
    /// The latest revision of each election heard of since the listening connection
    /// (re)connected.
    heard: HashMap<String, u64>,
    /// When each session ends, as the latest note that carried it reckoned it (a
    /// renewal since moves it on unheard).
    ends: HashMap<String, Instant>,
}

/// Elections (and sessions) the hub remembers; past it, it forgets them all.
const MAX_HEARD: usize = 100_000;

/// One wait in one election, from revision `seen` on, woken once: for a write to the
/// record of `me` (for a holder waiting on nothing else, any write), the deletion of
/// the record of `on` or the end of its session; with neither, any write.
struct Wait {
    election: ElectionName,
    what: WaitFor,
    to: Wake,
    done: CancellationToken,
}

/// A wait as [`Hub::register`] took it.
pub(crate) struct Registered {
    pub(crate) id: u64,
    /// Cancelled once the wait is woken (or taken).
    pub(crate) done: CancellationToken,
    /// Whether every later change will reach the wait without a look at the server:
    /// the hub heard the election at `seen` on the connection it listens on, or is
    /// between connections (the next one wakes every wait).
    pub(crate) sure: bool,
}

impl Hub {
    /// The generation, to wait for the next (re)connection.
    pub(crate) fn generation(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Register a wait for what `what` names in `election`, woken through `to`; `None`
    /// if the hub heard a later revision already (then `to` is woken at once).
    pub(crate) fn register(
        &self,
        election: &ElectionName,
        what: &WaitFor,
        to: &Wake,
    ) -> Option<Registered> {
        let mut state = lock(&self.state);
        let heard = state.heard.get(election.as_str()).copied();
        if heard.is_some_and(|h| h > what.seen) {
            to.wake(election);
            return None;
        }
        let sure = !state.up || heard == Some(what.seen);
        state.next_wait += 1;
        let (id, done) = (state.next_wait, CancellationToken::new());
        let wait = Wait {
            election: election.clone(),
            what: what.clone(),
            to: to.clone(),
            done: done.clone(),
        };
        let waits = state.waits.entry(election.as_str().to_owned()).or_default();
        waits.retain(|_, w| !w.to.is_closed());
        waits.insert(id, wait);
        Some(Registered { id, done, sure })
    }

    /// Forget wait `id` of `election`; its wake-up if it was still waiting.
    pub(crate) fn take(&self, election: &str, id: u64) -> Option<Wake> {
        let mut state = lock(&self.state);
        let waits = state.waits.get_mut(election)?;
        let wait = waits.remove(&id);
        if waits.is_empty() {
            state.waits.remove(election);
        }
        wait.map(|w| {
            w.done.cancel();
            w.to
        })
    }

    /// LISTEN on `channel` (a follower's) and return its change count; the
    /// subscription holds until [`unsubscribe`](Self::unsubscribe) with no receiver left.
    /// LISTEN and UNLISTEN go one at a time, so that a channel given up and taken again
    /// at once is still heard.
    pub(crate) async fn subscribe(&self, channel: &str) -> watch::Receiver<u64> {
        let _one_at_a_time = self.listening.lock().await;
        let (rx, client) = {
            let mut state = lock(&self.state);
            if let Some(tx) = state.channels.get(channel) {
                return tx.subscribe();
            }
            let (tx, rx) = watch::channel(0);
            state.channels.insert(channel.to_owned(), tx);
            (rx, state.client.clone())
        };
        if let Some(client) = client {
            // Without it the follower still reads again at the next reconnection.
            let _ = client.batch_execute(&format!("LISTEN \"{channel}\"")).await;
        }
        rx
    }

    pub(crate) async fn unsubscribe(&self, channel: &str) {
        let _one_at_a_time = self.listening.lock().await;
        let client = {
            let mut state = lock(&self.state);
            let unheard = |tx: &watch::Sender<u64>| tx.receiver_count() == 0;
            if !state.channels.get(channel).is_some_and(unheard) {
                return;
            }
            state.channels.remove(channel);
            state.client.clone()
        };
        if let Some(client) = client {
            let _ = client
                .batch_execute(&format!("UNLISTEN \"{channel}\""))
                .await;
        }
    }

    /// The latest revision of `election` heard of since the listening connection
    /// (re)connected, if any.
    pub(crate) fn heard(&self, election: &str) -> Option<u64> {
        lock(&self.state).heard.get(election).copied()
    }

    /// When `session` ends, as the latest note that carried it reckoned it.
    pub(crate) fn ends(&self, session: &str) -> Option<Instant> {
        lock(&self.state).ends.get(session).copied()
    }

    /// One notification: `e REVISION SESSIONS SNAPSHOT ELECTION` (a write at REVISION to
    /// the records of SESSIONS, comma-separated, a deleted one marked `-`, `*` for any;
    /// the election after it, or `-`) wakes the waits in ELECTION from an earlier
    /// revision on that the election after it satisfies (with it) or, without it,
    /// whose `me` it names or whose `on` it deleted; `s SESSION` (a session ended) the
    /// waits on SESSION in any election; anything on a follower's channel counts a
    /// change.
    fn deliver(&self, note: &Notification) {
        let mut state = lock(&self.state);
        if let Some(tx) = state.channels.get(note.channel()) {
            tx.send_modify(|n| *n += 1);
            return;
        }
        let words: Vec<&str> = note.payload().splitn(5, ' ').collect();
        let (rev, sessions, snap, election) = match words[..] {
            ["e", rev, sessions, snap, election] => match rev.parse::<u64>() {
                Ok(rev) => (rev, sessions, snap, election),
                Err(_) => return,
            },
            ["s", session] => {
                state.ends.insert(session.to_owned(), Instant::now());
                let ended = |s: &Option<String>| s.as_deref() == Some(session);
                for waits in state.waits.values_mut() {
                    wake(waits, |w| {
                        (ended(&w.what.me) || ended(&w.what.on)).then_some(None)
                    });
                }
                state.waits.retain(|_, w| !w.is_empty());
                return;
            }
            _ => {
                tracing::debug!(payload = note.payload(), "unexpected notification");
                return;
            }
        };
        if state.heard.len() >= MAX_HEARD {
            state.heard.clear();
        }
        let heard = state.heard.entry(election.to_owned()).or_default();
        *heard = (*heard).max(rev);
        let now = decode(rev, snap);
        if let Some((_, lives)) = &now {
            if state.ends.len() >= MAX_HEARD {
                state.ends.clear();
            }
            let at = Instant::now();
            for (session, ms) in lives {
                state
                    .ends
                    .insert(session.clone(), at + Duration::from_millis(*ms));
            }
        }
        let names = |s: &Option<String>, deleted_only: bool| {
            let Some(s) = s.as_deref() else {
                return false;
            };
            sessions == "*"
                || sessions.split(',').any(|n| match n.strip_prefix('-') {
                    Some(gone) => gone == s,
                    None => !deleted_only && n == s,
                })
        };
        let Some(waits) = state.waits.get_mut(election) else {
            return;
        };
        wake(waits, |w| match &now {
            _ if rev <= w.what.seen => None,
            Some((now, _)) => w.what.met_by(now).then(|| Some(now.clone())),
            None => (names(&w.what.me, false) || names(&w.what.on, true)).then_some(None),
        });
        if waits.is_empty() {
            state.waits.remove(election);
        }
    }

    /// Keep the listening connection up until `stop`: LISTEN on `own` and every
    /// observer's channel, deliver what arrives, check the link every [`PING_EVERY`].
    pub(crate) async fn listen(
        self: Arc<Self>,
        opener: Opener,
        own: String,
        timeout: Duration,
        stop: CancellationToken,
    ) {
        let retry = Retry::default();
        let mut failures = 0u32;
        loop {
            let opened = tokio::select! {
                _ = stop.cancelled() => return,
                opened = tokio::time::timeout(timeout, opener.open()) => opened,
            };
            if let Ok(Ok((client, notes))) = opened {
                let client = Arc::new(client);
                if self.serve(&client, notes, &own, timeout, &stop).await {
                    failures = 0;
                }
                let mut state = lock(&self.state);
                (state.client, state.up) = (None, false);
            }
            if stop.is_cancelled() {
                return;
            }
            tracing::debug!("PostgreSQL listening connection lost; connecting again");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(retry.delay(failures)) => {}
            }
            failures = failures.saturating_add(1);
        }
    }

    /// Serve one connection until it fails; true if it was set up.
    async fn serve(
        &self,
        client: &Arc<Client>,
        mut notes: mpsc::UnboundedReceiver<Notification>,
        own: &str,
        timeout: Duration,
        stop: &CancellationToken,
    ) -> bool {
        let channels: Vec<String> = {
            let mut state = lock(&self.state);
            state.client = Some(client.clone());
            state.heard.clear();
            state.channels.keys().cloned().collect()
        };
        let sql: String = std::iter::once(own)
            .chain(channels.iter().map(String::as_str))
            .map(|c| format!("LISTEN \"{c}\";"))
            .collect();
        if !matches!(
            tokio::time::timeout(timeout, client.batch_execute(&sql)).await,
            Ok(Ok(()))
        ) {
            return false;
        }
        {
            // Whatever was written while no connection listened went unheard.
            let mut state = lock(&self.state);
            state.up = true;
            for waits in state.waits.values_mut() {
                wake(waits, |_| Some(None));
            }
            state.waits.clear();
        }
        self.generation.send_modify(|g| *g += 1);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return true,
                note = notes.recv() => match note {
                    Some(note) => self.deliver(&note),
                    None => return true,
                },
                _ = tokio::time::sleep(PING_EVERY) => {
                    let ping = tokio::time::timeout(timeout, client.batch_execute("")).await;
                    if !matches!(ping, Ok(Ok(()))) {
                        return true;
                    }
                }
            }
        }
    }
}

/// Wake the waits of one election that `due` picks (with the election as it stands,
/// if it gives it), and forget them, with those nobody follows any more.
fn wake(waits: &mut HashMap<u64, Wait>, due: impl Fn(&Wait) -> Option<Option<Snapshot>>) {
    waits.retain(|_, w| {
        let Some(now) = due(w) else {
            return !w.to.is_closed();
        };
        w.done.cancel();
        match now {
            Some(now) => w.to.wake_with(&w.election, now),
            None => w.to.wake(&w.election),
        };
        false
    });
}

/// The election a note or an answer carries (`snap` in `schema.sql`'s `read`) at
/// `revision`, and how long each of its sessions still lives, in milliseconds; `None`
/// for `-` or a malformed one.
pub(crate) fn decode(revision: u64, snap: &str) -> Option<(Snapshot, Vec<(String, u64)>)> {
    let mut parts = snap.split('/');
    let kept = unhex(parts.next()?)?;
    let (mut records, mut lives) = (Vec::new(), Vec::new());
    for part in parts {
        let f: Vec<&str> = part.split(',').collect();
        let [session, arrival, version, token, live, ms, body] = f[..] else {
            return None;
        };
        let token = match token {
            "" => None,
            t => Some(t.parse().ok()?),
        };
        let (arrival, version) = (arrival.parse().ok()?, version.parse().ok()?);
        let body = unhex(body)?;
        records.push(Record::from_store(
            session.to_owned(),
            arrival,
            version,
            token,
            live == "1",
            &body,
        ));
        lives.push((session.to_owned(), ms.parse().ok()?));
    }
    Some((Snapshot::from_store(revision, &kept, records), lives))
}

/// Bytes from hex digits.
fn unhex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    let byte = |i: usize| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok();
    (0..hex.len()).step_by(2).map(byte).collect()
}

/// The tag's error for answers of a shape tenure's functions never give.
pub(crate) fn unexpected(what: &str, e: impl std::fmt::Display) -> tenure_core::Error {
    TAG.own(
        tenure_core::ErrorKind::Backend,
        format!("{what}: unexpected answer from PostgreSQL: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::{decode, unhex};

    #[test]
    fn a_note_carries_the_election_as_snap_writes_it() {
        // What `snap` in schema.sql wrote for a holder and a waiter, with nothing kept.
        let (now, lives) = decode(7, "/aa,1,3,5,1,59987,7b7d/bb,2,7,,0,0,7b7d").expect("decoded");
        assert_eq!(now.revision, 7);
        let (a, b) = (now.record("aa").expect("aa"), now.record("bb").expect("bb"));
        assert_eq!(
            (a.arrival, a.version, a.token, a.live),
            (1, 3, Some(5), true)
        );
        assert_eq!((b.arrival, b.version, b.token, b.live), (2, 7, None, false));
        assert_eq!(lives, [("aa".to_string(), 59987), ("bb".to_string(), 0)]);
        assert!(decode(3, "").is_some_and(|(s, l)| s.records.is_empty() && l.is_empty()));
        for bad in ["-", "/aa,1,3", "/aa,x,3,,1,0,", "/aa,1,3,,1,0,7", "zz"] {
            assert!(decode(1, bad).is_none(), "{bad}");
        }
        assert_eq!(unhex("00ff7B"), Some(vec![0, 255, 123]));
    }
}
