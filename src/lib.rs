//! tollgate: a sliding-window rate-limit service for Envoy's RateLimitService v3.
//!
//! Data flows one way: [`server`] turns protobuf requests into [`descriptor::Request`]s, the
//! [`limiter`] resolves them against a [`config::Config`] snapshot and asks a [`backend`] to
//! decide each limit with the math of [`window`]. The limiter knows nothing of gRPC; the backends
//! know nothing of descriptors or YAML.
//!
//! # The request path
//!
//! One `ShouldRateLimit` call, from proto in to proto out, is handed down through five files,
//! one step each; the helpers a step calls out to are named where it uses them. The binary runs
//! `Limiter<Sharded<AnyBackend>>`; the Redis backend is shown, the others branch off at step 4.
//!
//! 1. **Handler**, `src/server/fast_path/`. [`FastPath`], a tonic service written by hand,
//!    reads the call's one message from the HTTP/2 body ([`server::fast_path::unary`]) and
//!    decodes it with [`decode_request`] (`src/server/fast_path/wire.rs`) straight into a
//!    [`descriptor::Request`], with no protobuf struct between, and hands it to
//!    `App::decide_since` (`src/server/rls.rs`):
//!    it starts the clock, opens the decision's span, answers at once when no policies are in
//!    force yet or too many decisions are in flight, and asks [`Limiter::should_rate_limit`] (a
//!    [`LimiterError`] becomes `INVALID_ARGUMENT`). **Metrics are recorded** there:
//!    [`Metrics::observe`] (`src/server/metrics.rs`) counts the overall and per-descriptor codes
//!    and the latency. The [`Decision`] goes back to the handler, which writes the protobuf answer
//!    from it (`write_decision`, with the field writer of `src/server/fast_path/answer.rs`) as
//!    the call's one data frame ([`server::fast_path::unary::answer`]). With
//!    `--grpc-fast-path=false` the call takes tonic's generated service instead
//!    ([`GeneratedRls`]), to the same `App::decide_since`, through the protobuf structs.
//!    `POST /json`
//!    (`src/server/admin.rs`) takes [`App::decide`], the same path between the protobuf structs
//!    (`request_from_proto`, `response_to_proto`); [`rls::decide`] is that conversion without the
//!    metrics, for embedders and tests.
//! 2. **Limiter**, `src/limiter/mod.rs`. [`Limiter::should_rate_limit`] checks the protocol's
//!    bounds (`validate`), loads **one config snapshot** for the whole request, resolves each
//!    descriptor to its limit (`Limiter::resolve`: the descriptor's own `limit` override, else
//!    [`Domain::resolve`] in `src/config/domain.rs`) and the identity of the counter it charges
//!    (`src/counter_key.rs`: the domain builds it from pieces escaped when the config was built,
//!    an override with [`limiter_key`]), applies `replaces` and `unlimited` and makes one [`Hit`]
//!    per limit left (`Limiter::plan`), asks the backend once ([`Backend::acquire`]), turns the
//!    verdicts into statuses, the overall code and `retry-after` (`Limiter::verdicts`), gives
//!    back what a rejected request took ([`Backend::release`], `Limiter::give_back`) and adds the
//!    metadata (`Limiter::conclude`).
//! 3. **Hot-key sharding**, `src/backend/shard.rs`. [`Sharded::acquire`] passes a batch without
//!    sharded hits straight through; a hit of a limit with `shards: N` goes to one random shard
//!    window (and, if that one is full, to one other).
//! 4. **Backend dispatch**, `src/backend/mod.rs`. [`AnyBackend::acquire`] matches on the store
//!    chosen at startup: [`MemoryBackend`] (`src/backend/memory.rs`), [`ClusterBackend`]
//!    (`src/backend/redis/cluster.rs`, one script call per hit, concurrently), or:
//! 5. **Store**, `src/backend/redis/single.rs`. [`RedisBackend::acquire`] turns each hit into a
//!    Lua script call (`Scripts::acquire` in `src/backend/redis/scripts.rs`, its keys from
//!    [`KeySpace::base`] in `keys.rs`), sends them all in one pipeline within the deadline
//!    (`run`, `pipeline`; NOSCRIPT answered by sending the script along), and reads each reply
//!    into an [`Outcome`] (`Call::outcome`). The shared connection, error mapping and failure
//!    log are in `src/backend/redis/mod.rs`; the scripts themselves are in `lua/`.
//!
//! # Where config snapshots come from
//!
//! At startup `main` resolves the [`settings::Settings`] (flags, `TOLLGATE_*` variables,
//! envoyproxy/ratelimit's variables, defaults), which name a [`config::FileSource`]: the
//! `--config` path, or the reference's runtime directory layout. It loads it (an invalid config
//! stops it with the message `tollgate check` prints) and hands it to [`Limiter::new`]. While
//! serving, [`server::reload::watch`] polls the source's files (and reloads on SIGHUP), loads
//! them again and installs them with [`Limiter::set_config`]; a config that fails to load is
//! logged and the last good one stays. Loading goes source → schema tree → rules → snapshot (`src/config/file.rs`,
//! `schema.rs`, `rules.rs`); requests in flight keep the snapshot they started with.
//!
//! With an xDS source (`--xds-server-url`, or `CONFIG_TYPE=GRPC_XDS_SOTW`) the limiter starts
//! empty and [`server::xds::run`] runs the ADS client ([`config::xds::XdsClient`]): each push of
//! `RateLimitConfig` resources is converted into the same schema tree (`src/config/xds/convert.rs`)
//! and built by the same rules into a snapshot, installed with [`Limiter::set_config`] and then
//! ACKed; a push that does not load is NACKed and the snapshot in force stays.
//!
//! [`FastPath`]: server::fast_path::FastPath
//! [`GeneratedRls`]: server::rls::GeneratedRls
//! [`decode_request`]: server::fast_path::wire::decode_request
//! [`App::decide`]: server::App::decide
//! [`rls::decide`]: server::rls::decide
//! [`Limiter::should_rate_limit`]: limiter::Limiter::should_rate_limit
//! [`Limiter::new`]: limiter::Limiter::new
//! [`Limiter::set_config`]: limiter::Limiter::set_config
//! [`Decision`]: limiter::Decision
//! [`LimiterError`]: limiter::LimiterError
//! [`limiter_key`]: limiter::limiter_key
//! [`Metrics::observe`]: server::Metrics::observe
//! [`Domain::resolve`]: config::Domain::resolve
//! [`Config::load`]: config::Config::load
//! [`Hit`]: backend::Hit
//! [`Outcome`]: backend::Outcome
//! [`Backend::acquire`]: backend::Backend::acquire
//! [`Backend::release`]: backend::Backend::release
//! [`Sharded::acquire`]: backend::Sharded
//! [`AnyBackend::acquire`]: backend::AnyBackend
//! [`MemoryBackend`]: backend::MemoryBackend
//! [`ClusterBackend`]: backend::ClusterBackend
//! [`RedisBackend::acquire`]: backend::RedisBackend
//! [`KeySpace::base`]: backend::redis::KeySpace::base

#![warn(missing_docs)]

mod allocator;
pub mod backend;
pub mod clock;
pub mod config;
pub mod counter_key;
pub mod descriptor;
pub mod limiter;
pub mod proto;
pub mod server;
pub mod settings;
pub mod telemetry;
pub mod window;
