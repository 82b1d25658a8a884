//! The whole conformance suite on the in-memory backend.

tenure_core::conformance_tests!(async { tenure_core::testing::Env::memory() });
