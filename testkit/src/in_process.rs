//! tollgate inside the test process: the real server (`tollgate::server::serve`, with the RLS,
//! health, reflection and the admin HTTP interface) on listeners bound to `127.0.0.1:0`, over a
//! limiter and backend the test chooses, on a runtime of its own. No binary to build or find, no
//! port to guess, and any backend stack, shared servers and key prefixes included.
//!
//! What only the binary does (flags, environment, signals, exit codes, logs) is tested with
//! [`crate::tollgate::Tollgate`] instead.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tollgate::backend::{AnyBackend, MemoryBackend, Sharded};
use tollgate::clock::ManualClock;
use tollgate::config::{Config, FileSource};
use tollgate::limiter::{LimitHeaders, Limiter, Settings};
use tollgate::server::runtime::{self, Wakeups};
use tollgate::server::{Listeners, ServeError, ServeOptions, serve};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::policy::Policies;
use crate::redis::unique_prefix;
use crate::rls::health_status;
use crate::target::{CALL_TIMEOUT, Store};
use crate::tollgate::LIVENESS;
use crate::wait;

/// How long the server may take to become SERVING on a loaded machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a shutdown may take to drain.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// What to serve: policy files, the store, and the settings `tollgate serve` takes as flags.
#[derive(Debug, Clone)]
pub struct InProcessBuilder {
    policies: Policies,
    store: Store,
    clock: Option<ManualClock>,
    key_prefix: Option<String>,
    settings: Settings,
    limit_headers: Option<LimitHeaders>,
    backend_timeout: Duration,
    reload_interval: Duration,
    drain_timeout: Duration,
    /// Where gRPC listens; a free loopback port when `None`.
    grpc: Option<SocketAddr>,
    /// The remaining serve options (bounds, reload safety, health), as `tollgate serve`'s
    /// defaults unless set.
    options: ServeOptions,
}

impl Default for InProcessBuilder {
    fn default() -> Self {
        InProcessBuilder {
            policies: Policies::default(),
            store: Store::Memory,
            clock: None,
            key_prefix: None,
            settings: Settings::default(),
            limit_headers: None,
            // Generous: a loaded machine must not turn decisions into failure-mode answers.
            backend_timeout: CALL_TIMEOUT,
            reload_interval: Duration::from_secs(1),
            drain_timeout: Duration::from_secs(1),
            grpc: None,
            // The policy source is set at start, once the policy files are written.
            options: ServeOptions::files(PathBuf::new()),
        }
    }
}

impl InProcessBuilder {
    /// Listens for gRPC at `addr` (an earlier instance's, to stand for it restarted).
    pub fn grpc_addr(mut self, addr: SocketAddr) -> Self {
        self.grpc = Some(addr);
        self
    }

    /// Adds a policy file named `file_name` (e.g. `edge.yaml`) with the given YAML text.
    pub fn policy(mut self, file_name: &str, yaml: &str) -> Self {
        self.policies.add(file_name, yaml);
        self
    }

    /// Where the windows live (default: memory).
    pub fn store(mut self, store: Store) -> Self {
        self.store = store;
        self
    }

    /// Decides on the memory store at the instants `clock` reads, so a test can put requests
    /// on either side of a window edge exactly, whatever the machine's load.
    pub fn clock(mut self, clock: ManualClock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The prefix of every Redis key (default: one no other backend of this process uses).
    pub fn key_prefix(mut self, prefix: &str) -> Self {
        self.key_prefix = Some(prefix.to_owned());
        self
    }

    /// `--failure-mode`, `--shadow-mode`, `--retry-after-header`.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = settings;
        self
    }

    /// Adds the draft RateLimit headers to every response (`LIMIT_RESPONSE_HEADERS_ENABLED`),
    /// under their default names.
    pub fn limit_headers(mut self) -> Self {
        self.limit_headers = Some(LimitHeaders::default());
        self
    }

    /// `--backend-timeout` (default: generous, so that only outages answer failure modes).
    pub fn backend_timeout(mut self, timeout: Duration) -> Self {
        self.backend_timeout = timeout;
        self
    }

    /// `--reload-interval`.
    pub fn reload_interval(mut self, interval: Duration) -> Self {
        self.reload_interval = interval;
        self
    }

    /// `--reload-settle` (default 1 s).
    pub fn reload_settle(mut self, settle: Duration) -> Self {
        self.options.reload_settle = settle;
        self
    }

    /// `--allow-empty-config`.
    pub fn allow_empty_config(mut self, allow: bool) -> Self {
        self.options.allow_empty_config = allow;
        self
    }

    /// `--max-in-flight` (`None`: unbounded).
    pub fn max_in_flight(mut self, bound: Option<usize>) -> Self {
        self.options.max_in_flight = bound;
        self
    }

    /// `--grpc-fast-path` (default: true; `false` serves ShouldRateLimit through tonic's
    /// generated service).
    pub fn grpc_fast_path(mut self, on: bool) -> Self {
        self.options.grpc_fast_path = on;
        self
    }

    /// `--health-fail-after`.
    pub fn health_fail_after(mut self, after: Duration) -> Self {
        self.options.health_fail_after = Some(after);
        self
    }

    /// Starts serving and waits until gRPC health answers SERVING (policies loaded, backend
    /// answering).
    pub fn start(self) -> InProcess {
        self.start_until("")
    }

    /// Starts serving and waits only until it is alive (`tollgate.liveness` SERVING), for tests
    /// whose backend is not reachable and so never becomes ready.
    pub fn start_alive(self) -> InProcess {
        self.start_until(LIVENESS)
    }

    fn start_until(self, service: &str) -> InProcess {
        let (dir, config_dir) = self.policies.write();
        let config = Config::load(&config_dir).unwrap_or_else(|err| panic!("{err}"));
        // The binary's scheduling for the backend, on two workers.
        let workers = std::num::NonZeroUsize::new(2).expect("two workers");
        let wakeups = Wakeups::for_backend(self.store != Store::Memory);
        let runtime = runtime::build(workers, wakeups).expect("build a tokio runtime");
        let prefix = self
            .key_prefix
            .unwrap_or_else(|| unique_prefix("in-process"));
        let options = ServeOptions {
            reload_interval: self.reload_interval,
            drain_timeout: self.drain_timeout,
            policies: tollgate::server::Policies::Files(FileSource::Path(config_dir.clone())),
            ..self.options
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let (served, grpc_addr, http_addr) = runtime.block_on(async {
            let backend = match self.clock {
                Some(clock) => {
                    assert_eq!(self.store, Store::Memory, "only memory takes a clock");
                    AnyBackend::Memory(MemoryBackend::with_clock(Arc::new(clock)))
                }
                None => self.store.connect(&prefix, self.backend_timeout).await,
            };
            let mut limiter = Limiter::new(Arc::new(config), Sharded::new(backend), self.settings);
            if let Some(names) = self.limit_headers {
                limiter = limiter.with_limit_headers(names);
            }
            let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
            let listeners = Listeners::bind(self.grpc.unwrap_or(loopback), loopback)
                .await
                .expect("bind two loopback listeners");
            let grpc_addr = listeners.grpc_addr().expect("the gRPC address");
            let http_addr = listeners.http_addr().expect("the HTTP address");
            let shutdown = async move {
                let _ = stopped.await;
            };
            let served = tokio::spawn(serve(Arc::new(limiter), listeners, options, shutdown));
            (served, grpc_addr, http_addr)
        });
        let server = InProcess {
            runtime: Some(runtime),
            grpc_addr,
            http_addr,
            stop: Some(stop),
            served: Some(served),
            config_dir,
            _dir: dir,
        };
        server.wait_for(service);
        server
    }
}

/// tollgate serving in this process; dropping it shuts it down.
///
/// For synchronous tests: it blocks on its own runtime, which an async test must not do.
#[derive(Debug)]
pub struct InProcess {
    runtime: Option<Runtime>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: Option<JoinHandle<Result<(), ServeError>>>,
    config_dir: PathBuf,
    /// Keeps the config directory alive as long as the server.
    _dir: TempDir,
}

impl InProcess {
    /// A builder with no policies, the memory store and default settings.
    pub fn builder() -> InProcessBuilder {
        InProcessBuilder::default()
    }

    /// Serves one policy file `config.yaml` on the memory store.
    pub fn start(yaml: &str) -> InProcess {
        InProcess::builder().policy("config.yaml", yaml).start()
    }

    /// The gRPC address (RLS, health, reflection).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The admin HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// `http://<admin address><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }

    /// The config directory the server watches.
    pub fn config_dir(&self) -> &Path {
        &self.config_dir
    }

    /// Shuts down as SIGTERM does for the binary (health NOT_SERVING, listeners closed, calls in
    /// flight finished) and waits until serving has stopped.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let (Some(served), Some(runtime)) = (self.served.take(), self.runtime.as_ref()) {
            let result =
                runtime.block_on(async { tokio::time::timeout(SHUTDOWN_TIMEOUT, served).await });
            match result {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => panic!("serving failed: {err}"),
                Ok(Err(err)) => panic!("the server task failed: {err}"),
                Err(_) => panic!("tollgate did not stop within {SHUTDOWN_TIMEOUT:?}"),
            }
        }
    }

    /// Polls gRPC health of `service` until SERVING.
    fn wait_for(&self, service: &str) {
        let runtime = self.runtime.as_ref().expect("the runtime lives until drop");
        wait::until(
            &format!("in-process tollgate to be SERVING {service:?}"),
            START_TIMEOUT,
            || {
                runtime.block_on(health_status(self.grpc_addr, service))
                    == Ok(ServingStatus::Serving)
            },
        );
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(runtime) = self.runtime.take() {
            // Never blocks, so a drop during a panic or inside another runtime is safe; the
            // listeners close with the runtime's tasks.
            runtime.shutdown_background();
        }
    }
}
