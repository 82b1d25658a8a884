//! `tenure handover`: ask the leader of an election to step down to a waiter.

use std::time::Duration;

use serde_json::{json, Value};
use tenure::{Candidate, DynBackend, ElectionName, Observer, Result};

use crate::args::{positive_seconds, HandoverArgs};
use crate::clock::monotonic_now_ns;

/// The arguments of `tenure handover`, checked before the backend is connected.
#[derive(Debug, Clone)]
pub struct HandoverPlan {
    election: ElectionName,
    to: Option<String>,
    connect_timeout: Duration,
}

impl HandoverPlan {
    /// Check `args` (election name, the waiter's id, connect timeout).
    pub fn new(args: &HandoverArgs) -> Result<HandoverPlan> {
        let to = match &args.to {
            Some(id) => Some(Candidate::new(id)?.id().to_string()),
            None => None,
        };
        Ok(HandoverPlan {
            election: ElectionName::new(&args.election)?,
            to,
            connect_timeout: positive_seconds("connect_timeout", args.connect_timeout)?,
        })
    }

    /// How long connecting, and the answer, may take.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }
}

/// Ask for the handover; the line to print names the leader asked and the waiter.
pub async fn run_handover(backend: DynBackend, plan: &HandoverPlan) -> Result<Value> {
    let observer = Observer::new(backend, plan.connect_timeout);
    let leader = observer
        .handover(&plan.election, plan.to.as_deref())
        .await?;
    Ok(json!({
        "event": "handover",
        "election": plan.election.as_str(),
        "leader": {"id": leader.id, "value": leader.value, "token": leader.token.get()},
        "to": plan.to,
        "mono_ns": monotonic_now_ns(),
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use clap::Parser;
    use tenure::{Candidate, ElectionName, LossReason, MemoryBackend, Session, Timing};

    use super::{run_handover, HandoverPlan};
    use crate::args::{Cli, Command};

    fn plan(args: &[&str]) -> tenure::Result<HandoverPlan> {
        let mut argv = vec!["tenure", "handover"];
        argv.extend_from_slice(args);
        match Cli::parse_from(argv).command {
            Command::Handover(a) => HandoverPlan::new(&a),
            other => panic!("parsed {other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_leader_steps_down_to_the_waiter_asked_for() {
        let mem = MemoryBackend::new();
        let backend: tenure::DynBackend = Arc::new(mem.clone());
        let timing = Timing::from_ttl(Duration::from_secs(2));
        let e = ElectionName::new("jobs/handover").unwrap();
        let (a, b) = (
            Session::open(backend.clone(), timing.clone())
                .await
                .unwrap(),
            Session::open(backend.clone(), timing).await.unwrap(),
        );
        let la = a.campaign(&e, &Candidate::new("a").unwrap()).await.unwrap();
        // The leader's work has stopped already: it steps down as soon as it is asked.
        drop(la.work_guard());
        let waiter = {
            let e = e.clone();
            tokio::spawn(async move { b.campaign(&e, &Candidate::new("b").unwrap()).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let line = run_handover(
            backend,
            &plan(&["--election", "jobs/handover", "--to", "b"]).unwrap(),
        )
        .await
        .unwrap();
        assert_eq!(line["event"], "handover");
        assert_eq!(line["leader"]["id"], "a");
        assert_eq!(line["leader"]["token"], la.token().get());
        assert_eq!(line["to"], "b");
        let lb = tokio::time::timeout(Duration::from_secs(2), waiter)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(la.loss_reason(), Some(LossReason::Preempted));
        assert!(lb.token() > la.token());
    }

    #[test]
    fn bad_arguments_are_refused_before_connecting() {
        let e = plan(&["--election", "a//b"]).unwrap_err();
        assert!(e.message().contains("election name"), "{e}");
        let e = plan(&["--election", "e", "--to", "a b"]).unwrap_err();
        assert!(e.message().contains("candidate id"), "{e}");
        let e = plan(&["--election", "e", "--connect-timeout", "0"]).unwrap_err();
        assert!(e.message().contains("connect_timeout"), "{e}");
    }
}
