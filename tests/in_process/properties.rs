//! The limiter's invariants as properties, checked on generated traffic against the memory
//! backend on an injected clock (the backends' shared math; the conformance suite holds Redis to
//! the same answers):
//!
//! - the sliding window log never admits more than its limit in any window, refunds included;
//! - the sliding window counter admits a hit only when its estimate, computed here from the
//!   admitted hits alone, leaves room for it;
//! - a rejected request consumes nothing; statuses stay within their limits;
//! - two different descriptors never share a counter identity;
//! - the memory backend never holds more than its budget;
//! - the local over-limit cache never refuses a hit the bare backend admits.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use tollgate::backend::local_cache::DEFAULT_BYTES;
use tollgate::backend::memory::MIN_BUDGET;
use tollgate::backend::{Backend, Hit, LocalCache, MemoryBackend, Receipt, Sharded};
use tollgate::clock::{Clock, ManualClock};
use tollgate::config::Config;
use tollgate::descriptor::{Descriptor, Entry, Request};
use tollgate::limiter::{Code, Limiter, Settings, limiter_key};
use tollgate::window::{Algorithm, Cost, Counting};

const W: u64 = 10_000;
const START: u64 = 1_000 * W;

/// Runs a future of the memory backend, which never waits, to completion.
fn now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
    }
}

/// One step of traffic on one limit: time moves, then a hit or the refund of an earlier one.
#[derive(Debug, Clone)]
enum Step {
    Hit { after_ms: u64, cost: u64 },
    Refund { after_ms: u64, which: usize },
}

fn steps(limit: u64) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        4 => (0..W / 2, 0..=limit + 1).prop_map(|(after_ms, cost)| Step::Hit { after_ms, cost }),
        1 => (0..W / 2, any::<usize>()).prop_map(|(after_ms, which)| Step::Refund { after_ms, which }),
    ];
    proptest::collection::vec(step, 1..200)
}

fn hit(key: &str, algorithm: Algorithm, limit: u64, cost: u64) -> Hit {
    Hit {
        key: key.to_owned(),
        algorithm,
        limit,
        window_ms: W,
        cost: if cost == 0 {
            Cost::CheckOnly
        } else {
            Cost::Consume(cost)
        },
        counting: Counting::Admitted,
        shards: 1,
        lease_ms: 0,
        tentative: false,
        group: 0,
        descriptor_tag: false,
        slice: false,
    }
}

/// Plays `steps` on one limit; answers every admitted charge still standing as (time, cost),
/// checking `check(admitted so far, time, cost)` before each admission is recorded.
fn play(
    algorithm: Algorithm,
    limit: u64,
    steps: &[Step],
    mut check: impl FnMut(&[(u64, u64)], u64, u64),
) {
    let clock = ManualClock::new(START);
    let backend = MemoryBackend::with_clock(Arc::new(clock.clone()));
    let mut standing: Vec<(u64, u64, Receipt)> = Vec::new();
    for step in steps {
        match step {
            Step::Hit { after_ms, cost } => {
                clock.advance(*after_ms);
                let t = clock.now_ms();
                let outcome = now(backend.acquire(&[hit("k", algorithm, limit, *cost)]))
                    .remove(0)
                    .expect("memory decides");
                assert!(outcome.verdict.remaining <= limit);
                if let Some(receipt) = outcome.receipt {
                    let admitted: Vec<(u64, u64)> =
                        standing.iter().map(|(t, c, _)| (*t, *c)).collect();
                    check(&admitted, t, *cost);
                    standing.push((t, *cost, receipt));
                }
            }
            Step::Refund { after_ms, which } => {
                clock.advance(*after_ms);
                if standing.is_empty() {
                    continue;
                }
                let (_, _, receipt) = standing.remove(which % standing.len());
                now(backend.release(&[receipt])).expect("memory releases");
            }
        }
    }
}

proptest! {
    #[test]
    fn the_log_never_admits_more_than_its_limit_in_any_window(limit in 1u64..20, steps in steps(20)) {
        play(Algorithm::SlidingWindowLog, limit, &steps, |admitted, t, cost| {
            let in_window: u64 = admitted
                .iter()
                .filter(|(at, _)| at + W > t)
                .map(|(_, c)| c)
                .sum();
            assert!(in_window + cost <= limit, "{in_window} + {cost} > {limit} at {t}");
        });
    }

    #[test]
    fn the_counter_admits_only_within_its_estimate(limit in 1u64..20, steps in steps(20)) {
        play(Algorithm::SlidingWindowCounter, limit, &steps, |admitted, t, cost| {
            let k = t / W;
            let count = |window: u64| -> u128 {
                admitted.iter().filter(|(at, _)| at / W == window).map(|(_, c)| u128::from(*c)).sum()
            };
            let (prev, curr) = (count(k - 1), count(k));
            let elapsed = u128::from(t % W);
            // prev * (W - e) / W + curr + cost <= limit, in integers scaled by W
            let used = prev * (u128::from(W) - elapsed) + (curr + u128::from(cost)) * u128::from(W);
            assert!(used <= u128::from(limit) * u128::from(W), "prev {prev} curr {curr} + {cost} over {limit} at {t}");
        });
    }

    #[test]
    fn limiter_keys_are_injective(
        a in proptest::collection::vec(("[a-z|=~@%{}\\x00\u{80}-\u{9f}]{0,4}", "[a-z|=~@%{}\\x00*]{0,4}"), 1..4),
        b in proptest::collection::vec(("[a-z|=~@%{}\\x00\u{80}-\u{9f}]{0,4}", "[a-z|=~@%{}\\x00*]{0,4}"), 1..4),
    ) {
        let entries = |pairs: &Vec<(String, String)>| -> Vec<Entry> {
            pairs.iter().map(|(k, v)| Entry::new(k.as_str(), v.as_str())).collect()
        };
        let (a, b) = (entries(&a), entries(&b));
        let key_a = limiter_key("d", &a, &[], Algorithm::SlidingWindowLog, W);
        let key_b = limiter_key("d", &b, &[], Algorithm::SlidingWindowLog, W);
        prop_assert_eq!(key_a == key_b, a == b);
        let no_hash_tag = !key_a.contains(['{', '}']);
        prop_assert!(no_hash_tag, "{}", key_a);
    }

    #[test]
    fn the_memory_backend_never_exceeds_its_budget(
        keys in proptest::collection::vec((0u32..5_000, any::<bool>(), 1u64..5_000, 0u64..3), 1..3_000),
    ) {
        let clock = ManualClock::new(START);
        let backend = MemoryBackend::with_budget(Arc::new(clock.clone()), MIN_BUDGET);
        for (key, log, window_s, after_ms) in keys {
            clock.advance(after_ms);
            let algorithm = if log { Algorithm::SlidingWindowLog } else { Algorithm::SlidingWindowCounter };
            let h = Hit { window_ms: window_s * 1000, ..hit(&format!("k{key}"), algorithm, 1000, 1) };
            now(backend.acquire(&[h]));
            let usage = backend.usage();
            prop_assert!(usage.bytes <= usage.budget, "{:?}", usage);
        }
    }
}

/// Plays `steps` on one limit against the memory backend with the local over-limit cache and
/// against a bare one, on one clock; answers the decisions of each, in order, up to the first
/// that differs (included).
fn cached_and_bare(
    algorithm: Algorithm,
    limit: u64,
    counting: Counting,
    steps: &[Step],
) -> Vec<(bool, bool)> {
    let clock = ManualClock::new(START);
    let shared: Arc<dyn Clock> = Arc::new(clock.clone());
    let cached = LocalCache::new(
        MemoryBackend::with_clock(Arc::clone(&shared)),
        Arc::clone(&shared),
        DEFAULT_BYTES,
    );
    let bare = MemoryBackend::with_clock(shared);
    let mut standing: Vec<(Receipt, Receipt)> = Vec::new();
    let mut decisions = Vec::new();
    for step in steps {
        match step {
            Step::Hit { after_ms, cost } => {
                clock.advance(*after_ms);
                let h = Hit {
                    counting,
                    ..hit("k", algorithm, limit, *cost)
                };
                let a = now(cached.acquire(std::slice::from_ref(&h)))
                    .remove(0)
                    .expect("memory decides");
                let b = now(bare.acquire(std::slice::from_ref(&h)))
                    .remove(0)
                    .expect("memory decides");
                decisions.push((a.verdict.admitted, b.verdict.admitted));
                if a.verdict.admitted != b.verdict.admitted {
                    break;
                }
                if let (Some(a), Some(b)) = (a.receipt, b.receipt) {
                    standing.push((a, b));
                }
            }
            Step::Refund { after_ms, which } => {
                clock.advance(*after_ms);
                if standing.is_empty() {
                    continue;
                }
                let (a, b) = standing.remove(which % standing.len());
                now(cached.release(&[a])).expect("memory releases");
                now(bare.release(&[b])).expect("memory releases");
            }
        }
    }
    decisions
}

proptest! {
    /// Where refused hits are not charged the cache changes no decision at all, refunds included.
    #[test]
    fn the_local_cache_decides_as_the_bare_backend(
        log in any::<bool>(), limit in 0u64..20, steps in steps(20),
    ) {
        let algorithm = if log { Algorithm::SlidingWindowLog } else { Algorithm::SlidingWindowCounter };
        for (step, (cached, bare)) in cached_and_bare(algorithm, limit, Counting::Admitted, &steps).into_iter().enumerate() {
            prop_assert_eq!(cached, bare, "step {}", step);
        }
    }

    /// Where every hit is charged the cache skips the charges of the refusals it answers, so it
    /// may admit earlier than the bare backend; where the two first differ, the cache admits and
    /// the bare backend refuses, never the other way round.
    #[test]
    fn the_local_cache_never_refuses_what_the_bare_backend_admits(
        log in any::<bool>(), limit in 0u64..20, steps in steps(20),
    ) {
        let algorithm = if log { Algorithm::SlidingWindowLog } else { Algorithm::SlidingWindowCounter };
        let decisions = cached_and_bare(algorithm, limit, Counting::All, &steps);
        if let Some((cached, bare)) = decisions.last().filter(|(a, b)| a != b) {
            prop_assert!(*cached && !*bare, "the cache refused what the backend admitted");
        }
    }
}

const POLICY: &str = "domain: p
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: sliding_window_log}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 8}
";

fn descriptor(key: &str, value: &str, addend: Option<u64>) -> Descriptor {
    Descriptor {
        entries: vec![Entry::new(key, value)],
        hits_addend: addend,
        ..Descriptor::default()
    }
}

proptest! {
    /// Requests of one to three descriptors with random costs, decided at one instant: whenever
    /// the whole request is over, every limit's usage is as it was before it.
    #[test]
    fn a_rejected_request_consumes_nothing(
        requests in proptest::collection::vec(
            proptest::collection::vec((0usize..3, 0u64..5), 1..4),
            1..40,
        ),
    ) {
        let clock = ManualClock::new(START);
        let backend = Sharded::new(MemoryBackend::with_clock(Arc::new(clock)));
        let config = Arc::new(Config::from_yaml("p.yaml", POLICY).expect("the policy loads"));
        let limiter = Limiter::new(config, backend, Settings::default());
        let keys = ["a", "b", "c"];
        let usage = |limiter: &Limiter<_>| -> Vec<u32> {
            let request = Request {
                domain: "p".into(),
                descriptors: keys.iter().map(|k| descriptor(k, "v", Some(0))).collect(),
                hits_addend: 0,
            };
            now(limiter.should_rate_limit(&request))
                .expect("valid")
                .statuses
                .iter()
                .map(|status| status.remaining)
                .collect()
        };
        for descriptors in requests {
            let before = usage(&limiter);
            let request = Request {
                domain: "p".into(),
                descriptors: descriptors
                    .iter()
                    .map(|(which, cost)| descriptor(keys[*which], "v", Some(*cost)))
                    .collect(),
                hits_addend: 0,
            };
            let decision = now(limiter.should_rate_limit(&request)).expect("valid");
            prop_assert_eq!(decision.statuses.len(), request.descriptors.len());
            for status in &decision.statuses {
                let limit = status.limit.as_ref().expect("every descriptor has a limit");
                prop_assert!(status.remaining <= limit.requests_per_unit);
                prop_assert!(status.reset.is_some_and(|reset| reset.as_secs() >= 1));
            }
            if decision.overall == Code::OverLimit {
                prop_assert_eq!(usage(&limiter), before);
            }
        }
    }
}
