//! The `redis-cluster` backend: a Redis Cluster reached from seed nodes.
//!
//! The `redis` crate's async cluster client keeps one connection per node, routes each script call
//! to the node owning its keys' slot, follows MOVED/ASK and refreshes the slot map after a
//! failover. Every limiter's keys share a hash tag, so each hit is one script call on one node; the
//! calls of one request run concurrently, each with its own deadline, so a slow node fails only
//! the hits it owns.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use redis::Value;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;

use super::connect::{Addr, Auth, Kind, Target};
use super::keys::KeySpace;
use super::scripts::{Call, Scripts};
use super::{Failure, Reconnecting, backend_error, is_noscript};
use crate::backend::observe::{self, FailureKind};
use crate::backend::{Backend, BackendError, Hit, Outcome, Receipt, ShardKeys};

/// The least time given to opening connections and loading the slot map, whatever the per-call
/// deadline (the connection outlives the call that opened it).
const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const NAME: &str = "redis-cluster";
/// Consecutive failed calls after which the cluster connection is rebuilt from the seeds, in
/// case the client's own reconnection cannot find its way back (say, every node was replaced).
const REBUILD_AFTER_FAILURES: u32 = 100;

/// Sliding windows in a Redis Cluster, shared by every tollgate instance that uses it.
pub struct ClusterBackend {
    client: Box<ClusterClient>,
    connection: Arc<Reconnecting<ClusterConnection>>,
    failures_in_a_row: AtomicU32,
    scripts: Scripts,
    keys: KeySpace,
    timeout: Duration,
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
            .response_timeout(connect_timeout);
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
        let backend = ClusterBackend {
            client: Box::new(client),
            connection: Arc::default(),
            failures_in_a_row: AtomicU32::new(0),
            scripts: Scripts::default(),
            keys: KeySpace::new(key_prefix),
            timeout,
        };
        let warm = async {
            let mut conn = backend.connection().await.map_err(|f| f.error)?;
            for cmd in backend.scripts.load_commands() {
                cmd.query_async::<Value>(&mut conn)
                    .await
                    .map_err(|err| backend_error(&err))?;
            }
            Ok::<(), BackendError>(())
        };
        match tokio::time::timeout(connect_timeout, warm).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                tracing::warn!("redis cluster is not ready yet ({err}); retrying on each call")
            }
            Err(_) => tracing::warn!(
                "redis cluster did not answer within {connect_timeout:?}; retrying on each call"
            ),
        }
        Ok(backend)
    }

    /// The shared cluster connection, opened on first use. Any failure to get it is a
    /// connection failure.
    async fn connection(&self) -> Result<ClusterConnection, Failure> {
        let client = self.client.clone();
        self.connection
            .get_or_open(move || async move {
                client
                    .get_async_connection()
                    .await
                    .map_err(|err| backend_error(&err))
            })
            .await
            .map_err(|error| Failure::new(FailureKind::Connection, error))
    }

    /// Runs one script call within the deadline; on NOSCRIPT (a node restarted, failed over or
    /// flushed its scripts) sends the script along, which caches it on that node again.
    /// Failures are counted and logged here (by kind); `operation` names the call in the
    /// latency histogram.
    async fn call(&self, call: &Call<'_>, operation: &'static str) -> Result<Value, BackendError> {
        let run = async {
            let mut conn = self.connection().await?;
            match call.evalsha().query_async::<Value>(&mut conn).await {
                Ok(value) => Ok(value),
                Err(err) if is_noscript(&err) => call
                    .eval()
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(|err| Failure::redis(&err)),
                Err(err) => Err(Failure::redis(&err)),
            }
        };
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(self.timeout, run).await;
        observe::call(NAME, operation, started.elapsed());
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
                Err(failure.report(NAME))
            }
        }
    }

    async fn decide(&self, hit: &Hit) -> Result<Outcome, BackendError> {
        let call = self.scripts.acquire(&self.keys, hit)?;
        let reply = self.call(&call, "acquire").await?;
        call.outcome(hit, reply)
    }
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
        join_all(hits.iter().map(|hit| self.decide(hit))).await
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        let calls: Vec<Call<'_>> = receipts.iter().map(|r| self.scripts.refund(r)).collect();
        let results = join_all(calls.iter().map(|call| self.call(call, "release"))).await;
        results.into_iter().try_for_each(|result| result.map(drop))
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
        observe::call(NAME, "ping", started.elapsed());
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
}
