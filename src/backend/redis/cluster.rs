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

use super::keys::KeySpace;
use super::scripts::{Call, Scripts};
use super::{FailureLog, Reconnecting, backend_error, is_noscript};
use crate::backend::{Backend, BackendError, Hit, Outcome, Receipt, ShardKeys, SustainedFailure};

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
    failures: FailureLog,
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
        if seed_urls.is_empty() {
            return Err(BackendError::Unavailable(
                "redis-cluster needs at least one seed URL".to_owned(),
            ));
        }
        let connect_timeout = timeout.max(MIN_CONNECT_TIMEOUT);
        let client = ClusterClientBuilder::new(seed_urls.iter().map(String::as_str))
            .connection_timeout(connect_timeout)
            .response_timeout(connect_timeout)
            .build()
            .map_err(|err| {
                BackendError::Unavailable(format!("redis cluster urls {seed_urls:?}: {err}"))
            })?;
        let backend = ClusterBackend {
            client: Box::new(client),
            connection: Arc::default(),
            failures_in_a_row: AtomicU32::new(0),
            scripts: Scripts::default(),
            keys: KeySpace::new(key_prefix),
            timeout,
            failures: FailureLog::default(),
        };
        let warm = async {
            let mut conn = backend.connection().await?;
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

    /// The shared cluster connection, opened on first use.
    async fn connection(&self) -> Result<ClusterConnection, BackendError> {
        let client = self.client.clone();
        self.connection
            .get_or_open(move || async move {
                client
                    .get_async_connection()
                    .await
                    .map_err(|err| backend_error(&err))
            })
            .await
    }

    /// Runs one script call within the deadline; on NOSCRIPT (a node restarted, failed over or
    /// flushed its scripts) sends the script along, which caches it on that node again.
    async fn call(&self, call: &Call<'_>) -> Result<Value, BackendError> {
        let run = async {
            let mut conn = self.connection().await?;
            match call.evalsha().query_async::<Value>(&mut conn).await {
                Ok(value) => Ok(value),
                Err(err) if is_noscript(&err) => call
                    .eval()
                    .query_async::<Value>(&mut conn)
                    .await
                    .map_err(|err| backend_error(&err)),
                Err(err) => Err(backend_error(&err)),
            }
        };
        let result = tokio::time::timeout(self.timeout, run)
            .await
            .unwrap_or(Err(BackendError::Timeout(self.timeout)));
        match &result {
            Ok(_) => {
                self.failures_in_a_row.store(0, Ordering::Relaxed);
                self.failures.success(NAME);
            }
            Err(err) => {
                if self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1
                    >= REBUILD_AFTER_FAILURES
                {
                    self.failures_in_a_row.store(0, Ordering::Relaxed);
                    self.connection.clear();
                }
                self.failures.failure(NAME, err);
            }
        }
        result
    }

    async fn decide(&self, hit: &Hit) -> Result<Outcome, BackendError> {
        let call = self.scripts.acquire(&self.keys, hit)?;
        let reply = self.call(&call).await?;
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
        let results = join_all(calls.iter().map(|call| self.call(call))).await;
        results.into_iter().try_for_each(|result| result.map(drop))
    }

    async fn ping(&self) -> Result<(), BackendError> {
        let ping = async {
            let mut conn = self.connection().await?;
            redis::cmd("PING")
                .query_async::<Value>(&mut conn)
                .await
                .map(drop)
                .map_err(|err| backend_error(&err))
        };
        tokio::time::timeout(self.timeout, ping)
            .await
            .unwrap_or(Err(BackendError::Timeout(self.timeout)))
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.failures.sustained()
    }
}
