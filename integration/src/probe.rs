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

/// What a PostgreSQL server answers first to a StartupMessage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostgresAnswer {
    /// An authentication message (`R`) with its code: 0 is AuthenticationOk (the server
    /// let the user in, e.g. with `trust`), 3 a cleartext password request, 5 an MD5
    /// one, 10 SASL (SCRAM-SHA-256).
    Authentication(u32),
    /// An error (`E`): its SQLSTATE (e.g. `57P03`, "the database system is starting
    /// up"; `28000`, no `pg_hba.conf` entry or no such role; `28P01`, wrong password)
    /// and message.
    Error {
        /// The SQLSTATE code (field `C`).
        code: String,
        /// The primary message (field `M`).
        message: String,
    },
}

/// The AuthenticationOk code of an [`PostgresAnswer::Authentication`].
pub const POSTGRES_AUTH_OK: u32 = 0;

/// A PostgreSQL StartupMessage (protocol 3.0) for `user` and `database`.
pub fn postgres_startup(user: &str, database: &str) -> Vec<u8> {
    let mut body = 196_608u32.to_be_bytes().to_vec(); // 3 << 16 | 0: protocol 3.0
    for (key, value) in [
        ("user", user),
        ("database", database),
        ("application_name", "tenure-harness-probe"),
    ] {
        for text in [key, value] {
            body.extend_from_slice(text.as_bytes());
            body.push(0);
        }
    }
    body.push(0);
    let mut message = u32::try_from(body.len() + 4)
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    message.extend(body);
    message
}

/// The first authentication or error message in what a PostgreSQL server sent after a
/// StartupMessage (notices before it are skipped); `None` while it is incomplete, an
/// error for bytes that are not such an answer.
pub fn postgres_answer(bytes: &[u8]) -> Option<Result<PostgresAnswer, String>> {
    let mut rest = bytes;
    loop {
        let (&tag, after) = rest.split_first()?;
        let length = after.get(..4)?;
        let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
        if !(4..=MAX_ANSWER).contains(&length) {
            return Some(Err(format!(
                "a message {:?} of length {length}",
                char::from(tag)
            )));
        }
        let payload = after.get(4..length)?;
        match tag {
            b'R' => {
                return Some(match payload.get(..4) {
                    Some(c) => Ok(PostgresAnswer::Authentication(u32::from_be_bytes([
                        c[0], c[1], c[2], c[3],
                    ]))),
                    None => Err("an authentication message without a code".to_owned()),
                })
            }
            b'E' => return Some(Ok(postgres_error(payload))),
            b'N' => rest = &after[length..],
            other => {
                return Some(Err(format!(
                    "a message of type {:?}, not authentication or error",
                    char::from(other)
                )))
            }
        }
    }
}

/// The SQLSTATE and message of an ErrorResponse body: fields of a type byte and a
/// NUL-terminated text, ended by a NUL.
fn postgres_error(payload: &[u8]) -> PostgresAnswer {
    let (mut code, mut message) = (String::new(), String::new());
    let mut rest = payload;
    while let Some((&field, after)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let end = after.iter().position(|&b| b == 0).unwrap_or(after.len());
        let text = String::from_utf8_lossy(&after[..end]).into_owned();
        match field {
            b'C' => code = text,
            b'M' => message = text,
            _ => {}
        }
        rest = after.get(end + 1..).unwrap_or_default();
    }
    PostgresAnswer::Error { code, message }
}

/// Sends a StartupMessage for `user` and `database` to the PostgreSQL server at `addr`
/// (plain TCP, no TLS) and returns its first answer. The connection is then dropped.
pub async fn postgres_hello(
    addr: SocketAddr,
    user: &str,
    database: &str,
    timeout: Duration,
) -> Result<PostgresAnswer, String> {
    let startup = postgres_startup(user, database);
    let done = |a: &[u8]| postgres_answer(a).is_some();
    let answer = exchange(addr, &startup, done, timeout).await?;
    match postgres_answer(&answer) {
        Some(parsed) => parsed.map_err(|why| format!("startup answered {why}")),
        None => Err(format!(
            "startup answered {}",
            excerpt(&String::from_utf8_lossy(&answer))
        )),
    }
}

/// PostgreSQL is ready when a StartupMessage for the user `tenure` and database
/// `postgres` gets through its start-up checks: answered by AuthenticationOk, by a
/// request for a password, or by an authentication error (SQLSTATE class 28: no
/// `pg_hba.conf` entry, as on a TLS-only server, or no such role); the server checks
/// those only once it accepts connections. Any other error (`57P03`, "the database
/// system is starting up") is not ready.
pub async fn postgres(addr: SocketAddr, timeout: Duration) -> Result<(), String> {
    postgres_ready(postgres_hello(addr, "tenure", "postgres", timeout).await?)
}

/// Whether a startup answer means the server accepts connections.
fn postgres_ready(answer: PostgresAnswer) -> Result<(), String> {
    match answer {
        PostgresAnswer::Authentication(_) => Ok(()),
        PostgresAnswer::Error { code, .. } if code.starts_with("28") => Ok(()),
        PostgresAnswer::Error { code, message } => {
            Err(format!("startup answered SQLSTATE {code}: {message}"))
        }
    }
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

    /// A backend message: `tag`, its length, `body`.
    fn message(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn postgres_startup_is_a_protocol_3_startup_message() {
        let m = postgres_startup("tenure", "postgres");
        assert_eq!(
            u32::from_be_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(&m[4..8], &[0, 3, 0, 0]);
        let text = String::from_utf8_lossy(&m[8..]);
        assert!(
            text.starts_with("user\0tenure\0database\0postgres\0"),
            "{text:?}"
        );
        assert!(text.ends_with("\0\0"), "{text:?}");
    }

    #[test]
    fn postgres_answers_are_parsed() {
        // AuthenticationOk, followed by more (ParameterStatus…): only the first counts.
        let mut ok = message(b'R', &0u32.to_be_bytes());
        ok.extend(message(b'S', b"server_version\x0015.1\x00"));
        assert_eq!(
            postgres_answer(&ok),
            Some(Ok(PostgresAnswer::Authentication(POSTGRES_AUTH_OK)))
        );
        // SASL, after a notice.
        let mut sasl = message(b'N', b"SNOTICE\x00Mhello\x00\x00");
        sasl.extend(message(b'R', &[0, 0, 0, 10, b'S', b'C', b'R', b'A', b'M']));
        assert_eq!(
            postgres_answer(&sasl),
            Some(Ok(PostgresAnswer::Authentication(10)))
        );
        let starting = message(
            b'E',
            b"SFATAL\x00VFATAL\x00C57P03\x00Mthe database system is starting up\x00\x00",
        );
        let error = PostgresAnswer::Error {
            code: "57P03".into(),
            message: "the database system is starting up".into(),
        };
        assert_eq!(postgres_answer(&starting), Some(Ok(error.clone())));
        let err = postgres_ready(error).unwrap_err();
        assert!(
            err.contains("57P03") && err.contains("starting up"),
            "{err}"
        );
        // Incomplete: nothing yet.
        for cut in [0, 1, 4, starting.len() - 1] {
            assert_eq!(postgres_answer(&starting[..cut]), None, "{cut}");
        }
        // Not PostgreSQL at all.
        assert!(matches!(postgres_answer(b"HTTP/1.1 400 Bad"), Some(Err(_))));
        assert!(matches!(
            postgres_answer(&message(b'Z', b"I")),
            Some(Err(_))
        ));
        assert!(matches!(postgres_answer(&message(b'R', b"")), Some(Err(_))));
    }

    #[test]
    fn postgres_is_ready_once_past_its_start_up_checks() {
        assert_eq!(postgres_ready(PostgresAnswer::Authentication(0)), Ok(()));
        assert_eq!(postgres_ready(PostgresAnswer::Authentication(10)), Ok(()));
        let no_entry = PostgresAnswer::Error {
            code: "28000".into(),
            message: "no pg_hba.conf entry for host \"127.0.0.1\", no encryption".into(),
        };
        assert_eq!(postgres_ready(no_entry), Ok(()));
        let too_many = PostgresAnswer::Error {
            code: "53300".into(),
            message: "sorry, too many clients already".into(),
        };
        assert!(postgres_ready(too_many).is_err());
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
