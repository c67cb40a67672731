//! Tests of the settings: the flags, the `TOLLGATE_*` variables and the reference's, their order of
//! precedence, each entry's defaults, Go's syntax, and the message a malformed value stops
//! start-up with.

use std::collections::HashMap;

use super::env::{go_duration, go_int, listen_addr};
use super::*;
use crate::backend::memory;
use crate::backend::redis::connect::Kind;
use crate::config::{FileSource, RuntimeLayout};

fn resolve(entry: Entry, flags: &Flags, vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    let map: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Settings::resolve(entry, flags, &move |name| map.get(name).cloned())
}

fn config_flag() -> Flags {
    Flags {
        config: Some(PathBuf::from("examples/")),
        ..Flags::default()
    }
}

fn error(entry: Entry, vars: &[(&str, &str)]) -> String {
    resolve(entry, &config_flag(), vars)
        .unwrap_err()
        .to_string()
}

/// What Envoy Gateway sets on the rate-limit container.
const ENVOY_GATEWAY: &[(&str, &str)] = &[
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
    ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
    ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
    ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
    ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
    ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("REDIS_URL", "redis.redis-system.svc.cluster.local:6379"),
    ("USE_PROMETHEUS", "true"),
    ("PROMETHEUS_ADDR", ":19001"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];

#[test]
fn envoy_gateways_environment_resolves_under_the_ratelimit_entry() {
    let settings = resolve(Entry::Reference, &Flags::default(), ENVOY_GATEWAY).unwrap();
    assert_eq!(
        settings.listen.grpc,
        GrpcAddr::Tcp("0.0.0.0:8081".parse().unwrap())
    );
    assert_eq!(settings.listen.http, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(settings.listen.debug, Some("0.0.0.0:6070".parse().unwrap()));
    assert_eq!(
        settings.listen.metrics,
        Some("0.0.0.0:19001".parse().unwrap())
    );
    let tls = settings.grpc.tls.expect("TLS on");
    assert_eq!(tls.cert, PathBuf::from("/certs/tls.crt"));
    assert_eq!(tls.client_ca, Some(PathBuf::from("/certs/ca.crt")));
    let PolicySettings::XdsSotw { options, .. } = &settings.policies else {
        panic!("policies over xDS: {:?}", settings.policies);
    };
    assert_eq!(options.server_url, "envoy-gateway:18001");
    assert_eq!(options.node_id, "envoy-ratelimit");
    assert_eq!(
        options.client_cert.as_deref(),
        Some(std::path::Path::new("/certs/tls.crt"))
    );
    assert!(options.force_start_without_initial_config);
    assert!(settings.force_start_without_initial_config);
    assert_eq!(settings.log.level, Some(LogLevel::Info));
    let Store::Redis(target) = &settings.backend.store else {
        panic!("a redis backend: {:?}", settings.backend.store);
    };
    assert_eq!(target.kind, Kind::Single);
    assert_eq!(
        target.describe(),
        "redis.redis-system.svc.cluster.local:6379"
    );
    assert!(target.tls.is_none());
    assert_eq!(
        settings.grpc.max_connection_age,
        Some(Duration::from_secs(86_400))
    );
    assert_eq!(
        settings.stats.mapper_yaml.as_deref(),
        Some(std::path::Path::new("/etc/statsd-exporter/conf.yaml"))
    );
}

#[test]
fn with_nothing_set_serve_keeps_tollgates_defaults() {
    let settings = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    assert_eq!(settings.listen.grpc, GrpcAddr::Tcp(DEFAULT_GRPC));
    assert_eq!(settings.listen.http, DEFAULT_HTTP);
    assert_eq!(settings.listen.debug, None);
    assert_eq!(settings.listen.metrics, None);
    assert_eq!(settings.backend.store, Store::Memory);
    assert_eq!(settings.backend.key_prefix, "tollgate:");
    assert_eq!(settings.backend.timeout, Duration::from_millis(50));
    assert_eq!(settings.grpc.tls, None);
    assert_eq!(settings.grpc.max_connection_age, None);
    assert_eq!(settings.log.level, None);
    assert_eq!(settings.log.format, LogFormat::Text);
    assert_eq!(settings.limiter, limiter::Settings::default());
    assert_eq!(
        settings.policies,
        PolicySettings::Files(FileSource::Path(PathBuf::from("examples/")))
    );
    assert!(settings.notices.is_empty(), "{:?}", settings.notices);
    let missing = resolve(Entry::Tollgate, &Flags::default(), &[]).unwrap_err();
    assert!(missing.to_string().contains("--config"), "{missing}");
}

/// `--grpc-fast-path` is a boolean like the others: on by default, `--grpc-fast-path`,
/// `--grpc-fast-path=true|false` or `--grpc-fast-path false`.
#[test]
fn the_grpc_fast_path_flag_is_on_unless_turned_off() {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        flags: Flags,
    }
    let fast_path = |args: &[&str]| {
        let parsed = <Serve as clap::Parser>::try_parse_from(
            ["serve", "--config", "examples/"].iter().chain(args),
        )
        .unwrap_or_else(|err| panic!("{args:?}: {err}"));
        let settings = resolve(Entry::Tollgate, &parsed.flags, &[]).unwrap();
        settings.grpc.fast_path
    };
    assert!(fast_path(&[]));
    assert!(fast_path(&["--grpc-fast-path"]));
    assert!(fast_path(&["--grpc-fast-path=true"]));
    assert!(!fast_path(&["--grpc-fast-path=false"]));
    assert!(!fast_path(&["--grpc-fast-path", "false"]));
}

/// `--admin-allow-reset` is off unless asked for, by the flag or `TOLLGATE_ADMIN_ALLOW_RESET`
/// (which clap reads for the flag, so it is tried through the flag's parser).
#[test]
fn admin_reset_is_off_unless_asked_for() {
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        flags: Flags,
    }
    let allowed = |args: &[&str]| {
        let parsed = <Serve as clap::Parser>::try_parse_from(
            ["serve", "--config", "examples/"].iter().chain(args),
        )
        .unwrap_or_else(|err| panic!("{args:?}: {err}"));
        resolve(Entry::Tollgate, &parsed.flags, &[])
            .unwrap()
            .admin_allow_reset
    };
    assert!(!allowed(&[]));
    assert!(allowed(&["--admin-allow-reset"]));
    assert!(allowed(&["--admin-allow-reset=true"]));
    assert!(!allowed(&["--admin-allow-reset=false"]));
}

#[test]
fn the_hardening_flags_default_safe_and_reach_their_settings() {
    let settings = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    assert_eq!(settings.reload_settle, Duration::from_secs(1));
    assert!(!settings.allow_empty_config);
    assert_eq!(settings.max_in_flight, Some(256));
    assert_eq!(settings.health_fail_after, None);
    assert_eq!(settings.backend.memory_budget, memory::default_budget());

    let flags = Flags {
        reload_settle: Some(Duration::from_millis(300)),
        allow_empty_config: Some(true),
        memory_budget: Some(parse_bytes("4MiB").unwrap()),
        max_in_flight: Some(0),
        health_fail_after: Some(Duration::from_secs(30)),
        ..config_flag()
    };
    let settings = resolve(Entry::Tollgate, &flags, &[]).unwrap();
    assert_eq!(settings.reload_settle, Duration::from_millis(300));
    assert!(settings.allow_empty_config);
    assert_eq!(settings.backend.memory_budget, 4 << 20);
    assert_eq!(settings.max_in_flight, None, "0 is unbounded");
    assert_eq!(settings.health_fail_after, Some(Duration::from_secs(30)));
    assert!(settings.notices.is_empty(), "{:?}", settings.notices);

    // A budget for counters that live in Redis is said to do nothing.
    let redis = Flags {
        backend: Some(BackendKind::Redis),
        ..flags
    };
    let settings = resolve(Entry::Tollgate, &redis, &[]).unwrap();
    assert!(
        settings
            .notices
            .iter()
            .any(|n| n.contains("--memory-budget")),
        "{:?}",
        settings.notices
    );
}

#[test]
fn sizes_read_binary_and_decimal_units_and_refuse_a_budget_below_the_least() {
    assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
    assert_eq!(parse_bytes("1GiB"), Ok(1 << 30));
    assert_eq!(parse_bytes("2M"), Ok(2 << 20));
    assert_eq!(parse_bytes("5MB"), Ok(5_000_000));
    assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
    assert!(parse_bytes("512KiB").unwrap_err().contains("smallest"));
    assert!(parse_bytes("12 parsecs").unwrap_err().contains("unit"));
    assert!(parse_bytes("MiB").unwrap_err().contains("not a size"));
    assert!(parse_bytes("99999999999999999999GiB").is_err());
}

/// The reference's default store is one Redis server, and the runtime is scheduled for it (the
/// other half of `server::runtime`'s test, which starts from a store).
#[test]
fn the_references_default_store_queues_wakeups() {
    use crate::server::runtime::Wakeups;
    let redis = Settings::resolve(Entry::Reference, &Flags::default(), &|name| {
        (name == "REDIS_URL").then(|| "127.0.0.1:6379".to_owned())
    })
    .expect("the reference's defaults");
    assert!(matches!(redis.backend.store, Store::Redis(_)));
    assert_eq!(Wakeups::for_store(&redis.backend.store), Wakeups::Queue);
}

#[test]
fn the_ratelimit_entry_takes_the_references_defaults() {
    let settings = resolve(Entry::Reference, &Flags::default(), &[]).unwrap();
    assert!(matches!(settings.backend.store, Store::Redis(_)));
    assert_eq!(settings.listen.debug, Some("0.0.0.0:6070".parse().unwrap()));
    assert_eq!(
        settings.policies,
        PolicySettings::Files(FileSource::Runtime(RuntimeLayout {
            root: "/srv/runtime_data/current".into(),
            subdirectory: String::new(),
            appdirectory: "config".into(),
            watch_root: true,
            ignore_dot_files: false,
        }))
    );
}

#[test]
fn flags_win_over_the_references_variables() {
    let flags = Flags {
        grpc_addr: Some("127.0.0.1:1".parse().unwrap()),
        http_addr: Some("127.0.0.1:2".parse().unwrap()),
        backend: Some(BackendKind::Memory),
        key_prefix: Some("mine:".into()),
        shadow_mode: Some(false),
        ..config_flag()
    };
    let settings = resolve(
        Entry::Reference,
        &flags,
        &[
            ("GRPC_PORT", "9"),
            ("PORT", "10"),
            ("BACKEND_TYPE", "redis"),
            ("CACHE_KEY_PREFIX", "theirs:"),
            ("SHADOW_MODE", "true"),
            ("RUNTIME_ROOT", "/elsewhere"),
        ],
    )
    .unwrap();
    assert_eq!(
        settings.listen.grpc,
        GrpcAddr::Tcp("127.0.0.1:1".parse().unwrap())
    );
    assert_eq!(settings.listen.http, "127.0.0.1:2".parse().unwrap());
    assert_eq!(settings.backend.store, Store::Memory);
    assert_eq!(settings.backend.key_prefix, "mine:");
    assert!(!settings.limiter.shadow_mode);
    assert_eq!(
        settings.policies,
        PolicySettings::Files(FileSource::Path(PathBuf::from("examples/")))
    );
}

#[test]
fn the_references_variables_fill_what_flags_leave() {
    let settings = resolve(
        Entry::Tollgate,
        &config_flag(),
        &[
            ("GRPC_PORT", "9081"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0x1F90"),
            ("BACKEND_TYPE", "redis"),
            ("REDIS_TYPE", "Sentinel"),
            ("REDIS_URL", "mymaster,127.0.0.1:26379,127.0.0.1:26380"),
            ("REDIS_AUTH", "alice:secret"),
            ("REDIS_SENTINEL_AUTH", "sentinelpass"),
            ("CACHE_KEY_PREFIX", ""),
            ("SHADOW_MODE", "T"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
            ("LOG_FORMAT", "JSON"),
            ("LOG_LEVEL", "WARNING"),
        ],
    )
    .unwrap();
    assert_eq!(
        settings.listen.grpc,
        GrpcAddr::Tcp("0.0.0.0:9081".parse().unwrap())
    );
    assert_eq!(settings.listen.http, "127.0.0.1:8080".parse().unwrap());
    let Store::Redis(target) = &settings.backend.store else {
        panic!("redis");
    };
    assert_eq!(target.kind, Kind::Sentinel);
    assert_eq!(target.master_name.as_deref(), Some("mymaster"));
    assert_eq!(target.nodes.len(), 2);
    assert_eq!(
        target.auth.as_ref().and_then(|a| a.username.as_deref()),
        Some("alice")
    );
    assert_eq!(
        target.sentinel_auth.as_ref().map(|a| a.password.as_str()),
        Some("sentinelpass")
    );
    assert_eq!(settings.backend.key_prefix, "");
    assert!(settings.limiter.shadow_mode);
    let headers = settings.limit_headers.expect("headers on");
    assert_eq!(headers.limit, "RateLimit-Limit");
    assert_eq!(headers.reset, "X-Reset");
    assert_eq!(
        settings.grpc.max_connection_age,
        Some(Duration::from_secs(5400))
    );
    assert_eq!(settings.grpc.max_connection_age_grace, None);
    assert_eq!(settings.log.format, LogFormat::Json);
    assert_eq!(settings.log.level, Some(LogLevel::Warn));
}

#[test]
fn malformed_values_name_the_variable_and_what_it_accepts() {
    let e = error(Entry::Tollgate, &[("PORT", "abc")]);
    assert!(e.starts_with("PORT=abc: expected a port number"), "{e}");
    let e = error(Entry::Tollgate, &[("PORT", "")]);
    assert!(e.starts_with("PORT=: expected"), "{e}");
    let e = error(
        Entry::Tollgate,
        &[("BACKEND_TYPE", "redis"), ("REDIS_TYPE", "ring")],
    );
    assert_eq!(e, "REDIS_TYPE=ring: expected single, cluster or sentinel");
    let e = error(Entry::Tollgate, &[("SHADOW_MODE", "yes")]);
    assert!(
        e.starts_with("SHADOW_MODE=yes: expected true or false"),
        "{e}"
    );
    let e = error(Entry::Tollgate, &[("REDIS_TIMEOUT", "10")]);
    assert!(
        e.starts_with("REDIS_TIMEOUT=10: expected a duration"),
        "{e}"
    );
    let e = error(Entry::Tollgate, &[("CONFIG_TYPE", "file")]);
    assert_eq!(e, "CONFIG_TYPE=file: expected FILE or GRPC_XDS_SOTW");
    let e = error(Entry::Tollgate, &[("LOG_LEVEL", "verbose")]);
    assert!(
        e.starts_with("LOG_LEVEL=verbose: expected trace, debug"),
        "{e}"
    );
    let e = error(Entry::Reference, &[("REDIS_SOCKET_TYPE", "udp")]);
    assert_eq!(e, "REDIS_SOCKET_TYPE=udp: expected tcp or unix");
    let e = error(
        Entry::Tollgate,
        &[("USE_PROMETHEUS", "true"), ("PROMETHEUS_PATH", "/a{b}")],
    );
    assert!(
        e.starts_with("PROMETHEUS_PATH=/a{b}: expected a URL path"),
        "{e}"
    );
    let e = error(
        Entry::Tollgate,
        &[
            ("USE_PROMETHEUS", "true"),
            ("PORT", "9090"),
            ("PROMETHEUS_ADDR", ":9090"),
            ("PROMETHEUS_PATH", "/json"),
        ],
    );
    assert!(e.contains("would hide the admin endpoint"), "{e}");
    let e = error(Entry::Tollgate, &[("EXTRA_TAGS", "a:b,c")]);
    assert!(e.starts_with("EXTRA_TAGS=a:b,c: expected key:value"), "{e}");
    let e = error(
        Entry::Reference,
        &[("REDIS_TYPE", "sentinel"), ("REDIS_URL", "mymaster")],
    );
    assert!(
        e.starts_with("REDIS_URL=mymaster: a sentinel address"),
        "{e}"
    );
}

#[test]
fn secrets_never_appear_in_messages() {
    let e = error(
        Entry::Reference,
        &[("REDIS_URL", "redis://alice:hunter2@redis:6379,x:1")],
    );
    assert!(!e.contains("hunter2"), "{e}");
    let e = error(
        Entry::Reference,
        &[("REDIS_AUTH", "hunter2"), ("REDIS_POOL_SIZE", "-1")],
    );
    assert!(!e.contains("hunter2"), "{e}");
    let settings = resolve(
        Entry::Reference,
        &Flags::default(),
        &[("REDIS_AUTH", "hunter2")],
    )
    .unwrap();
    assert!(!format!("{settings:?}").contains("hunter2"));
}

#[test]
fn unsupported_settings_stop_or_warn_as_carrying_on_would_surprise_or_not() {
    let e = error(Entry::Tollgate, &[("BACKEND_TYPE", "memcache")]);
    assert!(
        e.starts_with("BACKEND_TYPE=memcache: tollgate has no memcached backend"),
        "{e}"
    );
    // Merged domains are supported now: the variable applies, and only a malformed value stops.
    let merged = resolve(
        Entry::Tollgate,
        &config_flag(),
        &[("MERGE_DOMAIN_CONFIG", "true")],
    )
    .unwrap();
    assert!(merged.load_options.merge_domains);
    let e = error(Entry::Tollgate, &[("MERGE_DOMAIN_CONFIG", "yes")]);
    assert!(e.starts_with("MERGE_DOMAIN_CONFIG=yes"), "{e}");
    let settings = resolve(
        Entry::Tollgate,
        &config_flag(),
        &[
            ("USE_STATSD", "true"),
            ("USE_DOG_STATSD", "true"),
            ("TRACING_ENABLED", "true"),
            ("DISABLE_STATS", "true"),
        ],
    )
    .unwrap();
    for var in ["USE_STATSD=true", "USE_DOG_STATSD=true"] {
        assert!(
            settings.notices.iter().any(|n| n.starts_with(var)),
            "{var}: {:?}",
            settings.notices
        );
    }
    // Both are honoured now, so neither is announced as ignored.
    for var in ["TRACING_ENABLED", "DISABLE_STATS"] {
        assert!(
            !settings.notices.iter().any(|n| n.starts_with(var)),
            "{var}: {:?}",
            settings.notices
        );
    }
    assert!(settings.tracing.enabled);
    assert!(settings.stats.per_limit_disabled);
    let defaults = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    assert!(!defaults.tracing.enabled);
    assert!(!defaults.stats.per_limit_disabled);
    assert_eq!(defaults.tracing.service_name, "RateLimit");
    assert_eq!(defaults.tracing.sampling_rate, 1.0);
}

#[test]
fn tls_needs_a_key_pair_and_takes_either_client_ca_name() {
    let e = error(Entry::Tollgate, &[("GRPC_SERVER_USE_TLS", "true")]);
    assert!(e.contains("GRPC_SERVER_TLS_CERT"), "{e}");
    let settings = resolve(
        Entry::Tollgate,
        &config_flag(),
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "c"),
            ("GRPC_SERVER_TLS_KEY", "k"),
            ("GRPC_CLIENT_TLS_CACERT", "ca"),
            ("GRPC_SERVER_TLS_CA_CERT", "other"),
            ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
        ],
    )
    .unwrap();
    let tls = settings.grpc.tls.unwrap();
    assert_eq!(tls.client_ca, Some(PathBuf::from("ca")));
    assert_eq!(tls.client_san.as_deref(), Some("envoy.example"));
}

#[test]
fn redis_tls_and_the_per_second_store() {
    let settings = resolve(
        Entry::Reference,
        &Flags::default(),
        &[
            ("REDIS_URL", "redis:6379"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CLIENT_CERT", "/redis-certs/tls.crt"),
            ("REDIS_TLS_CLIENT_KEY", "/redis-certs/tls.key"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_URL", "/run/ps.sock"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "unix"),
        ],
    )
    .unwrap();
    let Store::Redis(main) = &settings.backend.store else {
        panic!("redis");
    };
    let tls = main.tls.as_ref().expect("TLS to the main store");
    assert_eq!(
        tls.client_cert.as_deref(),
        Some(std::path::Path::new("/redis-certs/tls.crt"))
    );
    let per_second = settings.backend.per_second.expect("a per-second store");
    assert!(per_second.tls.is_none());
    assert_eq!(per_second.describe(), "unix:/run/ps.sock");
}

#[test]
fn go_numbers_and_durations() {
    assert_eq!(go_int("8080"), Some(8080));
    assert_eq!(go_int("0x1F"), Some(31));
    assert_eq!(go_int("0o17"), Some(15));
    assert_eq!(go_int("010"), Some(8));
    assert_eq!(go_int("0b101"), Some(5));
    assert_eq!(go_int("1_000"), Some(1000));
    assert_eq!(go_int("-3"), Some(-3));
    for bad in ["", " 8080", "08080", "abc", "1__0", "_1"] {
        assert_eq!(go_int(bad), None, "{bad:?}");
    }
    assert_eq!(go_duration("0"), Some(Duration::ZERO));
    assert_eq!(go_duration("10s"), Some(Duration::from_secs(10)));
    assert_eq!(go_duration("1h30m"), Some(Duration::from_secs(5400)));
    assert_eq!(go_duration("1.5h"), Some(Duration::from_secs(5400)));
    assert_eq!(go_duration("250ms"), Some(Duration::from_millis(250)));
    assert_eq!(go_duration("150us"), Some(Duration::from_micros(150)));
    assert_eq!(go_duration("-5s"), Some(Duration::ZERO));
    for bad in ["", "10", "1d", "s", "1.2.3s"] {
        assert_eq!(go_duration(bad), None, "{bad:?}");
    }
    assert_eq!(
        listen_addr(":19001"),
        Some("0.0.0.0:19001".parse().unwrap())
    );
    assert_eq!(
        listen_addr("[::1]:9090"),
        Some("[::1]:9090".parse().unwrap())
    );
    assert_eq!(listen_addr("9090"), None);
}

/// The reference's counting, quota mode, dynamic metadata and merged domains follow its
/// variables; `ratelimit` charges every hit unless told to stop, `tollgate serve` only admitted
/// ones, and a flag wins over both.
#[test]
fn the_references_behaviour_switches_apply() {
    let plain = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    assert_eq!(plain.limiter.counting, Counting::Admitted);
    assert!(!plain.limiter.quota_mode && !plain.limiter.response_dynamic_metadata);
    assert!(!plain.load_options.merge_domains);

    // `overLimit` in the metadata is tollgate's: on under `serve`, off under `ratelimit`,
    // unless asked for.
    assert!(plain.limiter.over_limit_metadata);
    let reference = resolve(Entry::Reference, &config_flag(), &[]).unwrap();
    assert_eq!(reference.limiter.counting, Counting::All);
    assert!(!reference.limiter.over_limit_metadata);
    let asked = Flags {
        over_limit_metadata: Some(true),
        ..config_flag()
    };
    let asked = resolve(Entry::Reference, &asked, &[]).unwrap();
    assert!(asked.limiter.over_limit_metadata);
    let stop = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true")];
    let stopped = resolve(Entry::Reference, &config_flag(), &stop).unwrap();
    assert_eq!(stopped.limiter.counting, Counting::Admitted);
    let charge = [("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false")];
    let charged = resolve(Entry::Tollgate, &config_flag(), &charge).unwrap();
    assert_eq!(charged.limiter.counting, Counting::All);
    let flagged = Flags {
        counting: Some(CountingArg::Admitted),
        quota_mode: Some(false),
        ..config_flag()
    };
    let vars = [
        ("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false"),
        ("QUOTA_MODE", "true"),
    ];
    let flags_win = resolve(Entry::Reference, &flagged, &vars).unwrap();
    assert_eq!(flags_win.limiter.counting, Counting::Admitted);
    assert!(!flags_win.limiter.quota_mode);

    let vars = [
        ("QUOTA_MODE", "true"),
        ("RESPONSE_DYNAMIC_METADATA", "1"),
        ("MERGE_DOMAIN_CONFIG", "t"),
    ];
    let all = resolve(Entry::Tollgate, &config_flag(), &vars).unwrap();
    assert!(all.limiter.quota_mode && all.limiter.response_dynamic_metadata);
    assert!(all.load_options.merge_domains);
    assert!(all.notices.is_empty(), "{:?}", all.notices);
    let e = error(Entry::Tollgate, &[("QUOTA_MODE", "sometimes")]);
    assert!(
        e.starts_with("QUOTA_MODE=sometimes: expected true or false"),
        "{e}"
    );
}

#[test]
fn the_local_cache_is_on_for_every_backend_unless_set() {
    use crate::backend::local_cache::DEFAULT_BYTES;
    let memory = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    assert_eq!(memory.behaviour.local_cache_size_in_bytes, None);
    assert_eq!(memory.behaviour.local_cache_bytes(), DEFAULT_BYTES);
    let redis = resolve(Entry::Reference, &Flags::default(), &[]).unwrap();
    assert!(matches!(
        redis.backend.store,
        crate::backend::Store::Redis(_)
    ));
    assert_eq!(redis.behaviour.local_cache_bytes(), DEFAULT_BYTES);
    // On by default it never skips a charge; set, it answers `counting: all` hits as the
    // reference's cache does.
    assert!(!redis.behaviour.local_cache_answers_counted());

    // The reference's variable, 0 included, and the flag over it.
    let set = |vars: &[(&str, &str)], flag: Option<usize>| {
        let flags = Flags {
            local_cache_bytes: flag,
            ..config_flag()
        };
        let settings = resolve(Entry::Tollgate, &flags, vars).unwrap();
        (
            settings.behaviour.local_cache_bytes(),
            settings.behaviour.local_cache_answers_counted(),
        )
    };
    assert_eq!(set(&[("LOCAL_CACHE_SIZE_IN_BYTES", "0")], None), (0, true));
    assert_eq!(
        set(&[("LOCAL_CACHE_SIZE_IN_BYTES", "65536")], None),
        (65_536, true)
    );
    assert_eq!(
        set(&[("LOCAL_CACHE_SIZE_IN_BYTES", "65536")], Some(1 << 20)),
        (1 << 20, true)
    );
    assert_eq!(set(&[], Some(0)), (0, true));
    let redis_on = resolve(
        Entry::Reference,
        &Flags::default(),
        &[("LOCAL_CACHE_SIZE_IN_BYTES", "1000000")],
    )
    .unwrap();
    assert_eq!(redis_on.behaviour.local_cache_bytes(), 1_000_000);
    assert!(
        error(Entry::Tollgate, &[("LOCAL_CACHE_SIZE_IN_BYTES", "-1")])
            .contains("LOCAL_CACHE_SIZE_IN_BYTES")
    );
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(parse_size("8MiB"), Ok(8 << 20));
}

#[test]
fn worker_threads_come_from_the_flag_then_tokio_then_go() {
    let threads = |flags: &Flags, vars: &[(&str, &str)]| {
        Some(
            resolve(Entry::Tollgate, flags, vars)
                .unwrap()
                .worker_threads,
        )
    };
    // Unset: one per CPU this process may use.
    let cpus = std::thread::available_parallelism().ok();
    assert_eq!(threads(&config_flag(), &[]), cpus);
    assert_eq!(
        threads(&config_flag(), &[("GOMAXPROCS", "3")]),
        NonZeroUsize::new(3)
    );
    assert_eq!(
        threads(
            &config_flag(),
            &[("GOMAXPROCS", "3"), ("TOKIO_WORKER_THREADS", "2")]
        ),
        NonZeroUsize::new(2)
    );
    let flags = Flags {
        worker_threads: NonZeroUsize::new(1),
        ..config_flag()
    };
    assert_eq!(
        threads(
            &flags,
            &[("GOMAXPROCS", "3"), ("TOKIO_WORKER_THREADS", "2")]
        ),
        NonZeroUsize::new(1)
    );
    assert_eq!(
        threads(&config_flag(), &[("TOKIO_WORKER_THREADS", "")]),
        cpus
    );
}

#[test]
fn a_bad_worker_count_is_named_where_go_would_have_ignored_it_a_notice() {
    // tokio itself panics on these; tollgate stops with the variable's name instead.
    for value in ["abc", "0", "-2", "1.5"] {
        let e = error(Entry::Tollgate, &[("TOKIO_WORKER_THREADS", value)]);
        assert_eq!(
            e,
            format!("TOKIO_WORKER_THREADS={value}: expected a whole number of 1 or more")
        );
    }
    // The reference's Go runtime starts with any GOMAXPROCS, so the swapped image does too.
    let settings = resolve(Entry::Reference, &Flags::default(), &[("GOMAXPROCS", "0")]).unwrap();
    assert_eq!(
        Some(settings.worker_threads),
        std::thread::available_parallelism().ok()
    );
    assert!(
        settings.notices.iter().any(|notice| notice
            == "GOMAXPROCS=0: expected a whole number of 1 or more; ignored, as Go ignores it"),
        "{:?}",
        settings.notices
    );
}

#[test]
fn rust_log_applies_unless_a_level_is_given_and_a_bad_one_is_a_notice() {
    let log = |vars: &[(&str, &str)]| resolve(Entry::Tollgate, &config_flag(), vars).unwrap();
    assert_eq!(log(&[]).log.directives(), "info");
    assert_eq!(log(&[("RUST_LOG", "")]).log.directives(), "info");
    let traced = log(&[("RUST_LOG", "tollgate=debug,h2=warn")]);
    assert_eq!(traced.log.directives(), "tollgate=debug,h2=warn");
    assert_eq!(
        log(&[("RUST_LOG", "tollgate=debug"), ("LOG_LEVEL", "warn")])
            .log
            .directives(),
        "warn"
    );
    let rejected = log(&[("RUST_LOG", "tollgate=loud")]);
    assert_eq!(rejected.log.directives(), "info");
    assert!(
        rejected
            .notices
            .iter()
            .any(|notice| notice.starts_with("RUST_LOG=tollgate=loud: ")
                && notice.ends_with("; logging at info instead")),
        "{:?}",
        rejected.notices
    );
}

#[test]
fn the_bounds_default_to_the_documented_values_and_take_their_flags() {
    let settings = resolve(Entry::Tollgate, &config_flag(), &[]).unwrap();
    let bounds = settings.bounds;
    assert_eq!(bounds.grpc_max_concurrent_streams, 1024);
    assert_eq!(bounds.grpc_body_timeout, Duration::from_secs(10));
    assert_eq!(bounds.grpc_unfinished_bytes_per_connection, 8 << 20);
    assert_eq!(bounds.grpc_unfinished_bytes, 64 << 20);
    assert_eq!(bounds.grpc_first_request_timeout, Duration::from_secs(30));
    assert_eq!(bounds.admin_header_read_timeout, Duration::from_secs(10));
    assert_eq!(bounds.admin_max_connections, 256);

    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        flags: Flags,
    }
    let parse = |args: &[&str]| <Serve as clap::Parser>::try_parse_from(args).map(|s| s.flags);
    let flags = parse(&[
        "serve",
        "--config",
        "examples/",
        "--grpc-max-concurrent-streams",
        "16",
        "--grpc-body-timeout",
        "2s",
        "--grpc-unfinished-bytes-per-connection",
        "1MiB",
        "--grpc-unfinished-bytes",
        "4MiB",
        "--grpc-first-request-timeout",
        "1s",
        "--admin-header-read-timeout",
        "500ms",
        "--admin-max-connections",
        "8",
    ])
    .unwrap();
    let bounds = resolve(Entry::Tollgate, &flags, &[]).unwrap().bounds;
    assert_eq!(
        bounds,
        crate::server::Bounds {
            grpc_max_concurrent_streams: 16,
            grpc_body_timeout: Duration::from_secs(2),
            grpc_unfinished_bytes_per_connection: 1 << 20,
            grpc_unfinished_bytes: 4 << 20,
            grpc_first_request_timeout: Duration::from_secs(1),
            admin_header_read_timeout: Duration::from_millis(500),
            admin_max_connections: 8,
        }
    );

    for (flag, value) in [
        ("--grpc-body-timeout", "0s"),
        ("--grpc-max-concurrent-streams", "0"),
        ("--admin-max-connections", "0"),
    ] {
        assert!(
            parse(&["serve", flag, value]).is_err(),
            "{flag} {value} is refused"
        );
    }
    let flags = Flags {
        grpc_unfinished_bytes: Some(0),
        ..config_flag()
    };
    let error = resolve(Entry::Tollgate, &flags, &[])
        .unwrap_err()
        .to_string();
    assert!(error.contains("--grpc-unfinished-bytes"), "{error}");
}
