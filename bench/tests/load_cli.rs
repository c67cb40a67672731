//! Runs `tollgate-bench load` against a small in-process RLS v3 server that answers OK and
//! OVER_LIMIT alternately, and checks what it reports against what the server saw.

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;
use tokio::sync::oneshot;
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use tollgate::proto::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// A peer RLS server: alternates OK / OVER_LIMIT, refuses requests whose shape differs from the
/// one the test asked the generator for, and fails every call of the domain `fail`.
struct Alternating {
    calls: Arc<AtomicU64>,
    expected: Expected,
}

#[derive(Clone)]
struct Expected {
    descriptors: usize,
    keys: u64,
    hits_addend: u32,
}

#[tonic::async_trait]
impl RateLimitService for Alternating {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        if request.domain == "fail" {
            return Err(Status::unavailable("this domain always fails"));
        }
        self.check_shape(&request)?;
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let code = if call.is_multiple_of(2) {
            Code::Ok
        } else {
            Code::OverLimit
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        }))
    }
}

impl Alternating {
    fn check_shape(&self, request: &RateLimitRequest) -> Result<(), Status> {
        let expected = &self.expected;
        if request.domain != "benchtest" || request.hits_addend != expected.hits_addend {
            return Err(Status::invalid_argument("unexpected domain or hits_addend"));
        }
        if request.descriptors.len() != expected.descriptors {
            return Err(Status::invalid_argument("unexpected descriptor count"));
        }
        for (i, descriptor) in request.descriptors.iter().enumerate() {
            let [entry] = descriptor.entries.as_slice() else {
                return Err(Status::invalid_argument("expected one entry"));
            };
            let value: u64 = entry
                .value
                .parse()
                .map_err(|_| Status::invalid_argument("value is not a key index"))?;
            if entry.key != format!("bench_key_{i}") || value >= expected.keys {
                return Err(Status::invalid_argument("unexpected entry"));
            }
        }
        Ok(())
    }
}

/// A running peer server; stops when dropped.
struct PeerServer {
    addr: SocketAddr,
    calls: Arc<AtomicU64>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl PeerServer {
    async fn start(expected: Expected) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicU64::new(0));
        let service = Alternating {
            calls: Arc::clone(&calls),
            expected,
        };
        let (shutdown, stopped) = oneshot::channel::<()>();
        tokio::spawn(
            Server::builder()
                .add_service(RateLimitServiceServer::new(service))
                .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                    let _ = stopped.await;
                }),
        );
        PeerServer {
            addr,
            calls,
            shutdown: Some(shutdown),
        }
    }

    fn target(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
    }
}

/// Runs the bench binary to completion off the runtime, so the peer server keeps serving.
async fn bench(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_tollgate-bench"))
            .arg("load")
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

async fn bench_json(args: Vec<String>) -> Value {
    let output = bench(args).await;
    assert!(
        output.status.success(),
        "tollgate-bench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn count(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing in {report}"))
}

fn assert_percentiles_ordered(report: &Value) {
    let latency = &report["latency_us"];
    let values: Vec<f64> = ["min", "p50", "p90", "p99", "p99_9", "max"]
        .iter()
        .map(|name| latency[name].as_f64().unwrap())
        .collect();
    assert!(values[0] > 0.0, "{latency}");
    assert!(values.windows(2).all(|w| w[0] <= w[1]), "{latency}");
}

fn shape() -> Expected {
    Expected {
        descriptors: 3,
        keys: 50,
        hits_addend: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_counts_add_up() {
    let server = PeerServer::start(shape()).await;
    let mut args = strings(&[
        "--requests",
        "200",
        "--json",
        "--connections",
        "2",
        "--concurrency",
        "8",
        "--domain",
        "benchtest",
        "--descriptors",
        "3",
        "--keys",
        "50",
        "--distribution",
        "zipf",
        "--zipf-exponent",
        "1.2",
        "--hits-addend",
        "2",
        "--seed",
        "42",
        "--threads",
        "1",
        "--target",
    ]);
    args.push(server.target());
    let report = bench_json(args).await;

    assert_eq!(report["mode"], "closed");
    assert_eq!(count(&report, "requests"), 200);
    let (ok, over, unknown, errors) = (
        count(&report, "ok"),
        count(&report, "over_limit"),
        count(&report, "unknown"),
        count(&report, "errors"),
    );
    assert_eq!(errors, 0, "{report}");
    assert_eq!(ok + over + unknown + errors, 200);
    // The peer alternates strictly, so its answers split evenly.
    assert_eq!((ok, over, unknown), (100, 100, 0));
    assert_eq!(count(&report, "decisions"), 200);
    assert!(report["decisions_per_second"].as_f64().unwrap() > 0.0);
    assert_percentiles_ordered(&report);
    assert_eq!(server.calls(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_with_warmup_reports_only_the_measured_calls() {
    let server = PeerServer::start(shape()).await;
    let mut args = strings(&[
        "--requests",
        "200",
        "--rate",
        "2000",
        "--warmup",
        "50ms",
        "--json",
        "--concurrency",
        "4",
        "--domain",
        "benchtest",
        "--descriptors",
        "3",
        "--keys",
        "50",
        "--hits-addend",
        "2",
        "--target",
    ]);
    args.push(server.target());
    let report = bench_json(args).await;

    assert_eq!(report["mode"], "open");
    assert_eq!(report["target_rate"].as_f64(), Some(2000.0));
    assert_eq!(count(&report, "requests"), 200);
    assert_eq!(count(&report, "errors"), 0, "{report}");
    assert_eq!(count(&report, "ok") + count(&report, "over_limit"), 200);
    assert!(count(&report, "decisions") > 0);
    assert_percentiles_ordered(&report);
    // Warmup traffic reached the server but is not in the report.
    assert!(server.calls() > 200, "server saw {} calls", server.calls());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_calls_are_counted_by_grpc_code() {
    let server = PeerServer::start(shape()).await;
    let mut args = strings(&["--requests", "30", "--json", "--domain", "fail", "--target"]);
    args.push(server.target());
    let report = bench_json(args).await;

    assert_eq!(count(&report, "requests"), 30);
    assert_eq!(count(&report, "errors"), 30);
    assert_eq!(count(&report, "decisions"), 0);
    assert_eq!(report["errors_by_code"]["UNAVAILABLE"].as_u64(), Some(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_report_names_outcomes_and_percentiles() {
    let server = PeerServer::start(shape()).await;
    let mut args = strings(&[
        "--requests",
        "20",
        "--domain",
        "benchtest",
        "--descriptors",
        "3",
        "--keys",
        "50",
        "--hits-addend",
        "2",
        "--target",
    ]);
    args.push(server.target());
    let output = bench(args).await;

    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("20 calls"), "{text}");
    assert!(text.contains("OK 10  OVER_LIMIT 10"), "{text}");
    for label in ["p50", "p90", "p99", "p99.9", "max"] {
        assert!(text.contains(label), "{label} missing in {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_target_fails_fast_with_a_message() {
    // A port that was free a moment ago and has no listener now.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let output = bench(vec![
        "--requests".into(),
        "5".into(),
        "--target".into(),
        format!("http://{addr}"),
    ])
    .await;

    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot connect"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_bound_runs_stop_by_themselves() {
    let server = PeerServer::start(shape()).await;
    for mode in [&["--rate", "500"][..], &[]] {
        let mut args = strings(&[
            "--duration",
            "200ms",
            "--json",
            "--domain",
            "benchtest",
            "--descriptors",
            "3",
            "--keys",
            "50",
            "--hits-addend",
            "2",
        ]);
        args.extend(strings(mode));
        args.push("--target".into());
        args.push(server.target());
        let report = bench_json(args).await;

        let requests = count(&report, "requests");
        assert!(requests > 0, "{report}");
        assert_eq!(count(&report, "errors"), 0, "{report}");
        assert_eq!(
            count(&report, "ok") + count(&report, "over_limit") + count(&report, "unknown"),
            requests
        );
        assert_eq!(report["duration_seconds"].as_f64(), Some(0.2));
        assert_percentiles_ordered(&report);
    }
}
