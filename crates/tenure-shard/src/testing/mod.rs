//! Shard-manager scenarios for tests, shared by the in-memory tests and the tests
//! against real stores (behind the `testing` feature): a [`Cluster`] of managers in
//! one process, each with its own connection, checked against the store; the
//! scenario functions panic on failure (they are test code).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod cluster;
mod env;
mod load;
mod membership;

pub use self::cluster::{same_backend, timing, Cluster, Connect, Logged};
pub use self::env::ShardEnv;
pub use self::load::{
    check_load_capacities, check_load_noise, check_load_shift, check_load_zipf, check_move_budget,
    started_by_load,
};
pub use self::membership::{
    check_cold_start, check_crash, check_drain, check_join, check_quiet, check_zone_loss,
};
pub use crate::balance::zipf;
