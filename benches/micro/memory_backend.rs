//! The memory backend under contention: one hot key that every thread hits versus many keys
//! spread over the lock stripes, from 1 and from 4 threads. The machine may have fewer cores
//! than threads; the numbers are aggregate decisions per second across all threads.
//!
//! `cargo bench --bench micro -- memory_backend`

use std::thread;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use tollgate::backend::{Backend, Hit, MemoryBackend, Sharded};
use tollgate::window::{Algorithm, Cost, Counting};

use super::support::ready;

const MANY_KEYS: usize = 10_000;

fn hits(keys: usize, algorithm: Algorithm, limit: u64, shards: u16) -> Vec<Hit> {
    (0..keys)
        .map(|i| Hit {
            key: format!("bench|tenant=t{i}@c60000"),
            algorithm,
            limit,
            window_ms: 60_000,
            cost: Cost::Consume(1),
            counting: Counting::Admitted,
            shards,
            lease_ms: 0,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        })
        .collect()
}

/// Spreads `iters` decisions over `threads` threads, each walking `hits` from its own offset, and
/// answers the wall time they took together.
fn contend<B: Backend>(backend: &B, hits: &[Hit], threads: usize, iters: u64) -> Duration {
    let per_thread = iters.div_ceil(threads as u64);
    let start = Instant::now();
    thread::scope(|scope| {
        for thread in 0..threads {
            scope.spawn(move || {
                let mut next = thread * hits.len() / threads;
                for _ in 0..per_thread {
                    let results = ready(backend.acquire(std::slice::from_ref(&hits[next])));
                    std::hint::black_box(results);
                    next += 1;
                    if next == hits.len() {
                        next = 0;
                    }
                }
            });
        }
    });
    start.elapsed()
}

fn contention(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_counter");
    group.throughput(Throughput::Elements(1));
    // A limit no run reaches, so every decision admits and writes.
    let one_key = hits(1, Algorithm::SlidingWindowCounter, u64::MAX, 1);
    let many_keys = hits(MANY_KEYS, Algorithm::SlidingWindowCounter, u64::MAX, 1);
    let backend = MemoryBackend::new();
    for threads in [1, 4] {
        for (name, hits) in [("one_hot_key", &one_key), ("10000_keys", &many_keys)] {
            group.bench_with_input(BenchmarkId::new(name, threads), &threads, |b, &threads| {
                b.iter_custom(|iters| contend(&backend, hits, threads, iters))
            });
        }
    }
    group.finish();

    // The over-limit path of a hot log: every hit is refused and walks entries for its retry time.
    let mut group = c.benchmark_group("memory_log_over_limit");
    group.throughput(Throughput::Elements(1));
    let backend = MemoryBackend::new();
    let mut full = hits(1, Algorithm::SlidingWindowLog, 100, 1);
    // An hour, so the entries outlive the benchmark.
    full[0].window_ms = 3_600_000;
    for _ in 0..100 {
        ready(backend.acquire(&full));
    }
    for threads in [1, 4] {
        group.bench_with_input(
            BenchmarkId::new("one_hot_key", threads),
            &threads,
            |b, &threads| b.iter_custom(|iters| contend(&backend, &full, threads, iters)),
        );
    }
    group.finish();

    // The same hot key split into 8 shard windows, which spreads it over the lock stripes.
    let mut group = c.benchmark_group("memory_counter_sharded");
    group.throughput(Throughput::Elements(1));
    let backend = Sharded::new(MemoryBackend::new());
    let hot = hits(1, Algorithm::SlidingWindowCounter, u64::MAX, 8);
    for threads in [1, 4] {
        group.bench_with_input(
            BenchmarkId::new("one_hot_key_8_shards", threads),
            &threads,
            |b, &threads| b.iter_custom(|iters| contend(&backend, &hot, threads, iters)),
        );
    }
    group.finish();
}

criterion_group!(benches, contention);
