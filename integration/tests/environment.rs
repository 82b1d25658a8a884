//! How `start` reacts to its environment: external endpoints and missing
//! programs. Environment variables are process-wide, so everything that
//! changes them runs in this one test, in its own test binary.

use tenure_integration::{HarnessError, RedisServer, ZooKeeperServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn environment_overrides_and_missing_programs() {
    // An external endpoint is used as it is, and refuses fault injection.
    let real = RedisServer::start().await.unwrap();
    std::env::set_var(RedisServer::ENV, real.addr().to_string());
    let mut external = RedisServer::start().await.unwrap();
    std::env::remove_var(RedisServer::ENV);
    assert!(external.is_external());
    assert_eq!(external.endpoint(), format!("redis://{}", real.addr()));
    assert_eq!(external.addr(), real.addr());
    assert!(external.data_dir().is_none());
    for err in [
        external.pause().unwrap_err(),
        external.resume().unwrap_err(),
        external.restart().await.unwrap_err(),
        external.kill().await.unwrap_err(),
    ] {
        assert!(matches!(err, HarnessError::ExternalServer { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("needs a locally started server"), "{text}");
        assert!(text.contains("TENURE_TEST_REDIS"), "{text}");
    }
    // Dropping the external handle leaves the server alone.
    drop(external);
    let mut stream = TcpStream::connect(real.addr()).await.unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").await.unwrap();
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"+PONG\r\n");

    // A malformed override is reported, not ignored.
    std::env::set_var(ZooKeeperServer::ENV, "http://127.0.0.1:2181");
    let err = ZooKeeperServer::start().await.unwrap_err();
    std::env::remove_var(ZooKeeperServer::ENV);
    assert!(matches!(err, HarnessError::BadEnvironment { .. }), "{err}");

    // A missing program names the install script and the package (etcd comes from
    // the project's .tools first: its lookup has a unit test in the harness).
    let path = std::env::var_os("PATH").unwrap();
    let empty = tempfile::tempdir().unwrap();
    std::env::set_var("PATH", empty.path());
    let redis = RedisServer::start().await;
    std::env::set_var("PATH", path);
    let err = redis.unwrap_err();
    assert!(matches!(err, HarnessError::MissingBinary { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("bash scripts/install-test-deps.sh"), "{text}");
    assert!(text.contains("redis-server"), "{text}");
}
