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

/// The next leader `stream` reports for which `pred` holds, waiting at most `limit`;
/// panics (in the calling test) if the stream ends or fails first, or nothing matches
/// in time.
pub async fn next_leader_where(
    stream: &mut tenure_core::LeaderStream,
    limit: std::time::Duration,
    pred: impl Fn(&Option<tenure_core::LeaderInfo>) -> bool,
) -> Option<tenure_core::LeaderInfo> {
    use futures::StreamExt;
    tokio::time::timeout(limit, async {
        loop {
            let item = stream
                .next()
                .await
                .expect("observe stream ended")
                .expect("observe item");
            if pred(&item) {
                return item;
            }
        }
    })
    .await
    .expect("observe did not report the expected leader in time")
}

/// A campaign running in a task of its own, so a test can look at other things while
/// it waits; its leadership and the monotonic time of the grant once it returns.
pub struct SpawnedCampaign {
    id: String,
    task: Option<tokio::task::JoinHandle<(tenure_core::Result<tenure_core::Leadership>, u64)>>,
    held: Option<(tenure_core::Leadership, u64)>,
}

impl SpawnedCampaign {
    /// Starts `candidate`'s campaign for `election` in `session`.
    pub fn spawn(
        session: &tenure_core::Session,
        election: &tenure_core::ElectionName,
        candidate: tenure_core::Candidate,
    ) -> SpawnedCampaign {
        let (session, election) = (session.clone(), election.clone());
        SpawnedCampaign {
            id: candidate.id().to_string(),
            task: Some(tokio::spawn(async move {
                let granted = session.campaign(&election, &candidate).await;
                (granted, crate::monotonic_now_ns())
            })),
            held: None,
        }
    }

    /// True once the campaign returned (collecting the leadership); a failed campaign
    /// fails the calling test.
    pub async fn granted(&mut self) -> bool {
        if let Some(task) = self.task.take_if(|t| t.is_finished()) {
            let (leadership, at) = task.await.expect("campaign task");
            let leadership =
                leadership.unwrap_or_else(|e| panic!("{}'s campaign failed: {e}", self.id));
            self.held = Some((leadership, at));
        }
        self.held.is_some()
    }

    /// Waits for the grant, at most `bound`: the leadership and when it was granted
    /// ([`monotonic_now_ns`](crate::monotonic_now_ns)).
    pub async fn wait(&mut self, bound: std::time::Duration) -> (&tenure_core::Leadership, u64) {
        let until = std::time::Instant::now() + bound;
        while !self.granted().await {
            assert!(
                std::time::Instant::now() < until,
                "{} was not elected within {bound:?}",
                self.id
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let (leadership, at) = self.held.as_ref().expect("granted");
        (leadership, *at)
    }

    /// Whether the campaign was granted and that leadership still holds.
    pub fn is_leader(&self) -> bool {
        self.held.as_ref().is_some_and(|(l, _)| l.is_leader())
    }

    /// The leadership, once granted.
    pub fn into_leadership(self) -> Option<tenure_core::Leadership> {
        self.held.map(|(l, _)| l)
    }
}
