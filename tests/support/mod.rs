pub mod envoy;
pub mod net;
pub mod tollgate;
pub mod tools;
