//! The store's primitives as the engine's backend uses them: counted, and each write
//! run to its answer.

use super::*;

/// The backend's primitives with every election request counted (clause 7's check), and
/// every write run to its answer in a task of its own, counted in flight by election
/// ([`Inflight`]): a campaign dropped while its write is on its way does not leave the
/// write to land after the withdrawal.
#[derive(Debug)]
pub(super) struct Counted(pub(super) DrivenBackend, pub(super) Inflight);

/// Run `write` in a task of its own: it reaches its answer even if the caller stops
/// waiting for it.
async fn to_answer<T: Send + 'static>(
    write: impl std::future::Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    match tokio::spawn(write).await {
        Ok(answer) => answer,
        Err(e) => Err(Error::new(
            ErrorKind::Backend,
            format!("a write's task ended without an answer: {e}"),
        )),
    }
}

#[async_trait]
impl Primitives for Counted {
    async fn open(&self, ttl: Duration) -> Result<String> {
        self.0.store.open(ttl).await
    }
    async fn renew(&self, sessions: &[String]) -> Result<Vec<bool>> {
        self.0.store.renew(sessions).await
    }
    async fn revoke(&self, session: &str) -> Result<()> {
        self.0.store.revoke(session).await
    }
    async fn read(&self, election: &ElectionName) -> Result<Snapshot> {
        self.0.read(election).await
    }
    async fn commit(
        &self,
        election: &ElectionName,
        write: &engine::Write,
    ) -> Result<(bool, Snapshot)> {
        self.0.count();
        let entered = self.1.enter([election.clone()]);
        let (store, at, write) = (self.0.store.clone(), election.clone(), write.clone());
        let answer = to_answer(async move {
            let answer = store.commit(&at, &write).await;
            drop(entered);
            answer
        })
        .await?;
        self.0.saw(election, &answer.1);
        Ok(answer)
    }
    async fn changed(&self, election: &ElectionName, what: &WaitFor) -> Result<()> {
        self.0.count();
        self.0.store.changed(election, what).await
    }
    async fn read_many(&self, elections: &[ElectionName]) -> Result<Vec<Snapshot>> {
        self.0.count();
        self.0.store.read_many(elections).await
    }
    async fn commit_many(
        &self,
        writes: &[(ElectionName, engine::Write)],
    ) -> Result<Vec<(bool, Snapshot)>> {
        self.0.count();
        let entered = self.1.enter(writes.iter().map(|(e, _)| e.clone()));
        let (store, writes) = (self.0.store.clone(), writes.to_vec());
        to_answer(async move {
            let answers = store.commit_many(&writes).await;
            drop(entered);
            answers
        })
        .await
    }
    fn batch(&self) -> Option<usize> {
        self.0.store.batch()
    }
    fn notify(&self, election: &ElectionName, what: &WaitFor, to: &Wake) -> bool {
        self.0.store.notify(election, what, to)
    }
}

/// `impl Backend for $ty` by handing every call to the [`DrivenBackend`] at the field
/// path `$field` (`driven`, `inner.driven`): a store's backend type that is the engine over its primitives (plus its
/// own constructors and hooks) writes nothing else.
#[macro_export]
macro_rules! driven_backend {
    ($ty:ty, $($field:ident).+) => {
        #[$crate::async_trait]
        impl $crate::backend::Backend for $ty {
            fn scheme(&self) -> &'static str {
                $crate::backend::Backend::scheme(&self.$($field).+)
            }
            fn capabilities(&self) -> $crate::backend::Capabilities {
                $crate::backend::Backend::capabilities(&self.$($field).+)
            }
            fn check_timing(&self, timing: &$crate::Timing) -> $crate::Result<()> {
                $crate::backend::Backend::check_timing(&self.$($field).+, timing)
            }
            async fn open_session(
                &self,
                ttl: ::std::time::Duration,
                events: $crate::backend::SessionEvents,
            ) -> $crate::Result<$crate::backend::DynSession> {
                $crate::backend::Backend::open_session(&self.$($field).+, ttl, events).await
            }
            async fn leader(
                &self,
                election: &$crate::ElectionName,
            ) -> $crate::Result<Option<$crate::LeaderInfo>> {
                $crate::backend::Backend::leader(&self.$($field).+, election).await
            }
            async fn observe(
                &self,
                election: &$crate::ElectionName,
            ) -> $crate::Result<$crate::backend::LeaderStream> {
                $crate::backend::Backend::observe(&self.$($field).+, election).await
            }
            async fn handover(
                &self,
                election: &$crate::ElectionName,
                to: Option<&str>,
            ) -> $crate::Result<$crate::LeaderInfo> {
                $crate::backend::Backend::handover(&self.$($field).+, election, to).await
            }
            fn election_requests(&self) -> Option<u64> {
                $crate::backend::Backend::election_requests(&self.$($field).+)
            }
            async fn members(
                &self,
                namespace: &$crate::ElectionName,
            ) -> $crate::Result<Vec<$crate::Member>> {
                $crate::backend::Backend::members(&self.$($field).+, namespace).await
            }
            async fn watch_members(
                &self,
                namespace: &$crate::ElectionName,
            ) -> $crate::Result<$crate::backend::MemberStream> {
                $crate::backend::Backend::watch_members(&self.$($field).+, namespace).await
            }
        }
    };
}
