//! The reference's variables tollgate accepts and ignores (pipelining, start-up backoff, the xDS
//! client's tuning, memcached's): read with their types all the same, so that a Deployment the
//! reference would refuse is refused here too, and a notice says where a value is ignored.

use super::SettingsError;
use super::env::Env;

/// Variables tollgate accepts and ignores, read with their types so that a value the reference
/// would refuse is refused here too.
pub(super) fn ignored_but_typed(
    env: &Env<'_>,
    notices: &mut Vec<String>,
) -> Result<(), SettingsError> {
    for prefix in ["REDIS", "REDIS_PERSECOND"] {
        env.duration(&format!("{prefix}_PIPELINE_WINDOW"))?;
        env.int(&format!("{prefix}_PIPELINE_LIMIT"))?;
        let parallelism = format!("{prefix}_CLUSTER_PIPELINE_PARALLELISM");
        if env.int(&parallelism)?.is_some_and(|n| n < 0) {
            return Err(env.malformed(&parallelism, "0 (auto) or more"));
        }
        let on_empty = format!("{prefix}_POOL_ON_EMPTY_BEHAVIOR");
        if let Some(behaviour) = env.string(&on_empty)
            && !behaviour.eq_ignore_ascii_case("WAIT")
        {
            notices.push(format!(
                "{on_empty}={behaviour}: ignored; tollgate's Redis connections are multiplexed, \
                 so calls never wait for a free connection"
            ));
        }
    }
    env.boolean("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")?;
    // Read again where a Redis store uses them; checked here whatever the backend.
    for var in ["REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT"] {
        env.duration(var)?;
    }
    for var in ["REDIS_POOL_SIZE", "REDIS_PERSECOND_POOL_SIZE"] {
        env.int(var)?;
    }
    for var in [
        "REDIS_TLS",
        "REDIS_PERSECOND_TLS",
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        "REDIS_PERSECOND",
    ] {
        env.boolean(var)?;
    }
    for var in [
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "REDIS_STARTUP_MAX_INTERVAL",
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    ] {
        env.duration(var)?;
    }
    env.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS")?;
    env.boolean("XDS_CLIENT_BACKOFF_JITTER")?;
    env.float("XDS_CLIENT_BACKOFF_RANDOM_FACTOR")?;
    env.int("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")?;
    env.map("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")?;
    for var in ["MEMCACHE_TLS", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION"] {
        env.boolean(var)?;
    }
    env.int("MEMCACHE_MAX_IDLE_CONNS")?;
    env.duration("MEMCACHE_SRV_REFRESH")?;
    Ok(())
}
