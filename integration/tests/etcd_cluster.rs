//! A 3-member etcd cluster: a member's pause, crash or restart never costs a leader
//! that is healthy on the rest of the cluster its seat; losing quorum past the TTL
//! loses it by the deadline, and the seat is granted again after quorum returns.

use std::sync::Arc;
use std::time::Duration;

use tenure_core::{Candidate, Session, Timing};
use tenure_etcd::EtcdBackend;
use tenure_integration::cluster_faults::{self, election, hold_through, lead};
use tenure_integration::EtcdCluster;

const TTL: Duration = Duration::from_secs(5);

/// One cluster at a time: each test runs three etcd processes and stops or restarts
/// them, and two such tests side by side on a 2-core machine starve each other's raft
/// heartbeats, which is not the fault under test.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start() -> EtcdCluster {
    cluster_faults::logs();
    match EtcdCluster::start(3).await {
        Ok(c) => c,
        Err(e) => panic!("start a 3-member etcd cluster: {e}"),
    }
}

/// A session over every member (the URL a user writes), TTL 5 s, default timeouts.
async fn session(cluster: &EtcdCluster) -> Session {
    let url = format!("etcd://{}", cluster.hosts());
    let backend = EtcdBackend::from_url(&url).await.expect("connect");
    cluster_faults::session(Arc::new(backend), TTL).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_member_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    let cluster = start().await;
    let s = session(&cluster).await;
    let l = lead(&s, "pause").await;
    // Pause each member in turn under one leadership: whichever member serves the
    // session's keep-alive stream (and whichever it moves to) is paused at least once.
    for member in 0..3 {
        cluster.pause(member).expect("pause");
        let what = format!("member {member} paused for 8 s");
        hold_through(&l, Duration::from_secs(8), &what).await;
        cluster.resume(member).expect("resume");
    }
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_raft_leader_and_a_rolling_restart_cost_no_leadership() {
    let _serial = SERIAL.lock().await;
    let mut cluster = start().await;
    let s = session(&cluster).await;
    let l = lead(&s, "restart").await;
    // SIGKILL the raft leader; the others elect a new one; it comes back.
    let leader = cluster.leader().expect("raft leader");
    cluster.kill(leader).await.expect("kill");
    hold_through(&l, Duration::from_secs(4), "raft leader killed").await;
    cluster.restart(leader).await.expect("restart");
    // Rolling restart: one member at a time, each down for 2 s.
    for member in 0..3 {
        cluster.kill(member).await.expect("kill");
        hold_through(&l, Duration::from_secs(2), &format!("member {member} down")).await;
        cluster.restart(member).await.expect("restart");
        hold_through(&l, Duration::from_secs(1), &format!("member {member} back")).await;
    }
    l.resign().await.expect("resign");
    s.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_quorum_loses_by_the_deadline_and_its_return_elects_again() {
    let _serial = SERIAL.lock().await;
    let cluster = start().await;
    let s = session(&cluster).await;
    let election = election("quorum");
    let l = cluster_faults::lead_in(&s, &election).await;
    let timing = Timing::from_ttl(TTL);
    // Two of three stopped past the TTL: no renewal can be confirmed.
    cluster.pause(0).expect("pause");
    cluster.pause(1).expect("pause");
    let paused = std::time::Instant::now();
    let lost = l.lost();
    tokio::time::timeout(
        timing.renew_deadline + Duration::from_secs(1),
        lost.cancelled(),
    )
    .await
    .expect("the lost signal fires by the renew deadline without quorum");
    assert!(!l.is_leader());
    let waited = TTL + Duration::from_secs(1);
    tokio::time::sleep(waited.saturating_sub(paused.elapsed())).await;
    cluster.resume(0).expect("resume");
    cluster.resume(1).expect("resume");
    let back = std::time::Instant::now();
    // The session campaigns again by itself through the runner-less path: campaign anew.
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
}
