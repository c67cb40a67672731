//! Real things for tollgate's tests and benchmarks, started on free loopback ports and stopped
//! when their handles drop: `redis-server` (single, Cluster, Sentinel), Envoy, grpcurl, an xDS
//! management server, test certificates, and tollgate itself, as a process or in this process on
//! listeners bound to port 0; and the targets a test body is run against, one `#[test]` per case
//! and target ([`cases!`]).
//!
//! Servers that a whole test binary shares (one Redis, one Cluster) outlive every test, so their
//! processes are started by [`process::spawn`], which ties them to this process: they die with
//! it however it ends, and a test run never leaves servers behind.

pub mod backends;
pub mod certs;
pub mod chromium;
pub mod envoy;
pub mod hits;
pub mod in_process;
pub mod mount;
pub mod net;
pub mod otlp;
pub mod pki;
pub mod policy;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod reference;
pub mod requests;
pub mod rls;
pub mod target;
pub mod tollgate;
pub mod tools;
pub mod wait;
pub mod xds;

/// Expands test cases into one `#[test]` per case and target: a module named after the case with
/// one function per target, so `cargo test <case>::redis_cluster` runs one test and a failure
/// names both. A case is an `async fn <case>(t: &Target)` in scope where the macro is invoked;
/// each target is a constructor of [`target::Target`] of the same name.
///
/// ```ignore
/// tollgate_testkit::cases! {
///     statuses_follow_request_order: exact;
///     concurrent_instances_never_exceed_the_limit: leased;
///     script_flush_is_survived: [redis, redis_cluster];
/// }
/// ```
///
/// Target sets, chosen per case:
/// - `every`: every store sharded or not, each limit decided in its store;
/// - `leased`: `every` and the Redis stores with every limit leased, for cases whose promises
///   hold whatever a hit's answer came from (a leased instance holds unspent slices, so cases
///   that read exact usage from the store do not);
/// - `exact`: every store composed as `tollgate serve` composes it, where each limit has exactly
///   the budget its policy gives it, for cases whose numbers depend on that;
/// - `[name, ...]`: these targets only.
///
/// A new mode joins by its constructors and by its names in the sets it keeps the promises of.
#[macro_export]
macro_rules! cases {
    () => {};
    (@case $case:ident [$($target:ident),+ $(,)?]) => {
        mod $case {
            $(
                #[test]
                fn $target() {
                    $crate::target::run($crate::target::Target::$target, super::$case);
                }
            )+
        }
    };
    ($case:ident: every; $($rest:tt)*) => {
        $crate::cases!(@case $case [
            memory, redis, redis_cluster, sharded_memory, sharded_redis, sharded_redis_cluster
        ]);
        $crate::cases!($($rest)*);
    };
    ($case:ident: leased; $($rest:tt)*) => {
        $crate::cases!(@case $case [
            memory, redis, redis_cluster, sharded_memory, sharded_redis, sharded_redis_cluster,
            leased_redis, leased_redis_cluster, leased_sharded_redis, leased_sharded_redis_cluster
        ]);
        $crate::cases!($($rest)*);
    };
    ($case:ident: exact; $($rest:tt)*) => {
        $crate::cases!(@case $case [memory, redis, redis_cluster]);
        $crate::cases!($($rest)*);
    };
    ($case:ident: [$($target:ident),+ $(,)?]; $($rest:tt)*) => {
        $crate::cases!(@case $case [$($target),+]);
        $crate::cases!($($rest)*);
    };
}
