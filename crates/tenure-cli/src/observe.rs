//! `tenure observe`: one JSON line per leader change.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::json;
use tenure::{DynBackend, ElectionName, Error, ErrorKind, Result};
use tokio_util::sync::CancellationToken;

use crate::args::{seconds, ObserveArgs};
use crate::clock::monotonic_now_ns;
use crate::events::EventSink;

/// Print leader changes of the election until `shutdown` fires or the stream ends.
pub async fn run_observe(
    backend: DynBackend,
    args: &ObserveArgs,
    sink: Arc<dyn EventSink>,
    shutdown: CancellationToken,
) -> Result<()> {
    let election = ElectionName::new(&args.election)?;
    let limit = seconds("connect_timeout", args.connect_timeout)?;
    let mut stream = tokio::time::timeout(limit, backend.observe(&election))
        .await
        .map_err(|_| {
            Error::new(
                ErrorKind::Timeout,
                format!("no answer within connect_timeout {limit:?}"),
            )
        })??;
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
