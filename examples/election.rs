//! One election, two candidates and an observer, on any store by URL: the observer
//! prints each leader change while the candidates take turns (a graceful handover),
//! each lead marked by its fencing token.
//!
//! ```text
//! cargo run --example election                                   # mem://, no server
//! cargo run --example election --features etcd -- etcd://127.0.0.1:2379
//! cargo run --example election --features redis -- redis://127.0.0.1:6379
//! cargo run --example election --features zookeeper -- zk://127.0.0.1:2181/tenure
//! cargo run --example election --features postgres -- postgres://tenure@127.0.0.1:5432/postgres
//! AZURE_STORAGE_CONNECTION_STRING=UseDevelopmentStorage=true cargo run --example election \
//!   --features azure -- 'azblob://devstoreaccount1/elections?endpoint=http://127.0.0.1:10000/devstoreaccount1&poll_interval_ms=100'
//! ```
//!
//! The URL comes from the first argument, else `TENURE_BACKEND`, else `mem://` (the
//! servers: `docker compose -f docker/docker-compose.yml up`). What each store maps the
//! election onto:
//!
//! | store | session | seat | fencing token | waiters |
//! |---|---|---|---|---|
//! | etcd | a lease | a key created in a transaction | its create revision | watch their predecessor |
//! | Redis | a key with a TTL | a key set by a Lua script | a per-election counter | woken by pub/sub |
//! | ZooKeeper | a ZooKeeper session | ephemeral sequential nodes (Curator LeaderLatch) | the node's czxid | watch their predecessor |
//! | PostgreSQL | a row expired by the server's clock | a row granted under the election's lock | a sequence | woken by `NOTIFY` |
//! | Azure Blob | leases renewed together | the blob's lease (15–60 s, so the TTL is at least 15 s) | a metadata counter written under the lease | poll |
//!
//! This connects through `tenure::connect`; the typed way is each backend's
//! `from_url` / config type (`tenure::EtcdBackend::from_url`, `tenure::EtcdConfig`, …).

mod common;

use std::time::Duration;

use futures::StreamExt;
use tenure::{Candidate, DynBackend, ElectionName, Observer, Session, Timing};

#[tokio::main]
async fn main() -> tenure::Result<()> {
    let url = common::backend_url();
    // Azure Blob leases last 15 s at the least; 5 s suits every other store.
    let ttl = if url.to_ascii_lowercase().starts_with("azblob") {
        15
    } else {
        5
    };
    let timing = Timing::from_ttl(Duration::from_secs(ttl));
    println!("connecting to {url}");
    let backend: DynBackend = tenure::connect(&url).await?;
    let election = ElectionName::new(format!("examples/report-{}", std::process::id()))?;

    // An observer (no session needed): one line per leader change.
    let observer = Observer::new(backend.clone(), timing.connect_timeout);
    let mut leaders = observer.observe(&election).await?;
    let observer = tokio::spawn(async move {
        while let Some(Ok(leader)) = leaders.next().await {
            match leader {
                Some(l) => println!(
                    "  observer: {} leads (token {}, value {:?})",
                    l.id, l.token, l.value
                ),
                None => println!("  observer: no leader"),
            }
        }
    });

    // Two candidates, each in its own session (as two processes would be).
    let a = Session::open(backend.clone(), timing.clone()).await?;
    let b = Session::open(backend.clone(), timing).await?;
    let first = a
        .campaign(
            &election,
            &Candidate::with_value("worker-a", "10.0.0.1:8080")?,
        )
        .await?;
    println!(
        "worker-a leads {election} with fencing token {}",
        first.token()
    );

    let waiting = {
        let (b, election) = (b.clone(), election.clone());
        tokio::spawn(async move {
            let c = Candidate::with_value("worker-b", "10.0.0.2:8080")?;
            b.campaign(&election, &c).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("worker-a resigns");
    first.resign().await?;
    let second = match waiting.await {
        Ok(r) => r?,
        Err(e) => {
            return Err(tenure::Error::new(
                tenure::ErrorKind::Backend,
                e.to_string(),
            ))
        }
    };
    println!(
        "worker-b leads with fencing token {} (greater: writes of worker-a are now refused)",
        second.token()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    second.resign().await?;
    a.close().await?;
    b.close().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    observer.abort();
    Ok(())
}
