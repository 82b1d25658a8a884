//! Handover and failover latency of a backend, as a table (not a timed test).
//!
//! [`bench_backend`] measures any backend (the integration harness runs it on the
//! servers it starts; `tenure bench` on the backends given by URL). [`BenchTable`]
//! prints min/median/max per figure, so every backend's numbers look the same.

use std::fmt;
use std::time::Duration;

use tenure::{Candidate, DynBackend, ElectionName, Leadership, Session, Timing};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// What to measure and how often.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Graceful handovers to measure (resign → the waiter is granted).
    pub handover_runs: usize,
    /// Crash failovers to measure (holder abandons its session → the waiter is granted).
    pub failover_runs: usize,
    /// Session timing; its TTL bounds crash failover.
    pub timing: Timing,
    /// Election names start with this.
    pub prefix: String,
}

impl Default for BenchOptions {
    /// 20 handovers, 5 failovers, TTL 2 s (renew every 500 ms, deadline 1.33 s).
    fn default() -> Self {
        BenchOptions {
            handover_runs: 20,
            failover_runs: 5,
            timing: Timing::from_ttl(Duration::from_secs(2)),
            prefix: format!("bench-{}", std::process::id()),
        }
    }
}

/// One measured quantity and its samples.
#[derive(Debug, Clone)]
pub struct Figure {
    /// What was measured.
    pub name: String,
    /// Conditions worth stating next to the numbers (e.g. the TTL).
    pub note: String,
    /// The samples, in the order measured.
    pub samples: Vec<Duration>,
}

impl Figure {
    fn sorted(&self) -> Vec<Duration> {
        let mut s = self.samples.clone();
        s.sort_unstable();
        s
    }

    /// The smallest sample.
    pub fn min(&self) -> Option<Duration> {
        self.sorted().first().copied()
    }

    /// The median sample (the mean of the middle two for an even count).
    pub fn median(&self) -> Option<Duration> {
        let s = self.sorted();
        match s.len() {
            0 => None,
            n if n % 2 == 1 => Some(s[n / 2]),
            n => Some((s[n / 2 - 1] + s[n / 2]) / 2),
        }
    }

    /// The largest sample.
    pub fn max(&self) -> Option<Duration> {
        self.sorted().last().copied()
    }
}

/// Figures of one backend, printed as a Markdown table.
#[derive(Debug, Clone)]
pub struct BenchTable {
    /// A title line, e.g. the backend and where it ran.
    pub title: String,
    /// The figures.
    pub figures: Vec<Figure>,
}

/// A duration for the tables: two decimals below 10 ms, whole milliseconds above.
pub fn show_duration(d: Option<Duration>) -> String {
    match d {
        Some(d) if d < Duration::from_millis(10) => format!("{:.2} ms", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3),
        None => "–".to_string(),
    }
}

impl fmt::Display for BenchTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.title)?;
        writeln!(f)?;
        writeln!(f, "| figure | runs | min | median | max | conditions |")?;
        writeln!(f, "|---|---:|---:|---:|---:|---|")?;
        for fig in &self.figures {
            writeln!(
                f,
                "| {} | {} | {} | {} | {} | {} |",
                fig.name,
                fig.samples.len(),
                show_duration(fig.min()),
                show_duration(fig.median()),
                show_duration(fig.max()),
                fig.note
            )?;
        }
        Ok(())
    }
}

fn name(s: &str) -> Result<ElectionName, String> {
    ElectionName::new(s).map_err(|e| e.to_string())
}

fn candidate(id: &str) -> Result<Candidate, String> {
    Candidate::new(id).map_err(|e| e.to_string())
}

async fn open(backend: &DynBackend, timing: &Timing) -> Result<Session, String> {
    Session::open(backend.clone(), timing.clone())
        .await
        .map_err(|e| format!("open session: {e}"))
}

/// The waiter of a measurement: `candidate` campaigns on `session` in a task of its own.
fn campaign_in_background(
    session: &Session,
    election: &ElectionName,
    candidate: Candidate,
) -> JoinHandle<tenure::Result<Leadership>> {
    let (s, e) = (session.clone(), election.clone());
    tokio::spawn(async move { s.campaign(&e, &candidate).await })
}

/// The leadership `waiter` is granted, if within `ttls` times the TTL of `timing`.
async fn granted_within(
    waiter: JoinHandle<tenure::Result<Leadership>>,
    timing: &Timing,
    ttls: u32,
) -> Result<Leadership, String> {
    tokio::time::timeout(timing.ttl * ttls, waiter)
        .await
        .map_err(|_| format!("the waiter was not granted within {ttls} TTL"))?
        .map_err(|e| format!("waiter task: {e}"))?
        .map_err(|e| format!("waiter campaign: {e}"))
}

/// Graceful handover: two sessions take turns; each run, the holder resigns while the
/// other waits, and the time from the resign call to the waiter's grant is recorded.
pub async fn measure_handover(
    backend: &DynBackend,
    options: &BenchOptions,
) -> Result<Vec<Duration>, String> {
    let election = name(&format!("{}/handover", options.prefix))?;
    let sessions = [
        open(backend, &options.timing).await?,
        open(backend, &options.timing).await?,
    ];
    let ids = [candidate("a")?, candidate("b")?];
    let mut holder = sessions[0]
        .campaign(&election, &ids[0])
        .await
        .map_err(|e| format!("campaign: {e}"))?;
    let mut samples = Vec::with_capacity(options.handover_runs);
    for run in 0..options.handover_runs {
        let next = (run + 1) % 2;
        let waiter = campaign_in_background(&sessions[next], &election, ids[next].clone());
        // Let the waiter queue up behind the holder.
        tokio::time::sleep(Duration::from_millis(30)).await;
        let t0 = Instant::now();
        holder.resign().await.map_err(|e| format!("resign: {e}"))?;
        let granted = granted_within(waiter, &options.timing, 2).await?;
        samples.push(granted.granted_at().saturating_duration_since(t0));
        holder = granted;
    }
    holder.resign().await.map_err(|e| format!("resign: {e}"))?;
    for s in sessions {
        let _ = s.close().await;
    }
    Ok(samples)
}

/// Preemption (contract clause 14): each run, a holder of priority 0 leads and a
/// candidate of priority 1 joins; the time from the join to the newcomer's grant is
/// recorded (its campaign request, the notification that tells the holder, the
/// holder's release and the newcomer's wake-up). `None` if the backend does not keep
/// priorities.
pub async fn measure_preemption(
    backend: &DynBackend,
    options: &BenchOptions,
) -> Result<Option<Vec<Duration>>, String> {
    if !backend.capabilities().priority {
        return Ok(None);
    }
    let election = name(&format!("{}/preemption", options.prefix))?;
    let holding = open(backend, &options.timing).await?;
    let joining = open(backend, &options.timing).await?;
    let preferred = candidate("preferred")?
        .with_priority(1)
        .map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(options.handover_runs);
    for _ in 0..options.handover_runs {
        let held = holding
            .campaign(&election, &candidate("holder")?)
            .await
            .map_err(|e| format!("campaign: {e}"))?;
        let t0 = Instant::now();
        let waiter = campaign_in_background(&joining, &election, preferred.clone());
        let granted = granted_within(waiter, &options.timing, 2).await?;
        samples.push(granted.granted_at().saturating_duration_since(t0));
        if held.lost_at().is_none_or(|at| at > granted.granted_at()) {
            return Err("the preempted holder's grant outlived the newcomer's start".into());
        }
        drop(held);
        granted.resign().await.map_err(|e| format!("resign: {e}"))?;
    }
    for s in [holding, joining] {
        let _ = s.close().await;
    }
    Ok(Some(samples))
}

/// Crash failover: each run, a holder abandons its session (stops renewing without
/// resigning, as a crashed process would) while a waiter waits; the time from the
/// abandon to the waiter's grant is recorded. It is bounded by the TTL plus the store's
/// expiry granularity, minus the time since the holder's last renewal.
pub async fn measure_failover(
    backend: &DynBackend,
    options: &BenchOptions,
) -> Result<Vec<Duration>, String> {
    measure_failover_with(backend, options, "failover", |crashing| {
        crashing.abandon();
        Ok(())
    })
    .await
}

/// [`measure_failover`] with `crash` doing the crash (e.g. abandon the session and also
/// drop its connection), in the election `<prefix>/<election>`; the time is measured from
/// just before `crash` runs to the waiter's grant.
pub async fn measure_failover_with(
    backend: &DynBackend,
    options: &BenchOptions,
    election: &str,
    crash: impl Fn(&Session) -> Result<(), String>,
) -> Result<Vec<Duration>, String> {
    let election = name(&format!("{}/{election}", options.prefix))?;
    let mut samples = Vec::with_capacity(options.failover_runs);
    for _ in 0..options.failover_runs {
        let crashing = open(backend, &options.timing).await?;
        let waiting = open(backend, &options.timing).await?;
        let held = crashing
            .campaign(&election, &candidate("crashing")?)
            .await
            .map_err(|e| format!("campaign: {e}"))?;
        let waiter = campaign_in_background(&waiting, &election, candidate("waiting")?);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t0 = Instant::now();
        crash(&crashing)?;
        let granted = granted_within(waiter, &options.timing, 3).await?;
        samples.push(granted.granted_at().saturating_duration_since(t0));
        drop(held);
        granted.resign().await.map_err(|e| format!("resign: {e}"))?;
        let _ = waiting.close().await;
    }
    Ok(samples)
}

/// Both figures for `backend`, titled `title`.
pub async fn bench_backend(
    backend: DynBackend,
    title: &str,
    options: &BenchOptions,
) -> Result<BenchTable, String> {
    let handover = measure_handover(&backend, options).await?;
    let failover = measure_failover(&backend, options).await?;
    let preemption = measure_preemption(&backend, options).await?;
    let t = &options.timing;
    let mut table = BenchTable {
        title: title.to_string(),
        figures: vec![
            Figure {
                name: "graceful handover (resign → successor granted)".into(),
                note: "one waiter queued".into(),
                samples: handover,
            },
            Figure {
                name: "crash failover (holder abandons session → successor granted)".into(),
                note: format!(
                    "TTL {:?}, renew every {:?}, deadline {:?}",
                    t.ttl, t.renew_interval, t.renew_deadline
                ),
                samples: failover,
            },
        ],
    };
    // Only where the backend keeps priorities (clause 14); elsewhere it refuses them.
    if let Some(samples) = preemption {
        table.figures.push(Figure {
            name: "preemption (higher priority joins → it is granted)".into(),
            note: "holder priority 0, newcomer 1".into(),
            samples,
        });
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_and_table() {
        let f = Figure {
            name: "x".into(),
            note: "n".into(),
            samples: [3, 1, 2, 10].map(Duration::from_millis).to_vec(),
        };
        assert_eq!(f.min(), Some(Duration::from_millis(1)));
        assert_eq!(f.median(), Some(Duration::from_micros(2500)));
        assert_eq!(f.max(), Some(Duration::from_millis(10)));
        let empty = Figure {
            samples: vec![],
            ..f.clone()
        };
        assert_eq!(empty.median(), None);
        let t = BenchTable {
            title: "t".into(),
            figures: vec![f, empty],
        };
        let text = t.to_string();
        assert!(
            text.contains("| x | 4 | 1.00 ms | 2.50 ms | 10 ms | n |"),
            "{text}"
        );
        assert!(text.contains("| x | 0 | – | – | – | n |"), "{text}");
    }
}
