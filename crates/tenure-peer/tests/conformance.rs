//! The contract's conformance suite against `peer://`: three nodes in this
//! process over real TCP on loopback. The checks' sessions live on node 1;
//! clause 8's victim is node 2, cut off by blackholing its transport.

mod support;

use std::sync::Arc;

use async_trait::async_trait;
use tenure_core::testing::{memory_timing, Env, Faults};
use tenure_core::{DynBackend, Session};
use tenure_peer::{PeerAlgorithm, PeerBackend};

struct PeerFaults {
    nodes: Vec<PeerBackend>,
}

impl PeerFaults {
    fn node_of(&self, session: &Session) -> Result<&PeerBackend, String> {
        let id = session.id();
        self.nodes
            .iter()
            .find(|n| id.starts_with(&format!("peer-{}-", n.id())))
            .ok_or_else(|| format!("no node has session {id}"))
    }
}

#[async_trait]
impl Faults for PeerFaults {
    async fn victim_backend(&self, _env: &Env) -> Result<DynBackend, String> {
        Ok(Arc::new(self.nodes[1].clone()))
    }

    async fn disconnect(&self, session: &Session) -> Result<(), String> {
        self.node_of(session)?.set_isolated(true);
        Ok(())
    }

    async fn reconnect(&self, session: &Session) -> Result<(), String> {
        self.node_of(session)?.set_isolated(false);
        Ok(())
    }

    async fn expire(&self, session: &Session) -> Result<(), String> {
        let node = self.node_of(session)?;
        if node.expire_session(&session.id()).await {
            Ok(())
        } else {
            Err(format!("no session {}", session.id()))
        }
    }
}

async fn peer_env() -> Env {
    let nodes = support::cluster(3, PeerAlgorithm::Bully).await;
    let mut env = Env::new(Arc::new(nodes[0].clone()), memory_timing());
    env.faults = Arc::new(PeerFaults {
        nodes: nodes.clone(),
    });
    env.guard = Some(Box::new(nodes));
    env
}

tenure_core::conformance_tests!(peer_env());
