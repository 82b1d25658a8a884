//! Test harness for `tenure`: real coordination stores, network faults,
//! candidate processes and fencing checks.
//!
//! - **Servers.** [`EtcdServer`], [`ZooKeeperServer`], [`RedisServer`],
//!   [`AzuriteServer`] and [`PostgresServer`] run the store as a child process on a free
//!   loopback port with a temporary data directory (or use the external one
//!   `TENURE_TEST_ETCD`, `…_ZOOKEEPER`, `…_REDIS`, `…_AZURITE` or `…_POSTGRES` names), with
//!   faults on the process ([`StoreServer`]);
//!   [`EtcdCluster`], [`ZooKeeperEnsemble`] and [`RedisSentinels`] run several.
//! - **Network faults.** [`TcpProxy`] can cut, black-hole and heal a link.
//! - **Candidates.** [`CandidateProcess`] runs the `tenure` CLI and collects its
//!   [`Event`]s; [`GuardedResource`] refuses writes with stale tokens and
//!   [`check_fencing`] finds overlapping tenures and non-increasing tokens.
//! - **Suites.** [`fault_suite`] and [`cluster_faults`] run the same fault scenarios on
//!   every store; [`run_chaos`] runs seeded random faults against K candidates
//!   ([`ChaosReport`]; the `tenure-chaos` binary runs it from a shell).
//! - **Benchmarks.** [`bench_etcd`], [`bench_redis`], [`bench_zookeeper`],
//!   [`bench_azure`] and [`bench_backend`] measure handover and failover latency
//!   ([`BenchTable`]): `cargo run --release -p tenure-integration --example bench -- STORE`.
//!
//! Everything here needs a Tokio runtime with the `net`, `process`, `time` and `io-util`
//! drivers (any `#[tokio::test]`).
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
pub mod planned;
pub mod probe;
mod proxy;
mod proxy_faults;
pub mod redis_admin;
mod round_trips;
mod server;
pub mod shard_chaos;
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
pub use proxy_faults::{assert_ttls_refused, etcd_env, timing_ms, ProxyFaults};
pub use round_trips::{print_round_trips, print_table};
pub use server::{
    etcdctl_program, start_with_passwords, workspace_root, AzuriteServer, EtcdCluster, EtcdServer,
    Members, PostgresServer, RedisSentinels, RedisServer, StoreServer, ZooKeeperEnsemble,
    ZooKeeperServer, READY_TIMEOUT,
};
pub use shared::{next_leader_where, run_prefix, with_query, SpawnedCampaign};
