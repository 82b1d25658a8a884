//! The whole conformance suite on the election engine driven over the in-memory
//! primitives: the contract kept by the engine's rules and the primitive surface alone.

use std::sync::Arc;

use tenure_core::backend::{DrivenBackend, MemPrimitives};
use tenure_core::testing::{memory_timing, Env};

fn env() -> Env {
    let backend = DrivenBackend::new(Arc::new(MemPrimitives::new()), "engine");
    let mut env = Env::new(Arc::new(backend.clone()), memory_timing());
    env.faults = Arc::new(backend);
    env
}

tenure_core::conformance_tests!(async { env() });
