//! Hot reload: the policy files are polled for changes (Kubernetes updates a ConfigMap mount by
//! swapping a symlink, which no single-file watch sees) and re-read on SIGHUP. A change is loaded
//! once it has stayed unchanged for a settle time, so a file caught mid-write is never applied. A
//! config that fails to load is logged and the last good one keeps serving, and so does one that
//! has lost every policy (unless the operator allows empty configs).

use std::sync::Arc;
use std::time::Duration;

use super::App;
use crate::backend::Backend;
use crate::config::{FileSource, LoadOptions};
use crate::limiter::Limiter;

/// How long a changed config must stay unchanged before it is loaded when no other time is
/// given. Editors and `kubectl cp` write a file in several steps; a ConfigMap update is a symlink
/// swap and is whole at once, so this only delays it by the settle time.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);

/// How the policy files are watched.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// How often the files are checked for changes.
    pub interval: Duration,
    /// How long a change must stay as it is before it is loaded: the files are read again after
    /// this long, and only applied once two readings agree.
    pub settle: Duration,
    /// Whether a config with no policies at all replaces one that has some.
    pub allow_empty: bool,
}

/// Watches `source` forever, swapping a freshly loaded config into the app's limiter when its
/// files change and have settled (gathered as `options` say; telling health how many domains it
/// has and the metrics how the load went: a refused empty config counts as a failed load).
pub async fn watch<B: Backend>(
    app: Arc<App<B>>,
    source: FileSource,
    options: LoadOptions,
    watch: Watch,
) {
    let mut last_seen = source.fingerprint();
    let mut ticker = tokio::time::interval(watch.interval.max(Duration::from_millis(100)));
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
        last_seen = settled(&source, current, watch.settle).await;
        let loaded = reload(&app.limiter, &source, options, watch.allow_empty);
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

/// Waits until the files of `source` read the same twice `settle` apart, starting from the
/// reading `seen`, and answers that reading. A writer that is still at it keeps this waiting, so
/// a file is never loaded half written (even when its first half is valid YAML on its own).
async fn settled(source: &FileSource, mut seen: u64, settle: Duration) -> u64 {
    let mut rounds = 0u32;
    loop {
        tokio::time::sleep(settle).await;
        let again = source.fingerprint();
        if again == seen {
            return seen;
        }
        seen = again;
        rounds += 1;
        if rounds.is_multiple_of(10) {
            tracing::warn!(
                source = %source.describe(),
                "the config keeps changing; waiting for it to stay unchanged for {settle:?} before loading it"
            );
        }
    }
}

/// Loads `source` (gathered as `options` say) and installs it; on failure keeps the config in
/// force. A config with no policies replaces one that has some only with `allow_empty`: an
/// emptied directory, a ConfigMap whose `..data` link dangles or files removed one by one would
/// otherwise allow every request. Returns whether it took.
pub fn reload<B: Backend>(
    limiter: &Limiter<B>,
    source: &FileSource,
    options: LoadOptions,
    allow_empty: bool,
) -> bool {
    match source.load_with(options) {
        Ok(config) if config.is_empty() && !allow_empty && !limiter.config().is_empty() => {
            tracing::error!(
                source = %source.describe(),
                "config reload found no policies ({}); still serving the last good config ({} \
                 domains); pass --allow-empty-config to apply an empty config",
                source.why_empty(),
                limiter.config().len()
            );
            false
        }
        Ok(config) => {
            for warning in config.warnings() {
                tracing::warn!("{warning}");
            }
            log_skipped(&config);
            log_dropped(&limiter.config(), &config, &source.describe());
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

/// The most dropped limits a reload's warning names; the rest are counted.
const NAMED_DROPPED: usize = 20;

/// Says at WARN which limits of `old` the reload to `new` drops: a file cut short that is still
/// valid YAML, or a policy removed by mistake, takes limits away, and their requests are
/// allowed from then on. `source` names where `new` came from (a path, an xDS server).
pub(super) fn log_dropped(old: &crate::config::Config, new: &crate::config::Config, source: &str) {
    let dropped = old.dropped_limits(new);
    if dropped.is_empty() {
        return;
    }
    let named = dropped
        .iter()
        .take(NAMED_DROPPED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    let more = dropped.len().saturating_sub(NAMED_DROPPED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    tracing::warn!(
        source,
        dropped = dropped.len(),
        "config reload drops {} {}, whose requests are no longer limited: {named}{more}",
        dropped.len(),
        if dropped.len() == 1 {
            "limit"
        } else {
            "limits"
        }
    );
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
