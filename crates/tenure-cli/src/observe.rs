//! `tenure observe`: one JSON line per leader change.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use tenure::{DynBackend, ElectionName, Observer, Result};
use tokio_util::sync::CancellationToken;

use crate::args::{positive_seconds, ObserveArgs};
use crate::clock::monotonic_now_ns;
use crate::events::EventSink;

/// The arguments of `tenure observe`, checked before the backend is connected.
#[derive(Debug, Clone)]
pub struct ObservePlan {
    election: ElectionName,
    connect_timeout: Duration,
}

impl ObservePlan {
    /// Check `args` (election name, connect timeout).
    pub fn new(args: &ObserveArgs) -> Result<ObservePlan> {
        Ok(ObservePlan {
            election: ElectionName::new(&args.election)?,
            connect_timeout: positive_seconds("connect_timeout", args.connect_timeout)?,
        })
    }

    /// How long connecting, and the first answer, may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

/// Print leader changes of the election until `shutdown` fires or the stream ends.
pub async fn run_observe(
    backend: DynBackend,
    plan: &ObservePlan,
    sink: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) -> Result<()> {
    let election = &plan.election;
    let limit = plan.connect_timeout;
    let mut stream = Observer::new(backend, limit).observe(election).await?;
    let mut last = None;
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = shutdown.cancelled() => return Ok(()),
        };
        match item {
            None => return Ok(()),
            Some(Err(e)) => return Err(e),
            Some(Ok(state)) => {
                if last.as_ref() == Some(&state) {
                    continue;
                }
                let leader = state
                    .as_ref()
                    .map(|l| json!({"id": l.id, "value": l.value, "token": l.token.get()}));
                sink.emit(json!({
                    "event": "leader",
                    "election": election.as_str(),
                    "leader": leader,
                    "mono_ns": monotonic_now_ns(),
                }));
                last = Some(state);
            }
        }
    }
}
