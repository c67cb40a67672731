//! envoyproxy/ratelimit's config fixtures (`test/config/*.yaml`) and what its
//! `test/config/config_test.go` expects of them: which load, which fail (and on what), and which
//! limit each request resolves to. The fixtures are restated in `fixtures/config/` from the facts
//! those tests check. The reference's error texts are Go's; tollgate's say the same thing in its
//! own words with `file:line:column`, so each failure is matched on the file it names and the
//! problem its message states.
//!
//! Stats keys (`detailed_metric`, `value_to_metric`) are the metrics' concern and are not checked
//! here; the limits, names, flags and shared counters are.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tollgate::backend::{MemoryBackend, Sharded};
use tollgate::config::{Config, ConfigError, LoadOptions, MetaValue};
use tollgate::descriptor::{Descriptor, Entry, LimitOverride, Request, Unit};
use tollgate::limiter::Limiter;

use super::support::{fixtures, reference_defaults};

/// What config_test.go expects of a set of files.
#[derive(Debug)]
enum Expect {
    /// They load.
    Loads,
    /// Loading fails on the file ending with `file`; the reference's message, and a text of
    /// tollgate's message saying the same.
    Fails {
        file: &'static str,
        reference: &'static str,
        ours: &'static str,
    },
}

/// One test of config_test.go loading fixtures.
#[derive(Debug)]
pub struct FixtureCase {
    test: &'static str,
    files: &'static [&'static str],
    merge_domains: bool,
    expect: Expect,
}

/// Every config_test.go test that loads fixture files, in its order.
pub const CASES: &[FixtureCase] = &[
    FixtureCase {
        test: "TestBasicConfig (:30)",
        files: &["basic_config.yaml"],
        merge_domains: false,
        expect: Expect::Loads,
    },
    FixtureCase {
        test: "TestDomainMerge (:227)",
        files: &["merge_domain_key1.yaml", "merge_domain_key2.yaml"],
        merge_domains: true,
        expect: Expect::Loads,
    },
    FixtureCase {
        test: "TestEmptyDomain (:347)",
        files: &["empty_domain.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "empty_domain.yaml",
            reference: "config file cannot have empty domain",
            ours: "missing `domain`",
        },
    },
    FixtureCase {
        test: "TestDuplicateDomain (:357)",
        files: &["basic_config.yaml", "duplicate_domain.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "duplicate_domain.yaml",
            reference: "duplicate domain 'test-domain' in config file",
            ours: "domain `test-domain` is already declared",
        },
    },
    FixtureCase {
        test: "TestEmptyKey (:368)",
        files: &["empty_key.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "empty_key.yaml",
            reference: "descriptor has empty key",
            ours: "descriptor has no `key`",
        },
    },
    FixtureCase {
        test: "TestDuplicateKey (:379)",
        files: &["duplicate_key.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "duplicate_key.yaml",
            reference: "duplicate descriptor composite key 'test-domain.key1_value1'",
            ours: "duplicate descriptor `test-domain.key1_value1`",
        },
    },
    FixtureCase {
        test: "TestDuplicateKeyDomainMerge (:390)",
        files: &["merge_domain_key1.yaml", "merge_domain_key1.yaml"],
        merge_domains: true,
        expect: Expect::Fails {
            file: "merge_domain_key1.yaml",
            reference: "duplicate descriptor composite key 'test-domain.key1_value1'",
            ours: "duplicate descriptor `test-domain.key1_value1`",
        },
    },
    FixtureCase {
        test: "TestBadLimitUnit (:403)",
        files: &["bad_limit_unit.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "bad_limit_unit.yaml",
            reference: "invalid rate limit unit 'foo'",
            ours: "unknown unit `foo`",
        },
    },
    FixtureCase {
        test: "TestReplacesSelf (:414)",
        files: &["replaces_self.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "replaces_self.yaml",
            reference: "replaces should not contain name of same descriptor",
            ours: "a limit cannot replace itself",
        },
    },
    FixtureCase {
        test: "TestReplacesEmpty (:425)",
        files: &["replaces_empty.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "replaces_empty.yaml",
            reference: "should not have an empty replaces entry",
            ours: "empty `replaces` entry",
        },
    },
    FixtureCase {
        test: "TestBadYaml (:436)",
        files: &["bad_yaml.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "bad_yaml.yaml",
            reference: "error loading config file: yaml: line 2: found unexpected end of stream",
            ours: "invalid YAML",
        },
    },
    FixtureCase {
        test: "TestMisspelledKey (:447)",
        files: &["misspelled_key.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "misspelled_key.yaml",
            reference: "config error, unknown key 'ratelimit'",
            ours: "unknown key `ratelimit`",
        },
    },
    FixtureCase {
        test: "TestMisspelledKey (:457)",
        files: &["misspelled_key2.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "misspelled_key2.yaml",
            reference: "config error, unknown key 'requestsperunit'",
            ours: "unknown key `requestsperunit`",
        },
    },
    FixtureCase {
        test: "TestNonStringKey (:467)",
        files: &["non_string_key.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "non_string_key.yaml",
            reference: "config error, key is not of type string: 0.25",
            ours: "key `0.25` is not a string",
        },
    },
    FixtureCase {
        test: "TestNonMapList (:478)",
        files: &["non_map_list.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "non_map_list.yaml",
            reference: "config error, yaml file contains list of type other than map: a",
            ours: "each item of `descriptors` must be a mapping such as `- key: user`, found the \
                   string `a`",
        },
    },
    FixtureCase {
        test: "TestUnlimitedWithRateLimitUnit (:489)",
        files: &["unlimited_with_unit.yaml"],
        merge_domains: false,
        expect: Expect::Fails {
            file: "unlimited_with_unit.yaml",
            reference: "should not specify rate limit unit when unlimited",
            ours: "`unlimited: true` takes no `unit`",
        },
    },
    FixtureCase {
        test: "TestShadowModeConfig (:500)",
        files: &["shadowmode_config.yaml"],
        merge_domains: false,
        expect: Expect::Loads,
    },
    FixtureCase {
        test: "TestWildcardConfig (:576)",
        files: &["wildcard.yaml"],
        merge_domains: false,
        expect: Expect::Loads,
    },
    FixtureCase {
        test: "TestShareThreshold (:1667)",
        files: &["share_threshold.yaml"],
        merge_domains: false,
        expect: Expect::Loads,
    },
    FixtureCase {
        test: "TestMetadata (:2209)",
        files: &["metadata.yaml"],
        merge_domains: false,
        expect: Expect::Loads,
    },
];

/// The fixture files the cases use.
pub fn fixture_files() -> BTreeSet<&'static str> {
    CASES.iter().flat_map(|c| c.files.iter().copied()).collect()
}

/// Loads `files` of `fixtures/config/` as one config directory, in the given order (each copied
/// under a name that sorts in that order and ends with its own name).
fn load(files: &[&str], merge_domains: bool) -> (tempfile::TempDir, Result<Config, ConfigError>) {
    let dir = tempfile::tempdir().expect("a scratch directory");
    for (index, file) in files.iter().enumerate() {
        std::fs::copy(
            fixtures("config").join(file),
            dir.path().join(format!("{index}-{file}")),
        )
        .unwrap_or_else(|err| panic!("copy {file}: {err}"));
    }
    let loaded = Config::load_with(dir.path(), LoadOptions { merge_domains });
    (dir, loaded)
}

/// A fixture directory's files, by name.
fn listed(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("the fixture directory")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

#[test]
fn every_fixture_of_config_test_is_restated_and_used() {
    let used: BTreeSet<String> = fixture_files().into_iter().map(String::from).collect();
    assert_eq!(listed(&fixtures("config")), used);
    assert_eq!(
        used.len(),
        20,
        "the reference's test/config holds 20 fixtures"
    );
}

#[test]
fn fixtures_load_or_fail_as_config_test_expects() {
    for case in CASES {
        let (_dir, loaded) = load(case.files, case.merge_domains);
        match (&case.expect, loaded) {
            (Expect::Loads, Ok(config)) => {
                assert!(!config.is_empty(), "{}", case.test);
            }
            (
                Expect::Fails {
                    file,
                    reference,
                    ours,
                },
                Err(error),
            ) => {
                let named = error
                    .file
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned());
                assert!(
                    named.as_deref().is_some_and(|n| n.ends_with(file)),
                    "{}: the error names {:?}, the reference {file}: {error}",
                    case.test,
                    error.file
                );
                assert!(
                    error.message.contains(ours),
                    "{}: `{error}` does not say what the reference's `{reference}` says",
                    case.test
                );
                assert!(error.line >= 1 && error.column >= 1, "{error}");
            }
            (expect, loaded) => panic!("{}: expected {expect:?}, got {loaded:?}", case.test),
        }
    }
}

#[test]
fn the_integration_and_example_policies_load() {
    for dir in ["integration", "integration-reload", "examples", "service"] {
        let config = Config::load(&fixtures(dir)).unwrap_or_else(|err| panic!("{dir}: {err}"));
        assert!(
            config.warnings().is_empty(),
            "{dir}: {:?}",
            config.warnings()
        );
    }
}

/// What a request's entries resolve to in a domain: requests per unit, unit, full key, name,
/// shadow mode and the shared levels; `None` for no limit.
type Resolved = (
    u32,
    Option<Unit>,
    String,
    Option<String>,
    bool,
    Vec<(usize, String)>,
);

/// A request's `(key, value)` entries.
type Pairs<'a> = &'a [(&'a str, &'a str)];

/// Shared levels as written in a table: `(entry index, pattern)`.
type Levels<'a> = &'a [(usize, &'a str)];

fn resolve(config: &Config, domain: &str, pairs: &[(&str, &str)]) -> Option<Resolved> {
    let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
    let matched = config.domain(domain)?.resolve(&entries)?;
    let limit = &matched.limits[0];
    Some((
        limit.requests_per_unit,
        limit.unit,
        limit.full_key.clone(),
        limit.name.clone(),
        limit.shadow_mode,
        matched
            .shared
            .iter()
            .map(|(level, pattern)| (*level, pattern.to_string()))
            .collect(),
    ))
}

fn one(file: &str) -> Config {
    let path: PathBuf = fixtures("config").join(file);
    Config::load(&path).unwrap_or_else(|err| panic!("{err}"))
}

fn limit(rpu: u32, unit: Unit, key: &str) -> Option<Resolved> {
    Some((rpu, Some(unit), key.to_owned(), None, false, Vec::new()))
}

/// `TestBasicConfig` (config_test.go:30-225).
#[test]
fn basic_config_resolves_as_the_reference() {
    let config = one("basic_config.yaml");
    assert!(config.domain("foo_domain").is_none(), "an unknown domain");
    let d = "test-domain";
    for pairs in [
        &[][..],
        &[("key1", "something")],
        &[("key1", "value1")],
        &[("key2", "value2"), ("subkey", "subvalue")],
        &[("key5", "value5"), ("subkey5", "subvalue")],
        &[("key2", "value3")],
    ] {
        assert_eq!(resolve(&config, d, pairs), None, "{pairs:?}");
    }
    let cases: &[(Pairs, Option<Resolved>)] = &[
        (
            &[("key1", "value1"), ("subkey1", "something")],
            limit(5, Unit::Second, "test-domain.key1_value1.subkey1"),
        ),
        (
            &[("key1", "value1"), ("subkey1", "subvalue1")],
            limit(
                10,
                Unit::Second,
                "test-domain.key1_value1.subkey1_subvalue1",
            ),
        ),
        (
            &[("key2", "something")],
            limit(20, Unit::Minute, "test-domain.key2"),
        ),
        (
            &[("key2", "value2")],
            limit(30, Unit::Minute, "test-domain.key2_value2"),
        ),
        (&[("key3", "foo")], limit(1, Unit::Hour, "test-domain.key3")),
        (
            &[("key4", "foo")],
            Some((
                1,
                Some(Unit::Day),
                "test-domain.key4".into(),
                Some("key4_rate_limit".into()),
                false,
                Vec::new(),
            )),
        ),
        (
            &[("key7", "unspecified_value")],
            limit(70, Unit::Minute, "test-domain.key7"),
        ),
    ];
    for (pairs, expected) in cases {
        assert_eq!(&resolve(&config, d, pairs), expected, "{pairs:?}");
    }
    let domain = config.domain(d).expect("test-domain");
    let key6 = domain.resolve(&[Entry::new("key6", "foo")]).expect("key6");
    assert!(key6.limits[0].unlimited);
    assert_eq!(key6.limits[0].full_key, "test-domain.key6");
    let key7 = domain.resolve(&[Entry::new("key7", "x")]).expect("key7");
    assert!(key7.limits[0].detailed_metric);
}

/// `TestConfigLimitOverride` (config_test.go:256-334): a request's own limit replaces the
/// configured one in a known domain, keyed by the request's entries; an unknown domain ignores it.
#[tokio::test]
async fn a_request_limit_overrides_as_the_reference() {
    let limiter = Limiter::new(
        Arc::new(one("basic_config.yaml")),
        Sharded::new(MemoryBackend::new()),
        reference_defaults(),
    );
    let request = |domain: &str, value: &str, rpu, unit| Request {
        domain: domain.into(),
        descriptors: vec![Descriptor {
            entries: vec![Entry::new("key1", "value1"), Entry::new("subkey1", value)],
            limit: Some(LimitOverride {
                requests_per_unit: rpu,
                unit: Some(unit),
            }),
            hits_addend: None,
        }],
        hits_addend: 0,
    };
    let limit_of = |decision: tollgate::limiter::Decision| {
        decision.statuses[0].limit.as_ref().map(|l| {
            (
                l.requests_per_unit,
                l.unit,
                l.full_key.clone(),
                l.name.clone(),
            )
        })
    };
    let unknown = limiter
        .should_rate_limit(&request("foo_domain", "something", 10, Unit::Day))
        .await
        .expect("decided");
    assert_eq!(limit_of(unknown), None);
    for (value, rpu, unit) in [
        ("something", 10, Unit::Day),
        ("something", 42, Unit::Hour),
        ("something_else", 42, Unit::Hour),
    ] {
        let decision = limiter
            .should_rate_limit(&request("test-domain", value, rpu, unit))
            .await
            .expect("decided");
        assert_eq!(
            limit_of(decision),
            Some((
                rpu,
                Some(unit),
                format!("test-domain.key1_value1.subkey1_{value}"),
                None
            ))
        );
    }
}

/// `TestDomainMerge` (config_test.go:227-254).
#[test]
fn merged_domains_resolve_as_the_reference() {
    let (_dir, loaded) = load(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], true);
    let config = loaded.unwrap_or_else(|err| panic!("{err}"));
    assert!(config.domain("foo_domain").is_none());
    assert_eq!(resolve(&config, "test-domain", &[]), None);
    assert_eq!(
        resolve(&config, "test-domain", &[("key1", "value1")]),
        limit(10, Unit::Minute, "test-domain.key1_value1")
    );
    assert_eq!(
        resolve(&config, "test-domain", &[("key2", "value2")]),
        limit(20, Unit::Minute, "test-domain.key2_value2")
    );
    // Without merging, the second file is a duplicate domain.
    let (_dir, loaded) = load(&["merge_domain_key1.yaml", "merge_domain_key2.yaml"], false);
    let error = loaded.expect_err("a domain declared twice");
    assert!(error.message.contains("already declared"), "{error}");
}

/// `TestShadowModeConfig` (config_test.go:500-574): shadow mode is the node's own, not its
/// siblings'.
#[test]
fn shadow_mode_resolves_as_the_reference() {
    let config = one("shadowmode_config.yaml");
    let shadow = |pairs: &[(&str, &str)]| {
        resolve(&config, "test-domain", pairs)
            .map(|(rpu, unit, _, _, shadow, _)| (rpu, unit, shadow))
    };
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "something")]),
        Some((5, Some(Unit::Second), false))
    );
    assert_eq!(
        shadow(&[("key1", "value1"), ("subkey1", "subvalue1")]),
        Some((10, Some(Unit::Second), true))
    );
    assert_eq!(
        shadow(&[("key2", "something")]),
        Some((20, Some(Unit::Minute), true))
    );
    assert_eq!(
        shadow(&[("key2", "value2")]),
        Some((30, Some(Unit::Minute), false))
    );
}

/// `TestWildcardConfig` (config_test.go:576-710).
#[test]
fn wildcards_resolve_as_the_reference() {
    let config = one("wildcard.yaml");
    let key = |pairs: &[(&str, &str)]| resolve(&config, "test-domain", pairs).map(|r| r.2);
    for (pairs, expected) in [
        (&[("noVal", "foo1")][..], Some("test-domain.noVal")),
        (&[("noVal", "foo2")], Some("test-domain.noVal")),
        (&[("wild", "foo1")], Some("test-domain.wild_foo*")),
        (&[("wild", "foo2")], Some("test-domain.wild_foo*")),
        (
            &[("nestedWild", "val1"), ("wild", "goo2")],
            Some("test-domain.nestedWild_val1.wild_goo*"),
        ),
        (&[("wild", "bar")], None),
        (&[("noWild", "foo1")], None),
        (&[("midWild", "barab")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "bar123b")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "barb")], Some("test-domain.midWild_bar*b")),
        (&[("midWild", "bara")], None),
        (&[("midWild", "xbarb")], None),
        (
            &[("multiWild", "foo123bar456baz")],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (
            &[("multiWild", "foobarbaz")],
            Some("test-domain.multiWild_foo*bar*baz"),
        ),
        (&[("multiWild", "foo123baz")], None),
        (&[("multiWild", "bar456baz")], None),
    ] {
        assert_eq!(key(pairs).as_deref(), expected, "{pairs:?}");
    }
    // The units were written in capitals: read case-insensitively.
    assert_eq!(
        resolve(&config, "test-domain", &[("wild", "foo1")]).map(|r| r.1),
        Some(Some(Unit::Minute))
    );
}

/// `TestShareThreshold` (config_test.go:1667-1981): which levels share one counter, by pattern.
#[test]
fn share_threshold_resolves_as_the_reference() {
    let config = one("share_threshold.yaml");
    let shared = |pairs: &[(&str, &str)]| {
        resolve(&config, "test-domain", pairs).map(|(rpu, _, _, _, _, shared)| (rpu, shared))
    };
    let levels = |list: &[(usize, &str)]| -> Vec<(usize, String)> {
        list.iter().map(|(l, p)| (*l, p.to_string())).collect()
    };
    let cases: &[(Pairs, Option<(u32, Levels)>)] = &[
        (&[("files", "files/a.pdf")], Some((100, &[(0, "files/*")]))),
        (&[("files", "files/b.csv")], Some((100, &[(0, "files/*")]))),
        (&[("files", "files/c.txt")], Some((100, &[(0, "files/*")]))),
        (
            &[("route", "api/v1"), ("method", "GET")],
            Some((60, &[(0, "api/*")])),
        ),
        (
            &[("service", "svc/user"), ("endpoint", "get")],
            Some((80, &[(0, "svc/*")])),
        ),
        (
            &[("nested", "parent"), ("files", "nested/file1.txt")],
            Some((200, &[(1, "nested/*")])),
        ),
        (
            &[("files", "top/file1.txt"), ("files", "nested/file1.txt")],
            Some((300, &[(0, "top/*"), (1, "nested/*")])),
        ),
        (
            &[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")],
            Some((120, &[(0, "path/*")])),
        ),
        (
            &[
                ("user", "user/alice"),
                ("resource", "res/file1"),
                ("action", "read"),
            ],
            Some((150, &[(0, "user/*"), (1, "res/*")])),
        ),
        (&[("file", "test1")], Some((50, &[]))),
        (&[("file", "test2")], Some((100, &[(0, "test*")]))),
        (&[("file", "test23")], Some((100, &[(0, "test*")]))),
        (&[("file", "test123")], Some((100, &[(0, "test*")]))),
        (&[("midpath", "/api/v1")], Some((100, &[(0, "/api*v1")]))),
        (
            &[("midpath", "/api-beta-v1")],
            Some((100, &[(0, "/api*v1")])),
        ),
        (&[("midpath", "/apiXYZv1")], Some((100, &[(0, "/api*v1")]))),
        (&[("midpath", "/api/v2")], None),
        (
            &[("multiroute", "svcAepBrpc")],
            Some((50, &[(0, "svc*ep*rpc")])),
        ),
        (
            &[("multiroute", "svcXXXepYYYrpc")],
            Some((50, &[(0, "svc*ep*rpc")])),
        ),
        (
            &[("multiroute", "svceprpc")],
            Some((50, &[(0, "svc*ep*rpc")])),
        ),
        (&[("multiroute", "svcABCrpc")], None),
        (&[("midroute", "/api/v2")], Some((80, &[(0, "/api*v2")]))),
        (
            &[("midroute", "/api-beta-v2")],
            Some((80, &[(0, "/api*v2")])),
        ),
        (
            &[("tenant", "t1prod"), ("resource", "resAv2")],
            Some((60, &[(0, "t*prod"), (1, "res*v2")])),
        ),
        (
            &[("tenant", "t99prod"), ("resource", "resBBBv2")],
            Some((60, &[(0, "t*prod"), (1, "res*v2")])),
        ),
    ];
    for (pairs, expected) in cases {
        let expected = expected.map(|(rpu, list)| (rpu, levels(list)));
        assert_eq!(shared(pairs), expected, "{pairs:?}");
    }
}

/// `TestMetadata` (config_test.go:2209-2260): metadata comes from the node that has the limit.
#[test]
fn metadata_resolves_as_the_reference() {
    let config = one("metadata.yaml");
    let domain = config.domain("test-domain").expect("test-domain");
    assert!(domain.resolve(&[]).is_none());
    let text = |s: &str| MetaValue::String(s.into());
    let first = domain
        .resolve(&[
            Entry::new("key1", "value1"),
            Entry::new("subkey1", "something"),
        ])
        .expect("a limit");
    assert_eq!(
        (first.limits[0].requests_per_unit, first.limits[0].unit),
        (5, Some(Unit::Second))
    );
    assert_eq!(
        first.metadata,
        Some(&MetaValue::Map(vec![("name".into(), text("service_1"))]))
    );
    let second = domain
        .resolve(&[Entry::new("key2", "something")])
        .expect("a limit");
    assert_eq!(
        (second.limits[0].requests_per_unit, second.limits[0].unit),
        (20, Some(Unit::Minute))
    );
    assert_eq!(
        second.metadata,
        Some(&MetaValue::Map(vec![(
            "service_with_quota".into(),
            MetaValue::Map(vec![("name".into(), text("service_2"))])
        )]))
    );
}
