//! Reading and forgetting one window of the memory backend for an operator
//! ([`Backend::peek`](crate::backend::Backend::peek), [`Backend::clear`](crate::backend::Backend::clear)).
//! A peek takes the shard's lock only to read: it neither advances the shard's clock nor
//! prunes, sweeps or creates anything.

use super::{Id, MemoryBackend, Shard, State, counter_index, window_of};
use crate::backend::{Hit, WindowState};
use crate::window::{self, Algorithm};

impl MemoryBackend {
    /// What `hit`'s window holds now.
    pub(super) fn peek_one(&self, hit: &Hit) -> WindowState {
        let window_ms = window_of(hit.window_ms);
        let (id, index) = self.locate(&hit.key, hit.algorithm, window_ms);
        let now = self.clock.now_ms();
        let shard = self.lock(index);
        // Time never runs backwards inside a shard: read at the latest instant it has seen.
        let now = now.max(shard.latest_ms);
        shard.peek(id, hit, window_ms, now)
    }

    /// Drops `hit`'s window, whatever it holds.
    pub(super) fn clear_one(&self, hit: &Hit) {
        let window_ms = window_of(hit.window_ms);
        let (id, index) = self.locate(&hit.key, hit.algorithm, window_ms);
        self.lock(index).forget(id);
    }
}

impl Shard {
    fn peek(&self, id: Id, hit: &Hit, window_ms: u64, now_ms: u64) -> WindowState {
        let empty = WindowState {
            used: 0,
            remaining: hit.limit,
            reset_ms: 0,
        };
        let Some(slot) = self.slots.find(id.hash, |slot| slot.id == id) else {
            return empty;
        };
        match (hit.algorithm, &slot.state) {
            (Algorithm::SlidingWindowCounter, State::Counter { prev, curr }) => {
                let index = window::counter_window_index(now_ms, window_ms);
                let (prev, curr) = window::counter_counts(
                    counter_index(slot.expires_ms, window_ms, index),
                    *prev,
                    *curr,
                    index,
                );
                WindowState::counter(hit.limit, window_ms, now_ms, prev, curr)
            }
            (Algorithm::SlidingWindowLog, State::Log(log)) => {
                WindowState::log(hit.limit, window_ms, now_ms, self.logs.entries(*log))
            }
            // The identity includes the algorithm, so a slot always holds its own kind.
            _ => empty,
        }
    }

    fn forget(&mut self, id: Id) {
        let Ok(found) = self.slots.find_entry(id.hash, |slot| slot.id == id) else {
            return;
        };
        let (slot, _) = found.remove();
        if let State::Log(log) = slot.state {
            self.logs.remove(log);
        }
    }
}
