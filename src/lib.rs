#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "azure")]
pub use tenure_azure::{AzureBackend, AzureConfig};
pub use tenure_core::*;
#[cfg(feature = "etcd")]
pub use tenure_etcd::{EtcdBackend, EtcdConfig, EtcdLayout};
/// The peer-to-peer backend (`peer://`): election algorithms, quorum guard,
/// simulator, TCP transport.
#[cfg(feature = "peer")]
pub use tenure_peer as peer;
#[cfg(feature = "postgres")]
pub use tenure_postgres::{PostgresBackend, PostgresConfig};
#[cfg(feature = "redis")]
pub use tenure_redis::{RedisBackend, RedisConfig};
#[cfg(feature = "shard")]
pub use tenure_shard as shard;
#[cfg(feature = "shard")]
pub use tenure_shard::{Layout, ShardEvent, ShardManager, ShardMap};
#[cfg(feature = "zookeeper")]
pub use tenure_zookeeper::{ZooKeeperBackend, ZooKeeperConfig};

/// Open the backend named by `url`, among those enabled by cargo features:
///
/// | scheme | feature | backend |
/// |---|---|---|
/// | `mem://[NAME]` | always | in-memory store of this process ([`MemoryBackend`]) |
/// | `etcd://host:port[,…][?prefix=…][&layout=go]`, `etcds://…` (TLS) | `etcd` | etcd v3 (`EtcdBackend`); `layout=go` shares elections with Go's `concurrency.Election` |
/// | `redis://[user:password@]host[:port][/db][?prefix=…]`, `rediss://…` (TLS) | `redis` | a Redis primary (`RedisBackend`) |
/// | `redis+sentinel://[user:password@]sentinel[:port][,…]/service[/db]`, `rediss+sentinel://…` | `redis` | the Redis primary Sentinel names, followed through failovers (`RedisBackend`) |
/// | `zk://[user:password@]host:port[,…][/chroot][?session_timeout=…]` | `zookeeper` | ZooKeeper, Curator LeaderLatch-style nodes (`ZooKeeperBackend`) |
/// | `azblob://account/container[/prefix][?endpoint=…&poll_interval_ms=…]` (credentials from `AZURE_STORAGE_*`) | `azure` | Azure Blob leases (`AzureBackend`) |
/// | `postgres://[user:password@]host[:port][/database][?schema=…&sslmode=verify-full&ca=…]`, `postgresql://…` | `postgres` | PostgreSQL (`PostgresBackend`): server-clock sessions, LISTEN/NOTIFY wake-ups |
/// | `peer://host:port?id=…&peers=…[&algorithm=…]` | `peer` | this process as one node of a peer cluster, no store (`peer::PeerBackend`) |
///
/// An unknown or disabled scheme is [`ErrorKind::InvalidArgument`] naming the schemes
/// this build knows.
pub async fn connect(url: &str) -> Result<DynBackend> {
    backend::connect_with(DRIVERS, url).await
}

/// Every backend this build has, in one list: [`connect`] and [`schemes`] read it.
const DRIVERS: &[backend::Driver] = &[
    MEM_DRIVER,
    #[cfg(feature = "etcd")]
    tenure_etcd::DRIVER,
    #[cfg(feature = "redis")]
    tenure_redis::DRIVER,
    #[cfg(feature = "zookeeper")]
    tenure_zookeeper::DRIVER,
    #[cfg(feature = "peer")]
    tenure_peer::DRIVER,
    #[cfg(feature = "azure")]
    tenure_azure::DRIVER,
    #[cfg(feature = "postgres")]
    tenure_postgres::DRIVER,
];

/// The URL schemes this build of tenure can [`connect`] to.
pub fn schemes() -> Vec<&'static str> {
    DRIVERS
        .iter()
        .flat_map(|d| d.schemes.iter().copied())
        .collect()
}
