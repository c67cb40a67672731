//! The `redis` backend: one Redis server (`redis://` or `rediss://`, optional user and password,
//! TLS with client certificates, a unix socket), or the master that Redis Sentinel names.
//!
//! Connections come from a deadpool pool ([`super::connect::Pool`]). Each is a multiplexed
//! connection that many requests share at once, so the backend keeps them checked out ("lanes",
//! one unless the target asks for more) and spreads calls over them: a pool checkout costs a PING
//! round trip (deadpool's health check), and paying it per request would double the cost of a
//! decision. A lane whose connection breaks gives it back to the pool, which health-checks or
//! replaces it. All hits of one request go in one pipeline, one round
//! trip, each hit its algorithm's script call of its own, but for the limits of one descriptor
//! decided together ([`Hit::group`]), which are one call of the group script.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use deadpool::Runtime;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, RedisError, RedisResult, Value};

use super::connect::{Kind, Manager, Pool, Pooled, Target};
use super::keys::KeySpace;
use super::permissions;
use super::scripts::{Call, Invoke, Scripts, count_late_refunds};
use super::{Failure, FailureLog, Reconnecting, backend_error};
use super::{group, inspect};
use crate::backend::observe::{self, CallLatency, FailureKind, Operation};
use crate::backend::{
    Backend, BackendError, Cleared, Hit, Outcome, Peeked, Receipt, Results, ShardKeys,
    SustainedFailure,
};

/// Shared connections kept checked out of the pool, unless the target says otherwise. One: every
/// call in flight shares it, so commands and replies move in the largest batches, the fewest
/// system calls per decision on both sides; more connections only split those batches (the
/// `connections` benchmark measures fewer decisions a second and more CPU per decision, in
/// tollgate and in Redis, with every connection added). A single Redis server runs one command at
/// a time, so one connection's reader is not what bounds it.
const LANES: usize = 1;
/// Consecutive timeouts after which a lane's connection is presumed stuck and replaced.
const STUCK_AFTER_TIMEOUTS: u32 = 3;
/// The least time given to opening a connection, whatever the per-call deadline: a connection
/// outlives the call that needed it, so a short deadline must not prevent ever connecting.
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const NAME: &str = "redis";

/// Sliding windows in one Redis server, shared by every tollgate instance that uses it.
pub struct RedisBackend {
    pool: Pool,
    /// The Redis user tollgate logs in as, for permission errors (`default` without one).
    user: String,
    lanes: Box<[Lane]>,
    next_lane: AtomicUsize,
    scripts: Scripts,
    keys: KeySpace,
    timeout: Duration,
    /// Since when every call has failed, for health (logging is `observe`'s).
    failures: FailureLog,
    /// Its calls' latency histograms.
    latency: CallLatency,
    /// Replicas that must acknowledge a decision's writes before it counts (0: none).
    wait_replicas: u32,
}

impl std::fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBackend")
            .field("keys", &self.keys)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// One shared connection slot.
#[derive(Default)]
struct Lane {
    /// A pooled connection, held out of the pool while the lane uses it.
    connection: Arc<Reconnecting<Arc<Pooled>>>,
    timeouts: AtomicU32,
}

impl RedisBackend {
    /// A backend on the server at `url` (`redis://[user:password@]host:port[/db]`, or `rediss://`
    /// for TLS), with every key starting with `key_prefix` and every call bounded by `timeout`.
    /// Fails only on an unusable URL: a server that is down now is retried on each call, so
    /// tollgate can start before Redis does. The scripts are loaded into the server when it
    /// answers.
    pub async fn connect(
        url: &str,
        key_prefix: &str,
        timeout: Duration,
    ) -> Result<RedisBackend, BackendError> {
        let target = Target::parse(Kind::Single, url, None)
            .map_err(|err| BackendError::Unavailable(format!("redis url: {err}")))?;
        RedisBackend::connect_to(&target, key_prefix, timeout, 0).await
    }

    /// A backend on `target`, one server or the master its sentinels name, with every key
    /// starting with `key_prefix` and every call bounded by `timeout`. With `wait_replicas` > 0 a
    /// decision counts only once that many replicas acknowledged its writes (`WAIT`), so that a
    /// failover cannot lose an admitted hit; otherwise each limit answers its failure mode. Fails
    /// only on an unusable target (an address, a certificate file): a server that is down now is
    /// retried on each call, so tollgate can start before Redis does.
    pub async fn connect_to(
        target: &Target,
        key_prefix: &str,
        timeout: Duration,
        wait_replicas: u32,
    ) -> Result<RedisBackend, BackendError> {
        let connect_timeout = target
            .connect_timeout
            .unwrap_or_else(|| timeout.max(MIN_CONNECT_TIMEOUT));
        let connector = target
            .connector()
            .map_err(|err| BackendError::Unavailable(format!("redis: {err}")))?;
        let user = target.username();
        let lanes = target.pool_size.filter(|n| *n > 0).unwrap_or(LANES);
        let pool = Pool::builder(Manager::new(connector, connect_timeout))
            .max_size(lanes * 2)
            .wait_timeout(Some(connect_timeout))
            .create_timeout(Some(connect_timeout))
            .recycle_timeout(Some(connect_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|err| BackendError::Unavailable(format!("redis pool: {err}")))?;
        let backend = RedisBackend {
            pool,
            user,
            lanes: (0..lanes).map(|_| Lane::default()).collect(),
            next_lane: AtomicUsize::new(0),
            scripts: Scripts::new(timeout),
            keys: KeySpace::new(key_prefix),
            timeout,
            failures: FailureLog::default(),
            latency: CallLatency::new(NAME),
            wait_replicas,
        };
        match backend.load_scripts(connect_timeout).await {
            Ok(()) => {
                // Every lane opens (and checks) its connection now rather than on the first
                // calls that reach it.
                for _ in 1..backend.lanes.len() {
                    let opened = tokio::time::timeout(connect_timeout, backend.connection()).await;
                    if !matches!(opened, Ok(Ok(_))) {
                        break;
                    }
                }
            }
            // A user who may not run the scripts fails every decision: say so now, not later.
            Err(Checked::Refused(err)) => return Err(err),
            Err(Checked::Failed(err)) => {
                tracing::warn!(
                    "redis at {} is not reachable yet ({err}); retrying on each call",
                    target.describe()
                );
            }
        }
        Ok(backend)
    }

    /// Decides `hits` as if the server's clock read `now_ms`: the same scripts and keys as
    /// [`Backend::acquire`], for tests that hold the scripts to the window math at chosen instants.
    pub async fn acquire_at(
        &self,
        hits: &[Hit],
        now_ms: u64,
    ) -> Vec<Result<Outcome, BackendError>> {
        self.decide(hits, Some(now_ms)).await
    }

    /// Gives back `receipts` as if the server's clock read `now_ms`, for tests that decide at
    /// chosen instants ([`RedisBackend::acquire_at`]): a refund's horizon is on the clock the
    /// charge was decided by.
    pub async fn release_at(&self, receipts: &[Receipt], now_ms: u64) -> Result<(), BackendError> {
        self.refund(receipts, Some(now_ms)).await
    }

    /// Reads `hits`' windows as if the server's clock read `now_ms` (tests), else by its own.
    pub async fn peek_at(&self, hits: &[Hit], now_ms: Option<u64>) -> Peeked {
        let calls = hits
            .iter()
            .map(|hit| {
                let call = self.scripts.peek(&self.keys, hit)?;
                Ok(match now_ms {
                    Some(now) => call.at(now),
                    None => call,
                })
            })
            .collect();
        self.each(hits, calls, false, inspect::window_state).await
    }

    /// Sends each call that could be made (one per hit, in one pipeline) and reads its reply
    /// with `read`; a call that could not be made answers its error.
    async fn each<T>(
        &self,
        hits: &[Hit],
        calls: Vec<Result<Call<'_>, BackendError>>,
        durable: bool,
        read: fn(&Hit, Value) -> Result<T, BackendError>,
    ) -> Vec<Result<T, BackendError>> {
        let mut results: Vec<Option<Result<T, BackendError>>> =
            (0..hits.len()).map(|_| None).collect();
        let mut at = Vec::with_capacity(calls.len());
        let mut sent = Vec::with_capacity(calls.len());
        for (index, call) in calls.into_iter().enumerate() {
            match call {
                Ok(call) => {
                    at.push(index);
                    sent.push(call);
                }
                Err(err) => results[index] = Some(Err(err)),
            }
        }
        if !sent.is_empty() {
            let operation = if durable {
                Operation::Release
            } else {
                Operation::Acquire
            };
            match self.run(&sent, durable, operation).await {
                Ok(replies) => {
                    for (index, reply) in at.into_iter().zip(replies) {
                        results[index] = Some(
                            call_result(reply)
                                .map_err(|err| Failure::redis(&err).report(NAME))
                                .and_then(|value| read(&hits[index], value)),
                        );
                    }
                }
                Err(err) => {
                    for index in at {
                        results[index] = Some(Err(err.clone()));
                    }
                }
            }
        }
        let results: Vec<Result<T, BackendError>> = results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(BackendError::Protocol(
                        "a script call went unanswered".into(),
                    ))
                })
            })
            .collect();
        self.record(&results);
        results
    }

    async fn refund(&self, receipts: &[Receipt], now_ms: Option<u64>) -> Result<(), BackendError> {
        if receipts.is_empty() {
            return Ok(());
        }
        let calls: Vec<Call<'_>> = receipts
            .iter()
            .map(|r| {
                let call = self.scripts.refund(r);
                match now_ms {
                    Some(now) => call.at(now),
                    None => call,
                }
            })
            .collect();
        let results: Vec<Result<Value, BackendError>> = match self
            .run(&calls, false, Operation::Release)
            .await
        {
            Ok(replies) => replies
                .into_iter()
                .map(|reply| call_result(reply).map_err(|err| Failure::redis(&err).report(NAME)))
                .collect(),
            Err(err) => vec![Err(err)],
        };
        self.record(&results);
        count_late_refunds(&results);
        results.into_iter().try_for_each(|result| result.map(drop))
    }

    /// Loads every script into the server's cache, so that the first calls find them, and
    /// checks that the user may run them.
    async fn load_scripts(&self, within: Duration) -> Result<(), Checked> {
        let load = async {
            let (_, mut conn) = self
                .connection()
                .await
                .map_err(|failure| Checked::Failed(failure.error))?;
            check_permissions(&mut conn, &self.scripts, &self.keys, &self.user).await
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(within, load).await;
        self.latency
            .record(Operation::LoadScripts, started.elapsed());
        outcome.unwrap_or(Err(Checked::Failed(BackendError::Timeout(within))))
    }

    async fn decide(
        &self,
        hits: &[Hit],
        now_ms: Option<u64>,
    ) -> Vec<Result<Outcome, BackendError>> {
        if hits.iter().any(|hit| hit.group != 0) {
            // Boxed: only a request with a descriptor's limits decided together takes this way,
            // and its future would otherwise widen the state of every decision.
            return Box::pin(self.decide_grouped(hits, now_ms)).await;
        }
        let mut calls = Vec::with_capacity(hits.len());
        // Hits that cannot become a call (a window out of range), by position; rare, so this
        // usually stays empty and never allocates.
        let mut refused = Vec::new();
        for (index, hit) in hits.iter().enumerate() {
            match self.scripts.acquire(&self.keys, hit) {
                Ok(call) => calls.push(match now_ms {
                    Some(now) => call.at(now),
                    None => call,
                }),
                Err(err) => refused.push((index, err)),
            }
        }
        // A request's limits all live on this one server: their calls go in one pipeline, one
        // round trip, each call deciding its limit on its own. One call running them all
        // (a batch script) was measured against this and cost Redis more per limit: its own Lua
        // for each hit outweighs the command it saves once calls arrive pipelined.
        let mut replies = if calls.is_empty() {
            Ok(Vec::new().into_iter())
        } else {
            self.run(&calls, true, Operation::Acquire)
                .await
                .map(Vec::into_iter)
        };
        let mut calls = calls.into_iter();
        let mut refused = refused.into_iter().peekable();
        let results: Vec<Result<Outcome, BackendError>> = hits
            .iter()
            .enumerate()
            .map(|(index, hit)| {
                if let Some((_, err)) = refused.next_if(|(at, _)| *at == index) {
                    return Err(err);
                }
                let call = calls.next();
                match &mut replies {
                    Ok(replies) => match (call, replies.next()) {
                        (Some(call), Some(reply)) => call_result(reply)
                            .map_err(|err| Failure::redis(&err).report(NAME))
                            .and_then(|value| call.outcome(hit, value)),
                        // `pipeline` answers exactly one reply per call.
                        _ => Err(BackendError::Protocol(
                            "a script call went unanswered".into(),
                        )),
                    },
                    Err(err) => Err(err.clone()),
                }
            })
            .collect();
        self.record(&results);
        results
    }

    /// Decides `hits`, some of which are groups ([`Hit::group`]): each group is one call of the
    /// group script, every other hit a call of its own, all in one pipeline as
    /// [`RedisBackend::decide`] sends them.
    async fn decide_grouped(&self, hits: &[Hit], now_ms: Option<u64>) -> Results {
        let mut units = Vec::new();
        // Each span of hits, and why it cannot be decided when a hit of it cannot become a call.
        let mut spans = Vec::new();
        for span in group::spans(hits) {
            match group::unit(&self.scripts, &self.keys, &hits[span.clone()], now_ms) {
                Ok(unit) => {
                    units.push(unit);
                    spans.push((span, None));
                }
                Err(err) => spans.push((span, Some(err))),
            }
        }
        let replies = if units.is_empty() {
            Ok(Vec::new())
        } else {
            self.run(&units, true, Operation::Acquire).await
        };
        let mut results = Vec::with_capacity(hits.len());
        let mut answered = match replies {
            Ok(replies) => Ok(units.into_iter().zip(replies)),
            Err(err) => Err(err),
        };
        for (span, refused) in spans {
            let hits = &hits[span];
            if let Some(err) = refused {
                results.extend(hits.iter().map(|_| Err(err.clone())));
                continue;
            }
            match &mut answered {
                Ok(pairs) => match pairs.next() {
                    Some((unit, reply)) => {
                        let reply =
                            call_result(reply).map_err(|err| Failure::redis(&err).report(NAME));
                        unit.outcomes(hits, reply, &mut results);
                    }
                    // `pipeline` answers exactly one reply per call.
                    None => results.extend(hits.iter().map(|_| {
                        Err(BackendError::Protocol(
                            "a script call went unanswered".into(),
                        ))
                    })),
                },
                Err(err) => results.extend(hits.iter().map(|_| Err(err.clone()))),
            }
        }
        self.record(&results);
        results
    }

    /// Counts a batch of answers for the sustained-failure tracking (health): any failed call (a
    /// script the server refused, say out of memory, as much as a connection that broke) is a
    /// failure, so a server that answers pings but runs no script does not pass for a healthy
    /// one. Only a batch without any failure ends a failure burst in the log too: a ping or one
    /// hit that went through says nothing about the calls that keep failing. (Each failure was
    /// counted and logged by kind where it happened.)
    fn record<T>(&self, results: &[Result<T, BackendError>]) {
        match results.iter().find_map(|result| result.as_ref().err()) {
            Some(err) => self.failures.failure(err),
            None if !results.is_empty() => {
                self.failures.success();
                observe::success(NAME);
            }
            None => {}
        }
    }

    /// Runs `calls` within the deadline, answering one reply per call (see [`call_result`]).
    /// `durable`: the calls admit hits, so with `wait_replicas` their writes must reach the
    /// replicas before they count.
    /// Failures are counted and logged here (by kind); `operation` names the call in the latency
    /// histogram.
    async fn run<C: Invoke>(
        &self,
        calls: &[C],
        durable: bool,
        operation: Operation,
    ) -> Result<Vec<Value>, BackendError> {
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, self.pipeline(calls, durable)).await;
        self.latency.record(operation, started.elapsed());
        match outcome {
            Ok(Ok(replies)) => Ok(replies),
            Ok(Err(failure)) => Err(failure.report(NAME)),
            Err(_) => Err(
                Failure::new(FailureKind::Timeout, BackendError::Timeout(self.timeout))
                    .report(NAME),
            ),
        }
    }

    /// `WAIT <replicas> <ms>` when decisions must be replicated: it answers how many replicas
    /// acknowledged every write sent on the connection so far. Its timeout leaves half the
    /// deadline, so a lagging replica turns into a failure answer, not a missed deadline.
    fn wait_command(&self, durable: bool) -> Option<Cmd> {
        if !durable || self.wait_replicas == 0 {
            return None;
        }
        let millis = (self.timeout.as_millis() / 2).clamp(1, u128::from(u32::MAX));
        let mut wait = redis::cmd("WAIT");
        wait.arg(self.wait_replicas).arg(millis.to_string());
        Some(wait)
    }

    /// Sends `calls` in one round trip: one command alone, several as a pipeline (followed by a
    /// `WAIT` when the writes must be replicated).
    async fn pipeline<C: Invoke>(&self, calls: &[C], durable: bool) -> Result<Vec<Value>, Failure> {
        let (lane, mut conn) = self.connection().await?;
        let timed = LaneGuard {
            lane: &self.lanes[lane],
        };
        let wait = self.wait_command(durable);
        let sent = match &wait {
            None => send(&mut conn, calls.iter().map(C::evalsha)).await,
            Some(wait) => {
                let commands: Vec<Cmd> = calls
                    .iter()
                    .map(C::evalsha)
                    .chain(std::iter::once(wait.clone()))
                    .collect();
                send(&mut conn, commands.into_iter()).await
            }
        };
        let mut replies = match sent {
            Ok(replies) => replies,
            Err(err) => return Err(self.broken(lane, &err)),
        };
        let mut acknowledged = match &wait {
            Some(_) => replies.pop(),
            None => None,
        };
        if replies.len() != calls.len() {
            return Err(Failure::new(
                FailureKind::Other,
                BackendError::Protocol(format!(
                    "pipeline of {} calls answered {} replies",
                    calls.len(),
                    replies.len()
                )),
            ));
        }
        if replies.iter().any(is_read_only) {
            // The server turned replica (a failover): this connection can never write again.
            self.lanes[lane].discard();
            return Err(read_only());
        }
        // The server lost its script cache (restart, SCRIPT FLUSH): send those scripts along,
        // which caches them again. Calls that hit NOSCRIPT did not run, so resending is safe.
        let missing: Vec<usize> = (0..calls.len())
            .filter(|&i| {
                matches!(&replies[i], Value::ServerError(err)
                    if err.kind() == Some(redis::ServerErrorKind::NoScript))
            })
            .collect();
        if !missing.is_empty() {
            let retry: Vec<Cmd> = missing
                .iter()
                .map(|&i| calls[i].eval())
                .chain(wait.clone())
                .collect();
            let mut again = match send(&mut conn, retry.into_iter()).await {
                Ok(again) => again,
                Err(err) => return Err(self.broken(lane, &err)),
            };
            if wait.is_some() {
                acknowledged = again.pop();
            }
            if again.iter().any(is_read_only) {
                self.lanes[lane].discard();
                return Err(read_only());
            }
            for (i, reply) in missing.into_iter().zip(again) {
                replies[i] = reply;
            }
        }
        if wait.is_some() {
            let replicas = match acknowledged {
                Some(Value::Int(n)) => n,
                other => {
                    return Err(Failure::new(
                        FailureKind::Other,
                        BackendError::Protocol(format!(
                            "WAIT answered {other:?} instead of a replica count"
                        )),
                    ));
                }
            };
            if replicas < i64::from(self.wait_replicas) {
                // The hits were recorded on this server but may not survive a failover, so they
                // are not counted as admitted: each limit answers its failure mode instead.
                timed.answered();
                return Err(Failure::new(
                    FailureKind::Other,
                    BackendError::Unavailable(format!(
                        "{replicas} of {} replicas acknowledged the decision in time",
                        self.wait_replicas
                    )),
                ));
            }
        }
        timed.answered();
        Ok(replies)
    }

    /// A connection to send on: a lane's shared connection, refilled from the pool when empty.
    /// A refilled lane checks first that the user may still run the scripts (an ACL can change
    /// while tollgate runs), and reports a permission failure (kind `noperm`) naming what is
    /// missing if not. Any failure to get a connection is a connection failure.
    async fn connection(&self) -> Result<(usize, MultiplexedConnection), Failure> {
        let index = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let pooled = self.lanes[index]
            .connection
            .get_or_open(|| {
                let pool = self.pool.clone();
                let (scripts, keys, user) =
                    (self.scripts.clone(), self.keys.clone(), self.user.clone());
                move || async move {
                    match pool.get().await {
                        Ok(pooled) => {
                            let mut conn = MultiplexedConnection::clone(&pooled);
                            if let Err(Checked::Refused(err)) =
                                check_permissions(&mut conn, &scripts, &keys, &user).await
                            {
                                Failure::new(FailureKind::NoPerm, err).report(NAME);
                            }
                            Ok(Arc::new(pooled))
                        }
                        Err(deadpool::managed::PoolError::Backend(err)) => Err(backend_error(&err)),
                        Err(other) => Err(BackendError::Unavailable(format!(
                            "redis connection: {other}"
                        ))),
                    }
                }
            })
            .await
            .map_err(|error| Failure::new(FailureKind::Connection, error))?;
        Ok((index, MultiplexedConnection::clone(&pooled)))
    }

    /// Classifies a failed round trip; a connection that broke leaves its lane.
    fn broken(&self, lane: usize, err: &RedisError) -> Failure {
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_connection_refusal()
            || err.is_unrecoverable_error()
            || err.is_timeout()
        {
            self.lanes[lane].discard();
        }
        Failure::redis(err)
    }
}

/// What a permission check found wrong.
#[derive(Debug)]
enum Checked {
    /// The user may not run what tollgate needs: every decision would fail.
    Refused(BackendError),
    /// The check itself could not be made (the server is down, slow or loading).
    Failed(BackendError),
}

/// Loads the scripts (`SCRIPT LOAD`), runs every command the scripts run on keys of its own
/// (`lua/permissions.lua`) and a harmless script call (`EVALSHA` of a check-only decision on a
/// key of its own), which is what every decision needs the user to be allowed: the commands, the
/// commands inside the scripts and the key prefix.
async fn check_permissions(
    conn: &mut MultiplexedConnection,
    scripts: &Scripts,
    keys: &KeySpace,
    user: &str,
) -> Result<(), Checked> {
    let rule = permissions::acl_rule(keys.prefix(), false);
    let classify = |err: RedisError| match super::permission_error(&err, user, &rule) {
        Some(refused) => Checked::Refused(refused),
        None => Checked::Failed(backend_error(&err)),
    };
    for cmd in scripts.load_commands() {
        cmd.query_async::<Value>(conn).await.map_err(classify)?;
    }
    let probed = match scripts
        .probe(keys)
        .evalsha()
        .query_async::<Value>(conn)
        .await
    {
        Ok(reply) => call_result(reply).map(drop),
        Err(err) => Err(err),
    };
    permissions::check_inside(conn, keys, user, &rule, probed)
        .await
        .map_err(|(refused, err)| {
            if refused {
                Checked::Refused(err)
            } else {
                Checked::Failed(err)
            }
        })
}

/// Sends `commands` in one round trip and answers their replies in order: a command alone goes
/// as itself, several as a pipeline. A command the server refused answers a server error value
/// (see [`call_result`]); only a failed round trip is an error.
async fn send(
    conn: &mut MultiplexedConnection,
    mut commands: impl ExactSizeIterator<Item = Cmd>,
) -> RedisResult<Vec<Value>> {
    if commands.len() == 1
        && let Some(command) = commands.next()
    {
        return conn
            .send_packed_command(&command)
            .await
            .map(|reply| vec![reply]);
    }
    let mut pipe = redis::Pipeline::with_capacity(commands.len());
    for command in commands {
        pipe.add_command(command);
    }
    conn.send_packed_commands(&pipe, 0, pipe.len()).await
}

/// The failure of a write refused by a server that is a replica now.
fn read_only() -> Failure {
    Failure::new(
        FailureKind::ReadOnly,
        BackendError::Unavailable(
            "redis answered READONLY: the server is a replica now (failover)".into(),
        ),
    )
}

/// Whether a reply is the error a replica gives to writes.
fn is_read_only(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.kind() == Some(redis::ServerErrorKind::ReadOnly))
}

/// One call's result from its reply: a server error (the script failed, NOSCRIPT) is the call's
/// error.
fn call_result(reply: Value) -> RedisResult<Value> {
    match reply {
        Value::ServerError(err) => Err(err.into()),
        reply => Ok(reply),
    }
}

impl Lane {
    /// Gives the connection back to the pool, which health-checks it before handing it out again.
    fn discard(&self) {
        self.connection.clear();
        self.timeouts.store(0, Ordering::Relaxed);
    }
}

/// Counts a call on a lane as timed out unless it reports an answer; a lane whose calls keep
/// timing out has its connection replaced (it may be half-open).
struct LaneGuard<'a> {
    lane: &'a Lane,
}

impl LaneGuard<'_> {
    fn answered(self) {
        self.lane.timeouts.store(0, Ordering::Relaxed);
        std::mem::forget(self);
    }
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if self.lane.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= STUCK_AFTER_TIMEOUTS {
            self.lane.discard();
        }
    }
}

/// The same shard identities as the cluster backend: placement does not matter on one server,
/// and the same keys keep data and tooling alike across the two (see
/// [`KeySpace::shard_identity`]).
impl ShardKeys for RedisBackend {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.keys.shard_identity(key, shard, shards)
    }
}

impl Backend for RedisBackend {
    async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
        self.decide(hits, None).await
    }

    /// One server holds every key: any group is one script call.
    fn joint(&self, group: &[Hit]) -> bool {
        let _ = group;
        true
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.refund(receipts, None).await
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        self.peek_at(hits, None).await
    }

    /// Deletes are replicated as decisions are (`WAIT` under `--redis-wait-replicas`).
    async fn clear(&self, hits: &[Hit]) -> Cleared {
        let calls = hits
            .iter()
            .map(|hit| Ok(self.scripts.clear(&self.keys, hit)))
            .collect();
        self.each(hits, calls, true, inspect::cleared).await
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let ping = async {
            let (lane, mut conn) = self.connection().await?;
            match redis::cmd("PING").query_async::<String>(&mut conn).await {
                Ok(_) => Ok(()),
                Err(err) => Err(self.broken(lane, &err)),
            }
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, ping).await;
        self.latency.record(Operation::Ping, started.elapsed());
        // A ping that answers ends no failure burst: PING works while scripts fail (OOM,
        // NOPERM), and the bursts are about the calls that decide.
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
