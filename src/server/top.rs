//! Who is being refused: per domain, the descriptors refused most often in the last five
//! minutes (`GET /top`, the admin page, and the `tollgate_top_refused` gauge).
//!
//! Metrics cannot answer "who" (per-client series are unbounded), and keeping an exact count per
//! refused descriptor is unbounded too: a flood of distinct clients would grow it without end.
//! So each domain keeps a heavy-hitters sketch ([`SpaceSaving`]) of `CAPACITY` counters per
//! one-minute slot, five slots in a ring, merged when asked. Memory is bounded: at most
//! `MAX_DOMAINS` domains (refusals only come from domains the policies declare) times five slots
//! times `CAPACITY` descriptors, each descriptor's text cut to `MAX_ENTRIES` entries of
//! `MAX_TEXT` bytes. A merged count is never below the true count and overestimates it by at
//! most `N / CAPACITY`, where `N` is the domain's refusals over the five minutes; any descriptor
//! refused more than `N / CAPACITY` times is listed.
//!
//! Only refusals are recorded, under one lock per domain; an admitted request touches nothing
//! here, and a refusal allocates only when its descriptor is new to the slot.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use crate::config::Limit;
use crate::descriptor::Entry;

/// Counters per domain and slot: the sketch's `k`.
pub const CAPACITY: usize = 64;
/// How long one slot covers, in milliseconds.
pub const SLOT_MS: u64 = 60_000;
/// How many slots are merged: with the current (partial) minute, the last five minutes.
pub const SLOTS: usize = 5;
/// The most domains counted; a domain past it is not (refusals come only from the policies'
/// domains, so this is only reached by very large policy sets).
pub const MAX_DOMAINS: usize = 256;
/// The most entries of a descriptor kept for display (its identity uses them all).
pub const MAX_ENTRIES: usize = 16;
/// The most bytes of an entry's key or value kept for display.
pub const MAX_TEXT: usize = 128;
/// The most descriptors one `/top` answer lists.
pub const MAX_N: usize = CAPACITY;
/// How many ranks of each domain the `tollgate_top_refused` gauge shows.
pub const METRIC_RANKS: usize = 5;

/// A Space-Saving summary (Metwally, Agrawal, El Abbadi, 2005) of a weighted stream: at most
/// `capacity` counters; an item not counted yet takes over the smallest counter when all are
/// taken, inheriting its count. For a stream of total weight `N`, every counted item's count is
/// at least its true weight and at most its true weight plus the smallest counter, which is at
/// most `N / capacity`; any item heavier than `N / capacity` is counted.
#[derive(Debug, Clone)]
pub struct SpaceSaving<T> {
    capacity: usize,
    items: Vec<Counted<T>>,
    /// Where each counted item's id is in `items`.
    index: HashMap<u64, usize>,
    total: u64,
}

/// One counter of a [`SpaceSaving`] summary.
#[derive(Debug, Clone)]
pub struct Counted<T> {
    /// The item's identity (a hash of what it stands for).
    pub id: u64,
    /// What the item stands for.
    pub value: T,
    /// Its count: its true weight plus at most `error`.
    pub count: u64,
    /// The count it inherited when it took over a counter: the most its count overestimates.
    pub error: u64,
}

impl<T> SpaceSaving<T> {
    /// An empty summary of `capacity` counters (at least one).
    pub fn new(capacity: usize) -> Self {
        SpaceSaving {
            capacity: capacity.max(1),
            items: Vec::new(),
            index: HashMap::new(),
            total: 0,
        }
    }

    /// Counts `weight` more of the item `id`; `make` says what it stands for, called only when
    /// the item is not counted yet.
    pub fn offer(&mut self, id: u64, weight: u64, make: impl FnOnce() -> T) {
        self.total = self.total.saturating_add(weight);
        if let Some(item) = self.index.get(&id).and_then(|&i| self.items.get_mut(i)) {
            item.count = item.count.saturating_add(weight);
            return;
        }
        if self.items.len() < self.capacity {
            self.index.insert(id, self.items.len());
            self.items.push(Counted {
                id,
                value: make(),
                count: weight,
                error: 0,
            });
            return;
        }
        // Full: the smallest counter changes hands (a scan of `capacity` counters, only when a
        // new item arrives at a full summary).
        let Some((at, smallest)) = self
            .items
            .iter()
            .enumerate()
            .min_by_key(|(_, item)| item.count)
            .map(|(at, item)| (at, item.count))
        else {
            return;
        };
        if let Some(old) = self.items.get(at) {
            self.index.remove(&old.id);
        }
        self.index.insert(id, at);
        if let Some(slot) = self.items.get_mut(at) {
            *slot = Counted {
                id,
                value: make(),
                count: smallest.saturating_add(weight),
                error: smallest,
            };
        }
    }

    /// The most an item not counted here may have weighed: the smallest counter once every
    /// counter is taken, else 0 (every item seen is counted).
    pub fn floor(&self) -> u64 {
        if self.items.len() < self.capacity {
            0
        } else {
            self.items.iter().map(|item| item.count).min().unwrap_or(0)
        }
    }

    /// The count of item `id`, if counted.
    pub fn get(&self, id: u64) -> Option<&Counted<T>> {
        self.index.get(&id).and_then(|&i| self.items.get(i))
    }

    /// The counted items, in no order.
    pub fn items(&self) -> &[Counted<T>] {
        &self.items
    }

    /// The total weight offered.
    pub fn total(&self) -> u64 {
        self.total
    }
}

/// Merges summaries of consecutive parts of one stream: each item counted in any of them, with
/// the sum of its counts, plus, for each summary that does not count it, that summary's
/// [`SpaceSaving::floor`]. The result keeps the bound of one summary: never below the true
/// weight, above it by at most the sum of the floors, which is at most `N / capacity` for the
/// total weight `N` of the parts. Sorted heaviest first.
pub fn merge<'a, T: Clone + 'a>(
    parts: impl IntoIterator<Item = &'a SpaceSaving<T>> + Clone,
) -> Vec<(T, u64)> {
    let mut merged: HashMap<u64, (T, u64)> = HashMap::new();
    for part in parts.clone() {
        for item in part.items() {
            merged
                .entry(item.id)
                .or_insert_with(|| (item.value.clone(), 0))
                .1 += item.count;
        }
    }
    for part in parts {
        let floor = part.floor();
        if floor == 0 {
            continue;
        }
        for (id, (_, count)) in merged.iter_mut() {
            if part.get(*id).is_none() {
                *count = count.saturating_add(floor);
            }
        }
    }
    let mut merged: Vec<(T, u64)> = merged.into_values().collect();
    merged.sort_by_key(|item| std::cmp::Reverse(item.1));
    merged
}

/// A refused descriptor as `/top` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// Its entries (at most [`MAX_ENTRIES`], each cut to [`MAX_TEXT`] bytes).
    pub entries: Vec<(String, String)>,
    /// The limit that refused it: its name, or its full key when it has none.
    pub limit: String,
    /// Whether that limit is the descriptor's own (Envoy's `limit` override), whose full key the
    /// request made: the metric does not show it.
    pub overridden: bool,
}

/// One domain's slots.
#[derive(Debug)]
struct DomainTop {
    /// Each slot with the minute (since the epoch) it counts, in a ring by minute.
    slots: [(u64, SpaceSaving<Refused>); SLOTS],
}

impl DomainTop {
    fn new() -> Self {
        DomainTop {
            slots: std::array::from_fn(|_| (u64::MAX, SpaceSaving::new(CAPACITY))),
        }
    }

    /// The slot of `minute`, emptied first if it held an older minute.
    fn slot(&mut self, minute: u64) -> &mut SpaceSaving<Refused> {
        let (held, sketch) = &mut self.slots[(minute % SLOTS as u64) as usize];
        if *held != minute {
            *held = minute;
            *sketch = SpaceSaving::new(CAPACITY);
        }
        sketch
    }

    /// The descriptors refused in the five minutes up to `minute`, heaviest first.
    fn top(&self, minute: u64) -> Vec<(Refused, u64)> {
        let live = self
            .slots
            .iter()
            .filter(|(held, _)| *held <= minute && minute - *held < SLOTS as u64)
            .map(|(_, sketch)| sketch);
        let mut top = merge(live);
        // Ties in a stable order, so that an answer does not shuffle between two calls.
        top.sort_by(|a, b| {
            b.1.cmp(&a.1)
                .then_with(|| a.0.entries.cmp(&b.0.entries))
                .then_with(|| a.0.limit.cmp(&b.0.limit))
        });
        top
    }
}

/// The refused descriptors of every domain, as the service counts them.
#[derive(Debug)]
pub struct TopRefused {
    domains: RwLock<HashMap<String, Arc<Mutex<DomainTop>>>>,
    /// Hashes descriptors into ids, with a seed of this process's own so no client can aim
    /// collisions.
    hasher: foldhash::fast::RandomState,
    full_logged: AtomicBool,
}

impl Default for TopRefused {
    fn default() -> Self {
        TopRefused {
            domains: RwLock::new(HashMap::new()),
            hasher: foldhash::fast::RandomState::default(),
            full_logged: AtomicBool::new(false),
        }
    }
}

/// What a limit is called in `/top`: its name, or its full key.
pub fn limit_label(limit: &Limit) -> &str {
    limit.name.as_deref().unwrap_or(&limit.full_key)
}

impl TopRefused {
    /// Counts `weight` refusals of the descriptor `entries` of `domain` by `limit` at `now_ms`
    /// (milliseconds since the Unix epoch).
    pub fn record<'a, I>(
        &self,
        domain: &str,
        entries: I,
        limit: (&str, bool),
        weight: u64,
        now_ms: u64,
    ) where
        I: IntoIterator<Item = (&'a str, &'a str)> + Clone,
    {
        if weight == 0 {
            return;
        }
        let Some(top) = self.domain(domain) else {
            return;
        };
        let mut hasher = self.hasher.build_hasher();
        for (key, value) in entries.clone() {
            key.hash(&mut hasher);
            value.hash(&mut hasher);
        }
        limit.0.hash(&mut hasher);
        let id = hasher.finish();
        let mut top = top.lock().unwrap_or_else(|e| e.into_inner());
        top.slot(now_ms / SLOT_MS).offer(id, weight, || Refused {
            entries: entries
                .into_iter()
                .take(MAX_ENTRIES)
                .map(|(key, value)| (cut(key), cut(value)))
                .collect(),
            limit: cut(limit.0),
            overridden: limit.1,
        });
    }

    /// Counts the refusals of a request descriptor's `entries` by `limit` (`overridden`: the
    /// descriptor's own).
    pub fn record_entries(
        &self,
        domain: &str,
        entries: &[Entry],
        (limit, overridden): (&Limit, bool),
        weight: u64,
        now_ms: u64,
    ) {
        self.record(
            domain,
            entries.iter().map(|e| (e.key.as_str(), e.value.as_str())),
            (limit_label(limit), overridden),
            weight,
            now_ms,
        );
    }

    /// The `n` descriptors of `domain` refused most often in the five minutes up to `now_ms`,
    /// most refused first.
    pub fn top(&self, domain: &str, n: usize, now_ms: u64) -> Vec<(Refused, u64)> {
        let Some(top) = self
            .domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
            .cloned()
        else {
            return Vec::new();
        };
        let mut top = top
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .top(now_ms / SLOT_MS);
        top.truncate(n);
        top
    }

    /// The domains that have refusals counted, sorted.
    pub fn domains(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect();
        names.sort();
        names
    }

    /// The slots of `domain`, made at its first refusal; `None` past [`MAX_DOMAINS`].
    fn domain(&self, domain: &str) -> Option<Arc<Mutex<DomainTop>>> {
        if let Some(found) = self
            .domains
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(domain)
        {
            return Some(Arc::clone(found));
        }
        let mut domains = self.domains.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = domains.get(domain) {
            return Some(Arc::clone(found));
        }
        if domains.len() >= MAX_DOMAINS {
            if !self.full_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    cap = MAX_DOMAINS,
                    "top refused: more domains with refusals than the cap; further domains are \
                     not counted in /top"
                );
            }
            return None;
        }
        let top = Arc::new(Mutex::new(DomainTop::new()));
        domains.insert(domain.to_string(), Arc::clone(&top));
        Some(top)
    }
}

/// `text`, cut to at most [`MAX_TEXT`] bytes at a character boundary.
fn cut(text: &str) -> String {
    let mut end = text.len().min(MAX_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// `tollgate_top_refused{domain,rank,limit}`: the refusals of each domain's `METRIC_RANKS` most
/// refused descriptors over the last five minutes. The descriptors themselves are left out: their
/// values (users, addresses) would make a new series each time the ranking changes, and put
/// client identities in the metrics store; `GET /top` names them.
impl Collector for TopRefused {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now_ms = crate::clock::Clock::now_ms(&crate::clock::SystemClock);
        let mut metric = encoder.encode_descriptor(
            "tollgate_top_refused",
            "Refusals over the last five minutes of each domain's most refused descriptors, by \
             rank (1 = most refused) and the limit that refused it; GET /top?domain= names them",
            None,
            MetricType::Gauge,
        )?;
        for domain in self.domains() {
            for (rank, (refused, count)) in self
                .top(&domain, METRIC_RANKS, now_ms)
                .into_iter()
                .enumerate()
            {
                let labels = [
                    ("domain".to_string(), domain.clone()),
                    ("rank".to_string(), (rank + 1).to_string()),
                    (
                        "limit".to_string(),
                        if refused.overridden {
                            "(override)".to_string()
                        } else {
                            refused.limit
                        },
                    ),
                ];
                metric
                    .encode_family(&labels.to_vec())?
                    .encode_gauge(&(count as i64))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "top/tests.rs"]
mod tests;
