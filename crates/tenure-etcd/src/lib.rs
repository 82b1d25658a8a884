#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod client;
mod config;
mod error;
mod follow;
mod gather;
mod keys;
mod members;
mod ops;
mod primitives;
mod proto;
mod session;
mod shared;
mod watches;

pub use backend::EtcdBackend;
pub use config::{EtcdConfig, SCHEME, SCHEMES};
pub use keys::EtcdLayout;

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&SCHEMES, |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(EtcdBackend::from_url(url).await?) as tenure_core::DynBackend)
        })
    });
