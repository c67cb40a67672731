//! Settings parsed here for behaviour other parts of tollgate carry out: the near-limit ratio of
//! the reference's metrics and the local over-limit cache's budget, whose default depends on the
//! store.

use super::SettingsError;
use super::env::Env;
use super::flags::Flags;
use crate::backend::Store;

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
    /// The local over-limit cache's budget in front of `store`: as set, else on for the memory
    /// backend (every release goes through this process, so the cache is exact) and off for Redis
    /// (another instance's refund of a rejected request's charge is not seen here, and an entry
    /// would keep refusing what that refund made room for).
    pub fn local_cache_bytes(&self, store: &Store) -> u64 {
        match (self.local_cache_size_in_bytes, store) {
            (Some(bytes), _) => bytes,
            (None, Store::Memory) => crate::backend::local_cache::DEFAULT_BYTES,
            (None, Store::Redis(_)) => 0,
        }
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
