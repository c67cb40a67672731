//! The Redis backends: each hit is one Lua script call (see `lua/`) that reads the server's clock,
//! decides and records atomically. [`RedisBackend`] talks to one server through a deadpool-redis
//! pool; [`ClusterBackend`] talks to a Redis Cluster through the `redis` crate's cluster client.
//! Both share the key layout ([`keys`]), the script calls (`scripts`) and, here, the plumbing
//! around them: how `redis` errors map to [`BackendError`] and to the kinds of failure
//! operators see ([`failure_kind`]; counted and logged by [`super::observe`]), and the shared
//! connection that is reopened on demand (`Reconnecting`).

mod cluster;
pub mod connect;
mod group;
mod inspect;
pub mod keys;
mod permissions;
mod scripts;
mod single;

pub use permissions::{CLIENT_COMMANDS, CLUSTER_COMMANDS, SCRIPT_COMMANDS, acl_rule};
pub use scripts::{SETTLE_MS, refund_horizon_ms};

use permissions::permission_error;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError};

use super::observe::{self, FailureKind};
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

/// A failed call: what the limiter is told, and which kind of failure operators see.
#[derive(Debug, Clone)]
struct Failure {
    kind: FailureKind,
    error: BackendError,
}

impl Failure {
    /// A failure of `kind` telling the limiter `error`.
    fn new(kind: FailureKind, error: BackendError) -> Failure {
        Failure { kind, error }
    }

    /// A failure the `redis` crate reported.
    fn redis(err: &RedisError) -> Failure {
        let kind = failure_kind(err);
        let error = match kind {
            FailureKind::NoPerm => BackendError::Protocol(format!(
                "{err}; the Redis user may not run what the scripts run (the ACL rule tollgate \
                 needs is in docs/security.md and in the start-up error)"
            )),
            _ => backend_error(err),
        };
        Failure::new(kind, error)
    }

    /// Counts and (rate-limited) logs the failure on `backend`, and hands its error on.
    fn report(self, backend: &'static str) -> BackendError {
        observe::failure(backend, self.kind, &self.error);
        self.error
    }
}

/// Tells `redis` errors apart by what an operator does about them: the one place that reads
/// the crate's error kinds and the server's error codes.
pub fn failure_kind(err: &RedisError) -> FailureKind {
    use redis::ServerErrorKind as Server;
    if err.is_timeout() {
        return FailureKind::Timeout;
    }
    if err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() {
        return FailureKind::Connection;
    }
    match err.kind() {
        ErrorKind::Server(Server::NoScript) => FailureKind::NoScript,
        ErrorKind::Server(Server::NoPerm) => FailureKind::NoPerm,
        ErrorKind::Server(Server::ClusterDown | Server::MasterDown) => FailureKind::ClusterDown,
        ErrorKind::Server(Server::TryAgain) => FailureKind::TryAgain,
        ErrorKind::Server(Server::Moved | Server::Ask) => FailureKind::Redirect,
        ErrorKind::Server(Server::ReadOnly) => FailureKind::ReadOnly,
        ErrorKind::Server(Server::BusyLoading) => FailureKind::Busy,
        _ => match err.code() {
            Some("OOM") => FailureKind::Oom,
            Some("NOPERM") => FailureKind::NoPerm,
            Some("BUSY") => FailureKind::Busy,
            // A command a script ran that the user's ACL refuses (the code is ERR, the text
            // says it): a permission to grant, not a script to fix.
            _ if err.detail().is_some_and(permissions::is_permission_text) => FailureKind::NoPerm,
            // A script that raised an error, or a command it ran that failed.
            Some("ERR") if err.detail().is_some_and(is_script_error) => FailureKind::Script,
            _ if err.detail().is_some_and(is_script_error) => FailureKind::Script,
            _ => FailureKind::Other,
        },
    }
}

/// Whether a server error's text says it came out of a running script.
fn is_script_error(detail: &str) -> bool {
    detail.contains("user_script")
        || detail.contains("script:")
        || detail.contains("Error running script")
}

/// How often the latest error of a continuing failure is taken again (for health's reason).
const REFRESH_EVERY: Duration = Duration::from_secs(5);

/// Tracks one backend instance's run of failures for health (`--health-fail-after`): since when
/// every call has failed, and the latest error. It logs nothing: failures are counted and logged
/// (rate-limited, by kind) in [`super::observe`]. It is per instance, as the main store and the
/// per-second store fail and recover apart even when both are Redis.
#[derive(Debug, Default)]
struct FailureLog {
    /// Set while calls fail; lets a success skip the lock.
    failing: AtomicBool,
    run: Mutex<Option<Run>>,
}

/// A run of failures: when it began, and its latest error as last taken.
#[derive(Debug)]
struct Run {
    since: Instant,
    error: String,
    taken: Instant,
}

impl FailureLog {
    /// Records one failed backend call.
    fn failure(&self, err: &BackendError) {
        self.failing.store(true, Ordering::Relaxed);
        let Ok(mut run) = self.run.lock() else {
            return;
        };
        let now = Instant::now();
        match run.as_mut() {
            None => {
                *run = Some(Run {
                    since: now,
                    error: err.to_string(),
                    taken: now,
                })
            }
            Some(run) if now.duration_since(run.taken) >= REFRESH_EVERY => {
                run.error = err.to_string();
                run.taken = now;
            }
            Some(_) => {}
        }
    }

    /// Records one successful backend call: the run of failures, if any, is over.
    fn success(&self) {
        if !self.failing.swap(false, Ordering::Relaxed) {
            return;
        }
        if let Ok(mut run) = self.run.lock() {
            *run = None;
        }
    }

    /// Since when every call has failed, while the latest one failed.
    fn sustained(&self) -> Option<SustainedFailure> {
        if !self.failing.load(Ordering::Relaxed) {
            return None;
        }
        let run = self.run.lock().ok()?;
        run.as_ref().map(|run| SustainedFailure {
            since: run.since,
            error: run.error.clone(),
        })
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

    /// The open connection, or a new one from the opener `prepare` makes. Only one attempt runs
    /// at a time; callers that arrive meanwhile wait for it and share its result. `prepare` runs
    /// only when a connection must be opened: the opener owns what it needs (it runs on a task
    /// of its own), and copying that for every call that finds the connection open would cost
    /// each decision more than the lookup.
    async fn get_or_open<P, F, Fut>(self: &Arc<Self>, prepare: P) -> Result<T, BackendError>
    where
        P: FnOnce() -> F,
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
        let open = prepare();
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
