//! One decision in this process, on the memory backend with the stack `tollgate serve` builds
//! (per-second split, local over-limit cache, sharding, leases) and the metrics it records: what
//! a call costs beside gRPC and the network. Measured on one thread, so no core is shared and no
//! lock contended; the `grpc-floor` scenario of `tollgate-bench` measures the same decision
//! behind gRPC, against a server that decides nothing.
//!
//! - `app`: `App::decide`, the gRPC handler's whole work: the protobuf request converted,
//!   decided, counted in every metric, and the protobuf response built.
//! - `limiter`: `Limiter::should_rate_limit` alone, on a converted request.
//!
//! Each with one descriptor value (as h2load sends) and with 10,000 values in turn (as the
//! benchmark's generator sends), under a limit no run reaches, so every hit is admitted and
//! counted.
//!
//! `cargo bench --bench micro -- decision`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group};
use tollgate::backend::{self, AnyBackend, MemoryBackend, memory};
use tollgate::clock::{Clock, SystemClock};
use tollgate::config::Config;
use tollgate::limiter::{Limiter, Settings};
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, rate_limit_descriptor::Entry};
use tollgate::server::{App, Health, rls::request_from_proto};

use super::support::ready;

const POLICY: &str = "domain: bench
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 4000000000}
";

fn request(value: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: value.to_string(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

fn limiter() -> Arc<Limiter<backend::Stack>> {
    let config = Config::from_yaml("bench.yaml", POLICY)
        .unwrap_or_else(|error| panic!("the policy does not load: {error}"));
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let store = AnyBackend::Memory(MemoryBackend::with_budget(
        Arc::clone(&clock),
        memory::default_budget(),
    ));
    let stack = backend::stack(
        store,
        None,
        // The cache as `tollgate serve` sets it by default.
        backend::CacheOptions {
            clock,
            bytes: backend::local_cache::DEFAULT_BYTES,
            answer_counted: false,
        },
        false,
    );
    Arc::new(Limiter::new(Arc::new(config), stack, Settings::default()))
}

fn decision(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|error| panic!("no runtime: {error}"));
    let (reporter, _health_service) = tonic_health::server::health_reporter();
    let health = runtime.block_on(Health::new(reporter));
    let limiter = limiter();
    let app = App::new(Arc::clone(&limiter), health, Some(256));

    let mut group = c.benchmark_group("decision");
    group.throughput(Throughput::Elements(1));
    for keys in [1, 10_000] {
        let requests: Vec<RateLimitRequest> = (0..keys).map(request).collect();
        for request in &requests {
            let response = ready(app.decide(request.clone()))
                .unwrap_or_else(|status| panic!("the request was refused: {status}"));
            assert_eq!(
                response.overall_code,
                Code::Ok as i32,
                "every hit is admitted: {response:?}"
            );
        }
        let mut next = 0;
        let mut take = move || {
            next = (next + 1) % requests.len();
            requests[next].clone()
        };
        group.bench_function(BenchmarkId::new("app", keys), |b| {
            b.iter_batched(
                &mut take,
                |request| ready(app.decide(request)),
                BatchSize::SmallInput,
            )
        });
        group.bench_function(BenchmarkId::new("limiter", keys), |b| {
            b.iter_batched(
                || request_from_proto(take()),
                |request| ready(limiter.should_rate_limit(&request)),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();

    // Two threads deciding at once, as the two workers of a 2-CPU server do: what the decision
    // shares between cores (locks, counters, reference counts) costs more when both write it.
    let mut group = c.benchmark_group("decision_2_threads");
    group.throughput(Throughput::Elements(1));
    for keys in [1, 10_000] {
        let requests: Vec<RateLimitRequest> = (0..keys).map(request).collect();
        group.bench_function(BenchmarkId::new("app", keys), |b| {
            b.iter_custom(|iters| {
                on_two_threads(iters, &requests, |request| {
                    let _ = std::hint::black_box(ready(app.decide(request)));
                })
            })
        });
        group.bench_function(BenchmarkId::new("limiter", keys), |b| {
            b.iter_custom(|iters| {
                on_two_threads(iters, &requests, |request| {
                    let request = request_from_proto(request);
                    let _ = std::hint::black_box(ready(limiter.should_rate_limit(&request)));
                })
            })
        });
    }
    group.finish();
}

/// Spreads `iters` calls of `decide` over two threads, each walking `requests` from its own
/// half, and answers the wall time they took together.
fn on_two_threads(
    iters: u64,
    requests: &[RateLimitRequest],
    decide: impl Fn(RateLimitRequest) + Sync,
) -> Duration {
    let per_thread = iters.div_ceil(2);
    let started = Instant::now();
    std::thread::scope(|scope| {
        for thread in 0..2 {
            let decide = &decide;
            scope.spawn(move || {
                let mut next = thread * requests.len() / 2;
                for _ in 0..per_thread {
                    decide(requests[next].clone());
                    next = (next + 1) % requests.len();
                }
            });
        }
    });
    started.elapsed()
}

criterion_group!(benches, decision);
