//! Matching and loading rules, checked on in-memory configs.

use super::*;
use crate::counter_key::limiter_key;
use crate::descriptor::Entry;

const MATCHING: &str = r#"
domain: test
descriptors:
  # Key-only default under an exact parent, with an exact override.
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}

  # Exact beats wildcard beats key-only; value3 is allow-listed.
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: val*
    rate_limit: {unit: minute, requests_per_unit: 25}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3

  # A limit at both levels.
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}

  # Wildcards: first match in config order wins; `*` at the end, start, middle, several.
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: wild
    value: f*
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: mid
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: multi
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: nested
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 6}

  # A key-only parent without a limit of its own.
  - key: parent
    descriptors:
      - key: child
        rate_limit: {unit: hour, requests_per_unit: 7}

  # No backtracking: an exact leaf hides the key-only node's children.
  - key: nb
    descriptors:
      - key: sub
        rate_limit: {unit: hour, requests_per_unit: 8}
  - key: nb
    value: x
    rate_limit: {unit: hour, requests_per_unit: 9}

  # No backtracking through a wildcard either.
  - key: wb
    descriptors:
      - key: sub
        rate_limit: {unit: hour, requests_per_unit: 8}
  - key: wb
    value: a*
    rate_limit: {unit: hour, requests_per_unit: 9}

  # share_threshold: matching values share one counter, keyed by the pattern.
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: files
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}

  - key: free
    rate_limit:
      unlimited: true
  - key: tagged
    metadata:
      team: payments
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// A request's entries and the full key of the limit they should resolve to.
type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a str>);

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

#[test]
fn resolve_follows_the_reference() {
    let config = Config::from_yaml("matching.yaml", MATCHING).unwrap();
    let domain = config.domain("test").unwrap();
    let cases: &[Case] = &[
        // Nothing, unknown keys, partial matches.
        (&[], None),
        (&[("unknown", "x")], None),
        (&[("key1", "something")], None),
        // A node with children but no limit: the request is shallower than the config.
        (&[("key1", "value1")], None),
        (&[("parent", "p")], None),
        (
            &[("parent", "p"), ("child", "c")],
            Some("test.parent.child"),
        ),
        // Key-only default and its exact override at the second level.
        (
            &[("key1", "value1"), ("subkey1", "x")],
            Some("test.key1_value1.subkey1"),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            Some("test.key1_value1.subkey1_subvalue1"),
        ),
        // Exact beats wildcard beats key-only, allow-list is None.
        (&[("key2", "value2")], Some("test.key2_value2")),
        (&[("key2", "valx")], Some("test.key2_val*")),
        (&[("key2", "val")], Some("test.key2_val*")),
        (&[("key2", "other")], Some("test.key2")),
        (&[("key2", "")], Some("test.key2")),
        (&[("key2", "value3")], None),
        // The request is deeper than the config.
        (&[("key2", "value2"), ("more", "x")], None),
        (&[("key5", "value5"), ("subkey5", "subvalue")], None),
        (&[("key5", "value5")], Some("test.key5_value5")),
        (
            &[("key5", "value5"), ("subkey5", "subvalue5")],
            Some("test.key5_value5.subkey5_subvalue5"),
        ),
        // Wildcards.
        (&[("wild", "foo1")], Some("test.wild_foo*")),
        (&[("wild", "foo")], Some("test.wild_foo*")),
        (&[("wild", "fab")], Some("test.wild_f*")),
        (&[("wild", "bar")], None),
        (
            &[("host", "api.example.com")],
            Some("test.host_*.example.com"),
        ),
        (&[("host", "example.com")], None),
        (&[("mid", "barb")], Some("test.mid_bar*b")),
        (&[("mid", "bar123b")], Some("test.mid_bar*b")),
        (&[("mid", "bara")], None),
        (&[("mid", "xbarb")], None),
        (&[("multi", "foo1bar2baz")], Some("test.multi_foo*bar*baz")),
        (&[("multi", "foo123baz")], None),
        (
            &[("nested", "val1"), ("wild", "goo2")],
            Some("test.nested_val1.wild_goo*"),
        ),
        (&[("nested", "val1"), ("wild", "foo2")], None),
        // A request value equal to the pattern text matches it exactly.
        (&[("wild", "foo*")], Some("test.wild_foo*")),
        // No backtracking.
        (&[("nb", "x"), ("sub", "s")], None),
        (&[("nb", "y"), ("sub", "s")], Some("test.nb.sub")),
        (&[("nb", "x")], Some("test.nb_x")),
        (&[("wb", "abc"), ("sub", "s")], None),
        (&[("wb", "zzz"), ("sub", "s")], Some("test.wb.sub")),
        // share_threshold and exact precedence over it.
        (&[("files", "files/a")], Some("test.files_files/*")),
        (&[("files", "test1")], Some("test.files_test1")),
        (&[("free", "x")], Some("test.free")),
    ];
    for (request, expected) in cases {
        let matched = domain.resolve(&entries(request));
        let got = matched.as_ref().map(|m| m.limits[0].full_key.as_str());
        assert_eq!(got, *expected, "request {request:?}");
    }
}

/// Asserts that every match of `requests` in `domain` charges the counter [`limiter_key`] names
/// for it, and returns how many matched.
fn assert_counter_keys(domain: &Domain, requests: &[&[(&str, &str)]]) -> usize {
    let mut matched_any = 0;
    for request in requests {
        let entries = entries(request);
        let Some(matched) = domain.resolve(&entries) else {
            continue;
        };
        matched_any += 1;
        let limit = &matched.limits[0];
        let expected = if limit.unlimited {
            String::new()
        } else {
            limiter_key(
                domain.name(),
                &entries,
                &matched.shared,
                limit.algorithm,
                limit.window_ms,
            )
        };
        assert_eq!(matched.counter_keys[0], expected, "request {request:?}");
    }
    matched_any
}

#[test]
fn counter_keys_from_the_config_pieces_are_the_limiter_keys() {
    let config = Config::from_yaml("matching.yaml", MATCHING).unwrap();
    let domain = config.domain("test").unwrap();
    let requests: &[&[(&str, &str)]] = &[
        &[("parent", "p"), ("child", "c")],
        &[("key1", "value1"), ("subkey1", "x")],
        &[("key1", "value1"), ("subkey1", "subvalue1")],
        &[("key2", "value2")],
        &[("key2", "valx")],
        &[("key2", "val*")],
        &[("key2", "")],
        &[("files", "files/a")],
        &[("files", "files/*")],
        &[("files", "test1")],
        &[("tenant", "t1prod"), ("resource", "res9v2")],
        &[("free", "x")],
        &[("key2", "a|b=c%d{e}\n")],
    ];
    assert!(assert_counter_keys(domain, requests) >= 10);

    // Every piece the config writes needs escaping here, in both algorithms and odd windows.
    let escaped = r#"
domain: "e|d{o}=m"
descriptors:
  - key: "k=1|"
    value: "a%|*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: sliding_window_log}
    descriptors:
      - key: "@n~"
        rate_limit: {window: 90s, requests_per_unit: 5}
  - key: "k=1|"
    value: "b*"
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: "k=1|"
    rate_limit: {unlimited: true}
"#;
    let config = Config::from_yaml("escaped.yaml", escaped).unwrap();
    let domain = config.domain("e|d{o}=m").unwrap();
    let requests: &[&[(&str, &str)]] = &[
        &[("k=1|", "a%|x}")],
        &[("k=1|", "a%|*")],
        &[("k=1|", "a%|y"), ("@n~", "v=\u{85}|")],
        &[("k=1|", "b{}")],
        &[("k=1|", "zzz")],
    ];
    assert_eq!(assert_counter_keys(domain, requests), 5);
    let shared = domain.resolve(&entries(&[("k=1|", "a%|x}")])).unwrap();
    assert_eq!(
        shared.counter_keys[0],
        "e%7Cd%7Bo%7D%3Dm|k%3D1%7C~a%25%7C*@l1000"
    );
}

#[test]
fn shared_levels_name_the_pattern() {
    let config = Config::from_yaml("matching.yaml", MATCHING).unwrap();
    let domain = config.domain("test").unwrap();
    let shared = |request: &[(&str, &str)]| {
        domain.resolve(&entries(request)).map(|m| {
            m.shared
                .iter()
                .map(|(i, p)| (*i, p.to_string()))
                .collect::<Vec<_>>()
        })
    };
    assert_eq!(
        shared(&[("files", "files/a")]),
        Some(vec![(0, "files/*".to_string())])
    );
    // Two values of one pattern give the same shared key.
    assert_eq!(
        shared(&[("files", "files/a")]),
        shared(&[("files", "files/b")])
    );
    // An exact match is never shared, nor is a wildcard without share_threshold.
    assert_eq!(shared(&[("files", "test1")]), Some(vec![]));
    assert_eq!(shared(&[("wild", "foo1")]), Some(vec![]));
    // Both nested levels share.
    assert_eq!(
        shared(&[("tenant", "t1prod"), ("resource", "res9v2")]),
        Some(vec![(0, "t*prod".to_string()), (1, "res*v2".to_string())])
    );
    // Only the parent shares; the child wildcard keeps per-value counters.
    assert_eq!(
        shared(&[("path", "path/x"), ("file", "file/y"), ("type", "pdf")]),
        Some(vec![(0, "path/*".to_string())])
    );
    // A key-only match gives each value its own counter: nothing shared.
    assert_eq!(shared(&[("key2", "other")]), Some(vec![]));
}

#[test]
fn matched_limits_carry_their_settings() {
    let config = Config::from_yaml("matching.yaml", MATCHING).unwrap();
    let domain = config.domain("test").unwrap();

    let matched = domain.resolve(&entries(&[("key2", "value2")])).unwrap();
    assert_eq!(matched.limits[0].requests_per_unit, 30);
    assert_eq!(matched.limits[0].unit, Some(Unit::Minute));
    assert_eq!(matched.limits[0].window_ms, 60_000);
    assert_eq!(matched.metadata, None);

    let free = domain.resolve(&entries(&[("free", "x")])).unwrap();
    assert!(free.limits[0].unlimited);
    assert_eq!(
        (
            free.limits[0].requests_per_unit,
            free.limits[0].unit,
            free.limits[0].window_ms
        ),
        (0, None, 0)
    );

    let tagged = domain.resolve(&entries(&[("tagged", "x")])).unwrap();
    assert_eq!(
        tagged.metadata,
        Some(&MetaValue::Map(vec![(
            "team".to_string(),
            MetaValue::String("payments".to_string())
        )]))
    );
    assert!(config.domain("other").is_none());
}

#[test]
fn windows_and_units() {
    let config = Config::from_yaml(
        "w.yaml",
        r#"
domain: w
descriptors:
  - key: a
    rate_limit: {window: 90s, requests_per_unit: 10}
  - key: b
    rate_limit: {window: 1h, requests_per_unit: 10, algorithm: sliding_window_log}
  - key: c
    rate_limit: {unit: HOUR, requests_per_unit: 10, shards: 4, failure_mode: deny}
  - key: d
    rate_limit: {unit: Second, requests_per_unit: 10, lease: true}
"#,
    )
    .unwrap();
    let limit = |key: &str| {
        config
            .domain("w")
            .unwrap()
            .resolve(&[Entry::new(key, "v")])
            .unwrap()
            .limits[0]
            .clone()
    };
    let a = limit("a");
    assert_eq!((a.unit, a.window_ms), (None, 90_000));
    let b = limit("b");
    assert_eq!((b.unit, b.window_ms), (Some(Unit::Hour), 3_600_000));
    assert_eq!(b.algorithm, Algorithm::SlidingWindowLog);
    let c = limit("c");
    assert_eq!(
        (c.unit, c.window_ms, c.shards),
        (Some(Unit::Hour), 3_600_000, 4)
    );
    assert_eq!(c.failure_mode, Some(FailureMode::Deny));
    assert_eq!(c.algorithm, Algorithm::SlidingWindowCounter);
    assert_eq!(limit("d").unit, Some(Unit::Second));
    assert!(limit("d").lease);
    assert!(!limit("c").lease, "not leased unless asked");
    // 10 hits over 4 shards is fewer than 10 per shard.
    assert_eq!(config.warnings().len(), 1);
    assert!(
        config.warnings()[0].starts_with("w.yaml:9:61: warning: `w.c` splits 10 hits over 4"),
        "{:?}",
        config.warnings()
    );
}

#[test]
fn table_lists_every_limit() {
    let config = Config::from_yaml(
        "t.yaml",
        r#"
domain: t
descriptors:
  - key: a
    shadow_mode: true
    rate_limit: {window: 90s, requests_per_unit: 100, shards: 2, failure_mode: deny, name: a, lease: true}
  - key: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5, replaces: [{name: a}]}
  - key: c
    rate_limit: {unlimited: true}
"#,
    )
    .unwrap();
    let table = config.table();
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        vec![
            vec![
                "t.a",
                "sliding_window_counter",
                "100",
                "1m30s",
                "shadow",
                "shards=2",
                "lease",
                "failure_mode=deny",
                "name=a"
            ],
            vec![
                "t.b",
                "sliding_window_counter",
                "5",
                "minute",
                "quota",
                "replaces=a"
            ],
            vec!["t.c", "-", "-", "-", "unlimited"],
        ]
    );
    let keys: Vec<&str> = config
        .limits()
        .iter()
        .map(|l| l.full_key.as_str())
        .collect();
    assert_eq!(keys, ["t.a", "t.b", "t.c"]);
    assert_eq!(compact_duration(86_400 + 61), "1d1m1s");
}

#[test]
fn empty_config_matches_nothing() {
    let config = Config::empty();
    assert!(config.is_empty());
    assert_eq!(config.len(), 0);
    assert!(config.domain("edge").is_none());
    assert_eq!(config.table(), "");
    assert!(config.limits().is_empty());
}

#[test]
fn config_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Config>();
    assert_send_sync::<Arc<Config>>();
}

/// The policies of envoyproxy/ratelimit's own tests of its statistics keys.
const METRIC_KEYS: &str = r#"
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: detailed_route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            detailed_metric: true
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: "read*"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: files
    value: "files/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: api
    value: "api/*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: "svc/*"
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: wild
    value: "foo*"
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: plain_wild
    value: "foo*"
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 60}
"#;

#[test]
fn metric_keys_follow_the_references_rules() {
    let config = Config::from_yaml("d.yaml", METRIC_KEYS).unwrap();
    let domain = config.domain("d").unwrap();
    let key = |entries: &[(&str, &str)]| {
        let entries: Vec<Entry> = entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect();
        let matched = domain.resolve(&entries).expect("a limit");
        matched
            .metric_key
            .unwrap_or_else(|| matched.limits[0].full_key.clone())
    };
    let cases: &[(&[(&str, &str)], &str)] = &[
        (
            &[
                ("route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
            "d.route_draw.http_method_GET.subject_id",
        ),
        (&[("k1", "X"), ("k2", "Y"), ("k3", "Z")], "d.k1.k2_Y.k3"),
        (
            &[
                ("detailed_route", "draw"),
                ("http_method", "GET"),
                ("subject_id", "123"),
            ],
            "d.detailed_route_draw.http_method_GET.subject_id_123",
        ),
        (
            &[("route", ""), ("http_method", "GET"), ("subject_id", "1")],
            "d.route.http_method_GET.subject_id",
        ),
        (
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents"),
            ],
            "d.user_alice.action_readfile.resource",
        ),
        (&[("files", "files/a.pdf")], "d.files_files/*"),
        (
            &[("api", "api/v1"), ("method", "GET")],
            "d.api_api/*.method",
        ),
        (
            &[("service", "svc/user"), ("endpoint", "get")],
            "d.service_svc/*.endpoint_get",
        ),
        (&[("wild", "foo1")], "d.wild_foo1"),
        (&[("plain_wild", "foo1")], "d.plain_wild_foo*"),
        (&[("key7", "unspecified_value")], "d.key7_unspecified_value"),
        (&[("key7", "")], "d.key7_"),
    ];
    for (entries, expected) in cases {
        assert_eq!(key(entries), *expected, "{entries:?}");
    }
}

/// A descriptor with several limits, and a limit elsewhere that replaces one of them by name.
const SEVERAL: &str = r#"
domain: edge
descriptors:
  - key: user
    detailed_metric: true
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: burst}
      - {unit: hour, requests_per_unit: 1000, name: sustained, algorithm: sliding_window_log}
      - {window: 90s, requests_per_unit: 50, replaces: [{name: other}]}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 5, name: other, replaces: [{name: burst}]}
"#;

#[test]
fn rate_limits_declare_several_limits_of_one_descriptor() {
    let config = Config::from_yaml("several.yaml", SEVERAL).unwrap();
    let domain = config.domain("edge").unwrap();
    let request = entries(&[("user", "alice")]);
    let matched = domain.resolve(&request).unwrap();
    let summary: Vec<_> = matched
        .limits
        .iter()
        .map(|l| {
            (
                l.series_key.as_str(),
                l.name.as_deref(),
                l.requests_per_unit,
                l.window_ms,
                l.algorithm,
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (
                "edge.user.burst",
                Some("burst"),
                10,
                1000,
                Algorithm::SlidingWindowCounter
            ),
            (
                "edge.user.sustained",
                Some("sustained"),
                1000,
                3_600_000,
                Algorithm::SlidingWindowLog
            ),
            (
                "edge.user.3",
                None,
                50,
                90_000,
                Algorithm::SlidingWindowCounter
            ),
        ]
    );
    for limit in matched.limits {
        assert_eq!(limit.full_key, "edge.user");
        assert!(limit.joint && limit.detailed_metric, "{limit:?}");
    }
    assert_eq!(matched.limits[2].replaces, ["other"]);

    // One counter per limit, each the one `limiter_key` names, all after one descriptor part.
    assert_eq!(matched.counter_keys.len(), 3);
    for (limit, key) in matched.limits.iter().zip(&matched.counter_keys) {
        let expected = limiter_key("edge", &request, &[], limit.algorithm, limit.window_ms);
        assert_eq!(*key, expected);
        assert!(key.starts_with("edge|user=alice@"), "{key}");
    }
    assert_eq!(
        matched.counter_keys.as_slice(),
        [
            "edge|user=alice@c1000",
            "edge|user=alice@l3600000",
            "edge|user=alice@c90000"
        ]
    );
    assert_eq!(matched.metric_key.as_deref(), Some("edge.user_alice"));

    let other = domain.resolve(&entries(&[("other", "x")])).unwrap();
    assert_eq!(other.limits.len(), 1);
    assert!(!other.limits[0].joint);
    assert_eq!(other.limits[0].series_key, "edge.other");
    assert_eq!(other.counter_keys.as_slice(), ["edge|other=x@c60000"]);

    let listed: Vec<&str> = config
        .limits()
        .iter()
        .map(|l| l.series_key.as_str())
        .collect();
    assert_eq!(
        listed,
        [
            "edge.other",
            "edge.user.3",
            "edge.user.burst",
            "edge.user.sustained"
        ]
    );
    let table = config.table();
    let table: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        table,
        [
            vec![
                "edge.other",
                "sliding_window_counter",
                "5",
                "minute",
                "name=other",
                "replaces=burst"
            ],
            vec![
                "edge.user.3",
                "sliding_window_counter",
                "50",
                "1m30s",
                "replaces=other",
                "detailed_metric"
            ],
            vec![
                "edge.user.burst",
                "sliding_window_counter",
                "10",
                "second",
                "name=burst",
                "detailed_metric"
            ],
            vec![
                "edge.user.sustained",
                "sliding_window_log",
                "1000",
                "hour",
                "name=sustained",
                "detailed_metric"
            ],
        ]
    );
}

/// The error loading a file `e.yaml` of domain `edge` whose descriptors are `descriptors`.
fn several_error(descriptors: &str) -> String {
    let text = format!("domain: edge\ndescriptors:\n{descriptors}");
    Config::from_yaml("e.yaml", &text).unwrap_err().to_string()
}

#[test]
fn rate_limits_errors_say_where_and_what_to_write() {
    let cases: &[(&str, &str)] = &[
        (
            "  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1}\n    \
             rate_limits:\n      - {unit: hour, requests_per_unit: 10}\n",
            "e.yaml:5:5: `edge.user` has both `rate_limit` and `rate_limits`; give one: move the \
             `rate_limit` into the `rate_limits` list",
        ),
        (
            "  - key: user\n    rate_limits: []\n",
            "e.yaml:4:18: `rate_limits` of `edge.user` is empty; list at least one limit such as \
             `- {unit: second, requests_per_unit: 10}`, or remove `rate_limits` to allow every \
             request",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: hour, requests_per_unit: 10}\n      \
             - {unlimited: true}\n",
            "e.yaml:6:9: a `rate_limits` entry cannot be `unlimited: true`: the other limits of \
             `edge.user` would still limit it; to never limit the descriptor, write \
             `rate_limit: {unlimited: true}` instead of `rate_limits`",
        ),
        (
            "  - key: user\n    rate_limits:\n      - 5\n",
            "e.yaml:5:9: each item of `rate_limits` must be a mapping such as `- {unit: second, \
             requests_per_unit: 10}`, found the number `5`",
        ),
        (
            "  - key: user\n    rate_limits: {unit: hour}\n",
            "e.yaml:4:18: `rate_limits` must be a list of limits such as `- {unit: second, \
             requests_per_unit: 10}`, found a mapping",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10}\n      \
             - {window: 60s, requests_per_unit: 20, name: wide}\n",
            "e.yaml:6:9: this limit of `edge.user` has the same algorithm (sliding_window_counter) \
             and window (minute) as the one at line 5, so the two would share one counter; give \
             them different windows (or algorithms), or keep only the lower limit",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10, \
             name: a}\n      - {unit: hour, requests_per_unit: 20, name: a}\n",
            "e.yaml:6:9: two limits of `edge.user` are named `a` (the first at line 5); give each \
             limit of `rate_limits` its own name",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10, \
             nmae: a}\n",
            "e.yaml:5:47: unknown key `nmae` in a `rate_limits` entry; did you mean `name`? \
             (allowed: `unit`, `requests_per_unit`, `unlimited`, `name`, `replaces`, \
             `algorithm`, `window`, `shards`, `failure_mode`, `counting`, `lease`)",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10}\n      \
             - {unit: hour, window: 2h, requests_per_unit: 20}\n",
            "e.yaml:6:22: give either `unit` or `window`, not both; remove one",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {requests_per_unit: 10}\n",
            "e.yaml:5:9: a `rate_limits` entry needs a `unit` (second, minute, hour, day, week, \
             month, year) or a `window` (e.g. `window: 90s`)",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10, \
             replaces: [{name: nobody}]}\n",
            "e.yaml:5:58: `replaces` names `nobody`, but no limit in domain `edge` has `name: \
             nobody`; fix the name or add it to the limit to replace",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: minute, requests_per_unit: 10, \
             name: me, replaces: [{name: me}]}\n",
            "e.yaml:5:68: a limit cannot replace itself: `me` is this limit's own `name`; name \
             another limit",
        ),
        (
            "  - key: user\n    rate_limits:\n      - {unit: fortnight, requests_per_unit: 10}\n",
            "e.yaml:5:16: unknown unit `fortnight`; write second, minute, hour, day, week, month \
             or year (or `window: 90s` for other lengths)",
        ),
    ];
    for (descriptors, expected) in cases {
        assert_eq!(several_error(descriptors), *expected, "{descriptors}");
    }
}

#[test]
fn a_reload_names_the_limits_it_drops_and_not_the_ones_it_changes() {
    let old = Config::from_yaml(
        "old.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n  - key: path\n    rate_limit: {unit: second, requests_per_unit: 9}\n",
    )
    .unwrap();
    let new = Config::from_yaml(
        "new.yaml",
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 50}\n",
    )
    .unwrap();
    assert_eq!(old.dropped_limits(&new), ["edge.path"]);
    assert!(new.dropped_limits(&old).is_empty());
    assert_eq!(old.dropped_limits(&Config::empty()).len(), 2);
}
