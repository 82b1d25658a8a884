//! The one timing configuration, validated once.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::random::random_unit;

/// The share of the TTL kept free between the renew deadline and the TTL, to absorb
/// clock-rate differences between this process and the store (5 %).
pub const CLOCK_DRIFT_MARGIN: f64 = 0.05;

/// The default [`Timing::step_down_grace`]: 10 s, the runner's default task grace.
pub const DEFAULT_STEP_DOWN_GRACE: Duration = Duration::from_secs(10);

/// How a session keeps itself alive and how campaigns retry.
///
/// | field | default | meaning |
/// |---|---|---|
/// | `ttl` | 10 s | how long the store keeps the session without hearing from it |
/// | `renew_interval` | TTL / 16 (625 ms) | how often the core renews the session (one request per session, however many seats it holds) |
/// | `renew_deadline` | TTL × 7/8 (8.75 s) | a leadership is valid until the send time of the last confirmed renewal plus this; past it the lost signal fires |
/// | `connect_timeout` | 5 s | the longest any single store request may take before it fails with `Timeout` (a batch of seats: this much per round trip it needs) |
/// | `retry` | 50 ms doubling to 1 s, ±20 % jitter | back-off between failed store requests and between polls |
/// | `step_down_grace` | 10 s | how long a holder asked to step down (contract clause 15: its own shutdown, a preemption, a handover, a shard handoff) keeps the seat, held and renewed, while its work stops; at the grace the seat is released whether or not the work acknowledged |
///
/// Rules (checked by [`Timing::validate`], errors name the field): every duration > 0;
/// `renew_interval < renew_deadline`; `renew_deadline ≤ ttl × (1 − CLOCK_DRIFT_MARGIN)`;
/// retry `initial ≤ max`, `multiplier ≥ 1`, `jitter` in [0, 1].
///
/// Why these shares: a renewal sent just before the store stops answering is the last
/// confirmed one, so `renew_deadline − renew_interval` (here 13/16 of the TTL) is what a
/// store's own leader failover may take without costing a healthy leader its seat; the
/// TTL's last eighth keeps the clock-drift margin and what a store needs after a
/// confirmed renewal (a ZooKeeper follower reports its sessions' activity to the leader
/// only every `tickTime` / 2). Measured failovers at the stores'
/// production timing (`integration/examples/store_failover.rs`) and the shortest TTL
/// they allow are in each store's README ([`FailoverFloor`](crate::backend::FailoverFloor)).
///
/// Build one with [`Timing::from_ttl`] and change fields, or with a struct literal ending
/// in `..Timing::default()`.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    /// Session time-to-live in the store.
    pub ttl: Duration,
    /// Time between renewals.
    pub renew_interval: Duration,
    /// Validity of a leadership after the last confirmed renewal was sent.
    pub renew_deadline: Duration,
    /// Limit for connecting and for any single store request.
    pub connect_timeout: Duration,
    /// Back-off between retries.
    pub retry: Retry,
    /// How long a planned step-down may take before the seat is released anyway.
    pub step_down_grace: Duration,
}

/// Exponential back-off with jitter.
#[derive(Clone, Debug, PartialEq)]
pub struct Retry {
    /// First delay.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Factor applied after each failure.
    pub multiplier: f64,
    /// Fraction of the delay randomised in both directions (0.2 = ±20 %).
    pub jitter: f64,
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            initial: Duration::from_millis(50),
            max: Duration::from_secs(1),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

impl Default for Timing {
    fn default() -> Self {
        Timing::from_ttl(Duration::from_secs(10))
    }
}

impl Timing {
    /// Defaults derived from `ttl`: renew every TTL/16, renew deadline TTL × 7/8, 5 s
    /// connect timeout, default retry, 10 s step-down grace.
    pub fn from_ttl(ttl: Duration) -> Self {
        Timing {
            ttl,
            renew_interval: ttl / 16,
            // ×7 first keeps the usual rounding; a TTL too large to multiply (fuzzing
            // found `ttl * 2` panicking) divides first instead.
            renew_deadline: ttl.checked_mul(7).map_or(ttl / 8 * 7, |d| d / 8),
            connect_timeout: Duration::from_secs(5),
            retry: Retry::default(),
            step_down_grace: DEFAULT_STEP_DOWN_GRACE,
        }
    }

    /// Check the rules; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        let positive = |name: &str, d: Duration| {
            if d.is_zero() {
                Err(Error::invalid(format!("{name}: must be greater than zero")))
            } else {
                Ok(())
            }
        };
        positive("ttl", self.ttl)?;
        positive("renew_interval", self.renew_interval)?;
        positive("renew_deadline", self.renew_deadline)?;
        positive("connect_timeout", self.connect_timeout)?;
        positive("retry.initial", self.retry.initial)?;
        positive("step_down_grace", self.step_down_grace)?;
        if self.renew_deadline >= self.ttl {
            return Err(Error::invalid(format!(
                "renew_deadline: {:?} must be below ttl {:?}",
                self.renew_deadline, self.ttl
            )));
        }
        let max_deadline = self.ttl.mul_f64(1.0 - CLOCK_DRIFT_MARGIN);
        if self.renew_deadline > max_deadline {
            return Err(Error::invalid(format!(
                "renew_deadline: {:?} leaves no margin for clock drift; at most {:?} (ttl × {})",
                self.renew_deadline,
                max_deadline,
                1.0 - CLOCK_DRIFT_MARGIN
            )));
        }
        if self.renew_interval >= self.ttl {
            return Err(Error::invalid(format!(
                "renew_interval: {:?} must be below ttl {:?}",
                self.renew_interval, self.ttl
            )));
        }
        if self.renew_interval >= self.renew_deadline {
            return Err(Error::invalid(format!(
                "renew_interval: {:?} must be below renew_deadline {:?}",
                self.renew_interval, self.renew_deadline
            )));
        }
        if self.retry.max < self.retry.initial {
            return Err(Error::invalid(format!(
                "retry.max: {:?} must be at least retry.initial {:?}",
                self.retry.max, self.retry.initial
            )));
        }
        if !(self.retry.multiplier >= 1.0 && self.retry.multiplier.is_finite()) {
            return Err(Error::invalid(format!(
                "retry.multiplier: {} must be a finite number ≥ 1",
                self.retry.multiplier
            )));
        }
        if !(0.0..=1.0).contains(&self.retry.jitter) {
            return Err(Error::invalid(format!(
                "retry.jitter: {} must be between 0 and 1",
                self.retry.jitter
            )));
        }
        Ok(())
    }
}

impl Retry {
    /// The delay before retry number `attempt` (0-based), with jitter applied.
    pub fn delay(&self, attempt: u32) -> Duration {
        let base = self.initial.as_secs_f64() * self.multiplier.powi(attempt.min(64) as i32);
        let capped = base.min(self.max.as_secs_f64());
        let factor = 1.0 + self.jitter * (2.0 * random_unit() - 1.0);
        Duration::from_secs_f64((capped * factor).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn from_ttl_takes_any_duration_without_panicking() {
        // Found by the `timing` fuzz target: `ttl * 2` overflowed.
        for ttl in [
            Duration::MAX,
            Duration::new(u64::MAX / 2 + 1, 0),
            Duration::ZERO,
        ] {
            let t = Timing::from_ttl(ttl);
            assert!(t.renew_deadline <= ttl && t.renew_interval <= t.renew_deadline);
            let _ = t.validate();
        }
        let t = Timing::from_ttl(Duration::from_secs(2));
        assert_eq!(t.renew_deadline, Duration::from_millis(1750));
        assert_eq!(t.renew_interval, Duration::from_millis(125));
    }

    fn err(t: Timing) -> String {
        let e = t.validate().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        e.message().to_string()
    }

    #[test]
    fn defaults_are_valid() {
        Timing::default().validate().unwrap();
        Timing::from_ttl(Duration::from_millis(300))
            .validate()
            .unwrap();
        let t = Timing::default();
        assert_eq!(t.renew_interval, Duration::from_millis(625));
        assert_eq!(t.renew_deadline, Duration::from_millis(8750));
        // The default deadline keeps the clock-drift margin, at any TTL.
        for ms in [1, 7, 100, 1000, 7000, 60_000, 86_400_000] {
            Timing::from_ttl(Duration::from_millis(ms))
                .validate()
                .unwrap();
        }
        let margin = (t.ttl - t.renew_deadline).as_secs_f64() / t.ttl.as_secs_f64();
        assert!(margin > CLOCK_DRIFT_MARGIN, "{margin}");
    }

    #[test]
    #[allow(clippy::field_reassign_with_default)]
    fn bad_timings_name_the_field() {
        let mut t = Timing::default();
        t.ttl = Duration::ZERO;
        assert!(err(t).starts_with("ttl"));
        let mut t = Timing::default();
        t.renew_interval = t.ttl;
        assert!(err(t).starts_with("renew_interval"));
        let mut t = Timing::default();
        t.renew_deadline = t.ttl;
        assert!(err(t).starts_with("renew_deadline"));
        let mut t = Timing::default();
        t.renew_deadline = t.ttl.mul_f64(0.99);
        assert!(err(t).contains("clock drift"));
        let mut t = Timing::default();
        t.renew_interval = t.renew_deadline;
        assert!(err(t).starts_with("renew_interval"));
        let mut t = Timing::default();
        t.connect_timeout = Duration::ZERO;
        assert!(err(t).starts_with("connect_timeout"));
        let mut t = Timing::default();
        t.retry.jitter = 1.5;
        assert!(err(t).starts_with("retry.jitter"));
        let mut t = Timing::default();
        t.retry.multiplier = f64::NAN;
        assert!(err(t).starts_with("retry.multiplier"));
        let mut t = Timing::default();
        t.retry.max = Duration::from_millis(1);
        assert!(err(t).starts_with("retry.max"));
        let mut t = Timing::default();
        t.step_down_grace = Duration::ZERO;
        assert!(err(t).starts_with("step_down_grace"));
    }

    #[test]
    fn backoff_grows_to_the_cap_within_jitter() {
        let r = Retry::default();
        for attempt in 0..20 {
            let d = r.delay(attempt).as_secs_f64();
            let base = (0.05 * 2f64.powi(attempt as i32)).min(1.0);
            assert!(
                d >= base * 0.8 - 1e-9 && d <= base * 1.2 + 1e-9,
                "{attempt}: {d}"
            );
        }
    }
}
