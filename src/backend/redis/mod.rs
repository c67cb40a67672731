//! The Redis backends: each hit is one Lua script call (see `lua/`) that reads the server's clock,
//! decides and records atomically. [`RedisBackend`] talks to one server through a deadpool-redis
//! pool; [`ClusterBackend`] talks to a Redis Cluster through the `redis` crate's cluster client.
//! Both share the key layout ([`keys`]), the script calls (`scripts`) and, here, the plumbing
//! around them: how `redis` errors map to [`BackendError`], failure logging once per burst, and
//! the shared connection that is reopened on demand (`Reconnecting`).

mod cluster;
pub mod connect;
pub mod keys;
mod scripts;
mod single;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError};

use super::{BackendError, SustainedFailure};

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

/// What a permission check found: the error names the command the Redis user may not run (or
/// the keys it may not touch) and how to grant it.
fn permission_error(err: &RedisError, user: &str) -> Option<BackendError> {
    if err.kind() != ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        return None;
    }
    let detail = err.to_string();
    let lower = detail.to_ascii_lowercase();
    let what = ["script|load", "evalsha", "eval", "script", "ping"]
        .into_iter()
        .find(|command| lower.contains(&format!("'{command}'")))
        .map(|command| {
            format!(
                "may not run {}",
                command.to_ascii_uppercase().replace('|', " ")
            )
        })
        .unwrap_or_else(|| "may not touch tollgate's keys".to_owned());
    Some(BackendError::Protocol(format!(
        "the Redis user {user} {what} ({detail}); tollgate needs +evalsha +eval +script|load \
         +ping and its key prefix (e.g. ACL SETUSER {user} +evalsha +eval +script|load +ping \
         ~<prefix>*)"
    )))
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
    /// When the current run of failures began, and its latest error as last reported.
    since: Option<(Instant, String)>,
}

impl FailureLog {
    /// Records one failed backend call.
    fn failure(&self, backend: &str, err: &BackendError) {
        self.failing.store(true, Ordering::Relaxed);
        let Ok(mut reports) = self.reports.lock() else {
            return;
        };
        reports.unreported += 1;
        if reports.since.is_none() {
            reports.since = Some((Instant::now(), err.to_string()));
        }
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
            if let Some((_, latest)) = reports.since.as_mut() {
                *latest = err.to_string();
            }
        }
    }

    /// Since when every call has failed, while the latest one failed.
    fn sustained(&self) -> Option<SustainedFailure> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let reports = self.reports.lock().ok()?;
        reports
            .since
            .as_ref()
            .map(|(since, error)| SustainedFailure {
                since: *since,
                error: error.clone(),
            })
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

/// How long a failed attempt is answered from memory before the next attempt.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// A connection handle of type `T` (cheap to clone, shared by concurrent calls), or the means to
/// open one. It is opened on demand: by one task at a time, in the background (so a call whose
/// deadline passes does not abort the attempt the next calls need), and not again for a short
/// pause after a failed attempt (so a dead server is not hammered with connection attempts at the
/// request rate).
#[derive(Debug)]
struct Reconnecting<T> {
    current: Mutex<Option<T>>,
    opening: Arc<tokio::sync::Mutex<()>>,
    failed: Mutex<Option<(Instant, BackendError)>>,
}

impl<T> Default for Reconnecting<T> {
    fn default() -> Self {
        Reconnecting {
            current: Mutex::new(None),
            opening: Arc::default(),
            failed: Mutex::new(None),
        }
    }
}

impl<T: Clone + Send + 'static> Reconnecting<T> {
    /// The open connection, if any.
    fn current(&self) -> Option<T> {
        self.current.lock().ok().and_then(|slot| slot.clone())
    }

    /// Forgets the connection (it broke); the next call opens another.
    fn clear(&self) {
        let dropped = self.current.lock().ok().and_then(|mut slot| slot.take());
        drop(dropped);
    }

    /// The open connection, or a new one from `open`. Only one attempt runs at a time; callers
    /// that arrive meanwhile wait for it and share its result.
    async fn get_or_open<F, Fut>(self: &Arc<Self>, open: F) -> Result<T, BackendError>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BackendError>> + Send + 'static,
    {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        if let Some(err) = self.recent_failure() {
            return Err(err);
        }
        let Ok(turn) = Arc::clone(&self.opening).try_lock_owned() else {
            // another call is opening: wait for its outcome instead of opening a second one
            let _done = self.opening.lock().await;
            return match self.current() {
                Some(conn) => Ok(conn),
                None => Err(self.recent_failure().unwrap_or_else(|| {
                    BackendError::Unavailable("connection attempt failed".to_owned())
                })),
            };
        };
        let this = Arc::clone(self);
        let attempt = tokio::spawn(async move {
            let _turn = turn;
            if let Some(conn) = this.current() {
                return Ok(conn);
            }
            let opened = open().await;
            match &opened {
                Ok(conn) => {
                    if let Ok(mut slot) = this.current.lock() {
                        *slot = Some(conn.clone());
                    }
                    if let Ok(mut failed) = this.failed.lock() {
                        *failed = None;
                    }
                }
                Err(err) => {
                    if let Ok(mut failed) = this.failed.lock() {
                        *failed = Some((Instant::now(), err.clone()));
                    }
                }
            }
            opened
        });
        attempt.await.unwrap_or_else(|join| {
            Err(BackendError::Unavailable(format!(
                "connection task ended: {join}"
            )))
        })
    }

    fn recent_failure(&self) -> Option<BackendError> {
        let failed = self.failed.lock().ok()?;
        failed
            .as_ref()
            .filter(|(when, _)| when.elapsed() < PAUSE_AFTER_FAILURE)
            .map(|(_, err)| err.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::connect::redact;

    #[test]
    fn passwords_never_reach_messages() {
        assert_eq!(
            redact("redis://app:s3cret@10.0.0.1:6379/0"),
            "redis://<credentials>@10.0.0.1:6379/0"
        );
        assert_eq!(
            redact("rediss://:s3cret@host:6380"),
            "rediss://<credentials>@host:6380"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
