//! Every backend's URL parser, on raw input and on input behind each scheme: never a
//! panic; a parsed config formats (Debug, Display) without panicking, and an error
//! names no more than the input gave it.
#![no_main]

use libfuzzer_sys::fuzz_target;

const SCHEMES: [&str; 8] = [
    "", "etcd://", "etcds://", "redis://", "rediss://", "zk://", "peer://", "mem://",
];

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let Ok(tail) = std::str::from_utf8(rest) else {
        return;
    };
    let url = format!("{}{tail}", SCHEMES[usize::from(first) % SCHEMES.len()]);
    let _ = tenure_core::backend::split_scheme(&url);
    let _ = tenure_core::MemoryBackend::from_url(&url);
    if let Ok(c) = tenure_etcd::EtcdConfig::from_url(&url) {
        let _ = (format!("{c:?}"), c.to_string(), c.validate());
    }
    if let Ok(c) = tenure_redis::RedisConfig::from_url(&url) {
        let _ = (format!("{c:?}"), c.to_string(), c.validate());
    }
    if let Ok(c) = tenure_zookeeper::ZooKeeperConfig::from_url(&url) {
        let _ = (format!("{c:?}"), c.to_string(), c.validate());
    }
    if let Ok(c) = tenure_peer::PeerConfig::from_url(&url) {
        let _ = format!("{c:?}");
    }
});
