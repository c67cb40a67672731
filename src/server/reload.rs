//! Hot reload: the config path is polled for changes (Kubernetes updates a ConfigMap mount by
//! swapping a symlink, which no single-file watch sees) and re-read on SIGHUP. A change is loaded
//! once it has stayed unchanged for a settle time, so a file caught mid-write is never applied. A
//! config that fails to load is logged and the last good one keeps serving, and so does one that
//! has lost every policy (unless the operator allows empty configs).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::backend::Backend;
use crate::config::Config;
use crate::limiter::Limiter;

/// How long a changed config must stay unchanged before it is loaded when no other time is
/// given. Editors and `kubectl cp` write a file in several steps; a ConfigMap update is a symlink
/// swap and is whole at once, so this only delays it by the settle time.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);

/// How the config path is watched.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// How often the path is checked for changes.
    pub interval: Duration,
    /// How long a change must stay as it is before it is loaded: a file is read again after
    /// this long, and only applied once two readings agree.
    pub settle: Duration,
    /// Whether a config with no policies at all replaces one that has some.
    pub allow_empty: bool,
}

/// Watches `path` forever, swapping a freshly loaded config into `limiter` when the files change
/// and have settled.
pub async fn watch<B: Backend>(limiter: Arc<Limiter<B>>, path: PathBuf, watch: Watch) {
    let mut last_seen = fingerprint(&path);
    let mut ticker = tokio::time::interval(watch.interval.max(Duration::from_millis(100)));
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
        last_seen = settled(&path, current, watch.settle).await;
        reload(&limiter, &path, watch.allow_empty);
    }
}

/// Waits until the files under `path` read the same twice `settle` apart, starting from the
/// reading `seen`, and answers that reading. A writer that is still at it keeps this waiting, so
/// a file is never loaded half written (even when its first half is valid YAML on its own).
async fn settled(path: &Path, mut seen: u64, settle: Duration) -> u64 {
    let mut rounds = 0u32;
    loop {
        tokio::time::sleep(settle).await;
        let again = fingerprint(path);
        if again == seen {
            return seen;
        }
        seen = again;
        rounds += 1;
        if rounds.is_multiple_of(10) {
            tracing::warn!(
                path = %path.display(),
                "the config keeps changing; waiting for it to stay unchanged for {settle:?} before loading it"
            );
        }
    }
}

/// Loads `path` and installs it; on failure keeps the config in force. A config with no
/// policies replaces one that has some only with `allow_empty`: an emptied directory, a
/// ConfigMap whose `..data` link dangles or files removed one by one would otherwise allow every
/// request. Returns whether it took.
pub fn reload<B: Backend>(limiter: &Limiter<B>, path: &Path, allow_empty: bool) -> bool {
    match Config::load(path) {
        Ok(config) if config.is_empty() && !allow_empty && !limiter.config().is_empty() => {
            tracing::error!(
                path = %path.display(),
                "config reload found no policies ({}); still serving the last good config ({} \
                 domains); pass --allow-empty-config to apply an empty config",
                why_empty(path),
                limiter.config().len()
            );
            false
        }
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

/// Why a config directory yields no policies, as far as its entries tell: links that lead
/// nowhere (a ConfigMap's `..data` swapped away), or no policy file at all.
fn why_empty(path: &Path) -> String {
    let Ok(entries) = std::fs::read_dir(path) else {
        return "the path cannot be listed".to_owned();
    };
    let mut dangling = Vec::new();
    let mut files = 0;
    for entry in entries.flatten() {
        let entry_path = entry.path();
        let is_link = entry
            .file_type()
            .is_ok_and(|file_type| file_type.is_symlink());
        if is_link && std::fs::metadata(&entry_path).is_err() {
            dangling.push(entry.file_name().to_string_lossy().into_owned());
        } else if is_policy_file(&entry_path) {
            files += 1;
        }
    }
    dangling.sort();
    match (dangling.is_empty(), files) {
        (false, _) => format!("dangling symlinks: {}", dangling.join(", ")),
        (true, 0) => "no *.yaml or *.yml files".to_owned(),
        (true, _) => "the policy files declare no domain".to_owned(),
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
