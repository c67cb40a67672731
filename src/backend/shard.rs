//! Hash-sharded hot keys: a limit with `shards: N` splits its budget over N independent windows,
//! so one limit that all traffic shares is not one key on one node.
//!
//! [`Sharded`] wraps any backend and does the splitting; the inner backend only names the shard
//! windows ([`ShardKeys`]) and decides each one as an ordinary limit. Shard `i` holds
//! `floor(L/N)`, plus one for the first `L mod N` shards, so the budgets add up to exactly `L` and
//! the shards together can never admit more than the limit. A hit goes to a random shard; when
//! that shard is full one other random shard is tried before the hit is refused.
//!
//! Consequences of splitting, accepted on purpose:
//! - A single cost larger than every shard's budget (`ceil(L/N)`) can never be admitted, even on
//!   an idle limit: it is refused with the full window as its retry time.
//! - Under skewed luck a hit can be refused while another shard still has room (two random tries
//!   out of N); under sustained load every shard fills and the limit is used almost fully.
//! - `limit_remaining` is the chosen shard's remaining times N, capped at the limit: an estimate
//!   of the whole, since the other shards are not read.
//!
//! Under [`Counting::All`] a refused hit is charged exactly once: a first try that another shard
//! may follow is made without charging a refusal, and the last shard tried charges it.

use std::fmt::Write as _;

use futures_util::future::Either;

use crate::backend::{
    Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt, Results,
    SustainedFailure, WindowState,
};
use crate::window::{self, Cost, Counting};

/// Names the windows of a sharded limit in a backend's key space.
///
/// A backend implements this so that shard keys never collide with an unsharded identity nor
/// with each other, and, where it matters (Redis Cluster), so that different shards land on
/// different slots and nodes.
pub trait ShardKeys {
    /// The identity under which shard `shard` (0-based, below `shards`) of the limiter `key`
    /// is stored. The result is passed back to the same backend as an ordinary [`Hit::key`].
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String;
}

/// The plain shard identity `<key>{<shard>}`, for backends where placement does not matter.
///
/// Limiter identities never contain a raw `{` or `}` ([`crate::counter_key::limiter_key`] escapes
/// them), so the braces mark where the identity ends: a shard key never equals an unsharded
/// identity, and two shard keys are equal only for the same identity and shard. The shard count is left out on purpose:
/// changing `shards` keeps the counts of the shards that remain.
pub fn plain_shard_key(key: &str, shard: u16) -> String {
    let mut out = String::with_capacity(key.len() + 7);
    out.push_str(key);
    // Writing into a String cannot fail.
    let _ = write!(out, "{{{shard}}}");
    out
}

/// Shard `shard`'s share of `limit` split `shards` ways: `floor(limit/shards)`, plus one for
/// the first `limit mod shards` shards. The shares of shards `0..shards` sum to `limit`.
/// A `shards` of 0 is treated as 1.
pub fn shard_budget(limit: u64, shard: u16, shards: u16) -> u64 {
    let n = u64::from(shards.max(1));
    limit / n + u64::from(u64::from(shard) < limit % n)
}

/// How many shards, counted from shard 0, can ever admit `cost`: budgets only shrink with the
/// shard index, so they are a prefix. 0 when no shard can.
fn shards_that_fit(limit: u64, shards: u16, cost: Cost) -> u16 {
    let n = u64::from(shards.max(1));
    let (base, extra) = (limit / n, limit % n);
    // A check fits any shard that is not over its budget, so every shard can admit one.
    let units = match window::normalize_cost(cost) {
        Cost::Consume(units) => units,
        Cost::CheckOnly => 0,
    };
    let fitting = if units <= base {
        n
    } else if units == base + 1 {
        extra
    } else {
        0
    };
    // Both candidates are at most `shards`, a u16.
    u16::try_from(fitting).unwrap_or(shards)
}

fn is_sharded(hit: &Hit) -> bool {
    hit.shards > 1
}

/// A backend that splits every hit with `shards > 1` over that many shard windows of the inner
/// backend. Hits with `shards <= 1` pass through untouched.
#[derive(Debug, Default)]
pub struct Sharded<B> {
    inner: B,
}

impl<B> Sharded<B> {
    /// Wraps `inner`.
    pub fn new(inner: B) -> Self {
        Sharded { inner }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

impl<B: ShardKeys> Sharded<B> {
    /// The inner hit for shard `shard` of `hit`: the shard's key and budget, not sharded further,
    /// recording a refusal as `counting` says.
    fn shard_hit(&self, hit: &Hit, shard: u16, counting: Counting) -> Hit {
        Hit {
            key: self.inner.shard_key(&hit.key, shard, hit.shards),
            algorithm: hit.algorithm,
            limit: shard_budget(hit.limit, shard, hit.shards),
            window_ms: hit.window_ms,
            cost: hit.cost,
            counting,
            shards: 1,
            lease_ms: hit.lease_ms,
            tentative: hit.tentative,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }
}

impl<B: ShardKeys> Sharded<B> {
    /// Every window `hits` name, each sharded hit as all of its shard windows in order, and how
    /// many windows each hit became.
    fn every_shard(&self, hits: &[Hit]) -> (Vec<usize>, Vec<Hit>) {
        let mut spans = Vec::with_capacity(hits.len());
        let mut windows = Vec::with_capacity(hits.len());
        for hit in hits {
            if is_sharded(hit) {
                spans.push(usize::from(hit.shards));
                windows
                    .extend((0..hit.shards).map(|shard| self.shard_hit(hit, shard, hit.counting)));
            } else {
                spans.push(1);
                windows.push(hit.clone());
            }
        }
        (spans, windows)
    }
}

/// Picks the first shard for `hit`: at random among the shards whose budget can hold its cost,
/// or, when none can, any shard (its verdict then reports the refusal with the full window).
fn first_choice(hit: &Hit) -> u16 {
    match shards_that_fit(hit.limit, hit.shards, hit.cost) {
        0 => fastrand::u16(..hit.shards),
        fitting => fastrand::u16(..fitting),
    }
}

/// How the first try on shard `first` records a refusal: not at all when a second shard may be
/// tried after it (that one charges it, so it is charged once), else as the hit says.
fn first_counting(hit: &Hit, first: u16) -> Counting {
    let fitting = shards_that_fit(hit.limit, hit.shards, hit.cost);
    // `second_choice` finds another shard exactly when these hold.
    if first < fitting && fitting > 1 {
        Counting::Admitted
    } else {
        hit.counting
    }
}

/// Picks the shard to retry `hit` on after `tried` refused it: another random shard that can hold
/// its cost, or `None` when there is no such shard.
fn second_choice(hit: &Hit, tried: u16) -> Option<u16> {
    let fitting = shards_that_fit(hit.limit, hit.shards, hit.cost);
    if tried >= fitting {
        // The first choice was not a fitting shard only when none fits.
        return None;
    }
    let others = fitting - 1;
    if others == 0 {
        return None;
    }
    let pick = fastrand::u16(..others);
    Some(if pick >= tried { pick + 1 } else { pick })
}

/// Makes `results` exactly `len` long, so each hit gets an answer even from a backend that
/// answered too few.
fn answer_each(
    mut results: Vec<Result<Outcome, BackendError>>,
    len: usize,
) -> Vec<Result<Outcome, BackendError>> {
    results.truncate(len);
    results.resize_with(len, || {
        Err(BackendError::Protocol(
            "backend answered fewer hits than it was asked".into(),
        ))
    });
    results
}

impl<B: Backend + ShardKeys> Sharded<B> {
    /// One inner call for the first choices of every hit (unsharded hits included), then, only if
    /// some sharded hit was refused, one more for all the retries.
    async fn acquire_sharded(&self, hits: &[Hit]) -> Results {
        let mut chosen: Vec<Option<u16>> = Vec::with_capacity(hits.len());
        let mut inner_hits: Vec<Hit> = Vec::with_capacity(hits.len());
        for hit in hits {
            if is_sharded(hit) {
                let shard = first_choice(hit);
                chosen.push(Some(shard));
                inner_hits.push(self.shard_hit(hit, shard, first_counting(hit, shard)));
            } else {
                chosen.push(None);
                inner_hits.push(hit.clone());
            }
        }
        let mut results = answer_each(self.inner.acquire(&inner_hits).await, hits.len());

        inner_hits.clear();
        let mut retried: Vec<(usize, u16)> = Vec::new();
        for (index, (hit, result)) in hits.iter().zip(&results).enumerate() {
            let (Some(tried), Ok(outcome)) = (chosen[index], result) else {
                continue;
            };
            if outcome.verdict.admitted {
                continue;
            }
            if let Some(other) = second_choice(hit, tried) {
                retried.push((index, other));
                inner_hits.push(self.shard_hit(hit, other, hit.counting));
            }
        }
        super::observe::shard_hits(chosen.iter().flatten().count(), retried.len());
        if !inner_hits.is_empty() {
            let second = answer_each(self.inner.acquire(&inner_hits).await, inner_hits.len());
            for ((index, shard), result) in retried.into_iter().zip(second) {
                // A retry that failed leaves the first shard's refusal standing: a definite answer
                // beats none.
                if let Ok(outcome) = result {
                    chosen[index] = Some(shard);
                    results[index] = Ok(outcome);
                }
            }
        }

        for ((hit, result), shard) in hits.iter().zip(&mut results).zip(&chosen) {
            if let (Some(_), Ok(outcome)) = (shard, result) {
                let scale = |remaining: u64| {
                    remaining
                        .saturating_mul(u64::from(hit.shards))
                        .min(hit.limit)
                };
                outcome.verdict.remaining = scale(outcome.verdict.remaining);
                if let Some(receipt) = &mut outcome.receipt {
                    receipt.released_remaining = scale(receipt.released_remaining);
                }
            }
        }
        results
    }
}

impl<B: Backend + ShardKeys> Backend for Sharded<B> {
    /// A batch without a sharded hit is the inner backend's own future, so every layer above
    /// carries and moves no more than it; the sharded work lives in a box of its own.
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send {
        if hits.iter().any(is_sharded) {
            Either::Right(Box::pin(self.acquire_sharded(hits)))
        } else {
            Either::Left(self.inner.acquire(hits))
        }
    }

    /// Receipts already name the shard window they charged, so they go straight to the inner
    /// backend.
    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        self.inner.release(receipts).await
    }

    /// A sharded hit reads every shard window and answers their sum.
    async fn peek(&self, hits: &[Hit]) -> Peeked {
        if !hits.iter().any(is_sharded) {
            return self.inner.peek(hits).await;
        }
        let (spans, windows) = self.every_shard(hits);
        let mut states = self.inner.peek(&windows).await.into_iter();
        spans
            .into_iter()
            .map(|count| {
                let parts: Vec<Result<WindowState, BackendError>> =
                    states.by_ref().take(count).collect();
                if parts.len() < count {
                    return Err(BackendError::Protocol("a shard went unanswered".into()));
                }
                parts
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()
                    .map(WindowState::sum)
            })
            .collect()
    }

    /// A sharded hit clears every shard window.
    async fn clear(&self, hits: &[Hit]) -> Cleared {
        if !hits.iter().any(is_sharded) {
            return self.inner.clear(hits).await;
        }
        let (spans, windows) = self.every_shard(hits);
        let mut cleared = self.inner.clear(&windows).await.into_iter();
        spans
            .into_iter()
            .map(|count| {
                let parts: Vec<Result<(), BackendError>> = cleared.by_ref().take(count).collect();
                if parts.len() < count {
                    return Err(BackendError::Protocol("a shard went unanswered".into()));
                }
                parts.into_iter().collect()
            })
            .collect()
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.inner.ping().await
    }

    /// A sharded hit goes to one shard and may be retried on another, apart from its group.
    fn joint(&self, group: &[Hit]) -> bool {
        !group.iter().any(is_sharded) && self.inner.joint(group)
    }

    async fn maintain(&self) {
        self.inner.maintain().await
    }

    fn memory_usage(&self) -> Option<MemoryUsage> {
        self.inner.memory_usage()
    }

    fn failing_since(&self) -> Option<SustainedFailure> {
        self.inner.failing_since()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::backend::MemoryBackend;
    use crate::backend::memory::tests::one;
    use crate::clock::{Clock, ManualClock};
    use crate::window::Algorithm;

    const W: u64 = 10_000;
    const BOTH: [Algorithm; 2] = [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog];

    /// The memory backend, recording the batches it is asked to decide.
    #[derive(Default)]
    pub(crate) struct Recording {
        pub(crate) memory: MemoryBackend,
        calls: Mutex<Vec<Vec<Hit>>>,
    }

    impl Recording {
        pub(crate) fn at(clock: &ManualClock) -> Self {
            Recording {
                memory: MemoryBackend::with_clock(Arc::new(clock.clone())),
                calls: Mutex::default(),
            }
        }

        pub(crate) fn calls(&self) -> Vec<Vec<Hit>> {
            self.calls.lock().unwrap().clone()
        }
    }

    impl Backend for Recording {
        async fn acquire(&self, hits: &[Hit]) -> Vec<Result<Outcome, BackendError>> {
            self.calls.lock().unwrap().push(hits.to_vec());
            self.memory.acquire(hits).await
        }

        async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
            self.memory.release(receipts).await
        }

        async fn ping(&self) -> Result<(), BackendError> {
            self.memory.ping().await
        }
    }

    impl ShardKeys for Recording {
        fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
            self.memory.shard_key(key, shard, shards)
        }
    }

    fn sharded_at(now_ms: u64) -> (Sharded<Recording>, ManualClock) {
        let clock = ManualClock::new(now_ms);
        (Sharded::new(Recording::at(&clock)), clock)
    }

    fn hit(key: &str, algorithm: Algorithm, limit: u64, shards: u16, cost: Cost) -> Hit {
        Hit {
            key: key.to_owned(),
            algorithm,
            limit,
            window_ms: W,
            cost,
            counting: Counting::Admitted,
            shards,
            lease_ms: 0,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }

    /// What shard `shard` of `hit` has left, read straight from the inner backend.
    async fn shard_left(backend: &Sharded<Recording>, hit: &Hit, shard: u16) -> u64 {
        let mut probe = backend.shard_hit(hit, shard, Counting::Admitted);
        probe.cost = Cost::CheckOnly;
        one(&backend.inner().memory, &probe).await.verdict.remaining
    }

    #[test]
    fn budgets_sum_to_the_limit_and_differ_by_at_most_one() {
        let limits = (0..=300).chain([1_000, 12_345, u64::from(u32::MAX), u64::MAX - 1, u64::MAX]);
        for limit in limits {
            for shards in (1..=70).chain([u16::MAX]) {
                let budgets: Vec<u64> = (0..shards)
                    .map(|shard| shard_budget(limit, shard, shards))
                    .collect();
                let sum: u128 = budgets.iter().map(|&b| u128::from(b)).sum();
                assert_eq!(sum, u128::from(limit), "limit {limit}, {shards} shards");
                assert!(budgets.windows(2).all(|pair| pair[0] >= pair[1]));
                let (max, min) = (budgets[0], budgets[budgets.len() - 1]);
                assert!(max - min <= 1, "limit {limit}, {shards} shards");
                assert_eq!(max, limit.div_ceil(u64::from(shards)));
            }
        }
        // No shard count divides by zero.
        assert_eq!(shard_budget(7, 0, 0), 7);
    }

    #[test]
    fn shards_that_fit_counts_the_budgets_that_hold_the_cost() {
        for limit in 0..60u64 {
            for shards in 1..=12u16 {
                for units in 1..=8u64 {
                    let expected = (0..shards)
                        .filter(|&s| shard_budget(limit, s, shards) >= units)
                        .count();
                    let fitting = shards_that_fit(limit, shards, Cost::Consume(units));
                    assert_eq!(
                        usize::from(fitting),
                        expected,
                        "{limit}/{shards} cost {units}"
                    );
                }
                assert_eq!(shards_that_fit(limit, shards, Cost::CheckOnly), shards);
            }
        }
        assert_eq!(shards_that_fit(10, 4, Cost::Consume(u64::MAX)), 0);
    }

    #[test]
    fn shard_keys_never_meet_identities_or_each_other() {
        use crate::counter_key::limiter_key;
        use crate::descriptor::Entry;

        // Values chosen to look like shard suffixes once joined.
        let values = ["v", "v{1}", "v}", "{", "1}", "v@c1000{1}", "%7B", ""];
        let mut identities = Vec::new();
        for value in values {
            for window_ms in [1_000, 10_000, 100_000] {
                let entries = [Entry::new("k", value)];
                for algorithm in BOTH {
                    identities.push(limiter_key("d", &entries, &[], algorithm, window_ms));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for identity in &identities {
            assert!(seen.insert(identity.clone()), "{identity}");
        }
        for identity in &identities {
            for shard in [0, 1, 2, 10, 11, 63, u16::MAX] {
                let key = plain_shard_key(identity, shard);
                assert!(seen.insert(key.clone()), "{key} met another key");
            }
        }
        assert_eq!(plain_shard_key("x", 12), "x{12}");
        assert_eq!(plain_shard_key("x", u16::MAX), "x{65535}");
    }

    #[tokio::test]
    async fn unsharded_hits_pass_through_in_one_call() {
        let (backend, _clock) = sharded_at(100 * W);
        let hits = vec![
            hit("a", Algorithm::SlidingWindowCounter, 3, 1, Cost::Consume(1)),
            hit("b", Algorithm::SlidingWindowLog, 3, 0, Cost::Consume(2)),
        ];
        let results = backend.acquire(&hits).await;
        assert_eq!(results.len(), 2);
        let remaining: Vec<u64> = results
            .into_iter()
            .map(|r| r.unwrap().verdict.remaining)
            .collect();
        assert_eq!(remaining, [2, 1]);
        assert_eq!(backend.inner().calls(), [hits]);
        assert_eq!(backend.inner().memory.key_count(), 2);
    }

    #[tokio::test]
    async fn a_request_takes_one_call_for_first_choices_and_one_for_retries() {
        let (backend, _clock) = sharded_at(100 * W);
        let hits = vec![
            hit("a", Algorithm::SlidingWindowCounter, 8, 4, Cost::Consume(1)),
            hit(
                "plain",
                Algorithm::SlidingWindowCounter,
                100,
                1,
                Cost::Consume(1),
            ),
            hit("b", Algorithm::SlidingWindowLog, 8, 4, Cost::Consume(1)),
        ];
        // Four shards of 2 each; a request retries whenever a full shard is picked first, and
        // sixty requests fill both limits (a shard with room is among two random picks of four
        // at least half the time).
        let mut admitted = [0, 0, 0];
        for _ in 0..60 {
            backend.inner().calls.lock().unwrap().clear();
            let results = backend.acquire(&hits).await;
            assert_eq!(results.len(), 3);
            for (count, result) in admitted.iter_mut().zip(results) {
                *count += usize::from(result.unwrap().verdict.admitted);
            }
            let calls = backend.inner().calls();
            assert!(!calls.is_empty() && calls.len() <= 2);
            assert_eq!(calls[0].len(), 3);
            assert_eq!(
                calls[0][1], hits[1],
                "an unsharded hit goes through as it is"
            );
            for shard_hit in [&calls[0][0], &calls[0][2]] {
                assert!(shard_hit.key.ends_with('}'));
                assert_eq!((shard_hit.limit, shard_hit.shards), (2, 1));
            }
            if let Some(retries) = calls.get(1) {
                assert!(!retries.is_empty() && retries.len() <= 2);
                assert!(retries.iter().all(|h| h.key != "plain" && h.shards == 1));
            }
        }
        assert_eq!(admitted, [8, 60, 8]);
        // Both limits are full now: every sharded hit is refused twice, in two calls.
        backend.inner().calls.lock().unwrap().clear();
        let results = backend.acquire(&hits).await;
        let admitted: Vec<bool> = results
            .into_iter()
            .map(|r| r.unwrap().verdict.admitted)
            .collect();
        assert_eq!(admitted, [false, true, false]);
        let calls = backend.inner().calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].len(), 2);
        assert_ne!(
            calls[1][0].key, calls[0][0].key,
            "the retry tries another shard"
        );
        assert_ne!(
            calls[1][1].key, calls[0][2].key,
            "the retry tries another shard"
        );
    }

    /// Drives `hits_per_task * tasks` hits from concurrent tasks and answers the units admitted.
    async fn admit_concurrently(
        backend: Arc<Sharded<Recording>>,
        template: Hit,
        tasks: usize,
        hits_per_task: usize,
    ) -> u64 {
        let mut handles = Vec::new();
        for _ in 0..tasks {
            let backend = Arc::clone(&backend);
            let template = template.clone();
            handles.push(tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..hits_per_task {
                    let outcome = one(&*backend, &template).await;
                    assert!(outcome.verdict.remaining <= template.limit);
                    if outcome.verdict.admitted {
                        match template.cost {
                            Cost::Consume(units) => admitted += units,
                            Cost::CheckOnly => {}
                        }
                    }
                    tokio::task::yield_now().await;
                }
                admitted
            }));
        }
        let mut total = 0;
        for handle in handles {
            total += handle.await.unwrap();
        }
        total
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_callers_never_exceed_the_limit_and_use_most_of_it() {
        for algorithm in BOTH {
            for (limit, shards) in [(1_000, 8), (100, 7), (64, 64), (5, 8), (1, 3)] {
                let (backend, _clock) = sharded_at(100 * W + 17);
                let backend = Arc::new(backend);
                let template = hit("hot", algorithm, limit, shards, Cost::Consume(1));
                // Three times the limit, plus enough that even tiny limits see every shard.
                let per_task = usize::try_from(3 * limit + 200).unwrap() / 8;
                let admitted =
                    admit_concurrently(Arc::clone(&backend), template.clone(), 8, per_task).await;
                let context = format!("{algorithm}, limit {limit}, {shards} shards");
                assert!(admitted <= limit, "{context}: admitted {admitted}");
                assert!(admitted * 10 >= limit * 9, "{context}: admitted {admitted}");
                // The shards' own windows account for exactly what was admitted.
                let mut charged = 0;
                for shard in 0..shards {
                    let budget = shard_budget(limit, shard, shards);
                    charged += budget - shard_left(&backend, &template, shard).await;
                }
                assert_eq!(charged, admitted, "{context}");
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn weighted_costs_never_exceed_the_limit() {
        for algorithm in BOTH {
            // Four shards of 25: eight hits of 3 fit in each, 96 of the 100 units in all.
            let (backend, _clock) = sharded_at(100 * W);
            let backend = Arc::new(backend);
            let template = hit("w", algorithm, 100, 4, Cost::Consume(3));
            let admitted = admit_concurrently(Arc::clone(&backend), template, 4, 40).await;
            assert_eq!(admitted, 96, "{algorithm}");

            // Budgets 4, 3, 3: a cost of 4 fits only shard 0, and only once.
            let (backend, _clock) = sharded_at(100 * W);
            let big = hit("big", algorithm, 10, 3, Cost::Consume(4));
            let first = one(&backend, &big).await;
            assert!(first.verdict.admitted, "{algorithm}");
            assert_eq!(first.receipt.unwrap().key, plain_shard_key("big", 0));
            assert_eq!(first.verdict.remaining, 0);
            assert!(!one(&backend, &big).await.verdict.admitted);
            let small = hit("big", algorithm, 10, 3, Cost::Consume(3));
            let mut admitted = 0;
            for _ in 0..20 {
                admitted += u64::from(one(&backend, &small).await.verdict.admitted);
            }
            assert_eq!(admitted, 2, "{algorithm}: one 3 in each of shards 1 and 2");
        }
    }

    #[tokio::test]
    async fn a_cost_above_every_shard_budget_is_never_admitted() {
        for algorithm in BOTH {
            let (backend, clock) = sharded_at(100 * W);
            // Budgets 3, 3, 2, 2: a cost of 4 fits the limit of 10 but no shard.
            let h = hit("k", algorithm, 10, 4, Cost::Consume(4));
            for _ in 0..5 {
                let outcome = one(&backend, &h).await;
                assert!(!outcome.verdict.admitted, "{algorithm}");
                assert_eq!(outcome.verdict.reset_ms, W, "{algorithm}: the full window");
                assert_eq!(outcome.receipt, None);
                clock.advance(3 * W);
            }
            // No retry is wasted on a hit that cannot fit anywhere.
            assert!(backend.inner().calls().iter().all(|call| call.len() == 1));
            assert_eq!(backend.inner().calls().len(), 5);
        }
    }

    #[tokio::test]
    async fn a_limit_below_the_shard_count_uses_only_shards_with_budget() {
        for algorithm in BOTH {
            let (backend, _clock) = sharded_at(100 * W);
            let h = hit("k", algorithm, 3, 8, Cost::Consume(1));
            let mut admitted = 0;
            for _ in 0..30 {
                let outcome = one(&backend, &h).await;
                if let Some(receipt) = outcome.receipt {
                    admitted += 1;
                    let shard_keys: Vec<String> =
                        (0..3).map(|shard| plain_shard_key("k", shard)).collect();
                    assert!(shard_keys.contains(&receipt.key), "{}", receipt.key);
                }
            }
            assert_eq!(admitted, 3, "{algorithm}");
            // Full, but nothing is above a budget, so a check passes with nothing left.
            let check = hit("k", algorithm, 3, 8, Cost::CheckOnly);
            let verdict = one(&backend, &check).await.verdict;
            assert_eq!((verdict.admitted, verdict.remaining), (true, 0));

            let (backend, _clock) = sharded_at(100 * W);
            let zero = hit("z", algorithm, 0, 8, Cost::Consume(1));
            let outcome = one(&backend, &zero).await;
            assert!(!outcome.verdict.admitted);
            assert_eq!(
                (outcome.verdict.remaining, outcome.verdict.reset_ms),
                (0, W)
            );
        }
    }

    #[tokio::test]
    async fn refunds_restore_the_shard_that_was_charged() {
        for algorithm in BOTH {
            let (backend, _clock) = sharded_at(100 * W + 250);
            // Four shards of 2.
            let h = hit("r", algorithm, 8, 4, Cost::Consume(1));
            let outcome = one(&backend, &h).await;
            let receipt = outcome.receipt.unwrap();
            let charged = (0..4)
                .find(|&shard| receipt.key == plain_shard_key("r", shard))
                .unwrap();
            for shard in 0..4 {
                let expected = if shard == charged { 1 } else { 2 };
                assert_eq!(
                    shard_left(&backend, &h, shard).await,
                    expected,
                    "{algorithm}"
                );
            }
            backend.release(&[receipt]).await.unwrap();
            for shard in 0..4 {
                assert_eq!(shard_left(&backend, &h, shard).await, 2, "{algorithm}");
            }

            // A full limit takes exactly one more hit after one refund.
            let mut receipts = Vec::new();
            for _ in 0..40 {
                receipts.extend(one(&backend, &h).await.receipt);
            }
            assert_eq!(receipts.len(), 8, "{algorithm}");
            backend.release(&receipts[3..4]).await.unwrap();
            let mut admitted = 0;
            for _ in 0..40 {
                admitted += usize::from(one(&backend, &h).await.verdict.admitted);
            }
            assert_eq!(admitted, 1, "{algorithm}");
        }
    }

    /// The shards whose usage is above their budget, found with checks (which refuse exactly
    /// there).
    async fn shards_over(backend: &Sharded<Recording>, hit: &Hit) -> Vec<u16> {
        let mut over = Vec::new();
        for shard in 0..hit.shards {
            let mut probe = backend.shard_hit(hit, shard, Counting::Admitted);
            probe.cost = Cost::CheckOnly;
            if !one(&backend.inner().memory, &probe).await.verdict.admitted {
                over.push(shard);
            }
        }
        over
    }

    #[tokio::test]
    async fn a_refused_hit_counted_in_full_is_charged_to_exactly_one_shard() {
        for algorithm in BOTH {
            let (backend, _clock) = sharded_at(100 * W);
            // Four shards of 2, filled exactly (two random tries may miss the last free shard,
            // hence the loop).
            let mut h = hit("all", algorithm, 8, 4, Cost::Consume(1));
            let mut admitted = 0;
            while admitted < 8 {
                admitted += usize::from(one(&backend, &h).await.verdict.admitted);
            }
            assert!(shards_over(&backend, &h).await.is_empty(), "{algorithm}");

            // Every hit counted from now on: a first try that another may follow does not
            // charge its refusal, the second does.
            h.counting = Counting::All;

            backend.inner().calls.lock().unwrap().clear();
            let refused = one(&backend, &h).await;
            assert!(!refused.verdict.admitted);
            assert_eq!(refused.receipt, None);
            let calls = backend.inner().calls();
            assert_eq!(calls.len(), 2, "a second shard is tried");
            assert_eq!(calls[0][0].counting, Counting::Admitted);
            assert_eq!(calls[1][0].counting, Counting::All);
            let over = shards_over(&backend, &h).await;
            assert_eq!(
                over.len(),
                1,
                "{algorithm}: the debit is charged once: {over:?}"
            );

            // A cost no shard can hold is charged on its only try.
            let mut big = hit("big", algorithm, 8, 4, Cost::Consume(5));
            big.counting = Counting::All;
            backend.inner().calls.lock().unwrap().clear();
            assert!(!one(&backend, &big).await.verdict.admitted);
            assert_eq!(backend.inner().calls().len(), 1);
            assert_eq!(shards_over(&backend, &big).await.len(), 1, "{algorithm}");
        }
    }

    #[tokio::test]
    async fn remaining_is_the_shards_times_n_capped_at_the_limit() {
        for algorithm in BOTH {
            let (backend, _clock) = sharded_at(100 * W);
            // Budgets 4, 3, 3: an idle shard 0 would report 12, more than the limit.
            let check = hit("c", algorithm, 10, 3, Cost::CheckOnly);
            let mut seen = std::collections::BTreeSet::new();
            for _ in 0..200 {
                let verdict = one(&backend, &check).await.verdict;
                assert!(verdict.admitted);
                seen.insert(verdict.remaining);
            }
            assert_eq!(seen.into_iter().collect::<Vec<_>>(), [9, 10], "{algorithm}");

            let h = hit("c", algorithm, 10, 3, Cost::Consume(1));
            let mut admitted = 0;
            for _ in 0..100 {
                let outcome = one(&backend, &h).await;
                let Some(receipt) = outcome.receipt else {
                    continue;
                };
                admitted += 1;
                let shard = (0..3)
                    .find(|&shard| receipt.key == plain_shard_key("c", shard))
                    .unwrap();
                let left = shard_left(&backend, &h, shard).await;
                assert_eq!(outcome.verdict.remaining, (left * 3).min(10), "{algorithm}");
            }
            assert_eq!(admitted, 10, "{algorithm}");
            let over = one(&backend, &h).await.verdict;
            assert!(!over.admitted);
            assert_eq!(over.remaining, 0);
        }
    }

    #[tokio::test]
    async fn resets_come_from_the_shard_that_answered() {
        let (backend, clock) = sharded_at(100 * W);
        // Two shards of 1 on a log: fill them at different times.
        let h = hit("t", Algorithm::SlidingWindowLog, 2, 2, Cost::Consume(1));
        let first = one(&backend, &h).await;
        assert_eq!(first.verdict.reset_ms, W);
        clock.advance(1_000);
        let second = one(&backend, &h).await;
        assert!(second.verdict.admitted);
        assert_eq!(
            second.verdict.reset_ms, W,
            "the shard charged at this instant"
        );
        assert_ne!(first.receipt.unwrap().key, second.receipt.unwrap().key);
        clock.advance(1_000);
        // Both full: the retry answers last, and each shard frees up at its own time.
        let over = one(&backend, &h).await.verdict;
        assert!(!over.admitted);
        assert!(over.reset_ms == W - 2_000 || over.reset_ms == W - 1_000);
    }

    #[tokio::test]
    async fn a_sharded_log_never_admits_more_than_the_limit_in_any_window() {
        let (backend, clock) = sharded_at(100 * W);
        let (limit, shards) = (40u64, 6u16);
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for step in 0..3_000u64 {
            clock.advance(fastrand::u64(0..=W / 50));
            let units = 1 + step % 3;
            let h = hit(
                "s",
                Algorithm::SlidingWindowLog,
                limit,
                shards,
                Cost::Consume(units),
            );
            if one(&backend, &h).await.verdict.admitted {
                admitted.push((clock.now_ms(), units));
            }
        }
        for (index, &(time, _)) in admitted.iter().enumerate() {
            let used: u64 = admitted[..=index]
                .iter()
                .filter(|(at, _)| *at > time.saturating_sub(W))
                .map(|(_, units)| units)
                .sum();
            assert!(used <= limit, "{used} units in the window ending at {time}");
        }
        assert!(admitted.len() > 100);
    }

    #[tokio::test]
    async fn a_sharded_counter_never_admits_more_than_the_limit_in_a_fixed_window() {
        let (backend, clock) = sharded_at(100 * W);
        let (limit, shards) = (40u64, 6u16);
        let mut per_window = std::collections::BTreeMap::<u64, u64>::new();
        for step in 0..3_000u64 {
            clock.advance(fastrand::u64(0..=W / 50));
            let units = 1 + step % 3;
            let h = hit(
                "s",
                Algorithm::SlidingWindowCounter,
                limit,
                shards,
                Cost::Consume(units),
            );
            if one(&backend, &h).await.verdict.admitted {
                *per_window.entry(clock.now_ms() / W).or_default() += units;
            }
        }
        assert!(per_window.len() > 5);
        assert!(
            per_window.values().all(|&used| used <= limit),
            "{per_window:?}"
        );
    }
}
