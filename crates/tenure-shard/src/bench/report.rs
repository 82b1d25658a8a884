//! The benchmark's results as text: a markdown table ([`markdown`]) and a log-log
//! SVG chart of the figures against the number of shards ([`scaling_svg`]).

use std::fmt::Write as _;
use std::time::Duration;

use super::run::BenchResult;

/// Min / median / max of `v` as "a / b / c ms".
pub fn min_med_max_ms(v: &[Duration]) -> String {
    let mut v = v.to_vec();
    v.sort();
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(a), Some(b), Some(c)) => format!(
            "{:.1} / {:.1} / {:.1} ms",
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            c.as_secs_f64() * 1e3
        ),
        _ => "-".to_string(),
    }
}

/// The results as one markdown table.
pub fn markdown(results: &[BenchResult]) -> String {
    let mut out = String::from(
        "| backend | shards | nodes | R | TTL | cold start | re-converge after crash | re-converge after join | join moves / optimum | max/mean leaders | drain (shards) | store requests/s (steady) | heap per shard |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {:?} | {:.2} s | {:.2} s | {:.2} s | {} / {} | {:.3} | {:.2} s ({}) | {:.1} | {} |",
            r.backend,
            r.shards,
            r.nodes,
            r.replication,
            r.ttl,
            r.cold.as_secs_f64(),
            r.crash.as_secs_f64(),
            r.join.as_secs_f64(),
            r.join_moves,
            r.join_optimum,
            r.imbalance,
            r.drain.as_secs_f64(),
            r.drained,
            r.steady_requests_per_sec,
            r.bytes_per_shard
                .map_or("-".to_string(), |b| format!("{:.0} B", b)),
        );
    }
    out
}

/// One figure of a result, for [`scaling_svg`].
type Figure = fn(&BenchResult) -> Duration;

/// The figures of `results` against the number of shards on log-log axes, as an SVG
/// chart: cold start, re-converge after a crash and after a join, and drain, one line
/// each per node count, with a slope-1 reference line (time proportional to shards)
/// through the first cold start. Results of one backend are meant.
pub fn scaling_svg(results: &[BenchResult]) -> String {
    const W: f64 = 780.0;
    const H: f64 = 440.0;
    // Margins: left, right (the legend), top, bottom.
    const L: f64 = 70.0;
    const R: f64 = 230.0;
    const T: f64 = 30.0;
    const B: f64 = 50.0;
    let series: [(&str, &str, Figure); 4] = [
        ("cold start", "#1f77b4", |r| r.cold),
        ("after a crash", "#d62728", |r| r.crash),
        ("after a join", "#2ca02c", |r| r.join),
        ("drain of a node", "#9467bd", |r| r.drain),
    ];
    let secs = |d: Duration| d.as_secs_f64().max(1e-3);
    let xs: Vec<f64> = results.iter().map(|r| (r.shards as f64).log10()).collect();
    let ys: Vec<f64> = results
        .iter()
        .flat_map(|r| series.iter().map(move |(_, _, f)| secs(f(r)).log10()))
        .collect();
    let bounds = |v: &[f64]| {
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min).floor();
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil();
        if lo.is_finite() && hi.is_finite() {
            (lo, hi.max(lo + 1.0))
        } else {
            (0.0, 1.0)
        }
    };
    let ((x0, x1), (y0, y1)) = (bounds(&xs), bounds(&ys));
    let px = |x: f64| L + (x - x0) / (x1 - x0) * (W - L - R);
    let py = |y: f64| H - B - (y - y0) / (y1 - y0) * (H - T - B);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">
<rect width="{W}" height="{H}" fill="white"/>
<text x="{L}" y="18" font-size="14">Shard manager: time against shards (log-log); a crash's time includes the session TTL</text>
"#
    );
    for e in x0 as i32..=x1 as i32 {
        let x = px(f64::from(e));
        let _ = writeln!(
            out,
            r##"<line x1="{x:.1}" y1="{T}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">10^{e}</text>"##,
            H - B,
            H - B + 16.0
        );
    }
    for e in y0 as i32..=y1 as i32 {
        let y = py(f64::from(e));
        let label = match e {
            e if e < 0 => format!("{} ms", 10f64.powi(e + 3)),
            e => format!("{} s", 10f64.powi(e)),
        };
        let _ = writeln!(
            out,
            r##"<line x1="{L}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{label}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">shards</text>"#,
        (L + W - R) / 2.0,
        H - 12.0
    );
    // Slope 1 through the first cold start, clipped to the plot.
    if let Some(first) = results.first() {
        let (xa, ya) = ((first.shards as f64).log10(), secs(first.cold).log10());
        let xb = x1.min(xa + (y1 - ya));
        let _ = writeln!(
            out,
            r##"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#888" stroke-dasharray="5,4"/>"##,
            px(xa),
            py(ya),
            px(xb),
            py(ya + (xb - xa))
        );
    }
    let mut node_counts: Vec<usize> = results.iter().map(|r| r.nodes).collect();
    node_counts.sort_unstable();
    node_counts.dedup();
    let mut legend = 0;
    for (name, color, f) in series {
        for &n in &node_counts {
            let points: Vec<(f64, f64)> = results
                .iter()
                .filter(|r| r.nodes == n)
                .map(|r| (px((r.shards as f64).log10()), py(secs(f(r)).log10())))
                .collect();
            let dash = if n == node_counts[0] {
                ""
            } else {
                r#" stroke-dasharray="2,3""#
            };
            let line: Vec<String> = points
                .iter()
                .map(|(x, y)| format!("{x:.1},{y:.1}"))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                line.join(" ")
            );
            for (x, y) in &points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"#
                );
            }
            let ly = T + 10.0 + 18.0 * f64::from(legend);
            legend += 1;
            let _ = writeln!(
                out,
                r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/><text x="{:.1}" y="{:.1}">{name}, {n} nodes</text>"#,
                W - R + 10.0,
                W - R + 30.0,
                W - R + 36.0,
                ly + 4.0
            );
        }
    }
    let ly = T + 10.0 + 18.0 * f64::from(legend);
    let _ = writeln!(
        out,
        r##"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="#888" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}">slope 1 (linear)</text>"##,
        W - R + 10.0,
        W - R + 30.0,
        W - R + 36.0,
        ly + 4.0
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(shards: usize, nodes: usize, secs: f64) -> BenchResult {
        let d = Duration::from_secs_f64(secs);
        BenchResult {
            backend: "mem".into(),
            shards,
            nodes,
            replication: 3,
            ttl: Duration::from_secs(2),
            cold: d,
            crash: d * 2,
            join: d / 2,
            join_moves: 0,
            join_optimum: 0,
            imbalance: 1.0,
            drain: d / 4,
            drained: 0,
            steady_requests_per_sec: 0.0,
            bytes_per_shard: None,
        }
    }

    #[test]
    fn the_scaling_chart_has_a_line_per_figure_and_node_count() {
        let results = [
            result(1_000, 10, 0.1),
            result(10_000, 10, 0.3),
            result(100_000, 10, 2.0),
            result(100_000, 100, 4.0),
        ];
        let svg = scaling_svg(&results);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        // Four figures, each for 10 and for 100 nodes.
        assert_eq!(svg.matches("<polyline").count(), 8);
        assert_eq!(svg.matches("<circle").count(), 4 * results.len());
        assert!(svg.contains("slope 1"));
        for label in ["10^3", "10^5", "100 ms", "1 s", "10 s"] {
            assert!(svg.contains(label), "missing axis label {label}");
        }
        // Every coordinate is a number inside the canvas.
        for cap in svg.split("cx=\"").skip(1) {
            let x: f64 = cap.split('"').next().unwrap().parse().unwrap();
            assert!((0.0..=780.0).contains(&x), "{x}");
        }
    }
}
