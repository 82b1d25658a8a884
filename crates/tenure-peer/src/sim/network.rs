//! The simulated network's model: delays and random loss.

use std::time::Duration;

/// How the simulated network behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Network {
    /// Shortest one-way delay. Default 1 ms; keep it above zero so that a
    /// reply always comes strictly after its request.
    pub min_delay: Duration,
    /// Longest one-way delay. Default 10 ms.
    pub max_delay: Duration,
    /// Messages lost silently at random, per million. Default 0.
    pub loss_per_million: u32,
}

impl Default for Network {
    fn default() -> Self {
        Network {
            min_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(10),
            loss_per_million: 0,
        }
    }
}
