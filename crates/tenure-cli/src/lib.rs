//! The `tenure` command's logic, as a library so tests can run several commands in one
//! process (e.g. two campaigns on one in-memory store).
#![deny(missing_docs)]

pub mod args;
pub mod bench;
pub mod bench_all;
pub mod campaign;
pub mod clock;
pub mod demo;
pub mod events;
pub mod metrics;
pub mod observe;
pub mod shards;

pub use events::{EventSink, MemorySink, StdoutSink};
