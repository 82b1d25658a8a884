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
mod prims;
mod scripts;
mod shared;
mod target;

pub use backend::RedisBackend;
pub use config::{RedisConfig, SCHEME, SCHEMES, SENTINEL_SCHEME, SENTINEL_TLS_SCHEME, TLS_SCHEME};

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&SCHEMES, |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(RedisBackend::from_url(url).await?) as tenure_core::DynBackend)
        })
    });
