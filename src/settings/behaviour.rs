//! Settings parsed here for behaviour other parts of tollgate carry out: the near-limit ratio of
//! the reference's metrics and the local over-limit cache's budget, whose default depends on the
//! store.

use super::SettingsError;
use super::env::Env;
use super::flags::Flags;

/// Settings whose behaviour other parts of tollgate implement (or will); parsed and checked here.
#[derive(Debug, Clone, PartialEq)]
pub struct Behaviour {
    /// `NEAR_LIMIT_RATIO`: the share of a limit past which a hit counts as "near limit" in the
    /// reference's metrics. Parsed for those metrics.
    pub near_limit_ratio: f64,
    /// `--local-cache-bytes` or `LOCAL_CACHE_SIZE_IN_BYTES`: the byte budget of the local
    /// over-limit cache (0: off); `None` when neither is set (the default depends on the store:
    /// see [`Behaviour::local_cache_bytes`]).
    pub local_cache_size_in_bytes: Option<u64>,
}

impl Behaviour {
    /// The local over-limit cache's budget: as set, else on with
    /// [`DEFAULT_BYTES`](crate::backend::local_cache::DEFAULT_BYTES) in front of every store. It
    /// is exact across instances: a shared store says how long each refusal stands whatever
    /// other instances give back, and the cache keeps it no longer.
    pub fn local_cache_bytes(&self) -> u64 {
        self.local_cache_size_in_bytes
            .unwrap_or(crate::backend::local_cache::DEFAULT_BYTES)
    }

    /// Whether the cache answers hits under `counting: all` too, skipping the charge the store
    /// would make of each refusal, as envoyproxy/ratelimit's local cache does: only when its size
    /// was set (`LOCAL_CACHE_SIZE_IN_BYTES`, `--local-cache-bytes`), as the reference's cache is
    /// on only then. On by default, the cache never changes what is charged.
    pub fn local_cache_answers_counted(&self) -> bool {
        self.local_cache_size_in_bytes.is_some()
    }
}

pub(super) fn behaviour(flags: &Flags, env: &Env<'_>) -> Result<Behaviour, SettingsError> {
    let near_limit_ratio = env.float("NEAR_LIMIT_RATIO")?.unwrap_or(0.8);
    // The reference's 0 (its default) turns the cache off when set explicitly; unset, the
    // backend decides (`Behaviour::local_cache_bytes`).
    let local_cache_size_in_bytes = match flags.local_cache_bytes {
        Some(bytes) => Some(u64::try_from(bytes).unwrap_or(u64::MAX)),
        None => match env.int("LOCAL_CACHE_SIZE_IN_BYTES")? {
            Some(n) if n < 0 => {
                return Err(
                    env.malformed("LOCAL_CACHE_SIZE_IN_BYTES", "a size in bytes, 0 or more")
                );
            }
            Some(n) => Some(u64::try_from(n).unwrap_or(0)),
            None => None,
        },
    };
    Ok(Behaviour {
        near_limit_ratio,
        local_cache_size_in_bytes,
    })
}
