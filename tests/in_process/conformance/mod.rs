//! The conformance suite: tollgate's decision semantics, written once and run against every
//! target (a store and a mode, see `tollgate_testkit::target`): process memory, one real
//! `redis-server` and a real Redis Cluster of three masters and three replicas, each as
//! `tollgate serve` composes it and with every limit split over shards.
//!
//! Each case is an `async fn(&Target)`; the `cases!` list at the top of its group picks the
//! targets it holds on and expands it into one `#[test]` per target, named `<case>::<target>`:
//! `cargo test --test in_process rejected_requests_consume_nothing::redis_cluster` runs one test.
//! (`redis` is also the start of `redis_cluster`; add `-- --exact` with the full path to run the
//! single-server one alone.)
//!
//! Every target runs with the local over-limit cache on, as `tollgate serve` does; the
//! [`cache`] group proves it exact.
//!
//! The groups:
//! - [`limiter`]: requests in, decisions out, on the wall clock: the assertions do not depend on
//!   the instant (hour- and day-long windows, reset times within ranges, exact where the window
//!   makes them exact); with the same policy, [`counting`] (which hits a limit charges) and
//!   [`outages`] (each limit's failure mode when the store fails, and the recovery);
//! - [`clocked`]: the same with an injected clock, where every number is exact (memory, and one
//!   Redis server told the time with each call);
//! - [`backend`]: hits in, outcomes out: window math, weighted costs, releases, several limiters
//!   in one call;
//! - [`lease`]: leased limits across instances: the invariant under concurrency, an instance
//!   dying with a slice, a lowered limit, released hits;
//! - [`cache`]: the local over-limit cache never refuses what the store would admit;
//! - [`instances`]: the same across instances sharing a store, when others give charges back;
//! - [`several`]: several limits on one descriptor (`rate_limits`), charged all or none;
//! - [`operator`]: an operator reading and resetting a client's windows, consuming nothing.
//!
//! Cases marked `leased` also run with every limit leased on the Redis stores.
//!
//! The binary's tests share one `redis-server` and one Cluster, started on first use; each target
//! has a key prefix of its own, and the few cases that stop their store get private servers.

mod backend;
mod cache;
mod clocked;
mod counting;
mod instances;
mod lease;
mod limiter;
mod operator;
mod outages;
mod quota;
mod several;
mod support;
