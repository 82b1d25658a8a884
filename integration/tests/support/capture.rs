//! A tracing subscriber at TRACE level that keeps every line it writes, for tests that
//! read the log. Included by the test binaries that need it (`mod capture;`).

#![allow(dead_code)]

use std::io::Write;
use std::sync::{Arc, Mutex};

use tracing::subscriber::DefaultGuard;

/// Everything the subscriber wrote.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// The log so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }

    fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync + 'static {
        let sink = self.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish()
    }

    /// Installs the subscriber for the whole process: for a test binary all of whose
    /// tests read it (a thread's default misses events of callsites another test's
    /// thread reached first). Panics if a global subscriber is already set.
    pub fn install_global() -> Captured {
        let captured = Captured::default();
        tracing::subscriber::set_global_default(captured.subscriber())
            .expect("no other global subscriber in this test binary");
        captured
    }

    /// Installs the subscriber as this thread's default until the guard drops (for a
    /// test on a current-thread runtime that only checks what must *not* be logged).
    pub fn install_default() -> (Captured, DefaultGuard) {
        let captured = Captured::default();
        let guard = tracing::subscriber::set_default(captured.subscriber());
        (captured, guard)
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
