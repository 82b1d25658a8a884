//! tenure: leader election over interchangeable coordination stores.
//!
//! See the [README](https://example.invalid/tenure) for the contract in brief. This
//! facade re-exports [`tenure_core`] and, behind cargo features, each backend.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub use tenure_core::*;
