//! Hot reload: the policy files are polled for changes (Kubernetes updates a ConfigMap mount by
//! swapping a symlink, which no single-file watch sees) and re-read on SIGHUP. A config that fails
//! to load is logged and the last good one keeps serving.

use std::sync::Arc;
use std::time::Duration;

use super::App;
use crate::backend::Backend;
use crate::config::{FileSource, LoadOptions};
use crate::limiter::Limiter;

/// Watches `source` forever, swapping a freshly loaded config into the app's limiter when its
/// files change (gathered as `options` say; telling health how many domains it has and the
/// metrics how the load went).
pub async fn watch<B: Backend>(
    app: Arc<App<B>>,
    source: FileSource,
    options: LoadOptions,
    interval: Duration,
) {
    let mut last_seen = source.fingerprint();
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hangup = hangup_signal();
    loop {
        let forced = tokio::select! {
            _ = ticker.tick() => false,
            _ = next_hangup(&mut hangup) => true,
        };
        let current = source.fingerprint();
        if !forced && current == last_seen {
            continue;
        }
        last_seen = current;
        let loaded = reload(&app.limiter, &source, options);
        let config = app.limiter.config();
        let hash = config.content_hash();
        app.metrics.observe_config_load(
            if loaded { Ok(&hash) } else { Err(()) },
            std::time::SystemTime::now(),
        );
        if loaded {
            app.health.policies_loaded(config.len()).await;
        }
    }
}

/// Loads `source` (gathered as `options` say) and installs it; on failure keeps the config in
/// force. Returns whether it took.
pub fn reload<B: Backend>(limiter: &Limiter<B>, source: &FileSource, options: LoadOptions) -> bool {
    match source.load_with(options) {
        Ok(config) => {
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            log_skipped(&config);
            limiter.set_config(Arc::new(config));
            tracing::info!(source = %source.describe(), "config reloaded");
            true
        }
        Err(error) => {
            tracing::error!(%error, "config reload failed; still serving the last good config");
            false
        }
    }
}

/// Says which entries of a config directory were not read, so a policy file with another
/// extension does not go unnoticed.
pub fn log_skipped(config: &crate::config::Config) {
    for skipped in config.skipped() {
        tracing::info!(
            path = %skipped.display(),
            "not a policy file (only *.yaml and *.yml files are read); skipped"
        );
    }
}

#[cfg(unix)]
type Hangup = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangup = ();

#[cfg(unix)]
fn hangup_signal() -> Hangup {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}

#[cfg(not(unix))]
fn hangup_signal() -> Hangup {}

#[cfg(unix)]
async fn next_hangup(signal: &mut Hangup) {
    match signal {
        Some(signal) => {
            signal.recv().await;
        }
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn next_hangup(_: &mut Hangup) {
    std::future::pending().await
}
