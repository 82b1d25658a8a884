#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod assign;
pub mod balance;
pub mod bench;
mod config;
pub mod hash;
mod manager;
mod map;
pub mod metrics;
mod state;
mod status;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod view;

pub use assign::{plan, plan_reusing, NodeSpec, Plan};
pub use config::{
    Layout, Shard, ShardManagerBuilder, MAX_MEMBER_GRACE, MAX_REPLICATION, MAX_SHARDS, MAX_WEIGHT,
};
pub use manager::{LoadReporter, ShardEvent, ShardEvents, ShardManager, ShardStatus};
pub use map::ShardMap;
pub use view::{NodeInfo, ShardInfo, ShardView};
