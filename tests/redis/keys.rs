//! What the backends leave in Redis and send to it: every key with a TTL bounded by its useful
//! life, every key of one limiter in one cluster slot, limiters spread over the masters, and one
//! script call per limiter and decision with no other command.

use std::collections::{BTreeMap, HashMap};

use tollgate::backend::{Backend, Hit};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, fresh_key, hit, one};
use tollgate_testkit::redis::Monitor;
use tollgate_testkit::target::Target;

cases! {
    every_key_written_has_a_bounded_ttl: [redis, redis_cluster];
    idle_keys_of_short_windows_are_gone_within_three_windows_and_a_second: [redis, redis_cluster];
    keys_of_one_limiter_share_one_slot: [redis_cluster];
    one_script_call_per_limiter_and_no_other_command: [redis, redis_cluster];
}

const HOUR_MS: u64 = 3_600_000;

/// Every key the scripts write carries a TTL no longer than its useful life plus a margin:
/// checks, charges and releases of both algorithms.
async fn every_key_written_has_a_bounded_ttl(t: &Target) {
    let backend = t.backend().await;
    let window_ms = 60_000;
    let mut receipts = Vec::new();
    for algorithm in ALGORITHMS {
        for n in 0..20 {
            let key = fresh_key("ttl");
            let cost = if n % 3 == 0 {
                Cost::CheckOnly
            } else {
                Cost::Consume(n)
            };
            let outcome = one(&backend, &hit(&key, algorithm, 10, window_ms, cost)).await;
            receipts.extend(outcome.receipt);
        }
    }
    backend
        .release(&receipts[..receipts.len() / 2])
        .await
        .expect("release");
    let keys = tokio::task::block_in_place(|| t.keys_with_ttls());
    assert!(!keys.is_empty(), "no keys written");
    for (key, ttl) in keys {
        assert!(ttl > 0, "{key} has no TTL ({ttl})");
        // The counter keeps two windows and a margin; the log one window and two margins, the
        // second one so that calls in the seconds after need not set the expiry again.
        let bound = if key.ends_with(":c") {
            2 * window_ms + 5000
        } else {
            window_ms + 2 * 5000
        };
        assert!(ttl as u64 <= bound, "{key}: TTL {ttl} ms above {bound}");
    }
}

/// A limiter of a short window keeps its keys no longer than three windows and a second after
/// its last hit (the margins scale with the window below five seconds): plain, refused, tentative
/// and leased hits of both algorithms.
async fn idle_keys_of_short_windows_are_gone_within_three_windows_and_a_second(t: &Target) {
    let backend = t.backend().await;
    for window_ms in [1000, 2000, 4000] {
        for algorithm in ALGORITHMS {
            let key = fresh_key(&format!("short-{window_ms}"));
            let plain = hit(&key, algorithm, 2, window_ms, Cost::Consume(1));
            let kinds = [
                plain.clone(),
                Hit {
                    tentative: true,
                    group: 0,
                    descriptor_tag: false,
                    slice: false,
                    ..plain.clone()
                },
                Hit {
                    lease_ms: window_ms / 10,
                    tentative: true,
                    group: 0,
                    descriptor_tag: false,
                    slice: false,
                    ..plain.clone()
                },
                plain,
            ];
            for h in &kinds {
                one(&backend, h).await;
            }
        }
        let keys = tokio::task::block_in_place(|| t.keys_with_ttls());
        let bound = 3 * window_ms + 1000;
        for (key, ttl) in keys
            .iter()
            .filter(|(key, _)| key.contains(&format!("short-{window_ms}")))
        {
            assert!(*ttl > 0, "{key} has no TTL ({ttl})");
            assert!(*ttl as u64 <= bound, "{key}: TTL {ttl} ms above {bound}");
        }
        assert!(
            keys.iter()
                .any(|(key, _)| key.contains(&format!("short-{window_ms}"))),
            "no keys of {window_ms} ms windows in {keys:?}"
        );
    }
}

/// Every key of one limiter is in one slot, the slot tollgate computes is the cluster's, and
/// limiters spread over the masters.
async fn keys_of_one_limiter_share_one_slot(t: &Target) {
    let backend = t.backend().await;
    for n in 0..30 {
        for algorithm in ALGORITHMS {
            let key = fresh_key(&format!("slot-{n}"));
            one(
                &backend,
                &hit(&key, algorithm, 10, HOUR_MS, Cost::Consume(1)),
            )
            .await;
        }
    }
    tokio::task::block_in_place(|| {
        let cluster = t.cluster();
        let mut slots_of_limiter: HashMap<String, Vec<u16>> = HashMap::new();
        for (key, _) in t.keys_with_ttls() {
            let slot = cluster.slot_of(&key);
            assert_eq!(slot, tollgate::backend::redis::keys::slot(&key), "{key}");
            let limiter = key.rsplit_once(':').map_or(key.as_str(), |(base, _)| base);
            slots_of_limiter
                .entry(limiter.to_owned())
                .or_default()
                .push(slot);
        }
        assert_eq!(slots_of_limiter.len(), 60, "{slots_of_limiter:?}");
        let logs_with_both_keys = slots_of_limiter
            .values()
            .filter(|slots| slots.len() == 2)
            .count();
        assert_eq!(logs_with_both_keys, 30, "{slots_of_limiter:?}");
        for (limiter, slots) in &slots_of_limiter {
            assert!(
                slots.windows(2).all(|pair| pair[0] == pair[1]),
                "{limiter}: {slots:?}"
            );
        }
        let pattern = format!("{}*", t.prefix());
        let masters_used = cluster
            .masters()
            .filter(|master| !master.keys(&pattern).is_empty())
            .count();
        assert!(masters_used >= 2, "the limiters all landed on one master");
    });
}

/// Admitted decisions of three limiters each, both algorithms mixed.
fn three_limiters(round: usize) -> [Hit; 3] {
    [
        hit(
            &fresh_key(&format!("calls-c-{round}")),
            Algorithm::SlidingWindowCounter,
            1000,
            HOUR_MS,
            Cost::Consume(1),
        ),
        hit(
            &fresh_key(&format!("calls-l-{round}")),
            Algorithm::SlidingWindowLog,
            1000,
            HOUR_MS,
            Cost::Consume(2),
        ),
        hit(
            &fresh_key("calls-shared"),
            Algorithm::SlidingWindowCounter,
            1000,
            HOUR_MS,
            Cost::CheckOnly,
        ),
    ]
}

/// One decision costs one script execution per limiter and nothing else: no GET, no EXPIRE, no
/// SCRIPT LOAD per request. (Watched on private servers: a monitor sees every client.)
async fn one_script_call_per_limiter_and_no_other_command(t: &Target) {
    const ROUNDS: usize = 20;
    let watched = tokio::task::block_in_place(|| t.private());
    let backend = watched.backend().await;
    // The first call loads the scripts; only what follows is counted.
    backend.acquire(&three_limiters(usize::MAX)).await;
    let monitor = tokio::task::block_in_place(|| Monitor::watch(watched.masters()));
    for round in 0..ROUNDS {
        for result in backend.acquire(&three_limiters(round)).await {
            assert!(result.expect("decided").verdict.admitted);
        }
    }
    let calls = tokio::task::block_in_place(|| monitor.stop());
    let expected = BTreeMap::from([("evalsha".to_string(), (ROUNDS * 3) as u64)]);
    assert_eq!(calls, expected, "{}", t.name());
}
