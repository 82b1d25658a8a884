//! The primitive suite ([`tenure_core::testing::primitives`]) on the in-memory
//! primitives, with the clock paused.

use std::sync::Arc;

use tenure_core::backend::MemPrimitives;
use tenure_core::testing::primitives::check_primitives;

#[tokio::test(start_paused = true)]
async fn the_in_memory_primitives_keep_the_primitive_contract() {
    check_primitives(Arc::new(MemPrimitives::new()), "prim").await;
}
