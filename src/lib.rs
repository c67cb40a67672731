//! tollgate: a sliding-window rate-limit service for Envoy's RateLimitService v3.
//!
//! Data flows one way: [`server`] turns protobuf requests into [`descriptor::Request`]s, the
//! [`limiter`] resolves them against a [`config::Config`] snapshot and asks a [`backend`] to
//! decide each limit with the math of [`window`].

pub mod backend;
pub mod clock;
pub mod config;
pub mod descriptor;
pub mod limiter;
pub mod proto;
pub mod server;
pub mod window;
