//! TLS for etcd (`etcds://`), Redis (`rediss://`) and PostgreSQL
//! (`postgres://…?sslmode=verify-full`) against real servers that serve TLS only and
//! require client certificates, with every certificate made in the test by `rcgen`: a
//! CA, a server certificate for 127.0.0.1 and a client certificate signed by it, and a
//! second, unrelated CA with its own client certificate. The right CA and client
//! certificate elect a leader; a wrong CA, a missing or foreign client certificate, or
//! plain text to the TLS port fail within the connect timeout, never a hang: etcd and
//! Redis with `Unauthorized` or `Unavailable` (plain text: `Unavailable` or `Timeout`),
//! PostgreSQL always with `Unauthorized` (it negotiates TLS on its own port, and
//! `pg_hba.conf` refuses a plain startup). A Redis and a PostgreSQL that do not ask for
//! client certificates are verified with the CA alone; PostgreSQL's server certificate
//! must also name the host connected to, and a PostgreSQL without TLS is refused
//! (`Unauthorized`) when TLS is asked for.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    SanType,
};
use tenure::connect;
use tenure_core::ErrorKind;
use tenure_integration::cluster_faults::elect_and_resign;
use tenure_integration::{free_port, EtcdServer, PostgresServer, RedisServer};

/// The connect timeout the failing connections are given, and the slack on top of it
/// within which they must have failed.
const CONNECT_TIMEOUT_MS: u64 = 1000;
const SLACK: Duration = Duration::from_secs(4);

/// Certificates in a temporary directory: `ca.pem`, `server.pem`/`server.key` (for
/// `localhost` and 127.0.0.1), `ip-server.pem`/`ip-server.key` (for 127.0.0.1 only),
/// `client.pem`/`client.key` (signed by `ca`), `other-ca.pem` and
/// `other-client.pem`/`other-client.key` (signed by the other CA). The client
/// certificates name PostgreSQL's user ([`PostgresServer::USER`]) as their common name,
/// which `clientcert=verify-full` checks; etcd and Redis ignore it.
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
        // A server certificate for 127.0.0.1 and the DNS names `names`, or (`None`) a
        // client certificate.
        let leaf = |issuer: &Issuer<'_, KeyPair>, server: Option<&[&str]>| {
            let key = KeyPair::generate().expect("key");
            let names = server.unwrap_or_default().iter().map(|n| n.to_string());
            let mut params = CertificateParams::new(names.collect::<Vec<_>>()).expect("params");
            if server.is_some() {
                params
                    .subject_alt_names
                    .push(SanType::IpAddress([127, 0, 0, 1].into()));
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
                params
                    .distinguished_name
                    .push(DnType::CommonName, "127.0.0.1");
            } else {
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
                params
                    .distinguished_name
                    .push(DnType::CommonName, PostgresServer::USER);
            }
            let cert = params.signed_by(&key, issuer).expect("sign");
            (cert.pem(), key.serialize_pem())
        };
        let (ca_pem, ca) = make_ca("CA");
        let (other_pem, other) = make_ca("other CA");
        write("ca.pem", ca_pem);
        write("other-ca.pem", other_pem);
        for (name, issuer, server) in [
            ("server", &ca, Some(&["localhost"][..])),
            ("ip-server", &ca, Some(&[][..])),
            ("client", &ca, None),
            ("other-client", &other, None),
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

/// `connect(url)` fails with one of `kinds` within the connect timeout plus slack; the
/// error.
async fn fails(what: &str, url: String, kinds: &[ErrorKind]) -> tenure_core::Error {
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
            e
        }
    }
}

/// A TLS URL: `base` (the URL up to its query, ending in `?` or `&`) with the CA file
/// `ca`, the client certificate and key `client`, and the short timeouts.
fn tls_url(base: &str, ca: &Path, client: Option<(&Path, &Path)>) -> String {
    let mut url = format!(
        "{base}ca={}&connect_timeout_ms={CONNECT_TIMEOUT_MS}&request_timeout_ms={CONNECT_TIMEOUT_MS}",
        ca.display()
    );
    if let Some((cert, key)) = client {
        url.push_str(&format!("&cert={}&key={}", cert.display(), key.display()));
    }
    url
}

/// The start of a TLS URL to the store at `port` whose TLS scheme is `secure`, for
/// [`tls_url`].
fn tls_base(secure: &str, port: u16) -> String {
    format!("{secure}://127.0.0.1:{port}?")
}

/// The start of a URL to the local PostgreSQL at `host` (`127.0.0.1:port`,
/// `localhost:port`) as its trusted superuser; with `tls`, verifying its certificate.
fn postgres_base(host: &str, tls: bool) -> String {
    let (user, db) = (PostgresServer::USER, PostgresServer::DATABASE);
    let mode = if tls { "sslmode=verify-full&" } else { "" };
    format!("postgres://{user}@{host}/{db}?{mode}")
}

const REFUSED: &[ErrorKind] = &[ErrorKind::Unauthorized, ErrorKind::Unavailable];
const NO_ANSWER: &[ErrorKind] = &[ErrorKind::Unavailable, ErrorKind::Timeout];
const UNAUTHORIZED: &[ErrorKind] = &[ErrorKind::Unauthorized];

/// The same checks on a store that serves TLS only and requires client certificates
/// (`base` starts its TLS URLs, for [`tls_url`]; `plain` is a URL without TLS to the
/// same port): the right CA and client certificate elect a leader (the server may take
/// a moment after it listens before it serves); a wrong CA, no client certificate or a
/// foreign one are refused with one of `refused`, plain text to the TLS port with one
/// of `plain_kinds`.
async fn mutual_tls(
    base: &str,
    plain: &str,
    refused: &[ErrorKind],
    plain_kinds: &[ErrorKind],
    pki: &Pki,
) {
    let (ca, other_ca) = (pki.path("ca.pem"), pki.path("other-ca.pem"));
    let client = (pki.path("client.pem"), pki.path("client.key"));
    let other = (pki.path("other-client.pem"), pki.path("other-client.key"));
    let client = Some((client.0.as_path(), client.1.as_path()));
    let url = tls_url(base, &ca, client);
    let started = Instant::now();
    let backend = loop {
        match connect(&url).await {
            Ok(b) => break b,
            Err(e) if started.elapsed() < Duration::from_secs(20) => {
                eprintln!("{base} not ready yet: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{base} with the right certificates: {e}"),
        }
    };
    elect_and_resign(backend, Duration::from_secs(2), "tls").await;
    let other = Some((other.0.as_path(), other.1.as_path()));
    let plain = format!(
        "{plain}connect_timeout_ms={CONNECT_TIMEOUT_MS}&request_timeout_ms={CONNECT_TIMEOUT_MS}"
    );
    for (what, url, kinds) in [
        ("the wrong CA", tls_url(base, &other_ca, client), refused),
        ("no client certificate", tls_url(base, &ca, None), refused),
        (
            "a client certificate from another CA",
            tls_url(base, &ca, other),
            refused,
        ),
        ("plain text to the TLS port", plain, plain_kinds),
    ] {
        fails(&format!("{base} with {what}"), url, kinds).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_with_generated_certificates() {
    let pki = Pki::new();
    let server = etcd(&pki).await;
    let port = server.addr().port();
    let plain = format!("etcd://127.0.0.1:{port}?");
    mutual_tls(&tls_base("etcds", port), &plain, REFUSED, NO_ANSWER, &pki).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_with_generated_certificates() {
    let pki = Pki::new();
    let server = redis(&pki, true).await;
    let port = server.addr().port();
    let plain = format!("redis://127.0.0.1:{port}?");
    mutual_tls(&tls_base("rediss", port), &plain, REFUSED, NO_ANSWER, &pki).await;
}

/// A Redis that serves TLS without asking for client certificates: the CA alone is
/// enough; without it the system's roots do not know the issuer (`Unauthorized`), and a
/// CA file that cannot be read is bad input naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_verifies_the_server_with_its_ca() {
    let pki = Pki::new();
    let server = redis(&pki, false).await;
    let ca = pki.path("ca.pem");
    let backend = connect(&tls_url(
        &tls_base("rediss", server.addr().port()),
        &ca,
        None,
    ))
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

/// A PostgreSQL that serves TLS only (`hostssl` in `pg_hba.conf`) with the certificate
/// `name` (`server`, `ip-server`) from `pki`.
async fn postgres(pki: &Pki, name: &str) -> PostgresServer {
    let read = |file: String| std::fs::read_to_string(pki.path(&file)).expect("read a PEM file");
    let (cert, key) = (read(format!("{name}.pem")), read(format!("{name}.key")));
    let server = PostgresServer::start_with_tls(&cert, &key)
        .await
        .expect("postgres with TLS");
    server.require_local("it serves TLS with the test's certificates");
    server.require_tls().await.expect("require TLS");
    server
}

/// A PostgreSQL that serves TLS only and does not ask for client certificates: the CA
/// alone is enough to elect; a plain startup is refused by `pg_hba.conf`
/// (`Unauthorized`, the server's reason in the line); a wrong CA, or a certificate that
/// does not name the host connected to (`localhost` where it names only 127.0.0.1), is
/// `Unauthorized`; a CA file that cannot be read is bad input naming the parameter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_verifies_the_server_with_its_ca_and_name() {
    let pki = Pki::new();
    let server = postgres(&pki, "ip-server").await;
    let port = server.addr().port();
    let (ca, other_ca) = (pki.path("ca.pem"), pki.path("other-ca.pem"));
    let at = |host: &str, tls| postgres_base(&format!("{host}:{port}"), tls);
    let backend = connect(&tls_url(&at("127.0.0.1", true), &ca, None))
        .await
        .expect("PostgreSQL over TLS with the CA only");
    elect_and_resign(backend, Duration::from_secs(2), "tls").await;
    let timeouts =
        format!("connect_timeout_ms={CONNECT_TIMEOUT_MS}&request_timeout_ms={CONNECT_TIMEOUT_MS}");
    for (what, url, says) in [
        (
            "no TLS",
            format!("{}{timeouts}", at("127.0.0.1", false)),
            "no encryption",
        ),
        (
            "sslmode=disable",
            format!("{}sslmode=disable&{timeouts}", at("127.0.0.1", false)),
            "no encryption",
        ),
        (
            "the wrong CA",
            tls_url(&at("127.0.0.1", true), &other_ca, None),
            "UnknownIssuer",
        ),
        (
            "a certificate for another name",
            tls_url(&at("localhost", true), &ca, None),
            "certificate not valid for name \"localhost\"",
        ),
    ] {
        let what = format!("postgres:// with {what}");
        let e = fails(&what, url, UNAUTHORIZED).await;
        let line = tenure_core::one_line(&e);
        assert!(line.contains(says), "{what}: {line}");
    }
    let err = connect(&format!("{}ca=/no/such/ca.pem", at("127.0.0.1", true)))
        .await
        .expect_err("a CA file that does not exist");
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.message().starts_with("ca:"), "{err}");
}

/// A PostgreSQL without TLS (`ssl=off`), asked for `sslmode=verify-full`: it cannot be
/// identified, which no retry changes, so `Unauthorized` (as a certificate that does
/// not verify), the reason in the line; never a plain connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_without_tls_is_refused_when_tls_is_asked_for() {
    let pki = Pki::new();
    let server = PostgresServer::start().await.expect("postgres");
    server.require_local("its ssl setting must be off");
    assert_eq!(server.sql("SHOW ssl").await.expect("show ssl"), "off");
    let base = postgres_base(&format!("127.0.0.1:{}", server.addr().port()), true);
    let url = tls_url(&base, &pki.path("ca.pem"), None);
    let what = "postgres:// with sslmode=verify-full to a server without TLS";
    let line = tenure_core::one_line(&fails(what, url, UNAUTHORIZED).await);
    assert!(
        line.contains("server does not support TLS"),
        "{what}: {line}"
    );
}

/// A PostgreSQL that serves TLS only and requires a client certificate signed by the
/// CA and naming the user (`hostssl … clientcert=verify-full`, `ssl_ca_file` set with
/// `ALTER SYSTEM` and reloaded): the shared checks, every refusal `Unauthorized` (no
/// client certificate and a plain startup are refused by the server with SQLSTATE
/// 28000; a foreign client certificate by a TLS alert, `UnknownCA`, which is no outage
/// to wait out either).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_with_generated_certificates() {
    let pki = Pki::new();
    let server = postgres(&pki, "server").await;
    let data = server.data_dir().expect("a local server's data directory");
    // In the data directory, where the server's user can read it.
    let client_ca = data.join("client-ca.pem");
    std::fs::copy(pki.path("ca.pem"), &client_ca).expect("copy the CA");
    set_readable(&client_ca);
    let hba = "local all all trust\n\
               hostssl all all 127.0.0.1/32 trust clientcert=verify-full\n";
    std::fs::write(data.join("pg_hba.conf"), hba).expect("write pg_hba.conf");
    let path = client_ca.display().to_string();
    server
        .sql(&format!("ALTER SYSTEM SET ssl_ca_file = '{path}'"))
        .await
        .expect("set ssl_ca_file");
    server.sql("SELECT pg_reload_conf()").await.expect("reload");
    // A new backend forks from the postmaster, so once one shows the new setting the
    // postmaster has reloaded it, and pg_hba.conf with it.
    let started = Instant::now();
    while server.sql("SHOW ssl_ca_file").await.expect("show") != path {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "ssl_ca_file not reloaded"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let host = format!("127.0.0.1:{}", server.addr().port());
    mutual_tls(
        &postgres_base(&host, true),
        &postgres_base(&host, false),
        UNAUTHORIZED,
        UNAUTHORIZED,
        &pki,
    )
    .await;
}

/// Makes `path` readable by everyone (the server runs as another user under root).
fn set_readable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
}
