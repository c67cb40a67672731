//! The compatibility suite: envoyproxy/ratelimit's own test material, tried as a user switching
//! over would, with the settings its deployments run with. Written anew in tollgate's test style
//! from the facts of the reference's tests (envoyproxy/ratelimit at f2fb157; each case cites the
//! file and line it comes from):
//!
//! - [`fixtures`]: its config fixtures (`test/config/`) load or fail as its `config_test.go`
//!   expects, and resolve requests to the limits it expects;
//! - [`integration`]: its Go integration tests (`test/integration/`);
//! - [`service`]: its service tests (`test/service/`, and the dynamic metadata unit test);
//! - [`scripts`]: its docker-compose end-to-end scripts (`integration-test/scripts/`).
//!
//! The request→response cases run at the wire level (protobuf in, protobuf out) on every backend
//! where the reference's numbers apply: memory and one Redis server, told the time so each case
//! lands in one fixed window as the reference's do; scenarios whose windows are an hour or longer
//! also on the Redis Cluster. The memory scenarios run twice more over gRPC, to tollgate serving
//! in this process on the hand-written fast path (`memory_grpc`) and on tonic's generated
//! service (`memory_tonic`, as `--grpc-fast-path=false` serves), each answer compared field for
//! field with the library's. Sharded modes report estimates of `limit_remaining` and are left
//! out. Every deliberate difference is written at its case, with the reason, and
//! `docs/compatibility.md` lists them; [`the_inventory_is_the_one_documented`] keeps the counts
//! there true.

mod fixtures;
mod integration;
mod scripts;
mod service;
mod support;

use support::{Scenario, Tally};

/// Every request→response scenario of the suite.
fn scenarios() -> Vec<Scenario> {
    let mut all = integration::scenarios();
    all.extend(service::scenarios());
    all.extend(scripts::scenarios());
    all
}

/// The counts `docs/compatibility.md` states, and the differences it lists, are the suite's.
#[test]
fn the_inventory_is_the_one_documented() {
    let scenarios = scenarios();
    let tally = scenarios
        .iter()
        .map(Scenario::tally)
        .fold(Tally::default(), |sum, t| sum + t);
    let doc_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/compatibility.md");
    let doc = std::fs::read_to_string(&doc_path).expect("docs/compatibility.md");
    let requests = format!("{} of {} request→response cases", tally.same, tally.cases);
    assert!(
        doc.contains(&requests),
        "the document should say: {requests}"
    );
    let files = fixtures::fixture_files().len();
    let configs = format!("{files} of {files} config fixtures");
    assert!(doc.contains(&configs), "the document should say: {configs}");
    for (scenario, step, _) in scenarios.iter().flat_map(Scenario::differences) {
        assert!(
            doc.contains(scenario),
            "docs/compatibility.md should list the difference at {scenario}: {step}"
        );
    }
}
