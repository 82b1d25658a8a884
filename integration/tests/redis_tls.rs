//! `rediss://` against a real Redis serving TLS only: certificates made with the
//! `openssl` command in a temporary directory, the server verified with its CA, and
//! client certificates when the server asks for them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tenure_core::{Candidate, ElectionName, ErrorKind, Session, Timing};
use tenure_redis::RedisBackend;

/// A `redis-server` child serving TLS only, killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (apt package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by it.
fn certificates(dir: &Path) {
    // Extensions make version 3 certificates, which rustls requires.
    for (name, ext) in [
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write ext");
    }
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=tenure test CA",
        ],
    );
    for name in ["server", "client"] {
        let (key, csr, pem, ext, subject) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
            format!("/CN=tenure test {name}"),
        );
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subject,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
    }
}

async fn start(client_certificates: bool) -> TlsRedis {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let port = tenure_integration::free_port().expect("port");
    let file = |n: &str| dir.path().join(n).into_os_string();
    let child = Command::new("redis-server")
        .arg("--port")
        .arg("0")
        .arg("--tls-port")
        .arg(port.to_string())
        .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir.path())
        .arg("--tls-cert-file")
        .arg(file("server.pem"))
        .arg("--tls-key-file")
        .arg(file("server.key"))
        .arg("--tls-ca-cert-file")
        .arg(file("ca.pem"))
        .arg("--tls-auth-clients")
        .arg(if client_certificates { "yes" } else { "no" })
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server (apt package redis-server)");
    let server = TlsRedis {
        child,
        port,
        _dir: dir,
    };
    // Ready once it accepts TCP connections.
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "redis-server with TLS did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
}

fn path(server: &TlsRedis, name: &str) -> PathBuf {
    server._dir.path().join(name)
}

async fn elect_and_resign(backend: RedisBackend) {
    let session = Session::open(Arc::new(backend), Timing::from_ttl(Duration::from_secs(2)))
        .await
        .expect("session");
    let election = ElectionName::new("tls/check").expect("name");
    let l = session
        .campaign(&election, &Candidate::new("a").expect("id"))
        .await
        .expect("campaign");
    assert!(l.is_leader());
    assert_eq!(
        session
            .leader(&election)
            .await
            .expect("leader")
            .map(|i| i.token),
        Some(l.token())
    );
    l.resign().await.expect("resign");
    session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_verifies_the_server_with_its_ca() {
    let server = start(false).await;
    let ca = path(&server, "ca.pem");
    let url = format!(
        "rediss://127.0.0.1:{}?ca={}&connect_timeout_ms=2000",
        server.port,
        ca.display()
    );
    elect_and_resign(RedisBackend::from_url(&url).await.expect("TLS with the CA")).await;
    // Without the CA the system's roots do not know the server's issuer.
    let err = RedisBackend::from_url(&format!(
        "rediss://127.0.0.1:{}?connect_timeout_ms=2000",
        server.port
    ))
    .await
    .expect_err("an unknown issuer");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    // Plain text to a TLS port gets no answer it understands: an error, not a hang.
    let started = Instant::now();
    let err = RedisBackend::from_url(&format!(
        "redis://127.0.0.1:{}?connect_timeout_ms=700",
        server.port
    ))
    .await
    .expect_err("plain text to a TLS port");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // A CA file that cannot be read is bad input, naming the parameter.
    let err = RedisBackend::from_url(&format!(
        "rediss://127.0.0.1:{}?ca=/no/such/ca.pem",
        server.port
    ))
    .await
    .expect_err("missing CA file");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().starts_with("ca:"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_client_certificate() {
    let server = start(true).await;
    let (ca, cert, key) = (
        path(&server, "ca.pem"),
        path(&server, "client.pem"),
        path(&server, "client.key"),
    );
    let url = format!(
        "rediss://127.0.0.1:{}?ca={}&cert={}&key={}&connect_timeout_ms=2000",
        server.port,
        ca.display(),
        cert.display(),
        key.display()
    );
    elect_and_resign(RedisBackend::from_url(&url).await.expect("mutual TLS")).await;
    // Without a client certificate the server hangs up.
    let err = RedisBackend::from_url(&format!(
        "rediss://127.0.0.1:{}?ca={}&connect_timeout_ms=2000",
        server.port,
        ca.display()
    ))
    .await
    .expect_err("no client certificate");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Unauthorized),
        "{err}"
    );
}
