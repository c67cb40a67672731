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
    config_error: Option<String>,
    draining: bool,
}

impl Health {
    /// Starts NOT_SERVING (but alive) until the first successful probe.
    pub async fn new(reporter: HealthReporter) -> Arc<Self> {
        let health = Arc::new(Health {
            reporter,
            state: Mutex::new(State {
                backend_error: Some("backend not probed yet".into()),
                config_error: None,
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
        } else if let Some(error) = state.config_error {
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

    async fn set_errors(&self, backend_error: Option<String>, config_error: Option<String>) {
        let changed = {
            let mut state = self.lock();
            let changed = state.backend_error.is_some() != backend_error.is_some()
                || state.config_error.is_some() != config_error.is_some();
            state.backend_error = backend_error;
            state.config_error = config_error;
            changed
        };
        // Only a change is published: every publish reaches each open health Watch stream as
        // a message, and a probe that finds nothing new must not wake them every second.
        if changed {
            match self.check() {
                Ok(()) => tracing::info!("backend reachable and policies loaded: serving"),
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

/// Probes the backend forever, keeping `health` in step with it. With `require_config`, health
/// also stays NOT_SERVING while the loaded config has no domain (the reference's
/// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
pub async fn probe_backend<B: Backend>(
    health: Arc<Health>,
    limiter: Arc<Limiter<B>>,
    require_config: bool,
) {
    let mut ticker = tokio::time::interval(PROBE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let result = tokio::time::timeout(PROBE_INTERVAL, limiter.backend().ping()).await;
        let error = match result {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some(format!(
                "backend unavailable: no answer to a ping within {PROBE_INTERVAL:?}"
            )),
        };
        let config_error = (require_config && limiter.config().is_empty())
            .then(|| "no rate limit configuration with a domain is loaded".to_string());
        health.set_errors(error, config_error).await;
    }
}
