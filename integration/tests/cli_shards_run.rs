//! `tenure shards run` as processes on a real Redis: three nodes share 64 shards, each
//! shard's command a shell loop that writes its `TENURE_TOKEN` to a guarded resource.
//! A SIGKILLed node's shards get their commands started elsewhere within TTL + one
//! renew interval; a SIGTERMed node drains with every old command stopped before the
//! new one starts; the fencing checker over the commands' writes finds no two commands
//! of a shard running at once, and every write carries a token its node was granted for
//! that shard. The health endpoint of `shards run` and `campaign` goes 200 ↔ 503 as
//! leadership moves, and `/shards` lists what is led.
//!
//! Run with `-- --nocapture` for the table of measured figures.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use tenure_integration::cli_faults::{ms, shards_run_args, tenure_bin};
use tenure_integration::{
    check_fencing_at, free_port, monotonic_now_ns, run_prefix, CandidateProcess, Event,
    GuardedResource, RedisServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const SHARDS: usize = 64;
const TTL: Duration = Duration::from_secs(2);
/// The default renew interval: TTL / 4.
const RENEW_INTERVAL: Duration = Duration::from_millis(500);
/// How often each shard's command writes.
const WRITE_EVERY: Duration = Duration::from_millis(250);

/// A random namespace for this test (several runs against one store never meet).
fn namespace(what: &str) -> String {
    format!("{what}-{}", run_prefix().replace(['/', ':'], "-"))
}

/// How long a shard's command takes to stop after SIGTERM: it writes once more at the
/// end (a flush with its token), so a new leader's command started before it ended
/// would make that write stale.
const FLUSH: Duration = Duration::from_millis(300);

/// A command for `bash -c` that writes `WRITE $TENURE_ELECTION $TENURE_TOKEN
/// $TENURE_ID` to `resource` every [`WRITE_EVERY`] (as the chaos tests' write loop
/// does) until SIGTERM, then waits [`FLUSH`], writes once more and exits 0.
fn shard_command(resource: &GuardedResource) -> String {
    let addr = resource.addr();
    let write = format!(
        "{{ printf 'WRITE %s %s %s\\n' \"$TENURE_ELECTION\" \"$TENURE_TOKEN\" \"$TENURE_ID\" >&3; \
           IFS= read -r -t 5 reply <&3; }} 3<>/dev/tcp/{}/{} 2>/dev/null",
        addr.ip(),
        addr.port()
    );
    format!(
        "trap 'stopping=1' TERM; \
         while [ -z \"$stopping\" ]; do {write}; sleep {every}; done; \
         sleep {flush}; {write}",
        every = WRITE_EVERY.as_secs_f64(),
        flush = FLUSH.as_secs_f64(),
    )
}

/// `tenure <args>` as a process that logs warnings only.
fn tenure(args: &[&str]) -> CandidateProcess {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    CandidateProcess::spawn(&tenure_bin(), &args, [("RUST_LOG", "warn")]).expect("start tenure")
}

/// `tenure shards run` as node `id` of namespace `ns` on `url`: `shards` shards,
/// replication 2, TTL [`TTL`], then `options` and, after `--`, each shard's `command`.
fn shards_run(
    url: &str,
    ns: &str,
    shards: usize,
    id: &str,
    options: &[&str],
    command: &[&str],
) -> CandidateProcess {
    let ttl = TTL.as_secs_f64().to_string();
    let mut args = shards_run_args(url, ns, shards, id);
    args.extend(["--ttl", &ttl].map(String::from));
    args.extend(options.iter().map(|a| a.to_string()));
    args.push("--".into());
    args.extend(command.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    tenure(&args)
}

/// `tenure shards run` for node `id`, [`SHARDS`] shards with [`shard_command`] as
/// each one's command.
fn node(url: &str, ns: &str, id: &str, resource: &GuardedResource) -> CandidateProcess {
    let command = shard_command(resource);
    shards_run(
        url,
        ns,
        SHARDS,
        id,
        &["--grace", "2"],
        &["bash", "-c", &command],
    )
}

/// Commands by election: (node, token) of each.
type Commands = BTreeMap<String, Vec<(String, u64)>>;

/// The commands running now: a start without an exit.
fn running(nodes: &[&CandidateProcess]) -> Commands {
    let mut open = Commands::new();
    for n in nodes {
        if n.events().iter().any(|e| e.is(Event::KILLED)) {
            continue;
        }
        for e in n.events() {
            let key = (e.id.clone(), e.token.unwrap_or(0));
            if e.is("command_started") {
                open.entry(e.election.clone()).or_default().push(key);
            } else if e.is("command_exited") {
                if let Some(list) = open.get_mut(&e.election) {
                    list.retain(|k| *k != key);
                }
            }
        }
    }
    open.retain(|_, v| !v.is_empty());
    open
}

/// Wait until every shard has exactly one command running among `nodes`, each on a
/// node that runs about its share, and that has held for half a second.
async fn settle(nodes: &[&CandidateProcess], within: Duration) -> BTreeMap<String, (String, u64)> {
    let deadline = tokio::time::Instant::now() + within;
    let mut since: Option<(tokio::time::Instant, Commands)> = None;
    loop {
        let now = running(nodes);
        let whole = now.len() == SHARDS && now.values().all(|v| v.len() == 1);
        let mut per_node: HashMap<String, usize> = HashMap::new();
        for v in now.values() {
            *per_node.entry(v[0].0.clone()).or_default() += 1;
        }
        let fair = SHARDS / nodes.len();
        let balanced =
            per_node.len() == nodes.len() && per_node.values().all(|&c| c >= fair && c <= fair + 1);
        if whole && balanced {
            match &since {
                Some((at, seen)) if *seen == now => {
                    if at.elapsed() >= Duration::from_millis(500) {
                        return now.into_iter().map(|(k, mut v)| (k, v.remove(0))).collect();
                    }
                }
                _ => since = Some((tokio::time::Instant::now(), now.clone())),
            }
        } else {
            since = None;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "not settled within {within:?}: {} shards running, per node {per_node:?}\n{}",
                now.len(),
                dump(nodes)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn dump(nodes: &[&CandidateProcess]) -> String {
    nodes
        .iter()
        .map(|n| {
            let tail: Vec<String> = n
                .events()
                .iter()
                .rev()
                .take(20)
                .map(|e| e.to_string())
                .collect();
            format!(
                "{}: last events (newest first):\n  {}\n  stderr: {}",
                n.label(),
                tail.join("\n  "),
                n.stderr_tail()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first `command_started` of `election` after `after_ns` among `nodes`.
fn started_after(nodes: &[&CandidateProcess], election: &str, after_ns: u64) -> Option<Event> {
    nodes
        .iter()
        .flat_map(|n| n.events())
        .filter(|e| e.is("command_started") && e.election == election && e.mono_ns > after_ns)
        .min_by_key(|e| e.mono_ns)
}

/// Wait until every election of `elections` has a command started after `after_ns`;
/// the latest of those starts.
async fn restarted(
    nodes: &[&CandidateProcess],
    elections: &[String],
    after_ns: u64,
    within: Duration,
) -> Vec<Event> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let found: Vec<Event> = elections
            .iter()
            .filter_map(|e| started_after(nodes, e, after_ns))
            .collect();
        if found.len() == elections.len() {
            return found;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!(
                "{} of {} shards restarted within {within:?}\n{}",
                found.len(),
                elections.len(),
                dump(nodes)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn secs(ns: u64) -> String {
    format!("{:.2} s", ms(ns) / 1000.0)
}

/// One log per writer: each (election, token) it wrote with as a tenure from its
/// first to its last accepted write.
fn write_tenures(resource: &GuardedResource) -> Vec<Vec<Event>> {
    let mut spans: BTreeMap<(String, String, u64), (u64, u64)> = BTreeMap::new();
    for w in resource.writes() {
        let span = spans
            .entry((w.writer.clone(), w.election.clone(), w.token))
            .or_insert((w.mono_ns, w.mono_ns));
        span.0 = span.0.min(w.mono_ns);
        span.1 = span.1.max(w.mono_ns);
    }
    let mut logs: BTreeMap<String, Vec<Event>> = BTreeMap::new();
    for ((writer, election, token), (first, last)) in spans {
        let log = logs.entry(writer.clone()).or_default();
        log.push(Event::new(
            "elected",
            &election,
            &writer,
            Some(token),
            first,
        ));
        log.push(Event::new(
            "resigned",
            &election,
            &writer,
            Some(token),
            last,
        ));
    }
    logs.into_values().collect()
}

/// The commands' lifetimes from the event lines as tenures: `command_started` to
/// `command_exited` (or the kill).
fn command_tenures(nodes: &[&CandidateProcess]) -> Vec<Vec<Event>> {
    nodes
        .iter()
        .map(|n| {
            n.events()
                .into_iter()
                .filter_map(|mut e| {
                    let kind = match e.kind.as_str() {
                        "command_started" => "elected",
                        "command_exited" => "resigned",
                        Event::KILLED => Event::KILLED,
                        _ => return None,
                    };
                    e.kind = kind.to_string();
                    Some(e)
                })
                .collect()
        })
        .collect()
}

/// Every write was accepted and carries a token its writer's node was granted for that
/// shard; no two commands of a shard ran at once, by their writes and by their events.
fn assert_fenced(resource: &GuardedResource, nodes: &[&CandidateProcess]) {
    let writes = resource.writes();
    assert!(writes.len() > 1000, "only {} writes", writes.len());
    let refused = resource.refused();
    assert!(refused.is_empty(), "stale writes: {refused:#?}");
    assert!(
        resource.malformed().is_empty(),
        "{:?}",
        resource.malformed()
    );
    let mut granted: HashMap<(String, String, u64), ()> = HashMap::new();
    for n in nodes {
        for e in n.events().iter().filter(|e| e.is("acquired")) {
            granted.insert((e.id.clone(), e.election.clone(), e.token.unwrap_or(0)), ());
        }
    }
    for w in &writes {
        let key = (w.writer.clone(), w.election.clone(), w.token);
        assert!(
            granted.contains_key(&key),
            "a write with a token its node was not granted: {w:?}"
        );
    }
    let now = monotonic_now_ns();
    let by_writes = check_fencing_at(&write_tenures(resource), now);
    assert!(
        by_writes.is_empty(),
        "commands' writes overlap: {by_writes:#?}"
    );
    let by_events = check_fencing_at(&command_tenures(nodes), now);
    assert!(by_events.is_empty(), "commands overlap: {by_events:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_share_64_shards_through_a_kill_a_join_and_drains() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix={}", server.endpoint(), namespace("srun"));
    let ns = namespace("orders");
    let resource = GuardedResource::start().await.expect("resource");
    let mut figures: Vec<(String, String)> = Vec::new();

    let n1 = node(&url, &ns, "n1", &resource);
    let n2 = node(&url, &ns, "n2", &resource);
    let mut n3 = node(&url, &ns, "n3", &resource);
    let started = monotonic_now_ns();
    settle(&[&n1, &n2, &n3], Duration::from_secs(30)).await;
    figures.push((
        "cold start: 3 nodes, a command running for each of 64 shards".into(),
        secs(monotonic_now_ns() - started),
    ));

    // SIGKILL n3: its shards' commands start on n1 and n2 within TTL + one interval +
    // the member grace.
    let before = running(&[&n1, &n2, &n3]);
    let n3_shards: Vec<String> = before
        .iter()
        .filter(|(_, v)| v[0].0 == "n3")
        .map(|(e, _)| e.clone())
        .collect();
    let killed_at = n3.kill().await.expect("kill n3");
    let again = restarted(&[&n1, &n2], &n3_shards, killed_at, Duration::from_secs(15)).await;
    let mut gaps: Vec<u64> = again.iter().map(|e| e.mono_ns - killed_at).collect();
    gaps.sort_unstable();
    let worst = *gaps.last().expect("n3 led shards");
    // The others keep a vanished member's shards for the member grace (default: a
    // quarter of the TTL) before they take them.
    let grace = TTL / 4;
    assert!(
        worst <= (TTL + RENEW_INTERVAL + grace).as_nanos() as u64,
        "SIGKILL → last command restarted took {} ms (TTL {TTL:?} + {RENEW_INTERVAL:?} + \
         member grace {grace:?})",
        ms(worst)
    );
    figures.push((
        format!(
            "SIGKILL of a node → its {} shards' commands started elsewhere (first / median / last)",
            n3_shards.len()
        ),
        format!(
            "{} / {} / {}",
            secs(gaps[0]),
            secs(gaps[gaps.len() / 2]),
            secs(worst)
        ),
    ));
    let others = settle(&[&n1, &n2], Duration::from_secs(20)).await;
    // Only n3's shards moved.
    for (election, (id, _)) in &others {
        if !n3_shards.contains(election) {
            assert_eq!(before[election][0].0, *id, "{election} moved without cause");
        }
    }

    // n3 comes back: about a third of the shards are handed to it, each old command
    // stopped first.
    let joined_at = monotonic_now_ns();
    let n3_again = node(&url, &ns, "n3", &resource);
    settle(&[&n1, &n2, &n3_again], Duration::from_secs(30)).await;
    figures.push((
        "a third node joins: settled again (about 21 handoffs)".into(),
        secs(monotonic_now_ns() - joined_at),
    ));

    // SIGTERM each node in turn: it drains and exits 0, each old command stopped before
    // the shard's next command starts; the last hands its 64 shards to nobody.
    let mut procs = [n1, n2, n3_again];
    for leaving in 0..procs.len() {
        let id = format!("n{}", leaving + 1);
        let stayers = leaving + 1..procs.len();
        let held: Vec<String> = running(&procs.iter().collect::<Vec<_>>())
            .into_iter()
            .filter(|(_, v)| v[0].0 == id)
            .map(|(e, _)| e)
            .collect();
        let term_at = monotonic_now_ns();
        let status = procs[leaving].terminate().await.expect("terminate");
        let exited_at = monotonic_now_ns();
        let node = &procs[leaving];
        assert!(
            status.success(),
            "{}: {status}\n{}",
            node.label(),
            node.stderr_tail()
        );
        let events = node.events();
        let last = events.iter().rev().find(|e| !e.synthetic).expect("events");
        assert!(last.is("drained"), "{}: last line {last}", node.label());
        let exits: HashMap<&str, &Event> = events
            .iter()
            .filter(|e| e.is("command_exited") && e.mono_ns > term_at)
            .map(|e| (e.election.as_str(), e))
            .collect();
        assert_eq!(
            exits.len(),
            held.len(),
            "{}: every command stopped",
            node.label()
        );
        for e in exits.values() {
            // Stopped by tenure, and exited by itself after its last write.
            let how = (&e.extra["stopped"], &e.extra["killed"], &e.extra["code"]);
            assert_eq!(how, (&true.into(), &false.into(), &0.into()), "{e}");
        }
        let others: Vec<&CandidateProcess> = procs[stayers].iter().collect();
        if others.is_empty() {
            figures.push((
                format!(
                    "SIGTERM → drained and exited: the last node, {} shards, no successor",
                    held.len()
                ),
                secs(exited_at - term_at),
            ));
            continue;
        }
        figures.push((
            format!(
                "SIGTERM → drained and exited: {} shards handed to {} node{}",
                held.len(),
                others.len(),
                if others.len() == 1 { "" } else { "s" }
            ),
            secs(exited_at - term_at),
        ));
        let next = restarted(&others, &held, term_at, Duration::from_secs(15)).await;
        let mut worst = 0u64;
        for start in &next {
            let exit = exits[start.election.as_str()];
            assert!(
                exit.mono_ns < start.mono_ns,
                "{}: the new command started {} ms before the old one exited",
                start.election,
                ms(exit.mono_ns - start.mono_ns)
            );
            worst = worst.max(start.mono_ns - exit.mono_ns);
        }
        figures.push((
            "  longest gap, a shard's old command exited → its new one started".into(),
            format!("{:.0} ms", ms(worst)),
        ));
        settle(&others, Duration::from_secs(20)).await;
    }

    let mut all: Vec<&CandidateProcess> = procs.iter().collect();
    all.push(&n3);
    assert_fenced(&resource, &all);
    print_table(&figures);
}

fn print_table(figures: &[(String, String)]) {
    let mut table = String::from(
        "| what (3 nodes, 64 shards, replication 2, TTL 2 s, Redis) | time |\n|---|---|\n",
    );
    for (what, time) in figures {
        table.push_str(&format!("| {what} | {time} |\n"));
    }
    println!("{table}");
}

/// `GET path` from `addr`: the status code and the body, or `None` if nothing answers.
async fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let code = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// Poll `GET path` until it answers `code`; the body as JSON (or text in a string).
async fn wait_status(addr: SocketAddr, path: &str, code: u16) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut last = None;
    while tokio::time::Instant::now() < deadline {
        last = get(addr, path).await;
        if let Some((c, body)) = &last {
            if *c == code {
                return serde_json::from_str(body).unwrap_or_else(|_| body.clone().into());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("GET http://{addr}{path} did not answer {code}; last: {last:?}");
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_endpoint_follows_leadership() {
    let server = RedisServer::start().await.expect("redis");
    let url = format!("{}?prefix={}", server.endpoint(), namespace("health"));
    let ns = namespace("web");
    let [pa, pb, pm, pc, pd] = [(); 5].map(|_| free_port().expect("port"));
    // One shard, its command a sleep; `health` and `metrics` the ports of the two
    // endpoints.
    let sleeper = |id: &str, health: u16, metrics: u16| {
        let (health, metrics) = (local(health).to_string(), local(metrics).to_string());
        shards_run(
            &url,
            &ns,
            1,
            id,
            &["--health-addr", &health, "--metrics-addr", &metrics],
            &["sleep", "1000"],
        )
    };

    // h1 leads the one shard: 200, and /shards names it with the token of its grant.
    let mut h1 = sleeper("h1", pa, pa);
    let acquired = h1
        .wait_for_kind("acquired", Duration::from_secs(20))
        .await
        .expect("acquired");
    let leader = wait_status(local(pa), "/leader", 200).await;
    assert_eq!(
        leader,
        serde_json::json!({"id": "h1", "leading": true, "held": 1})
    );
    let shards = wait_status(local(pa), "/shards", 200).await;
    let election = format!("{ns}/0000");
    assert_eq!(
        shards,
        serde_json::json!({"id": "h1", "held": 1, "shards": [
            {"election": election, "shard": "0000", "index": 0, "token": acquired.token}
        ]})
    );
    // The same address serves the metrics.
    let metrics = wait_status(local(pa), "/metrics", 200).await;
    let metrics = metrics.as_str().expect("text");
    assert!(
        metrics.contains(&format!(
            "tenure_shard_leaders{{namespace=\"{ns}\",node=\"h1\"}} 1"
        )),
        "{metrics}"
    );

    // h2 waits: 503, nothing held; its metrics are on their own address.
    let h2 = sleeper("h2", pb, pm);
    let waiting = wait_status(local(pb), "/leader", 503).await;
    assert_eq!(
        waiting,
        serde_json::json!({"id": "h2", "leading": false, "held": 0})
    );
    assert_eq!(
        wait_status(local(pb), "/shards", 200).await["shards"],
        serde_json::json!([])
    );
    wait_status(local(pb), "/metrics", 404).await;
    wait_status(local(pm), "/metrics", 200).await;

    // h1 drains: h2 leads (200, a higher token), h1 is gone.
    let status = h1.terminate().await.expect("terminate h1");
    assert!(status.success(), "{status}");
    let leader = wait_status(local(pb), "/leader", 200).await;
    assert_eq!(leader["held"], 1);
    let shards = wait_status(local(pb), "/shards", 200).await;
    assert!(
        shards["shards"][0]["token"].as_u64() > acquired.token,
        "{shards}"
    );
    assert!(
        get(local(pa), "/leader").await.is_none(),
        "h1's listener outlived it"
    );
    drop(h2);

    // campaign: the leader answers 200 with its election, the waiting candidate 503,
    // until the leader resigns.
    let campaign = |id: &str, port: u16| {
        tenure(&[
            "campaign",
            "--backend",
            &url,
            "--election",
            &format!("{ns}-job"),
            "--id",
            id,
            "--ttl",
            "2",
            "--health-addr",
            &local(port).to_string(),
        ])
    };
    let mut c1 = campaign("c1", pc);
    let elected = c1
        .wait_for_kind("elected", Duration::from_secs(20))
        .await
        .expect("elected");
    let c2 = campaign("c2", pd);
    c2.wait_for_kind("campaigning", Duration::from_secs(20))
        .await
        .expect("campaigning");
    wait_status(local(pd), "/leader", 503).await;
    assert_eq!(
        wait_status(local(pc), "/shards", 200).await["shards"],
        serde_json::json!([{"election": format!("{ns}-job"), "token": elected.token}])
    );
    wait_status(local(pc), "/leader", 200).await;
    assert!(c1.terminate().await.expect("terminate c1").success());
    let leader = wait_status(local(pd), "/leader", 200).await;
    assert_eq!(leader["id"], "c2");
}
