//! What an operator sees on the admin port of the real binary: `GET /top` names the descriptors
//! being refused (and `tollgate_top_refused` counts them), `GET /ui/stats` charts each limit's
//! decisions, and `GET /ui`, rendered by a real headless Chromium, shows the domains, who is
//! refused and a descriptor's usage.

use serde_json::Value;
use tollgate::proto::rate_limit_response::Code;
use tollgate_testkit::chromium;
use tollgate_testkit::net::{Reply, agent, send};
use tollgate_testkit::rls::{client, request};
use tollgate_testkit::tollgate::Tollgate;

/// Domain `edge`: 2 hits a minute per user.
const EDGE: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

/// Domain `internal`: a named limit nothing hits.
const INTERNAL: &str = "domain: internal
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000, name: per_client}
";

fn get(tollgate: &Tollgate, path: &str) -> Reply {
    send(&agent(), "GET", &tollgate.url(path), &[], None)
}

/// One hit of `user` on `edge` through `POST /json`; answers the status.
fn hit(tollgate: &Tollgate, user: &str) -> u16 {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
    );
    send(
        &agent(),
        "POST",
        &tollgate.url("/json"),
        &[("content-type", "application/json")],
        Some(&body),
    )
    .status
}

/// tollgate with alice refused 3 times (5 hits on 2 a minute, over `POST /json` and gRPC) and
/// bob admitted once.
fn refusing() -> Tollgate {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", EDGE)
        .policy("internal.yaml", INTERNAL)
        .start();
    let answers: Vec<u16> = (0..3).map(|_| hit(&tollgate, "alice")).collect();
    assert_eq!(answers, [200, 200, 429]);
    // Two more over gRPC (the fast path): refusals through either door count alike.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime");
    let codes = runtime.block_on(async {
        let mut rls = client(tollgate.grpc_addr())
            .await
            .expect("connect over gRPC");
        let mut codes = Vec::new();
        for _ in 0..2 {
            let answer = rls
                .should_rate_limit(request("edge", &[&[("user", "alice")]]))
                .await
                .expect("ShouldRateLimit");
            codes.push(answer.into_inner().overall_code);
        }
        codes
    });
    assert_eq!(codes, [Code::OverLimit as i32; 2]);
    assert_eq!(hit(&tollgate, "bob"), 200);
    tollgate
}

#[test]
fn top_names_the_refused_descriptor_and_refuses_bad_queries() {
    let tollgate = refusing();
    let reply = get(&tollgate, "/top?domain=edge");
    assert_eq!(reply.status, 200, "{}", reply.body);
    let top: Value = serde_json::from_str(&reply.body).expect("JSON");
    assert_eq!(
        top,
        serde_json::json!({
            "domain": "edge",
            "refused": [{
                "entries": [{"key": "user", "value": "alice"}],
                "limit": "edge.user",
                "count": 3,
            }],
        })
    );
    let nothing: Value =
        serde_json::from_str(&get(&tollgate, "/top?domain=internal&n=5").body).expect("JSON");
    assert_eq!(nothing["refused"], serde_json::json!([]));

    for (query, status, reason) in [
        ("/top", 400, "`domain` is missing"),
        ("/top?domain=", 400, "`domain` is empty"),
        ("/top?domain=edge&n=0", 400, "from 1 to 64"),
        ("/top?domain=edge&n=many", 400, "not `many`"),
        ("/top?domain=edge&n=100000", 400, "from 1 to 64"),
        ("/top?domain=nowhere", 404, "no domain `nowhere`"),
    ] {
        let reply = get(&tollgate, query);
        assert_eq!(reply.status, status, "{query}: {}", reply.body);
        assert!(reply.body.contains(reason), "{query}: {}", reply.body);
    }

    let metrics = get(&tollgate, "/metrics").body;
    assert!(
        metrics.contains(r#"tollgate_top_refused{domain="edge",rank="1",limit="edge.user"} 3"#),
        "{metrics}"
    );
    assert!(!metrics.contains("alice"), "no descriptor value in metrics");
}

#[test]
fn ui_stats_chart_each_limits_decisions() {
    let tollgate = refusing();
    let stats: Value = serde_json::from_str(&get(&tollgate, "/ui/stats").body).expect("JSON");
    assert_eq!(stats["resetEnabled"], false);
    assert_eq!(stats["slotSeconds"], 10);
    let domains = stats["domains"].as_array().expect("domains");
    let names: Vec<&str> = domains.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, ["edge", "internal"]);
    let per_user = &domains[0]["limits"][0];
    assert_eq!(per_user["key"], "edge.user");
    assert_eq!(per_user["requestsPerUnit"], 2);
    assert_eq!(per_user["unit"], "MINUTE");
    let sum = |series: &Value| -> u64 {
        let slots = series.as_array().expect("slots");
        assert_eq!(slots.len(), 60);
        slots.iter().filter_map(Value::as_u64).sum()
    };
    assert_eq!(sum(&per_user["decided"]), 6);
    assert_eq!(sum(&per_user["refused"]), 3);
    let per_client = &domains[1]["limits"][0];
    assert_eq!(per_client["name"], "per_client");
    assert_eq!(sum(&per_client["decided"]), 0);
}

#[test]
fn the_page_shows_the_domains_and_who_is_refused() {
    let tollgate = refusing();
    let page = get(&tollgate, "/ui");
    assert_eq!(page.status, 200);
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );

    let dom = chromium::dump_dom(&tollgate.url("/ui"));
    for domain in ["edge", "internal"] {
        assert!(
            dom.contains(&format!(r#"<h3 class="domain">{domain}</h3>"#)),
            "domain {domain} not shown:\n{dom}"
        );
    }
    assert!(dom.contains("<code>edge.user</code>"), "{dom}");
    // alice, refused 3 times, in edge's top table; bob, never refused, nowhere in it.
    let top = dom
        .split(r#"<table id="top-edge">"#)
        .nth(1)
        .and_then(|rest| rest.split("</table>").next())
        .unwrap_or_else(|| panic!("no top table for edge:\n{dom}"));
    assert!(top.contains(">user=alice</a>"), "{top}");
    assert!(top.contains(r#"<td class="num">3</td>"#), "{top}");
    assert!(!top.contains("bob"), "{top}");
    // No reset button without --admin-allow-reset.
    assert!(
        dom.contains(r#"id="reset" hidden"#),
        "reset offered:\n{dom}"
    );

    // A screenshot renders too. docs/ui.png was taken the same way, of the examples' policies
    // under traffic; TOLLGATE_UI_SCREENSHOT=<file> keeps this one.
    let dir = tempfile::tempdir().expect("temporary directory");
    let png = dir.path().join("ui.png");
    chromium::screenshot(&tollgate.url("/ui"), &png, (1100, 640));
    let bytes = std::fs::read(&png).expect("read the screenshot");
    assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
    if let Some(keep) = std::env::var_os("TOLLGATE_UI_SCREENSHOT") {
        std::fs::copy(&png, keep).expect("keep the screenshot");
    }
}

/// The look-up form, filled from the page's query string, shows the descriptor's usage from
/// `POST /counters`.
#[test]
fn the_page_looks_up_a_descriptors_usage() {
    let tollgate = refusing();
    let dom = chromium::dump_dom(&tollgate.url("/ui?domain=edge&descriptor=user=alice"));
    let result = dom
        .split(r#"<div id="lookup-result">"#)
        .nth(1)
        .unwrap_or_else(|| panic!("no look-up result:\n{dom}"));
    assert!(
        result.contains(r#"<td class="num used">2 of 2 / minute</td>"#),
        "usage not shown:\n{result}"
    );
    assert!(
        result.contains(r#"<td class="num remaining">0 left</td>"#),
        "{result}"
    );
}
