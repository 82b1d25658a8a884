//! One server per test binary, shared by its tests, and one key prefix.

/// A random key prefix, the same for every test of this test binary (a fresh one per
/// run, so runs against an external server do not meet each other's keys).
pub fn run_prefix() -> &'static str {
    static PREFIX: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PREFIX.get_or_init(tenure_core::testing::random_prefix)
}

/// `url` with `pairs` (`k=v&…`) added to its query.
pub fn with_query(url: &str, pairs: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{pairs}")
}

/// Defines `fn shared_server() -> (String, SocketAddr)` for a test binary: starts one
/// `$server` (a harness server type) the first time it is called, on a thread of its
/// own so that no test's runtime owns it, stops it when the binary exits, and returns
/// its endpoint and address. A server that cannot start (e.g. a missing binary, whose
/// error names the install script) fails the calling test.
#[macro_export]
macro_rules! shared_server {
    ($server:ty, $what:literal) => {
        static SHARED_SERVER: ::std::sync::Mutex<Option<$server>> = ::std::sync::Mutex::new(None);
        static SHARED_ENDPOINT: ::std::sync::OnceLock<
            Result<(String, ::std::net::SocketAddr), String>,
        > = ::std::sync::OnceLock::new();

        extern "C" fn stop_shared_server() {
            if let Ok(mut server) = SHARED_SERVER.lock() {
                drop(server.take());
            }
        }

        fn shared_server() -> (String, ::std::net::SocketAddr) {
            let endpoint = SHARED_ENDPOINT.get_or_init(|| {
                ::std::thread::spawn(|| {
                    let rt = ::tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| e.to_string())?;
                    let server = rt.block_on(<$server>::start()).map_err(|e| e.to_string())?;
                    let found = (server.endpoint().to_string(), server.addr());
                    *SHARED_SERVER.lock().map_err(|e| e.to_string())? = Some(server);
                    // SAFETY: registers a plain function without arguments to run at exit.
                    unsafe {
                        ::libc::atexit(stop_shared_server);
                    }
                    Ok(found)
                })
                .join()
                .unwrap_or_else(|_| Err(concat!("the thread starting ", $what, " panicked").into()))
            });
            match endpoint {
                Ok(e) => e.clone(),
                Err(e) => panic!(concat!("starting ", $what, ": {}"), e),
            }
        }
    };
}
