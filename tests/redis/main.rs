//! The Redis backends where Redis itself is the subject: the Lua scripts held to the window math
//! at injected instants, the keys (TTLs, one slot per limiter, one EVALSHA per limiter and
//! decision), failures (a server that stops, hangs or loses its scripts, a cluster master that
//! dies), connections (passwords, TLS, ACL users, unix sockets, Sentinel: [`connect`]), where
//! sharded limits put their shards, chaos with traffic flowing ([`chaos`]), and what an
//! adversarial run found ([`hardening`]). What every backend must do alike is the conformance
//! suite's (`tests/in_process/`).
//!
//! A case that applies to one server and to the cluster runs on both, one `#[test]` per case and
//! backend, named `<case>::<target>` as in the conformance suite. Cases that stop, flush or
//! watch servers start private ones; the others share one server and one cluster per binary,
//! apart by key prefix.

mod chaos;
mod connect;
mod connections;
mod failures;
mod group;
mod hardening;
mod inspect;
mod keys;
mod scripts;
mod shards;
