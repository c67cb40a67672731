//! The network edge: the RLS gRPC service with health and reflection, the admin HTTP interface,
//! the policy source that keeps the limiter's snapshot current (file reloads, or xDS pushes) and
//! graceful shutdown.

pub mod admin;
pub mod bounds;
pub mod fast_path;
pub mod health;
pub mod history;
pub mod http;
pub mod incoming;
pub mod mapper;
pub mod metrics;
pub mod operator;
pub mod reload;
pub mod rlqs;
pub mod rls;
pub mod runtime;
pub mod stats;
pub mod striped;
pub mod tls;
pub mod top;
pub mod ui;
pub mod xds;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::Either;
use tokio::net::{TcpListener, UnixListener};
use tonic::service::Routes;

use crate::backend::Backend;
use crate::config::xds::{ExtensionDefaults, XdsOptions};
use crate::config::{FileSource, LoadOptions};
use crate::limiter::Limiter;
use crate::proto;
pub use bounds::Bounds;
pub use health::{Health, Readiness};
pub use incoming::GrpcListener;
pub use metrics::{Metrics, MetricsOptions};
pub use rls::{App, Origin};
pub use tls::{ServerTls, TlsFiles};

/// The sockets tollgate serves on, bound before serving starts.
///
/// Binding is the caller's job so that tests (and embedders) can bind port 0 and learn the port
/// before anything connects, with no window in which another process could take it.
#[derive(Debug)]
pub struct Listeners {
    /// RLS, health and reflection (gRPC), on TCP or a unix socket.
    pub grpc: GrpcListener,
    /// The admin HTTP interface.
    pub http: TcpListener,
    /// The debug HTTP interface (index, `/rlconfig`, `/metrics`), if wanted.
    pub debug: Option<TcpListener>,
    /// A listener of its own for the metrics (the reference's `PROMETHEUS_ADDR`), if wanted.
    pub metrics: Option<TcpListener>,
}

/// Where the gRPC services listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrpcAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A unix socket path.
    Unix(PathBuf),
}

/// Every address to listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddrs {
    /// gRPC.
    pub grpc: GrpcAddr,
    /// Admin HTTP.
    pub http: SocketAddr,
    /// Debug HTTP, if any.
    pub debug: Option<SocketAddr>,
    /// Metrics on a listener of their own, if any.
    pub metrics: Option<SocketAddr>,
}

impl Listeners {
    /// Binds gRPC and admin HTTP on TCP; port 0 picks a free port.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> Result<Listeners, ServeError> {
        Listeners::bind_all(&ListenAddrs {
            grpc: GrpcAddr::Tcp(grpc),
            http,
            debug: None,
            metrics: None,
        })
        .await
    }

    /// Binds every address of `addrs`. A unix socket path left behind by an earlier run (a
    /// socket nothing answers on) is replaced.
    pub async fn bind_all(addrs: &ListenAddrs) -> Result<Listeners, ServeError> {
        let grpc = match &addrs.grpc {
            GrpcAddr::Tcp(addr) => GrpcListener::Tcp(bind(*addr).await?),
            GrpcAddr::Unix(path) => GrpcListener::Unix {
                listener: bind_unix(path)?,
                path: path.clone(),
            },
        };
        let http = bind(addrs.http).await?;
        let metrics = match addrs.metrics {
            // The metrics are on the admin listener already.
            Some(addr) if addr == addrs.http && addr.port() != 0 => None,
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        Ok(Listeners {
            grpc,
            http,
            debug: match addrs.debug {
                Some(addr) => Some(bind(addr).await?),
                None => None,
            },
            metrics,
        })
    }

    /// The address the gRPC listener is bound to (TCP only).
    pub fn grpc_addr(&self) -> std::io::Result<SocketAddr> {
        self.grpc
            .tcp_addr()
            .ok_or_else(|| std::io::Error::other("gRPC listens on a unix socket"))
    }

    /// The address the admin HTTP listener is bound to.
    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }
}

/// Where policy updates come from while serving.
#[derive(Debug, Clone)]
pub enum Policies {
    /// Policy files, polled for changes and re-read on SIGHUP; their config is in the limiter
    /// before serving starts.
    Files(FileSource),
    /// An xDS management server pushing `RateLimitConfig` resources: each accepted push replaces
    /// the limiter's config. Until the first, the limiter holds whatever it was given (normally
    /// nothing) and is not ready unless `force_start_without_initial_config`.
    Xds {
        /// The client's settings.
        options: Box<XdsOptions>,
        /// What limits get when a push leaves tollgate's extensions out.
        defaults: ExtensionDefaults,
    },
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Where policy updates come from.
    pub policies: Policies,
    /// How policies are gathered into a snapshot, at every reload and every xDS push (domains
    /// merged or not).
    pub load_options: LoadOptions,
    /// How often the policy files (and TLS files) are checked for changes.
    pub reload_interval: Duration,
    /// How long changed policy files must stay unchanged before they are loaded, so a file
    /// caught mid-write is not applied truncated.
    pub reload_settle: Duration,
    /// Whether a reload of policy files that finds no policies at all is applied (every request
    /// then allowed); by default it is refused and the last good policies stay. (An xDS push is
    /// the control plane's deliberate word and is always applied.)
    pub allow_empty_config: bool,
    /// How long a shutdown waits for calls and streams in flight before cutting them.
    pub drain_timeout: Duration,
    /// TLS on the gRPC listener, if any.
    pub tls: Option<Arc<ServerTls>>,
    /// After how long a gRPC connection is asked to go away (GOAWAY), so clients rebalance.
    pub max_connection_age: Option<Duration>,
    /// How long a connection asked to go away may finish its calls before it is closed.
    pub max_connection_age_grace: Option<Duration>,
    /// The path the metrics are served at on their own listener.
    pub metrics_path: String,
    /// Whether health requires a config with at least one domain (the reference's
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`).
    pub require_config: bool,
    /// The most decisions in flight at once (gRPC and `POST /json` together); past it a call is
    /// answered at once with `RESOURCE_EXHAUSTED`. `None`: unbounded.
    pub max_in_flight: Option<usize>,
    /// When set, health turns NOT_SERVING once every backend call has failed for this long
    /// (and SERVING again at the next success). Unset, a sustained failure is logged loudly but
    /// health stays SERVING, since each limit answers its `failure_mode`.
    pub health_fail_after: Option<Duration>,
    /// How the reference-named statistics are built (mapping, near-limit ratio, cardinality cap).
    pub metrics: MetricsOptions,
    /// Whether `ShouldRateLimit` takes the hand-written path ([`fast_path`], the default) or,
    /// when `false`, tonic's generated service ([`rls::GeneratedRls`]), which answers alike.
    pub grpc_fast_path: bool,
    /// Whether `POST /counters/reset` may clear windows (`--admin-allow-reset`).
    pub admin_allow_reset: bool,
    /// What one client may hold: streams, unfinished request messages, silent connections, and
    /// the admin listeners' connections and header timeouts.
    pub bounds: Bounds,
}

impl ServeOptions {
    /// Options for the policy files at `config_path`, with no TLS and `tollgate serve`'s
    /// defaults for the rest.
    pub fn files(config_path: PathBuf) -> ServeOptions {
        ServeOptions {
            policies: Policies::Files(FileSource::Path(config_path)),
            load_options: LoadOptions::default(),
            reload_interval: Duration::from_secs(2),
            reload_settle: reload::DEFAULT_SETTLE,
            allow_empty_config: false,
            drain_timeout: Duration::from_secs(10),
            max_in_flight: Some(DEFAULT_MAX_IN_FLIGHT),
            health_fail_after: None,
            tls: None,
            max_connection_age: None,
            max_connection_age_grace: None,
            metrics_path: "/metrics".into(),
            require_config: false,
            metrics: MetricsOptions::default(),
            grpc_fast_path: true,
            admin_allow_reset: false,
            bounds: Bounds::default(),
        }
    }
}

/// The default bound on decisions in flight. Calls in flight wait their turn for the CPU and the
/// backend: at the 10,000 to 50,000 decisions a second one instance makes, 256 of them are 5 to
/// 25 ms of queue, about Envoy's own timeout (20 ms by default), past which an answer is wasted.
/// A burst past it is answered at once instead (the `overload` benchmark shows both sides).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 256;

/// How often the backend's housekeeping runs ([`Backend::maintain`]).
pub const MAINTAIN_INTERVAL: Duration = Duration::from_secs(1);

/// Why serving stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listen address could not be bound.
    #[error("cannot listen on {addr}: {source}; is another process using the port?")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// A unix socket could not be bound.
    #[error("cannot listen on the unix socket {path}: {source}")]
    BindUnix {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A bound listener could not report its address.
    #[error("listener unusable: {0}")]
    Listener(std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// gRPC reflection could not be set up from the embedded descriptors.
    #[error("gRPC reflection setup failed: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

/// Serves on `listeners` until `shutdown` resolves, then drains: health turns NOT_SERVING,
/// listeners close, calls in flight finish.
pub async fn serve<B: Backend>(
    limiter: Arc<Limiter<B>>,
    listeners: Listeners,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let Listeners {
        grpc: grpc_listener,
        http: http_listener,
        debug: debug_listener,
        metrics: metrics_listener,
    } = listeners;
    let grpc_addr = grpc_listener.describe();
    let http_addr = http_listener.local_addr().map_err(ServeError::Listener)?;
    let debug_addr = debug_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .map_err(ServeError::Listener)?;
    let metrics_addr = metrics_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .map_err(ServeError::Listener)?;

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter).await;
    let mut metrics = Metrics::with_options(options.metrics.clone());
    match &options.policies {
        Policies::Files(_) => {
            // The files were loaded before serving started (or serving would not start).
            let config = limiter.config();
            metrics.observe_config_load(Ok(&config.content_hash()), std::time::SystemTime::now());
            let readiness = Readiness {
                wait_for_first_policies: false,
                require_domain: options.require_config,
            };
            let domains = limiter.config().len();
            health
                .set_policies(readiness, Some(domains), String::new())
                .await;
        }
        Policies::Xds { options: xds, .. } => {
            metrics = metrics.with_xds();
            let readiness = Readiness {
                wait_for_first_policies: !xds.force_start_without_initial_config,
                require_domain: options.require_config,
            };
            let waiting_for = format!(
                "no policies yet: waiting for the first push from the xDS server {} (node {})",
                xds.server_url, xds.node_id
            );
            if xds.force_start_without_initial_config {
                tracing::warn!(
                    server = %xds.server_url,
                    "FORCE_START_WITHOUT_INITIAL_CONFIG: serving before the first xDS push; \
                     every request is allowed until the policies arrive"
                );
            }
            health.set_policies(readiness, None, waiting_for).await;
        }
    }
    let mut app = App::new(
        Arc::clone(&limiter),
        Arc::clone(&health),
        options.max_in_flight,
    );
    app.metrics = metrics;
    app.allow_reset = options.admin_allow_reset;
    let app = Arc::new(app);

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let mut tasks = vec![tokio::spawn(health::probe_backend(
        Arc::clone(&health),
        Arc::clone(&limiter),
        options.health_fail_after,
    ))];
    match &options.policies {
        Policies::Files(source) => tasks.push(tokio::spawn(reload::watch(
            Arc::clone(&app),
            source.clone(),
            options.load_options,
            reload::Watch {
                interval: options.reload_interval,
                settle: options.reload_settle,
                allow_empty: options.allow_empty_config,
            },
        ))),
        Policies::Xds {
            options: xds,
            defaults,
        } => tasks.push(tokio::spawn(xds::run(
            Arc::clone(&app),
            (**xds).clone(),
            *defaults,
            options.load_options,
        ))),
    }
    if let Some(tls) = &options.tls {
        tasks.push(tokio::spawn(Arc::clone(tls).watch(options.reload_interval)));
    }
    tasks.push(tokio::spawn(maintain(Arc::clone(&limiter))));

    // One shutdown signal fans out to every server after health has turned NOT_SERVING.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_deadline = stop_rx.clone();
    let drain_health = Arc::clone(&health);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: draining in-flight calls");
        drain_health.start_draining().await;
        let _ = stop_tx.send(true);
    });
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };

    let optional =
        |addr: Option<SocketAddr>| addr.map_or_else(|| "-".to_owned(), |a| a.to_string());
    tracing::info!(
        grpc = %grpc_addr,
        http = %http_addr,
        debug = %optional(debug_addr),
        metrics = %optional(metrics_addr),
        tls = options.tls.as_ref().map_or("off", |tls| if tls.is_mutual() { "mutual" } else { "on" }),
        workers = tokio::runtime::Handle::current().metrics().num_workers(),
        "tollgate listening"
    );

    let bounds = options.bounds;
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(bounds.grpc_max_concurrent_streams);
    if let Some(age) = options.max_connection_age {
        builder = builder.max_connection_age(age);
    }
    if let Some(grace) = options.max_connection_age_grace {
        builder = builder.max_connection_age_grace(grace);
    }
    let routes = Routes::default()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(rlqs::QuotaService::server(
            Arc::clone(&app),
            stop_rx.clone(),
        ));
    let grpc_stop = stopped(stop_rx.clone());
    let incoming = incoming::incoming(
        grpc_listener,
        options.tls.clone(),
        bounds.grpc_first_request_timeout,
    );
    let budget = Arc::new(bounds::BodyBudget::new(&bounds));
    let grpc = if options.grpc_fast_path {
        let rls = fast_path::FastPath::new(Arc::clone(&app));
        let routes = routes.add_service(rls.clone());
        let service = fast_path::Direct::new(rls::SHOULD_RATE_LIMIT, rls, routes);
        let service = bounds::Bounded::new(service, budget);
        Either::Left(builder.serve_with_incoming_shutdown(service, incoming, grpc_stop))
    } else {
        let routes = routes.add_service(rls::GeneratedRls::server(Arc::clone(&app)));
        let service = bounds::Bounded::new(routes.prepare(), budget);
        Either::Right(builder.serve_with_incoming_shutdown(service, incoming, grpc_stop))
    };
    let http_bounds = http::HttpBounds {
        header_read_timeout: bounds.admin_header_read_timeout,
        max_connections: bounds.admin_max_connections,
    };
    let mut admin = admin::router(Arc::clone(&app));
    // Metrics asked for on the admin listener's own address are served there, at their path,
    // unless an admin route has that path already.
    if metrics_listener.is_none()
        && metrics_addr.is_none()
        && !["/metrics", "/healthcheck", "/json", "/rlconfig"]
            .contains(&options.metrics_path.as_str())
    {
        admin = admin.merge(admin::metrics_router(
            Arc::clone(&app),
            &options.metrics_path,
        ));
    }
    let http = http::serve(
        http_listener,
        admin,
        http_bounds,
        "admin",
        stopped(stop_rx.clone()),
    );
    let debug = async {
        if let Some(listener) = debug_listener {
            let router = admin::debug_router(Arc::clone(&app));
            http::serve(
                listener,
                router,
                http_bounds,
                "debug",
                stopped(stop_rx.clone()),
            )
            .await;
        }
    };
    let metrics = async {
        if let Some(listener) = metrics_listener {
            let router = admin::metrics_router(Arc::clone(&app), &options.metrics_path);
            http::serve(
                listener,
                router,
                http_bounds,
                "metrics",
                stopped(stop_rx.clone()),
            )
            .await;
        }
    };

    // Long-lived streams (health Watch) would hold a graceful shutdown open forever; after the
    // drain deadline whatever is still open is cut.
    let drain_deadline = async {
        stopped(stop_rx_deadline).await;
        tokio::time::sleep(options.drain_timeout).await;
    };
    let servers = async { tokio::join!(grpc, http, debug, metrics) };
    let outcome = tokio::select! {
        results = servers => Some(results),
        () = drain_deadline => None,
    };
    for task in tasks {
        task.abort();
    }
    match outcome {
        Some((grpc_result, (), (), ())) => {
            grpc_result?;
            tracing::info!("stopped");
        }
        None => tracing::warn!(
            timeout = ?options.drain_timeout,
            "drain deadline passed; closing the streams still open"
        ),
    }
    Ok(())
}

/// Binds a unix socket at `path`, replacing a stale socket file nothing listens on.
fn bind_unix(path: &std::path::Path) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let unix_error = |source| ServeError::BindUnix {
        path: path.to_path_buf(),
        source,
    };
    if let Ok(metadata) = std::fs::symlink_metadata(path)
        && metadata.file_type().is_socket()
        && std::os::unix::net::UnixStream::connect(path).is_err()
    {
        std::fs::remove_file(path).map_err(unix_error)?;
    }
    UnixListener::bind(path).map_err(unix_error)
}

/// Runs the backend's housekeeping forever ([`Backend::maintain`]).
async fn maintain<B: Backend>(limiter: Arc<Limiter<B>>) {
    let mut ticker = tokio::time::interval(MAINTAIN_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        limiter.backend().maintain().await;
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}
