//! The one read path for leaders and members: what anyone may ask of a store without
//! campaigning, each request bounded by a timeout. [`Session`](crate::Session)'s reads
//! go through it too.

use std::time::Duration;

use crate::backend::{DynBackend, LeaderStream, MemberStream};
use crate::{ElectionName, Error, ErrorKind, LeaderInfo, Member, Result};

/// Reads of elections and namespaces, without a session: the current leader and its
/// changes, the members and theirs. Each call waits at most its timeout for the store's
/// first answer (`Timeout` after that); the streams then follow the contract's stream
/// rule (`docs/contract.md`, "Streams and errors"). Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> tenure_core::Result<()> {
/// use futures::StreamExt;
/// use std::time::Duration;
/// use tenure_core::{ElectionName, Observer};
///
/// let backend = tenure_core::connect("mem://demo").await?;
/// let observer = Observer::new(backend, Duration::from_secs(5));
/// let mut leaders = observer.observe(&ElectionName::new("jobs/scheduler")?).await?;
/// while let Some(Ok(leader)) = leaders.next().await {
///     println!("{leader:?}");
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Observer {
    backend: DynBackend,
    timeout: Duration,
}

impl Observer {
    /// Reads on `backend`, each waiting at most `timeout` for the first answer.
    pub fn new(backend: DynBackend, timeout: Duration) -> Self {
        Observer { backend, timeout }
    }

    /// The backend read.
    pub fn backend(&self) -> &DynBackend {
        &self.backend
    }

    /// The current holder of `election`, if any.
    pub async fn leader(&self, election: &ElectionName) -> Result<Option<LeaderInfo>> {
        self.within(self.backend.leader(election)).await
    }

    /// The holder of `election` now and at every change (see
    /// [`Backend::observe`](crate::Backend::observe)).
    pub async fn observe(&self, election: &ElectionName) -> Result<LeaderStream> {
        self.within(self.backend.observe(election)).await
    }

    /// The members of `namespace` now (see [`Backend::members`](crate::Backend::members)).
    pub async fn members(&self, namespace: &ElectionName) -> Result<Vec<Member>> {
        self.within(self.backend.members(namespace)).await
    }

    /// The member lists of `namespace` now and at every change (see
    /// [`Backend::watch_members`](crate::Backend::watch_members)).
    pub async fn watch_members(&self, namespace: &ElectionName) -> Result<MemberStream> {
        self.within(self.backend.watch_members(namespace)).await
    }

    /// Ask the leader of `election` to step down to the waiter `to` (a candidate id),
    /// or to the best waiter (see [`Backend::handover`](crate::Backend::handover));
    /// the one request here that changes the store. Returns the leader asked: its
    /// lost signal fires with [`LossReason::Preempted`](crate::LossReason::Preempted)
    /// and it releases the seat, as when preempted. A backend without priorities
    /// (clause 14) answers `Unsupported`.
    pub async fn handover(&self, election: &ElectionName, to: Option<&str>) -> Result<LeaderInfo> {
        if let Some(id) = to {
            crate::name::check_printable("candidate id", id, crate::MAX_CANDIDATE_ID_LEN)?;
        }
        if let Err(why) = self.backend.capabilities().priority_refusal() {
            return Err(crate::backend::handover_refused(self.backend.scheme(), why));
        }
        self.within(self.backend.handover(election, to)).await
    }

    async fn within<T>(&self, fut: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(Error::new(
                ErrorKind::Timeout,
                format!("no answer within {:?}", self.timeout),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use async_trait::async_trait;

    use super::*;
    use crate::backend::{Backend, DynSession, SessionEvents};
    use crate::MemoryBackend;

    /// A store that answers sessions but never answers a read.
    #[derive(Debug)]
    struct Silent(MemoryBackend);

    #[async_trait]
    impl Backend for Silent {
        fn scheme(&self) -> &'static str {
            "silent"
        }
        async fn open_session(&self, ttl: Duration, events: SessionEvents) -> Result<DynSession> {
            self.0.open_session(ttl, events).await
        }
        async fn leader(&self, _: &ElectionName) -> Result<Option<LeaderInfo>> {
            std::future::pending().await
        }
        async fn observe(&self, _: &ElectionName) -> Result<LeaderStream> {
            std::future::pending().await
        }
        async fn members(&self, _: &ElectionName) -> Result<Vec<Member>> {
            std::future::pending().await
        }
        async fn watch_members(&self, _: &ElectionName) -> Result<MemberStream> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_read_is_bounded_by_the_timeout() {
        let observer = Observer::new(
            Arc::new(Silent(MemoryBackend::new())),
            Duration::from_secs(2),
        );
        let e = ElectionName::new("e").unwrap();
        let started = tokio::time::Instant::now();
        let errors = [
            observer.leader(&e).await.err(),
            observer.observe(&e).await.err(),
            observer.members(&e).await.err(),
            observer.watch_members(&e).await.err(),
        ];
        for error in errors {
            assert_eq!(error.map(|e| e.kind()), Some(ErrorKind::Timeout));
        }
        assert_eq!(started.elapsed(), Duration::from_secs(8));
    }

    #[tokio::test]
    async fn a_session_reads_through_it() {
        let backend = MemoryBackend::new();
        let timing = crate::Timing::from_ttl(Duration::from_secs(1));
        let session = crate::Session::open(Arc::new(backend), timing.clone())
            .await
            .unwrap();
        let e = ElectionName::new("e").unwrap();
        let l = session
            .campaign(&e, &crate::Candidate::new("a").unwrap())
            .await
            .unwrap();
        let seen = session.observer().leader(&e).await.unwrap();
        assert_eq!(seen.map(|i| i.token), Some(l.token()));
        assert_eq!(session.observer().backend().scheme(), "mem");
    }
}
