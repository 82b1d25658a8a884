//! Three workers compete for one election on the in-memory store; only the leader runs
//! its task, writing to a resource that refuses stale fencing tokens. The script then
//! crashes the leader, lets a task stall, and shuts everything down.
//!
//! `cargo run --release --example run_when_leader`

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tenure::{
    Candidate, ElectionName, LeaderRunner, LeadershipEvent, MemoryBackend, Session, Timing,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A resource that accepts a write only with a token at least as high as any it saw.
#[derive(Default)]
struct GuardedResource {
    highest: AtomicU64,
    accepted: AtomicU64,
    refused: AtomicU64,
}

impl GuardedResource {
    fn write(&self, token: u64) -> bool {
        let prev = self.highest.fetch_max(token, Ordering::SeqCst);
        let ok = token >= prev;
        let counter = if ok { &self.accepted } else { &self.refused };
        counter.fetch_add(1, Ordering::SeqCst);
        ok
    }
}

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let store = MemoryBackend::new();
    let backend: tenure::DynBackend = Arc::new(store.clone());
    let mut timing = Timing::from_ttl(Duration::from_secs(2));
    timing.renew_interval = Duration::from_millis(250);
    timing.renew_deadline = Duration::from_millis(1300);
    let election = ElectionName::new("demo/nightly-report")?;
    let resource = Arc::new(GuardedResource::default());
    let start = Instant::now();
    let shutdown = CancellationToken::new();
    let mut sessions = Vec::new();
    let mut runners = Vec::new();
    // The second term's task hangs, to show stall detection.
    let terms = Arc::new(AtomicU64::new(0));

    println!("3 workers campaign for {election} on mem:// (TTL 2 s, renew every 250 ms)");
    for name in ["worker-a", "worker-b", "worker-c"] {
        let session = Session::open(backend.clone(), timing.clone()).await?;
        sessions.push((name, session.clone()));
        let mut runner = LeaderRunner::new(session, election.clone(), Candidate::new(name)?)
            .stall_timeout(Duration::from_millis(500));
        let mut events = runner.subscribe();
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                let t = start.elapsed().as_secs_f64();
                match ev {
                    LeadershipEvent::Elected { token, .. } => {
                        println!("{t:6.3}s  {name} elected, token {token}")
                    }
                    LeadershipEvent::Lost { token, reason, .. } => {
                        println!("{t:6.3}s  {name} lost token {token}: {reason}")
                    }
                    LeadershipEvent::Resigned { token, cause, .. } => {
                        println!("{t:6.3}s  {name} resigned token {token}: {cause}")
                    }
                    _ => {}
                }
            }
        });
        let resource = resource.clone();
        let stop = shutdown.clone();
        let terms = terms.clone();
        runners.push(tokio::spawn(runner.run(stop, move |ctx| {
            let resource = resource.clone();
            let term = terms.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                if term == 2 {
                    // Hang without heartbeats: the runner notices and resigns.
                    ctx.cancelled().await;
                    return Ok(());
                }
                loop {
                    ctx.heartbeat();
                    if !resource.write(ctx.token().get()) {
                        return Err("a newer leader exists");
                    }
                    tokio::select! {
                        _ = ctx.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                    }
                }
            }
        })));
    }

    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = sessions[0].1.leader(&election).await?;
    if let Some(leader) = leader {
        let t = start.elapsed().as_secs_f64();
        println!(
            "{t:6.3}s  crash: {} stops renewing without resigning",
            leader.id
        );
        if let Some((_, s)) = sessions.iter().find(|(n, _)| *n == leader.id) {
            store.crash_session(&s.id());
        }
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!("{:6.3}s  shutting down", start.elapsed().as_secs_f64());
    shutdown.cancel();
    for r in runners {
        let _ = tokio::time::timeout(Duration::from_secs(5), r).await;
    }
    println!(
        "\nwrites accepted: {}, refused as stale: {}, highest token: {}",
        resource.accepted.load(Ordering::SeqCst),
        resource.refused.load(Ordering::SeqCst),
        resource.highest.load(Ordering::SeqCst)
    );
    Ok(())
}
