//! The conformance environment of a ZooKeeper test binary, for every layout: its
//! backends connect with the binary's URL, disconnects go through a TCP proxy and expiry
//! closes a session from a second connection. Included by the test binaries that need
//! it (`mod zookeeper;`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tenure_core::testing::Env;
use tenure_core::{DynBackend, ErrorKind};
use tenure_integration::{timing_ms, ProxyFaults};
use tenure_zookeeper::ZooKeeperBackend;

/// The environment on the binary's shared server, `(hosts, server)` as its
/// `shared_server()` gives it; `url` makes a backend's URL from `host:port` (every
/// server of an external ensemble).
pub async fn env((hosts, server): (String, SocketAddr), url: fn(&str) -> String) -> Env {
    // Every server when `TENURE_TEST_ZOOKEEPER` names an ensemble.
    let backend = match ZooKeeperBackend::from_url(&url(&hosts)).await {
        Ok(b) => b,
        Err(e) => panic!("connect to ZooKeeper at {server}: {e}"),
    };
    let main = backend.clone();
    // Disconnects cut a victim backend's link through a proxy; expiry closes the
    // session from a second connection with its id and password, which only the
    // backend that opened it knows: every backend made here is asked.
    let backends = Arc::new(Mutex::new(vec![backend]));
    let known = backends.clone();
    let faults = ProxyFaults::new(&server.to_string(), server, move |at| {
        let known = known.clone();
        async move {
            let b = ZooKeeperBackend::from_url(&url(&at)).await?;
            if let Ok(mut k) = known.lock() {
                k.push(b.clone());
            }
            Ok(Arc::new(b) as DynBackend)
        }
    });
    let faults = faults.expire_with(move |id| {
        let backends = backends.lock().map(|b| b.clone()).unwrap_or_default();
        async move {
            let mut last = tenure_core::Error::new(ErrorKind::InvalidArgument, "no backend");
            for b in backends {
                match b.expire_session(&id).await {
                    Ok(()) => return Ok(()),
                    Err(e) => last = e,
                }
            }
            Err(last)
        }
    });
    // TTL 2 s (the shortest session timeout at tickTime 1000 ms), renew every 300 ms,
    // leadership valid for 1.2 s after the last confirmed renewal was sent. The server
    // expires sessions in tickTime buckets (up to 1 s late here), and an abandoned
    // session is dropped once renewals stop for twice their interval.
    faults.env(Arc::new(main), timing_ms(2000, 300, 1200, 2000), 1500)
}
