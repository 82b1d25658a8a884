//! The shortest TTL that rides out a store's own leader failover, for backends to check
//! a session's timing against (contract: a store's hiccup must not cost a healthy
//! leader its seat; each store's README states its floor).

use std::sync::Mutex;
use std::time::Duration;

use crate::timing::Timing;

/// What a store's own leader failover asks of a session's timing, as measured on the
/// store at its production timing.
///
/// - `failover`: the longest a renewal went unanswered while the store replaced its
///   leader. A renewal sent just before the failure has `renew_deadline −
///   renew_interval` to be answered, so that must be at least this long.
/// - `sync_window`: how much earlier than a confirmed renewal's send the store may
///   count the session's last sign of life: how long a member cut off from its leader
///   may still confirm a renewal (a local read), or how late a member reports a
///   session's activity to the member that expires sessions (a ZooKeeper follower, at
///   the leader's next ping). `ttl − renew_deadline` must be at least this long, lest
///   the seat be granted elsewhere while the holder still counts itself leader.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailoverFloor {
    /// The longest a renewal went unanswered during the store's leader failover.
    pub failover: Duration,
    /// How much earlier than a confirmed renewal the store may count the session's
    /// last sign of life (zero if never).
    pub sync_window: Duration,
}

impl FailoverFloor {
    /// Whether `timing` rides the failover out.
    pub fn holds(&self, timing: &Timing) -> bool {
        let (room, margin) = Self::shares(timing);
        room >= self.failover && margin >= self.sync_window
    }

    /// The shortest TTL that rides the failover out with `timing`'s renewal shares
    /// (its interval and deadline as parts of its TTL); `None` if no TTL does (the
    /// deadline is not after the interval, or leaves no margin).
    pub fn shortest_ttl(&self, timing: &Timing) -> Option<f64> {
        let (room, margin) = Self::shares(timing);
        let ttl = timing.ttl.as_secs_f64();
        let (room_share, margin_share) = (room.as_secs_f64() / ttl, margin.as_secs_f64() / ttl);
        if room_share <= 0.0 || (margin_share <= 0.0 && !self.sync_window.is_zero()) {
            return None;
        }
        let by_room = self.failover.as_secs_f64() / room_share;
        let by_margin = if self.sync_window.is_zero() {
            0.0
        } else {
            self.sync_window.as_secs_f64() / margin_share
        };
        Some(by_room.max(by_margin))
    }

    /// Log `why` as a warning once per store and timing (a process opening many
    /// sessions with one timing is told once) if `timing` does not ride the failover
    /// out; `why` is given the shortest TTL for these shares ("none" if no TTL does).
    pub fn warn_below(&self, store: &'static str, timing: &Timing, why: impl Fn(&str) -> String) {
        if self.holds(timing) || !first_time(store, timing) {
            return;
        }
        let floor = self
            .shortest_ttl(timing)
            .map_or_else(|| "none".to_string(), |f| format!("{f:.1} s"));
        tracing::warn!(
            backend = store,
            ttl = ?timing.ttl,
            renew_interval = ?timing.renew_interval,
            renew_deadline = ?timing.renew_deadline,
            "{}",
            why(&floor)
        );
    }

    /// `renew_deadline − renew_interval` and `ttl − renew_deadline`.
    fn shares(timing: &Timing) -> (Duration, Duration) {
        (
            timing.renew_deadline.saturating_sub(timing.renew_interval),
            timing.ttl.saturating_sub(timing.renew_deadline),
        )
    }
}

/// Whether this store and timing were not warned about before (at most 64 remembered).
fn first_time(store: &'static str, timing: &Timing) -> bool {
    type Key = (&'static str, Duration, Duration, Duration);
    static WARNED: Mutex<Vec<Key>> = Mutex::new(Vec::new());
    let key = (
        store,
        timing.ttl,
        timing.renew_interval,
        timing.renew_deadline,
    );
    WARNED.lock().map_or(true, |mut warned| {
        let first = !warned.contains(&key);
        if first && warned.len() < 64 {
            warned.push(key);
        }
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floors_follow_the_shares() {
        let etcd = FailoverFloor {
            failover: Duration::from_millis(2550),
            sync_window: Duration::ZERO,
        };
        // The default shares: 13/16 of the TTL covers the failover.
        let t5 = Timing::from_ttl(Duration::from_secs(5));
        assert!(etcd.holds(&t5));
        let floor = etcd.shortest_ttl(&t5).unwrap();
        assert!((floor - 2.55 * 16.0 / 13.0).abs() < 0.01, "{floor}");
        // The shares before (every TTL/4, deadline TTL × 2/3): 5/12 of the TTL.
        let mut before = t5.clone();
        before.renew_interval = t5.ttl / 4;
        before.renew_deadline = t5.ttl * 2 / 3;
        assert!(!etcd.holds(&before));
        let floor = etcd.shortest_ttl(&before).unwrap();
        assert!((floor - 2.55 * 12.0 / 5.0).abs() < 0.01, "{floor}");
        // A window in which the store may still count a renewal the holder saw
        // confirmed as older than it is must fit in the TTL's last part: 4 s (a
        // ZooKeeper follower answering reads while cut off) in an eighth of it; 1 s
        // (its report lag to the leader) likewise.
        let zk = FailoverFloor {
            failover: Duration::from_millis(5840),
            sync_window: Duration::from_secs(4),
        };
        let floor = zk.shortest_ttl(&t5).unwrap();
        assert!((floor - 32.0).abs() < 0.01, "{floor}");
        let zk = FailoverFloor {
            sync_window: Duration::from_secs(1),
            ..zk
        };
        let floor = zk.shortest_ttl(&t5).unwrap();
        assert!((floor - 8.0).abs() < 0.01, "{floor}");
        assert!(!zk.holds(&Timing::from_ttl(Duration::from_secs(7))));
        assert!(zk.holds(&Timing::from_ttl(Duration::from_secs(8))));
        let mut bad = t5.clone();
        bad.renew_deadline = bad.renew_interval;
        assert_eq!(zk.shortest_ttl(&bad), None);
    }
}
