//! Hot reload: the config path is polled for changes (Kubernetes updates a ConfigMap mount by
//! swapping a symlink, which no single-file watch sees) and re-read on SIGHUP. A config that fails
//! to load is logged and the last good one keeps serving.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::config::{Config, LoadOptions};
use crate::limiter::Limiter;

/// Watches `path` forever, swapping a freshly loaded config (gathered as `options` say) into
/// `limiter` when the files change.
pub async fn watch<B: Backend>(
    limiter: Arc<Limiter<B>>,
    path: PathBuf,
    options: LoadOptions,
    interval: Duration,
) {
    let mut last_seen = fingerprint(&path);
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut hangup = hangup_signal();
    loop {
        let forced = tokio::select! {
            _ = ticker.tick() => false,
            _ = next_hangup(&mut hangup) => true,
        };
        let current = fingerprint(&path);
        if !forced && current == last_seen {
            continue;
        }
        last_seen = current;
        reload(&limiter, &path, options);
    }
}

/// Loads `path` (gathered as `options` say) and installs it; on failure keeps the config in
/// force. Returns whether it took.
pub fn reload<B: Backend>(limiter: &Limiter<B>, path: &Path, options: LoadOptions) -> bool {
    match Config::load_with(path, options) {
        Ok(config) => {
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            limiter.set_config(Arc::new(config));
            tracing::info!(path = %path.display(), "config reloaded");
            true
        }
        Err(error) => {
            tracing::error!(%error, "config reload failed; still serving the last good config");
            false
        }
    }
}

/// A cheap digest of everything under `path` that could change the config: the names and
/// contents of the policy files (following symlinks), so a ConfigMap symlink swap is seen too.
fn fingerprint(path: &Path) -> u64 {
    let mut hasher = DefaultHasher::new();
    let mut files = Vec::new();
    match std::fs::read_dir(path) {
        Ok(entries) => {
            for entry in entries.flatten() {
                let file = entry.path();
                if is_policy_file(&file) {
                    files.push(file);
                }
            }
        }
        Err(_) => files.push(path.to_path_buf()),
    }
    files.sort();
    for file in files {
        file.hash(&mut hasher);
        if let Ok(contents) = std::fs::read(&file) {
            contents.hash(&mut hasher);
        }
    }
    hasher.finish()
}

/// Whether a directory entry is one `Config::load` reads: a visible `*.yaml` / `*.yml` file.
fn is_policy_file(path: &Path) -> bool {
    let visible = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| !n.starts_with('.'));
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e == "yaml" || e == "yml");
    visible && yaml
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
