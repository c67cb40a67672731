//! A real xDS management server for tests: gRPC ADS (`StreamAggregatedResources`, state of the
//! world) on tonic, serving `RateLimitConfig` resources to one node id, over plaintext or over
//! mutual TLS as Envoy Gateway's does it (TLS 1.3 only, ALPN `h2`, a client certificate signed by
//! its CA required). It runs on a runtime of its own, so blocking tests can drive it.
//!
//! It behaves as go-control-plane's snapshot cache does for one node: a stream gets the current
//! snapshot as soon as it asks (even when the client already has that version, since a new
//! stream knows nothing), every new snapshot is sent to every open stream, nonces count up per
//! stream, and requests answering a stale nonce are ignored. By default a NACKed snapshot is not
//! sent again (go-control-plane re-sends it at once; [`ManagementServer::resend_on_nack`] does
//! that too).
//!
//! The test can push versions, push resources that are not valid policies, drop every stream,
//! stop and restart the server on the same address, and read every request received, with the
//! stream it came on and that stream's request headers.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prost::Message;
use tokio::net::TcpListener;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tollgate::config::xds::RATE_LIMIT_CONFIG_TYPE_URL;
use tollgate::proto::discovery::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use tollgate::proto::discovery::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tollgate::proto::ratelimit::config::ratelimit::v3::RateLimitConfig;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::{Request, Response, Status, Streaming};

use crate::pki::Issued;

/// How long a test waits for something the client should do promptly, on a loaded machine.
pub const WAIT: Duration = Duration::from_secs(30);

/// One request the server received.
#[derive(Debug, Clone)]
pub struct Received {
    /// Which stream it came on (1 for the first stream the server accepted, counting across
    /// restarts).
    pub stream: u64,
    /// The request.
    pub request: DiscoveryRequest,
    /// The stream's request headers (gRPC metadata), lower-case names.
    pub headers: HashMap<String, String>,
    /// How many certificates the client presented on the connection (0 over plaintext).
    pub client_certificates: usize,
}

impl Received {
    /// Whether this request NACKs a response.
    pub fn is_nack(&self) -> bool {
        self.request.error_detail.is_some()
    }

    /// The NACK's message, if it is one.
    pub fn nack_message(&self) -> Option<&str> {
        self.request
            .error_detail
            .as_ref()
            .map(|status| status.message.as_str())
    }
}

/// The resources served at one version.
#[derive(Debug, Clone, Default)]
struct Snapshot {
    version: String,
    resources: Vec<prost_types::Any>,
}

/// What the server and the test share.
#[derive(Debug)]
struct Shared {
    node_id: String,
    snapshot: watch::Sender<Option<Snapshot>>,
    /// Bumped to end every open stream with an error.
    kill: watch::Sender<u64>,
    /// True while the server is stopped or stopping: a stream that still gets through (a
    /// connection accepted just before) ends at once.
    closing: watch::Sender<bool>,
    received: Mutex<Vec<Received>>,
    handshake_failures: Mutex<Vec<String>>,
    streams: AtomicU64,
    resend_on_nack: AtomicBool,
}

/// How the server is reached.
#[derive(Debug, Clone)]
enum Transport {
    Plaintext,
    /// Envoy Gateway's mutual TLS.
    MutualTls(Arc<rustls::ServerConfig>),
}

/// A running management server; dropping it stops it.
#[derive(Debug)]
pub struct ManagementServer {
    runtime: Runtime,
    shared: Arc<Shared>,
    transport: Transport,
    addr: SocketAddr,
    running: Option<Running>,
}

/// The tasks of a server that is up.
#[derive(Debug)]
struct Running {
    stop: oneshot::Sender<()>,
    server: JoinHandle<()>,
    acceptor: Option<JoinHandle<()>>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ManagementServerBuilder {
    node_id: String,
    tls: Option<Issued>,
}

impl ManagementServerBuilder {
    /// Serves the node id `node_id` (other nodes get nothing, as from a snapshot cache keyed by
    /// node id).
    pub fn node_id(mut self, node_id: &str) -> Self {
        self.node_id = node_id.to_owned();
        self
    }

    /// Requires mutual TLS as Envoy Gateway does: TLS 1.3 only, the server certificate
    /// `server`, client certificates signed by `server`'s CA.
    pub fn mutual_tls(mut self, server: &Issued) -> Self {
        self.tls = Some(server.clone());
        self
    }

    /// Starts the server on a free loopback port.
    pub fn start(self) -> ManagementServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("build the management server's runtime");
        let transport = match &self.tls {
            Some(issued) => Transport::MutualTls(Arc::new(server_tls(issued))),
            None => Transport::Plaintext,
        };
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("bind the management server");
        let addr = listener
            .local_addr()
            .expect("the management server's address");
        let shared = Arc::new(Shared {
            node_id: self.node_id,
            snapshot: watch::channel(None).0,
            kill: watch::channel(0).0,
            closing: watch::channel(false).0,
            received: Mutex::new(Vec::new()),
            handshake_failures: Mutex::new(Vec::new()),
            streams: AtomicU64::new(0),
            resend_on_nack: AtomicBool::new(false),
        });
        let mut server = ManagementServer {
            runtime,
            shared,
            transport,
            addr,
            running: None,
        };
        server.serve(listener);
        server
    }
}

impl ManagementServer {
    /// A plaintext server for node `default`, the reference's default node id.
    pub fn builder() -> ManagementServerBuilder {
        ManagementServerBuilder {
            node_id: "default".to_owned(),
            tls: None,
        }
    }

    /// `127.0.0.1:<port>`, as `CONFIG_GRPC_XDS_SERVER_URL` takes it.
    pub fn url(&self) -> String {
        self.addr.to_string()
    }

    /// The address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves `configs` at `version` from now on, to every open stream and every new one.
    pub fn push(&self, version: &str, configs: &[RateLimitConfig]) {
        let resources = configs
            .iter()
            .map(|config| prost_types::Any {
                type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
                value: config.encode_to_vec(),
            })
            .collect();
        self.push_resources(version, resources);
    }

    /// Serves raw resources at `version` (for resources that are not valid policies).
    pub fn push_resources(&self, version: &str, resources: Vec<prost_types::Any>) {
        self.shared.snapshot.send_replace(Some(Snapshot {
            version: version.to_owned(),
            resources,
        }));
    }

    /// Whether a NACKed snapshot is sent again at once, as go-control-plane does.
    pub fn resend_on_nack(&self, resend: bool) {
        self.shared.resend_on_nack.store(resend, Ordering::SeqCst);
    }

    /// Every request received so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared.lock_received().clone()
    }

    /// Waits until the requests received satisfy `done`, and returns them; panics after
    /// [`WAIT`] with what was received.
    pub fn wait_for(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + WAIT;
        loop {
            let received = self.received();
            if done(&received) {
                return received;
            }
            assert!(
                Instant::now() < deadline,
                "the management server did not see {what} within {WAIT:?}; received:\n{received:#?}\nTLS handshake failures: {:?}",
                self.handshake_failures()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the ACK of `version`, and returns it.
    pub fn wait_for_ack(&self, version: &str) -> Received {
        let acked = |r: &Received| {
            !r.is_nack()
                && r.request.version_info == version
                && !r.request.response_nonce.is_empty()
        };
        let received = self.wait_for(&format!("an ACK of version {version:?}"), |all| {
            all.iter().any(acked)
        });
        received.into_iter().find(acked).expect("the ACK just seen")
    }

    /// Waits for a NACK, and returns the first one.
    pub fn wait_for_nack(&self) -> Received {
        let received = self.wait_for("a NACK", |all| all.iter().any(Received::is_nack));
        received
            .into_iter()
            .find(Received::is_nack)
            .expect("the NACK just seen")
    }

    /// How many streams were opened so far (across restarts).
    pub fn streams(&self) -> u64 {
        self.shared.streams.load(Ordering::SeqCst)
    }

    /// TLS handshakes that failed, with the reason (e.g. a client without a certificate).
    pub fn handshake_failures(&self) -> Vec<String> {
        self.shared
            .handshake_failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ends every open stream with UNAVAILABLE, as a server going away would; the server keeps
    /// listening.
    pub fn drop_streams(&self) {
        self.shared.kill.send_modify(|generation| *generation += 1);
    }

    /// Stops the server: open streams end, the listener closes, connections are refused.
    pub fn stop(&mut self) {
        let Some(running) = self.running.take() else {
            return;
        };
        self.shared.closing.send_replace(true);
        self.drop_streams();
        let _ = running.stop.send(());
        if let Some(acceptor) = running.acceptor {
            acceptor.abort();
        }
        let server = running.server;
        let stopped = self
            .runtime
            .block_on(async { tokio::time::timeout(WAIT, server).await });
        assert!(stopped.is_ok(), "the management server did not stop");
    }

    /// Starts a stopped server again on the same address, with the snapshot it had.
    pub fn restart(&mut self) {
        assert!(self.running.is_none(), "the server is running");
        self.shared.closing.send_replace(false);
        let deadline = Instant::now() + WAIT;
        let listener = loop {
            match self.runtime.block_on(TcpListener::bind(self.addr)) {
                Ok(listener) => break listener,
                Err(err) => {
                    assert!(
                        Instant::now() < deadline,
                        "cannot bind {} again: {err}",
                        self.addr
                    );
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        self.serve(listener);
    }

    fn serve(&mut self, listener: TcpListener) {
        let service = AggregatedDiscoveryServiceServer::new(Ads {
            shared: Arc::clone(&self.shared),
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async {
            let _ = stopped.await;
        };
        let _guard = self.runtime.enter();
        let (server, acceptor) = match &self.transport {
            Transport::Plaintext => {
                let incoming = tonic::transport::server::TcpIncoming::from(listener);
                let server = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, shutdown);
                (
                    tokio::spawn(async move {
                        let _ = server.await;
                    }),
                    None,
                )
            }
            Transport::MutualTls(config) => {
                let (connections, incoming) = mpsc::channel(16);
                let acceptor = tokio::spawn(accept_tls(
                    listener,
                    TlsAcceptor::from(Arc::clone(config)),
                    connections,
                    Arc::clone(&self.shared),
                ));
                let incoming = ReceiverStream::new(incoming);
                let server = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, shutdown);
                (
                    tokio::spawn(async move {
                        let _ = server.await;
                    }),
                    Some(acceptor),
                )
            }
        };
        self.running = Some(Running {
            stop,
            server,
            acceptor,
        });
    }
}

impl Drop for ManagementServer {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            self.drop_streams();
            let _ = running.stop.send(());
            running.server.abort();
            if let Some(acceptor) = running.acceptor {
                acceptor.abort();
            }
        }
    }
}

impl Shared {
    fn lock_received(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Envoy Gateway's server TLS: TLS 1.3 only, ALPN h2, a client certificate required and
/// verified against the server certificate's CA.
fn server_tls(issued: &Issued) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(issued.cert())
        .expect("read the server certificate")
        .collect::<Result<_, _>>()
        .expect("parse the server certificate");
    let key = PrivateKeyDer::from_pem_file(issued.key()).expect("read the server key");
    let mut roots = rustls::RootCertStore::empty();
    for ca in CertificateDer::pem_file_iter(issued.ca()).expect("read the CA") {
        roots
            .add(ca.expect("parse the CA"))
            .expect("add the CA to the roots");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .expect("build the client verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("TLS 1.3")
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .expect("the server certificate and key");
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// A TLS connection the gRPC server accepts.
type TlsConnection = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;

/// Accepts TCP connections and completes their TLS handshakes, recording the failures.
async fn accept_tls(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    connections: mpsc::Sender<Result<TlsConnection, std::io::Error>>,
    shared: Arc<Shared>,
) {
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            continue;
        };
        let acceptor = acceptor.clone();
        let connections = connections.clone();
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            match tokio::time::timeout(WAIT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = connections.send(Ok(tls)).await;
                }
                Ok(Err(err)) => shared
                    .handshake_failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(err.to_string()),
                Err(_) => shared
                    .handshake_failures
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push("handshake timed out".to_owned()),
            }
        });
    }
}

/// The ADS service.
struct Ads {
    shared: Arc<Shared>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
type DeltaStream = Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for Ads {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ResponseStream>, Status> {
        let stream = self.shared.streams.fetch_add(1, Ordering::SeqCst) + 1;
        let headers = request
            .metadata()
            .clone()
            .into_headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        let client_certificates = request
            .extensions()
            .get::<TlsConnectInfo<TcpConnectInfo>>()
            .and_then(TlsConnectInfo::peer_certs)
            .map_or(0, |certs| certs.len());
        let (responses, outbound) = mpsc::channel(4);
        let session = Session {
            shared: Arc::clone(&self.shared),
            stream,
            headers,
            client_certificates,
            responses,
            nonce: 0,
            sent: None,
        };
        tokio::spawn(session.run(request.into_inner()));
        Ok(Response::new(Box::pin(ReceiverStream::new(outbound))))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<DeltaStream>, Status> {
        Err(Status::unimplemented(
            "this server speaks state of the world only",
        ))
    }
}

/// One stream's state.
struct Session {
    shared: Arc<Shared>,
    stream: u64,
    headers: HashMap<String, String>,
    client_certificates: usize,
    responses: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    nonce: u64,
    /// The version and nonce of the last response sent on this stream.
    sent: Option<(String, String)>,
}

impl Session {
    async fn run(mut self, mut requests: Streaming<DiscoveryRequest>) {
        let mut snapshots = self.shared.snapshot.subscribe();
        let mut kill = self.shared.kill.subscribe();
        let mut closing = self.shared.closing.subscribe();
        let mut node_matches = false;
        loop {
            tokio::select! {
                request = requests.message() => {
                    let Ok(Some(request)) = request else { return };
                    let stale = self
                        .sent
                        .as_ref()
                        .is_some_and(|(_, nonce)| *nonce != request.response_nonce);
                    let nack = request.error_detail.is_some();
                    node_matches = request.node.as_ref().is_some_and(|n| n.id == self.shared.node_id);
                    self.shared.lock_received().push(Received {
                        stream: self.stream,
                        request,
                        headers: self.headers.clone(),
                        client_certificates: self.client_certificates,
                    });
                    if stale || !node_matches {
                        continue;
                    }
                    let resend = nack && self.shared.resend_on_nack.load(Ordering::SeqCst);
                    let snapshot = snapshots.borrow_and_update().clone();
                    if self.send_if_new(&snapshot, resend).await.is_err() {
                        return;
                    }
                }
                changed = snapshots.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let snapshot = snapshots.borrow_and_update().clone();
                    // Nothing goes out before the client has asked.
                    if node_matches && self.send_if_new(&snapshot, false).await.is_err() {
                        return;
                    }
                }
                _ = kill.changed() => {
                    let _ = self
                        .responses
                        .send(Err(Status::unavailable("the management server dropped the stream")))
                        .await;
                    return;
                }
                () = async { drop(closing.wait_for(|closing| *closing).await) } => {
                    let _ = self
                        .responses
                        .send(Err(Status::unavailable("the management server is stopping")))
                        .await;
                    return;
                }
            }
        }
    }

    /// Sends `snapshot` unless this stream already got its version (or `again`).
    async fn send_if_new(&mut self, snapshot: &Option<Snapshot>, again: bool) -> Result<(), ()> {
        let Some(snapshot) = snapshot else {
            return Ok(());
        };
        let already = self
            .sent
            .as_ref()
            .is_some_and(|(version, _)| *version == snapshot.version);
        if already && !again {
            return Ok(());
        }
        self.nonce += 1;
        let nonce = self.nonce.to_string();
        let response = DiscoveryResponse {
            version_info: snapshot.version.clone(),
            resources: snapshot.resources.clone(),
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_owned(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        self.sent = Some((snapshot.version.clone(), nonce));
        self.responses.send(Ok(response)).await.map_err(|_| ())
    }
}
