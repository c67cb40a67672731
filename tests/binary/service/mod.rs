//! tollgate as a service, from the outside: the command line (`check`, `serve`'s flags and
//! environment), the admin HTTP interface (`/json`, `/rlconfig`, `/metrics`, `/healthcheck`,
//! `/counters`),
//! gRPC health and reflection as grpcurl uses them, hot reloads and the SIGTERM drain.
//!
//! What only the binary does (arguments, environment, exit codes, signals, its log) runs the real
//! `tollgate` process; the protocol surfaces run the same server in this process
//! (`tollgate_testkit::in_process`), which needs no port guessing and starts at once. One binary
//! for all of it, because each test binary links the whole tree.

mod admin;
mod cli;
mod counters;
mod grpcurl;
mod lifecycle;
