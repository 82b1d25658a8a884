#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod config;
mod error;
mod link;
mod store;

pub use backend::PostgresBackend;
pub use config::{PostgresConfig, SCHEME, SCHEMES};

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&SCHEMES, |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(PostgresBackend::from_url(url).await?)
                as tenure_core::DynBackend)
        })
    });
