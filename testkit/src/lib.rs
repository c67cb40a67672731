//! Real things for tollgate's tests and benchmarks, started on free loopback ports and stopped
//! when their handles drop: `redis-server` (single, Cluster), Envoy, grpcurl, an xDS management
//! server (with test certificates for its mutual TLS), and tollgate itself,
//! as a process or in this process on listeners bound to port 0.
//!
//! Servers that a whole test binary shares (one Redis, one Cluster) outlive every test, so their
//! processes are started by [`process::spawn`], which ties them to this process: they die with
//! it however it ends, and a test run never leaves servers behind.

pub mod certs;
pub mod envoy;
pub mod net;
pub mod process;
pub mod redis;
pub mod tollgate;
pub mod tools;
pub mod xds;
