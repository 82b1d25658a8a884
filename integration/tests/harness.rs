//! Proves the harness against the real servers on this machine.
//!
//! Needs etcd, ZooKeeper, Redis, Azurite and PostgreSQL: `bash scripts/install-test-deps.sh`.
//! Run with `cargo test -p tenure-integration -- --test-threads=2`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tenure_integration::probe::{self, exchange, http, PostgresAnswer};
use tenure_integration::{
    check_fencing, check_fencing_at, monotonic_now_ns, tenures, AzuriteServer, CandidateProcess,
    EtcdServer, Event, FencingViolation, GuardedResource, HarnessError, LinkState, PostgresServer,
    RedisServer, TcpProxy, TenureEnd, WriteReply, ZooKeeperServer,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const QUICK: Duration = Duration::from_millis(500);
const PATIENT: Duration = Duration::from_secs(5);

/// The fault-injection life cycle every server handle must support:
/// answers; paused, does not; resumed, does; killed, refuses; restarted on
/// the same port with a new process, answers again.
macro_rules! check_lifecycle {
    ($server:expr, $ping:ident) => {{
        let server = &mut $server;
        let addr = server.addr();
        assert!(!server.is_external());
        probe::$ping(addr, PATIENT)
            .await
            .expect("answers after start");

        server.pause().unwrap();
        let err = probe::$ping(addr, QUICK)
            .await
            .expect_err("must not answer while paused");
        assert!(err.starts_with(probe::NO_ANSWER), "{err}");
        server.resume().unwrap();
        probe::$ping(addr, PATIENT)
            .await
            .expect("answers after resume");

        let pid = server.pid().unwrap();
        server.restart().await.unwrap();
        eprintln!(
            "{} restarted in {:?}",
            stringify!($ping),
            server.startup_time().unwrap()
        );
        assert_eq!(server.addr(), addr, "restart keeps the port");
        assert_ne!(server.pid().unwrap(), pid, "restart starts a new process");
        probe::$ping(addr, PATIENT)
            .await
            .expect("answers after restart");

        // Restarting a paused server works too.
        server.pause().unwrap();
        server.restart().await.unwrap();
        probe::$ping(addr, PATIENT)
            .await
            .expect("answers after restart from pause");

        server.kill().await.unwrap();
        assert!(server.pid().is_none());
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "killed server refuses"
        );
        assert!(matches!(
            server.pause(),
            Err(HarnessError::NotRunning { .. })
        ));
        server.restart().await.unwrap();
        probe::$ping(addr, PATIENT)
            .await
            .expect("answers after kill + restart");
    }};
}

#[tokio::test]
async fn etcd_server_lifecycle_and_data_survive_restart() {
    let mut etcd = EtcdServer::start().await.unwrap();
    eprintln!("etcd ready in {:?}", etcd.startup_time().unwrap());
    assert_eq!(etcd.endpoint(), format!("http://{}", etcd.addr()));
    let data_dir = etcd.data_dir().unwrap().to_path_buf();
    assert!(data_dir.join("member").is_dir(), "etcd uses the data dir");

    // key "tenure" = "v1", through etcd's JSON gateway (base64 fields).
    let put = http(
        etcd.addr(),
        "POST",
        "/v3/kv/put",
        r#"{"key":"dGVudXJl","value":"djE="}"#,
        PATIENT,
    )
    .await
    .unwrap();
    assert!(put.starts_with("HTTP/1.1 200"), "{put}");

    check_lifecycle!(etcd, etcd);

    assert_eq!(etcd.data_dir().unwrap(), data_dir);
    let range = http(
        etcd.addr(),
        "POST",
        "/v3/kv/range",
        r#"{"key":"dGVudXJl"}"#,
        PATIENT,
    )
    .await
    .unwrap();
    assert!(range.contains(r#""value":"djE=""#), "{range}");

    drop(etcd);
    assert!(!data_dir.exists(), "drop removes the data dir");
}

#[tokio::test]
async fn zookeeper_server_lifecycle() {
    let mut zk = ZooKeeperServer::start().await.unwrap();
    eprintln!("ZooKeeper ready in {:?}", zk.startup_time().unwrap());
    assert_eq!(zk.endpoint(), zk.addr().to_string());
    let srvr = exchange(zk.addr(), b"srvr", |_| false, PATIENT)
        .await
        .unwrap();
    let srvr = String::from_utf8_lossy(&srvr);
    assert!(srvr.contains("Mode: standalone"), "{srvr}");

    check_lifecycle!(zk, zookeeper);

    // tickTime=1000 shows in `conf`.
    let conf = exchange(zk.addr(), b"conf", |_| false, PATIENT)
        .await
        .unwrap();
    let conf = String::from_utf8_lossy(&conf);
    assert!(conf.contains("tickTime=1000"), "{conf}");
    assert!(conf.contains("maxSessionTimeout=20000"), "{conf}");
}

#[tokio::test]
async fn redis_server_lifecycle() {
    let mut redis = RedisServer::start().await.unwrap();
    eprintln!("Redis ready in {:?}", redis.startup_time().unwrap());
    assert_eq!(redis.endpoint(), format!("redis://{}", redis.addr()));
    check_lifecycle!(redis, redis);
}

#[tokio::test]
async fn azurite_server_lifecycle() {
    let mut azurite = AzuriteServer::start().await.unwrap();
    eprintln!("Azurite ready in {:?}", azurite.startup_time().unwrap());
    assert_eq!(
        azurite.endpoint(),
        format!("http://{}/devstoreaccount1", azurite.addr())
    );
    check_lifecycle!(azurite, azurite);
}

#[tokio::test]
async fn postgres_server_lifecycle_and_data_survive_restart() {
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(PostgresServer::ENV, "TENURE_TEST_POSTGRES");
    let mut pg = PostgresServer::start().await.unwrap();
    eprintln!("PostgreSQL ready in {:?}", pg.startup_time().unwrap());
    assert_eq!(
        pg.endpoint(),
        format!("postgres://tenure@{}/postgres", pg.addr())
    );
    let data_dir = pg.data_dir().unwrap().to_path_buf();
    assert!(
        data_dir.join("PG_VERSION").is_file(),
        "initdb made a cluster"
    );
    let mode = std::fs::metadata(&data_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "{mode:o}");
    assert_eq!(
        pg.sql("SELECT current_user, current_database()")
            .await
            .unwrap(),
        "tenure|postgres"
    );
    pg.sql("CREATE TABLE fence (token bigint); INSERT INTO fence VALUES (41), (42)")
        .await
        .unwrap();

    check_lifecycle!(pg, postgres);

    assert_eq!(pg.data_dir().unwrap(), data_dir);
    assert_eq!(pg.sql("SELECT max(token) FROM fence").await.unwrap(), "42");
    // A commit right before a crash (SIGKILL of every process) survives it.
    pg.sql("INSERT INTO fence VALUES (43)").await.unwrap();
    pg.kill().await.unwrap();
    pg.restart().await.unwrap();
    assert_eq!(pg.sql("SELECT max(token) FROM fence").await.unwrap(), "43");
    // And an orderly stop.
    pg.sql("INSERT INTO fence VALUES (44)").await.unwrap();
    pg.terminate().await.unwrap();
    assert!(pg.pid().is_none());
    pg.restart().await.unwrap();
    assert_eq!(pg.sql("SELECT max(token) FROM fence").await.unwrap(), "44");

    // An SQL error is an error, with PostgreSQL's message.
    let err = pg.sql("SELECT * FROM no_such_table").await.unwrap_err();
    assert!(err.to_string().contains("no_such_table"), "{err}");

    drop(pg);
    assert!(!data_dir.exists(), "drop removes the data dir");
}

/// Reads from `stream` into `buf` until it ends with ReadyForQuery (idle).
async fn read_until_ready(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let ready = [b'Z', 0, 0, 0, 5, b'I'];
    let mut chunk = [0u8; 4096];
    while !buf.ends_with(&ready) {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(())
}

#[tokio::test]
async fn postgres_pause_freezes_open_connections_too() {
    let pg = PostgresServer::start().await.unwrap();
    let mut stream = TcpStream::connect(pg.addr()).await.unwrap();
    stream
        .write_all(&probe::postgres_startup("tenure", "postgres"))
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(PATIENT, read_until_ready(&mut stream, &mut answer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        probe::postgres_answer(&answer),
        Some(Ok(PostgresAnswer::Authentication(probe::POSTGRES_AUTH_OK)))
    );

    // The backend of this open connection is paused with the postmaster.
    pg.pause().unwrap();
    let query = b"SELECT 'still' || 'here'\0";
    let mut message = vec![b'Q'];
    message.extend_from_slice(&(query.len() as u32 + 4).to_be_bytes());
    message.extend_from_slice(query);
    stream.write_all(&message).await.unwrap();
    let mut rows = Vec::new();
    let paused = tokio::time::timeout(QUICK, read_until_ready(&mut stream, &mut rows)).await;
    assert!(paused.is_err(), "a paused backend answered: {rows:?}");

    pg.resume().unwrap();
    tokio::time::timeout(PATIENT, read_until_ready(&mut stream, &mut rows))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&rows);
    assert!(text.contains("stillhere"), "{text:?}");
}

/// `psql` over TCP to `url` running `sql`: its output, or its error message.
fn psql_tcp(url: &str, sql: &str) -> Result<String, String> {
    let out = std::process::Command::new(PostgresServer::psql_program().unwrap())
        .args(["-X", "-q", "-t", "-A", "-d", url, "-c", sql])
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
    match out.status.success() {
        true => Ok(text(&out.stdout)),
        false => Err(text(&out.stderr)),
    }
}

#[tokio::test]
async fn postgres_requires_a_password_when_asked() {
    let mut pg = PostgresServer::start().await.unwrap();
    let addr = pg.addr();
    let url = |user: &str| format!("postgres://{user}@{addr}/postgres");
    assert_eq!(psql_tcp(&url("tenure"), "SELECT 1"), Ok("1".into()));

    pg.require_password("app", "s3cr'et").await.unwrap();
    for user in ["tenure", "app"] {
        let answer = probe::postgres_hello(addr, user, "postgres", PATIENT).await;
        assert_eq!(answer, Ok(PostgresAnswer::Authentication(10)), "{user}");
    }
    let err = psql_tcp(&url("tenure"), "SELECT 1").unwrap_err();
    assert!(err.contains("password"), "{err}");
    let err = psql_tcp(&url("app:wrong"), "SELECT 1").unwrap_err();
    assert!(err.contains("password authentication failed"), "{err}");
    // The role can log in with its password (SCRAM) and create tables.
    let app = url("app:s3cr%27et");
    let created = psql_tcp(&app, "CREATE TABLE t (x int); SELECT current_user");
    assert_eq!(created, Ok("app".into()));
    // The harness still gets in (its Unix socket stays trusted), and the rule survives
    // a restart.
    assert_eq!(pg.sql("SELECT count(*) FROM t").await.unwrap(), "0");
    pg.restart().await.unwrap();
    let answer = probe::postgres_hello(addr, "app", "postgres", PATIENT).await;
    assert_eq!(answer, Ok(PostgresAnswer::Authentication(10)));
    // Asking again changes the password of an existing role.
    pg.require_password("app", "other").await.unwrap();
    assert!(psql_tcp(&app, "SELECT 1").is_err());
    assert_eq!(psql_tcp(&url("app:other"), "SELECT 1"), Ok("1".into()));
}

#[tokio::test]
async fn postgres_serves_tls_and_can_require_it() {
    use rcgen::{CertificateParams, KeyPair, SanType};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = params.self_signed(&key).unwrap();

    // A plain server cannot be made TLS-only.
    let plain = PostgresServer::start().await.unwrap();
    let err = plain.require_tls().await.unwrap_err();
    assert!(err.to_string().contains("start_with_tls"), "{err}");
    drop(plain);

    let pg = PostgresServer::start_with_tls(&cert.pem(), &key.serialize_pem())
        .await
        .unwrap();
    assert!(!pg.is_external());
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let key_file = std::fs::metadata(pg.data_dir().unwrap().join("server.key")).unwrap();
    assert_eq!(key_file.permissions().mode() & 0o777, 0o600);
    let data_dir = std::fs::metadata(pg.data_dir().unwrap()).unwrap();
    assert_eq!(
        key_file.uid(),
        data_dir.uid(),
        "the key belongs to the server's user"
    );

    // SSLRequest: the server is willing ('S').
    let ssl_request = [0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f];
    let willing = exchange(pg.addr(), &ssl_request, |a| !a.is_empty(), PATIENT)
        .await
        .unwrap();
    assert_eq!(willing, b"S");
    let url = |mode: &str| format!("postgres://tenure@{}/postgres?sslmode={mode}", pg.addr());
    let over_tls = "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()";
    assert_eq!(psql_tcp(&url("require"), over_tls), Ok("t".into()));
    assert_eq!(psql_tcp(&url("disable"), over_tls), Ok("f".into()));

    pg.require_tls().await.unwrap();
    let answer = probe::postgres_hello(pg.addr(), "tenure", "postgres", PATIENT)
        .await
        .unwrap();
    assert!(
        matches!(&answer, PostgresAnswer::Error { code, .. } if code == "28000"),
        "{answer:?}"
    );
    let err = psql_tcp(&url("disable"), "SELECT 1").unwrap_err();
    assert!(err.contains("no encryption"), "{err}");
    assert_eq!(psql_tcp(&url("require"), over_tls), Ok("t".into()));
    // Still ready by the probe's measure (it got past the start-up checks).
    probe::postgres(pg.addr(), PATIENT).await.unwrap();
}

/// A local echo server for the proxy tests.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn echo_roundtrip(
    stream: &mut TcpStream,
    text: &[u8],
    timeout: Duration,
) -> Result<(), String> {
    stream.write_all(text).await.map_err(|e| e.to_string())?;
    let mut got = vec![0u8; text.len()];
    match tokio::time::timeout(timeout, stream.read_exact(&mut got)).await {
        Err(_) => Err("timed out".to_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(_)) if got == text => Ok(()),
        Ok(Ok(_)) => Err(format!("echoed {got:?}")),
    }
}

async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + PATIENT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn proxy_forwards_cuts_blackholes_and_heals() {
    let upstream = echo_server().await;
    let proxy = TcpProxy::start(upstream).await.unwrap();
    assert_eq!(proxy.upstream(), upstream);
    assert_eq!(proxy.state(), LinkState::Healthy);

    // Forwards.
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    echo_roundtrip(&mut a, b"hello", PATIENT).await.unwrap();
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    echo_roundtrip(&mut b, b"world", PATIENT).await.unwrap();
    assert_eq!(proxy.connections_accepted(), 2);
    assert_eq!(proxy.open_connections(), 2);

    // Cut: open connections are closed, new ones refused.
    proxy.cut().await.unwrap();
    assert_eq!(proxy.state(), LinkState::Cut);
    assert_eq!(proxy.open_connections(), 0);
    let mut buf = [0u8; 8];
    let read = tokio::time::timeout(PATIENT, a.read(&mut buf))
        .await
        .unwrap();
    assert!(matches!(read, Ok(0) | Err(_)), "cut closes: {read:?}");
    let refused = TcpStream::connect(proxy.addr()).await;
    assert_eq!(
        refused.unwrap_err().kind(),
        std::io::ErrorKind::ConnectionRefused
    );

    // Heal: the same address accepts and forwards again.
    proxy.heal().await.unwrap();
    let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
    echo_roundtrip(&mut c, b"again", PATIENT).await.unwrap();
    assert_eq!(proxy.connections_accepted(), 3);

    // Black hole: connections stay open, no byte passes either way.
    proxy.blackhole().await.unwrap();
    assert_eq!(
        echo_roundtrip(&mut c, b"lost", QUICK).await,
        Err("timed out".to_owned())
    );
    let mut d = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(
        echo_roundtrip(&mut d, b"void", QUICK).await,
        Err("timed out".to_owned())
    );
    wait_until("the black-holed connection is counted", || {
        proxy.open_connections() == 2
    })
    .await;
    // Closing our end is held back too: the upstream side stays open.
    drop(d);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(proxy.open_connections(), 2);

    // Heal: what was held back arrives late, in order, before new bytes (TCP
    // retransmits; it does not drop bytes out of a stream), and the held-back
    // close goes through.
    proxy.heal().await.unwrap();
    c.write_all(b"back").await.unwrap();
    let mut late = [0u8; 8];
    tokio::time::timeout(PATIENT, c.read_exact(&mut late))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&late, b"lostback");
    wait_until("the closed connection is gone", || {
        proxy.open_connections() == 1
    })
    .await;

    drop(proxy);
    let read = tokio::time::timeout(PATIENT, c.read(&mut buf))
        .await
        .unwrap();
    assert!(matches!(read, Ok(0) | Err(_)), "drop closes: {read:?}");
}

#[tokio::test]
async fn proxy_in_front_of_a_real_server() {
    let redis = RedisServer::start().await.unwrap();
    let proxy = TcpProxy::start(redis.addr()).await.unwrap();
    probe::redis(proxy.addr(), PATIENT).await.unwrap();
    proxy.blackhole().await.unwrap();
    let err = probe::redis(proxy.addr(), QUICK).await.unwrap_err();
    assert!(err.starts_with(probe::NO_ANSWER), "{err}");
    proxy.cut().await.unwrap();
    assert!(probe::redis(proxy.addr(), QUICK).await.is_err());
    proxy.heal().await.unwrap();
    probe::redis(proxy.addr(), PATIENT).await.unwrap();
}

#[tokio::test]
async fn guarded_resource_accepts_and_refuses() {
    let resource = GuardedResource::start().await.unwrap();
    let ok = WriteReply::Ok;
    for (election, token, writer, reply) in [
        ("e1", 5, "a", ok.clone()),
        ("e1", 5, "a", ok.clone()),
        ("e1", 4, "b", WriteReply::Stale(5)),
        ("e1", 9, "b", ok.clone()),
        ("e2", 1, "c", ok),
    ] {
        let got = resource.write(election, token, writer).await.unwrap();
        assert_eq!(got, reply, "{election} {token} {writer}");
    }
    let highest = ["e1", "e2", "e3"].map(|e| resource.highest(e));
    assert_eq!(highest, [Some(9), Some(1), None]);

    let writes = resource.writes();
    assert_eq!(writes.len(), 5);
    assert!(writes.windows(2).all(|w| w[0].mono_ns <= w[1].mono_ns));
    let refused = resource.refused();
    assert_eq!(refused.len(), 1);
    assert_eq!((refused[0].token, refused[0].writer.as_str()), (4, "b"));
    assert_eq!(refused[0].highest_before, Some(5));
    assert_eq!(resource.accepted().len(), 4);

    // A raw client can pipeline several lines on one connection.
    let answer = exchange(
        resource.addr(),
        b"WRITE e1 10 x\nWRITE e1 2 y\nHELLO\n",
        |a| a.iter().filter(|&&b| b == b'\n').count() == 3,
        PATIENT,
    )
    .await
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "OK\nSTALE 10\nERR unknown request\n"
    );
    assert_eq!(resource.malformed(), ["HELLO"]);
}

#[tokio::test]
async fn shell_writer_loop_speaks_to_the_guarded_resource() {
    let resource = GuardedResource::start().await.unwrap();
    let command = resource.write_loop_command(Duration::from_millis(50));
    let writer = |token: &str, id: &str| {
        let env = [
            ("TENURE_ELECTION", "e1"),
            ("TENURE_TOKEN", token),
            ("TENURE_ID", id),
        ];
        fake_candidate(&command, &env)
    };
    let mut old = writer("3", "old");
    wait_until("the old writer wrote", || resource.accepted().len() >= 2).await;
    let mut new = writer("4", "new");
    wait_until("the old writer is refused", || {
        resource.refused().iter().any(|w| w.writer == "old")
    })
    .await;
    new.kill_group().await.unwrap();
    old.kill_group().await.unwrap();

    let writes = resource.writes();
    assert!(
        resource.malformed().is_empty(),
        "{:?}",
        resource.malformed()
    );
    assert!(writes.iter().any(|w| w.writer == "new" && w.accepted));
    let first_new = writes.iter().position(|w| w.writer == "new").unwrap();
    assert!(
        writes[first_new..]
            .iter()
            .filter(|w| w.writer == "old")
            .all(|w| !w.accepted && w.highest_before == Some(4)),
        "{writes:#?}"
    );
    assert_eq!(resource.highest("e1"), Some(4));
}

/// A fake candidate: bash running `script` with `env` (event lines, or a writer loop),
/// labelled `--id fake`.
fn fake_candidate(script: &str, env: &[(&str, &str)]) -> CandidateProcess {
    let args = ["-c", script, "--id", "fake"].map(String::from);
    CandidateProcess::spawn(Path::new("bash"), &args, env.iter().copied()).unwrap()
}

#[tokio::test]
async fn candidate_process_collects_events_and_takes_signals() {
    let t0 = monotonic_now_ns();
    let script = r#"
        echo "{\"event\":\"campaigning\",\"election\":\"e1\",\"id\":\"c1\",\"mono_ns\":$T0}"
        echo "some plain output"
        echo "a warning" >&2
        sleep 0.2
        echo "{\"event\":\"elected\",\"election\":\"e1\",\"id\":\"c1\",\"token\":5,\"mono_ns\":$T0}"
        while :; do echo tick; sleep 0.05; done
    "#;
    let mut c = fake_candidate(script, &[("T0", &t0.to_string())]);
    assert!(c.label().contains("--id fake"), "{}", c.label());

    let elected = c
        .wait_for_event(|e| e.is(Event::ELECTED), PATIENT)
        .await
        .unwrap();
    assert_eq!((elected.token, elected.mono_ns), (Some(5), t0));
    assert_eq!(elected.id, "c1");
    let kinds: Vec<String> = c.events().into_iter().map(|e| e.kind).collect();
    assert_eq!(kinds, ["campaigning", "elected"]);
    assert_eq!(c.other_stdout()[0], "some plain output");
    wait_until("stderr is read", || c.stderr_tail().contains("a warning")).await;

    // A missing event times out with the events so far in the message.
    let err = c.wait_for_kind(Event::LOST, QUICK).await.unwrap_err();
    assert!(matches!(err, HarnessError::EventTimeout { .. }), "{err}");
    assert!(err.to_string().contains("elected e1"), "{err}");

    // Paused, it prints nothing; resumed, it goes on.
    c.pause().unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = c.other_stdout().len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(c.other_stdout().len(), before, "paused process printed");
    c.resume().unwrap();
    wait_until("resumed process prints", || {
        c.other_stdout().len() > before + 2
    })
    .await;

    let killed_at = c.kill().await.unwrap();
    assert!(killed_at > t0);
    assert!(c.pid().is_none());
    assert!(matches!(c.pause(), Err(HarnessError::NotRunning { .. })));
    let last = c.wait_for_kind(Event::KILLED, PATIENT).await.unwrap();
    assert!(last.synthetic);
    assert_eq!(last.mono_ns, killed_at);

    let ts = tenures(&[c.events()], monotonic_now_ns());
    assert_eq!(ts.len(), 1);
    assert_eq!((ts[0].end, ts[0].end_ns), (TenureEnd::Killed, killed_at));
}

#[tokio::test]
async fn candidate_terminate_and_exit() {
    let script = r#"
        trap 'echo "{\"event\":\"resigned\",\"election\":\"e1\",\"id\":\"c1\",\"token\":1,\"mono_ns\":1}"; exit 3' TERM
        echo "{\"event\":\"elected\",\"election\":\"e1\",\"id\":\"c1\",\"token\":1,\"mono_ns\":0}"
        while :; do sleep 0.05; done
    "#;
    let mut c = fake_candidate(script, &[]);
    c.wait_for_kind(Event::ELECTED, PATIENT).await.unwrap();
    c.pause().unwrap();
    let status = c.terminate().await.unwrap();
    assert_eq!(status.code(), Some(3));
    c.wait_for_kind(Event::EXITED, PATIENT).await.unwrap();
    assert!(c.events().iter().any(|e| e.is(Event::RESIGNED)));

    // A process that ends without the awaited event ends the wait early.
    let mut quick = fake_candidate("echo bye", &[]);
    let started = Instant::now();
    let err = quick
        .wait_for_kind(Event::ELECTED, Duration::from_secs(20))
        .await
        .unwrap_err();
    assert!(
        matches!(err, HarnessError::EventStreamEnded { .. }),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(quick.wait_exit(PATIENT).await.unwrap().success());
}

fn pid_alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn dropping_a_candidate_kills_the_commands_it_started() {
    let c = fake_candidate("sleep 300 & echo \"child $!\"; wait", &[]);
    let deadline = Instant::now() + PATIENT;
    let pid = loop {
        if let Some(line) = c.other_stdout().first() {
            break line.trim_start_matches("child ").parse::<i32>().unwrap();
        }
        assert!(Instant::now() < deadline, "no child pid printed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(pid_alive(pid));
    drop(c);
    wait_until("the grandchild is gone", || !pid_alive(pid)).await;
}

fn ev(kind: &str, id: &str, token: Option<u64>, at: u64) -> Event {
    Event::new(kind, "e1", id, token, at)
}

/// `id`'s log in `e1`: elected with `token` at `from`, then `end` (`lost`, `resigned`)
/// at `to`.
fn held(id: &str, token: u64, from: u64, end: &str, to: u64) -> Vec<Event> {
    vec![
        ev("elected", id, Some(token), from),
        ev(end, id, Some(token), to),
    ]
}

/// One line per violation: `overlap a b`, `a:Some(7)>=b:Some(7)`, `missing d`.
fn summary(violations: &[FencingViolation]) -> Vec<String> {
    let line = |v: &FencingViolation| match v {
        FencingViolation::Overlap { first, second } => {
            format!("overlap {} {}", first.id, second.id)
        }
        FencingViolation::TokenNotIncreasing {
            earlier: a,
            later: b,
        } => {
            format!("{}:{:?}>={}:{:?}", a.id, a.token, b.id, b.token)
        }
        FencingViolation::MissingToken { tenure } => format!("missing {}", tenure.id),
        other => format!("unexpected {other}"),
    };
    violations.iter().map(line).collect()
}

#[test]
fn fencing_checker_passes_a_clean_history() {
    let mut a = held("a", 1, 10, "lost", 20);
    a.insert(0, ev("campaigning", "a", None, 1));
    a.push(ev("campaigning", "a", None, 21));
    a.extend(held("a", 4, 50, "resigned", 60));
    let logs = vec![
        a,
        // Touching ends are fine.
        vec![ev("elected", "b", Some(2), 20), ev("killed", "", None, 30)],
        // Still leader "now".
        [
            held("c", 3, 35, "lost", 49),
            vec![ev("elected", "c", Some(5), 70)],
        ]
        .concat(),
        // Another election is checked on its own.
        vec![Event::new("elected", "e2", "z", Some(1), 15)],
    ];
    let violations = check_fencing_at(&logs, 100);
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(tenures(&logs, 100).len(), 6);
}

#[test]
fn fencing_checker_finds_a_planted_overlap() {
    let logs = vec![
        held("a", 1, 10, "lost", 40),
        held("b", 2, 30, "resigned", 50),
    ];
    let violations = check_fencing_at(&logs, 100);
    assert_eq!(summary(&violations), ["overlap a b"]);
    let text = violations[0].to_string();
    assert!(text.contains("overlap by 10 ns"), "{text}");

    // A leader that never ended overlaps a later one until "now"; a killed
    // one only until its kill.
    let open = vec![
        vec![ev("elected", "a", Some(1), 10)],
        vec![ev("elected", "b", Some(2), 30)],
    ];
    assert_eq!(check_fencing_at(&open, 100).len(), 1);
    let killed = vec![
        vec![ev("elected", "a", Some(1), 10), ev("killed", "", None, 25)],
        vec![ev("elected", "b", Some(2), 30)],
    ];
    assert!(check_fencing_at(&killed, 100).is_empty());
    // With the real clock, "now" is later than any planted time.
    assert_eq!(check_fencing(&open).len(), 1);
}

#[test]
fn fencing_checker_finds_a_planted_non_increasing_token() {
    let logs = vec![
        held("a", 7, 10, "lost", 20),
        held("b", 7, 30, "lost", 40),
        held("c", 3, 50, "lost", 60),
        vec![ev("elected", "d", None, 70)],
    ];
    assert_eq!(
        summary(&check_fencing_at(&logs, 100)),
        ["a:Some(7)>=b:Some(7)", "b:Some(7)>=c:Some(3)", "missing d"]
    );
}
