//! The State-of-the-World ADS client: one stream to the management server, subscribed to every
//! `RateLimitConfig` for this node; each response is the whole set of policies, turned into a
//! snapshot and either handed over and ACKed, or refused and NACKed with the reason while the
//! policies in force stay.
//!
//! What goes on the wire, request by request:
//!
//! | when | `version_info` | `response_nonce` | `error_detail` |
//! |---|---|---|---|
//! | a stream opens | the version last accepted (`""` before any) | `""` | none |
//! | a response is accepted (ACK) | that response's version | its nonce | none |
//! | a response is refused (NACK) | the version last accepted | its nonce | code 3 (INVALID_ARGUMENT), the [`Rejection`] |
//!
//! Every request carries the node (id and metadata), the type URL and no resource names (all of
//! them). The reference sends the same, except that it repeats the last nonce on a new stream,
//! which the protocol reserves for answering a response of that stream.
//!
//! Connecting retries every `connect_retry_interval` until the server answers; a stream that
//! breaks afterwards is reopened after the reference's backoff ([`Backoff`]).

use std::collections::hash_map::DefaultHasher;
use std::error::Error as _;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime};

use prost_types::value::Kind;
use tokio::sync::mpsc;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::backoff::Backoff;
use super::convert::{self, ExtensionDefaults, RATE_LIMIT_CONFIG_TYPE_URL, Rejection};
use super::options::XdsOptions;
use crate::config::{Config, LoadOptions};
use crate::proto::discovery::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use crate::proto::discovery::{DiscoveryRequest, DiscoveryResponse};
use crate::proto::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use crate::proto::google::rpc::Status as RpcStatus;

/// `google.rpc.Code.INVALID_ARGUMENT`: what a NACK says about the resources it refuses.
const NACK_CODE: i32 = 3;

/// How long one connection attempt (TCP, TLS, HTTP/2) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalive on the connection, so a server that vanished without closing it is noticed.
/// (HTTP/2 pings are left off: gRPC servers refuse pings more often than every five minutes by
/// default and close the connection.)
const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// A refused response that comes straight back unchanged (go-control-plane re-sends a NACKed
/// snapshot at once, forever) is answered after this pause, so the two sides do not spin.
const REPEATED_NACK_PAUSE: Duration = Duration::from_secs(1);

/// A push the client accepted: the snapshot to install, before the client ACKs it.
#[derive(Debug)]
pub struct Accepted {
    /// The response's `version_info` (may be empty: servers with nothing to send use `""`).
    pub version: String,
    /// The validated snapshot of every policy in the push.
    pub config: Config,
    /// How many resources the push carried.
    pub resources: usize,
    /// When it was accepted.
    pub at: SystemTime,
}

/// A push the client refused; the policies in force stay.
#[derive(Debug, Clone)]
pub struct Rejected {
    /// The refused response's `version_info`.
    pub version: String,
    /// Why; also the NACK's message.
    pub reason: Rejection,
}

/// What the client reports as it runs. The server implements it to install snapshots, follow
/// readiness and count metrics; the client knows nothing of limiters or health.
pub trait Events: Send + Sync + 'static {
    /// A connection to the server is up and a stream is being opened (the first time and after
    /// every reconnect).
    fn connected(&self) -> impl Future<Output = ()> + Send;
    /// A push was accepted; install it. The client ACKs once this returns.
    fn accepted(&self, update: Accepted) -> impl Future<Output = ()> + Send;
    /// A push was refused; the client NACKs once this returns.
    fn rejected(&self, rejected: &Rejected) -> impl Future<Output = ()> + Send;
}

/// Why a connection or stream ended, for the log.
#[derive(Debug, thiserror::Error)]
enum StreamEnd {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("the server closed the stream")]
    Closed,
    #[error("the stream failed: {0}")]
    Failed(String),
}

/// The xDS client for one management server.
#[derive(Debug, Clone)]
pub struct XdsClient {
    options: XdsOptions,
    defaults: ExtensionDefaults,
    load_options: LoadOptions,
    node: Node,
}

/// What the client remembers across streams.
#[derive(Debug, Default)]
struct Progress {
    /// The version of the last response accepted ("" before any).
    accepted_version: String,
    /// A digest of the last response refused, to spot a server re-sending it unchanged.
    last_refused: Option<u64>,
}

impl XdsClient {
    /// A client set up by `options`, filling in tollgate's extensions from `defaults` and
    /// gathering each push's resources as `load_options` say.
    pub fn new(
        options: XdsOptions,
        defaults: ExtensionDefaults,
        load_options: LoadOptions,
    ) -> Self {
        let node = node(&options);
        XdsClient {
            options,
            defaults,
            load_options,
            node,
        }
    }

    /// The options it runs with.
    pub fn options(&self) -> &XdsOptions {
        &self.options
    }

    /// Runs until the task is dropped: connects, follows the stream, reconnects.
    pub async fn run(self, events: impl Events) {
        let mut progress = Progress::default();
        let mut backoff = Backoff::new(self.options.backoff);
        let mut failing_connect: Option<String> = None;
        loop {
            let channel = match self.connect().await {
                Ok(channel) => channel,
                Err(error) => {
                    let error = error.to_string();
                    // One warning per streak of the same failure; the rest at debug.
                    if failing_connect.as_ref() != Some(&error) {
                        tracing::warn!(
                            server = %self.options.server_url,
                            retry_in = ?self.options.connect_retry_interval,
                            "xDS: {error}"
                        );
                        failing_connect = Some(error);
                    } else {
                        tracing::debug!(server = %self.options.server_url, "xDS: {error}");
                    }
                    tokio::time::sleep(self.options.connect_retry_interval).await;
                    continue;
                }
            };
            failing_connect = None;
            tracing::info!(
                server = %self.options.server_url,
                node = %self.options.node_id,
                "xDS: connected to the management server"
            );
            events.connected().await;
            let (end, delivered) = self.stream(channel, &mut progress, &events).await;
            if delivered {
                backoff.reset();
            }
            let delay = backoff.next_delay();
            tracing::warn!(
                server = %self.options.server_url,
                reconnect_in = ?delay,
                "xDS: {end}; the policies in force stay"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// Dials the server (TLS files are read at every attempt, so rotated certificates are
    /// picked up).
    async fn connect(&self) -> Result<Channel, StreamEnd> {
        let endpoint = self
            .options
            .endpoint()
            .map_err(|e| StreamEnd::Connect(e.to_string()))?;
        let mut endpoint = Endpoint::from_shared(endpoint)
            .map_err(|e| StreamEnd::Connect(chain(&e)))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_keepalive(Some(TCP_KEEPALIVE))
            .user_agent(format!("tollgate/{}", env!("CARGO_PKG_VERSION")))
            .map_err(|e| StreamEnd::Connect(chain(&e)))?;
        if self.options.tls() {
            let tls = tls_config(&self.options).map_err(StreamEnd::Connect)?;
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| StreamEnd::Connect(chain(&e)))?;
        }
        endpoint
            .connect()
            .await
            .map_err(|e| StreamEnd::Connect(chain(&e)))
    }

    /// Follows one stream until it ends; says why, and whether any response arrived on it.
    async fn stream(
        &self,
        channel: Channel,
        progress: &mut Progress,
        events: &impl Events,
    ) -> (StreamEnd, bool) {
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(self.options.max_message_size);
        let (sender, receiver) = mpsc::channel::<DiscoveryRequest>(4);
        // A new stream answers no response yet: the version last accepted, no nonce.
        let first = self.request(&progress.accepted_version, "", None);
        if sender.send(first).await.is_err() {
            return (StreamEnd::Closed, false);
        }
        let outbound = futures_util::stream::unfold(receiver, |mut receiver| async move {
            receiver.recv().await.map(|request| (request, receiver))
        });
        let mut request = tonic::Request::new(outbound);
        for (key, value) in &self.options.additional_headers {
            // Both were checked when the options were read.
            if let (Ok(key), Ok(value)) = (
                AsciiMetadataKey::from_bytes(key.as_bytes()),
                AsciiMetadataValue::try_from(value.as_str()),
            ) {
                request.metadata_mut().insert(key, value);
            }
        }
        let mut inbound = match client.stream_aggregated_resources(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return (StreamEnd::Failed(status_text(&status)), false),
        };
        let mut delivered = false;
        loop {
            let response = match inbound.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return (StreamEnd::Closed, delivered),
                Err(status) => return (StreamEnd::Failed(status_text(&status)), delivered),
            };
            delivered = true;
            let Some(reply) = self.answer(response, progress, events).await else {
                continue;
            };
            if sender.send(reply).await.is_err() {
                return (StreamEnd::Closed, delivered);
            }
        }
    }

    /// Handles one response: the ACK or NACK to send, or `None` for a response of a type this
    /// client did not ask for.
    async fn answer(
        &self,
        response: DiscoveryResponse,
        progress: &mut Progress,
        events: &impl Events,
    ) -> Option<DiscoveryRequest> {
        if response.type_url != RATE_LIMIT_CONFIG_TYPE_URL {
            tracing::warn!(
                type_url = %response.type_url,
                "xDS: ignoring a response of a type this client did not subscribe to"
            );
            return None;
        }
        let DiscoveryResponse {
            version_info: version,
            resources,
            nonce,
            ..
        } = response;
        match convert::snapshot(&resources, &self.defaults, self.load_options) {
            Ok(config) => {
                progress.last_refused = None;
                for warning in config.warnings() {
                    tracing::warn!("xDS: {warning}");
                }
                tracing::info!(
                    version = %version,
                    domains = config.len(),
                    resources = resources.len(),
                    "xDS: policies applied"
                );
                events
                    .accepted(Accepted {
                        version: version.clone(),
                        config,
                        resources: resources.len(),
                        at: SystemTime::now(),
                    })
                    .await;
                progress.accepted_version = version.clone();
                Some(self.request(&version, &nonce, None))
            }
            Err(reason) => {
                let digest = digest(&version, &resources);
                let repeated = progress.last_refused == Some(digest);
                progress.last_refused = Some(digest);
                if repeated {
                    tracing::debug!(version = %version, %reason, "xDS: the same push again, refused again");
                    tokio::time::sleep(REPEATED_NACK_PAUSE).await;
                } else {
                    tracing::error!(
                        version = %version,
                        %reason,
                        "xDS: push refused (NACK); the policies in force stay"
                    );
                }
                let rejected = Rejected { version, reason };
                events.rejected(&rejected).await;
                let status = RpcStatus {
                    code: NACK_CODE,
                    message: rejected.reason.to_string(),
                    details: Vec::new(),
                };
                Some(self.request(&progress.accepted_version, &nonce, Some(status)))
            }
        }
    }

    fn request(&self, version: &str, nonce: &str, error: Option<RpcStatus>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_string(),
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error,
        }
    }
}

/// The node this client presents: id, metadata (string values) and tollgate's user agent.
fn node(options: &XdsOptions) -> Node {
    let fields = options
        .node_metadata
        .iter()
        .map(|(key, value)| {
            (
                key.clone(),
                prost_types::Value {
                    kind: Some(Kind::StringValue(value.clone())),
                },
            )
        })
        .collect();
    Node {
        id: options.node_id.clone(),
        metadata: Some(prost_types::Struct { fields }),
        user_agent_name: "tollgate".to_string(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_string(),
        )),
        ..Default::default()
    }
}

/// The TLS setup for one connection attempt: the system's roots plus the given CA, the client
/// certificate for mutual TLS, and the name the server's certificate must carry.
fn tls_config(options: &XdsOptions) -> Result<ClientTlsConfig, String> {
    use super::options::vars;

    let mut tls = ClientTlsConfig::new();
    // As the reference: the given CA is trusted in addition to the system's roots (an image
    // without any, such as a distroless one, trusts the given CA alone).
    static SYSTEM_ROOTS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let system_roots =
        *SYSTEM_ROOTS.get_or_init(|| !rustls_native_certs::load_native_certs().certs.is_empty());
    if system_roots {
        tls = tls.with_native_roots();
    }
    match &options.server_ca {
        Some(path) => {
            let pem = read(vars::SERVER_CA, path)?;
            if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
                return Err(format!(
                    "{}: {} holds no PEM certificate",
                    vars::SERVER_CA,
                    path.display()
                ));
            }
            tls = tls.ca_certificate(Certificate::from_pem(pem));
        }
        None if !system_roots => {
            return Err(format!(
                "no CA to verify the server with: this system has no trusted roots; set {}",
                vars::SERVER_CA
            ));
        }
        None => {}
    }
    if let (Some(cert), Some(key)) = (&options.client_cert, &options.client_key) {
        tls = tls.identity(Identity::from_pem(
            read(vars::CLIENT_CERT, cert)?,
            read(vars::CLIENT_KEY, key)?,
        ));
    }
    if let Some(san) = &options.server_san {
        tls = tls.domain_name(san.clone());
    }
    Ok(tls)
}

/// A TLS file's bytes, or an error naming the setting and the path (never the contents).
fn read(name: &str, path: &std::path::Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{name}: cannot read {}: {e}", path.display()))
}

/// A digest of a response's version and resources.
fn digest(version: &str, resources: &[prost_types::Any]) -> u64 {
    let mut hasher = DefaultHasher::new();
    version.hash(&mut hasher);
    for any in resources {
        any.type_url.hash(&mut hasher);
        any.value.hash(&mut hasher);
    }
    hasher.finish()
}

/// An error and its causes, `outer: inner: ...`, since transport errors say little on top.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// A gRPC status as the log shows it, with its transport causes.
fn status_text(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    if let Some(source) = status.source() {
        text.push_str(": ");
        text.push_str(&chain(source));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_carries_id_metadata_and_user_agent() {
        let options = XdsOptions {
            node_id: "envoy-ratelimit".into(),
            node_metadata: vec![("zone".into(), "eu".into())],
            ..XdsOptions::default()
        };
        let node = node(&options);
        assert_eq!(node.id, "envoy-ratelimit");
        assert_eq!(node.user_agent_name, "tollgate");
        let metadata = node.metadata.unwrap();
        assert_eq!(
            metadata.fields["zone"].kind,
            Some(Kind::StringValue("eu".into()))
        );
        // No metadata is still a (empty) Struct, as the reference sends it.
        let node = super::node(&XdsOptions::default());
        assert_eq!(node.metadata, Some(prost_types::Struct::default()));
    }

    #[test]
    fn requests_carry_version_nonce_node_and_type() {
        let client = XdsClient::new(
            XdsOptions::default(),
            ExtensionDefaults::default(),
            LoadOptions::default(),
        );
        let ack = client.request("7", "3", None);
        assert_eq!(ack.version_info, "7");
        assert_eq!(ack.response_nonce, "3");
        assert_eq!(ack.type_url, RATE_LIMIT_CONFIG_TYPE_URL);
        assert!(ack.resource_names.is_empty());
        assert_eq!(ack.node.as_ref().map(|n| n.id.as_str()), Some("default"));
        assert_eq!(ack.error_detail, None);
    }
}
