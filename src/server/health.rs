//! Whether tollgate should receive traffic: SERVING only while a config is loaded, the backend
//! answers and the process is not draining. Shared by gRPC health and `GET /healthcheck`.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::backend::Backend;
use crate::limiter::Limiter;
use crate::proto::RLS_SERVICE_NAME;

/// A gRPC health service name that is SERVING for as long as the process runs and is not
/// draining, whatever the backend does: for liveness probes, which must not restart tollgate
/// during a Redis outage.
pub const LIVENESS_SERVICE: &str = "tollgate.liveness";

/// How often the backend is probed; health follows a backend outage within two periods.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The serving state and the reason when not serving.
#[derive(Debug)]
pub struct Health {
    reporter: HealthReporter,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct State {
    backend_error: Option<String>,
    draining: bool,
}

impl Health {
    /// Starts NOT_SERVING (but alive) until the first successful probe.
    pub async fn new(reporter: HealthReporter) -> Arc<Self> {
        let health = Arc::new(Health {
            reporter,
            state: Mutex::new(State {
                backend_error: Some("backend not probed yet".into()),
                draining: false,
            }),
        });
        health.publish().await;
        health
    }

    /// `Ok(())` when serving, else why not.
    pub fn check(&self) -> Result<(), String> {
        let state = self.lock().clone();
        if state.draining {
            Err("draining: shutting down".into())
        } else if let Some(error) = state.backend_error {
            Err(error)
        } else {
            Ok(())
        }
    }

    /// Marks the process as shutting down: NOT_SERVING from now on.
    pub async fn start_draining(&self) {
        self.lock().draining = true;
        self.publish().await;
    }

    async fn set_backend_error(&self, error: Option<String>) {
        let changed = {
            let mut state = self.lock();
            let changed = state.backend_error.is_some() != error.is_some();
            state.backend_error = error;
            changed
        };
        // Only a change is published: every publish reaches each open health Watch stream as
        // a message, and a probe that finds nothing new must not wake them every second.
        if changed {
            match self.check() {
                Ok(()) => tracing::info!("backend reachable: serving"),
                Err(reason) => tracing::warn!(%reason, "not serving"),
            }
            self.publish().await;
        }
    }

    async fn publish(&self) {
        let serving = |ok: bool| {
            if ok {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            }
        };
        let ready = serving(self.check().is_ok());
        for service in ["", RLS_SERVICE_NAME] {
            self.reporter.set_service_status(service, ready).await;
        }
        let alive = serving(!self.lock().draining);
        self.reporter
            .set_service_status(LIVENESS_SERVICE, alive)
            .await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the state itself is always whole.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How long every backend call must have failed before it is reported as sustained (an error
/// log line, repeated every [`SUSTAINED_REPORT_EVERY`]) when health is not set to follow it.
pub const SUSTAINED_AFTER: Duration = Duration::from_secs(10);

/// How often a sustained failure is reported again.
pub const SUSTAINED_REPORT_EVERY: Duration = Duration::from_secs(60);

/// Probes the backend forever, keeping `health` in step with it: NOT_SERVING while it does not
/// answer a ping, and, with `fail_after`, while every call it was given has failed for that long.
///
/// A backend that answers pings but refuses every script (out of memory under `noeviction`, an
/// ACL user without EVALSHA) leaves every decision on its limits' `failure_mode`. By default that
/// does not turn health NOT_SERVING: tollgate as a sidecar that turns unready takes its
/// application out of service, which is the opposite of what `failure_mode: allow` asks for. It
/// is logged as an error instead, once it has lasted [`SUSTAINED_AFTER`] and then every
/// [`SUSTAINED_REPORT_EVERY`]. Operators who prefer the instance taken out of service set
/// `fail_after` (`--health-fail-after`).
pub async fn probe_backend<B: Backend>(
    health: Arc<Health>,
    limiter: Arc<Limiter<B>>,
    fail_after: Option<Duration>,
) {
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reported: Option<std::time::Instant> = None;
    loop {
        ticker.tick().await;
        let result = tokio::time::timeout(PROBE_INTERVAL, limiter.backend().ping()).await;
        let mut error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "backend unavailable: no answer to a ping within {PROBE_INTERVAL:?}"
            )),
        };
        let sustained = limiter
            .backend()
            .failing_since()
            .map(|failure| (failure.since.elapsed(), failure.error));
        match (&sustained, fail_after) {
            (Some((lasted, latest)), Some(limit)) if *lasted >= limit => {
                error.get_or_insert_with(|| {
                    format!(
                        "every backend call has failed for {}s (--health-fail-after {}): {latest}",
                        lasted.as_secs(),
                        humantime::format_duration(limit)
                    )
                });
            }
            (Some((lasted, latest)), None)
                if *lasted >= SUSTAINED_AFTER
                    && reported.is_none_or(|at| at.elapsed() >= SUSTAINED_REPORT_EVERY) =>
            {
                reported = Some(std::time::Instant::now());
                tracing::error!(
                    failing_for_secs = lasted.as_secs(),
                    "every backend call has failed for {}s: {latest}; each limit answers its \
                     failure_mode, and health stays SERVING (--health-fail-after makes it \
                     NOT_SERVING)",
                    lasted.as_secs()
                );
            }
            (None, _) => reported = None,
            _ => {}
        }
        health.set_backend_error(error).await;
    }
}
