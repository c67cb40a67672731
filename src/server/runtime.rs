//! The async runtime tollgate serves on, scheduled for its backend.
//!
//! tokio runs a task woken by the running one next, before the tasks already queued (its "LIFO
//! slot"), which answers one message quickly. A Redis decision wakes two tasks that write to a
//! shared socket: the Redis connection's writer (the call) and the HTTP/2 connection's writer
//! (the answer). Run first, each writer sent one decision per write under load. Queued behind the
//! decisions waiting on its worker instead, it sends all of theirs in one write: against one
//! Redis at 64 calls in flight, 1.3 → 0.19 `writev` calls per decision, about 10% less CPU per
//! decision in tollgate and 13% less in Redis. With the memory backend a decision writes only its
//! answer; queuing saved no CPU there and cost a sixth of the decisions a second at saturation,
//! so that runtime keeps tokio's default (docs/dev/performance-history.md, "The runtime and the allocator").
//!
//! Queuing woken tasks is one of tokio's unstable options, so the build passes
//! `--cfg tokio_unstable` (`.cargo/config.toml`). A build without it (a `RUSTFLAGS` variable
//! replaces those flags) still works, with the default scheduling for every backend; the build
//! script warns.

use std::num::NonZeroUsize;

use tokio::runtime::{Builder, Runtime};

use crate::backend::Store;

/// Where a task woken by the running task is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeups {
    /// Next, before the tasks already queued (tokio's default): the memory backend's choice.
    RunFirst,
    /// Behind the tasks already queued, so that socket writers batch: the Redis backends'.
    Queue,
}

impl Wakeups {
    /// The scheduling for a store: queued for every Redis deployment, where each decision also
    /// writes to Redis; tokio's default in memory.
    pub fn for_store(store: &Store) -> Self {
        Wakeups::for_backend(matches!(store, Store::Redis(_)))
    }

    /// The scheduling for a backend whose decisions do (`calls_redis`) or do not go to Redis:
    /// what [`Wakeups::for_store`] decides, for callers that build a backend without settings.
    pub fn for_backend(calls_redis: bool) -> Self {
        if calls_redis {
            Wakeups::Queue
        } else {
            Wakeups::RunFirst
        }
    }
}

/// A multi-threaded runtime of `workers` threads with I/O and timers, scheduling `wakeups` as
/// asked. The worker count is always given, so tokio never reads `TOKIO_WORKER_THREADS` itself
/// (it panics on a value the settings read as unset, an empty one).
pub fn build(workers: NonZeroUsize, wakeups: Wakeups) -> std::io::Result<Runtime> {
    let mut builder = Builder::new_multi_thread();
    builder.worker_threads(workers.get()).enable_all();
    #[cfg(tokio_unstable)]
    if wakeups == Wakeups::Queue {
        builder.disable_lifo_slot();
    }
    #[cfg(not(tokio_unstable))]
    let _ = wakeups;
    builder.build()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::backend::redis::connect::{Kind, Target};

    /// The order in which two tasks, spawned one after the other by a task on the only worker,
    /// first run.
    fn order_of_two_spawned(wakeups: Wakeups) -> Vec<&'static str> {
        let runtime = build(NonZeroUsize::MIN, wakeups).expect("runtime");
        let order = Arc::new(Mutex::new(Vec::new()));
        let seen = order.clone();
        runtime
            .block_on(async move {
                tokio::spawn(async move {
                    let spawn = |name: &'static str| {
                        let order = seen.clone();
                        tokio::spawn(async move { order.lock().expect("order").push(name) })
                    };
                    let first = spawn("first");
                    let second = spawn("second");
                    let _ = tokio::join!(first, second);
                })
                .await
            })
            .expect("the spawning task");
        order.lock().expect("order").clone()
    }

    #[test]
    fn only_a_redis_store_queues_wakeups() {
        assert_eq!(Wakeups::for_store(&Store::Memory), Wakeups::RunFirst);
        // One Redis server, the reference's default store (settings' tests check that choice).
        let redis = Target::parse(Kind::Single, "127.0.0.1:6379", None).expect("a Redis target");
        assert_eq!(
            Wakeups::for_store(&Store::Redis(Box::new(redis))),
            Wakeups::Queue
        );
    }

    /// Queued wakeups run in the order they were queued; run first, the second takes the slot
    /// the first was in and runs before it, as every woken writer ran before the work queued
    /// ahead of it.
    #[test]
    fn queued_wakeups_wait_behind_work_already_queued() {
        assert_eq!(
            order_of_two_spawned(Wakeups::Queue),
            ["first", "second"],
            "the woken task ran first: was this built without --cfg tokio_unstable?"
        );
        assert_eq!(order_of_two_spawned(Wakeups::RunFirst), ["second", "first"]);
    }
}
