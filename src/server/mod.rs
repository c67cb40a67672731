//! The network edge: the RLS gRPC service with health and reflection, the admin HTTP interface,
//! config reloads and graceful shutdown.

pub mod admin;
pub mod health;
pub mod metrics;
pub mod reload;
pub mod rls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;

use crate::backend::Backend;
use crate::limiter::Limiter;
use crate::proto;
pub use health::Health;
pub use metrics::Metrics;
pub use rls::App;

/// The sockets tollgate serves on, bound before serving starts.
///
/// Binding is the caller's job so that tests (and embedders) can bind port 0 and learn the port
/// before anything connects, with no window in which another process could take it.
#[derive(Debug)]
pub struct Listeners {
    /// RLS, health and reflection (gRPC).
    pub grpc: TcpListener,
    /// The admin HTTP interface.
    pub http: TcpListener,
}

impl Listeners {
    /// Binds both addresses; port 0 picks a free port.
    pub async fn bind(grpc: SocketAddr, http: SocketAddr) -> Result<Listeners, ServeError> {
        Ok(Listeners {
            grpc: bind(grpc).await?,
            http: bind(http).await?,
        })
    }

    /// The address the gRPC listener is bound to.
    pub fn grpc_addr(&self) -> std::io::Result<SocketAddr> {
        self.grpc.local_addr()
    }

    /// The address the admin HTTP listener is bound to.
    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }
}

/// How to serve.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The config file or directory, re-read when it changes.
    pub config_path: PathBuf,
    /// How often the config path is checked for changes.
    pub reload_interval: Duration,
    /// How long a changed config must stay unchanged before it is loaded, so a file caught
    /// mid-write is not applied truncated.
    pub reload_settle: Duration,
    /// Whether a reload that finds no policies at all is applied (every request then allowed);
    /// by default it is refused and the last good policies stay.
    pub allow_empty_config: bool,
    /// How long a shutdown waits for calls and streams in flight before cutting them.
    pub drain_timeout: Duration,
    /// The most decisions in flight at once (gRPC and `POST /json` together); past it a call is
    /// answered at once with `RESOURCE_EXHAUSTED`. `None`: unbounded.
    pub max_in_flight: Option<usize>,
    /// When set, health turns NOT_SERVING once every backend call has failed for this long
    /// (and SERVING again at the next success). Unset, a sustained failure is logged loudly but
    /// health stays SERVING, since each limit answers its `failure_mode`.
    pub health_fail_after: Option<Duration>,
}

impl Default for ServeOptions {
    /// The defaults of `tollgate serve`, for a config at `./config`.
    fn default() -> Self {
        ServeOptions {
            config_path: PathBuf::from("config"),
            reload_interval: Duration::from_secs(2),
            reload_settle: reload::DEFAULT_SETTLE,
            allow_empty_config: false,
            drain_timeout: Duration::from_secs(10),
            max_in_flight: Some(DEFAULT_MAX_IN_FLIGHT),
            health_fail_after: None,
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
    /// A bound listener could not report its address.
    #[error("listener unusable: {0}")]
    Listener(std::io::Error),
    /// The gRPC server failed.
    #[error("gRPC server failed: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// The admin HTTP server failed.
    #[error("admin HTTP server failed: {0}")]
    Http(std::io::Error),
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
    } = listeners;
    let grpc_addr = grpc_listener.local_addr().map_err(ServeError::Listener)?;
    let http_addr = http_listener.local_addr().map_err(ServeError::Listener)?;

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter).await;
    let app = Arc::new(App::new(
        Arc::clone(&limiter),
        Arc::clone(&health),
        options.max_in_flight,
    ));

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    let probe = tokio::spawn(health::probe_backend(
        Arc::clone(&health),
        Arc::clone(&limiter),
        options.health_fail_after,
    ));
    let reloader = tokio::spawn(reload::watch(
        Arc::clone(&limiter),
        options.config_path.clone(),
        reload::Watch {
            interval: options.reload_interval,
            settle: options.reload_settle,
            allow_empty: options.allow_empty_config,
        },
    ));
    let maintenance = tokio::spawn(maintain(Arc::clone(&limiter)));

    // One shutdown signal fans out to both servers after health has turned NOT_SERVING.
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

    tracing::info!(grpc = %grpc_addr, http = %http_addr, "tollgate listening");

    let grpc = tonic::transport::Server::builder()
        .add_service(
            proto::rate_limit_service_server::RateLimitServiceServer::new(rls::RlsService::new(
                Arc::clone(&app),
            )),
        )
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .serve_with_incoming_shutdown(
            // With a listener of our own, tonic leaves accepted sockets as they are; without
            // TCP_NODELAY a response queued behind an unacknowledged one waits for the peer's
            // delayed ACK (tens of ms on the tail).
            TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            stopped(stop_rx.clone()),
        );
    let http = axum::serve(http_listener, admin::router(Arc::clone(&app)))
        .with_graceful_shutdown(stopped(stop_rx));

    // Long-lived streams (health Watch) would hold a graceful shutdown open forever; after the
    // drain deadline whatever is still open is cut.
    let drain_deadline = async {
        stopped(stop_rx_deadline).await;
        tokio::time::sleep(options.drain_timeout).await;
    };
    let servers = async { tokio::join!(grpc, async { http.await }) };
    let outcome = tokio::select! {
        (grpc_result, http_result) = servers => Some((grpc_result, http_result)),
        () = drain_deadline => None,
    };
    probe.abort();
    reloader.abort();
    maintenance.abort();
    match outcome {
        Some((grpc_result, http_result)) => {
            grpc_result?;
            http_result.map_err(ServeError::Http)?;
            tracing::info!("stopped");
        }
        None => tracing::warn!(
            timeout = ?options.drain_timeout,
            "drain deadline passed; closing the streams still open"
        ),
    }
    Ok(())
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
