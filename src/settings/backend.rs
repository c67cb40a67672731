//! Where counters live and how they are reached: the memory store and its budget, or a Redis
//! deployment (one server, a cluster or sentinels) with its URL, auth, TLS files, pool and
//! timeouts, and the reference's second Redis for one-second windows (`REDIS_PERSECOND_*`).

use std::path::PathBuf;
use std::time::Duration;

use super::env::Env;
use super::flags::{BackendKind, Flags};
use super::{Entry, SettingsError, positive};
use crate::backend::Store;
use crate::backend::memory;
use crate::backend::redis::connect::{self, Auth, Kind, SocketType, Target, TlsFiles};

const DEFAULT_REDIS_URL: &str = "redis://127.0.0.1:6379";
const DEFAULT_KEY_PREFIX: &str = "tollgate:";
const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_millis(50);

/// Where counters live and how they are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSettings {
    /// The main store.
    pub store: Store,
    /// A second Redis for one-second windows (`REDIS_PERSECOND`).
    pub per_second: Option<Target>,
    /// The prefix of every key.
    pub key_prefix: String,
    /// The deadline of one backend call.
    pub timeout: Duration,
    /// Replicas that must acknowledge a decision's writes (0: none).
    pub wait_replicas: u32,
    /// The most bytes the memory store holds (unused by the Redis stores).
    pub memory_budget: usize,
    /// `EXPIRATION_JITTER_MAX_SECONDS`: parsed only; sliding-window keys expire when their last
    /// entry leaves the window, so there is nothing to spread.
    pub expiration_jitter_max_seconds: i64,
}

pub(super) fn backend(
    entry: Entry,
    flags: &Flags,
    env: &Env<'_>,
    notices: &mut Vec<String>,
) -> Result<BackendSettings, SettingsError> {
    let redis_type = |var: &str| -> Result<Kind, SettingsError> {
        match env.string(var) {
            None => Ok(Kind::Single),
            Some(text) => match text.to_ascii_lowercase().as_str() {
                "single" => Ok(Kind::Single),
                "cluster" => Ok(Kind::Cluster),
                "sentinel" => Ok(Kind::Sentinel),
                _ => Err(env.malformed(var, "single, cluster or sentinel")),
            },
        }
    };
    let main_type = redis_type("REDIS_TYPE")?;
    let kind = match flags.backend {
        Some(BackendKind::Memory) => None,
        Some(BackendKind::Redis) => Some(Kind::Single),
        Some(BackendKind::RedisCluster) => Some(Kind::Cluster),
        Some(BackendKind::RedisSentinel) => Some(Kind::Sentinel),
        None => match env.string("BACKEND_TYPE").as_deref() {
            Some("redis" | "") => Some(main_type),
            Some("memcache") => {
                return Err(SettingsError::Unsupported(
                    "BACKEND_TYPE=memcache: tollgate has no memcached backend; use \
                     BACKEND_TYPE=redis (its windows need Redis's atomic scripts)"
                        .into(),
                ));
            }
            Some(_) => return Err(env.malformed("BACKEND_TYPE", "redis (or memcache)")),
            None if entry == Entry::Reference => Some(main_type),
            None => None,
        },
    };
    let key_prefix = match &flags.key_prefix {
        Some(prefix) => prefix.clone(),
        None => env
            .string("CACHE_KEY_PREFIX")
            .unwrap_or_else(|| DEFAULT_KEY_PREFIX.into()),
    };
    if key_prefix.contains(['{', '}']) {
        let name = if flags.key_prefix.is_some() {
            "--key-prefix"
        } else {
            "CACHE_KEY_PREFIX"
        };
        return Err(SettingsError::Invalid(format!(
            "{name}: a key prefix must not contain `{{` or `}}`: tollgate places the Redis hash \
             tag itself"
        )));
    }
    let timeout = flags.backend_timeout.unwrap_or(DEFAULT_BACKEND_TIMEOUT);
    let memory_budget = flags.memory_budget.unwrap_or_else(memory::default_budget);
    let expiration_jitter_max_seconds = env.int("EXPIRATION_JITTER_MAX_SECONDS")?.unwrap_or(300);
    let wait_replicas = flags.redis_wait_replicas.unwrap_or(0);
    let tls_files = redis_tls_files(flags, env)?;
    let main_tls = tls_files.is_some()
        && (env.boolean("REDIS_TLS")?.unwrap_or(false)
            || flags.redis_tls_cert.is_some()
            || flags.redis_tls_ca.is_some());
    let per_second_wanted = env.boolean("REDIS_PERSECOND")?.unwrap_or(false);

    let Some(kind) = kind else {
        if per_second_wanted {
            notices.push(
                "REDIS_PERSECOND=true is ignored: the backend is memory (set BACKEND_TYPE=redis \
                 or --backend redis)"
                    .into(),
            );
        }
        return Ok(BackendSettings {
            store: Store::Memory,
            per_second: None,
            key_prefix,
            timeout,
            wait_replicas,
            memory_budget,
            expiration_jitter_max_seconds,
        });
    };
    if flags.memory_budget.is_some() {
        notices.push(
            "--memory-budget is ignored: it bounds the memory backend, and the counters are in \
             Redis"
                .into(),
        );
    }
    if kind == Kind::Cluster && wait_replicas > 0 {
        return Err(SettingsError::Unsupported(
            "--redis-wait-replicas is for one server or sentinel, not a cluster".into(),
        ));
    }
    let (url, url_name) = match &flags.redis_url {
        Some(url) => (url.clone(), "--redis-url"),
        None => match env.string("REDIS_URL") {
            Some(url) => (url, "REDIS_URL"),
            None => (DEFAULT_REDIS_URL.to_owned(), "--redis-url"),
        },
    };
    let main = redis_target(
        env,
        RedisVars {
            url_name,
            url: &url,
            kind,
            socket_type: "REDIS_SOCKET_TYPE",
            auth: "REDIS_AUTH",
            sentinel_auth: "REDIS_SENTINEL_AUTH",
            pool_size: "REDIS_POOL_SIZE",
            timeout: "REDIS_TIMEOUT",
        },
        main_tls.then(|| tls_files.clone()).flatten(),
    )?;
    let per_second = if per_second_wanted {
        let ps_type = redis_type("REDIS_PERSECOND_TYPE")?;
        let ps_url = env.string("REDIS_PERSECOND_URL").ok_or_else(|| {
            SettingsError::Invalid("REDIS_PERSECOND=true needs REDIS_PERSECOND_URL".into())
        })?;
        let ps_tls = env.boolean("REDIS_PERSECOND_TLS")?.unwrap_or(false);
        Some(redis_target(
            env,
            RedisVars {
                url_name: "REDIS_PERSECOND_URL",
                url: &ps_url,
                kind: ps_type,
                socket_type: "REDIS_PERSECOND_SOCKET_TYPE",
                auth: "REDIS_PERSECOND_AUTH",
                sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
                pool_size: "REDIS_PERSECOND_POOL_SIZE",
                timeout: "REDIS_PERSECOND_TIMEOUT",
            },
            if ps_tls {
                Some(tls_files.clone().unwrap_or_default())
            } else {
                None
            },
        )?)
    } else {
        None
    };
    if per_second.as_ref().is_some_and(|t| t.kind == Kind::Cluster) && wait_replicas > 0 {
        return Err(SettingsError::Unsupported(
            "--redis-wait-replicas is for one server or sentinel, not a per-second cluster".into(),
        ));
    }
    Ok(BackendSettings {
        store: Store::Redis(Box::new(main)),
        per_second,
        key_prefix,
        timeout,
        wait_replicas,
        memory_budget,
        expiration_jitter_max_seconds,
    })
}

/// The TLS files for Redis from flags and `REDIS_TLS_*`, shared by both stores as in the
/// reference; `None` when TLS is not asked for at all.
fn redis_tls_files(flags: &Flags, env: &Env<'_>) -> Result<Option<TlsFiles>, SettingsError> {
    let wanted = flags.redis_tls_cert.is_some()
        || flags.redis_tls_ca.is_some()
        || env.boolean("REDIS_TLS")?.unwrap_or(false)
        || env.boolean("REDIS_PERSECOND_TLS")?.unwrap_or(false);
    let path = |flag: &Option<PathBuf>, var: &str| {
        flag.clone()
            .or_else(|| env.string(var).filter(|p| !p.is_empty()).map(PathBuf::from))
    };
    let files = TlsFiles {
        client_cert: path(&flags.redis_tls_cert, "REDIS_TLS_CLIENT_CERT"),
        client_key: path(&flags.redis_tls_key, "REDIS_TLS_CLIENT_KEY"),
        ca_cert: path(&flags.redis_tls_ca, "REDIS_TLS_CACERT"),
        skip_hostname_verification: env
            .boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")?
            .unwrap_or(false),
    };
    if files.client_cert.is_some() != files.client_key.is_some() {
        return Err(SettingsError::Invalid(
            "a Redis client certificate needs both REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY \
             (or --redis-tls-cert and --redis-tls-key)"
                .into(),
        ));
    }
    Ok(wanted.then_some(files))
}

/// The variable names of one Redis store (main or per-second).
struct RedisVars<'a> {
    url_name: &'a str,
    url: &'a str,
    kind: Kind,
    socket_type: &'a str,
    auth: &'a str,
    sentinel_auth: &'a str,
    pool_size: &'a str,
    timeout: &'a str,
}

fn redis_target(
    env: &Env<'_>,
    vars: RedisVars<'_>,
    tls: Option<TlsFiles>,
) -> Result<Target, SettingsError> {
    let socket_type = match env.string(vars.socket_type) {
        None => None,
        Some(text) => match text.as_str() {
            "tcp" | "tcp4" | "tcp6" => Some(SocketType::Tcp),
            "unix" => Some(SocketType::Unix),
            _ => return Err(env.malformed(vars.socket_type, "tcp or unix")),
        },
    };
    let mut target = Target::parse(vars.kind, vars.url, socket_type).map_err(|err| {
        SettingsError::Invalid(format!(
            "{}={}: {err}",
            vars.url_name,
            connect::redact(vars.url)
        ))
    })?;
    target.auth = env.secret(vars.auth).map(|text| Auth::parse(&text));
    target.sentinel_auth = env
        .secret(vars.sentinel_auth)
        .map(|text| Auth::parse(&text));
    target.tls = tls;
    target.pool_size = match env.int(vars.pool_size)? {
        Some(n) if n < 0 => return Err(env.malformed(vars.pool_size, "a count of 0 or more")),
        Some(n) => usize::try_from(n).ok(),
        None => None,
    };
    target.connect_timeout = env.duration(vars.timeout)?.and_then(positive);
    if let Some(tls) = &target.tls
        && tls.skip_hostname_verification
        && target.kind == Kind::Sentinel
    {
        return Err(SettingsError::Unsupported(
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is not supported with REDIS_TYPE=sentinel; give \
             the CA that signs the servers' certificates (REDIS_TLS_CACERT) instead"
                .into(),
        ));
    }
    Ok(target)
}
