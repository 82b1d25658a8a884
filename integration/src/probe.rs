//! Readiness probes: the smallest request each store answers once it serves, and the
//! raw exchange they are made of (for tests that talk to a store below any client).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How a probe error that timed out begins.
pub const NO_ANSWER: &str = "no answer";

/// The most bytes a probe reads from one answer.
const MAX_ANSWER: usize = 64 * 1024;

/// Sends `request` to `addr` and reads until `done` says the answer is
/// complete, the peer closes, or `timeout` passes. Returns what was read.
pub async fn exchange(
    addr: SocketAddr,
    request: &[u8],
    done: impl Fn(&[u8]) -> bool,
    timeout: Duration,
) -> Result<Vec<u8>, String> {
    let work = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .write_all(request)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = stream
                .read(&mut buf)
                .await
                .map_err(|e| format!("read: {e}"))?;
            if n == 0 {
                return Ok(answer);
            }
            answer.extend_from_slice(&buf[..n]);
            if done(&answer) || answer.len() >= MAX_ANSWER {
                return Ok(answer);
            }
        }
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(format!("{NO_ANSWER} within {timeout:?}")),
    }
}

/// An HTTP/1.1 request with `Connection: close` and a JSON `body` (if any); returns
/// the whole response (status line, headers and body) as text.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<String, String> {
    let json = if body.is_empty() {
        ""
    } else {
        "Content-Type: application/json\r\n"
    };
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{json}\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let answer = exchange(addr, request.as_bytes(), |_| false, timeout).await?;
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

/// [`http`] `GET path`.
pub async fn http_get(addr: SocketAddr, path: &str, timeout: Duration) -> Result<String, String> {
    http(addr, "GET", path, "", timeout).await
}

/// `Ok` when `ok`, else an error saying what `asked` answered.
fn answered(ok: bool, asked: &str, answer: &str) -> Result<(), String> {
    match ok {
        true => Ok(()),
        false => Err(format!("{asked} answered {}", excerpt(answer))),
    }
}

/// Shortens a probe answer for an error message.
fn excerpt(text: &str) -> String {
    let flat: String = text.trim().replace(['\r', '\n'], " ");
    if flat.chars().count() > 160 {
        let cut: String = flat.chars().take(160).collect();
        format!("{cut}…")
    } else if flat.is_empty() {
        "(empty answer)".to_owned()
    } else {
        flat
    }
}

/// etcd is ready when `GET /health` says `"health":"true"`.
pub async fn etcd(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let answer = http_get(addr, "/health", timeout).await?;
    answered(answer.contains("\"health\":\"true\""), "/health", &answer)
}

/// ZooKeeper is ready when `srvr` reports a mode (before that it answers
/// "This ZooKeeper instance is not currently serving requests").
pub async fn zookeeper(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let answer = exchange(addr, b"srvr", |_| false, timeout).await?;
    let text = String::from_utf8_lossy(&answer);
    answered(text.contains("Mode:"), "srvr", &text)
}

/// Redis is ready when `PING` gets `+PONG`.
pub async fn redis(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let ping = b"*1\r\n$4\r\nPING\r\n";
    let answer = exchange(addr, ping, |a| a.ends_with(b"\r\n"), timeout).await?;
    let text = String::from_utf8_lossy(&answer);
    answered(text.starts_with("+PONG"), "PING", &text)
}

/// Azurite is ready when its blob endpoint answers HTTP at all (without
/// credentials the answer is an error status, which is fine).
pub async fn azurite(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    let answer = http_get(addr, "/devstoreaccount1?comp=list", timeout).await?;
    answered(answer.starts_with("HTTP/1."), "blob endpoint", &answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_flattens_and_shortens() {
        assert_eq!(excerpt("a\r\nb\n"), "a  b");
        assert_eq!(excerpt("  "), "(empty answer)");
        let long = "x".repeat(500);
        assert_eq!(excerpt(&long).chars().count(), 161);
    }

    #[tokio::test]
    async fn probe_of_a_closed_port_fails_with_connect_error() {
        let port = crate::os::free_port().unwrap();
        let err = redis(crate::os::loopback(port), Duration::from_secs(2))
            .await
            .unwrap_err();
        assert!(err.starts_with("connect:"), "{err}");
    }
}
