//! A shared connection that is opened on demand: by one task at a time, in the background (so a
//! call whose deadline passes does not abort the attempt the next calls need), and not again for
//! a short pause after a failed attempt (so a dead server is not hammered with connection attempts
//! at the request rate).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::backend::BackendError;

/// How long a failed attempt is answered from memory before the next attempt.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// A connection handle of type `T` (cheap to clone, shared by concurrent calls), or the means to
/// open one.
#[derive(Debug)]
pub struct Reconnecting<T> {
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
    pub fn current(&self) -> Option<T> {
        self.current.lock().ok().and_then(|slot| slot.clone())
    }

    /// Forgets the connection (it broke); the next call opens another.
    pub fn clear(&self) {
        let dropped = self.current.lock().ok().and_then(|mut slot| slot.take());
        drop(dropped);
    }

    /// The open connection, or a new one from `open`. Only one attempt runs at a time; callers
    /// that arrive meanwhile wait for it and share its result.
    pub async fn get_or_open<F, Fut>(self: &Arc<Self>, open: F) -> Result<T, BackendError>
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
