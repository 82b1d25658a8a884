//! CLOCK_MONOTONIC timestamps, comparable between processes on one machine.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// Nanoseconds of CLOCK_MONOTONIC now.
pub fn monotonic_now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC is always
    // available on Linux; clock_gettime writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// CLOCK_MONOTONIC nanoseconds of a tokio `Instant` (which runs on CLOCK_MONOTONIC too),
/// through a pair of readings taken once per process.
pub fn mono_ns(at: Instant) -> u64 {
    static BASE: OnceLock<(Instant, u64)> = OnceLock::new();
    let (base, base_ns) = *BASE.get_or_init(|| (Instant::now(), monotonic_now_ns()));
    if at >= base {
        base_ns.saturating_add(duration_ns(at - base))
    } else {
        base_ns.saturating_sub(duration_ns(base - at))
    }
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_map_onto_the_monotonic_clock() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let before = monotonic_now_ns();
            let at = mono_ns(Instant::now());
            let after = monotonic_now_ns();
            assert!(
                before <= at + 1_000_000 && at <= after + 1_000_000,
                "{before} {at} {after}"
            );
            let later = mono_ns(Instant::now() + Duration::from_secs(1));
            assert!(later >= at + 999_000_000);
        });
    }
}
