//! The memory backend's sliding-window logs, and the pages of blocks their entries live in.
//!
//! A log's entries live as long as its window (a minute, an hour) while every request allocates
//! and frees small blocks by the thousand. Kept in a growable buffer per log on the allocator's
//! heap, large logs cut that heap up between long-lived buffers until the requests' own
//! allocations slowed down: with 80,000 logs filled for 30 s behind it, a counter's load cost
//! tollgate 18.5 µs of CPU a decision instead of 10.5. So a shard keeps its logs apart from that
//! heap: their headers side by side in one table ([`Logs`]), their entries in blocks of
//! [`BLOCK_ENTRIES`] carved from pages the shard allocates a few at a time (each as large as all
//! before it together, up to [`MAX_PAGE_BLOCKS`] blocks) and reuses itself. The heap sees a few
//! large allocations per shard instead of two per log; the same load then cost 11.1 µs.
//!
//! A log is a doubly linked chain of blocks, oldest first. The budget counts the pages and the
//! headers' table, not what is in use; a sweep that leaves three quarters of either free moves
//! what lives there to the front and gives the rest back ([`Logs::compact`]).

use std::mem::size_of;

use crate::window;

/// Entries per block. Four keeps a log of one entry as small as a growable buffer's first
/// allocation was, and costs two bytes of links per entry.
const BLOCK_ENTRIES: usize = 4;

/// No block: the end of a chain or of the free list.
const NONE: u32 = u32::MAX;

/// A block's index holds its page in the high bits and its place in the page in these low ones.
const OFFSET_BITS: u32 = 11;

/// The most blocks a page holds (about 208 KiB).
const MAX_PAGE_BLOCKS: usize = 1 << OFFSET_BITS;

/// The blocks of a shard's first page.
const FIRST_PAGE_BLOCKS: usize = 16;

/// The most pages a shard holds; one more would make an index equal to [`NONE`].
const MAX_PAGES: usize = (1 << (32 - OFFSET_BITS)) - 1;

/// One recorded hit.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LogEntry {
    pub(super) time_ms: u64,
    pub(super) cost: u64,
    /// Unique within the shard and growing in insertion order, so a log is sorted by it.
    pub(super) id: u64,
}

/// [`BLOCK_ENTRIES`] entries and the links to the blocks before and after them in their log
/// (or, for a free block, `next` links the free list): 104 bytes.
#[derive(Debug, Clone, Copy)]
struct Block {
    entries: [LogEntry; BLOCK_ENTRIES],
    prev: u32,
    next: u32,
}

const EMPTY_BLOCK: Block = Block {
    entries: [LogEntry {
        time_ms: 0,
        cost: 0,
        id: 0,
    }; BLOCK_ENTRIES],
    prev: NONE,
    next: NONE,
};

/// The pages of one shard's log blocks, and the list of its free blocks.
struct Blocks {
    pages: Vec<Box<[Block]>>,
    /// The largest page this shard allocates: small shares of a small budget get small pages.
    max_page_blocks: usize,
    /// The first free block, linked through `next`.
    free: u32,
    free_count: usize,
    /// Blocks in all pages.
    capacity: usize,
}

impl Blocks {
    /// The block store of a shard allowed `share` bytes: its pages never take more than a
    /// sixteenth of that.
    fn new(share: usize) -> Blocks {
        let fit = (share / 16 / size_of::<Block>()).max(FIRST_PAGE_BLOCKS);
        // The largest power of two at most `fit`.
        let max_page_blocks = (1usize << fit.ilog2()).min(MAX_PAGE_BLOCKS);
        Blocks {
            pages: Vec::new(),
            max_page_blocks,
            free: NONE,
            free_count: 0,
            capacity: 0,
        }
    }

    /// Bytes the pages take (what the budget counts).
    fn bytes(&self) -> usize {
        self.capacity * size_of::<Block>() + self.pages.capacity() * size_of::<Box<[Block]>>()
    }

    /// Whether a block can be taken without a new page.
    fn has_free(&self) -> bool {
        self.free != NONE
    }

    /// Blocks holding entries.
    fn in_use(&self) -> usize {
        self.capacity - self.free_count
    }

    fn next_page_blocks(&self) -> usize {
        self.capacity.clamp(FIRST_PAGE_BLOCKS, self.max_page_blocks)
    }

    /// Bytes the next page would add; zero when a block is free.
    fn growth_for_one_block(&self) -> usize {
        if self.has_free() {
            0
        } else {
            self.next_page_blocks() * size_of::<Block>() + size_of::<Box<[Block]>>()
        }
    }

    /// Adds a page and puts its blocks on the free list; false when the shard holds as many
    /// pages as an index can name.
    fn grow(&mut self) -> bool {
        if self.pages.len() >= MAX_PAGES {
            return false;
        }
        let blocks = self.next_page_blocks();
        let mut page = vec![EMPTY_BLOCK; blocks].into_boxed_slice();
        // The page's index fits: it is below MAX_PAGES.
        let base = (self.pages.len() as u32) << OFFSET_BITS;
        for (offset, block) in page.iter_mut().enumerate().rev() {
            block.next = self.free;
            self.free = base | offset as u32;
        }
        self.pages.push(page);
        self.free_count += blocks;
        self.capacity += blocks;
        true
    }

    fn get(&self, index: u32) -> &Block {
        &self.pages[(index >> OFFSET_BITS) as usize][(index as usize) & (MAX_PAGE_BLOCKS - 1)]
    }

    fn get_mut(&mut self, index: u32) -> &mut Block {
        &mut self.pages[(index >> OFFSET_BITS) as usize][(index as usize) & (MAX_PAGE_BLOCKS - 1)]
    }

    /// Takes a free block, unlinked; `None` when none is free.
    fn take(&mut self) -> Option<u32> {
        let index = self.free;
        if index == NONE {
            return None;
        }
        let block = self.get_mut(index);
        let next = block.next;
        block.prev = NONE;
        block.next = NONE;
        self.free = next;
        self.free_count -= 1;
        Some(index)
    }

    /// Puts a block back on the free list.
    fn give_back(&mut self, index: u32) {
        let free = self.free;
        let block = self.get_mut(index);
        block.prev = NONE;
        block.next = free;
        self.free = index;
        self.free_count += 1;
    }

    /// Whether [`Blocks::compact`] would give pages back: at most a quarter of the blocks hold
    /// entries, so each compaction at least halves what is held and its cost (a walk over the
    /// live logs) is paid for by the blocks freed since the last.
    fn worth_compacting(&self) -> bool {
        !self.pages.is_empty() && self.in_use() * 4 <= self.capacity
    }

    /// Moves every block in use into the fewest front pages that hold them all and drops the
    /// pages behind those. `logs` must be every log whose chain is in these blocks.
    fn compact<'a>(&mut self, logs: impl Iterator<Item = &'a mut LogWindow>) {
        let in_use = self.in_use();
        let mut keep = 0;
        let mut kept_capacity = 0;
        while kept_capacity < in_use {
            kept_capacity += self.pages[keep].len();
            keep += 1;
        }
        if keep == self.pages.len() {
            return;
        }
        let kept = |index: u32| ((index >> OFFSET_BITS) as usize) < keep;
        // The free list of the kept pages alone: they have room for every block moved.
        let mut free = NONE;
        let mut free_count = 0;
        let mut cursor = self.free;
        while cursor != NONE {
            let next = self.get(cursor).next;
            if kept(cursor) {
                self.get_mut(cursor).next = free;
                free = cursor;
                free_count += 1;
            }
            cursor = next;
        }
        self.free = free;
        self.free_count = free_count;
        for log in logs {
            let mut cursor = log.head;
            while cursor != NONE {
                let block = *self.get(cursor);
                if kept(cursor) {
                    cursor = block.next;
                    continue;
                }
                let Some(moved) = self.take() else {
                    // Cannot happen: the kept pages have a free block for every block in use
                    // behind them. Should it, keep every page (nothing is lost; the free blocks
                    // behind the kept pages are no longer listed, so they count as used).
                    self.free_count = 0;
                    return;
                };
                *self.get_mut(moved) = block;
                match block.prev {
                    NONE => log.head = moved,
                    prev => self.get_mut(prev).next = moved,
                }
                match block.next {
                    NONE => log.tail = moved,
                    next => self.get_mut(next).prev = moved,
                }
                cursor = block.next;
            }
        }
        self.pages.truncate(keep);
        self.pages.shrink_to_fit();
        self.capacity = kept_capacity;
        self.free_count = self.capacity - in_use;
    }
}

/// A sliding window log: recorded hits (admitted ones, and refused ones under
/// [`window::Counting::All`]) oldest first, with their running sum. Its entries are a chain of
/// blocks in its shard's [`Blocks`]; every method takes that store.
#[derive(Debug, Clone, Copy)]
struct LogWindow {
    /// The sum of the entries' costs.
    used: u128,
    /// The block with the oldest entry, [`NONE`] when the log is empty.
    head: u32,
    /// The block with the newest entry.
    tail: u32,
    /// Where the oldest entry sits in `head`.
    start: u8,
    /// One past the newest entry in `tail`.
    end: u8,
}

/// A place in a log: a block and an entry in it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Place {
    block: u32,
    slot: usize,
}

impl LogWindow {
    /// An empty log.
    fn new() -> LogWindow {
        LogWindow {
            used: 0,
            head: NONE,
            tail: NONE,
            start: 0,
            end: 0,
        }
    }

    fn is_empty(&self) -> bool {
        self.head == NONE
    }

    /// Whether one more entry needs a block of its own.
    fn needs_block(&self) -> bool {
        self.head == NONE || usize::from(self.end) == BLOCK_ENTRIES
    }

    fn first(&self) -> Option<Place> {
        (self.head != NONE).then_some(Place {
            block: self.head,
            slot: usize::from(self.start),
        })
    }

    fn last(&self) -> Option<Place> {
        (self.head != NONE).then_some(Place {
            block: self.tail,
            slot: usize::from(self.end) - 1,
        })
    }

    fn after(&self, blocks: &Blocks, place: Place) -> Option<Place> {
        if place.block == self.tail {
            return (place.slot + 1 < usize::from(self.end)).then_some(Place {
                block: place.block,
                slot: place.slot + 1,
            });
        }
        if place.slot + 1 < BLOCK_ENTRIES {
            return Some(Place {
                block: place.block,
                slot: place.slot + 1,
            });
        }
        Some(Place {
            block: blocks.get(place.block).next,
            slot: 0,
        })
    }

    fn before(&self, blocks: &Blocks, place: Place) -> Option<Place> {
        let first = if place.block == self.head {
            usize::from(self.start)
        } else {
            0
        };
        if place.slot > first {
            return Some(Place {
                block: place.block,
                slot: place.slot - 1,
            });
        }
        if place.block == self.head {
            return None;
        }
        Some(Place {
            block: blocks.get(place.block).prev,
            slot: BLOCK_ENTRIES - 1,
        })
    }

    fn entry(blocks: &Blocks, place: Place) -> &LogEntry {
        &blocks.get(place.block).entries[place.slot]
    }

    fn entry_mut(blocks: &mut Blocks, place: Place) -> &mut LogEntry {
        &mut blocks.get_mut(place.block).entries[place.slot]
    }

    /// The newest entry.
    fn newest<'a>(&self, blocks: &'a Blocks) -> Option<&'a LogEntry> {
        self.last().map(|place| Self::entry(blocks, place))
    }

    /// The entries, oldest first.
    fn iter<'a>(&'a self, blocks: &'a Blocks) -> impl Iterator<Item = &'a LogEntry> {
        std::iter::successors(self.first(), |&place| self.after(blocks, place))
            .map(|place| Self::entry(blocks, place))
    }

    /// Appends an entry as the newest; false when that needs a block and none is free (see
    /// [`LogWindow::needs_block`] and [`Blocks::grow`]).
    fn push(&mut self, blocks: &mut Blocks, entry: LogEntry) -> bool {
        if self.needs_block() {
            let Some(fresh) = blocks.take() else {
                return false;
            };
            blocks.get_mut(fresh).entries[0] = entry;
            if self.head == NONE {
                self.head = fresh;
                self.start = 0;
            } else {
                blocks.get_mut(self.tail).next = fresh;
                blocks.get_mut(fresh).prev = self.tail;
            }
            self.tail = fresh;
            self.end = 1;
        } else {
            blocks.get_mut(self.tail).entries[usize::from(self.end)] = entry;
            self.end += 1;
        }
        self.used = self.used.saturating_add(u128::from(entry.cost));
        true
    }

    /// Removes the oldest entry, leaving `used` as it is.
    fn unlink_oldest(&mut self, blocks: &mut Blocks) -> Option<LogEntry> {
        let place = self.first()?;
        let entry = *Self::entry(blocks, place);
        self.start += 1;
        if self.head == self.tail {
            if self.start == self.end {
                self.clear(blocks);
            }
        } else if usize::from(self.start) == BLOCK_ENTRIES {
            let old = self.head;
            self.head = blocks.get(old).next;
            blocks.get_mut(self.head).prev = NONE;
            blocks.give_back(old);
            self.start = 0;
        }
        Some(entry)
    }

    /// Removes the newest entry, leaving `used` as it is.
    fn unlink_newest(&mut self, blocks: &mut Blocks) {
        if self.head == NONE {
            return;
        }
        self.end -= 1;
        if self.head == self.tail {
            if self.start == self.end {
                self.clear(blocks);
            }
        } else if self.end == 0 {
            let old = self.tail;
            self.tail = blocks.get(old).prev;
            blocks.get_mut(self.tail).next = NONE;
            blocks.give_back(old);
            self.end = BLOCK_ENTRIES as u8;
        }
    }

    /// Gives every block back; the log is empty after.
    fn clear(&mut self, blocks: &mut Blocks) {
        let mut cursor = self.head;
        while cursor != NONE {
            let next = blocks.get(cursor).next;
            blocks.give_back(cursor);
            cursor = next;
        }
        *self = LogWindow::new();
    }

    /// Drops the entries that have left the window.
    fn prune(&mut self, blocks: &mut Blocks, window_ms: u64, now_ms: u64) {
        while let Some(oldest) = self.first().map(|place| *Self::entry(blocks, place)) {
            if window::log_entry_live(oldest.time_ms, window_ms, now_ms) {
                break;
            }
            self.unlink_oldest(blocks);
            self.used = self.used.saturating_sub(u128::from(oldest.cost));
        }
    }

    /// When the log holds nothing any more: a window after its newest entry.
    fn expiry(&self, blocks: &Blocks, window_ms: u64) -> u64 {
        self.newest(blocks)
            .map_or(0, |newest| newest.time_ms.saturating_add(window_ms))
    }

    /// Merges the two oldest entries into one with the newer time and id and the summed cost.
    /// The older hit then leaves the window later than it would have: the log counts more, never
    /// less, so this can only refuse what an exact log would have admitted.
    fn merge_oldest(&mut self, blocks: &mut Blocks) -> bool {
        let Some(first) = self.first() else {
            return false;
        };
        if self.after(blocks, first).is_none() {
            return false;
        }
        let Some(older) = self.unlink_oldest(blocks) else {
            return false;
        };
        if let Some(place) = self.first() {
            let newer = Self::entry_mut(blocks, place);
            newer.cost = newer.cost.saturating_add(older.cost);
        }
        true
    }

    /// Merges the oldest entries (see [`LogWindow::merge_oldest`]) until one more entry needs no
    /// new block: for a log that may not grow. False if the log is too short to merge.
    fn merge_to_fit(&mut self, blocks: &mut Blocks) -> bool {
        if !self.needs_block() {
            return true;
        }
        if self.head != self.tail {
            // Fold the oldest block into the next: it goes back to the free list.
            let head = self.head;
            while self.head == head {
                if !self.merge_oldest(blocks) {
                    return false;
                }
            }
            return true;
        }
        // One full block: merge once if nothing before its first entry is free, then move what
        // is left to the block's front.
        if self.start == 0 && !self.merge_oldest(blocks) {
            return false;
        }
        let (start, end) = (usize::from(self.start), usize::from(self.end));
        blocks.get_mut(self.head).entries.copy_within(start..end, 0);
        self.end -= self.start;
        self.start = 0;
        true
    }

    /// Gives back up to `units` of the entry with id `id`: it shrinks by that much and goes only
    /// when nothing is left. Answers the units given back (zero when no entry has that id).
    fn release(&mut self, blocks: &mut Blocks, id: u64, units: u64) -> u64 {
        // Receipts are mostly of recent hits: search from the newest.
        let mut cursor = self.last();
        let place = loop {
            let Some(place) = cursor else {
                return 0;
            };
            let entry = Self::entry(blocks, place);
            if entry.id == id {
                break place;
            }
            if entry.id < id {
                return 0;
            }
            cursor = self.before(blocks, place);
        };
        let entry = Self::entry_mut(blocks, place);
        if units < entry.cost {
            entry.cost -= units;
            self.used = self.used.saturating_sub(u128::from(units));
            return units;
        }
        let back = entry.cost;
        // Shift the newer entries one place older, then drop the newest place.
        let mut place = place;
        while let Some(next) = self.after(blocks, place) {
            *Self::entry_mut(blocks, place) = *Self::entry(blocks, next);
            place = next;
        }
        self.unlink_newest(blocks);
        self.used = self.used.saturating_sub(u128::from(back));
        back
    }
}

/// A log's place in its shard's [`Logs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogId(u32);

/// Marks a header on the free list (in `start`, which is below [`BLOCK_ENTRIES`] in a log).
const FREE_HEADER: u8 = u8::MAX;

/// The logs of one shard: their headers side by side in one table (a log is no allocation of
/// its own), and the blocks of their entries.
pub(super) struct Logs {
    headers: Vec<LogWindow>,
    /// The first free header, linked through `head`.
    free_header: u32,
    live: usize,
    blocks: Blocks,
}

impl Logs {
    /// The logs of a shard allowed `share` bytes.
    pub(super) fn new(share: usize) -> Logs {
        Logs {
            headers: Vec::new(),
            free_header: NONE,
            live: 0,
            blocks: Blocks::new(share),
        }
    }

    /// Bytes held: the headers' table and the blocks' pages (what the budget counts).
    pub(super) fn bytes(&self) -> usize {
        self.headers.capacity() * size_of::<LogWindow>() + self.blocks.bytes()
    }

    /// Bytes a new log needs: nothing while a header is free, else the headers' table grown
    /// (counted as the old and the new table both, as they are while it moves).
    pub(super) fn growth_for_new_log(&self) -> usize {
        if self.free_header != NONE || self.headers.len() < self.headers.capacity() {
            0
        } else {
            (self.headers.capacity() * 2).max(4) * size_of::<LogWindow>()
        }
    }

    /// Bytes one more block needs: nothing while one is free, else the next page.
    pub(super) fn growth_for_one_block(&self) -> usize {
        self.blocks.growth_for_one_block()
    }

    /// Whether a block can be taken without a new page.
    pub(super) fn has_free_block(&self) -> bool {
        self.blocks.has_free()
    }

    /// Adds a page of blocks; false when the shard may not hold more pages.
    pub(super) fn grow_blocks(&mut self) -> bool {
        self.blocks.grow()
    }

    /// A new, empty log.
    pub(super) fn create(&mut self) -> LogId {
        self.live += 1;
        let free = self.free_header;
        if free != NONE {
            let header = &mut self.headers[free as usize];
            self.free_header = header.head;
            *header = LogWindow::new();
            return LogId(free);
        }
        // A shard's share of any budget holds far fewer than `u32::MAX` headers.
        let index = self.headers.len() as u32;
        self.headers.push(LogWindow::new());
        LogId(index)
    }

    /// Drops a log and gives its blocks back.
    pub(super) fn remove(&mut self, id: LogId) {
        let Some(header) = self.headers.get_mut(id.0 as usize) else {
            return;
        };
        if header.start == FREE_HEADER {
            return;
        }
        header.clear(&mut self.blocks);
        header.start = FREE_HEADER;
        header.head = self.free_header;
        self.free_header = id.0;
        self.live -= 1;
    }

    fn header(&self, id: LogId) -> &LogWindow {
        &self.headers[id.0 as usize]
    }

    /// A log's header and the blocks, to change both.
    fn parts(&mut self, id: LogId) -> (&mut LogWindow, &mut Blocks) {
        (&mut self.headers[id.0 as usize], &mut self.blocks)
    }

    /// The sum of a log's entries' costs.
    pub(super) fn used(&self, id: LogId) -> u128 {
        self.header(id).used
    }

    pub(super) fn is_empty(&self, id: LogId) -> bool {
        self.header(id).is_empty()
    }

    /// Whether one more entry needs a block of its own.
    pub(super) fn needs_block(&self, id: LogId) -> bool {
        self.header(id).needs_block()
    }

    /// The time of a log's newest entry.
    pub(super) fn newest_ms(&self, id: LogId) -> Option<u64> {
        self.header(id)
            .newest(&self.blocks)
            .map(|newest| newest.time_ms)
    }

    /// A log's entries as `(time, cost)`, oldest first.
    pub(super) fn entries(&self, id: LogId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.header(id)
            .iter(&self.blocks)
            .map(|entry| (entry.time_ms, entry.cost))
    }

    /// When a log holds nothing any more: a window after its newest entry.
    pub(super) fn expiry(&self, id: LogId, window_ms: u64) -> u64 {
        self.header(id).expiry(&self.blocks, window_ms)
    }

    /// Appends an entry; false when it needs a block and none is free.
    pub(super) fn push(&mut self, id: LogId, entry: LogEntry) -> bool {
        let (header, blocks) = self.parts(id);
        header.push(blocks, entry)
    }

    /// Drops the entries that have left the window.
    pub(super) fn prune(&mut self, id: LogId, window_ms: u64, now_ms: u64) {
        let (header, blocks) = self.parts(id);
        header.prune(blocks, window_ms, now_ms);
    }

    /// Merges a log's oldest entries until one more needs no new block (for a log that may not
    /// grow); false if it is too short to merge.
    pub(super) fn merge_to_fit(&mut self, id: LogId) -> bool {
        let (header, blocks) = self.parts(id);
        header.merge_to_fit(blocks)
    }

    /// Gives back up to `units` of entry `entry`; answers the units given back.
    pub(super) fn release(&mut self, id: LogId, entry: u64, units: u64) -> u64 {
        let (header, blocks) = self.parts(id);
        header.release(blocks, entry, units)
    }

    /// After a sweep: gives back the pages and the part of the headers' table that stand mostly
    /// free, moving what lives in them to the front. `handles` must be every live log's id; they
    /// are updated where a header moves.
    pub(super) fn compact<'a>(&mut self, handles: impl Iterator<Item = &'a mut LogId>) {
        if self.live * 4 <= self.headers.len() {
            self.compact_headers(handles);
        }
        if self.blocks.worth_compacting() {
            self.blocks.compact(
                self.headers
                    .iter_mut()
                    .filter(|header| header.start != FREE_HEADER),
            );
        }
    }

    fn compact_headers<'a>(&mut self, handles: impl Iterator<Item = &'a mut LogId>) {
        let keep = self.live;
        // The free headers in front of `keep`: exactly as many as live ones behind it.
        let mut free = NONE;
        let mut cursor = self.free_header;
        while cursor != NONE {
            let next = self.headers[cursor as usize].head;
            if (cursor as usize) < keep {
                self.headers[cursor as usize].head = free;
                free = cursor;
            }
            cursor = next;
        }
        for handle in handles {
            if (handle.0 as usize) < keep {
                continue;
            }
            if free == NONE {
                // Cannot happen while `handles` are the live logs; keep every header rather
                // than drop a live one.
                self.free_header = NONE;
                return;
            }
            let moved = free;
            free = self.headers[moved as usize].head;
            self.headers[moved as usize] = self.headers[handle.0 as usize];
            handle.0 = moved;
        }
        self.free_header = free;
        self.headers.truncate(keep);
        self.headers.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    fn entry(id: u64, cost: u64) -> LogEntry {
        LogEntry {
            time_ms: id,
            cost,
            id,
        }
    }

    fn ids(log: &LogWindow, blocks: &Blocks) -> Vec<(u64, u64)> {
        log.iter(blocks).map(|e| (e.id, e.cost)).collect()
    }

    fn push(log: &mut LogWindow, blocks: &mut Blocks, entry: LogEntry) {
        if log.needs_block() && !blocks.has_free() {
            assert!(blocks.grow());
        }
        assert!(log.push(blocks, entry));
    }

    /// Every operation on many logs sharing one store matches the same operations on plain
    /// queues, and the store's free count always matches the blocks the logs hold.
    #[test]
    fn logs_in_shared_blocks_behave_as_queues() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut blocks = Blocks::new(1 << 20);
        let mut logs: Vec<LogWindow> = (0..8).map(|_| LogWindow::new()).collect();
        let mut models: Vec<VecDeque<(u64, u64)>> = vec![VecDeque::new(); 8];
        let mut next_id = 0;
        for step in 0..50_000 {
            let n = rng.usize(..logs.len());
            let (log, model) = (&mut logs[n], &mut models[n]);
            match rng.u8(..10) {
                0..=4 => {
                    let cost = rng.u64(1..5);
                    push(log, &mut blocks, entry(next_id, cost));
                    model.push_back((next_id, cost));
                    next_id += 1;
                }
                5 | 6 => {
                    let pruned = rng.usize(..4).min(model.len());
                    let cut = model.get(pruned).map_or(next_id, |&(id, _)| id);
                    log.prune(&mut blocks, 1, cut);
                    model.drain(..pruned);
                }
                7 => {
                    if let Some(&(id, cost)) = model.get(rng.usize(..model.len().max(1))) {
                        let units = rng.u64(1..=cost + 1);
                        assert_eq!(log.release(&mut blocks, id, units), units.min(cost));
                        let position = model.iter().position(|&(i, _)| i == id).unwrap();
                        if units < cost {
                            model[position].1 -= units;
                        } else {
                            model.remove(position);
                        }
                    }
                }
                8 => {
                    if log.merge_to_fit(&mut blocks) {
                        let before = model.len();
                        let kept = ids(log, &blocks).len();
                        let folded: u64 = model.drain(..before - kept).map(|(_, c)| c).sum();
                        if let Some(front) = model.front_mut() {
                            front.1 += folded;
                        }
                        assert!(!log.needs_block() || blocks.has_free());
                    }
                }
                _ => {
                    if blocks.worth_compacting() {
                        blocks.compact(logs.iter_mut());
                    }
                }
            }
            for (log, model) in logs.iter().zip(&models) {
                let model: Vec<_> = model.iter().copied().collect();
                assert_eq!(ids(log, &blocks), model, "step {step}");
                assert_eq!(log.used, model.iter().map(|&(_, c)| u128::from(c)).sum());
                assert_eq!(log.newest(&blocks).map(|e| e.id), model.last().map(|e| e.0));
            }
            let held: usize = models.iter().map(|m| m.len().div_ceil(BLOCK_ENTRIES)).sum();
            assert!(blocks.in_use() >= held, "step {step}");
            assert!(blocks.in_use() <= held + 2 * logs.len(), "step {step}");
        }
    }

    #[test]
    fn compaction_gives_pages_back_and_keeps_every_entry() {
        let mut blocks = Blocks::new(1 << 20);
        let mut logs: Vec<LogWindow> = (0..4).map(|_| LogWindow::new()).collect();
        for id in 0..4_000 {
            push(&mut logs[(id % 4) as usize], &mut blocks, entry(id, 1));
        }
        let full = blocks.bytes();
        // Keep only the newest forty entries, ten a log.
        for log in &mut logs {
            log.prune(&mut blocks, 1, 3_960);
        }
        assert!(blocks.worth_compacting());
        blocks.compact(logs.iter_mut());
        assert!(blocks.bytes() * 8 < full, "{} of {full}", blocks.bytes());
        for (n, log) in logs.iter().enumerate() {
            let expected: Vec<_> = (3_960..4_000)
                .filter(|id| id % 4 == n as u64)
                .map(|id| (id, 1))
                .collect();
            assert_eq!(ids(log, &blocks), expected);
        }
        for log in &mut logs {
            log.clear(&mut blocks);
        }
        blocks.compact(std::iter::empty());
        assert_eq!(blocks.capacity, 0);
    }

    #[test]
    fn pages_are_sized_to_the_share() {
        assert_eq!(Blocks::new(16 << 10).max_page_blocks, FIRST_PAGE_BLOCKS);
        assert_eq!(Blocks::new(4 << 20).max_page_blocks, MAX_PAGE_BLOCKS);
        assert!(Blocks::new(1 << 20).max_page_blocks * size_of::<Block>() <= (1 << 20) / 16);
        assert_eq!(size_of::<Block>(), 104);
        assert_eq!(size_of::<LogWindow>(), 32);
    }

    #[test]
    fn a_full_single_block_merges_to_make_room() {
        let mut blocks = Blocks::new(16 << 10);
        let mut log = LogWindow::new();
        for id in 0..4 {
            push(&mut log, &mut blocks, entry(id, 1));
        }
        assert!(log.needs_block());
        assert!(log.merge_to_fit(&mut blocks));
        assert_eq!(ids(&log, &blocks), [(1, 2), (2, 1), (3, 1)]);
        assert!(!log.needs_block());
        assert!(log.push(&mut blocks, entry(4, 1)));
        assert_eq!(log.used, 5);
    }

    /// Headers of dropped logs are reused, and a sweep's compaction moves the live ones to the
    /// front, updating their handles, and gives back what stood free.
    #[test]
    fn log_headers_are_reused_and_compacted() {
        let mut logs = Logs::new(1 << 20);
        let mut ids: Vec<LogId> = (0..1_000).map(|_| logs.create()).collect();
        for (n, &log) in ids.iter().enumerate() {
            for k in 0..3 {
                let entry = entry(n as u64 * 10 + k, 1);
                if logs.needs_block(log) && !logs.has_free_block() {
                    assert!(logs.grow_blocks());
                }
                assert!(logs.push(log, entry));
            }
        }
        let full = logs.bytes();
        // A dropped log's header is the next one handed out.
        logs.remove(ids[5]);
        ids[5] = logs.create();
        assert_eq!(ids[5], LogId(5));
        assert!(logs.is_empty(ids[5]));
        logs.remove(ids[5]);
        // Keep every tenth log, the ones at the back of the table among them.
        let mut kept: Vec<(usize, LogId)> = Vec::new();
        for (n, &log) in ids.iter().enumerate() {
            if n % 10 == 9 {
                kept.push((n, log));
            } else if n != 5 {
                logs.remove(log);
            }
        }
        logs.compact(kept.iter_mut().map(|(_, log)| log));
        assert!(logs.bytes() * 4 < full, "{} of {full}", logs.bytes());
        for &(n, log) in &kept {
            assert!((log.0 as usize) < kept.len(), "moved to the front");
            let expected: Vec<_> = (0..3).map(|k| (n as u64 * 10 + k, 1)).collect();
            assert_eq!(logs.entries(log).collect::<Vec<_>>(), expected);
            assert_eq!(logs.used(log), 3);
        }
        // Removing a log twice, or one already dropped, changes nothing.
        logs.remove(kept[0].1);
        logs.remove(kept[0].1);
        assert_eq!(logs.live, kept.len() - 1);
    }
}
