//! What every backend example does once connected: an observer prints leader changes
//! while two candidates take turns (a graceful handover), each lead marked by its
//! fencing token.

use std::time::Duration;

use futures::StreamExt;
use tenure::{Candidate, DynBackend, ElectionName, Observer, Session, Timing};

/// The URL from the first argument, else `TENURE_BACKEND`, else `default`.
pub fn url(default: &str) -> String {
    std::env::args()
        .nth(1)
        .or_else(|| std::env::var("TENURE_BACKEND").ok())
        .unwrap_or_else(|| default.to_string())
}

/// Connect to `url` (any scheme this build knows), then observe and campaign.
pub async fn connect_campaign_observe(url: &str, timing: Timing) -> tenure::Result<()> {
    println!("connecting to {url}");
    let backend: DynBackend = tenure::connect(url).await?;
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
