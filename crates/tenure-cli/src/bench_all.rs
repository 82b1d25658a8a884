//! `tenure bench`: the latency figures of every given backend and the shard manager's
//! figures in one run, as one Markdown table (with the machine and the TTLs) and an SVG
//! chart of the latency distributions.
//!
//! The measuring is [`crate::bench::bench_backend`] (election handover and failover)
//! and [`tenure::shard::bench::run`] (the shard manager's cold start, crash, join and
//! quiet stretch); this module only runs them and draws the results.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use tenure::{DynBackend, Error, ErrorKind, Result, Timing};

use crate::bench::{bench_backend, show_duration, BenchOptions, BenchTable, Figure};

/// One backend to measure.
#[derive(Debug, Clone)]
pub struct Target {
    /// Short name (mem, etcd, redis, zookeeper, azure).
    pub name: String,
    /// URL to connect to.
    pub url: String,
    /// Session timing for this backend (Azure leases need a TTL of 15 to 60 s).
    pub timing: Timing,
    /// Whether to run the shard manager's benchmark on it too.
    pub shards: bool,
}

/// What `tenure bench` runs.
#[derive(Debug, Clone)]
pub struct BenchPlan {
    /// The backends, in order.
    pub targets: Vec<Target>,
    /// Graceful handovers per backend.
    pub handover_runs: usize,
    /// Crash failovers per backend.
    pub failover_runs: usize,
    /// Shard manager benchmark: shards, nodes, replication, quiet stretch.
    pub shard_config: Option<tenure::shard::bench::BenchConfig>,
}

/// The outcome for one backend.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The backend.
    pub target: Target,
    /// Its figures, or why there are none.
    pub result: std::result::Result<BenchTable, String>,
    /// The shard manager's figures, if asked for.
    pub shards: Option<std::result::Result<tenure::shard::bench::BenchResult, String>>,
}

/// Where the numbers were measured.
#[derive(Debug, Clone)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// Operating system and kernel.
    pub os: String,
}

impl Machine {
    /// This machine, from /proc and /etc/os-release (fields unknown elsewhere).
    pub fn detect() -> Machine {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".to_string());
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0);
        let distro = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                    .map(|v| v.trim_matches('"').to_string())
            })
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|k| format!(", kernel {}", k.trim()))
            .unwrap_or_default();
        Machine {
            cpu,
            cores,
            os: format!("{distro}{kernel}"),
        }
    }
}

impl std::fmt::Display for Machine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, {} cores, {}", self.cpu, self.cores, self.os)
    }
}

async fn limited<T>(limit: Duration, what: &str, f: impl Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("{what}: no answer within {limit:?}"),
        )),
    }
}

/// Run the plan; `progress` gets a line as each backend starts and ends.
pub async fn run(plan: &BenchPlan, progress: &(dyn Fn(String) + Sync)) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for target in &plan.targets {
        progress(format!("{}: measuring {}", target.name, target.url));
        let limit = target.timing.connect_timeout;
        let backend: std::result::Result<DynBackend, String> =
            limited(limit, "connect", tenure::connect(&target.url))
                .await
                .map_err(|e| format!("not reachable: {e}"));
        let result = match backend {
            Err(e) => Err(e),
            Ok(backend) => {
                let options = BenchOptions {
                    handover_runs: plan.handover_runs,
                    failover_runs: plan.failover_runs,
                    timing: target.timing.clone(),
                    prefix: format!("tenure-bench-{}", std::process::id()),
                };
                bench_backend(backend, &target.name, &options)
                    .await
                    .map_err(|e| format!("failed: {e}"))
            }
        };
        let shards = match (&plan.shard_config, &result) {
            (Some(cfg), Ok(_)) if target.shards => {
                progress(format!("{}: shard manager benchmark", target.name));
                let mut cfg = cfg.clone();
                cfg.timing = target.timing.clone();
                let url = target.url.clone();
                let connect = move || {
                    let url = url.clone();
                    async move { tenure::connect(&url).await }
                };
                let r = tenure::shard::bench::run(&target.name, connect, &cfg, None)
                    .await
                    .map_err(|e| format!("failed: {e}"));
                Some(r)
            }
            _ => None,
        };
        match &result {
            Ok(_) => progress(format!("{}: done", target.name)),
            Err(e) => progress(format!("{}: {e}", target.name)),
        }
        outcomes.push(Outcome {
            target: target.clone(),
            result,
            shards,
        });
    }
    outcomes
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '|'], " ")
}

/// The single Markdown table of all outcomes, headed by the machine.
pub fn markdown(outcomes: &[Outcome], machine: &Machine, command: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Measured with `{command}` on {machine}");
    let _ = writeln!(
        s,
        "({} build; every backend on loopback unless its URL says otherwise).",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| backend | figure | runs | min | median | max | conditions |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---|");
    for o in outcomes {
        let t = &o.target.timing;
        let ttl = format!(
            "TTL {}, renew every {}, deadline {}",
            show_duration(Some(t.ttl)),
            show_duration(Some(t.renew_interval)),
            show_duration(Some(t.renew_deadline))
        );
        match &o.result {
            Err(e) => {
                let _ = writeln!(
                    s,
                    "| {} | {} | – | – | – | – | {} |",
                    o.target.name,
                    one_line(e),
                    one_line(&o.target.url)
                );
            }
            Ok(table) => {
                for fig in &table.figures {
                    let note = if fig.note.starts_with("TTL") {
                        ttl.clone()
                    } else {
                        format!("{}; {ttl}", fig.note)
                    };
                    let _ = writeln!(
                        s,
                        "| {} | {} | {} | {} | {} | {} | {} |",
                        o.target.name,
                        fig.name,
                        fig.samples.len(),
                        show_duration(fig.min()),
                        show_duration(fig.median()),
                        show_duration(fig.max()),
                        note
                    );
                }
            }
        }
        match &o.shards {
            None => {}
            Some(Err(e)) => {
                let _ = writeln!(
                    s,
                    "| {} | shard manager: {} | – | – | – | – | |",
                    o.target.name,
                    one_line(e)
                );
            }
            Some(Ok(r)) => {
                let setup = format!(
                    "{} shards, {} nodes, replication {}, TTL {}",
                    r.shards,
                    r.nodes,
                    r.replication,
                    show_duration(Some(r.ttl))
                );
                for (name, d, extra) in [
                    ("shard manager: cold start to settled", r.cold, String::new()),
                    (
                        "shard manager: crash of a node to settled",
                        r.crash,
                        String::new(),
                    ),
                    (
                        "shard manager: join of a node to settled",
                        r.join,
                        format!(
                            "; {} moves, optimum {}; imbalance {:.3}; {:.0} store requests/s when quiet",
                            r.join_moves, r.join_optimum, r.imbalance, r.steady_requests_per_sec
                        ),
                    ),
                ] {
                    let v = show_duration(Some(d));
                    let _ = writeln!(
                        s,
                        "| {} | {name} | 1 | {v} | {v} | {v} | {setup}{extra} |",
                        o.target.name
                    );
                }
            }
        }
    }
    s
}

/// The latency distributions as an SVG strip-and-box plot: one row per backend and
/// figure, a logarithmic time axis, every sample a dot, the box from the lower to the
/// upper quartile with the median marked, whiskers from min to max.
pub fn svg(outcomes: &[Outcome], machine: &Machine) -> String {
    struct Row<'a> {
        label: String,
        figure: Option<&'a Figure>,
        error: Option<String>,
        color: &'static str,
    }
    let colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
    let mut rows: Vec<Row> = Vec::new();
    for o in outcomes {
        match &o.result {
            Ok(t) => {
                for (i, f) in t.figures.iter().enumerate() {
                    let short = f.name.split(" (").next().unwrap_or(&f.name);
                    rows.push(Row {
                        label: format!("{}: {short}", o.target.name),
                        figure: Some(f),
                        error: None,
                        color: colors[i % colors.len()],
                    });
                }
            }
            Err(e) => rows.push(Row {
                label: o.target.name.clone(),
                figure: None,
                error: Some(e.clone()),
                color: "#777",
            }),
        }
    }
    let all: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.figure)
        .flat_map(|f| f.samples.iter().map(|d| d.as_secs_f64().max(1e-6)))
        .collect();
    let (min, max) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(min, max), &v| {
            (min.min(v), max.max(v))
        });
    let (lo, hi) = (min.log10().floor(), max.log10().ceil());
    let (lo, hi) = if lo.is_finite() && hi.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (-4.0, 1.0)
    };
    let (left, width, row_h, top) = (300.0, 600.0, 30.0, 60.0);
    let height = top + row_h * rows.len() as f64 + 60.0;
    let x = |secs: f64| left + (secs.max(1e-6).log10() - lo) / (hi - lo) * width;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{}" height="{height}" font-family="sans-serif" font-size="12">"#,
        left + width + 40.0
    );
    let _ = writeln!(
        s,
        r##"<rect width="100%" height="100%" fill="white"/><text x="10" y="22" font-size="15" font-weight="bold">tenure bench: handover and failover latency per backend</text><text x="10" y="42" fill="#555">{}</text>"##,
        xml(&machine.to_string())
    );
    let axis_y = top + row_h * rows.len() as f64 + 10.0;
    let mut e = lo as i32;
    while e as f64 <= hi {
        let px = x(10f64.powi(e));
        let label = match e {
            ..=-4 => format!("{} µs", 10f64.powi(e + 6).round()),
            -3..=-1 => format!("{} ms", 10f64.powi(e + 3).round()),
            _ => format!("{} s", 10f64.powi(e).round()),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{axis_y}" stroke="#ddd"/><text x="{px:.1}" y="{:.1}" text-anchor="middle" fill="#333">{label}</text>"##,
            axis_y + 16.0
        );
        e += 1;
    }
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">time from resign or crash to the successor's grant (log scale)</text>"##,
        left + width / 2.0,
        axis_y + 36.0
    );
    for (i, r) in rows.iter().enumerate() {
        let cy = top + row_h * i as f64 + row_h / 2.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 10.0,
            cy + 4.0,
            xml(&r.label)
        );
        if let Some(err) = &r.error {
            let _ = writeln!(
                s,
                r#"<text x="{left}" y="{:.1}" fill="{}">{}</text>"#,
                cy + 4.0,
                r.color,
                xml(&truncate(err, 90))
            );
            continue;
        }
        let Some(f) = r.figure else { continue };
        let mut v: Vec<f64> = f.samples.iter().map(|d| d.as_secs_f64()).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            continue;
        }
        let q = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize];
        let (min, q1, med, q3, max) = (v[0], q(0.25), q(0.5), q(0.75), v[v.len() - 1]);
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{cy:.1}" x2="{:.1}" y2="{cy:.1}" stroke="{c}"/><rect x="{:.1}" y="{:.1}" width="{:.1}" height="16" fill="{c}" fill-opacity="0.15" stroke="{c}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{c}" stroke-width="2"/>"#,
            x(min),
            x(max),
            x(q1),
            cy - 8.0,
            (x(q3) - x(q1)).max(1.0),
            x(med),
            cy - 8.0,
            x(med),
            cy + 8.0,
            c = r.color
        );
        for (j, sample) in v.iter().enumerate() {
            // A little vertical jitter so equal samples stay visible.
            let dy = ((j * 7) % 9) as f64 - 4.0;
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{}" fill-opacity="0.7"/>"#,
                x(*sample),
                cy + dy,
                r.color
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(name: &str, result: std::result::Result<BenchTable, String>) -> Outcome {
        Outcome {
            target: Target {
                name: name.into(),
                url: format!("{name}://x"),
                timing: Timing::from_ttl(Duration::from_secs(2)),
                shards: false,
            },
            result,
            shards: None,
        }
    }

    #[test]
    fn table_and_chart_list_every_backend() {
        let table = BenchTable {
            title: "mem".into(),
            figures: vec![
                Figure {
                    name: "graceful handover (resign → successor granted)".into(),
                    note: "one waiter queued".into(),
                    samples: [1, 2, 3].map(Duration::from_micros).to_vec(),
                },
                Figure {
                    name: "crash failover (x)".into(),
                    note: "TTL 2s".into(),
                    samples: vec![Duration::from_millis(1900)],
                },
            ],
        };
        let outcomes = vec![
            outcome("mem", Ok(table)),
            outcome("etcd", Err("not reachable: connection refused".into())),
        ];
        let machine = Machine {
            cpu: "cpu <x>".into(),
            cores: 2,
            os: "linux".into(),
        };
        let md = markdown(&outcomes, &machine, "tenure bench");
        assert!(md.contains("| mem | graceful handover (resign → successor granted) | 3 | 0.00 ms | 0.00 ms | 0.00 ms | one waiter queued; TTL 2000 ms"), "{md}");
        assert!(
            md.contains("| mem | crash failover (x) | 1 | 1900 ms |"),
            "{md}"
        );
        assert!(
            md.contains("| etcd | not reachable: connection refused |"),
            "{md}"
        );
        assert!(md.contains("cpu <x>, 2 cores, linux"), "{md}");
        let chart = svg(&outcomes, &machine);
        assert!(chart.starts_with("<svg") && chart.trim_end().ends_with("</svg>"));
        assert_eq!(chart.matches("<circle").count(), 4);
        assert!(chart.contains("not reachable: connection refused"));
        assert!(chart.contains("cpu &lt;x&gt;"));
    }
}
