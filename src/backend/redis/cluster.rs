//! The `redis-cluster` backend: a Redis Cluster reached from seed nodes.
//!
//! The `redis` crate's async cluster client keeps one connection per node, routes each script call
//! to the node owning its keys' slot and refreshes the slot map after a failover. Every limiter's
//! keys share a hash tag, so each hit is one script call on one node; the calls of one request run
//! concurrently, each with its own deadline, so a slow node fails only the hits it owns. The
//! limits of one descriptor decided together ([`Hit::group`]) share the descriptor's hash tag,
//! and are one call of the group script on the node of their slot.
//!
//! # Which calls are sent again
//!
//! A script call changes counts, and a refund sent twice gives back twice: the limit would then
//! admit more than it allows. So a call is resent only when the node certainly did not run it,
//! which tollgate decides itself: the client's own retries are off (they also resend after a
//! connection broke, when the call may have run). Resent are calls answered with
//! - `NOSCRIPT` (sent again with the script itself, `EVAL`),
//! - `MOVED` (to the node named, or by the slot map once that node is connected),
//! - `ASK` (to the node named, after `ASKING`),
//! - `TRYAGAIN`, `CLUSTERDOWN`, `MASTERDOWN`, `LOADING` (after a short pause),
//!
//! and calls that were never sent: no connection to the node (refused, or not yet made). A
//! timeout, a broken connection or any other error ends the call; each limit then answers its
//! `failure_mode`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::connect::{Addr, Auth, Kind, Target};
use super::keys::KeySpace;
use super::permissions;
use super::scripts::{Call, Invoke, Scripts, count_late_refunds};
use super::{Failure, FailureLog, Reconnecting, backend_error, permission_error};
use super::{group, inspect};
use crate::backend::observe::{self, CallLatency, FailureKind, Operation};
use crate::backend::{
    Backend, BackendError, Cleared, Hit, Outcome, Peeked, Receipt, Results, ShardKeys,
    SustainedFailure,
};

/// The least time given to opening connections and loading the slot map, whatever the per-call
/// deadline (the connection outlives the call that opened it).
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const NAME: &str = "redis-cluster";
/// Consecutive failed calls after which the cluster connection is rebuilt from the seeds, in
/// case the client's own reconnection cannot find its way back (say, every node was replaced).
const REBUILD_AFTER_FAILURES: u32 = 100;
/// The most times one call is sent (the first time included); each resend is one the node
/// certainly did not run, so the bound is only against a cluster that keeps redirecting.
const MAX_SENDS: u32 = 8;
/// The first pause before resending a call the cluster refused for now (TRYAGAIN, CLUSTERDOWN,
/// ...) or could not send; it doubles with each resend, within the call's deadline.
const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// Sliding windows in a Redis Cluster, shared by every tollgate instance that uses it.
pub struct ClusterBackend {
    client: Box<ClusterClient>,
    /// The Redis user tollgate logs in as, for permission errors.
    user: String,
    connection: Arc<Reconnecting<ClusterConnection>>,
    failures_in_a_row: AtomicU32,
    scripts: Scripts,
    keys: KeySpace,
    timeout: Duration,
    /// Since when every call has failed, for health (logging is `observe`'s).
    failures: FailureLog,
    /// Its calls' latency histograms.
    latency: CallLatency,
}

impl std::fmt::Debug for ClusterBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterBackend")
            .field("keys", &self.keys)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ClusterBackend {
    /// A backend on the cluster that `seed_urls` belong to (any reachable node is enough; all must
    /// carry the same user and password), with every key starting with `key_prefix` and every
    /// script call bounded by `timeout`. Fails only on unusable URLs: an unreachable cluster is
    /// retried on each call.
    pub async fn connect(
        seed_urls: &[String],
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<ClusterBackend, BackendError> {
        let text = seed_urls.join(",");
        let target = Target::parse(Kind::Cluster, &text, None)
            .map_err(|err| BackendError::Unavailable(format!("redis cluster urls: {err}")))?;
        ClusterBackend::connect_to(&target, key_prefix, timeout).await
    }

    /// A backend on the cluster `target`'s nodes belong to (seeds; any reachable node is
    /// enough), with its credentials and TLS applied to every node, every key starting with
    /// `key_prefix` and every script call bounded by `timeout`. Fails only on an unusable target:
    /// an unreachable cluster is retried on each call.
    pub async fn connect_to(
        target: &Target,
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<ClusterBackend, BackendError> {
        let unusable = |err: String| BackendError::Unavailable(format!("redis cluster: {err}"));
        let connect_timeout = target
            .connect_timeout
            .unwrap_or_else(|| timeout.max(MIN_CONNECT_TIMEOUT));
        let mut seeds = target
            .connection_infos()
            .map_err(|err| unusable(err.to_string()))?;
        // With certificates, the builder applies them to every node it discovers; the seeds
        // then carry only their address.
        let certificates = target
            .certificates()
            .map_err(|err| unusable(err.to_string()))?;
        if certificates.is_some() {
            seeds = target
                .nodes
                .iter()
                .map(|node| {
                    let addr = match &node.addr {
                        Addr::Tcp { host, port } => redis::ConnectionAddr::TcpTls {
                            host: host.clone(),
                            port: *port,
                            insecure: false,
                            tls_params: None,
                        },
                        Addr::Unix(path) => redis::ConnectionAddr::Unix(path.clone()),
                    };
                    redis::IntoConnectionInfo::into_connection_info(addr)
                })
                .collect::<Result<_, _>>()
                .map_err(|err| unusable(err.to_string()))?;
        }
        if seeds.is_empty() {
            return Err(unusable("at least one seed node is needed".to_owned()));
        }
        let mut builder = ClusterClientBuilder::new(seeds)
            .connection_timeout(connect_timeout)
            .response_timeout(connect_timeout)
            // tollgate resends only what certainly did not run (see the module docs)
            .retries(0);
        let auth = target.auth.clone().or_else(|| {
            target.nodes.first().and_then(|n| {
                n.password.clone().map(|password| Auth {
                    username: n.username.clone(),
                    password,
                })
            })
        });
        if let Some(auth) = auth {
            if let Some(user) = &auth.username {
                builder = builder.username(user);
            }
            builder = builder.password(auth.password);
        }
        let tls = target.tls.is_some() || target.nodes.iter().any(|n| n.tls);
        if tls {
            builder = builder.tls(redis::TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder.certs(certificates);
            }
            if target
                .tls
                .as_ref()
                .is_some_and(|t| t.skip_hostname_verification)
            {
                builder = builder.danger_accept_invalid_hostnames(true);
            }
        }
        let client = builder.build().map_err(|err| unusable(err.to_string()))?;
        let user = target.username();
        let backend = ClusterBackend {
            client: Box::new(client),
            user,
            connection: Arc::default(),
            failures_in_a_row: AtomicU32::new(0),
            scripts: Scripts::new(timeout),
            keys: KeySpace::new(key_prefix),
            timeout,
            failures: FailureLog::default(),
            latency: CallLatency::new(NAME),
        };
        let warm = async {
            let conn = backend
                .connection()
                .await
                .map_err(|failure| (false, failure.error))?;
            check_permissions(conn, &backend.scripts, &backend.keys, &backend.user).await
        };
        let started = std::time::Instant::now();
        let warmed = tokio::time::timeout(connect_timeout, warm).await;
        backend
            .latency
            .record(Operation::LoadScripts, started.elapsed());
        match warmed {
            Ok(Ok(())) => {}
            // A user who may not run the scripts fails every decision: say so now, not later.
            Ok(Err((true, err))) => return Err(err),
            Ok(Err((false, err))) => {
                tracing::warn!("redis cluster is not ready yet ({err}); retrying on each call")
            }
            Err(_) => tracing::warn!(
                "redis cluster did not answer within {connect_timeout:?}; retrying on each call"
            ),
        }
        Ok(backend)
    }

    /// The shared cluster connection, opened on first use. A new one checks first that the user
    /// may run the scripts, and reports a permission failure (kind `noperm`) naming what is
    /// missing if not. Any failure to get it is a connection failure.
    async fn connection(&self) -> Result<ClusterConnection, Failure> {
        self.connection
            .get_or_open(|| {
                let client = self.client.clone();
                let (scripts, keys, user) =
                    (self.scripts.clone(), self.keys.clone(), self.user.clone());
                move || async move {
                    let conn = client
                        .get_async_connection()
                        .await
                        .map_err(|err| backend_error(&err))?;
                    if let Err((true, err)) =
                        check_permissions(conn.clone(), &scripts, &keys, &user).await
                    {
                        Failure::new(FailureKind::NoPerm, err).report(NAME);
                    }
                    Ok(conn)
                }
            })
            .await
            .map_err(|error| Failure::new(FailureKind::Connection, error))
    }

    /// Runs one script call within the deadline, resending it only when the node certainly did
    /// not run it (see the module docs). Failures are counted and logged here (by kind);
    /// `operation` names the call in the latency histogram.
    async fn call<C: Invoke>(&self, call: &C, operation: Operation) -> Result<Value, BackendError> {
        let run = async {
            let conn = self.connection().await?;
            send_once(conn, call)
                .await
                .map_err(|err| Failure::redis(&err))
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, run).await;
        self.latency.record(operation, started.elapsed());
        let result = match outcome {
            Ok(result) => result,
            Err(_) => Err(Failure::new(
                FailureKind::Timeout,
                BackendError::Timeout(self.timeout),
            )),
        };
        match result {
            Ok(value) => {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
                self.failures.success();
                observe::success(NAME);
                Ok(value)
            }
            Err(failure) => {
                if self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1
                    >= REBUILD_AFTER_FAILURES
                {
                    self.failures_in_a_row.store(0, Ordering::Relaxed);
                    self.connection.clear();
                }
                self.failures.failure(&failure.error);
                Err(failure.report(NAME))
            }
        }
    }

    async fn decide(&self, hit: &Hit) -> Result<Outcome, BackendError> {
        let call = self.scripts.acquire(&self.keys, hit)?;
        let reply = self.call(&call, Operation::Acquire).await?;
        call.outcome(hit, reply)
    }

    /// Decides `hits`, some of which are groups ([`Hit::group`]): each group is one call of the
    /// group script on the node owning its slot, every other hit a call of its own, all
    /// concurrently.
    async fn decide_grouped(&self, hits: &[Hit]) -> Results {
        let decided = join_all(group::spans(hits).map(|span| async move {
            let hits = &hits[span];
            let mut results = Vec::with_capacity(hits.len());
            match group::unit(&self.scripts, &self.keys, hits, None) {
                Ok(unit) => {
                    let reply = self.call(&unit, Operation::Acquire).await;
                    unit.outcomes(hits, reply, &mut results);
                }
                Err(err) => results.extend(hits.iter().map(|_| Err(err.clone()))),
            }
            results
        }))
        .await;
        decided.into_iter().flatten().collect()
    }
}

/// Where the next send of a call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Route {
    /// The node that owns the keys' slot, by the client's slot map.
    Slot,
    /// The node a MOVED named.
    Moved(String, u16),
    /// The node an ASK named, after ASKING.
    Ask(String, u16),
}

/// What to do after a send failed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resend {
    /// Never: the call may have run.
    No,
    /// Now, with the script itself (`EVAL`): the node lost its script cache.
    WithScript,
    /// Now, to another node: the call was redirected.
    To(Route),
    /// After a pause, by the slot map: the cluster refused the call for now, or it was never
    /// sent.
    Later,
}

/// Whether a failed send may be repeated: only when the node certainly did not run the call.
fn resend(err: &RedisError) -> Resend {
    let address = || {
        err.redirect_node().and_then(|(address, _slot)| {
            let (host, port) = address.rsplit_once(':')?;
            Some((host.to_owned(), port.parse().ok()?))
        })
    };
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::NoScript) => Resend::WithScript,
        ErrorKind::Server(ServerErrorKind::Moved) => address()
            .map(|(host, port)| Resend::To(Route::Moved(host, port)))
            .unwrap_or(Resend::Later),
        ErrorKind::Server(ServerErrorKind::Ask) => address()
            .map(|(host, port)| Resend::To(Route::Ask(host, port)))
            .unwrap_or(Resend::No),
        // Refused by the node before the script ran.
        ErrorKind::Server(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        ) => Resend::Later,
        // Never written to any connection: the client has none to the node, or making one was
        // refused.
        ErrorKind::ClusterConnectionNotFound => Resend::Later,
        _ if err.is_connection_refusal() => Resend::Later,
        _ => Resend::No,
    }
}

/// Sends `call` until a node answers it or a failure leaves in doubt whether it ran. Each resend
/// is one the node certainly did not run ([`resend`]); the caller's deadline bounds the pauses.
async fn send_once<C: Invoke>(mut conn: ClusterConnection, call: &C) -> Result<Value, RedisError> {
    let mut cmd = call.evalsha();
    let mut route = Route::Slot;
    let mut pause = FIRST_PAUSE;
    let mut sends = 0;
    loop {
        sends += 1;
        let err = match send(&mut conn, &cmd, &route).await {
            Ok(value) => return Ok(value),
            Err(err) => err,
        };
        if sends >= MAX_SENDS {
            return Err(err);
        }
        match resend(&err) {
            Resend::No => return Err(err),
            Resend::WithScript => cmd = call.eval(),
            Resend::To(next) => route = next,
            Resend::Later => {
                tokio::time::sleep(pause).await;
                pause *= 2;
                route = Route::Slot;
            }
        }
    }
}

/// One send of `cmd` along `route`; a server error reply is the send's error.
async fn send(conn: &mut ClusterConnection, cmd: &Cmd, route: &Route) -> Result<Value, RedisError> {
    let by_address = |host: &str, port: u16| SingleNodeRoutingInfo::ByAddress {
        host: host.to_owned(),
        port,
    };
    let reply = match route {
        Route::Slot => cmd.query_async::<Value>(conn).await?,
        Route::Moved(host, port) => {
            conn.route_command(
                cmd.clone(),
                RoutingInfo::SingleNode(by_address(host, *port)),
            )
            .await?
        }
        Route::Ask(host, port) => {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            // The reply to ASKING is skipped: one reply, the call's, is answered.
            let mut replies = conn
                .route_pipeline(pipe, 1, 1, by_address(host, *port))
                .await?;
            replies.pop().unwrap_or(Value::Nil)
        }
    };
    match reply {
        Value::ServerError(err) => Err(err.into()),
        reply => Ok(reply),
    }
}

/// The first error a node answered within a reply gathered from several nodes.
fn server_error_in(reply: Value) -> Option<RedisError> {
    match reply {
        Value::ServerError(err) => Some(err.into()),
        Value::Array(items) | Value::Set(items) => items.into_iter().find_map(server_error_in),
        Value::Map(pairs) => pairs
            .into_iter()
            .find_map(|(key, value)| server_error_in(key).or_else(|| server_error_in(value))),
        _ => None,
    }
}

/// Loads the scripts on every master and runs a harmless one (see the single-server backend);
/// `Err((true, _))` when the user may not run them, `Err((false, _))` when the check could not
/// be made.
async fn check_permissions(
    mut conn: ClusterConnection,
    scripts: &Scripts,
    keys: &KeySpace,
    user: &str,
) -> Result<(), (bool, BackendError)> {
    let rule = permissions::acl_rule(keys.prefix(), true);
    let classify = |err: RedisError| match permission_error(&err, user, &rule) {
        Some(refused) => (true, refused),
        None => (false, backend_error(&err)),
    };
    for cmd in scripts.load_commands() {
        let routing = RoutingInfo::MultiNode((
            redis::cluster_routing::MultipleNodeRoutingInfo::AllMasters,
            Some(redis::cluster_routing::ResponsePolicy::AllSucceeded),
        ));
        let reply = conn.route_command(cmd, routing).await.map_err(classify)?;
        if let Some(err) = server_error_in(reply) {
            return Err(classify(err));
        }
    }
    let probed = send_once(conn.clone(), &scripts.probe(keys))
        .await
        .map(drop);
    permissions::check_inside(&mut conn, keys, user, &rule, probed).await
}

/// Shards get hash tags steered to different parts of the slot space, so one hot limit's
/// shards land on different slots and masters (see [`KeySpace::shard_identity`]).
impl ShardKeys for ClusterBackend {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.keys.shard_identity(key, shard, shards)
    }
}

impl Backend for ClusterBackend {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        if hits.iter().any(|hit| hit.group != 0) {
            // Boxed: only a request with a descriptor's limits decided together takes this way,
            // and its future would otherwise widen the state of every decision.
            return Box::pin(self.decide_grouped(hits)).await;
        }
        join_all(hits.iter().map(|hit| self.decide(hit))).await
    }

    /// A group is one script call when all its keys are in one slot (its limits carry the
    /// descriptor's hash tag, [`Hit::descriptor_tag`]).
    fn joint(&self, group: &[Hit]) -> bool {
        group::one_slot(&self.keys, group)
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        let calls: Vec<Call<'_>> = receipts.iter().map(|r| self.scripts.refund(r)).collect();
        let results = join_all(calls.iter().map(|call| self.call(call, Operation::Release))).await;
        count_late_refunds(&results);
        results.into_iter().try_for_each(|result| result.map(drop))
    }

    /// Each window is read on the node of its slot, all concurrently.
    async fn peek(&self, hits: &[Hit]) -> Peeked {
        join_all(hits.iter().map(|hit| async move {
            let call = self.scripts.peek(&self.keys, hit)?;
            let reply = self.call(&call, Operation::Acquire).await?;
            inspect::window_state(hit, reply)
        }))
        .await
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        join_all(hits.iter().map(|hit| async move {
            let call = self.scripts.clear(&self.keys, hit);
            let reply = self.call(&call, Operation::Release).await?;
            inspect::cleared(hit, reply)
        }))
        .await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let ping = async {
            let mut conn = self.connection().await?;
            redis::cmd("PING")
                .query_async::<Value>(&mut conn)
                .await
                .map(drop)
                .map_err(|err| Failure::redis(&err))
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, ping).await;
        self.latency.record(Operation::Ping, started.elapsed());
        // A ping that answers ends no failure burst: PING works while scripts fail.
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(failure)) => Err(failure.report(NAME)),
            Err(_) => Err(
                Failure::new(FailureKind::Timeout, BackendError::Timeout(self.timeout))
                    .report(NAME),
            ),
        }
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.failures.sustained()
    }
}
