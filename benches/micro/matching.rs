//! Descriptor matching over a large generated config: how long `Domain::resolve` takes to find
//! the limit for one request descriptor, and what building the limiter's key adds.
//!
//! `cargo bench --bench micro -- matching`

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group};
use tollgate::config::Config;
use tollgate::descriptor::Entry;
use tollgate::limiter::limiter_key;

/// Tenants in the generated config when benchmarking; a tenth of that when `cargo test` runs the
/// benchmarks once as a smoke test, where the unoptimized config load would dominate.
const TENANTS: usize = 2_000;
const HOST_WILDCARDS: usize = 500;
const PATH_WILDCARDS: usize = 8;

fn tenants() -> usize {
    // `cargo bench` passes `--bench`; `cargo test` does not.
    if std::env::args().any(|arg| arg == "--bench") {
        TENANTS
    } else {
        TENANTS / 10
    }
}

/// A domain with `tenants` exact tenants, each with wildcard paths and a key-only method below
/// them (three levels), a key-only tenant fallback, and `HOST_WILDCARDS` host wildcards that are
/// tried in config order.
fn generated_yaml(tenants: usize) -> String {
    let mut yaml = String::from("domain: bench\ndescriptors:\n");
    for tenant in 0..tenants {
        let _ = write!(
            yaml,
            "  - key: tenant\n    value: t{tenant}\n    \
             rate_limit: {{unit: minute, requests_per_unit: 1000}}\n    descriptors:\n"
        );
        for path in 0..PATH_WILDCARDS {
            let _ = write!(
                yaml,
                "      - key: path\n        value: /api/v{path}/*\n        descriptors:\n          \
                 - key: method\n            rate_limit: {{unit: second, requests_per_unit: 50}}\n"
            );
        }
        let _ = write!(
            yaml,
            "      - key: path\n        value: /health\n        \
             rate_limit: {{unit: second, requests_per_unit: 5}}\n"
        );
    }
    yaml.push_str("  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 10}\n");
    for host in 0..HOST_WILDCARDS {
        let _ = write!(
            yaml,
            "  - key: host\n    value: \"*.h{host}.example.com\"\n    share_threshold: true\n    \
             rate_limit: {{unit: hour, requests_per_unit: 100}}\n"
        );
    }
    yaml
}

fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
    pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
}

fn resolve(c: &mut Criterion) {
    let tenants = tenants();
    let yaml = generated_yaml(tenants);
    let config = match Config::from_yaml("bench.yaml", &yaml) {
        Ok(config) => config,
        Err(error) => panic!("the generated config does not load: {error}"),
    };
    let Some(domain) = config.domain("bench") else {
        panic!("the generated config has no domain `bench`");
    };
    let last_tenant = format!("t{}", tenants - 1);
    let last_host = format!("api.h{}.example.com", HOST_WILDCARDS - 1);
    let cases: Vec<(&str, Vec<Entry>)> = vec![
        ("exact_1_level", entries(&[("tenant", &last_tenant)])),
        (
            "exact_wildcard_keyonly_3_levels",
            entries(&[
                ("tenant", &last_tenant),
                ("path", "/api/v7/users/42"),
                ("method", "GET"),
            ]),
        ),
        (
            "exact_exact_2_levels",
            entries(&[("tenant", "t7"), ("path", "/health")]),
        ),
        ("key_only_fallback", entries(&[("tenant", "unknown")])),
        (
            "first_wildcard_of_500",
            entries(&[("host", "api.h0.example.com")]),
        ),
        ("last_wildcard_of_500", entries(&[("host", &last_host)])),
        (
            "no_match_after_500_wildcards",
            entries(&[("host", "nowhere")]),
        ),
        ("unknown_key", entries(&[("nope", "x")])),
    ];
    for (name, request) in &cases {
        if name.starts_with("no_match") || name.starts_with("unknown") {
            assert!(domain.resolve(request).is_none(), "{name} should not match");
        } else {
            assert!(domain.resolve(request).is_some(), "{name} should match");
        }
    }

    let mut group = c.benchmark_group("resolve");
    for (name, request) in &cases {
        group.bench_with_input(BenchmarkId::from_parameter(name), request, |b, request| {
            b.iter(|| domain.resolve(black_box(request)).is_some())
        });
    }
    group.finish();

    // What the limiter does next with a match: build the counter's identity.
    let mut group = c.benchmark_group("resolve_and_key");
    for (name, request) in &cases[..2] {
        group.bench_with_input(BenchmarkId::from_parameter(name), request, |b, request| {
            b.iter(|| {
                domain.resolve(black_box(request)).map(|matched| {
                    limiter_key(
                        domain.name(),
                        request,
                        &matched.shared,
                        matched.limits[0].algorithm,
                        matched.limits[0].window_ms,
                    )
                })
            })
        });
    }
    group.finish();
}

/// Parsing and building the whole generated config, as a reload does.
fn load(c: &mut Criterion) {
    // Two sizes, to show how loading scales with the number of descriptors.
    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    for tenants in [tenants() / 4, tenants()] {
        let yaml = generated_yaml(tenants);
        group.bench_with_input(
            BenchmarkId::new("generated_config_tenants", tenants),
            &yaml,
            |b, yaml| b.iter(|| Config::from_yaml("bench.yaml", black_box(yaml)).is_ok()),
        );
    }
    group.finish();
}

criterion_group!(benches, resolve, load);
