//! The limits of one descriptor decided together (`Hit::group`, issue 54): one call of the group
//! script charges a hit to every limit or to none. Each limit answers what it would alone; a
//! refusal leaves the others' windows as they were (tentative charges off the tally too), but a
//! limit that records refused hits keeps its charge; a check writes nothing; and on a cluster
//! the limits of one descriptor share a slot, so the call runs there.

use tollgate::backend::redis::KeySpace;
use tollgate::backend::redis::keys::slot;
use tollgate::backend::{AnyBackend, Backend, Hit, Outcome, RedisBackend};
use tollgate::window::{Algorithm, Cost, Counting};
use tollgate_testkit::cases;
use tollgate_testkit::hits::fresh_key;
use tollgate_testkit::target::{CALL_TIMEOUT, Store, Target};

cases! {
    an_admitted_group_charges_every_limit_and_a_refused_one_none: [redis, redis_cluster];
    each_limit_answers_as_alone_and_a_refusal_leaves_no_charge: [redis];
    a_limit_counting_every_hit_keeps_its_charge: [redis];
    tentative_charges_given_back_leave_the_tally: [redis];
    a_check_only_group_writes_nothing: [redis];
    a_group_survives_a_flushed_script_cache: [redis, redis_cluster];
}

const HOUR_MS: u64 = 3_600_000;
const START: u64 = 1_700_000_000_000;

/// The limit of the descriptor `head` with `algorithm`, `limit` and `window_ms`, one of the group
/// `group`: its identity ends in `@<c|l><window>`, as the limiter writes it.
fn limit(head: &str, algorithm: Algorithm, limit: u64, window_ms: u64) -> Hit {
    let letter = match algorithm {
        Algorithm::SlidingWindowCounter => 'c',
        Algorithm::SlidingWindowLog => 'l',
    };
    Hit {
        key: format!("{head}@{letter}{window_ms}"),
        algorithm,
        limit,
        window_ms,
        cost: Cost::Consume(1),
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: true,
        group: 1,
        descriptor_tag: true,
        slice: false,
    }
}

/// The same hits, alone: no group.
fn alone(hits: &[Hit]) -> Vec<Hit> {
    hits.iter()
        .map(|hit| Hit {
            group: 0,
            ..hit.clone()
        })
        .collect()
}

/// The same hits with `cost`.
fn costing(hits: &[Hit], cost: Cost) -> Vec<Hit> {
    hits.iter()
        .map(|hit| Hit {
            cost,
            ..hit.clone()
        })
        .collect()
}

/// The outcomes of `hits`, every one decided.
async fn decided<B: Backend>(backend: &B, hits: &[Hit]) -> Vec<Outcome> {
    let results = backend.acquire(hits).await;
    assert_eq!(results.len(), hits.len(), "one answer per hit");
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|err| panic!("{hits:?}: {err}")))
        .collect()
}

/// The outcomes of `hits` decided at the instant `now`, every one decided.
async fn decided_at(backend: &RedisBackend, hits: &[Hit], now: u64) -> Vec<Outcome> {
    let results = backend.acquire_at(hits, now).await;
    assert_eq!(results.len(), hits.len(), "one answer per hit");
    results
        .into_iter()
        .map(|result| result.unwrap_or_else(|err| panic!("{hits:?}: {err}")))
        .collect()
}

/// Each hit's admission and what it left.
fn verdicts(outcomes: &[Outcome]) -> Vec<(bool, u64)> {
    outcomes
        .iter()
        .map(|outcome| (outcome.verdict.admitted, outcome.verdict.remaining))
        .collect()
}

async fn single(t: &Target) -> RedisBackend {
    RedisBackend::connect(&t.redis_server().url(), t.prefix(), CALL_TIMEOUT)
        .await
        .expect("connect")
}

/// Every Redis key of `hit`, as the backends name them.
fn redis_keys(t: &Target, hit: &Hit) -> Vec<String> {
    let base = KeySpace::new(t.prefix()).hit_base(&hit.key, hit.descriptor_tag);
    match hit.algorithm {
        Algorithm::SlidingWindowCounter => vec![KeySpace::counter(&base)],
        Algorithm::SlidingWindowLog => vec![KeySpace::log(&base), KeySpace::log_meta(&base)],
    }
}

/// A counter of 3 an hour and a log of 5 an hour of one descriptor: three hits are charged to
/// both; the fourth, refused by the counter, to neither (the log's answer keeps its own verdict
/// but no receipt, and the log alone still has 2 left). On a cluster every key of the descriptor
/// is in one slot, the slot the node reports, and the group is one call there.
async fn an_admitted_group_charges_every_limit_and_a_refused_one_none(t: &Target) {
    let backend: AnyBackend = t.store().connect(t.prefix(), CALL_TIMEOUT).await;
    let head = fresh_key("group");
    let group = [
        limit(&head, Algorithm::SlidingWindowCounter, 3, HOUR_MS),
        limit(&head, Algorithm::SlidingWindowLog, 5, HOUR_MS),
    ];
    assert!(backend.joint(&group), "one descriptor's limits are joint");
    for n in 1..=3 {
        let outcomes = decided(&backend, &group).await;
        assert_eq!(
            verdicts(&outcomes),
            [(true, 3 - n), (true, 5 - n)],
            "hit {n}"
        );
        assert!(outcomes.iter().all(|outcome| outcome.receipt.is_some()));
    }
    let outcomes = decided(&backend, &group).await;
    assert_eq!(verdicts(&outcomes), [(false, 0), (true, 1)]);
    assert!(outcomes.iter().all(|outcome| outcome.receipt.is_none()));
    assert!(outcomes[0].verdict.reset_ms > 0);
    let check = decided(&backend, &alone(&costing(&group, Cost::CheckOnly))).await;
    assert_eq!(verdicts(&check), [(true, 0), (true, 2)]);

    if let Store::Cluster(_) = t.store() {
        let keys: Vec<String> = group.iter().flat_map(|hit| redis_keys(t, hit)).collect();
        tokio::task::block_in_place(|| {
            let cluster = t.cluster();
            let slots: Vec<u16> = keys.iter().map(|key| cluster.slot_of(key)).collect();
            assert!(slots.iter().all(|&s| s == slots[0]), "{keys:?}: {slots:?}");
            assert_eq!(slots[0], slot(&keys[0]));
            let stored: Vec<String> = t
                .keys_with_ttls()
                .into_iter()
                .map(|(key, _)| key)
                .filter(|key| key.contains(&head))
                .collect();
            assert_eq!(stored.len(), 3, "{stored:?}");
        });
        // Without the descriptor's tag, two limits whose keys fall in different slots are not
        // joint on a cluster (the limiter then decides them one by one).
        let untagged: Vec<Hit> = (0..20)
            .map(|n| Hit {
                descriptor_tag: false,
                slice: false,
                ..limit(
                    &format!("{head}-{n}"),
                    Algorithm::SlidingWindowCounter,
                    3,
                    HOUR_MS,
                )
            })
            .collect();
        let pair = untagged
            .iter()
            .skip(1)
            .find(|hit| slot(&redis_keys(t, hit)[0]) != slot(&redis_keys(t, &untagged[0])[0]))
            .expect("two of twenty limits in different slots");
        assert!(!backend.joint(&[untagged[0].clone(), pair.clone()]));
    }
}

/// Four limits of one descriptor (both algorithms, two windows each) at instants 90 ms apart:
/// the group's answer for each limit is what the same limit alone answers on twin keys with the
/// same history, where a refused group's admitted charges are released. After every group,
/// a check of each limit alone reads the same usage on the group's keys as on the twins.
async fn each_limit_answers_as_alone_and_a_refusal_leaves_no_charge(t: &Target) {
    let backend = single(t).await;
    let shapes = [
        (Algorithm::SlidingWindowCounter, 5, 1000),
        (Algorithm::SlidingWindowLog, 3, 1000),
        (Algorithm::SlidingWindowCounter, 2, 500),
        (Algorithm::SlidingWindowLog, 4, 700),
    ];
    for tentative in [true, false] {
        let head = fresh_key("together");
        let twin = fresh_key("twin");
        let make = |head: &str| -> Vec<Hit> {
            shapes
                .iter()
                .map(|&(algorithm, n, window_ms)| Hit {
                    tentative,
                    ..limit(head, algorithm, n, window_ms)
                })
                .collect()
        };
        let (group, twins) = (make(&head), alone(&make(&twin)));
        let (mut undone, mut admitted) = (0, 0);
        for step in 0..24u64 {
            let now = START + step * 90;
            let cost = Cost::Consume(1 + step % 2);
            let got = decided_at(&backend, &costing(&group, cost), now).await;
            let expected = decided_at(&backend, &costing(&twins, cost), now).await;
            for (index, (got, expected)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(got.verdict, expected.verdict, "step {step}, limit {index}");
                assert_eq!(
                    got.stands_ms, expected.stands_ms,
                    "step {step}, limit {index}"
                );
            }
            if expected.iter().all(|outcome| outcome.verdict.admitted) {
                admitted += 1;
                assert!(got.iter().all(|outcome| outcome.receipt.is_some()));
            } else {
                undone += 1;
                assert!(
                    got.iter().all(|outcome| outcome.receipt.is_none()),
                    "{got:?}"
                );
                let receipts: Vec<_> = expected.into_iter().filter_map(|o| o.receipt).collect();
                backend.release_at(&receipts, now).await.expect("release");
            }
            let check = alone(&costing(&group, Cost::CheckOnly));
            let twin_check = costing(&twins, Cost::CheckOnly);
            let after = decided_at(&backend, &check, now).await;
            let twin_after = decided_at(&backend, &twin_check, now).await;
            for (index, (a, b)) in after.iter().zip(&twin_after).enumerate() {
                assert_eq!(
                    a.verdict, b.verdict,
                    "usage after step {step}, limit {index}"
                );
                assert_eq!(a.stands_ms, b.stands_ms, "after step {step}, limit {index}");
            }
        }
        assert!(
            admitted > 0 && undone > 0,
            "{admitted} admitted, {undone} undone"
        );
    }
}

/// A counter and a log that record refused hits too keep the charge of a hit another limit of
/// their descriptor refused, as they would alone; only the limit counting admitted hits gives
/// its charge back.
async fn a_limit_counting_every_hit_keeps_its_charge(t: &Target) {
    let backend = single(t).await;
    let head = fresh_key("counted");
    let all = |hit: Hit| Hit {
        counting: Counting::All,
        tentative: false,
        ..hit
    };
    let group = [
        all(limit(&head, Algorithm::SlidingWindowCounter, 5, HOUR_MS)),
        all(limit(&head, Algorithm::SlidingWindowLog, 5, HOUR_MS)),
        limit(&head, Algorithm::SlidingWindowCounter, 10, 60_000),
        limit(&head, Algorithm::SlidingWindowLog, 1, 60_000),
    ];
    let first = decided_at(&backend, &group, START).await;
    assert_eq!(
        verdicts(&first),
        [(true, 4), (true, 4), (true, 9), (true, 0)]
    );
    let second = decided_at(&backend, &group, START + 10).await;
    assert_eq!(
        verdicts(&second),
        [(true, 3), (true, 3), (true, 8), (false, 0)]
    );
    // Kept: the charges of the limits counting every hit, receipts and all (the limiter never
    // gives those back); given back: the other admitted one.
    assert!(second[0].receipt.is_some() && second[1].receipt.is_some());
    assert!(second[2].receipt.is_none() && second[3].receipt.is_none());
    let check = decided_at(
        &backend,
        &alone(&costing(&group, Cost::CheckOnly)),
        START + 20,
    )
    .await;
    assert_eq!(
        verdicts(&check),
        [(true, 3), (true, 3), (true, 9), (true, 0)]
    );
}

/// A tentative charge is tallied as refundable; given back by a refused group, it leaves the
/// tally as it leaves the window, so the refusal that follows on the same keys stands for its
/// whole retry time (nothing refundable is pending).
async fn tentative_charges_given_back_leave_the_tally(t: &Target) {
    let backend = single(t).await;
    let head = fresh_key("tally");
    let group = [
        limit(&head, Algorithm::SlidingWindowCounter, 5, HOUR_MS),
        limit(&head, Algorithm::SlidingWindowLog, 5, HOUR_MS),
        limit(&head, Algorithm::SlidingWindowCounter, 0, 60_000),
    ];
    let outcomes = decided_at(&backend, &group, START).await;
    assert_eq!(verdicts(&outcomes), [(true, 4), (true, 4), (false, 0)]);
    let server = t.redis_server();
    tokio::task::block_in_place(|| {
        for hit in &group[..2] {
            for key in redis_keys(t, hit) {
                let fields = server.cli(&["HKEYS", &key]);
                assert!(
                    !fields.lines().any(|field| field.starts_with('r')),
                    "{key} still tallies {fields:?}"
                );
            }
            let counter = &redis_keys(t, &group[0])[0];
            assert_eq!(server.cli(&["EXISTS", counter]), "0", "an emptied counter");
            let log = &redis_keys(t, &group[1])[0];
            assert_eq!(server.cli(&["ZCARD", log]), "0", "an emptied log");
        }
    });
    // Filled to the limit alone and refused: no refundable unit is left to shorten the refusal.
    let fill: Vec<Hit> = alone(&costing(&group[..2], Cost::Consume(5)))
        .into_iter()
        .map(|hit| Hit {
            tentative: false,
            ..hit
        })
        .collect();
    decided_at(&backend, &fill, START + 10).await;
    let refused = decided_at(&backend, &alone(&group[..2]), START + 20).await;
    for outcome in &refused {
        assert!(!outcome.verdict.admitted);
        assert_eq!(outcome.stands_ms, outcome.verdict.reset_ms, "{outcome:?}");
    }
}

/// A group of checks (cost 0) writes nothing, whether its limits admit or one refuses.
async fn a_check_only_group_writes_nothing(t: &Target) {
    let backend = single(t).await;
    let head = fresh_key("check");
    let group = [
        limit(&head, Algorithm::SlidingWindowCounter, 5, HOUR_MS),
        limit(&head, Algorithm::SlidingWindowLog, 5, HOUR_MS),
    ];
    let checks = costing(&group, Cost::CheckOnly);
    let outcomes = decided_at(&backend, &checks, START).await;
    assert_eq!(verdicts(&outcomes), [(true, 5), (true, 5)]);
    assert!(outcomes.iter().all(|outcome| outcome.receipt.is_none()));
    let server = t.redis_server();
    let keys: Vec<String> = group.iter().flat_map(|hit| redis_keys(t, hit)).collect();
    let exists = |keys: &[String]| {
        tokio::task::block_in_place(|| {
            let mut args = vec!["EXISTS"];
            args.extend(keys.iter().map(String::as_str));
            server.cli(&args)
        })
    };
    assert_eq!(exists(&keys), "0");

    // Over the limit (a counting-every-hit charge of 6 on the counter), a check is refused by
    // the counter and admitted by the log; neither key changes.
    let over = Hit {
        cost: Cost::Consume(6),
        counting: Counting::All,
        tentative: false,
        group: 0,
        ..group[0].clone()
    };
    decided_at(&backend, &[over], START).await;
    let dump = |keys: &[String]| -> Vec<String> {
        tokio::task::block_in_place(|| keys.iter().map(|key| server.cli(&["DUMP", key])).collect())
    };
    let before = dump(&keys);
    let outcomes = decided_at(&backend, &checks, START + 10).await;
    assert_eq!(verdicts(&outcomes), [(false, 0), (true, 5)]);
    assert_eq!(dump(&keys), before);
}

/// SCRIPT FLUSH empties the script cache: the next group call sends the script along (NOSCRIPT,
/// then EVAL) and decides as the first did, a single hit beside it too.
async fn a_group_survives_a_flushed_script_cache(t: &Target) {
    let flushed = tokio::task::block_in_place(|| t.private());
    let backend: AnyBackend = flushed
        .store()
        .connect(flushed.prefix(), CALL_TIMEOUT)
        .await;
    let head = fresh_key("flush");
    let lone = Hit {
        group: 0,
        descriptor_tag: false,
        slice: false,
        ..limit(&fresh_key("lone"), Algorithm::SlidingWindowLog, 10, HOUR_MS)
    };
    let hits = [
        limit(&head, Algorithm::SlidingWindowCounter, 10, HOUR_MS),
        limit(&head, Algorithm::SlidingWindowLog, 10, HOUR_MS),
        lone,
    ];
    for n in 1..=3 {
        if n > 1 {
            tokio::task::block_in_place(|| flushed.script_flush());
        }
        let outcomes = decided(&backend, &hits).await;
        assert_eq!(
            verdicts(&outcomes),
            [(true, 10 - n), (true, 10 - n), (true, 10 - n)],
            "call {n}"
        );
    }
}
