//! Load figures: the one-byte codes they are published as ([`quantize`], [`level`]),
//! the reporters' deadband ([`republish`]), Zipf figures for demos and benchmarks,
//! and the lower bound of max/mean that no placement beats.

/// The first level above 0, in thousandths of the unit (0.01).
const FIRST_LEVEL: u64 = 10;

/// The level of each code (thousandths of the unit): 0, then 0.01 growing by 8% a
/// step (integer arithmetic, so every platform has the same table).
fn levels() -> &'static [u64; 256] {
    static LEVELS: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    LEVELS.get_or_init(|| {
        let mut t = [0u64; 256];
        t[1] = FIRST_LEVEL;
        for k in 2..256 {
            t[k] = t[k - 1] + (t[k - 1] * 8 / 100).max(1);
        }
        t
    })
}

/// The one-byte code of a load figure: the level nearest to it on the log scale
/// (negative, NaN and 0 are 0; figures above the top level are the top level).
pub fn quantize(load: f64) -> u8 {
    if load.is_nan() || load <= 0.0 {
        return 0;
    }
    let milli = load * 1000.0;
    let t = levels();
    if milli <= t[1] as f64 {
        return if milli < t[1] as f64 / 2.0 { 0 } else { 1 };
    }
    // The first level at or above, then whichever neighbour is nearer in ratio.
    let above = t.partition_point(|&l| (l as f64) < milli).min(255);
    if above <= 1 {
        return above as u8;
    }
    let (lo, hi) = (t[above - 1] as f64, t[above] as f64);
    if milli / lo < hi / milli {
        (above - 1) as u8
    } else {
        above as u8
    }
}

/// The factor by which a reported load must differ from the published one before it
/// is published again ([`republish`]).
pub const DEADBAND: f64 = 1.5;

/// The code to publish for a shard whose published code is `published` when `load`
/// is reported: `None` while the report is within a factor `deadband` of the
/// published figure (both ways), else the report's code.
pub fn republish(published: u8, load: f64, deadband: f64) -> Option<u8> {
    let code = quantize(load);
    let (now, was) = (level(code) as f64, level(published) as f64);
    let within = if was == 0.0 || now == 0.0 {
        code == published
    } else {
        now <= was * deadband && was <= now * deadband
    };
    (!within).then_some(code)
}

/// The load a code stands for, in thousandths of the unit.
pub fn level(code: u8) -> u64 {
    levels()[code as usize]
}

/// Zipf-distributed figures for `p` shards, as demos and benchmarks use: the hottest
/// is 1000, the one of rank k (from 1) 1000 / k^`exponent`, ranks shuffled over the
/// shards by hash so that heat does not follow the shard order.
pub fn zipf(p: usize, exponent: f64) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p).collect();
    order.sort_by_key(|i| crate::hash::key_hash(&format!("rank/{i}")));
    let mut figures = vec![0.0; p];
    for (rank, shard) in order.into_iter().enumerate() {
        figures[shard] = 1000.0 / ((rank + 1) as f64).powf(exponent);
    }
    figures
}

/// max(1, largest load ÷ mean node load) over `active` nodes of equal capacity: no
/// placement of these loads has a lower max/mean.
pub fn lower_bound(loads: &[u64], nodes: usize) -> f64 {
    let total: u64 = loads.iter().sum();
    let largest = loads.iter().copied().max().unwrap_or(0);
    if total == 0 || nodes == 0 {
        return 1.0;
    }
    (largest as f64 * nodes as f64 / total as f64).max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_figure_within_four_percent_and_keep_the_order() {
        assert_eq!(quantize(0.0), 0);
        assert_eq!(quantize(-3.0), 0);
        assert_eq!(quantize(f64::NAN), 0);
        assert_eq!(quantize(0.001), 0);
        assert_eq!(level(0), 0);
        let mut last = 0;
        let mut x = 0.01;
        while x < 2e6 {
            let c = quantize(x);
            assert!(c >= last, "{x}: code {c} after {last}");
            last = c;
            let back = level(c) as f64 / 1000.0;
            assert!((back / x - 1.0).abs() <= 0.045, "{x} -> {c} -> {back}");
            x *= 1.013;
        }
        assert_eq!(quantize(1e12), 255);
    }

    #[test]
    fn a_report_within_the_deadband_is_not_published() {
        let published = quantize(100.0);
        for jitter in [0.8, 0.9, 1.0, 1.1, 1.2] {
            assert_eq!(republish(published, 100.0 * jitter, DEADBAND), None);
        }
        assert_eq!(
            republish(published, 1000.0, DEADBAND),
            Some(quantize(1000.0))
        );
        assert_eq!(republish(published, 10.0, DEADBAND), Some(quantize(10.0)));
        assert_eq!(republish(published, 0.0, DEADBAND), Some(0));
        assert_eq!(republish(0, 0.0, DEADBAND), None);
        assert_eq!(republish(0, 5.0, DEADBAND), Some(quantize(5.0)));
    }
}
