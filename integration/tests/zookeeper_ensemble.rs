//! A 3-server ZooKeeper ensemble under the cluster fault suite: a server's crash,
//! pause or restart (the ensemble leader's included) never costs a leader whose
//! session can move to the rest of the ensemble its seat; losing quorum past the TTL
//! loses it by the deadline, and the seat is granted again after quorum returns.
//! Every test runs on its own ensemble, one test at a time (three JVMs each).

use tenure_integration::cluster_faults;
use tenure_integration::ZooKeeperEnsemble;

/// One ensemble at a time: the machine runs three JVMs per ensemble.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start() -> ZooKeeperEnsemble {
    cluster_faults::logs();
    match ZooKeeperEnsemble::start(3).await {
        Ok(e) => e,
        Err(e) => panic!("start a 3-server ZooKeeper ensemble: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_each_server_in_turn_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    cluster_faults::pausing_each_member(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_the_member_the_session_uses_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    cluster_faults::pausing_the_member_in_use(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_ensemble_leader_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    cluster_faults::pausing_the_store_leader(&start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_ensemble_leader_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    cluster_faults::killing_the_store_leader(&mut start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_costs_no_leadership() {
    let _one = SERIAL.lock().await;
    cluster_faults::a_rolling_restart(&mut start().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_quorum_loses_by_the_deadline_and_its_return_elects_again() {
    let _one = SERIAL.lock().await;
    cluster_faults::losing_quorum(&start().await).await;
}
