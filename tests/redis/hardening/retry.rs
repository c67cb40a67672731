//! Every resend a backend makes is safe: a script call is sent again only when the node certainly
//! did not run it. The case cuts the connection that carried a refund after the server ran it and
//! before the reply came back, as a node dying or a path breaking mid-call does; a backend that
//! sent it again would give the charge back twice, and the limit would admit more than it allows.

use tokio::task::block_in_place;
use tollgate::backend::redis::KeySpace;
use tollgate::backend::{AnyBackend, Backend, ClusterBackend, RedisBackend};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{assert_admitted, fresh_key, hit, one};
use tollgate_testkit::proxy::CutProxy;
use tollgate_testkit::target::{CALL_TIMEOUT, Target};
use tollgate_testkit::wait;

cases! {
    a_refund_in_doubt_is_never_sent_again: [redis, redis_cluster];
}

/// A window so long that no fixed-window boundary falls inside a test run.
const LONG_WINDOW_MS: u64 = 1 << 40;

/// The proxied backend and a direct one on the same data, with the proxy in front of the node
/// that holds `key`: for one server, the server; for a cluster, the master of the key's slot,
/// which then announces the proxy's port to the cluster, so clients reach it only through it.
async fn proxied(t: &Target, key: &str) -> (CutProxy, AnyBackend, AnyBackend) {
    let prefix = t.prefix();
    match t.store() {
        tollgate_testkit::target::Store::Redis(url) => {
            let proxy = CutProxy::start(t.redis_server().port());
            let through = format!("redis://127.0.0.1:{}", proxy.port());
            let proxied = RedisBackend::connect(&through, prefix, CALL_TIMEOUT)
                .await
                .expect("the proxied backend");
            let direct = RedisBackend::connect(url, prefix, CALL_TIMEOUT)
                .await
                .expect("the direct backend");
            (proxy, AnyBackend::Redis(proxied), AnyBackend::Redis(direct))
        }
        tollgate_testkit::target::Store::Cluster(_) => {
            let cluster = t.cluster();
            let redis_key = KeySpace::counter(&KeySpace::new(prefix).base(key));
            let master = block_in_place(|| cluster.master_of(&redis_key));
            let proxy = CutProxy::start(master.port());
            let (port, bus) = (
                proxy.port().to_string(),
                (master.port() + 10_000).to_string(),
            );
            block_in_place(|| {
                assert_eq!(
                    master.cli(&["CONFIG", "SET", "cluster-announce-bus-port", &bus]),
                    "OK"
                );
                assert_eq!(
                    master.cli(&["CONFIG", "SET", "cluster-announce-port", &port]),
                    "OK"
                );
                let announced = format!("127.0.0.1:{port}@");
                wait::until(
                    "every node to know the master by the proxy's port",
                    std::time::Duration::from_secs(60),
                    || {
                        cluster
                            .running()
                            .all(|node| node.cli(&["CLUSTER", "NODES"]).contains(&announced))
                    },
                );
            });
            // Seeds without the master: its address comes from the slot map, the proxy's.
            let seeds: Vec<String> = cluster
                .running()
                .filter(|node| node.port() != master.port())
                .map(|node| node.url())
                .collect();
            let proxied = ClusterBackend::connect(&seeds, prefix, CALL_TIMEOUT)
                .await
                .expect("the proxied backend");
            let direct = ClusterBackend::connect(&seeds, prefix, CALL_TIMEOUT)
                .await
                .expect("the second backend");
            (
                proxy,
                AnyBackend::Cluster(proxied),
                AnyBackend::Cluster(direct),
            )
        }
        tollgate_testkit::target::Store::Memory => panic!("memory has no connection to cut"),
    }
}

async fn a_refund_in_doubt_is_never_sent_again(t: &Target) {
    let private = block_in_place(|| t.private());
    let key = fresh_key("doubt");
    let (proxy, backend, other) = proxied(&private, &key).await;
    // The sliding window counter: a refund subtracts, so one sent twice gives back twice.
    let h = hit(
        &key,
        Algorithm::SlidingWindowCounter,
        10,
        LONG_WINDOW_MS,
        Cost::Consume(1),
    );
    let mut receipts = Vec::new();
    for left in [9, 8, 7] {
        let outcome = one(&backend, &h).await;
        assert_admitted(&outcome, true, left);
        receipts.push(outcome.receipt.expect("a receipt"));
    }
    proxy.cut_after(b"EVALSHA");
    // The answer is lost: the refund may or may not have happened, as far as the backend knows.
    let released = backend.release(&receipts[..1]).await;
    assert_eq!(
        proxy.cuts(),
        1,
        "the refund's connection was cut: {released:?}"
    );
    assert!(
        released.is_err(),
        "a refund whose answer was lost is not known to have run"
    );
    // It ran exactly once: 3 charged, 1 given back.
    let check = hit(
        &key,
        Algorithm::SlidingWindowCounter,
        10,
        LONG_WINDOW_MS,
        Cost::CheckOnly,
    );
    assert_eq!(
        one(&other, &check).await.verdict.remaining,
        8,
        "the refund was applied more than once"
    );
    // And the backend carries on over a new connection.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        match backend
            .acquire(std::slice::from_ref(&check))
            .await
            .remove(0)
        {
            Ok(outcome) => {
                assert_eq!(outcome.verdict.remaining, 8);
                break;
            }
            Err(err) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no answer after the cut: {err}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
