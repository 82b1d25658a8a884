//! A 3-server ZooKeeper ensemble: a server's crash, pause or restart never costs a
//! leader whose session can move to the rest of the ensemble its seat; losing quorum
//! past the TTL loses it by the deadline, and the seat is granted again after quorum
//! returns. Every test runs on its own ensemble, one test at a time (three JVMs each).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_core::{Candidate, Session, Timing};
use tenure_integration::cluster_faults::{self, election, hold_through, lead};
use tenure_integration::ZooKeeperEnsemble;
use tenure_zookeeper::ZooKeeperBackend;

const TTL: Duration = Duration::from_secs(5);

/// How long a server cut off from the quorum goes on answering: the ensemble's
/// `syncLimit` × `tickTime`.
const SYNC_WINDOW: Duration = Duration::from_secs(1);

/// One ensemble at a time: the machine runs three JVMs per ensemble.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start() -> ZooKeeperEnsemble {
    cluster_faults::logs();
    match ZooKeeperEnsemble::start(3).await {
        Ok(e) => e,
        Err(e) => panic!("start a 3-server ZooKeeper ensemble: {e}"),
    }
}

/// A session over every server (the URL a user writes), TTL 5 s, default timeouts.
async fn session(ensemble: &ZooKeeperEnsemble) -> Session {
    let url = format!("zk://{}", ensemble.hosts());
    let backend = ZooKeeperBackend::from_url(&url).await.expect("connect");
    cluster_faults::session(Arc::new(backend), TTL).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_ensemble_leader_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    let mut ensemble = start().await;
    let s = session(&ensemble).await;
    let l = lead(&s, "kill-leader").await;
    let leader = ensemble.wait_leader().await.expect("ensemble leader");
    ensemble.kill(leader).await.expect("kill");
    // Past the TTL: a session given up while the rest keeps quorum would be gone.
    hold_through(&l, TTL + Duration::from_secs(2), "ensemble leader killed").await;
    ensemble.restart(leader).await.expect("restart");
    hold_through(&l, Duration::from_secs(3), "ensemble leader back").await;
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_ensemble_leader_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    let ensemble = start().await;
    let s = session(&ensemble).await;
    let l = lead(&s, "pause-leader").await;
    let leader = ensemble.wait_leader().await.expect("ensemble leader");
    ensemble.pause(leader).expect("pause");
    hold_through(&l, Duration::from_secs(8), "ensemble leader paused for 8 s").await;
    ensemble.resume(leader).expect("resume");
    hold_through(&l, Duration::from_secs(4), "ensemble leader resumed").await;
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    let mut ensemble = start().await;
    let s = session(&ensemble).await;
    let l = lead(&s, "rolling").await;
    // One server at a time, each down for 2 s, the next only once all serve again.
    for server in 0..ensemble.len() {
        ensemble.kill(server).await.expect("kill");
        hold_through(&l, Duration::from_secs(2), &format!("server {server} down")).await;
        ensemble.restart(server).await.expect("restart");
        ensemble.wait_leader().await.expect("ensemble whole again");
        hold_through(&l, Duration::from_secs(1), &format!("server {server} back")).await;
    }
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_each_server_in_turn_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    let ensemble = start().await;
    let s = session(&ensemble).await;
    let l = lead(&s, "pause-each").await;
    // Under one leadership, so the server the session is connected to (and whichever
    // it moves to) is paused at least once, for longer than the client's read timeout.
    for server in 0..ensemble.len() {
        ensemble.wait_leader().await.expect("ensemble whole");
        ensemble.pause(server).expect("pause");
        let what = format!("server {server} paused for 6 s");
        hold_through(&l, Duration::from_secs(6), &what).await;
        ensemble.resume(server).expect("resume");
        hold_through(
            &l,
            Duration::from_secs(1),
            &format!("server {server} resumed"),
        )
        .await;
    }
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_quorum_loses_by_the_deadline_and_its_return_elects_again() {
    let _one = SERIAL.lock().await;
    let ensemble = start().await;
    let s = session(&ensemble).await;
    let election = election("quorum");
    let l = cluster_faults::lead_in(&s, &election).await;
    let timing = Timing::from_ttl(TTL);
    // Two of three stopped past the TTL: no renewal can be confirmed.
    ensemble.pause(0).expect("pause");
    ensemble.pause(1).expect("pause");
    let paused = Instant::now();
    // The server left may answer for up to syncLimit × tickTime (1 s) before it notices
    // the quorum is gone, so the last renewal can be confirmed that long after the pause.
    tokio::time::timeout(
        timing.renew_deadline + SYNC_WINDOW + Duration::from_secs(1),
        l.lost().cancelled(),
    )
    .await
    .expect("the lost signal fires by the renew deadline without quorum");
    assert!(!l.is_leader());
    let waited = TTL + Duration::from_secs(1);
    tokio::time::sleep(waited.saturating_sub(paused.elapsed())).await;
    ensemble.resume(0).expect("resume");
    ensemble.resume(1).expect("resume");
    let back = Instant::now();
    let again = tokio::time::timeout(
        TTL + Duration::from_secs(5),
        s.campaign(&election, &Candidate::new("holder").unwrap()),
    )
    .await
    .expect("elected again within TTL + 5 s of quorum's return")
    .expect("campaign");
    assert!(again.token() > l.token(), "a new grant has a larger token");
    eprintln!("elected again {:?} after quorum returned", back.elapsed());
    again.resign().await.expect("resign");
    s.close().await.expect("close");
}
