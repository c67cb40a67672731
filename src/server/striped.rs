//! Counters and histograms that every call records, split into cells, one per worker thread, and
//! summed when scraped.
//!
//! A counter is one word that every worker adds to at every call: each addition takes the cache
//! line from the core that added last, and prometheus-client's histogram also takes a mutex on
//! it. With the cells, a worker adds to a line no other worker writes; a scrape, a few times a
//! minute, pays for the sums. Each cell costs a cache line or four, so only series made once per
//! process use them (the service's, not the per-limit ones, whose number grows with the keys).
//!
//! They encode as prometheus-client's own `Counter` and `Histogram` do, so a scrape reads the
//! same text.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// How many cells a series is split into: the worker threads beyond it share cells (still
/// correct, as every cell is atomic; only the lines are shared again).
const CELLS: usize = 16;

/// The most bucket bounds a [`Histogram`] takes (the `+Inf` bucket comes on top).
pub const MAX_BOUNDS: usize = 16;

/// The cell of the calling thread: threads take the cells in turn as they first count.
fn cell_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    INDEX.with(|index| {
        if index.get() == usize::MAX {
            index.set(NEXT.fetch_add(1, Ordering::Relaxed) % CELLS);
        }
        index.get()
    })
}

/// One counter's word in a line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct CounterCell(AtomicU64);

/// A monotonic counter of whole units, counted per thread.
#[derive(Debug, Clone, Default)]
pub struct Counter {
    cells: Arc<[CounterCell; CELLS]>,
}

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.inc_by(1);
    }

    /// Adds `n`.
    pub fn inc_by(&self, n: u64) {
        self.cells[cell_index()].0.fetch_add(n, Ordering::Relaxed);
    }

    /// The count, summed over the cells.
    pub fn get(&self) -> u64 {
        self.cells.iter().fold(0u64, |sum, cell| {
            sum.wrapping_add(cell.0.load(Ordering::Relaxed))
        })
    }
}

impl TypedMetric for Counter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for Counter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// One thread's share of a histogram: the sum of its observations (as `f64` bits) and the
/// observations per bucket, the `+Inf` bucket last.
#[derive(Debug)]
#[repr(align(128))]
struct HistogramCell {
    sum: AtomicU64,
    buckets: [AtomicU64; MAX_BOUNDS + 1],
}

impl Default for HistogramCell {
    fn default() -> Self {
        HistogramCell {
            sum: AtomicU64::new(0f64.to_bits()),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A histogram of fixed buckets, counted per thread. Its count is the sum of its buckets, so a
/// scrape always shows a `+Inf` bucket equal to the count.
#[derive(Debug, Clone)]
pub struct Histogram {
    inner: Arc<HistogramInner>,
}

#[derive(Debug)]
struct HistogramInner {
    /// The upper bounds, ascending; at most [`MAX_BOUNDS`].
    bounds: Vec<f64>,
    cells: [HistogramCell; CELLS],
}

impl Histogram {
    /// A histogram with buckets up to each of `bounds` (ascending; past [`MAX_BOUNDS`] of them,
    /// the rest fall into `+Inf`) and one for everything above.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Histogram {
        Histogram {
            inner: Arc::new(HistogramInner {
                bounds: bounds.into_iter().take(MAX_BOUNDS).collect(),
                cells: std::array::from_fn(|_| HistogramCell::default()),
            }),
        }
    }

    /// Records one observation of `value`.
    pub fn observe(&self, value: f64) {
        let inner = &*self.inner;
        let bucket = inner
            .bounds
            .iter()
            .position(|&bound| value <= bound)
            .unwrap_or(inner.bounds.len());
        let cell = &inner.cells[cell_index()];
        if let Some(count) = cell.buckets.get(bucket) {
            count.fetch_add(1, Ordering::Relaxed);
        }
        // Other threads rarely share this cell, so the exchange almost always succeeds at once.
        let _ = cell
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    /// The sum, the count and the (non-cumulative) buckets, each with its upper bound, `+Inf`
    /// given as infinity as prometheus-client's encoders expect it.
    fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let inner = &*self.inner;
        let mut sum = 0.0;
        let mut buckets: Vec<(f64, u64)> = inner
            .bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .map(|bound| (bound, 0))
            .collect();
        for cell in &inner.cells {
            sum += f64::from_bits(cell.sum.load(Ordering::Relaxed));
            for ((_, count), observed) in buckets.iter_mut().zip(&cell.buckets) {
                *count += observed.load(Ordering::Relaxed);
            }
        }
        let count = buckets.iter().map(|(_, count)| count).sum();
        (sum, count, buckets)
    }
}

impl TypedMetric for Histogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Histogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.snapshot();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;
    use prometheus_client::registry::Registry;

    /// The text a registry holding `metric` as `name` scrapes to.
    fn scrape(name: &str, metric: impl prometheus_client::registry::Metric) -> String {
        let mut registry = Registry::default();
        registry.register(name, "help", metric);
        let mut out = String::new();
        encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn a_counter_sums_what_every_thread_added_and_scrapes_as_prometheus_clients_does() {
        let counter = Counter::default();
        let theirs = prometheus_client::metrics::counter::Counter::<u64>::default();
        std::thread::scope(|scope| {
            for _ in 0..(CELLS + 3) {
                scope.spawn(|| {
                    for _ in 0..1000 {
                        counter.inc();
                        theirs.inc();
                    }
                    counter.inc_by(5);
                    theirs.inc_by(5);
                });
            }
        });
        assert_eq!(counter.get(), (CELLS as u64 + 3) * 1005);
        assert_eq!(scrape("calls", counter), scrape("calls", theirs));
    }

    #[test]
    fn a_histogram_buckets_sums_and_scrapes_as_prometheus_clients_does() {
        let bounds = [
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
        ];
        let histogram = Histogram::new(bounds);
        let theirs = prometheus_client::metrics::histogram::Histogram::new(bounds);
        // On a bound, just past it, past the last one, and many from several threads.
        let values = [0.005, 0.0051, 0.3, 10.0, 11.0, 1e9, 0.0];
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for value in values {
                        histogram.observe(value);
                        theirs.observe(value);
                    }
                });
            }
        });
        let (_, count, buckets) = histogram.snapshot();
        assert_eq!(count, 4 * values.len() as u64);
        assert_eq!(buckets.len(), bounds.len() + 1);
        assert_eq!(
            buckets[0],
            (0.005, 8),
            "0.005 and 0.0 are in the first bucket"
        );
        assert_eq!(
            buckets[bounds.len()],
            (f64::INFINITY, 8),
            "11 and 1e9 are above 10"
        );
        assert_eq!(scrape("time", histogram), scrape("time", theirs));
    }

    #[test]
    fn bounds_past_the_most_a_histogram_takes_fall_into_inf() {
        let histogram = Histogram::new((1..=20).map(f64::from));
        histogram.observe(18.0);
        let (sum, count, buckets) = histogram.snapshot();
        assert_eq!(buckets.len(), MAX_BOUNDS + 1);
        assert_eq!(buckets[MAX_BOUNDS], (f64::INFINITY, 1));
        assert_eq!((sum, count), (18.0, 1));
    }
}
