//! A 3-member etcd cluster under the cluster fault suite: a member's pause, crash or
//! restart (the raft leader's included) never costs a leader that is healthy on the
//! rest of the cluster its seat; losing quorum past the TTL loses it by the deadline,
//! and the seat is granted again after quorum returns. One cluster at a time.
//!
//! The tests named after the scenarios run the cluster at etcd's defaults (heartbeat
//! 100 ms, election timeout 1 s: [`ClusterTiming::Production`]); the `fast_…` group runs
//! the same scenarios with a 20 ms heartbeat and a 200 ms election timeout
//! ([`ClusterTiming::Fast`]), faster than anyone runs etcd.
//!
//! [`ClusterTiming::Production`]: tenure_integration::cluster_faults::ClusterTiming::Production
//! [`ClusterTiming::Fast`]: tenure_integration::cluster_faults::ClusterTiming::Fast

tenure_integration::cluster_fault_tests!(
    tenure_integration::EtcdCluster::start(3),
    fast: tenure_integration::EtcdCluster::start_with(
        3,
        tenure_integration::cluster_faults::ClusterTiming::Fast
    )
);
