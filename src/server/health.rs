//! Whether tollgate should receive traffic: SERVING only while policies are loaded (for a source
//! that delivers them later, such as xDS: once the first push is in, unless told to start
//! without), the backend answers and the process is not draining. Shared by gRPC health and
//! `GET /healthcheck`.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether calls wait for the first policies, kept beside `state` (written under its lock)
    /// so that every call does not take that lock to learn it does not.
    waiting: AtomicBool,
}

#[derive(Debug, Clone)]
struct State {
    backend_error: Option<String>,
    draining: bool,
    policies: Policies,
}

/// What readiness asks of the policies in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Not ready until the source delivered its first policies (an xDS source without
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG`); requests are refused with UNAVAILABLE until then.
    pub wait_for_first_policies: bool,
    /// Ready only while at least one domain is loaded (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub require_domain: bool,
}

/// The policies side of readiness.
#[derive(Debug, Clone, Default)]
struct Policies {
    readiness: Readiness,
    /// Domains in the policies in force; `None` before a source that delivers later has.
    domains: Option<usize>,
    /// What the source is waiting for, said while not ready for lack of policies.
    waiting_for: String,
}

impl Health {
    /// Starts NOT_SERVING (but alive) until the first successful probe.
    pub async fn new(reporter: HealthReporter) -> Arc<Self> {
        let health = Arc::new(Health {
            reporter,
            state: Mutex::new(State {
                backend_error: Some("backend not probed yet".into()),
                draining: false,
                policies: Policies::default(),
            }),
            waiting: AtomicBool::new(false),
        });
        health.publish().await;
        health
    }

    /// `Ok(())` when serving, else why not.
    pub fn check(&self) -> Result<(), String> {
        let state = self.lock().clone();
        if state.draining {
            Err("draining: shutting down".into())
        } else if let Some(reason) = state.policies.not_ready() {
            Err(reason)
        } else if let Some(error) = state.backend_error {
            Err(error)
        } else {
            Ok(())
        }
    }

    /// Sets what readiness asks of the policies, with `domains` loaded now (`None`: none yet,
    /// the source delivers them later; `waiting_for` says from where).
    pub async fn set_policies(
        &self,
        readiness: Readiness,
        domains: Option<usize>,
        waiting_for: String,
    ) {
        {
            let mut state = self.lock();
            state.policies = Policies {
                readiness,
                domains,
                waiting_for,
            };
            self.waiting
                .store(state.policies.waiting(), Ordering::Release);
        }
        self.publish().await;
    }

    /// Records that policies with `domains` domains are in force.
    pub async fn policies_loaded(&self, domains: usize) {
        let changed = {
            let mut state = self.lock();
            let before = state.policies.not_ready();
            state.policies.domains = Some(domains);
            self.waiting.store(false, Ordering::Release);
            before != state.policies.not_ready()
        };
        if changed {
            match self.check() {
                Ok(()) => tracing::info!("policies loaded: serving"),
                Err(reason) => tracing::warn!(%reason, "not serving"),
            }
            self.publish().await;
        }
    }

    /// Why requests cannot be decided yet: the source has not delivered its first policies and
    /// readiness waits for them. `None` once they are in (or when nothing waits for them).
    pub fn waiting_for_policies(&self) -> Option<String> {
        if !self.waiting.load(Ordering::Acquire) {
            return None;
        }
        let state = self.lock();
        let policies = &state.policies;
        policies.waiting().then(|| policies.waiting_for.clone())
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

impl Policies {
    /// Whether calls are answered UNAVAILABLE until the first policies arrive.
    fn waiting(&self) -> bool {
        self.readiness.wait_for_first_policies && self.domains.is_none()
    }

    /// Why the policies keep tollgate from being ready, if they do.
    fn not_ready(&self) -> Option<String> {
        match self.domains {
            None if self.readiness.wait_for_first_policies => Some(self.waiting_for.clone()),
            Some(0) | None if self.readiness.require_domain => Some(
                "no policy domain loaded, and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED asks for \
                 at least one"
                    .into(),
            ),
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(wait: bool, require: bool, domains: Option<usize>) -> Policies {
        Policies {
            readiness: Readiness {
                wait_for_first_policies: wait,
                require_domain: require,
            },
            domains,
            waiting_for: "waiting for xDS".into(),
        }
    }

    #[test]
    fn readiness_follows_the_policies_as_the_reference_does() {
        let domain_needed = Some(
            "no policy domain loaded, and HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED asks for at \
             least one"
                .to_string(),
        );
        // Files: loaded before serving.
        assert_eq!(policies(false, false, Some(0)).not_ready(), None);
        assert_eq!(policies(false, true, Some(0)).not_ready(), domain_needed);
        assert_eq!(policies(false, true, Some(2)).not_ready(), None);
        // xDS without FORCE_START_WITHOUT_INITIAL_CONFIG: not ready until the first push.
        assert_eq!(
            policies(true, false, None).not_ready(),
            Some("waiting for xDS".into())
        );
        assert_eq!(policies(true, false, Some(0)).not_ready(), None);
        // xDS with it: ready at once, unless a domain is required.
        assert_eq!(policies(false, false, None).not_ready(), None);
        assert_eq!(policies(false, true, None).not_ready(), domain_needed);
    }
}
