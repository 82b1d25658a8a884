//! How a state readers watch (one election's leader, one namespace's members) is kept
//! up to date: a watch on its key range from just after the revision it was read at;
//! each batch of events updates the state; after a broken or compacted watch (or one
//! that never opened) the state is read again and watched from there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::Published;
use tenure_core::{Result, Retry};

use crate::ops::prefix_end;
use crate::proto::{Event, WatchCreateRequest};
use crate::shared::Shared;

/// A state kept from a key range: read whole, or updated from a batch of events.
pub(crate) trait Follower: Send {
    /// What readers see.
    type State: PartialEq + Clone + Send + Sync + 'static;

    /// Read the whole state and the revision it was read at.
    fn read(&mut self, shared: &Shared) -> impl Future<Output = Result<(Self::State, i64)>> + Send;

    /// The state after `events`, or `None` when it must be read whole again.
    fn apply(
        &mut self,
        shared: &Shared,
        events: &[Event],
    ) -> impl Future<Output = Option<Self::State>> + Send;
}

/// Follows `range` for its readers from `revision` until every reader is gone; `what`
/// names the watch in errors.
pub(crate) async fn follow<F: Follower>(
    shared: Arc<Shared>,
    range: String,
    revision: i64,
    mut published: Published<F::State>,
    mut follower: F,
    what: &'static str,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut from = revision + 1;
    loop {
        if published.is_closed() {
            return;
        }
        let create = WatchCreateRequest {
            key: range.as_bytes().to_vec(),
            range_end: prefix_end(range.as_bytes()),
            start_revision: from,
            ..Default::default()
        };
        let mut stream = match shared
            .requests
            .call(what, shared.client.watch(create))
            .await
        {
            Ok(s) => Some(s),
            Err(e) => {
                published.publish(Err(e));
                None
            }
        };
        while let Some(s) = stream.as_mut() {
            let message = tokio::select! {
                _ = published.closed() => return,
                m = s.message() => m,
            };
            match message {
                Ok(Some(response)) if response.canceled => stream = None,
                Ok(Some(response)) if response.events.is_empty() => {}
                Ok(Some(response)) => {
                    attempt = 0;
                    let seen = response.events.iter().filter_map(|e| e.kv.as_ref());
                    from = seen.map(|kv| kv.mod_revision + 1).fold(from, i64::max);
                    match follower.apply(&shared, &response.events).await {
                        Some(state) => published.publish(Ok(state)),
                        None => stream = None,
                    }
                }
                Ok(None) | Err(_) => stream = None,
            }
        }
        // Read again and watch from there: at once the first time, then backing off.
        let delay = retry.delay(attempt);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = published.closed() => return,
            _ = tokio::time::sleep(if attempt > 1 { delay } else { Duration::ZERO }) => {}
        }
        match follower.read(&shared).await {
            Ok((state, at)) => {
                from = at + 1;
                published.publish(Ok(state));
            }
            Err(e) => published.publish(Err(e)),
        }
    }
}
