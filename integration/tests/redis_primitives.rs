//! The Redis adapter against a real Redis: the store round trips of a grant, a join, a
//! release and a batch of 64 tries, counted with `MONITOR` (a command a script runs
//! inside the server is not a round trip and is not counted) and printed as a table.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tenure_core::{Candidate, DynBackend, ElectionName, Session};
use tenure_integration::{run_prefix, timing_ms, RedisServer};
use tenure_redis::RedisBackend;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The commands clients sent, by name, as `MONITOR` reports them (script-internal
/// commands, shown as `[db lua]`, left out; so are the subscriber's `PING`s).
#[derive(Clone, Default)]
struct Monitor(Arc<Mutex<Vec<String>>>);

impl Monitor {
    async fn start(addr: &str) -> Monitor {
        let mut stream = TcpStream::connect(addr).await.expect("connect for MONITOR");
        stream.write_all(b"MONITOR\r\n").await.expect("MONITOR");
        let seen = Monitor::default();
        let out = seen.clone();
        let mut lines = BufReader::new(stream).lines();
        // The `+OK` of MONITOR itself.
        let _ = lines.next_line().await;
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Some((_, rest)) = line.split_once(" [") else {
                    continue;
                };
                let Some((client, command)) = rest.split_once("] ") else {
                    continue;
                };
                if client.ends_with(" lua") {
                    continue;
                }
                let name = command
                    .split(' ')
                    .next()
                    .unwrap_or("")
                    .trim_matches('"')
                    .to_ascii_lowercase();
                if name != "ping" {
                    if let Ok(mut v) = out.0.lock() {
                        v.push(name);
                    }
                }
            }
        });
        seen
    }

    fn take(&self) -> Vec<String> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

fn summary(commands: &[String]) -> String {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for c in commands {
        *by.entry(c.as_str()).or_default() += 1;
    }
    let detail: Vec<String> = by.iter().map(|(c, n)| format!("{c} {n}")).collect();
    format!("{} ({})", commands.len(), detail.join(", "))
}

/// Settle: let follow loops and subscriptions finish what an operation started.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(400)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primitive_suite() {
    let server = RedisServer::start().await.expect("redis");
    let url = tenure_integration::with_query(
        server.endpoint(),
        "prefix=tenure-test&connect_timeout_ms=1000&request_timeout_ms=1000",
    );
    let backend = RedisBackend::from_url(&url).await.expect("connect");
    tenure_core::testing::primitives::check_primitives(backend.primitives(), run_prefix()).await;
}

/// A grant, a join, a release and a batch of 64 tries in elections under `name`: the
/// commands of each.
async fn scenario(a: &Session, b: &Session, monitor: &Monitor, name: &str) -> [Vec<String>; 4] {
    let e = ElectionName::new(format!("{name}/seat")).expect("name");
    settle().await;
    monitor.take();
    let held = a
        .campaign(&e, &Candidate::new("a").expect("candidate"))
        .await
        .expect("grant");
    settle().await;
    let grant = monitor.take();

    let waiting = {
        let (b, e) = (b.clone(), e.clone());
        tokio::spawn(async move { b.campaign(&e, &Candidate::new("b").expect("c")).await })
    };
    settle().await;
    let join = monitor.take();

    held.resign().await.expect("resign");
    let next = waiting.await.expect("join").expect("granted");
    settle().await;
    let release = monitor.take();
    next.resign().await.expect("resign");
    settle().await;
    monitor.take();

    let seats: Vec<(ElectionName, Candidate)> = (0..64)
        .map(|i| {
            (
                ElectionName::new(format!("{name}/batch-{i}")).expect("name"),
                Candidate::new("a").expect("candidate"),
            )
        })
        .collect();
    let got = a.try_campaign_many(&seats).await.expect("try many");
    assert!(got.iter().all(Option::is_some), "every free seat taken");
    settle().await;
    let batch = monitor.take();
    a.resign_many(got.into_iter().flatten().collect())
        .await
        .expect("resign many");
    [grant, join, release, batch]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_of_a_grant_a_join_a_release_and_a_batch() {
    let server = RedisServer::start().await.expect("redis");
    let prefix = run_prefix();
    let url = tenure_integration::with_query(
        server.endpoint(),
        &format!("prefix={prefix}&poll_interval_ms=60000"),
    );
    let backend: DynBackend = Arc::new(RedisBackend::from_url(&url).await.expect("connect"));
    // No renewal falls in the windows counted: the first comes 40 s after the session
    // opens, later than the whole scenario.
    let timing = timing_ms(60_000, 40_000, 50_000, 5_000);
    let open = || async {
        Session::open(backend.clone(), timing.clone())
            .await
            .expect("session")
    };
    let (a, b) = (open().await, open().await);
    let monitor = Monitor::start(&server.addr().to_string()).await;
    // Once to load the scripts (a first EVALSHA fails and SCRIPT LOAD follows), then
    // counted.
    scenario(&a, &b, &monitor, "warm").await;
    let [grant, join, release, batch] = scenario(&a, &b, &monitor, "rt").await;
    println!("| operation | store round trips (MONITOR, by command) |");
    println!("|---|---|");
    println!("| grant (campaign on a free seat) | {} |", summary(&grant));
    println!("| join (campaign behind a holder) | {} |", summary(&join));
    println!(
        "| release (resign with a waiter, until it leads) | {} |",
        summary(&release)
    );
    println!("| try_campaign_many, 64 free seats | {} |", summary(&batch));
}
