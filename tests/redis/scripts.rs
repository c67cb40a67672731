//! The Lua scripts against `tollgate::window`, the math the memory backend runs, at instants the
//! test chooses (`RedisBackend::acquire_at`): every verdict identical, every retry time exact.

use std::collections::BTreeMap;

use tollgate::backend::{Backend, Hit, Outcome, Receipt, RedisBackend};
use tollgate::window::{self, Algorithm, Cost, Counting};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, COUNTINGS, counted, fresh_key, hit, one};
use tollgate_testkit::target::{CALL_TIMEOUT, Target};

cases! {
    scripts_follow_the_window_math: [redis];
    retry_time_is_the_first_instant_that_admits: [redis];
    a_counter_key_keeps_only_two_windows: [redis];
    a_leased_log_entry_counts_until_its_lease_ends: [redis];
    settling_a_slice_gives_back_the_unspent_units: [redis];
    a_requests_hits_are_each_decided_as_a_call_of_their_own: [redis];
    stored_numbers_are_whole_integers_as_every_version_writes_them: [redis];
    a_count_written_by_something_else_decides_as_the_script_reads_it: [redis];
    the_log_sets_its_expiry_only_when_its_keys_would_expire_too_soon: [redis];
}

async fn connect(t: &Target) -> RedisBackend {
    RedisBackend::connect(&t.redis_server().url(), t.prefix(), CALL_TIMEOUT)
        .await
        .expect("connect")
}

/// The Redis key under the target's prefix that holds `key`'s window, if one exists.
fn stored_key(t: &Target, key: &str) -> Option<String> {
    t.redis_server()
        .cli(&["--scan", "--pattern", &format!("{}*", t.prefix())])
        .lines()
        .find(|line| line.contains(key))
        .map(str::to_owned)
}

/// The outcome of one hit decided at the instant `now` (ms since the epoch).
async fn one_at(backend: &RedisBackend, hit: &Hit, now: u64) -> Outcome {
    backend
        .acquire_at(std::slice::from_ref(hit), now)
        .await
        .remove(0)
        .expect("decided")
}

/// Random hits at increasing instants on a few limiters, the same hits fed to a model that keeps
/// what was charged (admitted hits, and refused ones where every hit counts) and decides with
/// `tollgate::window`; every verdict must be identical, and every released charge leaves the
/// model too.
async fn scripts_follow_the_window_math(t: &Target) {
    let backend = connect(t).await;
    let mut rng = fastrand::Rng::with_seed(7);
    // (limit, window): ordinary, tiny, and large enough that limit * window passes 2^53
    let shapes: [(u64, u64); 5] = [
        (10, 1000),
        (3, 7000),
        (1, 1000),
        (4_294_967_295, 31_536_000_000),
        ((1 << 40) + 7, 86_400_000),
    ];
    for ((limit, window_ms), algorithm, counting) in shapes
        .into_iter()
        .flat_map(|shape| ALGORITHMS.map(|algorithm| (shape, algorithm)))
        .flat_map(|(shape, algorithm)| COUNTINGS.map(|counting| (shape, algorithm, counting)))
    {
        {
            let key = fresh_key("model");
            let mut now = 1_700_000_000_000 + rng.u64(0..window_ms);
            let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
            let mut entries: Vec<(u64, u64, u64)> = Vec::new(); // (time, cost, id)
            let mut receipts: Vec<Receipt> = Vec::new();
            for step in 0..300 {
                now += match rng.u8(0..10) {
                    0 => window_ms + rng.u64(0..window_ms),
                    1..=3 => rng.u64(0..window_ms / 2 + 1),
                    _ => rng.u64(0..window_ms / 20 + 1),
                };
                if rng.u8(0..8) == 0 && !receipts.is_empty() {
                    let receipt = receipts.swap_remove(rng.usize(0..receipts.len()));
                    backend
                        .release(std::slice::from_ref(&receipt))
                        .await
                        .expect("release");
                    match algorithm {
                        Algorithm::SlidingWindowCounter => {
                            if let Some(count) = counts.get_mut(&receipt.token) {
                                *count = count.saturating_sub(receipt.cost);
                            }
                        }
                        Algorithm::SlidingWindowLog => {
                            entries.retain(|&(_, _, id)| id != receipt.token)
                        }
                    }
                    continue;
                }
                let cost = match rng.u8(0..10) {
                    0 => Cost::CheckOnly,
                    1 => Cost::Consume(limit + rng.u64(1..3)),
                    // far above the limit: saturated, and only charged where every hit counts
                    9 if rng.u8(0..4) == 0 => Cost::Consume(u64::MAX),
                    2 => Cost::Consume(rng.u64(1..=limit.max(1))),
                    _ => Cost::Consume(rng.u64(1..=(limit / 3).clamp(1, 4))),
                };
                let h = counted(hit(&key, algorithm, limit, window_ms, cost), counting);
                let outcome = one_at(&backend, &h, now).await;
                let k = now / window_ms;
                let expected = match algorithm {
                    Algorithm::SlidingWindowCounter => {
                        let prev = k.checked_sub(1).and_then(|p| counts.get(&p)).copied();
                        let curr = counts.get(&k).copied();
                        window::counter_decide(
                            limit,
                            window_ms,
                            now,
                            prev.unwrap_or(0),
                            curr.unwrap_or(0),
                            cost,
                            counting,
                        )
                    }
                    Algorithm::SlidingWindowLog => {
                        let pairs: Vec<(u64, u64)> =
                            entries.iter().map(|&(t, c, _)| (t, c)).collect();
                        window::log_decide(limit, window_ms, now, &pairs, cost, counting)
                    }
                };
                assert_eq!(
                    outcome.verdict, expected,
                    "step {step}: {h:?} at {now} (limit {limit}, window {window_ms})"
                );
                // A refused hit counted in full is charged, with nothing to give back.
                if let (false, Counting::All, Cost::Consume(units)) =
                    (outcome.verdict.admitted, counting, cost)
                {
                    assert_eq!(outcome.receipt, None);
                    match algorithm {
                        Algorithm::SlidingWindowCounter => {
                            let count = counts.entry(k).or_default();
                            *count = window::counter_refused_count(*count, units);
                        }
                        Algorithm::SlidingWindowLog => {
                            entries.push((now, window::log_refused_cost(limit, units), 0))
                        }
                    }
                }
                if let Some(receipt) = outcome.receipt {
                    let Cost::Consume(units) = cost else {
                        panic!("a check got a receipt")
                    };
                    match algorithm {
                        Algorithm::SlidingWindowCounter => {
                            assert_eq!(receipt.token, k);
                            *counts.entry(k).or_default() += units;
                        }
                        Algorithm::SlidingWindowLog => entries.push((now, units, receipt.token)),
                    }
                    receipts.push(receipt);
                }
            }
        }
    }
}

/// The retry time is exact: the same hit one millisecond earlier is refused, at it admitted;
/// also when a refused debit counted in full has taken usage above the limit.
async fn retry_time_is_the_first_instant_that_admits(t: &Target) {
    let backend = connect(t).await;
    let window_ms = 60_000;
    let base = 1_700_000_040_000; // a window boundary
    for algorithm in ALGORITHMS {
        // (fill time, units admitted then, units of a refused debit charged then, the hit asked
        // about, when)
        for (fill_at, fill, debit, cost, ask_at) in [
            (base + 1000, 10, 0, Cost::Consume(1), base + 30_000),
            (base + 1000, 10, 0, Cost::Consume(4), base + 50_000),
            (base + 59_000, 8, 0, Cost::Consume(5), base + 70_000),
            (base + 5000, 10, 3, Cost::CheckOnly, base + 6000),
            (base + 5000, 10, 3, Cost::CheckOnly, base + 64_000),
            (base + 1000, 9, 25, Cost::Consume(2), base + 60_500),
        ] {
            let key = fresh_key("retry");
            let h = |cost| hit(&key, algorithm, 10, window_ms, cost);
            let filled = one_at(&backend, &h(Cost::Consume(fill)), fill_at).await;
            assert!(filled.verdict.admitted);
            if debit > 0 {
                let debit = counted(h(Cost::Consume(debit)), Counting::All);
                let charged = one_at(&backend, &debit, fill_at).await;
                assert!(!charged.verdict.admitted, "{charged:?}");
            }
            let refused = one_at(&backend, &h(cost), ask_at).await;
            assert!(!refused.verdict.admitted, "{refused:?}");
            let retry = refused.verdict.reset_ms;
            assert!(retry > 0);
            let early = one_at(&backend, &h(cost), ask_at + retry - 1).await;
            assert!(
                !early.verdict.admitted,
                "{algorithm} {cost:?}: admitted before {retry} ms"
            );
            let on_time = one_at(&backend, &h(cost), ask_at + retry).await;
            assert!(
                on_time.verdict.admitted,
                "{algorithm} {cost:?}: refused at {retry} ms"
            );
        }
    }
}

/// A counter key drops the fields of windows older than the previous one when a new window gets
/// its first charge, however many windows the key lived through, and only those.
async fn a_counter_key_keeps_only_two_windows(t: &Target) {
    let backend = connect(t).await;
    let key = fresh_key("fields");
    let window_ms = 1000;
    let h = hit(
        &key,
        Algorithm::SlidingWindowCounter,
        1_000,
        window_ms,
        Cost::Consume(1),
    );
    let start = 1_700_000_000_000;
    let server = t.redis_server();
    let redis_key = stored_key(t, &key);
    assert!(redis_key.is_none(), "{redis_key:?}");
    // A charge early in each of six consecutive windows, a few inside each: the key outlives
    // every window by its margin, so without the clean-up it would hold all six.
    for window in 0..6 {
        for offset in [10, 20, 30] {
            assert!(
                one_at(&backend, &h, start + window * window_ms + offset)
                    .await
                    .verdict
                    .admitted
            );
        }
        let redis_key = stored_key(t, &key).expect("the counter key");
        let mut fields: Vec<u64> = server
            .cli(&["HKEYS", &redis_key])
            .lines()
            .map(|field| field.parse().expect("a window index"))
            .collect();
        fields.sort_unstable();
        let k = (start + window * window_ms) / window_ms;
        let expected: Vec<u64> = if window == 0 { vec![k] } else { vec![k - 1, k] };
        assert_eq!(fields, expected, "window {window}");
    }
}

/// A reserved slice of the log is stamped at the end of its lease: it stays in the window a
/// lease longer than an ordinary hit would, because the slice may admit hits until then.
async fn a_leased_log_entry_counts_until_its_lease_ends(t: &Target) {
    let backend = connect(t).await;
    let start = 1_700_000_000_000;
    let slice = Hit {
        lease_ms: 100,
        ..hit(
            &fresh_key("stamped"),
            Algorithm::SlidingWindowLog,
            10,
            1000,
            Cost::Consume(10),
        )
    };
    let reserved = one_at(&backend, &slice, start).await;
    assert!(reserved.verdict.admitted);
    assert_eq!(reserved.verdict.reset_ms, 1100, "the window plus the lease");
    let single = Hit {
        lease_ms: 0,
        cost: Cost::Consume(1),
        ..slice.clone()
    };
    // A window after the reservation, the slice still counts: the hits it admitted may be as late
    // as the lease's end.
    let refused = one_at(&backend, &single, start + 1050).await;
    assert!(!refused.verdict.admitted);
    assert_eq!(
        refused.verdict.reset_ms, 50,
        "until the lease's end leaves the window"
    );
    assert!(
        one_at(&backend, &single, start + 1100)
            .await
            .verdict
            .admitted
    );
}

/// Settling a slice gives back what it did not spend and keeps the rest; the log's entry moves
/// back to the settlement's time (the server's clock), never later than it was.
async fn settling_a_slice_gives_back_the_unspent_units(t: &Target) {
    let backend = connect(t).await;
    let window_ms = 60_000;
    for algorithm in ALGORITHMS {
        // Decided ten seconds ahead of the server's clock, so the settlement (which reads the
        // server's clock) is earlier than the slice's stamp.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as u64
            + 10_000;
        let slice = Hit {
            lease_ms: 1000,
            ..hit(
                &fresh_key("settled"),
                algorithm,
                10,
                window_ms,
                Cost::Consume(10),
            )
        };
        let reserved = one_at(&backend, &slice, now).await;
        let receipt = reserved.receipt.expect("an admitted slice has a receipt");
        backend
            .release(&[Receipt { keep: 4, ..receipt }])
            .await
            .expect("settled");
        let single = |cost| Hit {
            lease_ms: 0,
            cost: Cost::Consume(cost),
            ..slice.clone()
        };
        assert!(
            one_at(&backend, &single(6), now).await.verdict.admitted,
            "{algorithm}: the six unspent units are back"
        );
        let refused = one_at(&backend, &single(1), now).await;
        assert!(
            !refused.verdict.admitted,
            "{algorithm}: the four spent stay"
        );
        if algorithm == Algorithm::SlidingWindowLog {
            // The kept entry is the oldest: it now leaves the window before `now + window`,
            // where an entry stamped at the lease's end would have left a second after it.
            assert!(
                refused.verdict.reset_ms < window_ms - 5_000,
                "{algorithm}: the kept entry moved back to the settlement: {refused:?}"
            );
        }
    }
}

/// A request's hits reach the single server in one pipeline: each is decided exactly as a
/// request of that hit alone decides it (the same hits on twin keys, one acquire each, at the
/// same instants), and a hit whose key cannot be read fails alone.
async fn a_requests_hits_are_each_decided_as_a_call_of_their_own(t: &Target) {
    let backend = connect(t).await;
    let start = 1_700_000_000_000;
    let limits = [
        (Algorithm::SlidingWindowCounter, 5, 1000),
        (Algorithm::SlidingWindowLog, 3, 1000),
        (Algorithm::SlidingWindowCounter, 2, 500),
        (Algorithm::SlidingWindowLog, 4, 700),
    ];
    let together_keys: Vec<String> = limits.iter().map(|_| fresh_key("together")).collect();
    let alone: Vec<String> = limits.iter().map(|_| fresh_key("alone")).collect();
    let hits = |keys: &[String], cost: Cost| -> Vec<Hit> {
        limits
            .iter()
            .zip(keys)
            .map(|(&(algorithm, limit, window_ms), key)| {
                hit(key, algorithm, limit, window_ms, cost)
            })
            .collect()
    };
    let (mut admitted, mut refused) = (0, 0);
    for step in 0..16u64 {
        let now = start + step * 90;
        let cost = Cost::Consume(1 + step % 2);
        let together = backend.acquire_at(&hits(&together_keys, cost), now).await;
        assert_eq!(together.len(), limits.len(), "one answer per hit");
        for (single, got) in hits(&alone, cost).iter().zip(together) {
            let got = got.unwrap_or_else(|err| panic!("step {step}, {single:?}: {err}"));
            let expected = one_at(&backend, single, now).await;
            assert_eq!(got.verdict, expected.verdict, "step {step}, {single:?}");
            assert_eq!(got.receipt.is_some(), expected.receipt.is_some());
            if got.verdict.admitted {
                admitted += 1;
            } else {
                refused += 1;
            }
        }
    }
    assert!(
        admitted > 0 && refused > 0,
        "{admitted} admitted, {refused} refused"
    );

    // A key of the wrong type makes its own hit fail, and only that one.
    let broken = fresh_key("broken");
    let mut mixed = hits(
        &[
            broken.clone(),
            fresh_key("together"),
            fresh_key("together"),
            fresh_key("together"),
        ],
        Cost::Consume(1),
    );
    mixed.rotate_left(1);
    one_at(&backend, &mixed[3], start).await;
    let server = t.redis_server();
    let redis_key = stored_key(t, &broken).expect("the counter key");
    server.cli(&["DEL", &redis_key]);
    server.cli(&["SET", &redis_key, "not a hash"]);
    let results = backend.acquire_at(&mixed, start + 10).await;
    assert_eq!(results.len(), mixed.len());
    for (index, result) in results.into_iter().enumerate() {
        match (index, result) {
            (3, Err(err)) => assert!(err.to_string().contains("WRONGTYPE"), "{err}"),
            (3, Ok(outcome)) => panic!("a hit on a string key was decided: {outcome:?}"),
            (_, Ok(outcome)) => assert!(outcome.verdict.admitted),
            (_, Err(err)) => panic!("hit {index} failed beside the broken one: {err}"),
        }
    }
}

/// What the scripts store is read by every tollgate sharing the keys, older versions included:
/// ids, scores, sums and window indexes are written as plain decimal integers (a 16-digit id too,
/// which Lua's own number conversion would shorten to 14 significant digits).
async fn stored_numbers_are_whole_integers_as_every_version_writes_them(t: &Target) {
    let backend = connect(t).await;
    let now: u64 = 1_764_000_000_123;
    let log = fresh_key("layout-log");
    let counter = fresh_key("layout-counter");
    let hits = [
        hit(
            &log,
            Algorithm::SlidingWindowLog,
            10,
            60_000,
            Cost::Consume(3),
        ),
        hit(
            &counter,
            Algorithm::SlidingWindowCounter,
            10,
            60_000,
            Cost::Consume(2),
        ),
    ];
    for outcome in backend.acquire_at(&hits, now).await {
        assert!(outcome.expect("decided").verdict.admitted);
    }
    let keys = t
        .redis_server()
        .cli(&["--scan", "--pattern", &format!("{}*", t.prefix())]);
    let key_of = |name: &str, suffix: &str| -> String {
        keys.lines()
            .find(|line| line.contains(name) && line.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {name} key ending {suffix} in {keys}"))
            .to_owned()
    };
    let id = now * 1000 + 1;
    let entries = t
        .redis_server()
        .cli(&["ZRANGE", &key_of(&log, ":l"), "0", "-1", "WITHSCORES"]);
    assert_eq!(
        entries.lines().collect::<Vec<_>>(),
        [format!("{id}:3"), now.to_string()],
        "the log's entry"
    );
    let sum = t.redis_server().cli(&["HGETALL", &key_of(&log, ":s")]);
    let sum: BTreeMap<&str, &str> = sum
        .lines()
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|pair| (pair[0], pair[1]))
        .collect();
    let id_text = id.to_string();
    assert_eq!(
        sum,
        BTreeMap::from([("seq", id_text.as_str()), ("sum", "3")]),
        "the log's sum"
    );
    let windows = t.redis_server().cli(&["HGETALL", &key_of(&counter, ":c")]);
    let window = (now / 60_000).to_string();
    assert_eq!(
        windows.lines().collect::<Vec<_>>(),
        [window.as_str(), "2"],
        "the counter's window"
    );
}

/// A counter's previous window holding text some other writer left, which the script reads as
/// the number it spells: the verdict is what the window math gives for that number, whether
/// the script answers in full or, for plain digits as it writes them itself, in short.
async fn a_count_written_by_something_else_decides_as_the_script_reads_it(t: &Target) {
    let backend = connect(t).await;
    let window_ms = 60_000;
    let start: u64 = 1_764_000_000_000 / window_ms * window_ms;
    for text in ["4", "04", "4.0", " 4", "0x4", "4e0"] {
        let key = fresh_key("foreign-count");
        let h = hit(
            &key,
            Algorithm::SlidingWindowCounter,
            10,
            window_ms,
            Cost::Consume(1),
        );
        // The first charge, in window k-1, makes the key; then its count is overwritten.
        assert!(one_at(&backend, &h, start - 1000).await.verdict.admitted);
        let redis_key = stored_key(t, &key).expect("the counter key");
        let field = (start / window_ms - 1).to_string();
        t.redis_server().cli(&["HSET", &redis_key, &field, text]);
        let now = start + 15_000;
        let outcome = one_at(&backend, &h, now).await;
        let expected = window::counter_decide(
            10,
            window_ms,
            now,
            4,
            0,
            Cost::Consume(1),
            Counting::Admitted,
        );
        assert_eq!(outcome.verdict, expected, "window k-1 holding {text:?}");
        let receipt = outcome.receipt.expect("an admitted charge");
        assert_eq!(
            receipt.token,
            start / window_ms,
            "window k-1 holding {text:?}"
        );
    }
}

/// What one log's keys hold about their expiry: the hash's "exp", when each key expires (ms
/// since the epoch, the server's clock) and the newest entry's time.
#[derive(Debug, Clone, Copy)]
struct Expiry {
    exp: u64,
    log_at: u64,
    hash_at: u64,
    newest: u64,
}

fn expiry_of(t: &Target, key: &str) -> Expiry {
    let server = t.redis_server();
    let (log, hash) = log_keys(t, key);
    let number = |answer: String, what: &str| -> u64 {
        answer
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{what}: {answer:?}"))
    };
    let newest = server.cli(&["ZRANGE", &log, "-1", "-1", "WITHSCORES"]);
    Expiry {
        exp: number(server.cli(&["HGET", &hash, "exp"]), "exp"),
        log_at: number(server.cli(&["PEXPIRETIME", &log]), "the log's expiry"),
        hash_at: number(server.cli(&["PEXPIRETIME", &hash]), "the hash's expiry"),
        newest: number(
            newest.lines().nth(1).unwrap_or_default().to_owned(),
            "the newest entry's time",
        ),
    }
}

/// The Redis keys of the log of `key`: its sorted set and its hash.
fn log_keys(t: &Target, key: &str) -> (String, String) {
    let keys = t
        .redis_server()
        .cli(&["--scan", "--pattern", &format!("{}*", t.prefix())]);
    let named = |suffix: &str| -> String {
        keys.lines()
            .find(|line| line.contains(key) && line.ends_with(suffix))
            .unwrap_or_else(|| panic!("no {key} key ending {suffix} in {keys}"))
            .to_owned()
    };
    (named(":l"), named(":s"))
}

/// The log sets its keys' expiry again only when the time its hash records ("exp", before which
/// neither key expires) would not outlast the new entry's stay in the window by a second; and
/// whatever set the expiry in between, an older tollgate's script included (which sets it on
/// every hit, a margin past the entry's stay), both keys expire together and after their newest
/// entry has left the window.
async fn the_log_sets_its_expiry_only_when_its_keys_would_expire_too_soon(t: &Target) {
    const MARGIN_MS: u64 = 5000;
    const SLACK_MS: u64 = 1000;
    const MAX_AHEAD_MS: u64 = 1000;
    let backend = connect(t).await;
    let window_ms = 60_000;
    let key = fresh_key("expiry");
    let plain = hit(
        &key,
        Algorithm::SlidingWindowLog,
        1000,
        window_ms,
        Cost::Consume(1),
    );
    let leased = Hit {
        lease_ms: 1000,
        ..plain.clone()
    };
    let holds = |e: Expiry, what: &str| {
        assert_eq!(
            e.log_at, e.hash_at,
            "{what}: both keys expire together: {e:?}"
        );
        assert!(
            e.log_at >= e.newest + window_ms,
            "{what}: the keys expire before the newest entry leaves the window: {e:?}"
        );
    };

    // The first hit sets the expiry two margins past the entry's stay, and records it.
    assert!(one(&backend, &plain).await.verdict.admitted);
    let first = expiry_of(t, &key);
    holds(first, "first hit");
    assert_eq!(
        first.exp,
        first.newest + window_ms + 2 * MARGIN_MS,
        "{first:?}"
    );
    assert_eq!(first.log_at, first.exp, "{first:?}");

    // An older tollgate sets the expiry on every hit, one margin past its entry's stay: shorter
    // than this version's. The next hit (stamped a lease time ahead) sets it again exactly when
    // its entry's stay would not end a second before the least expiry any writer leaves, a
    // margin and a lease time before the recorded one (the calls are milliseconds apart, so it
    // normally does not).
    let server = t.redis_server();
    let (log, hash) = log_keys(t, &key);
    server.cli(&[
        "EVAL",
        "redis.call('PEXPIRE', KEYS[1], ARGV[1]) redis.call('PEXPIRE', KEYS[2], ARGV[1])",
        "2",
        &hash,
        &log,
        &(window_ms + MARGIN_MS).to_string(),
    ]);
    assert!(one(&backend, &leased).await.verdict.admitted);
    let second = expiry_of(t, &key);
    holds(second, "a leased hit after an older version's expiry");
    let skipped = second.newest + window_ms + SLACK_MS + MARGIN_MS + MAX_AHEAD_MS <= first.exp;
    assert_eq!(
        second.exp == first.exp,
        skipped,
        "the expiry is set again exactly when it would end too soon: {first:?} then {second:?}"
    );

    // A recorded time that has passed makes the next hit set the expiry again.
    server.cli(&["HSET", &hash, "exp", "1"]);
    assert!(one(&backend, &plain).await.verdict.admitted);
    let third = expiry_of(t, &key);
    holds(third, "after a recorded time that has passed");
    assert!(third.exp >= first.exp, "{third:?}");
    assert!(
        third.exp >= third.newest + window_ms + MARGIN_MS,
        "{third:?}"
    );
    assert_eq!(third.log_at, third.exp, "{third:?}");
}
