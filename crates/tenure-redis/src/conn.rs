//! The command connection: a `ConnectionManager` (which reconnects after the server
//! drops the connection), every request bounded by the request timeout, and a fresh
//! manager after a request timed out or was abandoned.
//!
//! Why replace it: a multiplexed connection matches answers to requests by order. When
//! a request times out, its answer may still arrive later (or, if bytes were lost on
//! the way, never), and the connection manager keeps using the connection; answers
//! could then be taken for the answers to later requests. A connection that saw a
//! timeout is therefore never used again.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, ScriptInvocation, ServerErrorKind, Value};
use tenure_core::backend::{lock, Purpose, Requests};
use tenure_core::{ErrorKind, Result};

use crate::error::{map, poisons_connection, TAG};
use crate::target::Target;

/// The shared command connection of a backend.
pub(crate) struct Conn {
    target: Arc<Target>,
    config: ConnectionManagerConfig,
    /// The request layer: timeout, error tags (the server's `host:port`) and count.
    requests: Arc<Requests<redis::RedisError>>,
    slot: Mutex<Slot>,
    /// The generation of the manager that must not be used any more (0: none).
    suspect: AtomicU64,
}

struct Slot {
    generation: u64,
    manager: Option<ConnectionManager>,
    /// The target's count of primary switches when the manager was made.
    switches: u64,
}

impl Conn {
    pub(crate) fn new(
        target: Arc<Target>,
        requests: Arc<Requests<redis::RedisError>>,
        connect_timeout: Duration,
    ) -> Self {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(requests.timeout()))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        Conn {
            target,
            config,
            requests,
            slot: Mutex::new(Slot {
                generation: 1,
                manager: None,
                switches: 0,
            }),
            suspect: AtomicU64::new(0),
        }
    }

    /// The current manager and its generation, creating one if needed (asking
    /// Sentinel for the primary first, with a `redis+sentinel://` URL).
    async fn current(&self, what: &str) -> Result<(u64, ConnectionManager)> {
        if let Some(current) = self.reuse() {
            return Ok(current);
        }
        // Read before asking for the primary: a switch announced meanwhile replaces
        // this connection at the next request.
        let switches = self.target.switches();
        let client = self.target.client().await?;
        let manager = ConnectionManager::new_lazy_with_config(client, self.config.clone())
            .map_err(|e| map(what, e))?;
        let mut slot = lock(&self.slot);
        // Another request may have made one meanwhile: use that one.
        if let Some(m) = &slot.manager {
            return Ok((slot.generation, m.clone()));
        }
        slot.manager = Some(manager.clone());
        slot.switches = switches;
        Ok((slot.generation, manager))
    }

    /// The manager in use, unless there is none or it was marked unusable.
    fn reuse(&self) -> Option<(u64, ConnectionManager)> {
        let mut slot = lock(&self.slot);
        let failed = self.suspect.load(Ordering::SeqCst) == slot.generation;
        // Or Sentinel announced a new primary since this connection was made.
        let moved = slot.switches != self.target.switches();
        if slot.manager.is_some() && (failed || moved) {
            slot.manager = None;
            slot.generation += 1;
            tracing::debug!(failed, moved, "replacing a Redis connection");
        }
        slot.manager.as_ref().map(|m| (slot.generation, m.clone()))
    }

    fn poison(&self, generation: u64) {
        self.suspect.store(generation, Ordering::SeqCst);
    }

    /// Run `f` on the connection through the request layer (`what` names the
    /// operation in errors, which also name the server). A request that fails on the
    /// connection, times out or is dropped before its answer marks the connection
    /// unusable.
    pub(crate) async fn run<T, F, Fut>(&self, purpose: Purpose, what: &str, f: F) -> Result<T>
    where
        F: FnOnce(ConnectionManager) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        // Finding the server (with Sentinel: asking the sentinels) is bounded too.
        let limit = self.requests.timeout();
        let (generation, manager) = match tokio::time::timeout(limit, self.current(what)).await {
            Ok(Ok(current)) => current,
            Ok(Err(e)) => return Err(self.requests.tag(e)),
            Err(_) => return Err(self.requests.tag(self.requests.timed_out(what, limit))),
        };
        let request = async move {
            let mut guard = Abandoned {
                conn: self,
                generation,
                armed: true,
            };
            let outcome = f(manager).await;
            guard.armed = match &outcome {
                Ok(_) => false,
                Err(e) => poisons_connection(e),
            };
            outcome
        };
        self.requests.call_as(purpose, what, request).await
    }

    /// One `SCAN` step over the keys matching `pattern` from `cursor`: the next cursor
    /// (0 at the end) and the keys.
    pub(crate) async fn scan(
        &self,
        what: &str,
        cursor: u64,
        pattern: &str,
    ) -> Result<(u64, Vec<String>)> {
        self.run(Purpose::Election, what, |mut c| async move {
            redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
        })
        .await
    }

    /// Run a script; with a `guard` (`(replicas, bound)`), its writes count only once
    /// that many replicas have them: the script and a `WAIT` go in one pipeline, so the
    /// `WAIT` covers this connection's write even if the connection is replaced right
    /// after. Fewer replicas than asked within the bound is `Unavailable`: the write
    /// happened on the primary but must not be relied on.
    pub(crate) async fn script(
        &self,
        purpose: Purpose,
        what: &str,
        invocation: &ScriptInvocation<'_>,
        guard: Option<(u32, Duration)>,
    ) -> Result<Value> {
        let Some((replicas, bound)) = guard else {
            return self
                .run(purpose, what, |mut c| async move {
                    invocation.invoke_async(&mut c).await
                })
                .await;
        };
        let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX).max(1);
        let (value, acked): (Value, i64) = self
            .run(purpose, what, |mut c| async move {
                let mut pipe = redis::pipe();
                pipe.invoke_script(invocation)
                    .cmd("WAIT")
                    .arg(replicas)
                    .arg(ms);
                match pipe.query_async(&mut c).await {
                    Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
                        invocation.load_async(&mut c).await?;
                        pipe.query_async(&mut c).await
                    }
                    other => other,
                }
            })
            .await?;
        if acked < i64::from(replicas) {
            return Err(self.requests.tag(TAG.own(
                ErrorKind::Unavailable,
                format!(
                    "{what}: {acked} of {replicas} replica(s) confirmed the write within {bound:?} (replication guard)"
                ),
            )));
        }
        Ok(value)
    }
}

/// Marks the connection unusable unless disarmed: when a request timed out, failed on
/// the connection, or its future was dropped before the answer came.
struct Abandoned<'a> {
    conn: &'a Conn,
    generation: u64,
    armed: bool,
}

impl Drop for Abandoned<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.poison(self.generation);
        }
    }
}
