//! TLS for etcd (`etcds://`) and Redis (`rediss://`) against real servers that serve TLS
//! only and require client certificates, with every certificate made in the test by
//! `rcgen`: a CA, a server certificate for 127.0.0.1 and a client certificate signed by
//! it, and a second, unrelated CA with its own client certificate. The right CA and
//! client certificate elect a leader; a wrong CA, a missing or foreign client
//! certificate, or plain text to the TLS port fail with `Unauthorized` or `Unavailable`
//! (plain text: `Unavailable` or `Timeout`) within the connect timeout, never a hang.
//! A Redis that does not ask for client certificates is verified with the CA alone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use tenure::connect;
use tenure_core::ErrorKind;
use tenure_integration::cluster_faults::elect_and_resign;
use tenure_integration::{free_port, EtcdServer, RedisServer};

/// The connect timeout the failing connections are given, and the slack on top of it
/// within which they must have failed.
const CONNECT_TIMEOUT_MS: u64 = 1000;
const SLACK: Duration = Duration::from_secs(4);

/// Certificates in a temporary directory: `ca.pem`, `server.pem`/`server.key`,
/// `client.pem`/`client.key` (signed by `ca`), `other-ca.pem` and
/// `other-client.pem`/`other-client.key` (signed by the other CA).
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write a certificate file")
        };
        let make_ca = |name: &str| {
            let key = KeyPair::generate().expect("CA key");
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(DnType::CommonName, format!("tenure test {name}"));
            let cert = params.self_signed(&key).expect("self-signed CA");
            (cert.pem(), Issuer::new(params, key))
        };
        let leaf = |issuer: &Issuer<'_, KeyPair>, server: bool| {
            let key = KeyPair::generate().expect("key");
            let names = if server {
                vec!["localhost".to_owned()]
            } else {
                Vec::new()
            };
            let mut params = CertificateParams::new(names).expect("params");
            if server {
                params
                    .subject_alt_names
                    .push(SanType::IpAddress([127, 0, 0, 1].into()));
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params
                    .distinguished_name
                    .push(DnType::CommonName, "localhost");
            } else {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                params
                    .distinguished_name
                    .push(DnType::CommonName, "tenure test client");
            }
            let cert = params.signed_by(&key, issuer).expect("sign");
            (cert.pem(), key.serialize_pem())
        };
        let (ca_pem, ca) = make_ca("CA");
        let (other_pem, other) = make_ca("other CA");
        write("ca.pem", ca_pem);
        write("other-ca.pem", other_pem);
        for (name, issuer, server) in [
            ("server", &ca, true),
            ("client", &ca, false),
            ("other-client", &other, false),
        ] {
            let (cert, key) = leaf(issuer, server);
            write(&format!("{name}.pem"), cert);
            write(&format!("{name}.key"), key);
        }
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A server's flags naming its certificate, its key and the CA it trusts.
    fn server_flags(&self, cert: &str, key: &str, ca: &str) -> Vec<String> {
        let files = [(cert, "server.pem"), (key, "server.key"), (ca, "ca.pem")];
        let path = |file| self.path(file).display().to_string();
        files
            .iter()
            .flat_map(|(flag, file)| [flag.to_string(), path(file)])
            .collect()
    }
}

/// etcd serving clients over TLS only, requiring a client certificate from `ca`.
async fn etcd(pki: &Pki) -> EtcdServer {
    let peer = format!("http://127.0.0.1:{}", free_port().expect("port"));
    let server = EtcdServer::start_with_args(|data, port| {
        let client = format!("https://127.0.0.1:{port}");
        let mut args = words(&format!(
            "--name e1 --listen-client-urls {client} --advertise-client-urls {client} \
             --listen-peer-urls {peer} --initial-advertise-peer-urls {peer} \
             --initial-cluster e1={peer} --initial-cluster-state new --heartbeat-interval 10 \
             --election-timeout 100 --client-cert-auth --logger zap --log-level error"
        ));
        args.extend(["--data-dir".into(), data.display().to_string()]);
        args.extend(pki.server_flags("--cert-file", "--key-file", "--trusted-ca-file"));
        args
    });
    server.await.expect("etcd with TLS")
}

/// Redis serving TLS only; with `client_auth`, requiring a client certificate from `ca`.
async fn redis(pki: &Pki, client_auth: bool) -> RedisServer {
    let auth = if client_auth { "yes" } else { "no" };
    let server = RedisServer::start_with_args(|data, port| {
        let mut args = words(&format!(
            "--port 0 --tls-port {port} --bind 127.0.0.1 --appendonly no --tls-auth-clients {auth}"
        ));
        args.extend(["--save".into(), String::new(), "--dir".into()]);
        args.push(data.display().to_string());
        args.extend(pki.server_flags("--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"));
        args
    });
    server.await.expect("redis-server with TLS")
}

/// The words of `text`.
fn words(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

/// `connect(url)` fails with one of `kinds` within the connect timeout plus slack.
async fn fails(what: &str, url: String, kinds: &[ErrorKind]) {
    let started = Instant::now();
    let limit = Duration::from_millis(CONNECT_TIMEOUT_MS) + SLACK;
    let outcome = tokio::time::timeout(limit, connect(&url)).await;
    let took = started.elapsed();
    match outcome {
        Err(_) => panic!("{what}: no answer within {limit:?}"),
        Ok(Ok(_)) => panic!("{what}: connected"),
        Ok(Err(e)) => {
            eprintln!("{what}: {:?} after {took:?}: {e}", e.kind());
            assert!(kinds.contains(&e.kind()), "{what}: {:?}: {e}", e.kind());
        }
    }
}

fn tls_url(scheme: &str, port: u16, ca: &Path, client: Option<(&Path, &Path)>) -> String {
    let mut url = format!(
        "{scheme}://127.0.0.1:{port}?ca={}&connect_timeout_ms={CONNECT_TIMEOUT_MS}&request_timeout_ms={CONNECT_TIMEOUT_MS}",
        ca.display()
    );
    if let Some((cert, key)) = client {
        url.push_str(&format!("&cert={}&key={}", cert.display(), key.display()));
    }
    url
}

const REFUSED: &[ErrorKind] = &[ErrorKind::Unauthorized, ErrorKind::Unavailable];
const NO_ANSWER: &[ErrorKind] = &[ErrorKind::Unavailable, ErrorKind::Timeout];

/// The same checks on a store that serves TLS only and requires client certificates
/// (`plain` and `secure` are its two schemes): the right CA and client certificate
/// elect a leader (the server may take a moment after it listens before it serves);
/// a wrong CA, no client certificate or a foreign one are refused; plain text to the
/// TLS port gets no answer.
async fn mutual_tls(plain: &str, secure: &str, pki: &Pki, port: u16) {
    let (ca, other_ca) = (pki.path("ca.pem"), pki.path("other-ca.pem"));
    let client = (pki.path("client.pem"), pki.path("client.key"));
    let other = (pki.path("other-client.pem"), pki.path("other-client.key"));
    let client = Some((client.0.as_path(), client.1.as_path()));
    let url = tls_url(secure, port, &ca, client);
    let started = Instant::now();
    let backend = loop {
        match connect(&url).await {
            Ok(b) => break b,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                eprintln!("{secure}:// not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{secure}:// with the right certificates: {e}"),
        }
    };
    elect_and_resign(backend, Duration::from_secs(2), "tls").await;
    let other = Some((other.0.as_path(), other.1.as_path()));
    for (what, url, kinds) in [
        ("the wrong CA", tls_url(secure, port, &other_ca, client), REFUSED),
        ("no client certificate", tls_url(secure, port, &ca, None), REFUSED),
        (
            "a client certificate from another CA",
            tls_url(secure, port, &ca, other),
            REFUSED,
        ),
        (
            "plain text to the TLS port",
            format!(
                "{plain}://127.0.0.1:{port}?connect_timeout_ms={CONNECT_TIMEOUT_MS}&request_timeout_ms={CONNECT_TIMEOUT_MS}"
            ),
            NO_ANSWER,
        ),
    ] {
        fails(&format!("{secure}:// with {what}"), url, kinds).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_generated_certificates() {
    let pki = Pki::new();
    let server = etcd(&pki).await;
    mutual_tls("etcd", "etcds", &pki, server.addr().port()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_generated_certificates() {
    let pki = Pki::new();
    let server = redis(&pki, true).await;
    mutual_tls("redis", "rediss", &pki, server.addr().port()).await;
}

/// A Redis that serves TLS without asking for client certificates: the CA alone is
/// enough; without it the system's roots do not know the issuer (`Unauthorized`), and a
/// CA file that cannot be read is bad input naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_verifies_the_server_with_its_ca() {
    let pki = Pki::new();
    let server = redis(&pki, false).await;
    let ca = pki.path("ca.pem");
    let backend = connect(&tls_url("rediss", server.addr().port(), &ca, None))
        .await
        .expect("Redis over TLS with the CA only");
    elect_and_resign(backend, Duration::from_secs(2), "tls").await;
    let started = Instant::now();
    let err = connect(&format!(
        "rediss://127.0.0.1:{}?connect_timeout_ms={CONNECT_TIMEOUT_MS}",
        server.addr().port()
    ))
    .await
    .expect_err("an issuer the system's roots do not know");
    assert_eq!(err.kind(), ErrorKind::Unauthorized, "{err}");
    assert!(started.elapsed() < Duration::from_millis(CONNECT_TIMEOUT_MS) + SLACK);
    let err = connect(&format!(
        "rediss://127.0.0.1:{}?ca=/no/such/ca.pem",
        server.addr().port()
    ))
    .await
    .expect_err("a CA file that does not exist");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().starts_with("ca:"), "{err}");
}
