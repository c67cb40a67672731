//! The Redis backends: each hit is one Lua script call (see `lua/`) that reads the server's clock,
//! decides and records atomically. [`RedisBackend`] talks to one server through a deadpool-redis
//! pool; [`ClusterBackend`] talks to a Redis Cluster through the `redis` crate's cluster client.
//! Both share the key layout ([`keys`]), the scripts ([`scripts`]) and the failure reporting here.

mod cluster;
pub mod keys;
mod reconnect;
mod scripts;
mod single;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError};

use super::BackendError;

pub use cluster::ClusterBackend;
pub use keys::KeySpace;
pub use single::RedisBackend;

/// Turns a `redis` error into the backend's error vocabulary: answers tollgate cannot use are
/// protocol errors, everything else (connections, failover, loading, cluster state) is unavailability.
fn backend_error(err: &RedisError) -> BackendError {
    use redis::ServerErrorKind as Server;
    match err.kind() {
        ErrorKind::Parse
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Server(Server::ResponseError | Server::CrossSlot | Server::NoPerm) => {
            BackendError::Protocol(err.to_string())
        }
        _ => BackendError::Unavailable(err.to_string()),
    }
}

/// Whether an error says the server lost the script cache (restart, failover, SCRIPT FLUSH).
fn is_noscript(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// How often a continuing failure is reported again.
const REPORT_EVERY: Duration = Duration::from_secs(5);

/// Logs backend failures once per burst: the first failure at once, then a summary with a count at
/// most every [`REPORT_EVERY`], and one line when calls succeed again. Thousands of requests failing
/// against a dead Redis thus cost a handful of log lines, not one each.
#[derive(Debug, Default)]
struct FailureLog {
    /// Set while calls fail; lets a success skip the lock.
    failing: AtomicBool,
    reports: Mutex<Reports>,
}

#[derive(Debug, Default)]
struct Reports {
    last: Option<Instant>,
    unreported: u64,
}

impl FailureLog {
    /// Records one failed backend call.
    fn failure(&self, backend: &str, err: &BackendError) {
        self.failing.store(true, Ordering::Relaxed);
        let Ok(mut reports) = self.reports.lock() else {
            return;
        };
        reports.unreported += 1;
        if reports
            .last
            .is_none_or(|last| last.elapsed() >= REPORT_EVERY)
        {
            tracing::warn!(
                backend,
                failures = reports.unreported,
                "backend call failed: {err}; each affected limit answers its failure_mode"
            );
            reports.last = Some(Instant::now());
            reports.unreported = 0;
        }
    }

    /// Records one successful backend call; reports the end of a failure burst.
    fn success(&self, backend: &str) {
        if !self.failing.swap(false, Ordering::Relaxed) {
            return;
        }
        let Ok(mut reports) = self.reports.lock() else {
            return;
        };
        tracing::info!(
            backend,
            unreported_failures = reports.unreported,
            "backend answers again"
        );
        *reports = Reports::default();
    }
}
