#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        clippy::indexing_slicing
    )
)]

mod backend;
mod bully;
mod candidate;
mod config;
mod heartbeat;
mod invitation;
mod machine;
mod message;
mod quorum;
mod ring;
mod types;

pub mod sim;
pub mod transport;

mod node;
pub mod wire;

pub use backend::{PeerAlgorithm, PeerBackend, PeerConfig, PEER_SCHEME};
pub use bully::{Bully, NextInLine, DEFAULT_ALTERNATIVES};
pub use candidate::CandidateOrdinary;
pub use config::{Config, ConfigError, Timing, MAX_MEMBERS};
pub use heartbeat::Heartbeat;
pub use invitation::Invitation;
pub use machine::ElectionAlgorithm;
pub use message::{Message, MessageKind};
pub use node::PeerNode;
pub use quorum::{QuorumGuard, INTEREST_FADES_AFTER};
pub use ring::{Ring, RingVariant};
pub use types::{Durable, Event, Instant, Leader, PeerId};

/// How `tenure::connect` opens this backend from a URL (its schemes and constructor).
pub const DRIVER: tenure_core::backend::Driver =
    tenure_core::backend::Driver::new(&[PEER_SCHEME], |url| {
        Box::pin(async move {
            Ok(std::sync::Arc::new(PeerBackend::connect(url).await?) as tenure_core::DynBackend)
        })
    });

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync + 'static>() {}

    #[test]
    fn machines_can_move_across_threads() {
        assert_send_sync::<Bully>();
        assert_send_sync::<NextInLine>();
        assert_send_sync::<CandidateOrdinary>();
        assert_send_sync::<Invitation>();
        assert_send_sync::<Ring>();
        assert_send_sync::<QuorumGuard<Heartbeat<Bully>>>();
        assert_send_sync::<Message>();
    }
}
