//! Randomness for ids and jitter, from std's per-process hash keys (which the operating
//! system seeds): nothing here is for secrets.

use std::cell::Cell;
use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicU64, Ordering};

/// A pseudo-random number in [0, 1), for jitter; not for anything secret.
pub fn random_unit() -> f64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(random_id()) | 1);
    }
    STATE.with(|s| {
        // xorshift64*
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    })
}

/// A 128-bit id that differs between calls, threads, processes and hosts: the
/// operating system's randomness (through std's hash keys), the time, the process id
/// and a process-wide counter. Used for session ids and protected node names.
pub fn random_id() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let seed = (std::process::id(), n, now);
    let a = RandomState::new().hash_one(seed);
    let b = RandomState::new().hash_one((seed, a));
    (u128::from(a) << 64) | u128::from(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_do_not_repeat() {
        let ids: std::collections::HashSet<u128> = (0..10_000).map(|_| random_id()).collect();
        assert_eq!(ids.len(), 10_000);
    }

    #[test]
    fn units_fall_in_zero_to_one_and_spread() {
        let xs: Vec<f64> = (0..10_000).map(|_| random_unit()).collect();
        assert!(xs.iter().all(|x| (0.0..1.0).contains(x)));
        let low = xs.iter().filter(|x| **x < 0.5).count();
        assert!((4_000..6_000).contains(&low), "{low} of 10,000 below 0.5");
    }
}
