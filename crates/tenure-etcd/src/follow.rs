//! How a state readers watch (one election's leader with `layout=go`, one namespace's
//! members) is kept up to date: a wait on the backend's prefix watch for its key range
//! from just after the revision it was read at (no etcd watch of its own); each batch
//! of events updates the state; after a broken or compacted wait the state is read
//! again and waited on from there.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tenure_core::backend::Published;
use tenure_core::{Result, Retry};

use crate::proto::Event;
use crate::shared::Shared;
use crate::watches::Seen;

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

/// Follows the keys under `range` for its readers from `revision` until every reader
/// is gone.
pub(crate) async fn follow<F: Follower>(
    shared: Arc<Shared>,
    range: String,
    revision: i64,
    mut published: Published<F::State>,
    mut follower: F,
) {
    let retry = Retry::default();
    let mut attempt = 0u32;
    let mut from = revision + 1;
    loop {
        let mut watch = shared.watches.watch(&range, from);
        loop {
            let seen = tokio::select! {
                _ = published.closed() => return,
                seen = watch.next() => seen,
            };
            let Seen::Events(events) = seen else { break };
            attempt = 0;
            let seen = events.iter().filter_map(|e| e.kv.as_ref());
            from = seen.map(|kv| kv.mod_revision + 1).fold(from, i64::max);
            match follower.apply(&shared, &events).await {
                Some(state) => published.publish(Ok(state)),
                None => break,
            }
        }
        drop(watch);
        // Read again and wait from there: at once the first time, then backing off.
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
