//! A read-only view of a namespace for routers that are not members.

use std::sync::Arc;

use futures::StreamExt;
use tenure_core::{DynBackend, Result, Session, Timing};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Layout;
use crate::manager::snapshot_from_store;
use crate::state::View;
use crate::view::{plan_after, plan_for, ShardView};

/// Follows a namespace's member list and keeps the shard map current, without
/// registering or campaigning: for request routers that need to know who leads which
/// shard. Leaders come from the members' published state, so the map can lag a
/// handoff by one publication; a write must still carry the fencing token its leader
/// got.
pub struct ShardMap {
    layout: Arc<Layout>,
    session: Session,
    rx: watch::Receiver<Arc<ShardView>>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for ShardMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardMap")
            .field("namespace", &self.layout.namespace().as_str())
            .finish()
    }
}

impl ShardMap {
    /// Start following `layout`'s namespace on `backend`.
    pub async fn watch(backend: DynBackend, layout: Layout, timing: Timing) -> Result<ShardMap> {
        let layout = Arc::new(layout);
        let session = Session::open(backend, timing).await?;
        let mut members = session.watch_members(layout.namespace()).await?;
        let empty = View::build(&[], layout.shards().len());
        let first = ShardView::build(&layout, &empty, &plan_for(&layout, &empty));
        let (tx, rx) = watch::channel(Arc::new(first));
        let l = layout.clone();
        let s = session.clone();
        let task = tokio::spawn(async move {
            let mut previous: Option<Arc<crate::assign::Plan>> = None;
            loop {
                match members.next().await {
                    Some(Ok(list)) => {
                        let view = View::build(&list, l.shards().len());
                        let plan = plan_after(previous.as_deref(), &l, &view);
                        previous = Some(plan.clone());
                        tx.send_replace(Arc::new(ShardView::build(&l, &view, &plan)));
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "member watch error"),
                    None => match s.watch_members(l.namespace()).await {
                        Ok(m) => members = m,
                        Err(e) => {
                            tracing::warn!(error = %e, "could not watch members again");
                            tokio::time::sleep(s.timing().retry.max).await;
                        }
                    },
                }
            }
        });
        Ok(ShardMap {
            layout,
            session,
            rx,
            task,
        })
    }

    /// The layout.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The current map.
    pub fn view(&self) -> Arc<ShardView> {
        self.rx.borrow().clone()
    }

    /// The leader of shard `index` by the current map.
    pub fn leader(&self, index: usize) -> Option<String> {
        self.rx
            .borrow()
            .shards
            .get(index)
            .and_then(|s| s.leader.clone())
    }

    /// Wait until the map changes.
    pub async fn changed(&mut self) -> Result<()> {
        self.rx.changed().await.map_err(|_| {
            tenure_core::Error::new(tenure_core::ErrorKind::Unavailable, "shard map stopped")
        })
    }

    /// The map with every shard's leader and token read from the store.
    pub async fn snapshot(&self) -> Result<ShardView> {
        let view = self.view().as_ref().clone();
        snapshot_from_store(&self.session, &self.layout, view).await
    }
}

impl Drop for ShardMap {
    fn drop(&mut self) {
        self.task.abort();
    }
}
