//! A real OTLP trace receiver for tests: the collector's gRPC `TraceService` and the OTLP/HTTP
//! protobuf endpoint (`POST /v1/traces`), each on its own loopback listener, keeping every span
//! they are sent so a test can wait for the ones it expects and inspect them.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message;
use tokio::runtime::Runtime;
use tokio_stream::wrappers::TcpListenerStream;

/// Which door a span came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// OTLP over gRPC.
    Grpc,
    /// OTLP over HTTP (protobuf body).
    Http,
}

/// One received span, with ids in lowercase hex (an empty parent when it is a root).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedSpan {
    /// Which protocol delivered it.
    pub via: Via,
    /// The span's name.
    pub name: String,
    /// The OTLP span kind (2 = server, 3 = client).
    pub kind: i32,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// 16 hex digits, or empty.
    pub parent_span_id: String,
    /// The span's attributes, values as text.
    pub attributes: BTreeMap<String, String>,
    /// The attributes of the resource that sent it (service.name, ...), values as text.
    pub resource: BTreeMap<String, String>,
}

impl ReceivedSpan {
    /// The attribute `key` as text, if present.
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }
}

#[derive(Default)]
struct Store {
    spans: Mutex<Vec<ReceivedSpan>>,
    arrived: Condvar,
}

impl Store {
    fn add(&self, via: Via, request: ExportTraceServiceRequest) {
        let mut received = Vec::new();
        for resource_spans in request.resource_spans {
            let resource = resource_spans
                .resource
                .map(|r| text_map(&r.attributes))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    received.push(ReceivedSpan {
                        via,
                        name: span.name,
                        kind: span.kind,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: text_map(&span.attributes),
                        resource: resource.clone(),
                    });
                }
            }
        }
        let mut spans = self.spans.lock().unwrap_or_else(|e| e.into_inner());
        spans.extend(received);
        self.arrived.notify_all();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text_map(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// A running receiver; stops when dropped.
pub struct OtlpReceiver {
    runtime: Option<Runtime>,
    store: Arc<Store>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
}

impl OtlpReceiver {
    /// A receiver on two free loopback ports.
    pub fn start() -> OtlpReceiver {
        let bind = || std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        OtlpReceiver::serve(bind(), bind())
    }

    /// A receiver answering OTLP/gRPC on `grpc` and OTLP/HTTP on `http`.
    pub fn serve(grpc: std::net::TcpListener, http: std::net::TcpListener) -> OtlpReceiver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("start the receiver's runtime");
        let store = Arc::new(Store::default());
        let grpc_addr = grpc.local_addr().expect("a bound listener has an address");
        let http_addr = http.local_addr().expect("a bound listener has an address");
        for listener in [&grpc, &http] {
            listener
                .set_nonblocking(true)
                .expect("make the listener non-blocking");
        }
        let _guard = runtime.enter();
        let grpc = tokio::net::TcpListener::from_std(grpc).expect("adopt the gRPC listener");
        let http = tokio::net::TcpListener::from_std(http).expect("adopt the HTTP listener");
        let service = TraceServiceServer::new(GrpcDoor {
            store: Arc::clone(&store),
        });
        runtime.spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(grpc))
                .await;
        });
        let http_store = Arc::clone(&store);
        runtime.spawn(async move {
            loop {
                let Ok((stream, _)) = http.accept().await else {
                    continue;
                };
                let store = Arc::clone(&http_store);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        http_door(Arc::clone(&store), request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        drop(_guard);
        OtlpReceiver {
            runtime: Some(runtime),
            store,
            grpc_addr,
            http_addr,
        }
    }

    /// The endpoint for `OTEL_EXPORTER_OTLP_ENDPOINT` with `TRACING_EXPORTER_PROTOCOL=grpc`.
    pub fn grpc_endpoint(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    /// The endpoint (a base; the exporter adds `/v1/traces`) for
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` with `TRACING_EXPORTER_PROTOCOL=http`.
    pub fn http_endpoint(&self) -> String {
        format!("http://{}", self.http_addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.store
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The spans of trace `trace_id` once `done` holds for them; panics naming `what` and
    /// listing what did arrive when `limit` passes first.
    pub fn wait_for_trace(
        &self,
        what: &str,
        trace_id: &str,
        limit: Duration,
        done: impl Fn(&[ReceivedSpan]) -> bool,
    ) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + limit;
        let mut spans = self.store.spans.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let of_trace: Vec<ReceivedSpan> = spans
                .iter()
                .filter(|s| s.trace_id == trace_id)
                .cloned()
                .collect();
            if done(&of_trace) {
                return of_trace;
            }
            let now = Instant::now();
            if now >= deadline {
                panic!(
                    "{what}: not received within {limit:?}; spans of trace {trace_id}: \
                     {of_trace:#?}; all spans: {:#?}",
                    *spans
                );
            }
            spans = self
                .store
                .arrived
                .wait_timeout(spans, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

struct GrpcDoor {
    store: Arc<Store>,
}

#[tonic::async_trait]
impl TraceService for GrpcDoor {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.store.add(Via::Grpc, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

async fn http_door(
    store: Arc<Store>,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let reply = |status: StatusCode, body: Vec<u8>| {
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        response.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/x-protobuf"),
        );
        Ok(response)
    };
    if request.method() != Method::POST || request.uri().path() != "/v1/traces" {
        return reply(StatusCode::NOT_FOUND, Vec::new());
    }
    let body = match request.into_body().collect().await {
        Ok(body) => body.to_bytes(),
        Err(_) => return reply(StatusCode::BAD_REQUEST, Vec::new()),
    };
    match ExportTraceServiceRequest::decode(body) {
        Ok(export) => {
            store.add(Via::Http, export);
            reply(
                StatusCode::OK,
                ExportTraceServiceResponse {
                    partial_success: None,
                }
                .encode_to_vec(),
            )
        }
        Err(_) => reply(StatusCode::BAD_REQUEST, Vec::new()),
    }
}
