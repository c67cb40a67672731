//! The in-process tests: the library driven from outside, with no tollgate process and no Envoy.
//! This is the developer's loop (`scripts/test --fast` runs it with the library's unit tests).
//!
//! - [`conformance`]: the decision semantics, every case on every backend (process memory, one
//!   real `redis-server`, a real Redis Cluster), as `tollgate serve` composes them;
//! - [`config`]: policy files on disk, loaded and refused as the reference would;
//! - [`properties`]: the limiter's invariants on generated traffic;
//! - [`memory_budget`]: the memory backend under a flood of distinct keys.
//!
//! One binary, because each test binary links the whole tree; the servers a module starts on
//! first use are shared by every module of the binary, apart by key prefix.

mod config;
mod conformance;
mod memory_budget;
mod properties;
