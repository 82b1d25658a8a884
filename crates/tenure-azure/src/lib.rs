#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod auth;
mod backend;
mod config;
mod error;
mod members;
mod names;
mod prims;
mod record;
mod sessions;
mod store;

pub use backend::AzureBackend;
pub use config::{AzureConfig, SCHEME};
pub use prims::{MAX_LEASE_SECS, MIN_LEASE_SECS};

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&[SCHEME], |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(AzureBackend::from_url(url).await?) as tenure_core::DynBackend)
        })
    });
