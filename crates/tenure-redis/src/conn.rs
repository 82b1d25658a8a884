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
use redis::{Client, RedisResult, ScriptInvocation, Value};
use tenure_core::backend::{Purpose, Requests};
use tenure_core::Result;

use crate::error::{map, poisons_connection};

/// The shared command connection of a backend.
pub(crate) struct Conn {
    client: Client,
    config: ConnectionManagerConfig,
    /// The request layer: timeout, error tags (the server's `host:port`) and count.
    requests: Arc<Requests>,
    slot: Mutex<Slot>,
    /// The generation of the manager that must not be used any more (0: none).
    suspect: AtomicU64,
}

struct Slot {
    generation: u64,
    manager: Option<ConnectionManager>,
}

impl Conn {
    pub(crate) fn new(client: Client, requests: Arc<Requests>, connect_timeout: Duration) -> Self {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(requests.timeout()))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(200));
        Conn {
            client,
            config,
            requests,
            slot: Mutex::new(Slot {
                generation: 1,
                manager: None,
            }),
            suspect: AtomicU64::new(0),
        }
    }

    /// The current manager and its generation, creating one if needed.
    fn current(&self) -> RedisResult<(u64, ConnectionManager)> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        let suspect = self.suspect.load(Ordering::SeqCst);
        if suspect == slot.generation && slot.manager.is_some() {
            slot.manager = None;
            slot.generation += 1;
            tracing::debug!("replacing a Redis connection that timed out");
        }
        if let Some(m) = &slot.manager {
            return Ok((slot.generation, m.clone()));
        }
        let manager =
            ConnectionManager::new_lazy_with_config(self.client.clone(), self.config.clone())?;
        slot.manager = Some(manager.clone());
        Ok((slot.generation, manager))
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
        let (generation, manager) = match self.current() {
            Ok(current) => current,
            Err(e) => return Err(self.requests.tag(map(what, e))),
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
        self.requests.call(purpose, what, request, map).await
    }

    /// Run a script.
    pub(crate) async fn script(
        &self,
        purpose: Purpose,
        what: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Value> {
        self.run(purpose, what, |mut c| async move {
            invocation.invoke_async(&mut c).await
        })
        .await
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
