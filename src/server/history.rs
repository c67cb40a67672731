//! What each limit decided over the last ten minutes, in ten-second slots: the charts of the
//! admin page (`GET /ui`, from `GET /ui/stats`).
//!
//! Each limit of the policies keeps two rings of `SLOTS` counters (hits decided, hits refused),
//! attached to the limit so that a decision finds them without a lookup; a counter word carries
//! its slot's number beside its count, so a slot is emptied by the first hit of its next turn
//! and no timer is needed. Memory: 2 x `SLOTS` words per limit of the policies. A limit's
//! history is kept by its key across policy reloads and dropped once no policy has the key and
//! its ten minutes hold nothing. A descriptor's own limit (Envoy's `limit` override) is not
//! charted: its key comes from the request, and charting it would grow without bound.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::config::Limit;

/// How long one slot covers, in seconds.
pub const SLOT_SECONDS: u64 = 10;
/// How many slots are kept: ten minutes.
pub const SLOTS: usize = 60;

/// Bits of a counter word holding the count; the rest hold the slot's number.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// One ring of counters.
#[derive(Debug)]
struct Ring([AtomicU64; SLOTS]);

impl Default for Ring {
    fn default() -> Self {
        Ring(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Ring {
    /// Adds `n` to the counter of `slot`, restarting it from 0 if it still counts an older turn.
    fn add(&self, slot: u64, n: u64) {
        let tag = slot << COUNT_BITS;
        let word = &self.0[(slot % SLOTS as u64) as usize];
        let _ = word.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
            let count = if old & !COUNT_MASK == tag & !COUNT_MASK {
                old & COUNT_MASK
            } else {
                0
            };
            Some((tag & !COUNT_MASK) | count.saturating_add(n).min(COUNT_MASK))
        });
    }

    /// The counts of the `SLOTS` slots up to `slot`, oldest first.
    fn read(&self, slot: u64) -> Vec<u64> {
        (0..SLOTS as u64)
            .map(|back| {
                let Some(at) = slot.checked_sub(SLOTS as u64 - 1 - back) else {
                    return 0;
                };
                let old = self.0[(at % SLOTS as u64) as usize].load(Ordering::Relaxed);
                if old & !COUNT_MASK == (at << COUNT_BITS) & !COUNT_MASK {
                    old & COUNT_MASK
                } else {
                    0
                }
            })
            .collect()
    }
}

/// The two rings of one limit.
#[derive(Debug, Default)]
pub struct Cells {
    decided: Ring,
    refused: Ring,
}

impl Cells {
    /// Counts `decided` decisions at `slot`, `refused` of them refused.
    fn add(&self, slot: u64, decided: u64, refused: u64) {
        if decided > 0 {
            self.decided.add(slot, decided);
        }
        if refused > 0 {
            self.refused.add(slot, refused);
        }
    }
}

/// What a [`History`] attaches to a limit; `history` names the one that attached it (tests run
/// several in one process).
struct Attachment {
    history: u64,
    cells: Arc<Cells>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A limit's history by its key and window.
type Key = (String, u64);

/// Every limit's recent history.
#[derive(Debug)]
pub struct History {
    id: u64,
    cells: Mutex<HashMap<Key, Arc<Cells>>>,
    /// How many keys were held after the last clean-up; the next runs at twice as many.
    cleaned_at: AtomicU64,
}

impl Default for History {
    fn default() -> Self {
        History {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cells: Mutex::new(HashMap::new()),
            cleaned_at: AtomicU64::new(0),
        }
    }
}

/// The slot of `now_ms` (milliseconds since the Unix epoch).
pub fn slot_of(now_ms: u64) -> u64 {
    now_ms / (SLOT_SECONDS * 1000)
}

/// One limit's counts over the last `SLOTS` slots, oldest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    /// Decisions (hits) the limit took part in.
    pub decided: Vec<u64>,
    /// Those it refused.
    pub refused: Vec<u64>,
}

impl History {
    /// Counts one decision of `limit` at `now_ms`.
    pub fn record(&self, limit: &Limit, refused: bool, now_ms: u64) {
        self.record_many(limit, 1, u64::from(refused), now_ms);
    }

    /// Counts `decided` decisions of `limit` at `now_ms`, `refused` of them refused (what an
    /// RLQS client reports of a bucket).
    pub fn record_many(&self, limit: &Limit, decided: u64, refused: u64, now_ms: u64) {
        let slot = slot_of(now_ms);
        match limit.attached.get_or_attach(|| Attachment {
            history: self.id,
            cells: self.cells(limit),
        }) {
            Some(attached) if attached.history == self.id => {
                attached.cells.add(slot, decided, refused);
            }
            _ => self.cells(limit).add(slot, decided, refused),
        }
    }

    /// The counts of `limit` in the `SLOTS` slots up to `now_ms`; zeros for a limit with none.
    pub fn counts(&self, limit: &Limit, now_ms: u64) -> Counts {
        let slot = slot_of(now_ms);
        let cells = self
            .lock()
            .get(&(limit.series_key.clone(), limit.window_ms))
            .cloned();
        match cells {
            Some(cells) => Counts {
                decided: cells.decided.read(slot),
                refused: cells.refused.read(slot),
            },
            None => Counts {
                decided: vec![0; SLOTS],
                refused: vec![0; SLOTS],
            },
        }
    }

    /// The cells of `limit`'s key, made if new.
    fn cells(&self, limit: &Limit) -> Arc<Cells> {
        let mut cells = self.lock();
        let key = (limit.series_key.clone(), limit.window_ms);
        if let Some(found) = cells.get(&key) {
            return Arc::clone(found);
        }
        // Keys of limits no policy holds any more go once their ten minutes are empty; checked
        // when the map has doubled, so that inserting stays cheap.
        if cells.len() as u64 >= self.cleaned_at.load(Ordering::Relaxed).max(64) * 2 {
            let slot = slot_of(crate::clock::Clock::now_ms(&crate::clock::SystemClock));
            cells.retain(|_, c| {
                Arc::strong_count(c) > 1 || c.decided.read(slot).iter().any(|&n| n > 0)
            });
            self.cleaned_at.store(cells.len() as u64, Ordering::Relaxed);
        }
        let made = Arc::new(Cells::default());
        cells.insert(key, Arc::clone(&made));
        made
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<Cells>>> {
        self.cells.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::Unit;

    fn limit(key: &str) -> Limit {
        Limit::plain(key.into(), 5, Unit::Minute)
    }

    #[test]
    fn decisions_land_in_their_slot_and_age_out() {
        let history = History::default();
        let per_user = limit("edge.user");
        let t0 = 1_000_000 * SLOT_SECONDS * 1000;
        history.record(&per_user, false, t0);
        history.record(&per_user, true, t0 + 1);
        history.record(&per_user, true, t0 + SLOT_SECONDS * 1000);
        let counts = history.counts(&per_user, t0 + SLOT_SECONDS * 1000);
        assert_eq!(counts.decided[SLOTS - 2..], [2, 1]);
        assert_eq!(counts.refused[SLOTS - 2..], [1, 1]);
        assert_eq!(counts.decided.iter().sum::<u64>(), 3);
        // Ten minutes on, the old slots read as empty, and a new turn of a slot restarts it.
        let later = t0 + SLOTS as u64 * SLOT_SECONDS * 1000;
        assert_eq!(
            history.counts(&per_user, later).decided.iter().sum::<u64>(),
            1
        );
        history.record(&per_user, false, later);
        assert_eq!(history.counts(&per_user, later).decided[SLOTS - 1], 1);
    }

    #[test]
    fn a_reloaded_limit_keeps_its_history_and_others_have_none() {
        let history = History::default();
        history.record(&limit("edge.user"), true, 0);
        // A new copy of the limit (a reload) reads the same history.
        assert_eq!(history.counts(&limit("edge.user"), 0).refused[SLOTS - 1], 1);
        assert_eq!(
            history.counts(&limit("edge.path"), 0).decided,
            vec![0; SLOTS]
        );
        // Another history in the same process counts apart, even on an attached limit.
        let shared = limit("edge.user");
        history.record(&shared, false, 0);
        let other = History::default();
        other.record(&shared, false, 0);
        assert_eq!(other.counts(&shared, 0).decided[SLOTS - 1], 1);
        assert_eq!(history.counts(&shared, 0).decided[SLOTS - 1], 2);
    }
}
