//! The window math on its own: what one decision costs before any locking or I/O.
//!
//! `cargo bench --bench micro -- window`

use std::hint::black_box;

use criterion::{Criterion, criterion_group};
use tollgate::window::{self, Cost, Counting};

const W: u64 = 60_000;
/// A time well inside a fixed window, so the counter's weighting is not trivial.
const NOW: u64 = 1_700_000_000_000 + 12_345;

fn counter(c: &mut Criterion) {
    let mut group = c.benchmark_group("counter_decide");
    // `reject` also computes the retry time.
    for (name, prev, curr, cost) in [
        ("admit", 400, 300, Cost::Consume(1)),
        ("reject", 900, 800, Cost::Consume(1)),
        ("check_only", 400, 300, Cost::CheckOnly),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                window::counter_decide(
                    black_box(1_000),
                    black_box(W),
                    black_box(NOW),
                    black_box(prev),
                    black_box(curr),
                    black_box(cost),
                    black_box(Counting::Admitted),
                )
            })
        });
    }
    group.finish();
}

/// `len` live entries of cost 1, evenly spread over the window ending at `NOW`, oldest first.
fn live_entries(len: u64) -> Vec<(u64, u64)> {
    (0..len)
        .map(|i| (NOW - W + 1 + i * (W - 1) / len.max(1), 1))
        .collect()
}

fn log(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_decide_live");
    // Admitting is O(1) with a running sum: the entries are not walked.
    let entries = live_entries(500);
    group.bench_function("admit_500_live", |b| {
        b.iter(|| {
            window::log_decide_live(
                black_box(1_000),
                black_box(W),
                black_box(NOW),
                black_box(500),
                black_box(entries.last().map(|e| e.0)),
                black_box(&entries).iter().copied(),
                black_box(Cost::Consume(1)),
                black_box(Counting::Admitted),
            )
        })
    });
    // Refusing walks the entries oldest first until enough have left: for a cost of 1 one
    // entry, for a large cost most of them.
    for (name, limit, len, cost) in [
        ("reject_small_cost_1000_live", 1_000, 1_000, 1),
        ("reject_large_cost_1000_live", 1_000, 1_000, 900),
        ("reject_large_cost_10000_live", 10_000, 10_000, 9_000),
    ] {
        let entries = live_entries(len);
        group.bench_function(name, |b| {
            b.iter(|| {
                window::log_decide_live(
                    black_box(limit),
                    black_box(W),
                    black_box(NOW),
                    black_box(u128::from(len)),
                    black_box(entries.last().map(|e| e.0)),
                    black_box(&entries).iter().copied(),
                    black_box(Cost::Consume(cost)),
                    black_box(Counting::Admitted),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, counter, log);
