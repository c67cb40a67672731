//! The in-process micro-benchmarks, one criterion binary (each bench binary links the whole
//! tree, and `scripts/test` runs every one once in test mode):
//!
//! - [`window`]: the sliding-window math of one key;
//! - [`matching`]: descriptor resolution against a large policy, and loading it;
//! - [`memory_backend`]: the memory backend's decisions under thread contention;
//! - [`decision`]: one whole decision on the stack `tollgate serve` builds.
//!
//! `cargo bench --bench micro` runs them all; `cargo bench --bench micro -- decision` one group.
//! What a user feels (decisions per second through gRPC, Redis CPU) is `tollgate-bench`'s.

mod decision;
mod matching;
mod memory_backend;
mod support;
mod window;

criterion::criterion_main!(
    window::benches,
    matching::benches,
    memory_backend::benches,
    decision::benches
);
