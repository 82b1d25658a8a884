//! Fencing: a resource that refuses stale tokens, and a checker for the
//! event logs of many candidates.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::candidate::Event;
use crate::error::{HarnessError, Result};
use crate::os::{listen_loopback, monotonic_now_ns};

/// The longest request line the guarded resource reads.
const MAX_LINE: u64 = 4096;

/// One write the guarded resource saw, accepted or refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteRecord {
    /// The election the token belongs to.
    pub election: String,
    /// The token the writer presented.
    pub token: u64,
    /// Who wrote (the fourth word of the request).
    pub writer: String,
    /// Whether the write was accepted (`OK`) or refused (`STALE`).
    pub accepted: bool,
    /// The highest token of the election before this write, if any.
    pub highest_before: Option<u64>,
    /// `CLOCK_MONOTONIC` nanoseconds when the write was decided.
    pub mono_ns: u64,
}

/// The answer of the guarded resource to a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteReply {
    /// The write was accepted.
    Ok,
    /// The write was refused; a write with this higher token was seen.
    Stale(u64),
    /// The request was not understood.
    Error(String),
}

#[derive(Debug, Default)]
struct Ledger {
    highest: HashMap<String, u64>,
    writes: Vec<WriteRecord>,
    malformed: Vec<String>,
}

/// A stand-in for a resource protected by fencing tokens: a TCP server on a
/// free loopback port that accepts a write only if its token is at least the
/// highest token seen for that election.
///
/// Protocol, one request per line (several per connection are fine):
/// `WRITE <election> <token> <writer-id>\n` is answered `OK\n` (and the token
/// recorded) or `STALE <highest>\n`; anything else gets `ERR <why>\n`. A shell
/// can speak it through bash's `/dev/tcp`, see
/// [`write_loop_command`](Self::write_loop_command). Dropping the resource
/// stops the server.
#[derive(Debug)]
pub struct GuardedResource {
    addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    task: JoinHandle<()>,
}

impl GuardedResource {
    /// Starts the server on a free loopback port.
    pub async fn start() -> Result<Self> {
        let (listener, addr) = listen_loopback("the guarded resource").await?;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let task = tokio::spawn(serve(listener, Arc::clone(&ledger)));
        Ok(GuardedResource { addr, ledger, task })
    }

    /// The address writers connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.ledger)
    }

    /// Every write seen so far, accepted and refused, in the order decided.
    pub fn writes(&self) -> Vec<WriteRecord> {
        self.ledger().writes.clone()
    }

    /// The accepted writes, in order.
    pub fn accepted(&self) -> Vec<WriteRecord> {
        self.writes_that(true)
    }

    /// The refused writes, in order.
    pub fn refused(&self) -> Vec<WriteRecord> {
        self.writes_that(false)
    }

    fn writes_that(&self, accepted: bool) -> Vec<WriteRecord> {
        let writes = self.ledger().writes.clone();
        writes
            .into_iter()
            .filter(|w| w.accepted == accepted)
            .collect()
    }

    /// The highest token accepted for `election`.
    pub fn highest(&self, election: &str) -> Option<u64> {
        self.ledger().highest.get(election).copied()
    }

    /// Request lines that were not understood.
    pub fn malformed(&self) -> Vec<String> {
        self.ledger().malformed.clone()
    }

    /// Sends one write and returns the answer; for tests that write
    /// directly rather than through a shell.
    pub async fn write(&self, election: &str, token: u64, writer: &str) -> Result<WriteReply> {
        let exchange = async {
            let mut stream = TcpStream::connect(self.addr).await?;
            let request = format!("WRITE {election} {token} {writer}\n");
            stream.write_all(request.as_bytes()).await?;
            let mut line = String::new();
            let mut reader = BufReader::new(stream).take(MAX_LINE);
            reader.read_line(&mut line).await.map(|_| line)
        };
        let context = format!("writing to the guarded resource at {}", self.addr);
        Ok(parse_reply(
            &exchange.await.map_err(|e| HarnessError::io(context, e))?,
        ))
    }

    /// A command for `bash -c` that writes `$TENURE_TOKEN` for
    /// `$TENURE_ELECTION` to this resource every `every`; see
    /// [`write_loop_command`].
    pub fn write_loop_command(&self, every: Duration) -> String {
        write_loop_command(self.addr, every)
    }
}

impl Drop for GuardedResource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A command for `bash -c` that, forever, opens a connection to the guarded
/// resource at `addr` through `/dev/tcp`, sends
/// `WRITE $TENURE_ELECTION $TENURE_TOKEN $TENURE_ID` (the writer id falls
/// back to `pid<shell pid>` when `TENURE_ID` is unset), reads the answer and
/// sleeps `every`. Connection failures are ignored and retried.
pub fn write_loop_command(addr: SocketAddr, every: Duration) -> String {
    let secs = every.as_secs_f64();
    format!(
        "while :; do \
           {{ printf 'WRITE %s %s %s\\n' \"$TENURE_ELECTION\" \"$TENURE_TOKEN\" \"${{TENURE_ID:-pid$$}}\" >&3; \
              IFS= read -r -t 5 reply <&3; }} 3<>/dev/tcp/{ip}/{port} 2>/dev/null; \
           sleep {secs:.3}; \
         done",
        ip = addr.ip(),
        port = addr.port(),
    )
}

fn lock(ledger: &Mutex<Ledger>) -> MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|p| p.into_inner())
}

fn parse_reply(line: &str) -> WriteReply {
    let line = line.trim_end();
    if line == "OK" {
        return WriteReply::Ok;
    }
    if let Some(highest) = line
        .strip_prefix("STALE ")
        .and_then(|h| h.trim().parse().ok())
    {
        return WriteReply::Stale(highest);
    }
    WriteReply::Error(line.strip_prefix("ERR ").unwrap_or(line).to_owned())
}

async fn serve(listener: TcpListener, ledger: Arc<Mutex<Ledger>>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(handle(stream, Arc::clone(&ledger)));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

async fn handle(stream: TcpStream, ledger: Arc<Mutex<Ledger>>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    loop {
        let mut line = String::new();
        match (&mut reader).take(MAX_LINE).read_line(&mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let overlong = !line.ends_with('\n') && line.len() as u64 >= MAX_LINE;
        let answer = decide(&line, &mut lock(&ledger));
        if write.write_all(answer.as_bytes()).await.is_err() || overlong {
            return;
        }
    }
}

/// Applies one request line to the ledger and returns the answer line.
fn decide(line: &str, ledger: &mut Ledger) -> String {
    let mut words = line.split_whitespace();
    let request = (words.next(), words.next(), words.next(), words.next());
    let (election, token, writer) = match request {
        (Some("WRITE"), Some(election), Some(token), Some(writer)) => match token.parse::<u64>() {
            Ok(token) => (election, token, writer),
            Err(_) => return malformed(ledger, line, "token is not a number"),
        },
        (Some("WRITE"), ..) => {
            return malformed(
                ledger,
                line,
                "expected WRITE <election> <token> <writer-id>",
            )
        }
        _ => return malformed(ledger, line, "unknown request"),
    };
    let highest_before = ledger.highest.get(election).copied();
    let accepted = highest_before.is_none_or(|h| token >= h);
    if accepted {
        ledger.highest.insert(election.to_owned(), token);
    }
    ledger.writes.push(WriteRecord {
        election: election.to_owned(),
        token,
        writer: writer.to_owned(),
        accepted,
        highest_before,
        mono_ns: monotonic_now_ns(),
    });
    match (accepted, highest_before) {
        (false, Some(highest)) => format!("STALE {highest}\n"),
        _ => "OK\n".to_owned(),
    }
}

fn malformed(ledger: &mut Ledger, line: &str, why: &str) -> String {
    ledger.malformed.push(line.trim_end().to_owned());
    format!("ERR {why}\n")
}

/// How a tenure ended in a candidate's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenureEnd {
    /// A `lost` event.
    Lost,
    /// A `resigned` event.
    Resigned,
    /// The harness killed the process ([`Event::KILLED`]).
    Killed,
    /// The process's output ended ([`Event::EXITED`]).
    Exited,
    /// The same process reported `elected` again for the election without
    /// ending the earlier tenure.
    ElectedAgain,
    /// Nothing ended it: it counts as lasting until "now".
    Open,
}

/// One `elected` … end interval from one candidate's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    /// Index of the log (in the slice given to the checker) it comes from.
    pub log: usize,
    /// The election.
    pub election: String,
    /// The candidate id from the `elected` event.
    pub id: String,
    /// The fencing token from the `elected` event.
    pub token: Option<u64>,
    /// `mono_ns` of the `elected` event.
    pub start_ns: u64,
    /// `mono_ns` of the event that ended it, or "now" if open.
    pub end_ns: u64,
    /// What ended it.
    pub end: TenureEnd,
    /// The reason the `lost` event gave, if a `lost` event ended it.
    pub reason: Option<String>,
}

impl fmt::Display for Tenure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let token = self
            .token
            .map_or_else(|| "none".to_owned(), |t| t.to_string());
        write!(
            f,
            "{} (log {}) token {token} from {} to {} ({:?})",
            self.id, self.log, self.start_ns, self.end_ns, self.end
        )
    }
}

/// Something the fencing checker found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FencingViolation {
    /// Two tenures of one election overlap in time.
    Overlap {
        /// The tenure that started first.
        first: Tenure,
        /// The tenure that started before `first` ended.
        second: Tenure,
    },
    /// A later grant of an election did not get a strictly larger token.
    TokenNotIncreasing {
        /// The earlier grant.
        earlier: Tenure,
        /// The next grant (by start time), whose token is not larger.
        later: Tenure,
    },
    /// An `elected` event without a token.
    MissingToken {
        /// The tenure without a token.
        tenure: Tenure,
    },
}

impl fmt::Display for FencingViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FencingViolation::Overlap { first, second } => write!(
                f,
                "election {}: tenures overlap by {} ns: [{first}] and [{second}]",
                first.election,
                first
                    .end_ns
                    .min(second.end_ns)
                    .saturating_sub(second.start_ns),
            ),
            FencingViolation::TokenNotIncreasing { earlier, later } => write!(
                f,
                "election {}: token did not increase: [{earlier}] then [{later}]",
                earlier.election
            ),
            FencingViolation::MissingToken { tenure } => write!(
                f,
                "election {}: elected without a token: [{tenure}]",
                tenure.election
            ),
        }
    }
}

/// The tenures in the logs, ordered by election and start time.
///
/// Each log is read in `mono_ns` order. A tenure starts at `elected` and ends
/// at the next `lost` or `resigned` of the same election in the same log, at
/// an [`Event::KILLED`] or [`Event::EXITED`] event, or at a second `elected`;
/// one that never ends lasts until `now_ns`.
pub fn tenures(logs: &[Vec<Event>], now_ns: u64) -> Vec<Tenure> {
    let mut all = Vec::new();
    for (index, log) in logs.iter().enumerate() {
        let mut events: Vec<&Event> = log.iter().collect();
        events.sort_by_key(|e| e.mono_ns);
        let mut open: BTreeMap<String, Tenure> = BTreeMap::new();
        for event in events {
            match event.kind.as_str() {
                Event::ELECTED => {
                    if let Some(mut previous) = open.remove(&event.election) {
                        previous.end_ns = event.mono_ns;
                        previous.end = TenureEnd::ElectedAgain;
                        all.push(previous);
                    }
                    open.insert(
                        event.election.clone(),
                        Tenure {
                            log: index,
                            election: event.election.clone(),
                            id: event.id.clone(),
                            token: event.token,
                            start_ns: event.mono_ns,
                            end_ns: now_ns,
                            end: TenureEnd::Open,
                            reason: None,
                        },
                    );
                }
                Event::LOST | Event::RESIGNED => {
                    if let Some(mut tenure) = open.remove(&event.election) {
                        tenure.end_ns = event.mono_ns;
                        tenure.end = if event.is(Event::LOST) {
                            tenure.reason.clone_from(&event.reason);
                            TenureEnd::Lost
                        } else {
                            TenureEnd::Resigned
                        };
                        all.push(tenure);
                    }
                }
                Event::KILLED | Event::EXITED => {
                    let end = if event.is(Event::KILLED) {
                        TenureEnd::Killed
                    } else {
                        TenureEnd::Exited
                    };
                    for (_, mut tenure) in std::mem::take(&mut open) {
                        tenure.end_ns = event.mono_ns;
                        tenure.end = end;
                        all.push(tenure);
                    }
                }
                _ => {}
            }
        }
        all.extend(open.into_values().map(|mut t| {
            t.end_ns = t.end_ns.max(t.start_ns);
            t
        }));
    }
    all.sort_by(|a, b| {
        (a.election.as_str(), a.start_ns, a.log).cmp(&(b.election.as_str(), b.start_ns, b.log))
    });
    all
}

/// Checks the event logs of many candidate processes (one `Vec<Event>` per
/// process, e.g. from [`CandidateProcess::events`](crate::CandidateProcess::events))
/// for fencing violations, with open tenures lasting until now.
///
/// A tenure of a process the harness killed ends at the kill, because
/// [`CandidateProcess::kill`](crate::CandidateProcess::kill) records an
/// [`Event::KILLED`] in that process's log; for hand-made logs append such an
/// event with the time of death. See [`check_fencing_at`].
pub fn check_fencing(logs: &[Vec<Event>]) -> Vec<FencingViolation> {
    check_fencing_at(logs, monotonic_now_ns())
}

/// Like [`check_fencing`], with open tenures lasting until `now_ns`.
///
/// Reports: every pair of tenures of one election that overlap in time
/// (touching ends do not count), every pair of successive grants of one
/// election (by start time) whose tokens do not strictly increase, and every
/// grant without a token.
pub fn check_fencing_at(logs: &[Vec<Event>], now_ns: u64) -> Vec<FencingViolation> {
    let all = tenures(logs, now_ns);
    let mut violations = Vec::new();
    let mut by_election: BTreeMap<&str, Vec<&Tenure>> = BTreeMap::new();
    for tenure in &all {
        by_election
            .entry(tenure.election.as_str())
            .or_default()
            .push(tenure);
    }
    for tenures in by_election.values() {
        // Already sorted by start time.
        for (i, first) in tenures.iter().enumerate() {
            for second in &tenures[i + 1..] {
                if second.start_ns < first.end_ns {
                    violations.push(FencingViolation::Overlap {
                        first: (*first).clone(),
                        second: (*second).clone(),
                    });
                }
            }
        }
        let mut previous: Option<&Tenure> = None;
        for tenure in tenures {
            let Some(token) = tenure.token else {
                violations.push(FencingViolation::MissingToken {
                    tenure: (*tenure).clone(),
                });
                continue;
            };
            if let Some(earlier) = previous {
                if earlier.token.is_some_and(|t| token <= t) {
                    violations.push(FencingViolation::TokenNotIncreasing {
                        earlier: earlier.clone(),
                        later: (*tenure).clone(),
                    });
                }
            }
            previous = Some(tenure);
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::loopback;

    fn ledger_answers(lines: &[&str]) -> (Vec<String>, Ledger) {
        let mut ledger = Ledger::default();
        let answers = lines.iter().map(|l| decide(l, &mut ledger)).collect();
        (answers, ledger)
    }

    #[test]
    fn accepts_equal_and_higher_tokens_and_refuses_lower() {
        let (answers, ledger) = ledger_answers(&[
            "WRITE e1 5 a\n",
            "WRITE e1 5 a\n",
            "WRITE e1 7 b\n",
            "WRITE e1 6 a\n",
            "WRITE e2 1 c\n",
        ]);
        assert_eq!(answers, ["OK\n", "OK\n", "OK\n", "STALE 7\n", "OK\n"]);
        assert_eq!(ledger.highest["e1"], 7);
        assert_eq!(ledger.highest["e2"], 1);
        assert_eq!(ledger.writes.len(), 5);
        assert_eq!(ledger.writes[3].highest_before, Some(7));
        assert!(!ledger.writes[3].accepted);
    }

    #[test]
    fn answers_err_to_malformed_requests() {
        let (answers, ledger) = ledger_answers(&["WRITE e1  a\n", "READ x\n", "WRITE e1 x a\n"]);
        assert!(answers.iter().all(|a| a.starts_with("ERR ")), "{answers:?}");
        assert_eq!(ledger.malformed.len(), 3);
        assert!(ledger.writes.is_empty());
    }

    #[test]
    fn replies_parse() {
        assert_eq!(parse_reply("OK\n"), WriteReply::Ok);
        assert_eq!(parse_reply("STALE 9\n"), WriteReply::Stale(9));
        assert_eq!(
            parse_reply("ERR unknown request\n"),
            WriteReply::Error("unknown request".into())
        );
    }

    #[test]
    fn write_loop_command_names_the_port_and_interval() {
        let cmd = write_loop_command(loopback(4321), Duration::from_millis(250));
        assert!(cmd.contains("/dev/tcp/127.0.0.1/4321"), "{cmd}");
        assert!(cmd.contains("sleep 0.250"), "{cmd}");
        assert!(cmd.contains("\"$TENURE_TOKEN\""), "{cmd}");
    }

    fn ev(kind: &str, id: &str, token: Option<u64>, at: u64) -> Event {
        Event::new(kind, "e1", id, token, at)
    }

    #[test]
    fn tenures_pair_events_and_close_open_ones() {
        let logs = vec![
            vec![
                ev("campaigning", "a", None, 1),
                ev("elected", "a", Some(1), 10),
                ev("lost", "a", Some(1), 20),
                ev("elected", "a", Some(3), 40),
            ],
            vec![ev("elected", "b", Some(2), 25), ev("killed", "", None, 30)],
        ];
        let t = tenures(&logs, 100);
        let spans: Vec<(u64, u64, TenureEnd)> =
            t.iter().map(|t| (t.start_ns, t.end_ns, t.end)).collect();
        assert_eq!(
            spans,
            [
                (10, 20, TenureEnd::Lost),
                (25, 30, TenureEnd::Killed),
                (40, 100, TenureEnd::Open)
            ]
        );
        assert!(check_fencing_at(&logs, 100).is_empty());
    }

    #[test]
    fn unsorted_logs_are_read_in_time_order() {
        // A kill recorded after late-arriving output still ends the tenure.
        let logs = vec![vec![
            ev("killed", "", None, 30),
            ev("elected", "a", Some(1), 10),
        ]];
        assert_eq!(tenures(&logs, 100)[0].end, TenureEnd::Killed);
    }
}
