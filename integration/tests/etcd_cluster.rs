//! A 3-member etcd cluster under the cluster fault suite: a member's pause, crash or
//! restart (the raft leader's included) never costs a leader that is healthy on the
//! rest of the cluster its seat; losing quorum past the TTL loses it by the deadline,
//! and the seat is granted again after quorum returns. One cluster at a time.

tenure_integration::cluster_fault_tests!(tenure_integration::EtcdCluster::start(3));
