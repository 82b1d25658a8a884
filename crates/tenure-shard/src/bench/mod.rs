//! The shard manager's benchmark, shared by the examples and `tenure bench`: a cluster
//! of managers in one process (each with its own connection), measured through a cold
//! start, a crash, a join and a quiet stretch, plus the time to compute an assignment.

mod counting;
mod report;
mod run;

pub use self::counting::{BatchGauge, CountingBackend};
pub use self::report::{markdown, min_med_max_ms, scaling_svg};
#[cfg(any(test, feature = "testing"))]
pub(crate) use self::run::settle;
pub use self::run::{assignment_times, run, BenchConfig, BenchResult};
