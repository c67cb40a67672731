//! tollgate's fuzz targets, as plain functions of the fuzzer's bytes. Each feeds one door an
//! attacker or a careless operator can reach and checks what must hold for any input; a panic
//! (an assertion included) is a finding.
//!
//! - [`yaml_config`]: the policy-file loader. Any text loads or fails with
//!   `file:line:column: message` pointing inside the text; the same text always loads alike.
//! - [`descriptor_key`]: the descriptor-to-key path. Two different descriptors never share a
//!   counter identity or a Redis key, keys never carry a stray hash tag, and a whole request
//!   through the limiter on the memory backend answers one status per descriptor, never more than
//!   the limit remaining.
//! - [`admin_json`]: `POST /json`. Any body answers 200, 429, 400 or 503, never a server error.
//! - [`rls_request`]: the gRPC service's request decoder, which reads the bytes straight into the
//!   limiter's request. Any bytes decode to what the generated protobuf code and its conversion
//!   make of them, or fail with the same error.
//!
//! `fuzz/` runs them under libFuzzer (`cargo +nightly fuzz run <target>`); the test suite replays
//! every input kept in `fuzz/corpus/<target>/` through them on the stable toolchain.

use std::sync::{Arc, OnceLock};

use prost::Message;
use tollgate::backend::memory::MIN_BUDGET;
use tollgate::backend::redis::KeySpace;
use tollgate::backend::{MemoryBackend, Sharded};
use tollgate::clock::SystemClock;
use tollgate::config::Config;
use tollgate::descriptor::{Descriptor, Entry, Request};
use tollgate::limiter::{Limiter, Settings, limiter_key};
use tollgate::proto::RateLimitRequest;
use tollgate::server::App;
use tollgate::server::admin::answer_json;
use tollgate::server::fast_path::wire::decode_request;
use tollgate::server::health::Health;
use tollgate::server::rls::request_from_proto;
use tollgate::window::Algorithm;

/// A fuzz target: any bytes in, a panic on a finding.
pub type Target = fn(&[u8]);

/// The targets by the names `fuzz/fuzz_targets/` and `fuzz/corpus/` give them.
pub const TARGETS: [(&str, Target); 4] = [
    ("yaml_config", yaml_config),
    ("descriptor_key", descriptor_key),
    ("admin_json", admin_json),
    ("rls_request", rls_request),
];

/// The policy file loader on any text.
pub fn yaml_config(data: &[u8]) {
    // Files that are not UTF-8 are refused while reading, before the parser sees them.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_yaml("fuzz.yaml", text) {
        Ok(config) => {
            let table = config.table();
            let again = Config::from_yaml("fuzz.yaml", text).expect("the same text loads again");
            assert_eq!(table, again.table(), "loading is deterministic");
            for warning in config.warnings() {
                assert!(warning.starts_with("fuzz.yaml:"), "{warning}");
            }
        }
        Err(error) => {
            assert_eq!(error.file.to_str(), Some("fuzz.yaml"));
            // Lines end as YAML ends them: at `\r\n`, `\r` or `\n`.
            let lines = text.replace("\r\n", "\n").split(['\r', '\n']).count();
            assert!(
                (1..=lines).contains(&error.line),
                "line {} of {lines}: {error}",
                error.line
            );
            assert!(error.column >= 1, "{error}");
            assert!(!error.message.trim().is_empty(), "{error}");
        }
    }
}

/// The policy the descriptor and JSON targets decide against: exact values, wildcards, a shared
/// wildcard, nesting, both algorithms, shards, an allow-list entry and an unlimited limit.
const POLICY: &str = "domain: fuzz
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    value: acme
    rate_limit: {unit: hour, requests_per_unit: 100, algorithm: sliding_window_log}
  - key: tenant
    value: 'team-*'
    share_threshold: true
    rate_limit: {window: 90s, requests_per_unit: 7, shards: 4}
  - key: path
    value: '/api/*'
    descriptors:
      - key: method
        rate_limit: {unit: second, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: internal
  - key: health
    rate_limit: {unlimited: true}
";

fn config() -> Arc<Config> {
    static CONFIG: OnceLock<Arc<Config>> = OnceLock::new();
    Arc::clone(CONFIG.get_or_init(|| {
        Arc::new(Config::from_yaml("fuzz.yaml", POLICY).expect("the fuzz policy loads"))
    }))
}

/// Descriptors from fuzzer bytes: `key=value` entries separated by `0xFE` bytes, descriptors by
/// `0xFD` (neither is part of UTF-8). Lossy decoding keeps every text valid.
fn descriptors(data: &[u8]) -> Vec<Descriptor> {
    data.split(|&byte| byte == 0xFD)
        .map(|descriptor| Descriptor {
            entries: descriptor
                .split(|&byte| byte == 0xFE)
                .map(|entry| {
                    let text = String::from_utf8_lossy(entry);
                    let (key, value) = text.split_once('=').unwrap_or((&text, ""));
                    Entry::new(key, value)
                })
                .collect(),
            ..Descriptor::default()
        })
        .collect()
}

/// The descriptor-to-key path: identities and Redis keys of two descriptors, and one request
/// through the limiter.
pub fn descriptor_key(data: &[u8]) {
    let mut parts = data.splitn(3, |&byte| byte == 0xFF);
    let domain = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let first = descriptors(parts.next().unwrap_or_default());
    let second = descriptors(parts.next().unwrap_or_default());
    let keys = KeySpace::new("fuzz:");
    for (a, b) in first.iter().zip(&second) {
        for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
            let key_a = limiter_key(&domain, &a.entries, &[], algorithm, 60_000);
            let key_b = limiter_key(&domain, &b.entries, &[], algorithm, 60_000);
            assert!(!key_a.contains(['{', '}']), "a stray hash tag: {key_a:?}");
            assert_eq!(
                key_a == key_b,
                a.entries == b.entries,
                "identities collide: {a:?} / {b:?} -> {key_a:?}"
            );
            let (base_a, base_b) = (keys.base(&key_a), keys.base(&key_b));
            assert_eq!(
                base_a == base_b,
                key_a == key_b,
                "redis keys collide: {key_a:?} / {key_b:?}"
            );
            assert_eq!(base_a.matches('{').count(), 1, "{base_a:?}");
            assert!(base_a.ends_with('}'), "{base_a:?}");
        }
    }
    let request = Request {
        domain: if domain.is_empty() {
            "fuzz".into()
        } else {
            domain.into()
        },
        descriptors: first,
        hits_addend: data.len() as u32 % 3,
    };
    decide(&request);
}

fn limiter() -> &'static Limiter<Sharded<MemoryBackend>> {
    static LIMITER: OnceLock<Limiter<Sharded<MemoryBackend>>> = OnceLock::new();
    LIMITER.get_or_init(|| {
        let backend = MemoryBackend::with_budget(Arc::new(SystemClock), MIN_BUDGET);
        Limiter::new(config(), Sharded::new(backend), Settings::default())
    })
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

fn decide(request: &Request) {
    let Ok(decision) = runtime().block_on(limiter().should_rate_limit(request)) else {
        return;
    };
    assert_eq!(decision.statuses.len(), request.descriptors.len());
    for status in &decision.statuses {
        if let Some(limit) = &status.limit {
            assert!(
                status.remaining <= limit.requests_per_unit,
                "{} remaining of {}",
                status.remaining,
                limit.requests_per_unit
            );
        }
    }
}

fn app() -> &'static App<Sharded<MemoryBackend>> {
    static APP: OnceLock<App<Sharded<MemoryBackend>>> = OnceLock::new();
    APP.get_or_init(|| {
        let backend = MemoryBackend::with_budget(Arc::new(SystemClock), MIN_BUDGET);
        let limiter = Arc::new(Limiter::new(
            config(),
            Sharded::new(backend),
            Settings::default(),
        ));
        let (reporter, _service) = tonic_health::server::health_reporter();
        let health = runtime().block_on(Health::new(reporter));
        App::new(limiter, health, None)
    })
}

/// `POST /json` on any body.
pub fn admin_json(data: &[u8]) {
    let response = runtime().block_on(answer_json(app(), data));
    let status = response.status().as_u16();
    assert!(
        matches!(status, 200 | 429 | 400 | 503),
        "status {status} for {:?}",
        String::from_utf8_lossy(data)
    );
}

/// The gRPC request decoder against the generated code on any bytes.
pub fn rls_request(data: &[u8]) {
    let direct = decode_request(&mut &data[..]).map_err(|error| error.to_string());
    let generated = RateLimitRequest::decode(data)
        .map(request_from_proto)
        .map_err(|error| error.to_string());
    assert_eq!(direct, generated);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_loads_and_each_target_takes_an_empty_input() {
        assert!(!config().is_empty());
        for (_, target) in TARGETS {
            target(b"");
        }
    }

    #[test]
    fn inputs_split_as_documented() {
        let parsed = descriptors(b"user=alice\xfepath=/x\xfdtenant=acme");
        assert_eq!(parsed.len(), 2);
        assert_eq!(
            parsed[0].entries,
            [Entry::new("user", "alice"), Entry::new("path", "/x")]
        );
    }
}
