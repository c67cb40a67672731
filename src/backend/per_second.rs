//! A second store for per-second limits (envoyproxy/ratelimit's `REDIS_PERSECOND`): limits whose
//! window is one second are charged in one backend, every other limit in the main one. Per-second
//! limits are the busiest and the shortest-lived, so a deployment may give them a Redis of their
//! own.

use futures_util::future::Either;

use crate::backend::{
    Backend, BackendError, Cleared, Hit, MemoryUsage, Outcome, Peeked, Receipt, Results, ShardKeys,
    SustainedFailure,
};

/// The window, in milliseconds, whose limits go to the per-second backend.
const ONE_SECOND_MS: u64 = 1000;

/// The main backend and, optionally, one for one-second windows.
#[derive(Debug)]
pub struct PerSecond<B> {
    main: B,
    per_second: Option<B>,
}

impl<B> PerSecond<B> {
    /// Every limit in `main`, except one-second windows when `per_second` is given.
    pub fn new(main: B, per_second: Option<B>) -> Self {
        PerSecond { main, per_second }
    }

    /// The backend that holds windows of `window_ms`.
    fn for_window(&self, window_ms: u64) -> &B {
        match &self.per_second {
            Some(per_second) if window_ms == ONE_SECOND_MS => per_second,
            _ => &self.main,
        }
    }
}

impl<B: Backend> PerSecond<B> {
    /// Splits `hits`, which hold both one-second windows and others, between the two backends,
    /// asks both at once and answers in `hits`' order.
    async fn acquire_split(&self, per_second: &B, hits: &[Hit]) -> Results {
        type Indexed<'h> = Vec<(usize, &'h Hit)>;
        let (fast, slow): (Indexed<'_>, Indexed<'_>) = hits
            .iter()
            .enumerate()
            .partition(|(_, hit)| hit.window_ms == ONE_SECOND_MS);
        let fast_hits: Vec<Hit> = fast.iter().map(|(_, hit)| (*hit).clone()).collect();
        let slow_hits: Vec<Hit> = slow.iter().map(|(_, hit)| (*hit).clone()).collect();
        let (fast_results, slow_results) = futures_util::future::join(
            per_second.acquire(&fast_hits),
            self.main.acquire(&slow_hits),
        )
        .await;
        let mut results: Vec<Option<Result<Outcome, BackendError>>> =
            (0..hits.len()).map(|_| None).collect();
        for ((index, _), result) in fast.iter().zip(fast_results) {
            results[*index] = Some(result);
        }
        for ((index, _), result) in slow.iter().zip(slow_results) {
            results[*index] = Some(result);
        }
        results
            .into_iter()
            .map(|result| {
                result
                    .unwrap_or_else(|| Err(BackendError::Protocol("a hit went unanswered".into())))
            })
            .collect()
    }
}

impl<B: Backend> Backend for PerSecond<B> {
    /// A batch for one backend, the usual case, is that backend's own future, adding nothing to
    /// the future every layer above carries; a batch that mixes one-second windows with others
    /// is split, in a box.
    fn acquire(&self, hits: &[Hit]) -> impl Future<Output = Results> + Send {
        let Some(per_second) = &self.per_second else {
            return Either::Left(self.main.acquire(hits));
        };
        let fast = hits
            .iter()
            .filter(|hit| hit.window_ms == ONE_SECOND_MS)
            .count();
        if fast == 0 {
            Either::Left(self.main.acquire(hits))
        } else if fast == hits.len() {
            Either::Left(per_second.acquire(hits))
        } else {
            Either::Right(Box::pin(self.acquire_split(per_second, hits)))
        }
    }

    /// A group whose hits live in two stores cannot be decided in one step.
    fn joint(&self, group: &[Hit]) -> bool {
        match &self.per_second {
            None => self.main.joint(group),
            Some(per_second) => {
                let fast = group
                    .iter()
                    .filter(|hit| hit.window_ms == ONE_SECOND_MS)
                    .count();
                if fast == 0 {
                    self.main.joint(group)
                } else if fast == group.len() {
                    per_second.joint(group)
                } else {
                    false
                }
            }
        }
    }

    async fn release(&self, receipts: &[Receipt]) -> Result<(), BackendError> {
        let Some(per_second) = &self.per_second else {
            return self.main.release(receipts).await;
        };
        let (fast, slow): (Vec<Receipt>, Vec<Receipt>) = receipts
            .iter()
            .cloned()
            .partition(|receipt| receipt.window_ms == ONE_SECOND_MS);
        let (fast, slow) = futures_util::future::join(
            async {
                if fast.is_empty() {
                    Ok(())
                } else {
                    per_second.release(&fast).await
                }
            },
            async {
                if slow.is_empty() {
                    Ok(())
                } else {
                    self.main.release(&slow).await
                }
            },
        )
        .await;
        fast.and(slow)
    }

    async fn peek(&self, hits: &[Hit]) -> Peeked {
        let Some(per_second) = &self.per_second else {
            return self.main.peek(hits).await;
        };
        let ((fast_at, fast), (slow_at, slow)) = by_store(hits);
        let (fast, slow) =
            futures_util::future::join(per_second.peek(&fast), self.main.peek(&slow)).await;
        in_order(hits.len(), [(fast_at, fast), (slow_at, slow)])
    }

    async fn clear(&self, hits: &[Hit]) -> Cleared {
        let Some(per_second) = &self.per_second else {
            return self.main.clear(hits).await;
        };
        let ((fast_at, fast), (slow_at, slow)) = by_store(hits);
        let (fast, slow) =
            futures_util::future::join(per_second.clear(&fast), self.main.clear(&slow)).await;
        in_order(hits.len(), [(fast_at, fast), (slow_at, slow)])
    }

    async fn ping(&self) -> Result<(), BackendError> {
        self.main.ping().await?;
        match &self.per_second {
            Some(per_second) => per_second.ping().await,
            None => Ok(()),
        }
    }

    async fn maintain(&self) {
        self.main.maintain().await;
        if let Some(per_second) = &self.per_second {
            per_second.maintain().await;
        }
    }

    /// Both stores' holdings added up (the per-second store is a Redis, which holds none).
    fn memory_usage(&self) -> Option<MemoryUsage> {
        let main = self.main.memory_usage();
        let per_second = self.per_second.as_ref().and_then(Backend::memory_usage);
        match (main, per_second) {
            (Some(a), Some(b)) => Some(MemoryUsage {
                bytes: a.bytes.saturating_add(b.bytes),
                budget: a.budget.saturating_add(b.budget),
                keys: a.keys.saturating_add(b.keys),
                evictions: a.evictions.saturating_add(b.evictions),
            }),
            (one, other) => one.or(other),
        }
    }

    /// The store that has been failing the longer: while either fails every call, the limits it
    /// holds answer only their failure modes.
    fn failing_since(&self) -> Option<SustainedFailure> {
        let main = self.main.failing_since();
        let per_second = self.per_second.as_ref().and_then(Backend::failing_since);
        match (main, per_second) {
            (Some(a), Some(b)) => Some(if b.since < a.since { b } else { a }),
            (one, other) => one.or(other),
        }
    }
}

/// Shard keys come from the store that holds the window. Both stores are Redis backends, whose
/// shard identities agree, so the main one answers for both.
impl<B: ShardKeys> ShardKeys for PerSecond<B> {
    fn shard_key(&self, key: &str, shard: u16, shards: u16) -> String {
        self.for_window(0).shard_key(key, shard, shards)
    }
}

/// Positions and copies of the hits of `hits` that go to each store: the one-second windows
/// first, then the others.
type Split = ((Vec<usize>, Vec<Hit>), (Vec<usize>, Vec<Hit>));

fn by_store(hits: &[Hit]) -> Split {
    let mut split: Split = Default::default();
    for (index, hit) in hits.iter().enumerate() {
        let (at, part) = if hit.window_ms == ONE_SECOND_MS {
            &mut split.0
        } else {
            &mut split.1
        };
        at.push(index);
        part.push(hit.clone());
    }
    split
}

/// One store's answers and the positions of the hits they answer.
type Answered<T> = (Vec<usize>, Vec<Result<T, BackendError>>);

/// The answers of both stores put back in the order of the `len` hits they were split from.
fn in_order<T>(len: usize, parts: [Answered<T>; 2]) -> Vec<Result<T, BackendError>> {
    let mut results: Vec<Option<Result<T, BackendError>>> = (0..len).map(|_| None).collect();
    for (at, answers) in parts {
        for (index, answer) in at.into_iter().zip(answers) {
            if let Some(slot) = results.get_mut(index) {
                *slot = Some(answer);
            }
        }
    }
    results
        .into_iter()
        .map(|result| {
            result.unwrap_or_else(|| Err(BackendError::Protocol("a hit went unanswered".into())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemoryBackend;
    use crate::window::{Algorithm, Cost, Counting};

    fn hit(key: &str, window_ms: u64) -> Hit {
        Hit {
            key: key.into(),
            algorithm: Algorithm::SlidingWindowCounter,
            limit: 1,
            window_ms,
            cost: Cost::Consume(1),
            counting: Counting::Admitted,
            shards: 1,
            lease_ms: 0,
            tentative: false,
            group: 0,
            descriptor_tag: false,
            slice: false,
        }
    }

    fn admitted(results: &Results) -> Vec<bool> {
        results
            .iter()
            .map(|r| r.as_ref().is_ok_and(|o| o.verdict.admitted))
            .collect()
    }

    #[tokio::test]
    async fn one_second_windows_go_to_their_own_store_in_request_order() {
        let split = PerSecond::new(MemoryBackend::new(), Some(MemoryBackend::new()));
        let hits = [hit("a", 60_000), hit("b", 1000), hit("c", 60_000)];
        assert_eq!(admitted(&split.acquire(&hits).await), [true, true, true]);
        // Each store now holds only its own windows: the per-second one knows `b` alone.
        let per_second = split.per_second.as_ref().unwrap();
        assert_eq!(
            admitted(&per_second.acquire(&hits).await),
            [true, false, true]
        );
        assert_eq!(
            admitted(&split.main.acquire(&hits).await),
            [false, true, false]
        );
    }

    #[tokio::test]
    async fn a_batch_for_one_store_goes_to_that_store_alone() {
        let split = PerSecond::new(MemoryBackend::new(), Some(MemoryBackend::new()));
        let fast = [hit("a", 1000), hit("b", 1000)];
        let slow = [hit("c", 60_000)];
        assert_eq!(admitted(&split.acquire(&fast).await), [true, true]);
        assert_eq!(admitted(&split.acquire(&slow).await), [true]);
        let per_second = split.per_second.as_ref().unwrap();
        assert_eq!(admitted(&per_second.acquire(&fast).await), [false, false]);
        assert_eq!(admitted(&per_second.acquire(&slow).await), [true]);
        assert_eq!(admitted(&split.main.acquire(&fast).await), [true, true]);
        assert_eq!(admitted(&split.main.acquire(&slow).await), [false]);
    }
}
