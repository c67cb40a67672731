//! The tests that run whole programs: the real `tollgate` binary (its command line,
//! environment, signals, TLS, xDS, traces and metrics), real Envoy in front of tollgate, the
//! deployment examples, envoyproxy/ratelimit's own test material, and every command the README
//! and docs/ show.
//!
//! - [`bounds`]: what a hostile client can hold: stalled streams, silent connections, files;
//! - [`service`]: tollgate from the outside: the command line, the admin interface, grpcurl;
//! - [`compat`]: envoyproxy/ratelimit's test material, as a user switching over would try it;
//! - [`settings`]: start-up settings at the binary's edge, the reference's variables among them;
//! - [`tls`]: where Envoy Gateway runs envoyproxy/ratelimit: gRPC over mutual TLS from Envoy;
//! - [`xds`]: policies from a real ADS management server;
//! - [`tracing`]: span export over OTLP to a real receiver;
//! - [`metrics`]: the metrics from known traffic;
//! - [`envoy`]: end to end through a real Envoy;
//! - [`rlqs`]: Envoy's rate-limit-quota filter against tollgate's RLQS, through real Envoys;
//! - [`deploy`]: the deployment examples under `deploy/`;
//! - [`ui`]: what an operator sees: who is refused (`/top`) and the admin page in Chromium;
//! - [`docs`]: every command the documents show, run as a user would type it.
//!
//! One binary, because each test binary links the whole tree.

mod bounds;
mod compat;
mod deploy;
mod docs;
mod envoy;
mod metrics;
mod rlqs;
mod service;
mod settings;
mod tls;
mod tracing;
mod ui;
mod xds;
