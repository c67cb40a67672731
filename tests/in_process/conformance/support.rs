//! Asking a limiter and reading its decisions, for the limiter-level groups.

use std::sync::atomic::{AtomicU64, Ordering};

use tollgate::descriptor::{Descriptor, Request};
use tollgate::limiter::{Code, Decision, Limiter};
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::requests::{descriptor as d, request};

/// The policy domain of every limiter-level case.
pub const DOMAIN: &str = "conformance";

/// A limiter over a target's backend stack.
pub type TestLimiter = Limiter<TestBackend>;

/// A descriptor value no other case uses. It carries the separators of the key layout and
/// hash-tag braces, which must neither collide nor split a limiter across cluster slots.
pub fn fresh(case: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{case}-{}:{{v}}|a.b=c",
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A request for [`DOMAIN`].
pub fn req(descriptors: Vec<Descriptor>) -> Request {
    request(DOMAIN, descriptors)
}

/// Decides `request`, which must be valid; one status per descriptor.
pub async fn ask(limiter: &TestLimiter, request: &Request) -> Decision {
    let decision = limiter
        .should_rate_limit(request)
        .await
        .unwrap_or_else(|err| panic!("{request:?}: {err}"));
    assert_eq!(decision.statuses.len(), request.descriptors.len());
    decision
}

/// Decides a request with this one descriptor.
pub async fn ask_one(limiter: &TestLimiter, descriptor: Descriptor) -> Decision {
    ask(limiter, &req(vec![descriptor])).await
}

/// Asks about one descriptor and asserts the overall code and the units it has left; `what`
/// names the step in the failure message.
pub async fn assert_one(
    limiter: &TestLimiter,
    descriptor: Descriptor,
    expected: (Code, u32),
    what: &str,
) {
    let decision = ask_one(limiter, descriptor).await;
    assert_eq!(
        (decision.overall, decision.statuses[0].remaining),
        expected,
        "{what}: {decision:?}"
    );
}

/// Asks about one descriptor with `hits_addend: 0`, which counts nothing, and answers the units
/// it has left.
pub async fn units_left(limiter: &TestLimiter, entries: &[(&str, &str)]) -> u32 {
    let mut probe = d(entries);
    probe.hits_addend = Some(0);
    ask_one(limiter, probe).await.statuses[0].remaining
}

/// The code of every status, in order.
pub fn codes(decision: &Decision) -> Vec<Code> {
    decision.statuses.iter().map(|s| s.code).collect()
}

/// The reset of status `index` in whole seconds.
pub fn reset_s(decision: &Decision, index: usize) -> u64 {
    decision.statuses[index]
        .reset
        .unwrap_or_else(|| panic!("status {index} has no reset: {decision:?}"))
        .as_secs()
}

/// The `retry-after` header's seconds, if the decision has one (and no other header).
pub fn retry_after(decision: &Decision) -> Option<u64> {
    match decision.response_headers.as_slice() {
        [] => None,
        [(name, value)] if name == "retry-after" => {
            Some(value.parse().expect("retry-after is whole seconds"))
        }
        other => panic!("unexpected response headers {other:?}"),
    }
}

/// Asserts a status that no limit applied to.
pub fn assert_free(decision: &Decision, index: usize, what: &str) {
    let status = &decision.statuses[index];
    assert_eq!(status.code, Code::Ok, "{what}: {decision:?}");
    assert!(status.limit.is_none(), "{what}: {decision:?}");
}
