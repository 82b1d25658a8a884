//! `--health-addr`: what a load balancer or a readiness probe asks. `GET /leader` is
//! 200 while this process leads (its election, or at least one shard), else 503;
//! `GET /shards` lists what it leads as JSON. With `--metrics-addr` on the same
//! address, `GET /metrics` is served by the same listener.
//!
//! The state follows the event lines the command prints ([`HealthSink`]): an
//! `elected` or `acquired` line adds an election, `lost`, `resigned` or `handed_off`
//! with the same token removes it. The responder is a small HTTP/1.1 one: one request
//! per connection, `GET` and `HEAD`, answered with `Connection: close`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use tenure::{Error, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::events::EventSink;

/// The longest request head read; a longer one is answered 431.
const MAX_HEAD: usize = 8 * 1024;
/// How long a client gets to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One election this process leads.
#[derive(Debug, Clone)]
struct Led {
    token: u64,
    /// For a shard: its name and index.
    shard: Option<(String, u64)>,
}

/// What this process leads, as its event lines tell.
#[derive(Debug)]
pub struct Health {
    id: String,
    led: Mutex<BTreeMap<String, Led>>,
}

impl Health {
    /// Nothing led yet, for the candidate or node `id`.
    pub fn new(id: &str) -> Health {
        Health {
            id: id.to_string(),
            led: Mutex::new(BTreeMap::new()),
        }
    }

    fn led(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Led>> {
        match self.led.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Take in one event line.
    pub fn observe(&self, event: &Value) {
        let (Some(kind), Some(election), Some(token)) = (
            event["event"].as_str(),
            event["election"].as_str(),
            event["token"].as_u64(),
        ) else {
            return;
        };
        let mut led = self.led();
        match kind {
            "elected" | "acquired" => {
                let shard = event["shard"].as_str().map(str::to_string);
                let shard = shard.zip(event["index"].as_u64());
                led.insert(election.to_string(), Led { token, shard });
            }
            "lost" | "resigned" | "handed_off"
                if led.get(election).is_some_and(|l| l.token == token) =>
            {
                led.remove(election);
            }
            _ => {}
        }
    }

    /// `/leader`: the status code and body.
    fn leader(&self) -> (u16, Value) {
        let held = self.led().len();
        let code = if held > 0 { 200 } else { 503 };
        (
            code,
            json!({ "id": self.id, "leading": held > 0, "held": held }),
        )
    }

    /// `/shards`: what is led, by election name.
    fn shards(&self) -> Value {
        let led = self.led();
        let list: Vec<Value> = led
            .iter()
            .map(|(election, l)| {
                let mut v = json!({ "election": election, "token": l.token });
                if let Some((name, index)) = &l.shard {
                    v["shard"] = json!(name);
                    v["index"] = json!(index);
                }
                v
            })
            .collect();
        json!({ "id": self.id, "held": list.len(), "shards": list })
    }
}

/// Passes every event line on to `inner` and into the health state.
pub struct HealthSink {
    /// Where the lines go.
    pub inner: Arc<dyn EventSink>,
    /// The state they update.
    pub health: Arc<Health>,
}

impl EventSink for HealthSink {
    fn emit(&self, event: Value) {
        self.health.observe(&event);
        self.inner.emit(event);
    }
}

/// Bind `addr` for `--health-addr`; fails with `InvalidArgument` naming `health_addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::invalid(format!("health_addr: cannot serve on {addr}: {e}")))
}

/// Answer requests on `listener` from a task of the current runtime, with `/metrics`
/// too when `metrics` is given.
pub fn serve(listener: TcpListener, health: Arc<Health>, metrics: Option<PrometheusHandle>) {
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let (health, metrics) = (health.clone(), metrics.clone());
                    tokio::spawn(async move {
                        if let Err(e) = answer(stream, &health, metrics.as_ref()).await {
                            tracing::debug!(error = %e, "health request");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "health listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
}

/// A response: status, content type, body.
struct Response {
    code: u16,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn json(code: u16, body: &Value) -> Response {
        Response {
            code,
            content_type: "application/json",
            body: format!("{body}\n"),
        }
    }

    fn text(code: u16, body: &str) -> Response {
        Response {
            code,
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n"),
        }
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        431 => "Request Header Fields Too Large",
        _ => "Service Unavailable",
    }
}

/// Read one request head from `stream` and answer it.
async fn answer(
    mut stream: TcpStream,
    health: &Health,
    metrics: Option<&PrometheusHandle>,
) -> std::io::Result<()> {
    let (response, head_only) = match read_head(&mut stream).await? {
        Head::Complete(head) => {
            let line = head.lines().next().unwrap_or("");
            let head_only = line.starts_with("HEAD ");
            (route(line, health, metrics), head_only)
        }
        Head::TooLong => (Response::text(431, "request head too long"), false),
        Head::TimedOut => (Response::text(408, "no request"), false),
        Head::Closed => return Ok(()),
    };
    let mut out = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        response.code,
        reason(response.code),
        response.content_type,
        response.body.len()
    );
    if !head_only {
        out.push_str(&response.body);
    }
    stream.write_all(out.as_bytes()).await?;
    stream.shutdown().await
}

enum Head {
    Complete(String),
    TooLong,
    TimedOut,
    Closed,
}

async fn read_head(stream: &mut TcpStream) -> std::io::Result<Head> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(n) => n?,
            Err(_) => return Ok(Head::TimedOut),
        };
        if n == 0 {
            return Ok(Head::Closed);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(end);
            return Ok(Head::Complete(String::from_utf8_lossy(&buf).into_owned()));
        }
        if buf.len() > MAX_HEAD {
            return Ok(Head::TooLong);
        }
    }
}

/// The response to a request line (`METHOD TARGET VERSION`).
fn route(line: &str, health: &Health, metrics: Option<&PrometheusHandle>) -> Response {
    let mut words = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Response::text(400, "bad request line");
    };
    if !version.starts_with("HTTP/1.") {
        return Response::text(400, "HTTP/1.x only");
    }
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "GET or HEAD only");
    }
    let path = target.split('?').next().unwrap_or(target);
    match (path, metrics) {
        ("/leader", _) => {
            let (code, body) = health.leader();
            Response::json(code, &body)
        }
        ("/shards", _) => Response::json(200, &health.shards()),
        ("/metrics", Some(handle)) => Response {
            code: 200,
            content_type: "text/plain; version=0.0.4",
            body: handle.render(),
        },
        _ => Response::text(404, "not found; try /leader or /shards"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::{bind, route, serve, Health};

    fn acquired(shard: &str, token: u64) -> serde_json::Value {
        json!({"event": "acquired", "election": format!("ns/{shard}"), "shard": shard,
               "index": shard.parse::<u64>().unwrap(), "token": token, "mono_ns": 1})
    }

    #[test]
    fn the_state_follows_the_event_lines() {
        let h = Health::new("n1");
        assert_eq!(h.leader().0, 503);
        h.observe(&acquired("0003", 7));
        h.observe(&acquired("0001", 9));
        h.observe(&json!({"event": "command_started", "election": "ns/0001", "token": 9}));
        let (code, body) = h.leader();
        assert_eq!((code, body["held"].as_u64()), (200, Some(2)));
        let shards = h.shards();
        assert_eq!(shards["shards"][0]["shard"], "0001");
        assert_eq!(shards["shards"][0]["index"], 1);
        assert_eq!(shards["shards"][1]["token"], 7);
        // An end with another token (an older grant) leaves the current one.
        h.observe(&json!({"event": "lost", "election": "ns/0003", "token": 6}));
        assert_eq!(h.leader().1["held"], 2);
        h.observe(&json!({"event": "lost", "election": "ns/0003", "token": 7}));
        h.observe(&json!({"event": "handed_off", "election": "ns/0001", "token": 9}));
        assert_eq!(h.leader().0, 503);
        assert_eq!(h.shards()["shards"], json!([]));
        // A campaign's lines.
        h.observe(&json!({"event": "elected", "election": "jobs/x", "token": 3, "mono_ns": 1}));
        assert_eq!(
            h.shards()["shards"],
            json!([{"election": "jobs/x", "token": 3}])
        );
        h.observe(&json!({"event": "resigned", "election": "jobs/x", "token": 3}));
        assert_eq!(h.leader().0, 503);
    }

    #[test]
    fn requests_are_routed_by_method_and_path() {
        let h = Health::new("n1");
        let code = |line: &str| route(line, &h, None).code;
        assert_eq!(code("GET /leader HTTP/1.1"), 503);
        assert_eq!(code("HEAD /leader?probe=1 HTTP/1.0"), 503);
        assert_eq!(code("GET /shards HTTP/1.1"), 200);
        assert_eq!(code("GET /metrics HTTP/1.1"), 404);
        assert_eq!(code("POST /leader HTTP/1.1"), 405);
        assert_eq!(code("GET /leader"), 400);
        assert_eq!(code("GET /leader SPDY/3"), 400);
        assert_eq!(code(""), 400);
    }

    async fn get(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn it_answers_over_tcp_and_refuses_oversized_heads() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let h = Arc::new(Health::new("n1"));
        serve(listener, h.clone(), None);
        let out = get(addr, b"GET /leader HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(
            out.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{out}"
        );
        h.observe(&acquired("0002", 4));
        let out = get(addr, b"GET /leader HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
        let body = out.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v, json!({"id": "n1", "leading": true, "held": 1}));
        assert!(out.contains(&format!("Content-Length: {}\r\n", body.len())));
        let out = get(addr, b"HEAD /shards HTTP/1.1\r\n\r\n").await;
        assert!(
            out.ends_with("\r\n\r\n"),
            "a HEAD answer has no body: {out}"
        );
        // Nine reads of 1,024 bytes without an end of head: all of it is read before
        // the answer (unread bytes would make the close a reset).
        let mut big = b"GET /leader HTTP/1.1\r\nX: ".to_vec();
        big.resize(9 * 1024, b'a');
        let out = get(addr, &big).await;
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
    }

    #[tokio::test]
    async fn a_taken_address_names_the_flag() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let e = bind(taken.local_addr().unwrap()).await.unwrap_err();
        assert_eq!(e.kind(), tenure::ErrorKind::InvalidArgument);
        assert!(
            e.to_string().contains("health_addr: cannot serve on"),
            "{e}"
        );
    }
}
