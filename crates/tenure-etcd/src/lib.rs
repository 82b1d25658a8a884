#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod client;
mod config;
mod error;
mod keys;
mod members;
mod ops;
mod proto;
mod session;
mod watcher;

pub use backend::EtcdBackend;
pub use config::EtcdConfig;

/// The URL scheme of this backend: `etcd://host:port[,host:port…][?prefix=…]`
/// (`etcds://` for TLS).
pub const SCHEME: &str = "etcd";

/// Both URL schemes this backend answers to.
pub const SCHEMES: [&str; 2] = [SCHEME, config::TLS_SCHEME];

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&SCHEMES, |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(EtcdBackend::from_url(url).await?) as tenure_core::DynBackend)
        })
    });
