//! What an adversarial run against the service found, each a regression test on real servers:
//! retries that could apply a refund twice, a Redis user who may not run the scripts, a backend
//! that refuses every call while answering pings, reloads that would empty the policies or load a
//! file half written, and a burst of calls past what the service can have in flight.

mod health;
mod overload;
mod permissions;
mod quiet_logs;
mod reload;
mod retry;
