//! Session timing validation on arbitrary durations: never a panic (no overflow in the
//! checks), and whatever passes keeps renew interval < renew deadline < TTL.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tenure_core::Timing;

fuzz_target!(|input: [(u64, u32); 4]| {
    let d = |(secs, nanos): (u64, u32)| Duration::new(secs, nanos % 1_000_000_000);
    let mut t = Timing::from_ttl(d(input[0]));
    t.renew_interval = d(input[1]);
    t.renew_deadline = d(input[2]);
    t.connect_timeout = d(input[3]);
    if t.validate().is_ok() {
        assert!(t.renew_deadline < t.ttl, "{t:?}");
        assert!(t.renew_interval < t.renew_deadline, "{t:?}");
    }
});
