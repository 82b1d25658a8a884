#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod backend;
pub mod engine;
mod error;
mod grant;
mod leadership;
mod memory;
pub mod metrics;
mod name;
mod observer;
mod random;
mod runner;
mod session;
mod timing;
mod url;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[doc(hidden)]
pub use async_trait::async_trait;
pub use backend::{Backend, DynBackend, LeaderStream, MemberStream};
pub use error::{one_line, BoxError, Error, ErrorKind, Result};
pub use grant::{Loss, LossReason, StepDownReason, WorkGuard};
pub use leadership::{Leadership, LeadershipWatch};
pub use memory::{MemoryBackend, MEM_SCHEME};
pub use name::{
    Candidate, ElectionName, FencingToken, LeaderInfo, Member, MAX_CANDIDATE_ID_LEN,
    MAX_CANDIDATE_VALUE_LEN, MAX_ELECTION_NAME_LEN, MAX_MEMBER_ID_LEN, MAX_MEMBER_VALUE_LEN,
    MAX_PRIORITY, MIN_PRIORITY,
};
pub use observer::Observer;
pub use runner::{LeaderContext, LeaderRunner, LeadershipEvent, ResignCause};
pub use session::{Losses, Session};
pub use timing::{Retry, Timing, CLOCK_DRIFT_MARGIN, DEFAULT_STEP_DOWN_GRACE};
/// The stop signal of a leadership ([`Leadership::lost`]) and of a runner's shutdown,
/// re-exported so that using them needs no `tokio-util` dependency.
pub use tokio_util::sync::CancellationToken;
pub use url::{connect, MEM_DRIVER};
