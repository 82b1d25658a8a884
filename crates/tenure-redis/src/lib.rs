#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod conn;
mod error;
mod hub;
mod keys;
mod members;
mod scripts;
mod session;

pub use backend::RedisBackend;
pub use config::RedisConfig;

/// The URL scheme of this backend: `redis://[[user][:password]@]host[:port][/db][?…]`.
pub const SCHEME: &str = "redis";

/// The URL scheme of Redis over TLS: `rediss://…`.
pub const TLS_SCHEME: &str = "rediss";

/// Both URL schemes this backend answers to.
pub const SCHEMES: [&str; 2] = [SCHEME, TLS_SCHEME];

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&SCHEMES, |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(RedisBackend::from_url(url).await?) as tenure_core::DynBackend)
        })
    });
