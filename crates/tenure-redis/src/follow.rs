//! How a state readers watch (one election's seat, one namespace's members) is kept up
//! to date: read again after every message on its channel, after a re-subscription,
//! when the read says something may expire, and at least every poll interval after a
//! failure (messages can be lost while the link is down).

use std::future::Future;
use std::time::Duration;

use tenure_core::backend::Published;
use tenure_core::{Result, Retry};

use crate::hub::Registration;

/// Follows one state for its readers until every reader is gone: `read` returns the
/// state and how long until it should be read again unprompted (a holder's or a
/// member's session expiring publishes no message); `poll` caps the wait after a
/// failed read. `subscribed` is whether the channel's subscription was confirmed before
/// the first read: if not, the state is read again once it is.
pub(crate) async fn follow<T, F, Fut>(
    registration: Registration,
    mut published: Published<T>,
    (mut next, mut subscribed): (Duration, bool),
    poll: Duration,
    read: F,
) where
    T: PartialEq + Clone + Send + Sync + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<(T, Duration)>>,
{
    let retry = Retry::default();
    let mut failures = 0u32;
    loop {
        tokio::select! {
            _ = published.closed() => return,
            _ = registration.woken() => {}
            _ = tokio::time::sleep(next) => {}
            // A change published before the subscription was confirmed was missed.
            _ = registration.subscribed(), if !subscribed => {}
        }
        subscribed = registration.is_subscribed();
        match read().await {
            Ok((state, look_again)) => {
                failures = 0;
                next = look_again;
                published.publish(Ok(state));
            }
            Err(e) => {
                next = retry.delay(failures).min(poll);
                failures = failures.saturating_add(1);
                published.publish(Err(e));
            }
        }
    }
}
