//! Decisions in flight are bounded: past the bound a call is answered at once with
//! RESOURCE_EXHAUSTED (Envoy then applies its failure_mode_deny) instead of queueing behind the
//! stalled ones, `POST /json` answers 503, the refusals are counted, and health keeps answering.

use std::time::Duration;

use tokio::sync::mpsc;
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::rls::{client, health_status, request};
use tollgate_testkit::target::Store;

const POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
";

/// How long any answer may take on a loaded machine before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn calls_past_the_bound_are_answered_at_once() {
    let redis = RedisServer::start();
    let server = InProcess::builder()
        .policy("edge.yaml", POLICY)
        .store(Store::Redis(redis.url()))
        // The stalled calls wait on the frozen server until it thaws, not on their deadline.
        .backend_timeout(Duration::from_secs(120))
        .max_in_flight(Some(2))
        .start();
    let grpc = server.grpc_addr();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    redis.freeze();
    let (done, mut answers) = mpsc::unbounded_channel();
    for n in 0..10 {
        let done = done.clone();
        runtime.spawn(async move {
            let mut rls = client(grpc).await.expect("connect");
            let answer = rls
                .should_rate_limit(request("edge", &[&[("user", &format!("u{n}"))]]))
                .await
                .map(|response| response.into_inner().overall_code)
                .map_err(|status| status.code());
            let _ = done.send(answer);
        });
    }
    drop(done);
    // While two calls wait on the frozen backend, the other eight are refused at once.
    let refused = runtime.block_on(async {
        let mut refused = Vec::new();
        while refused.len() < 8 {
            let answer = tokio::time::timeout(PATIENCE, answers.recv())
                .await
                .expect("an answer while two calls are stalled")
                .expect("the callers are still there");
            refused.push(answer);
        }
        refused
    });
    assert!(
        refused
            .iter()
            .all(|answer| *answer == Err(tonic::Code::ResourceExhausted)),
        "{refused:?}"
    );
    // Health answers meanwhile, and so does the admin interface: 503 for a decision.
    let health = runtime.block_on(health_status(grpc, ""));
    assert!(health.is_ok(), "health answers under overload: {health:?}");
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"x"}]}]}"#;
    let reply = send(&agent(), "POST", &server.url("/json"), &[], Some(body));
    assert_eq!(reply.status, 503, "{}", reply.body);
    assert!(reply.body.contains("overloaded"), "{}", reply.body);
    let metrics = send(&agent(), "GET", &server.url("/metrics"), &[], None).body;
    assert!(
        metrics.contains("tollgate_requests_total{code=\"overloaded\"} 9"),
        "{metrics}"
    );
    // Once the backend answers, the stalled calls finish with real decisions.
    redis.thaw();
    let finished = runtime.block_on(async {
        let mut finished = Vec::new();
        while let Ok(Some(answer)) = tokio::time::timeout(PATIENCE, answers.recv()).await {
            finished.push(answer);
        }
        finished
    });
    assert_eq!(finished, [Ok(1), Ok(1)], "two OK answers");
}
