//! The `tenure` command. A binary only: its modules are private (see the crate README
//! for why, and for how the integration crate shares `src/bench.rs`).
#![deny(missing_docs)]
// The argument structs' doc comments are the command's help text, written for a
// terminal (`mem://[NAME]`, `demo-<pid>`), not as rustdoc markup.
#![allow(rustdoc::broken_intra_doc_links, rustdoc::invalid_html_tags)]

mod args;
mod bench;
mod bench_all;
mod campaign;
mod child;
mod clock;
mod demo;
mod events;
mod handover;
mod health;
mod metrics;
mod observe;
mod shards;
mod shards_run;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use std::io::IsTerminal;
use tenure::{Error, ErrorKind};

use args::{
    positive_seconds, seconds, BenchArgs, Cli, Command, DemoArgs, HealthArgs, MetricsArgs,
    ShardsArgs, ShardsCommand,
};
use bench_all::{BenchPlan, Machine, Target};
use demo::{DemoOptions, Display};
use events::{EventSink, StdoutSink};
use health::{Health, HealthSink};
use shards::StatusOptions;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind as Clap;
            if matches!(
                e.kind(),
                Clap::DisplayHelp
                    | Clap::DisplayVersion
                    | Clap::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            // One line, like every other bad input.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            // clap names the values it accepts on a later line: keep them on this one.
            let accepted = match e.get(clap::error::ContextKind::ValidValue) {
                Some(clap::error::ContextValue::Strings(values)) if !values.is_empty() => {
                    format!("; possible values: {}", values.join(", "))
                }
                _ => String::new(),
            };
            // The same for the arguments missing.
            let missing = match (e.kind(), e.get(clap::error::ContextKind::InvalidArg)) {
                (
                    Clap::MissingRequiredArgument,
                    Some(clap::error::ContextValue::Strings(names)),
                ) => format!(" {}", names.join(", ")),
                _ => String::new(),
            };
            eprintln!("tenure: invalid_argument: {first}{missing}{accepted} (see tenure --help)");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tenure: could not start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tenure: {}", one_line(&e));
            if e.kind() == ErrorKind::InvalidArgument {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}

/// The error and its causes on one line, each cause once, with the backend and the
/// endpoint (`tenure::one_line`).
fn one_line(e: &Error) -> String {
    tenure::one_line(e)
}

/// Cancelled on SIGINT or SIGTERM.
fn shutdown_on_signals() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            tracing::warn!("could not install signal handlers");
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        t.cancel();
    });
    token
}

/// Connect to the backend named by `url`, giving up after `limit`.
async fn connect(url: &str, limit: Duration) -> tenure::Result<tenure::DynBackend> {
    match tokio::time::timeout(limit, tenure::connect(url)).await {
        Ok(r) => r,
        Err(_) => Err(Error::new(
            ErrorKind::Timeout,
            format!("could not connect within connect_timeout {limit:?}"),
        )),
    }
}

fn serve_metrics(args: &MetricsArgs) -> tenure::Result<()> {
    match args.metrics_addr {
        Some(addr) => metrics::serve(addr),
        None => Ok(()),
    }
}

/// Serve `--metrics-addr` and `--health-addr` (one listener when both name the same
/// address); the event lines go through the returned sink, which keeps the health
/// state of `id` up to date.
async fn serve_endpoints(
    metrics: &MetricsArgs,
    health: &HealthArgs,
    id: &str,
) -> tenure::Result<Arc<dyn EventSink>> {
    let Some(addr) = health.health_addr else {
        serve_metrics(metrics)?;
        return Ok(Arc::new(StdoutSink));
    };
    let listener = health::bind(addr).await?;
    let handle = match metrics.metrics_addr {
        Some(m) if m == addr => Some(metrics::install()?),
        _ => {
            serve_metrics(metrics)?;
            None
        }
    };
    let state = Arc::new(Health::new(id));
    health::serve(listener, state.clone(), handle);
    Ok(Arc::new(HealthSink {
        inner: Arc::new(StdoutSink),
        health: state,
    }))
}

async fn run(cli: Cli) -> tenure::Result<()> {
    let shutdown = shutdown_on_signals();
    match cli.command {
        Command::Campaign(args) => {
            // Every argument is checked before touching the network.
            let plan = campaign::CampaignPlan::new(&args)?;
            let sink = serve_endpoints(&args.run.metrics, &args.run.health, &args.id).await?;
            let limit = plan.timing().connect_timeout;
            let backend = connect(&args.backend.backend, limit).await?;
            campaign::run_campaign(backend, &plan, sink, shutdown).await
        }
        Command::Observe(args) => {
            let plan = observe::ObservePlan::new(&args)?;
            serve_metrics(&args.metrics)?;
            let backend = connect(&args.backend.backend, plan.connect_timeout()).await?;
            observe::run_observe(backend, &plan, Arc::new(StdoutSink), shutdown).await
        }
        Command::Handover(args) => {
            let plan = handover::HandoverPlan::new(&args)?;
            let backend = connect(&args.backend.backend, plan.connect_timeout()).await?;
            let line = handover::run_handover(backend, &plan).await?;
            StdoutSink.emit(line);
            Ok(())
        }
        Command::Demo(args) => run_demo(args, shutdown).await,
        Command::Shards(args) => run_shards(args, shutdown).await,
        Command::Bench(args) => run_bench(args).await,
    }
}

async fn run_shards(args: ShardsArgs, shutdown: CancellationToken) -> tenure::Result<()> {
    match args.command {
        ShardsCommand::Status(args) => {
            // Every argument is checked before touching the network.
            let layout = args.layout.layout()?;
            let limit = positive_seconds("connect_timeout", args.connect_timeout)?;
            let mut timing = tenure::Timing::from_ttl(Duration::from_secs(10));
            timing.connect_timeout = limit;
            timing.validate()?;
            let backend = connect(&args.backend.backend, limit).await?;
            let options = StatusOptions {
                layout,
                timing,
                watch: args.watch,
                clear: args.watch && std::io::stdout().is_terminal(),
            };
            let mut out = std::io::stdout();
            shards::run_status(backend, &options, &mut out, shutdown).await
        }
        ShardsCommand::Run(args) => {
            // Every argument is checked before touching the network.
            let plan = shards_run::RunPlan::new(&args).await?;
            let sink = serve_endpoints(&args.run.metrics, &args.run.health, plan.id()).await?;
            let limit = plan.timing().connect_timeout;
            let backend = connect(&args.backend.backend, limit).await?;
            shards_run::run_shards(backend, &plan, sink, shutdown).await
        }
    }
}

/// `host:port` → `scheme://host:port`; a URL stays as it is.
fn with_scheme(scheme: &str, value: &str) -> String {
    if value.contains("://") {
        value.to_string()
    } else {
        format!("{scheme}://{value}")
    }
}

async fn run_bench(args: BenchArgs) -> tenure::Result<()> {
    let timing = tenure::Timing::from_ttl(seconds("ttl", args.ttl)?);
    timing.validate()?;
    let azure_timing = tenure::Timing::from_ttl(seconds("azure_ttl", args.azure_ttl)?);
    azure_timing.validate()?;
    if args.runs == 0 && args.failovers == 0 {
        return Err(Error::invalid(
            "runs, failovers: both 0; nothing to measure",
        ));
    }
    let mut targets = vec![Target {
        name: "mem".into(),
        url: "mem://tenure-bench".into(),
        timing: timing.clone(),
        shards: true,
    }];
    for (name, scheme, value) in [
        ("etcd", "etcd", &args.etcd),
        ("redis", "redis", &args.redis),
        ("zookeeper", "zk", &args.zk),
        ("postgres", "postgres", &args.postgres),
    ] {
        if let Some(v) = value {
            targets.push(Target {
                name: name.into(),
                url: with_scheme(scheme, v),
                timing: timing.clone(),
                shards: true,
            });
        }
    }
    if let Some(v) = &args.azure {
        // One blob lease per election, polled: the shard manager's benchmark (256
        // shards × replication 3 polling campaigns) is left out on Azure.
        targets.push(Target {
            name: "azure".into(),
            url: with_scheme("azblob", v),
            timing: azure_timing,
            shards: false,
        });
    }
    let shard_config = if args.no_shards {
        None
    } else {
        tenure::Layout::new("bench", args.shards, 3)?;
        if args.nodes < 2 {
            return Err(Error::invalid(format!(
                "nodes: {}; the shard benchmark crashes one node, so it needs at least 2",
                args.nodes
            )));
        }
        let mut cfg = tenure::shard::bench::BenchConfig::new(args.shards);
        cfg.nodes = args.nodes;
        cfg.steady_window = seconds("quiet", args.quiet)?;
        cfg.settle_timeout = Duration::from_secs(120);
        Some(cfg)
    };
    let plan = BenchPlan {
        targets,
        handover_runs: args.runs,
        failover_runs: args.failovers,
        shard_config,
    };
    let progress = |line: String| eprintln!("tenure bench: {line}");
    let outcomes = bench_all::run(&plan, &progress).await;
    let machine = Machine::detect();
    let command = std::env::args()
        .enumerate()
        .map(|(i, a)| if i == 0 { "tenure".to_string() } else { a })
        .collect::<Vec<_>>()
        .join(" ");
    print!("{}", bench_all::markdown(&outcomes, &machine, &command));
    let chart = bench_all::svg(&outcomes, &machine);
    std::fs::write(&args.svg, chart).map_err(|e| {
        Error::new(
            ErrorKind::Unavailable,
            format!("svg: cannot write {}: {e}", args.svg.display()),
        )
    })?;
    eprintln!("tenure bench: chart written to {}", args.svg.display());
    Ok(())
}

async fn run_demo(args: DemoArgs, shutdown: CancellationToken) -> tenure::Result<()> {
    let mut options = DemoOptions::new(&args.backend.backend);
    if !(2..=64).contains(&args.nodes) {
        return Err(Error::invalid(format!(
            "nodes: {}; the demo runs 2 to 64 nodes",
            args.nodes
        )));
    }
    if args.zones > args.nodes {
        return Err(Error::invalid(format!(
            "zones: {}; at most one zone per node ({} nodes)",
            args.zones, args.nodes
        )));
    }
    options.zones = args.zones;
    options.load = args.load;
    options.nodes = args.nodes;
    options.shards = args.shards;
    options.replication = args.replication;
    options.handoff_rate = demo::handoff_rate(options.shards, options.nodes);
    options.timing = tenure::Timing::from_ttl(seconds("ttl", args.ttl)?);
    options.timing.validate()?;
    if let Some(ns) = &args.namespace {
        options.namespace = ns.clone();
    }
    let live = !args.json && std::io::stdout().is_terminal();
    options.pause = match args.pause {
        Some(p) => seconds("pause", p)?,
        None if live => Duration::from_secs(1),
        None => Duration::ZERO,
    };
    // Check the layout before connecting.
    tenure::Layout::new(&options.namespace, options.shards, options.replication)?;
    serve_metrics(&args.metrics)?;
    let backend = connect(&args.backend.backend, options.timing.connect_timeout).await?;
    let display = if args.json {
        Display::Lines(Box::new(std::io::stderr()))
    } else if live {
        Display::Live(Box::new(std::io::stdout()))
    } else {
        Display::Lines(Box::new(std::io::stdout()))
    };
    let summary = demo::run_demo(backend, options, display, shutdown).await?;
    if args.json {
        let text = serde_json::to_string_pretty(&summary)
            .map_err(|e| Error::new(ErrorKind::Backend, format!("summary as JSON: {e}")))?;
        println!("{text}");
    } else {
        println!();
        print!("{}", summary.table());
    }
    Ok(())
}
