//! The xDS source: policies pushed by a management server (Envoy Gateway's, Envoy AI Gateway's)
//! as envoyproxy/ratelimit's `RateLimitConfig` resources over a State-of-the-World ADS stream,
//! turned into the same validated snapshot a policy file gives.
//!
//! ```text
//! management server ──ADS──► client.rs ──resources──► convert.rs ──► schema::Policy ──► rules ──► Config
//!        ▲                      │                                                               │
//!        └────── ACK / NACK ────┘◄───────────────────────── Events (the server installs it) ◄───┘
//! ```
//!
//! - `options`: [`XdsOptions`], read from the reference's variables ([`XdsOptions::from_env`]);
//! - `client`: [`XdsClient`], the stream, ACK/NACK, reconnects; reports through [`Events`];
//! - `convert`: one push into a snapshot ([`snapshot`]), or the [`Rejection`] a NACK carries;
//! - `backoff`: the reference's reconnect delays.

mod backoff;
mod client;
mod convert;
mod options;

pub use backoff::Backoff;
pub use client::{Accepted, Events, Rejected, XdsClient};
pub use convert::{ExtensionDefaults, RATE_LIMIT_CONFIG_TYPE_URL, Rejection, snapshot};
pub use options::{
    BackoffOptions, DEFAULT_MAX_MESSAGE_SIZE, XdsOptions, XdsOptionsError, parse_go_bool,
    parse_go_duration, vars,
};
