//! Small structures of the controller's bookkeeping: maps keyed by shard, sets of
//! shards to look at again or to count, and the token bucket that paces handoffs.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;

use tokio::time::Instant;

use crate::state::ShardSet;

/// Hashes a shard index with one multiplication: SipHash over the controller's maps
/// was a third of its time at 40,000 shards.
#[derive(Default)]
pub(super) struct ShardHasher(u64);

impl std::hash::Hasher for ShardHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A map keyed by shard index.
pub(super) type ByShard<V> = HashMap<usize, V, BuildHasherDefault<ShardHasher>>;

/// Shards to look at again: each marked once, or all of them.
pub(super) struct Dirty {
    all: bool,
    marked: ShardSet,
    list: Vec<usize>,
    shards: usize,
}

impl Dirty {
    pub(super) fn all(shards: usize) -> Self {
        Dirty {
            all: true,
            marked: ShardSet::new(shards),
            list: Vec::new(),
            shards,
        }
    }

    pub(super) fn mark(&mut self, s: usize) {
        if !self.all && !self.marked.contains(s) {
            self.marked.set(s, true);
            self.list.push(s);
        }
    }

    pub(super) fn mark_all(&mut self) {
        self.all = true;
    }

    /// Move `other`'s marks into this one.
    pub(super) fn absorb(&mut self, other: &mut Dirty) {
        if other.all {
            self.all = true;
        }
        for s in other.take() {
            self.mark(s);
        }
    }

    /// The marked shards (every shard after `mark_all`), clearing the marks.
    pub(super) fn take(&mut self) -> Vec<usize> {
        for &s in &self.list {
            self.marked.set(s, false);
        }
        if std::mem::take(&mut self.all) {
            self.list.clear();
            (0..self.shards).collect()
        } else {
            std::mem::take(&mut self.list)
        }
    }
}

/// A set of shards with its size.
pub(super) struct Counted {
    set: ShardSet,
    pub(super) count: usize,
}

impl Counted {
    pub(super) fn new(shards: usize) -> Self {
        Counted {
            set: ShardSet::new(shards),
            count: 0,
        }
    }

    pub(super) fn set(&mut self, s: usize, on: bool) {
        if self.set.contains(s) != on {
            self.set.set(s, on);
            if on {
                self.count += 1;
            } else {
                self.count -= 1;
            }
        }
    }
}

/// A token bucket for handoffs.
pub(super) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub(super) fn new(rate: f64, burst: u32) -> Self {
        Bucket {
            rate,
            burst: f64::from(burst),
            tokens: f64::from(burst),
            at: Instant::now(),
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        self.tokens = (self.tokens + (now - self.at).as_secs_f64() * self.rate).min(self.burst);
        self.at = now;
    }

    pub(super) fn take(&mut self) -> bool {
        self.refill();
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// When the next token is there.
    pub(super) fn next(&self) -> Instant {
        let missing = (1.0 - self.tokens).max(0.0);
        self.at + Duration::from_secs_f64(missing / self.rate)
    }
}
