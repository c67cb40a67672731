//! Policy files on disk: every file the reference accepts loads, every broken one fails with
//! `file:line:column: message`, and directories load as Kubernetes mounts them.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use tollgate::config::{Config, LoadOptions, MetaValue};
use tollgate::descriptor::{Entry, Unit};
use tollgate::window::{Algorithm, Counting};

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/config")
        .join(path)
}

fn load(path: &str) -> Config {
    let path = data(path);
    match Config::load(&path) {
        Ok(config) => config,
        Err(e) => panic!("{e}"),
    }
}

/// A request's entries and the full key of the limit they should resolve to.
type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

/// The full key of the limit `pairs` resolve to in `domain`.
fn full_key(config: &Config, domain: &str, pairs: &[(&str, &str)]) -> Option<String> {
    config
        .domain(domain)
        .unwrap_or_else(|| panic!("no domain {domain}"))
        .resolve(&entries(pairs))
        .map(|m| m.limits[0].full_key.clone())
}

/// A scratch directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "tollgate-config-{tag}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn every_valid_file_loads_without_warnings() {
    let mut files: Vec<PathBuf> = fs::read_dir(data("valid"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), 11);
    for file in &files {
        let config = Config::load(file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.len(), 1, "{}", file.display());
        assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    }
    let all = load("valid");
    assert_eq!(all.len(), files.len());
    let names: Vec<&str> = all.domains().iter().map(|d| d.name()).collect();
    assert_eq!(
        names,
        [
            "extended",
            "gateway",
            "meta",
            "placeholder",
            "shadow",
            "shared",
            "shop",
            "storage_qps",
            "suffixes",
            "wildcards",
            "yamlish"
        ]
    );
    assert!(all.domain("placeholder").unwrap().limits().is_empty());
    assert_eq!(all.limits().len(), all.table().lines().count());
}

#[test]
fn basic_file_matches_like_the_reference() {
    let config = load("valid/basic.yaml");
    let cases: &[Case] = &[
        (&[], None),
        (&[("tenant", "other")], None),
        (&[("tenant", "acme")], None),
        (&[("client", "mobile"), ("more", "x")], None),
        (&[("region", "eu"), ("zone", "eu-east")], None),
        (
            &[("tenant", "acme"), ("plan", "basic")],
            Some("shop.tenant_acme.plan"),
        ),
        (
            &[("tenant", "acme"), ("plan", "gold")],
            Some("shop.tenant_acme.plan_gold"),
        ),
        (&[("client", "web")], Some("shop.client")),
        (&[("client", "mobile")], Some("shop.client_mobile")),
        (&[("client", "monitoring")], None),
        (&[("session", "s1")], Some("shop.session")),
        (&[("order", "o1")], Some("shop.order")),
        (&[("region", "eu")], Some("shop.region_eu")),
        (
            &[("region", "eu"), ("zone", "eu-west")],
            Some("shop.region_eu.zone_eu-west"),
        ),
        (&[("internal", "x")], Some("shop.internal")),
        (&[("search", "q")], Some("shop.search")),
    ];
    for (request, expected) in cases {
        assert_eq!(
            full_key(&config, "shop", request).as_deref(),
            *expected,
            "{request:?}"
        );
    }
    let domain = config.domain("shop").unwrap();
    let order = &domain.resolve(&entries(&[("order", "o")])).unwrap().limits[0];
    assert_eq!(order.name.as_deref(), Some("orders_per_day"));
    assert_eq!((order.unit, order.requests_per_unit), (Some(Unit::Day), 2));
    let internal = &domain
        .resolve(&entries(&[("internal", "x")]))
        .unwrap()
        .limits[0];
    assert!(internal.unlimited);
    let search = &domain.resolve(&entries(&[("search", "q")])).unwrap().limits[0];
    assert!(search.detailed_metric);
    assert!(config.domain("unknown").is_none());
}

#[test]
fn wildcards_file_matches_like_the_reference() {
    let config = load("valid/wildcards.yaml");
    let cases: &[Case] = &[
        (&[("asset", "img1")], Some("wildcards.asset_img*")),
        (&[("asset", "img")], Some("wildcards.asset_img*")),
        (&[("asset", "logo")], Some("wildcards.asset_logo")),
        (&[("asset", "css")], None),
        (&[("fallback", "a")], Some("wildcards.fallback")),
        (&[("version", "v2beta")], Some("wildcards.version_v*beta")),
        (&[("version", "vbeta")], Some("wildcards.version_v*beta")),
        (&[("version", "v2alpha")], None),
        (&[("version", "xv2beta")], None),
        (&[("rpc", "svc1get2v2")], Some("wildcards.rpc_svc*get*v2")),
        (&[("rpc", "svcgetv2")], Some("wildcards.rpc_svc*get*v2")),
        (&[("rpc", "svc1v2")], None),
        (&[("rpc", "get1svc2v2")], None),
        (
            &[("app", "web"), ("asset", "css9")],
            Some("wildcards.app_web.asset_css*"),
        ),
        (&[("app", "web"), ("asset", "img1")], None),
    ];
    for (request, expected) in cases {
        assert_eq!(
            full_key(&config, "wildcards", request).as_deref(),
            *expected,
            "{request:?}"
        );
    }
    // Wildcards without share_threshold keep a counter per value.
    let domain = config.domain("wildcards").unwrap();
    let matched = domain.resolve(&entries(&[("asset", "img1")])).unwrap();
    assert!(matched.shared.is_empty());
}

#[test]
fn share_threshold_file_shares_by_pattern() {
    let config = load("valid/share_threshold.yaml");
    let domain = config.domain("shared").unwrap();
    let shared = |pairs: &[(&str, &str)]| {
        let matched = domain
            .resolve(&entries(pairs))
            .unwrap_or_else(|| panic!("no match for {pairs:?}"));
        let shared: Vec<(usize, String)> = matched
            .shared
            .iter()
            .map(|(i, p)| (*i, p.to_string()))
            .collect();
        (matched.limits[0].full_key.clone(), shared)
    };
    let s = |i: usize, p: &str| (i, p.to_string());
    for value in ["uploads/a", "uploads/b/c", "uploads/"] {
        assert_eq!(
            shared(&[("bucket", value)]),
            (
                "shared.bucket_uploads/*".to_string(),
                vec![s(0, "uploads/*")]
            )
        );
    }
    assert_eq!(
        shared(&[("project", "alpha"), ("bucket", "alpha/x")]),
        (
            "shared.project_alpha.bucket_alpha/*".to_string(),
            vec![s(1, "alpha/*")]
        )
    );
    assert_eq!(
        shared(&[("bucket", "top/x"), ("bucket", "inner/y")]).1,
        vec![s(0, "top/*"), s(1, "inner/*")]
    );
    assert_eq!(
        shared(&[("api", "v1/users"), ("verb", "GET")]).1,
        vec![s(0, "v1/*")]
    );
    assert_eq!(
        shared(&[("backend", "pool/a"), ("call", "get")]).1,
        vec![s(0, "pool/*")]
    );
    assert_eq!(
        shared(&[("dir", "docs/x"), ("doc", "page/1"), ("format", "pdf")]).1,
        vec![s(0, "docs/*")]
    );
    assert_eq!(
        shared(&[("report", "daily")]),
        ("shared.report_daily".to_string(), vec![])
    );
    assert_eq!(
        shared(&[("report", "dull")]),
        ("shared.report_d*".to_string(), vec![s(0, "d*")])
    );
    assert_eq!(
        shared(&[("route", "/v1/users/list")]).1,
        vec![s(0, "/v1*list")]
    );
    assert_eq!(shared(&[("method", "axbxc")]).1, vec![s(0, "a*b*c")]);
    assert!(domain.resolve(&entries(&[("route", "/v2/list")])).is_none());
}

#[test]
fn metadata_file_keeps_metadata() {
    let config = load("valid/metadata.yaml");
    let domain = config.domain("meta").unwrap();
    let matched = domain
        .resolve(&entries(&[("account", "premium"), ("call", "list")]))
        .unwrap();
    assert_eq!(
        matched.metadata,
        Some(&MetaValue::Map(vec![(
            "owner".to_string(),
            MetaValue::String("billing".to_string())
        )]))
    );
    let export = domain
        .resolve(&entries(&[("account", "premium"), ("call", "export")]))
        .unwrap();
    assert_eq!(export.metadata, None);
    let queue = domain.resolve(&entries(&[("queue", "q")])).unwrap();
    let string = |s: &str| MetaValue::String(s.to_string());
    assert_eq!(
        queue.metadata,
        Some(&MetaValue::Map(vec![(
            "queue_with_quota".to_string(),
            MetaValue::Map(vec![
                ("name".to_string(), string("jobs")),
                ("weight".to_string(), MetaValue::Number(2.0)),
                ("ratio".to_string(), MetaValue::Number(0.5)),
                ("enabled".to_string(), MetaValue::Bool(true)),
                (
                    "tags".to_string(),
                    MetaValue::List(vec![string("batch"), string("nightly")])
                ),
                ("nothing".to_string(), MetaValue::Null),
            ])
        )]))
    );
}

#[test]
fn shadow_mode_file_flags_limits() {
    let config = load("valid/shadow_mode.yaml");
    let domain = config.domain("shadow").unwrap();
    let shadow =
        |pairs: &[(&str, &str)]| domain.resolve(&entries(pairs)).unwrap().limits[0].shadow_mode;
    assert!(!shadow(&[("team", "infra"), ("job", "build")]));
    assert!(shadow(&[("team", "infra"), ("job", "backup")]));
    assert!(shadow(&[("probe", "http")]));
    assert!(!shadow(&[("probe", "synthetic")]));
}

#[test]
fn replaces_file_keeps_names_and_quota() {
    let config = load("valid/replaces.yaml");
    let domain = config.domain("gateway").unwrap();
    let limit = |pairs: &[(&str, &str)]| domain.resolve(&entries(pairs)).unwrap().limits[0].clone();
    assert_eq!(limit(&[("kind", "admin")]).replaces, ["per_owner", "trial"]);
    assert_eq!(
        limit(&[("caller", "c"), ("owner", "banned")]).requests_per_unit,
        0
    );
    assert_eq!(
        limit(&[("caller", "c"), ("owner", "someone")])
            .name
            .as_deref(),
        Some("per_owner")
    );
    assert!(limit(&[("caller", "c"), ("free", "x")]).unlimited);
    assert!(limit(&[("product", "p1")]).quota_mode);
    assert!(
        domain
            .resolve(&entries(&[("product", "p2")]))
            .unwrap()
            .metadata
            .is_some()
    );
}

#[test]
fn yaml_features_load_like_the_reference() {
    let config = load("valid/yaml_features.yaml");
    let domain = config.domain("yamlish").unwrap();
    let limit = |pairs: &[(&str, &str)]| {
        domain
            .resolve(&entries(pairs))
            .unwrap_or_else(|| panic!("no match for {pairs:?}"))
            .limits[0]
            .clone()
    };
    let base = limit(&[("base", "x")]);
    assert_eq!(
        (base.unit, base.requests_per_unit),
        (Some(Unit::Minute), 10)
    );
    assert_eq!(limit(&[("copy", "x")]).requests_per_unit, 10);
    let merged = limit(&[("merged", "x")]);
    assert_eq!(
        (merged.unit, merged.requests_per_unit),
        (Some(Unit::Minute), 11)
    );
    let flow = limit(&[("flow", "x")]);
    assert_eq!(
        (flow.unit, flow.requests_per_unit),
        (Some(Unit::Second), 16)
    );
    let status = limit(&[("status", "404")]);
    assert!(status.shadow_mode);
    assert_eq!(status.requests_per_unit, 1000);
    assert_eq!(limit(&[("flag", "true")]).unit, Some(Unit::Day));
    assert_eq!(
        limit(&[("empty_value", "any")]).full_key,
        "yamlish.empty_value"
    );
    assert_eq!(limit(&[("quoted", "it's")]).unit, Some(Unit::Month));
    assert_eq!(limit(&[("long", "folded text")]).unit, Some(Unit::Year));
    assert!(domain.resolve(&entries(&[("allow", "x")])).is_none());
}

#[test]
fn extensions_file_sets_windows_and_algorithms() {
    let config = load("valid/extensions.yaml");
    let domain = config.domain("extended").unwrap();
    let limit = |key: &str| domain.resolve(&[Entry::new(key, "v")]).unwrap().limits[0].clone();
    let login = limit("login");
    assert_eq!(login.algorithm, Algorithm::SlidingWindowLog);
    assert_eq!((login.unit, login.window_ms), (Some(Unit::Minute), 60_000));
    let export = limit("export");
    assert_eq!((export.unit, export.window_ms), (None, 90_000));
    assert_eq!(export.algorithm, Algorithm::SlidingWindowCounter);
    let report = limit("report");
    assert_eq!(
        (report.unit, report.window_ms),
        (Some(Unit::Hour), 3_600_000)
    );
    let global = limit("global");
    assert_eq!(global.shards, 16);
    assert_eq!(
        global.failure_mode,
        Some(tollgate::config::FailureMode::Deny)
    );
    let soft = limit("soft");
    assert_eq!((soft.unit, soft.window_ms), (None, 300_000));
    assert_eq!(
        soft.failure_mode,
        Some(tollgate::config::FailureMode::Allow)
    );
    assert_eq!(limit("login").shards, 1);
    assert_eq!(limit("login").failure_mode, None);
}

/// Every validation rule, with the exact message at the exact spot.
#[test]
fn invalid_files_fail_at_the_offending_node() {
    let cases = [
        (
            "bad_yaml.yaml",
            "4:12: invalid YAML: while scanning a quoted scalar, found unexpected end of stream",
        ),
        (
            "unknown_key.yaml",
            "4:5: unknown key `ratelimit` in a descriptor; did you mean `rate_limit`? (allowed: `key`, `value`, `rate_limit`, `rate_limits`, `descriptors`, `shadow_mode`, `quota_mode`, `detailed_metric`, `value_to_metric`, `share_threshold`, `metadata`)",
        ),
        (
            "unknown_key_in_rate_limit.yaml",
            "6:7: unknown key `requestsperunit` in `rate_limit`; did you mean `requests_per_unit`? (allowed: `unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`, `algorithm`, `window`, `shards`, `failure_mode`, `counting`, `lease`)",
        ),
        (
            "unknown_top_key.yaml",
            "2:1: unknown key `descriptor` at the top level of the file; did you mean `descriptors`? (allowed: `domain`, `descriptors`)",
        ),
        (
            "misplaced_key.yaml",
            "4:5: `unit` is not allowed in a descriptor; it belongs inside `rate_limit`",
        ),
        (
            "non_string_key.yaml",
            "1:1: key `0.25` is not a string; keys are names such as `domain`",
        ),
        (
            "non_map_list.yaml",
            "3:5: each item of `descriptors` must be a mapping such as `- key: user`, found the string `user`",
        ),
        (
            "descriptors_not_list.yaml",
            "3:3: `descriptors` must be a list of descriptors (`- key: ...`), found a mapping",
        ),
        (
            "root_not_map.yaml",
            "1:1: a policy file must be a mapping with `domain` and `descriptors`, found a list",
        ),
        (
            "empty_file.yaml",
            "1:1: the file is empty; a policy file needs `domain: <name>` and `descriptors:`",
        ),
        (
            "missing_domain.yaml",
            "1:1: missing `domain`; write `domain: <name>` at the top of the file",
        ),
        (
            "empty_domain.yaml",
            "1:9: `domain` is empty; write `domain: <name>` (the domain Envoy sends)",
        ),
        (
            "missing_key.yaml",
            "3:5: descriptor has no `key`; write e.g. `key: remote_address`",
        ),
        (
            "empty_key.yaml",
            "3:8: descriptor has an empty `key`; write e.g. `key: remote_address`",
        ),
        (
            "key_not_string.yaml",
            "3:10: `key` must be a string, found a list",
        ),
        (
            "duplicate_mapping_key.yaml",
            "7:7: duplicate key `unit` (first at line 5); keep only one",
        ),
        (
            "duplicate_descriptor.yaml",
            "6:5: duplicate descriptor `dups.user_alice` (first at line 3); merge the two",
        ),
        (
            "duplicate_nested_descriptor.yaml",
            "7:9: duplicate descriptor `dups.tenant.user` (first at line 5); merge the two",
        ),
        (
            "bad_unit.yaml",
            "5:13: unknown unit `fortnight`; write second, minute, hour, day, week, month or year (or `window: 90s` for other lengths)",
        ),
        (
            "missing_unit.yaml",
            "4:5: `rate_limit` needs a `unit` (second, minute, hour, day, week, month, year) or a `window` (e.g. `window: 90s`), or `unlimited: true`",
        ),
        (
            "unit_and_window.yaml",
            "6:7: give either `unit` or `window`, not both; remove one",
        ),
        (
            "unlimited_with_unit.yaml",
            "6:7: `unlimited: true` takes no `unit`; remove `unit` or `unlimited`",
        ),
        (
            "unlimited_with_window.yaml",
            "6:7: `unlimited: true` takes no `window`; remove `window` or `unlimited`",
        ),
        (
            "window_too_short.yaml",
            "5:15: `window` must be at least 1s, found `500ms`",
        ),
        (
            "window_fraction.yaml",
            "5:15: `window` must be a whole number of seconds (e.g. 2s, not 1500ms), found `1500ms`",
        ),
        (
            "window_not_duration.yaml",
            "5:15: `window` must be a duration such as 30s, 90s, 5m or 1h, found `90`",
        ),
        (
            "window_too_long.yaml",
            "5:15: `window` must be at most 365d (one year), found `400d`",
        ),
        (
            "requests_not_number.yaml",
            "6:26: `requests_per_unit` must be a whole number from 0 to 4294967295, found the string `10`",
        ),
        (
            "requests_negative.yaml",
            "6:26: `requests_per_unit` must be a whole number from 0 to 4294967295, found the number `-1`",
        ),
        (
            "requests_too_big.yaml",
            "6:26: `requests_per_unit` must be a whole number from 0 to 4294967295, found the number `4294967296`",
        ),
        (
            "bool_wrong_type.yaml",
            "4:18: `shadow_mode` must be true or false, found the string `sometimes`",
        ),
        (
            "shards_zero.yaml",
            "4:65: `shards` must be a whole number from 1 to 64, found the number `0`",
        ),
        (
            "shards_too_many.yaml",
            "4:65: `shards` must be a whole number from 1 to 64, found the number `65`",
        ),
        (
            "bad_algorithm.yaml",
            "5:18: unknown algorithm `token_bucket`; write sliding_window_counter (the default) or sliding_window_log",
        ),
        (
            "bad_failure_mode.yaml",
            "5:21: unknown failure_mode `open`; write allow or deny",
        ),
        (
            "replaces_self.yaml",
            "10:15: a limit cannot replace itself: `own` is this limit's own `name`; name another limit",
        ),
        (
            "replaces_empty.yaml",
            "10:15: empty `replaces` entry; write `- name: <name of the limit to replace>`",
        ),
        (
            "replaces_unknown.yaml",
            "11:11: `replaces` names `per_usr`, but no limit in domain `replacing` has `name: per_usr`; fix the name or add it to the limit to replace",
        ),
        (
            "replaces_not_list.yaml",
            "5:17: `replaces` must be a list such as `- name: other_limit`, found the string `per_user`",
        ),
        (
            "replaces_item_not_map.yaml",
            "6:11: each `replaces` entry must be a mapping such as `- name: other_limit`, found the string `per_user`",
        ),
        (
            "rate_limit_not_map.yaml",
            "4:17: `rate_limit` must be a mapping such as `{unit: minute, requests_per_unit: 10}`, found the string `5/minute`",
        ),
        (
            "share_threshold_without_wildcard.yaml",
            "5:5: share_threshold needs a wildcard `value` (containing `*`, e.g. `files/*`), but `bucket_uploads` has none; remove share_threshold",
        ),
        (
            "metadata_not_map.yaml",
            "4:15: `metadata` must be a mapping such as `{team: payments}`, found a list",
        ),
        (
            "two_documents.yaml",
            "3:1: a second YAML document (after `---`); a policy file holds one document: put each domain in its own file",
        ),
        (
            "unsupported_tag.yaml",
            "3:10: unsupported tag `!secret`; remove it",
        ),
        (
            "too_deep.yaml",
            "66:129: descriptors nest deeper than 32 levels; a request descriptor carries at most 32 entries, so this could never match",
        ),
        ("not_utf8.yaml", "1:12: the file is not UTF-8 text"),
    ];
    let mut files: Vec<String> = fs::read_dir(data("invalid"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    files.sort();
    let mut covered: Vec<String> = cases.iter().map(|(f, _)| f.to_string()).collect();
    covered.sort();
    assert_eq!(files, covered, "every invalid file has an expected message");

    for (file, expected) in cases {
        let path = data("invalid").join(file);
        let error = match Config::load(&path) {
            Ok(_) => panic!("{file} loaded"),
            Err(e) => e,
        };
        assert_eq!(error.file, path);
        assert_eq!(
            error.to_string(),
            format!("{}:{expected}", path.display()),
            "{file}"
        );
    }
}

#[test]
fn a_domain_declared_twice_points_at_both() {
    let dir = data("invalid/duplicate_domain");
    let error = Config::load(&dir).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:2:9: domain `twice` is already declared in {}:1:9; keep each domain in one file (or merge the files' domains with --merge-domains)",
            dir.join("b.yaml").display(),
            dir.join("a.yaml").display()
        )
    );
}

#[test]
fn from_yaml_names_the_file_in_errors() {
    let error = Config::from_yaml("inline.yaml", "domain: x\ndescriptors: 5\n").unwrap_err();
    assert_eq!(
        error.to_string(),
        "inline.yaml:2:14: `descriptors` must be a list of descriptors (`- key: ...`), found the number `5`"
    );
    assert_eq!((error.line, error.column), (2, 14));
}

#[test]
fn warnings_point_at_the_node() {
    let dir = TempDir::new("warnings");
    let file = dir.write(
        "w.yaml",
        "domain: w\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 100\n      shards: 16\n  - key: b\n    rate_limit:\n      unit: second\n",
    );
    let config = Config::load(&file).unwrap();
    let shown = file.display();
    assert_eq!(
        config.warnings(),
        [
            format!(
                "{shown}:7:15: warning: `w.a` splits 100 hits over 16 shards, 6 per shard; with \
                 fewer than 10 per shard the limit gets uneven: lower `shards`"
            ),
            format!(
                "{shown}:9:5: warning: `w.b` has no requests_per_unit, so it admits nothing; \
                 write `requests_per_unit: 0` if that is meant"
            ),
        ]
    );
}

#[test]
fn a_missing_path_is_an_error() {
    let path = data("does-not-exist.yaml");
    let error = Config::load(&path).unwrap_err();
    assert_eq!(error.file, path);
    assert_eq!((error.line, error.column), (1, 1));
    assert!(
        error.message.starts_with("cannot read the config: "),
        "{}",
        error.message
    );
}

#[test]
fn a_directory_loads_its_yaml_files_in_name_order() {
    let dir = TempDir::new("order");
    dir.write("b.yml", "domain: bravo\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 2}\n");
    dir.write("a.yaml", "domain: alpha\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n");
    // Ignored: not YAML by name, hidden, or a directory.
    dir.write("notes.txt", "not: [valid");
    dir.write("c.yaml.bak", "not: [valid");
    dir.write(".hidden.yaml", "not: [valid");
    dir.write("nested.yaml/inner.yaml", "domain: nested\ndescriptors:\n");
    dir.write("sub/d.yaml", "domain: sub\ndescriptors:\n");
    let config = Config::load(&dir.0).unwrap();
    let names: Vec<&str> = config.domains().iter().map(|d| d.name()).collect();
    assert_eq!(names, ["alpha", "bravo"]);
    assert_eq!(
        config.domain("bravo").unwrap().file(),
        dir.0.join("b.yml").as_path()
    );

    // The first broken file in name order is the one reported.
    dir.write("z.yaml", "domain: z\nbogus: 1\n");
    dir.write("m.yaml", "domain: m\ndescriptors: 1\n");
    let error = Config::load(&dir.0).unwrap_err();
    assert_eq!(error.file, dir.0.join("m.yaml"));
}

#[test]
fn an_empty_directory_is_an_empty_config_with_a_warning() {
    let dir = TempDir::new("empty");
    let config = Config::load(&dir.0).unwrap();
    assert!(config.is_empty());
    assert_eq!(config.warnings().len(), 1);
    assert!(config.warnings()[0].contains("warning: no policy files"));
}

/// The layout of a Kubernetes ConfigMap volume: `name.yaml -> ..data/name.yaml`,
/// `..data -> ..2024_01_01_00_00_00.000000000`, the real files in that dot directory.
#[cfg(unix)]
#[test]
fn a_configmap_mount_follows_symlinks_and_skips_dot_entries() {
    use std::os::unix::fs::symlink;

    let dir = TempDir::new("configmap");
    let stamp = "..2024_01_01_00_00_00.000000000";
    dir.write(
        &format!("{stamp}/edge.yaml"),
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    dir.write(
        &format!("{stamp}/internal.yml"),
        "domain: internal\ndescriptors:\n",
    );
    symlink(stamp, dir.0.join("..data")).unwrap();
    symlink("..data/edge.yaml", dir.0.join("edge.yaml")).unwrap();
    symlink("..data/internal.yml", dir.0.join("internal.yml")).unwrap();
    // A link left dangling by an update in progress is not a policy file.
    symlink("..data/removed.yaml", dir.0.join("removed.yaml")).unwrap();

    let config = Config::load(&dir.0).unwrap();
    let names: Vec<&str> = config.domains().iter().map(|d| d.name()).collect();
    assert_eq!(names, ["edge", "internal"]);
    assert_eq!(
        full_key(&config, "edge", &[("user", "alice")]).as_deref(),
        Some("edge.user")
    );

    // The mount directory itself and single files may be symlinks too.
    let outside = TempDir::new("configmap-link");
    symlink(&dir.0, outside.0.join("policies")).unwrap();
    assert_eq!(Config::load(&outside.0.join("policies")).unwrap().len(), 2);
    assert_eq!(Config::load(&dir.0.join("edge.yaml")).unwrap().len(), 1);
}

#[test]
fn the_examples_load_and_demo_as_documented() {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let config = Config::load(&examples).unwrap_or_else(|e| panic!("{e}"));
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
    let edge = config.domain("edge").unwrap();
    let limit = |pairs: &[(&str, &str)]| edge.resolve(&entries(pairs)).map(|m| m.limits[0].clone());

    // The README's grpcurl demo: alice is limited to 5 per minute.
    let alice = limit(&[("user", "alice")]).unwrap();
    assert_eq!(
        (alice.full_key.as_str(), alice.requests_per_unit, alice.unit),
        ("edge.user", 5, Some(Unit::Minute))
    );
    assert!(!alice.shadow_mode);
    assert!(limit(&[("user", "healthcheck")]).is_none());
    assert_eq!(
        limit(&[("remote_address", "203.0.113.7")])
            .unwrap()
            .full_key,
        "edge.remote_address"
    );
    let login = limit(&[("path", "/login")]).unwrap();
    assert_eq!(login.algorithm, Algorithm::SlidingWindowLog);
    let login_ip = limit(&[("path", "/login"), ("remote_address", "203.0.113.7")]).unwrap();
    assert_eq!(login_ip.algorithm, Algorithm::SlidingWindowLog);
    assert_eq!(login_ip.requests_per_unit, 5);
    assert!(limit(&[("path", "/search")]).unwrap().shadow_mode);
    let export = limit(&[("api_key", "k1")]).unwrap();
    assert_eq!((export.unit, export.window_ms), (None, 90_000));
    let global = limit(&[("generic_key", "global")]).unwrap();
    assert_eq!(global.shards, 8);
    assert!(limit(&[("path", "/other")]).is_none());

    let internal = config.domain("internal").unwrap();
    let batch = internal
        .resolve(&entries(&[("client", "batch-nightly")]))
        .unwrap();
    assert_eq!(batch.shared.as_slice(), [(0, "batch-*")]);
    let tenant = internal.resolve(&entries(&[("tenant", "acme")])).unwrap();
    assert!(tenant.limits[0].quota_mode);
    assert!(tenant.metadata.is_some());
}

/// With merged domains (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG), several files add their
/// top-level descriptors to one domain: `replaces` may name a limit of another file, and the
/// limits do not depend on the order the files are read in.
#[test]
fn merged_domains_span_files() {
    let options = LoadOptions {
        merge_domains: true,
    };
    let dir = TempDir::new("merge");
    dir.write(
        "a.yaml",
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}\n  - key: path\n    value: /a*\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    dir.write(
        "b.yaml",
        "domain: shop\ndescriptors:\n  - key: vip\n    rate_limit: {unit: minute, requests_per_unit: 50, replaces: [{name: per_user}]}\n  - key: path\n    value: /ab*\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: user\n    value: alice\n    rate_limit: {unit: minute, requests_per_unit: 7}\n",
    );
    let config = Config::load_with(&dir.0, options).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.len(), 1);
    let key = |pairs: &[(&str, &str)]| full_key(&config, "shop", pairs);
    assert_eq!(key(&[("user", "bob")]).as_deref(), Some("shop.user"));
    assert_eq!(
        key(&[("user", "alice")]).as_deref(),
        Some("shop.user_alice")
    );
    assert_eq!(key(&[("vip", "x")]).as_deref(), Some("shop.vip"));
    // Wildcards are tried in the order the files were read: a.yaml's first.
    assert_eq!(key(&[("path", "/abc")]).as_deref(), Some("shop.path_/a*"));
    assert_eq!(config.limits().len(), 5);
    assert_eq!(
        config.domain("shop").unwrap().file(),
        dir.0.join("a.yaml"),
        "the first file names the domain"
    );

    // Without merging, the second file is an error.
    let error = Config::load(&dir.0).unwrap_err();
    assert!(error.message.contains("already declared"), "{error}");
}

#[test]
fn merged_domains_refuse_a_top_level_descriptor_declared_twice() {
    let options = LoadOptions {
        merge_domains: true,
    };
    let dir = TempDir::new("merge-dup");
    dir.write(
        "a.yaml",
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    );
    dir.write(
        "b.yaml",
        "domain: shop\ndescriptors:\n  - key: other\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 9}\n",
    );
    let error = Config::load_with(&dir.0, options).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}:4:5: duplicate descriptor `shop.user` (first in {}:3:5); merged domains may \
             declare each top-level descriptor once",
            dir.0.join("b.yaml").display(),
            dir.0.join("a.yaml").display()
        )
    );
}

#[test]
fn merged_domains_check_replaces_against_the_whole_domain() {
    let options = LoadOptions {
        merge_domains: true,
    };
    let dir = TempDir::new("merge-replaces");
    dir.write(
        "a.yaml",
        "domain: shop\ndescriptors:\n  - key: vip\n    rate_limit: {unit: minute, requests_per_unit: 50, replaces: [{name: per_usr}]}\n",
    );
    dir.write(
        "b.yaml",
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5, name: per_user}\n",
    );
    let error = Config::load_with(&dir.0, options).unwrap_err();
    assert_eq!(error.file, dir.0.join("a.yaml"));
    assert!(
        error.message.contains("`replaces` names `per_usr`"),
        "{error}"
    );
}

#[test]
fn counting_is_read_per_limit() {
    let config = Config::from_yaml(
        "counting.yaml",
        "domain: d\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: hour, requests_per_unit: 1000, counting: all}\n  - key: calls\n    rate_limit: {unit: hour, requests_per_unit: 10, counting: admitted}\n  - key: other\n    rate_limit: {unit: hour, requests_per_unit: 10}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let counting = |key: &str| {
        config
            .domain("d")
            .unwrap()
            .resolve(&[Entry::new(key, "x")])
            .unwrap()
            .limits[0]
            .counting
    };
    assert_eq!(counting("tokens"), Some(Counting::All));
    assert_eq!(counting("calls"), Some(Counting::Admitted));
    assert_eq!(counting("other"), None);
    assert!(
        config.table().contains("counting=all"),
        "{}",
        config.table()
    );

    let error = Config::from_yaml(
        "bad.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1, counting: every}\n",
    )
    .unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("bad.yaml:4:62: unknown counting `every`; write admitted"),
        "{error}"
    );
}

/// The `rate_limits` example docs/configuration.md shows loads, with a limit per entry.
#[test]
fn the_documented_rate_limits_example_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let doc = fs::read_to_string(&path).expect("read docs/configuration.md");
    let section = doc
        .split("### Several limits on one descriptor")
        .nth(1)
        .expect("the section");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the example");
    let config = Config::from_yaml("docs.yaml", yaml).expect("the example loads");
    let keys: Vec<&str> = config
        .limits()
        .iter()
        .map(|limit| limit.series_key.as_str())
        .collect();
    assert_eq!(keys, ["edge.user.burst", "edge.user.sustained"]);
}
