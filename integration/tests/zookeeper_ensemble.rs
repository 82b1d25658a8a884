//! A 3-server ZooKeeper ensemble under the cluster fault suite: a server's crash,
//! pause or restart (the ensemble leader's included) never costs a leader whose
//! session can move to the rest of the ensemble its seat; losing quorum past the TTL
//! loses it by the deadline, and the seat is granted again after quorum returns.
//! Every test runs on its own ensemble, one test at a time (three JVMs each).
//!
//! The tests named after the scenarios run the ensemble at production timing
//! (`tickTime` 2000 ms, `initLimit` 5, `syncLimit` 2, as Kafka's operations guide
//! configures it: [`ClusterTiming::Production`]); the `fast_…` group runs the same
//! scenarios with `tickTime` 500 ms ([`ClusterTiming::Fast`]), faster than anyone runs
//! ZooKeeper.
//!
//! [`ClusterTiming::Production`]: tenure_integration::cluster_faults::ClusterTiming::Production
//! [`ClusterTiming::Fast`]: tenure_integration::cluster_faults::ClusterTiming::Fast

tenure_integration::cluster_fault_tests!(
    tenure_integration::ZooKeeperEnsemble::start(3),
    fast: tenure_integration::ZooKeeperEnsemble::start_with(
        3,
        tenure_integration::cluster_faults::ClusterTiming::Fast
    )
);
