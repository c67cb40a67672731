//! A backend that answers pings but refuses every script call (here: Redis out of memory under
//! `noeviction`) leaves every decision on its failure mode. By default health stays SERVING (a
//! sidecar turning unready would take its application out of service, the opposite of
//! `failure_mode: allow`); with `--health-fail-after` it turns NOT_SERVING once every call has
//! failed that long, and SERVING again when calls succeed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::target::Store;
use tollgate_testkit::wait;

const POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1000000}
";

fn health(server: &InProcess) -> u16 {
    send(&agent(), "GET", &server.url("/healthcheck"), &[], None).status
}

fn decide(server: &InProcess) -> u16 {
    let body = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
    send(&agent(), "POST", &server.url("/json"), &[], Some(body)).status
}

#[test]
fn sustained_failure_turns_health_only_when_asked() {
    let redis = RedisServer::start();
    let start = |fail_after: Option<Duration>| {
        let builder = InProcess::builder()
            .policy("edge.yaml", POLICY)
            .store(Store::Redis(redis.url()));
        match fail_after {
            Some(after) => builder.health_fail_after(after),
            None => builder,
        }
        .start()
    };
    let strict = start(Some(Duration::from_secs(2)));
    let lenient = start(None);
    assert_eq!((health(&strict), health(&lenient)), (200, 200));

    // Out of memory: every script that writes is refused; PING still answers.
    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "1"]), "OK");
    let traffic = Arc::new(AtomicBool::new(true));
    let sender = {
        let traffic = Arc::clone(&traffic);
        let urls = [strict.url("/json"), lenient.url("/json")];
        std::thread::spawn(move || {
            let body =
                r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}"#;
            while traffic.load(Ordering::SeqCst) {
                for url in &urls {
                    // Failure mode allow: each answer is a 200 either way.
                    assert_eq!(send(&agent(), "POST", url, &[], Some(body)).status, 200);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    wait::until(
        "the opted-in instance to turn NOT_SERVING",
        Duration::from_secs(60),
        || health(&strict) == 503,
    );
    let reason = send(&agent(), "GET", &strict.url("/healthcheck"), &[], None).body;
    assert!(reason.contains("every backend call has failed"), "{reason}");
    assert!(
        reason.contains("OOM"),
        "the reason names the error: {reason}"
    );
    // The other instance, failing alike, stays in service: its limits answer their failure mode.
    assert_eq!(health(&lenient), 200);
    assert_eq!(decide(&lenient), 200);

    assert_eq!(redis.cli(&["CONFIG", "SET", "maxmemory", "0"]), "OK");
    wait::until(
        "the opted-in instance to serve again",
        Duration::from_secs(60),
        || health(&strict) == 200,
    );
    traffic.store(false, Ordering::SeqCst);
    sender.join().expect("the traffic thread");
}
