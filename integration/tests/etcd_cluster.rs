//! A 3-member etcd cluster under the cluster fault suite: a member's pause, crash or
//! restart (the raft leader's included) never costs a leader that is healthy on the
//! rest of the cluster its seat; losing quorum past the TTL loses it by the deadline,
//! and the seat is granted again after quorum returns.

use tenure_integration::cluster_faults;
use tenure_integration::EtcdCluster;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_each_member_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    cluster_faults::pausing_each_member(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_the_member_the_session_uses_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    cluster_faults::pausing_the_member_in_use(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_raft_leader_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    cluster_faults::pausing_the_store_leader(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_raft_leader_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    cluster_faults::killing_the_store_leader(&mut start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_costs_no_leadership() {
    let _serial = SERIAL.lock().await;
    cluster_faults::a_rolling_restart(&mut start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_quorum_loses_by_the_deadline_and_its_return_elects_again() {
    let _serial = SERIAL.lock().await;
    cluster_faults::losing_quorum(&start().await).await;
}
