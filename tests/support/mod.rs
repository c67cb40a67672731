pub mod envoy;
pub mod net;
pub mod redis;
pub mod tollgate;
pub mod tools;
