//! The one error type of the harness.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while starting, probing or steering a test
/// server, a proxy, a candidate process or the guarded resource.
///
/// Each variant's message says what happened and, where there is one, what to
/// do about it (for example which install command provides a missing binary).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HarnessError {
    /// A program the harness needs is not installed.
    #[error(
        "{what} is not installed ({detail}); install it with `bash scripts/install-test-deps.sh` \
         (provides {package})"
    )]
    MissingBinary {
        /// What is missing, e.g. `etcd`.
        what: &'static str,
        /// Where the harness looked.
        detail: String,
        /// The apt or npm package that provides it.
        package: &'static str,
    },

    /// A server process exited before it answered its readiness probe.
    #[error("{server} exited with {status} before it became ready; log tail:\n{log_tail}")]
    ExitedEarly {
        /// Which server.
        server: &'static str,
        /// Its exit status as text.
        status: String,
        /// The last lines of its combined stdout/stderr.
        log_tail: String,
    },

    /// A server did not answer its readiness probe in time.
    #[error(
        "{server} at {addr} did not become ready within {timeout:?} (last probe: {last_probe}); \
         log tail:\n{log_tail}"
    )]
    NotReady {
        /// Which server.
        server: &'static str,
        /// Where it was probed.
        addr: SocketAddr,
        /// How long the harness waited.
        timeout: Duration,
        /// Why the last probe failed.
        last_probe: String,
        /// The last lines of its combined stdout/stderr.
        log_tail: String,
    },

    /// Fault injection was asked of a server that the harness did not start.
    #[error(
        "fault injection needs a locally started server: {server} at {endpoint} comes from \
         {variable}; unset {variable} to let the harness start its own"
    )]
    ExternalServer {
        /// Which server.
        server: &'static str,
        /// The external endpoint in use.
        endpoint: String,
        /// The environment variable that named it.
        variable: &'static str,
    },

    /// An environment variable holds something the harness cannot use.
    #[error("{variable}={value:?} is not usable: {reason}")]
    BadEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A chaos run was given options it cannot run with, or its setup failed.
    #[error("chaos: {reason}")]
    Chaos {
        /// What is wrong.
        reason: String,
    },

    /// A process (server or candidate) is not running, so it cannot be
    /// signalled.
    #[error("{what} is not running")]
    NotRunning {
        /// What was asked to be signalled.
        what: String,
    },

    /// A candidate process did not produce a matching event in time.
    #[error("{what}: no matching event within {timeout:?}; events so far:\n{events}")]
    EventTimeout {
        /// Which process.
        what: String,
        /// How long the harness waited.
        timeout: Duration,
        /// The events seen so far, one per line.
        events: String,
    },

    /// A candidate process ended before it produced a matching event.
    #[error("{what} ended before a matching event appeared; events:\n{events}\nstderr tail:\n{stderr_tail}")]
    EventStreamEnded {
        /// Which process.
        what: String,
        /// The events seen, one per line.
        events: String,
        /// The last lines the process wrote to stderr.
        stderr_tail: String,
    },

    /// A process did not exit in time after it was asked to.
    #[error("{what} did not exit within {timeout:?} after SIGTERM; it was killed")]
    ExitTimeout {
        /// Which process.
        what: String,
        /// How long the harness waited.
        timeout: Duration,
    },

    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The harness must be used from inside a Tokio runtime.
    #[error("{0} must be called from inside a Tokio runtime")]
    NoRuntime(&'static str),

    /// A file the harness reads or writes could not be handled.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
}

impl HarnessError {
    /// Wraps an [`io::Error`] with a description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        HarnessError::Io {
            context: context.into(),
            source,
        }
    }

    /// [`io`](Self::io) with an error that is only `why`.
    pub fn failed(context: impl Into<String>, why: impl Into<String>) -> Self {
        Self::io(context, io::Error::other(why.into()))
    }

    /// [`HarnessError::NotRunning`] for `what`.
    pub fn not_running(what: impl Into<String>) -> Self {
        HarnessError::NotRunning { what: what.into() }
    }
}

/// The result type of the harness.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;
