#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod curator;
mod error;
mod members;
mod nodes;
mod prims;
mod shared;

pub use backend::ZooKeeperBackend;
pub use config::{ZooKeeperConfig, ZooKeeperLayout};

/// The URL scheme of this backend:
/// `zk://[user:password@]host:port[,host:port…][/chroot][?session_timeout=…&layout=…]`.
pub const SCHEME: &str = "zk";

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&[SCHEME], |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(ZooKeeperBackend::from_url(url).await?)
                as tenure_core::DynBackend)
        })
    });
