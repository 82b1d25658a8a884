//! Test harness for `tenure`: real coordination stores, network faults,
//! candidate processes and fencing checks.
//!
//! - **Servers.** [`EtcdServer`], [`ZooKeeperServer`], [`RedisServer`] and
//!   [`AzuriteServer`] start the real store as a child process on a free
//!   loopback port with a temporary data directory, wait until it answers
//!   (at most [`READY_TIMEOUT`]), and kill it and remove the directory on
//!   drop. They offer fault injection: `pause` (SIGSTOP), `resume` (SIGCONT),
//!   `restart` (same port, same data directory) and `kill`. When
//!   `TENURE_TEST_ETCD`, `TENURE_TEST_ZOOKEEPER`, `TENURE_TEST_REDIS` or
//!   `TENURE_TEST_AZURITE` is set, `start` uses that external endpoint
//!   instead (and fault injection reports that it needs a local server). A
//!   missing program is an error naming `bash scripts/install-test-deps.sh`.
//! - **Network faults.** [`TcpProxy`] sits between a client and a server and
//!   can [`cut`](TcpProxy::cut), [`blackhole`](TcpProxy::blackhole) and
//!   [`heal`](TcpProxy::heal) the link.
//! - **Candidates.** [`CandidateProcess`] runs the `tenure` CLI (or any
//!   program printing the same JSON event lines), collects its [`Event`]s and
//!   can kill, pause, resume or terminate it. [`monotonic_now_ns`] reads the
//!   clock the events are stamped with.
//! - **Fencing.** [`GuardedResource`] is a line-protocol TCP server that
//!   refuses writes with stale tokens; [`write_loop_command`] is a shell
//!   command that writes a candidate's token to it in a loop;
//!   [`check_fencing`] finds overlapping tenures and non-increasing tokens in
//!   the event logs of many candidates.
//! - **Chaos.** [`run_chaos`] runs K candidate processes against a real backend
//!   for a given time, injects seeded random faults (SIGKILL or SIGSTOP of the
//!   holder, SIGSTOP or restart of the store, cut or black-holed links, peer
//!   partitions) and returns a [`ChaosReport`] of faults, grants, the longest
//!   leaderless gap and every safety violation; the `tenure-chaos` binary runs it
//!   from a shell.
//! - **Benchmarks.** [`bench_etcd`], [`bench_redis`], [`bench_zookeeper`] and [`bench_backend`]
//!   measure graceful handover and crash failover latency and return a
//!   [`BenchTable`] (min/median/max per figure); [`bench_redis`] adds the cost
//!   of one renewal for 1, 100 and 10,000 held elections. One example runs any of
//!   them: `cargo run --release -p tenure-integration --example bench -- STORE`.
//!
//! Everything here needs a Tokio runtime with the `net`, `process`, `time`
//! and `io-util` drivers (any `#[tokio::test]`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), tenure_integration::HarnessError> {
//! use tenure_integration::{EtcdServer, TcpProxy};
//!
//! let etcd = EtcdServer::start().await?;
//! let proxy = TcpProxy::start(etcd.addr()).await?;
//! let endpoint = format!("http://{}", proxy.addr()); // give this to the client
//! proxy.cut().await?; // the client loses the store
//! proxy.heal().await?;
//! etcd.pause()?; // the store hangs
//! etcd.resume()?;
//! # drop(endpoint);
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod bench;
mod bench_azure;
mod bench_redis;
mod bench_zookeeper;
mod candidate;
pub mod chaos;
pub mod cli_faults;
pub mod cluster_faults;
pub mod curator;
mod error;
pub mod fault_suite;
mod fencing;
pub mod membership;
mod os;
pub mod probe;
mod proxy;
mod proxy_faults;
pub mod redis_admin;
mod server;
mod shared;

pub use bench::{
    bench_backend, bench_etcd, measure_failover, measure_handover, positive_arg, BenchOptions,
    BenchTable, Figure,
};
pub use bench_azure::{bench_azure, AZURE_RENEW_ELECTIONS};
pub use bench_redis::{bench_redis, RENEW_ELECTIONS};
pub use bench_zookeeper::bench_zookeeper;
pub use candidate::{CandidateProcess, Event, TERMINATE_TIMEOUT};
pub use chaos::{run_chaos, ChaosBackend, ChaosOptions, ChaosReport, FaultKind};
pub use curator::{curator_classpath, curator_version, CuratorLatch, CURATOR_START_TIMEOUT};
pub use error::{HarnessError, Result};
pub use fencing::{
    check_fencing, check_fencing_at, tenures, write_loop_command, FencingViolation,
    GuardedResource, Tenure, TenureEnd, WriteRecord, WriteReply,
};
pub use os::{free_port, monotonic_now_ns};
pub use proxy::{LinkState, TcpProxy};
pub use proxy_faults::{assert_ttls_refused, timing_ms, ProxyFaults};
pub use server::{
    start_with_passwords, workspace_root, AzuriteServer, EtcdCluster, EtcdServer, Members,
    RedisSentinels, RedisServer, StoreServer, ZooKeeperEnsemble, ZooKeeperServer, READY_TIMEOUT,
};
pub use shared::run_prefix;
