//! A 3-server ZooKeeper ensemble under the cluster fault suite: a server's crash,
//! pause or restart (the ensemble leader's included) never costs a leader whose
//! session can move to the rest of the ensemble its seat; losing quorum past the TTL
//! loses it by the deadline, and the seat is granted again after quorum returns.
//! Every test runs on its own ensemble, one test at a time (three JVMs each).

tenure_integration::cluster_fault_tests!(tenure_integration::ZooKeeperEnsemble::start(3));
