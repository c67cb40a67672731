//! The memory backend's sliding-window logs, kept in pages of their shard's own.
//!
//! A log's entries live as long as its window (a minute, an hour) while every request allocates
//! and frees small blocks by the thousand. Kept in a growable buffer per log on the allocator's
//! heap, large logs cut that heap up between long-lived buffers until the requests' own
//! allocations slowed down: with 80,000 logs filled for 30 s behind it, a counter's load cost
//! tollgate 18.5 µs of CPU a decision instead of 10.5. So a shard keeps its logs apart from that
//! heap: their headers side by side in one table ([`Logs`]), and each log a doubly linked list of
//! entries whose nodes come from pages the shard allocates a few at a time (each half as large as
//! all before it together, up to [`MAX_PAGE_NODES`] nodes) and reuses itself. The heap sees a
//! few large allocations per shard instead of two per log; the same load then cost 11.1 µs.
//!
//! The budget counts the pages and the headers' table, not what is in use; a sweep that leaves
//! three quarters of either free moves what lives there to the front and gives the rest back
//! ([`Logs::compact`]).

use std::mem::size_of;

use crate::window;

/// No node: the end of a list, or of the free list.
const NONE: u32 = u32::MAX;

/// A node's index holds its page in the high bits and its place in the page in these low ones.
const OFFSET_BITS: u32 = 11;

/// The most nodes a page holds (64 KiB).
const MAX_PAGE_NODES: usize = 1 << OFFSET_BITS;

/// The nodes of a shard's first page.
const FIRST_PAGE_NODES: usize = 16;

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

/// An entry and the links to the entries before and after it in its log (for a free node,
/// `next` links the free list): 32 bytes.
#[derive(Debug, Clone, Copy)]
struct Node {
    entry: LogEntry,
    prev: u32,
    next: u32,
}

const EMPTY_NODE: Node = Node {
    entry: LogEntry {
        time_ms: 0,
        cost: 0,
        id: 0,
    },
    prev: NONE,
    next: NONE,
};

/// The pages of one shard's log nodes, and the list of its free nodes.
struct Nodes {
    pages: Vec<Box<[Node]>>,
    /// The largest page this shard allocates: small shares of a small budget get small pages.
    max_page_nodes: usize,
    /// The first free node, linked through `next`.
    free: u32,
    free_count: usize,
    /// Nodes in all pages.
    capacity: usize,
}

impl Nodes {
    /// The node store of a shard allowed `share` bytes: a page takes at most a sixteenth of
    /// that, or [`FIRST_PAGE_NODES`] nodes.
    fn new(share: usize) -> Nodes {
        let fit = (share / 16 / size_of::<Node>()).max(FIRST_PAGE_NODES);
        Nodes {
            pages: Vec::new(),
            max_page_nodes: fit.min(MAX_PAGE_NODES),
            free: NONE,
            free_count: 0,
            capacity: 0,
        }
    }

    /// Bytes the pages take.
    fn bytes(&self) -> usize {
        self.capacity * size_of::<Node>() + self.pages.capacity() * size_of::<Box<[Node]>>()
    }

    fn has_free(&self) -> bool {
        self.free != NONE
    }

    /// Nodes holding entries.
    fn in_use(&self) -> usize {
        self.capacity - self.free_count
    }

    /// Half of what the pages hold so far: a page added is at most a third of what is held
    /// after it, which bounds the nodes a shard holds but does not use.
    fn next_page_nodes(&self) -> usize {
        (self.capacity / 2).clamp(FIRST_PAGE_NODES, self.max_page_nodes)
    }

    /// Bytes the next page would add; zero while a node is free.
    fn growth_for_one(&self) -> usize {
        if self.has_free() {
            0
        } else {
            self.next_page_nodes() * size_of::<Node>() + size_of::<Box<[Node]>>()
        }
    }

    /// Adds a page and puts its nodes on the free list; false when the shard holds as many
    /// pages as an index can name.
    fn grow(&mut self) -> bool {
        if self.pages.len() >= MAX_PAGES {
            return false;
        }
        let count = self.next_page_nodes();
        let mut page = vec![EMPTY_NODE; count].into_boxed_slice();
        // The page's number is below MAX_PAGES, so the index fits.
        let base = (self.pages.len() as u32) << OFFSET_BITS;
        for (offset, node) in page.iter_mut().enumerate().rev() {
            node.next = self.free;
            self.free = base | offset as u32;
        }
        self.pages.push(page);
        self.free_count += count;
        self.capacity += count;
        true
    }

    fn get(&self, index: u32) -> &Node {
        &self.pages[(index >> OFFSET_BITS) as usize][(index as usize) & (MAX_PAGE_NODES - 1)]
    }

    fn get_mut(&mut self, index: u32) -> &mut Node {
        &mut self.pages[(index >> OFFSET_BITS) as usize][(index as usize) & (MAX_PAGE_NODES - 1)]
    }

    /// Takes a free node, unlinked; `None` when none is free.
    fn take(&mut self) -> Option<u32> {
        let index = self.free;
        if index == NONE {
            return None;
        }
        let node = self.get_mut(index);
        let next = node.next;
        node.prev = NONE;
        node.next = NONE;
        self.free = next;
        self.free_count -= 1;
        Some(index)
    }

    /// Puts a node back on the free list.
    fn give_back(&mut self, index: u32) {
        let free = self.free;
        let node = self.get_mut(index);
        node.prev = NONE;
        node.next = free;
        self.free = index;
        self.free_count += 1;
    }

    /// Whether [`Nodes::compact`] would give pages back: at most a quarter of the nodes hold
    /// entries, so each compaction at least halves what is held and its cost (a walk over the
    /// live logs) is paid for by the nodes freed since the last.
    fn worth_compacting(&self) -> bool {
        !self.pages.is_empty() && self.in_use() * 4 <= self.capacity
    }

    /// Moves every node in use into the fewest front pages that hold them all and drops the
    /// pages behind those. `logs` must be every log whose list is in these nodes.
    fn compact<'a>(&mut self, logs: impl Iterator<Item = &'a mut LogWindow>) {
        let in_use = self.in_use();
        let mut keep = 0;
        let mut kept_capacity = 0;
        while kept_capacity < in_use && keep < self.pages.len() {
            kept_capacity += self.pages[keep].len();
            keep += 1;
        }
        if keep == self.pages.len() {
            return;
        }
        let kept = |index: u32| ((index >> OFFSET_BITS) as usize) < keep;
        // The free list of the kept pages alone: they have room for every node moved.
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
                let node = *self.get(cursor);
                if !kept(cursor) {
                    let Some(moved) = self.take() else {
                        // Cannot happen: the kept pages have a free node for every node in use
                        // behind them. Should it, keep every page (nothing is lost; the free
                        // nodes behind the kept pages are no longer listed, so count as used).
                        self.free_count = 0;
                        return;
                    };
                    *self.get_mut(moved) = node;
                    match node.prev {
                        NONE => log.head = moved,
                        prev => self.get_mut(prev).next = moved,
                    }
                    match node.next {
                        NONE => log.tail = moved,
                        next => self.get_mut(next).prev = moved,
                    }
                }
                cursor = node.next;
            }
        }
        self.pages.truncate(keep);
        self.pages.shrink_to_fit();
        self.capacity = kept_capacity;
        self.free_count = self.capacity - in_use;
    }
}

/// A sliding window log: recorded hits (admitted ones, and refused ones under
/// [`window::Counting::All`]) oldest first, with their running sum. Its entries are a list of
/// nodes in its shard's [`Nodes`]; every method takes that store.
#[derive(Debug, Clone, Copy)]
struct LogWindow {
    /// The sum of the entries' costs.
    used: u128,
    /// The oldest entry's node, [`NONE`] when the log is empty.
    head: u32,
    /// The newest entry's node.
    tail: u32,
    /// False for a header on the free list of [`Logs`].
    live: bool,
}

impl LogWindow {
    const EMPTY: LogWindow = LogWindow {
        used: 0,
        head: NONE,
        tail: NONE,
        live: true,
    };

    fn is_empty(&self) -> bool {
        self.head == NONE
    }

    /// The entries' nodes, oldest first.
    fn nodes<'a>(&self, nodes: &'a Nodes) -> impl Iterator<Item = u32> + 'a {
        let head = self.head;
        std::iter::successors((head != NONE).then_some(head), move |&index| {
            let next = nodes.get(index).next;
            (next != NONE).then_some(next)
        })
    }

    /// Appends an entry as the newest; false when no node is free (see [`Nodes::grow`]).
    fn push(&mut self, nodes: &mut Nodes, entry: LogEntry) -> bool {
        let Some(fresh) = nodes.take() else {
            return false;
        };
        let node = nodes.get_mut(fresh);
        node.entry = entry;
        node.prev = self.tail;
        match self.tail {
            NONE => self.head = fresh,
            tail => nodes.get_mut(tail).next = fresh,
        }
        self.tail = fresh;
        self.used = self.used.saturating_add(u128::from(entry.cost));
        true
    }

    /// Takes the node `index` out of the list and gives it back, leaving `used` as it is.
    fn unlink(&mut self, nodes: &mut Nodes, index: u32) -> LogEntry {
        let node = *nodes.get(index);
        match node.prev {
            NONE => self.head = node.next,
            prev => nodes.get_mut(prev).next = node.next,
        }
        match node.next {
            NONE => self.tail = node.prev,
            next => nodes.get_mut(next).prev = node.prev,
        }
        nodes.give_back(index);
        node.entry
    }

    /// Gives every node back; the log is empty after.
    fn clear(&mut self, nodes: &mut Nodes) {
        let mut cursor = self.head;
        while cursor != NONE {
            let next = nodes.get(cursor).next;
            nodes.give_back(cursor);
            cursor = next;
        }
        *self = LogWindow::EMPTY;
    }

    /// Drops the entries that have left the window.
    fn prune(&mut self, nodes: &mut Nodes, window_ms: u64, now_ms: u64) {
        while self.head != NONE {
            let oldest = nodes.get(self.head).entry;
            if window::log_entry_live(oldest.time_ms, window_ms, now_ms) {
                break;
            }
            self.unlink(nodes, self.head);
            self.used = self.used.saturating_sub(u128::from(oldest.cost));
        }
    }

    /// Merges the two oldest entries into one with the newer time and id and the summed cost,
    /// freeing a node. The older hit then leaves the window later than it would have: the log
    /// counts more, never less, so this can only refuse what an exact log would have admitted.
    /// False when the log has fewer than two entries.
    fn merge_oldest(&mut self, nodes: &mut Nodes) -> bool {
        if self.head == self.tail {
            return false;
        }
        let older = self.unlink(nodes, self.head);
        let newer = &mut nodes.get_mut(self.head).entry;
        newer.cost = newer.cost.saturating_add(older.cost);
        true
    }

    /// Gives back up to `units` of the entry with id `id`: it shrinks by that much and goes only
    /// when nothing is left. Answers the units given back (zero when no entry has that id).
    fn release(&mut self, nodes: &mut Nodes, id: u64, units: u64) -> u64 {
        // Receipts are mostly of recent hits: search from the newest.
        let mut cursor = self.tail;
        while cursor != NONE {
            let node = *nodes.get(cursor);
            if node.entry.id < id {
                return 0;
            }
            if node.entry.id == id {
                let back = units.min(node.entry.cost);
                if back < node.entry.cost {
                    nodes.get_mut(cursor).entry.cost -= back;
                } else {
                    self.unlink(nodes, cursor);
                }
                self.used = self.used.saturating_sub(u128::from(back));
                return back;
            }
            cursor = node.prev;
        }
        0
    }
}

/// A log's place in its shard's [`Logs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LogId(u32);

/// The logs of one shard: their headers side by side in one table (a log is no allocation of
/// its own), and the nodes of their entries.
pub(super) struct Logs {
    headers: Vec<LogWindow>,
    /// The first free header, linked through `head`.
    free_header: u32,
    live: usize,
    nodes: Nodes,
}

impl Logs {
    /// The logs of a shard allowed `share` bytes.
    pub(super) fn new(share: usize) -> Logs {
        Logs {
            headers: Vec::new(),
            free_header: NONE,
            live: 0,
            nodes: Nodes::new(share),
        }
    }

    /// Bytes held: the headers' table and the nodes' pages (what the budget counts).
    pub(super) fn bytes(&self) -> usize {
        self.headers.capacity() * size_of::<LogWindow>() + self.nodes.bytes()
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

    /// Bytes one more entry needs: nothing while a node is free, else the next page.
    pub(super) fn growth_for_entry(&self) -> usize {
        self.nodes.growth_for_one()
    }

    /// Whether an entry can be added without a new page.
    pub(super) fn has_room_for_entry(&self) -> bool {
        self.nodes.has_free()
    }

    /// Adds a page of nodes; false when the shard may not hold more pages.
    pub(super) fn grow(&mut self) -> bool {
        self.nodes.grow()
    }

    /// A new, empty log.
    pub(super) fn create(&mut self) -> LogId {
        self.live += 1;
        let free = self.free_header;
        if free != NONE {
            let header = &mut self.headers[free as usize];
            self.free_header = header.head;
            *header = LogWindow::EMPTY;
            return LogId(free);
        }
        // A shard's share of any budget holds far fewer than `u32::MAX` headers.
        let index = self.headers.len() as u32;
        self.headers.push(LogWindow::EMPTY);
        LogId(index)
    }

    /// Drops a log and gives its nodes back.
    pub(super) fn remove(&mut self, id: LogId) {
        let Some(header) = self.headers.get_mut(id.0 as usize) else {
            return;
        };
        if !header.live {
            return;
        }
        header.clear(&mut self.nodes);
        header.live = false;
        header.head = self.free_header;
        self.free_header = id.0;
        self.live -= 1;
    }

    fn header(&self, id: LogId) -> &LogWindow {
        &self.headers[id.0 as usize]
    }

    /// A log's header and the nodes, to change both.
    fn parts(&mut self, id: LogId) -> (&mut LogWindow, &mut Nodes) {
        (&mut self.headers[id.0 as usize], &mut self.nodes)
    }

    /// The sum of a log's entries' costs.
    pub(super) fn used(&self, id: LogId) -> u128 {
        self.header(id).used
    }

    pub(super) fn is_empty(&self, id: LogId) -> bool {
        self.header(id).is_empty()
    }

    /// The time of a log's newest entry.
    pub(super) fn newest_ms(&self, id: LogId) -> Option<u64> {
        let tail = self.header(id).tail;
        (tail != NONE).then(|| self.nodes.get(tail).entry.time_ms)
    }

    /// A log's entries as `(time, cost)`, oldest first.
    pub(super) fn entries(&self, id: LogId) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.header(id).nodes(&self.nodes).map(|index| {
            let entry = self.nodes.get(index).entry;
            (entry.time_ms, entry.cost)
        })
    }

    /// When a log holds nothing any more: a window after its newest entry.
    pub(super) fn expiry(&self, id: LogId, window_ms: u64) -> u64 {
        self.newest_ms(id)
            .map_or(0, |newest| newest.saturating_add(window_ms))
    }

    /// Appends an entry; false when no node is free.
    pub(super) fn push(&mut self, id: LogId, entry: LogEntry) -> bool {
        let (header, nodes) = self.parts(id);
        header.push(nodes, entry)
    }

    /// Drops the entries that have left the window.
    pub(super) fn prune(&mut self, id: LogId, window_ms: u64, now_ms: u64) {
        let (header, nodes) = self.parts(id);
        header.prune(nodes, window_ms, now_ms);
    }

    /// Merges a log's two oldest entries, freeing a node (see [`LogWindow::merge_oldest`]), for
    /// a log that may not grow; false if it has fewer than two.
    pub(super) fn merge_oldest(&mut self, id: LogId) -> bool {
        let (header, nodes) = self.parts(id);
        header.merge_oldest(nodes)
    }

    /// Gives back up to `units` of entry `entry`; answers the units given back.
    pub(super) fn release(&mut self, id: LogId, entry: u64, units: u64) -> u64 {
        let (header, nodes) = self.parts(id);
        header.release(nodes, entry, units)
    }

    /// After a sweep: gives back the pages and the part of the headers' table that stand mostly
    /// free, moving what lives in them to the front. `handles` must be every live log's id; they
    /// are updated where a header moves.
    pub(super) fn compact<'a>(&mut self, handles: impl Iterator<Item = &'a mut LogId>) {
        // Only then are the handles walked: a shard of counters alone never walks its table here.
        if !self.headers.is_empty() && self.live * 4 <= self.headers.len() {
            self.compact_headers(handles);
        }
        if self.nodes.worth_compacting() {
            self.nodes
                .compact(self.headers.iter_mut().filter(|header| header.live));
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

    fn push(logs: &mut Logs, log: LogId, entry: LogEntry) {
        if !logs.has_room_for_entry() {
            assert!(logs.grow());
        }
        assert!(logs.push(log, entry));
    }

    fn ids(logs: &Logs, log: LogId) -> Vec<(u64, u64)> {
        logs.entries(log).collect()
    }

    /// Every operation on many logs sharing one store matches the same operations on plain
    /// queues, through compactions, and the store's nodes in use are exactly the entries held.
    #[test]
    fn logs_in_shared_pages_behave_as_queues() {
        let mut rng = fastrand::Rng::with_seed(7);
        let mut logs = Logs::new(1 << 20);
        let mut handles: Vec<LogId> = (0..8).map(|_| logs.create()).collect();
        let mut models: Vec<VecDeque<(u64, u64)>> = vec![VecDeque::new(); 8];
        let mut next_id = 0;
        for step in 0..50_000 {
            let n = rng.usize(..handles.len());
            let (log, model) = (handles[n], &mut models[n]);
            match rng.u8(..10) {
                0..=4 => {
                    let cost = rng.u64(1..5);
                    push(&mut logs, log, entry(next_id, cost));
                    model.push_back((next_id, cost));
                    next_id += 1;
                }
                5 | 6 => {
                    let pruned = rng.usize(..4).min(model.len());
                    let cut = model.get(pruned).map_or(next_id, |&(id, _)| id);
                    logs.prune(log, 1, cut);
                    model.drain(..pruned);
                }
                7 => {
                    if let Some(&(id, cost)) = model.get(rng.usize(..model.len().max(1))) {
                        let units = rng.u64(1..=cost + 1);
                        assert_eq!(logs.release(log, id, units), units.min(cost));
                        let position = model.iter().position(|&(i, _)| i == id).unwrap();
                        if units < cost {
                            model[position].1 -= units;
                        } else {
                            model.remove(position);
                        }
                    }
                }
                8 => {
                    if logs.merge_oldest(log) {
                        let (_, older) = model.pop_front().unwrap();
                        model.front_mut().unwrap().1 += older;
                    } else {
                        assert!(model.len() < 2);
                    }
                }
                _ => logs.compact(handles.iter_mut()),
            }
            for (&log, model) in handles.iter().zip(&models) {
                let model: Vec<_> = model.iter().copied().collect();
                assert_eq!(ids(&logs, log), model, "step {step}");
                assert_eq!(
                    logs.used(log),
                    model.iter().map(|&(_, c)| u128::from(c)).sum()
                );
                assert_eq!(logs.newest_ms(log), model.last().map(|e| e.0));
            }
            let held: usize = models.iter().map(VecDeque::len).sum();
            assert_eq!(logs.nodes.in_use(), held, "step {step}");
        }
    }

    #[test]
    fn compaction_gives_pages_back_and_keeps_every_entry() {
        let mut logs = Logs::new(1 << 20);
        let mut handles: Vec<LogId> = (0..4).map(|_| logs.create()).collect();
        for id in 0..4_000 {
            push(&mut logs, handles[(id % 4) as usize], entry(id, 1));
        }
        let full = logs.nodes.bytes();
        // Keep only the newest forty entries, ten a log.
        for &log in &handles {
            logs.prune(log, 1, 3_960);
        }
        logs.compact(handles.iter_mut());
        assert!(
            logs.nodes.bytes() * 8 < full,
            "{} of {full}",
            logs.nodes.bytes()
        );
        for (n, &log) in handles.iter().enumerate() {
            let expected: Vec<_> = (3_960..4_000)
                .filter(|id| id % 4 == n as u64)
                .map(|id| (id, 1))
                .collect();
            assert_eq!(ids(&logs, log), expected);
        }
        for &log in &handles {
            logs.remove(log);
        }
        logs.compact(std::iter::empty());
        assert_eq!(logs.bytes(), 0, "nothing held once every log is gone");
    }

    #[test]
    fn pages_are_sized_to_the_share() {
        assert_eq!(size_of::<Node>(), 32);
        assert_eq!(size_of::<LogWindow>(), 32);
        for share in [16 << 10, 64 << 10, 1 << 20] {
            let nodes = Nodes::new(share);
            assert!(
                nodes.max_page_nodes * size_of::<Node>() <= share / 16,
                "{share}"
            );
        }
        assert_eq!(Nodes::new(64 << 20).max_page_nodes, MAX_PAGE_NODES);
    }

    /// Headers of dropped logs are reused, and a sweep's compaction moves the live ones to the
    /// front, updating their handles, and gives back what stood free.
    #[test]
    fn log_headers_are_reused_and_compacted() {
        let mut logs = Logs::new(1 << 20);
        let mut handles: Vec<LogId> = (0..1_000).map(|_| logs.create()).collect();
        for (n, &log) in handles.iter().enumerate() {
            for k in 0..3 {
                push(&mut logs, log, entry(n as u64 * 10 + k, 1));
            }
        }
        let full = logs.bytes();
        // A dropped log's header is the next one handed out.
        logs.remove(handles[5]);
        handles[5] = logs.create();
        assert_eq!(handles[5], LogId(5));
        assert!(logs.is_empty(handles[5]));
        logs.remove(handles[5]);
        // Keep every tenth log, the ones at the back of the table among them.
        let mut kept: Vec<(usize, LogId)> = Vec::new();
        for (n, &log) in handles.iter().enumerate() {
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
            assert_eq!(ids(&logs, log), expected);
            assert_eq!(logs.used(log), 3);
        }
        // Removing a log twice changes nothing.
        logs.remove(kept[0].1);
        logs.remove(kept[0].1);
        assert_eq!(logs.live, kept.len() - 1);
    }
}
