//! What every backend session keeps about its own life, written once: whether the
//! caller closed it, and the token that stops its tasks when it is closed or dropped.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, DropGuard};

use crate::error::{Error, Result};

/// A session's open/closed state and the stop signal of its tasks (renewal watchers,
/// wake-up listeners). Held by the session's shared inner state; the session handle
/// the core owns holds the [`guard`](Self::guard), so dropping the handle (an abandoned
/// session) stops the tasks as closing does.
pub struct Lifetime {
    scheme: &'static str,
    id: String,
    stop: CancellationToken,
    closed: AtomicBool,
}

impl Lifetime {
    /// The life of the session `id` of the backend `scheme`.
    pub fn new(scheme: &'static str, id: impl Into<String>) -> Self {
        Lifetime {
            scheme,
            id: id.into(),
            stop: CancellationToken::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// The session's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `Ok` while open; [`ErrorKind::Closed`](crate::ErrorKind::Closed) once the
    /// caller closed it.
    pub fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) {
            Err(self.closed_error())
        } else {
            Ok(())
        }
    }

    /// The error of a request made on (or cut short by) a closed session.
    pub fn closed_error(&self) -> Error {
        Error::closed().with_backend(self.scheme)
    }

    /// Mark the session closed and stop its tasks; `false` if it was closed already.
    pub fn close(&self) -> bool {
        let was_open = !self.closed.swap(true, Ordering::SeqCst);
        self.stop.cancel();
        was_open
    }

    /// Resolves once the session is closed or its handle dropped.
    pub async fn stopped(&self) {
        self.stop.cancelled().await
    }

    /// A token cancelled with the session (and cancellable on its own).
    pub fn child_token(&self) -> CancellationToken {
        self.stop.child_token()
    }

    /// For the session handle: stops the tasks when dropped.
    pub fn guard(&self) -> DropGuard {
        self.stop.clone().drop_guard()
    }
}

impl fmt::Debug for Lifetime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Session")
            .field("backend", &self.scheme)
            .field("id", &self.id)
            .field("closed", &self.closed.load(Ordering::SeqCst))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[tokio::test]
    async fn closing_or_dropping_the_guard_stops_the_tasks() {
        let life = Lifetime::new("test", "s1");
        assert!(life.check_open().is_ok());
        let guard = life.guard();
        let task = life.child_token();
        drop(guard);
        assert!(task.is_cancelled(), "dropping the handle stops the tasks");
        assert!(
            life.check_open().is_ok(),
            "an abandoned session is not closed"
        );

        let life = Lifetime::new("test", "s2");
        assert!(life.close());
        assert!(!life.close(), "closed once");
        life.stopped().await;
        let e = life.check_open().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Closed);
        assert_eq!(e.backend(), Some("test"));
    }
}
