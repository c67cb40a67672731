//! One domain's descriptor tree and the per-request lookup, [`Domain::resolve`].
//!
//! Each level maps a key to the nodes declared with that key, so a lookup never builds a
//! `key_value` string: exact values are a hash lookup, wildcard values are tried in config order,
//! and the key-only node is the fallback.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use smallvec::SmallVec;

use super::{Limit, LookupMap, Matched, MetaValue};
use crate::counter_key;
use crate::descriptor::Entry;

/// One domain's descriptor tree and limits, as the rules built it.
#[derive(Debug)]
pub struct Domain {
    name: String,
    /// The escaped name that starts every counter identity of the domain.
    key_part: Box<str>,
    file: PathBuf,
    tree: Level,
    /// This domain's limits (each of a `rate_limits` list too), sorted by `series_key`, then
    /// window.
    limits: Vec<Arc<Limit>>,
    /// Each descriptor key's rank in [`Domain::order_entries`]: the shallowest level that
    /// declares it, then the first declaration's place in reading order.
    key_ranks: LookupMap<String, (usize, usize)>,
    /// How many key declarations were read into `key_ranks`.
    keys_read: usize,
}

impl Domain {
    /// A domain called `name`, declared in `file` (for sources without files, what names the
    /// policy), with its tree and its limits in any order.
    /// `keys` are its descriptor keys with their levels, in reading order.
    pub(super) fn new(
        name: String,
        file: PathBuf,
        tree: Level,
        mut limits: Vec<Arc<Limit>>,
        keys: &[(usize, String)],
    ) -> Self {
        limits.sort_by(Limit::listing_order);
        let mut domain = Domain {
            key_part: counter_key::domain_part(&name),
            name,
            file,
            tree,
            limits,
            key_ranks: LookupMap::default(),
            keys_read: 0,
        };
        domain.rank_keys(keys);
        domain
    }

    /// Ranks `keys` (levels and keys in reading order) after the keys already ranked.
    fn rank_keys(&mut self, keys: &[(usize, String)]) {
        for (depth, key) in keys {
            let rank = (*depth, self.keys_read);
            self.keys_read += 1;
            self.key_ranks
                .entry(key.clone())
                .and_modify(|ranked| *ranked = (*ranked).min(rank))
                .or_insert(rank);
        }
    }

    /// Puts the entries of an RLQS bucket id (a map, without order) in the order this domain's
    /// tree nests their keys: the first path of the tree, keys tried in reading order, that
    /// holds every key; when none does, by the shallowest level that declares each key, ties
    /// in reading order, and keys the tree never declares last, by name (such a descriptor
    /// matches no limit).
    pub fn order_entries(&self, entries: &mut [Entry]) {
        self.sort_by_rank(entries);
        let keys: Vec<&str> = entries.iter().map(|e| e.key.as_str()).collect();
        let mut path = Vec::with_capacity(keys.len());
        let mut budget = PATH_SEARCH_BUDGET;
        if nest(&self.tree, &keys, &mut path, &mut budget) {
            let order: Vec<usize> = path;
            let sorted: Vec<Entry> = order
                .iter()
                .filter_map(|&i| entries.get(i).cloned())
                .collect();
            if sorted.len() == entries.len() {
                entries.clone_from_slice(&sorted);
            }
        }
    }

    fn sort_by_rank(&self, entries: &mut [Entry]) {
        entries.sort_by(|a, b| {
            let rank = |entry: &Entry| self.key_ranks.get(entry.key.as_str()).copied();
            match (rank(a), rank(b)) {
                (Some(x), Some(y)) => x.cmp(&y),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (None, None) => a.key.as_str().cmp(b.key.as_str()),
            }
        });
    }

    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file that declares the domain (with merged domains, the first one read).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Adds the top-level descriptors of another policy declaring this domain (`tree`) and their
    /// limits, after what is there: wildcards of both are tried in the order they were read.
    /// The rules have checked that no top-level descriptor is declared twice.
    pub(super) fn merge(&mut self, tree: Level, limits: Vec<Arc<Limit>>, keys: &[(usize, String)]) {
        self.rank_keys(keys);
        for (key, nodes) in tree {
            match self.tree.get_mut(&key) {
                Some(ours) => ours.append(nodes),
                None => {
                    self.tree.insert(key, nodes);
                }
            }
        }
        self.limits.extend(limits);
        self.limits.sort_by(Limit::listing_order);
    }

    /// This domain's limits (each of a `rate_limits` list too), sorted by `series_key`, then
    /// window.
    pub fn limits(&self) -> &[Arc<Limit>] {
        &self.limits
    }

    /// The limits that apply to a request descriptor (the node's `rate_limit`, or every entry of
    /// its `rate_limits`), as envoyproxy/ratelimit decides which node applies: per level an
    /// exact `key`/`value` node wins over a wildcard value (first in config order), which wins
    /// over a key-only node; the descriptor must end exactly at a node that has a limit; there
    /// is no backtracking. `None` when nothing matches or the node is an allow-list entry (no
    /// limit).
    pub fn resolve<'a>(&'a self, entries: &[Entry]) -> Option<Matched<'a>> {
        let mut level = &self.tree;
        let last = entries.len().checked_sub(1)?;
        // Inline: a wildcard match would otherwise allocate both lists on every request.
        let mut shared = SmallVec::new();
        // How each level matched, kept only for the levels that change the metric key: empty
        // for the common exact and key-only paths without `value_to_metric`.
        let mut marks: SmallVec<[(usize, Mark<'a>); 4]> = SmallVec::new();
        // Levels matched by a key-only node, as bits (the limiter allows 32 entries; deeper
        // levels could only be wrong in a metric key, never in a decision).
        let mut key_only = 0u64;
        // Each level's piece of the counter identity, and whether the request's value follows.
        let mut key_parts: SmallVec<[(&'a str, bool); 4]> = SmallVec::new();
        for (index, entry) in entries.iter().enumerate() {
            let candidates = level.get(entry.key.as_str())?;
            let (node, wildcard) = if let Some(&node) = candidates.exact.get(entry.value.as_str()) {
                (node, None)
            } else if let Some((pattern, node)) = candidates
                .wildcards
                .iter()
                .find(|(pattern, _)| pattern.matches(&entry.value))
            {
                (*node, Some(pattern))
            } else {
                if let Some(bit) = 1u64.checked_shl(index as u32) {
                    key_only |= bit;
                }
                (candidates.key_only?, None)
            };
            let node = candidates.nodes.get(node)?;
            match wildcard {
                Some(pattern) if node.share_threshold => {
                    shared.push((index, pattern.as_str()));
                    key_parts.push((&node.shared_key_part, false));
                }
                _ => key_parts.push((&candidates.key_part, true)),
            }
            if let Some(pattern) = wildcard {
                marks.push((
                    index,
                    Mark::Wildcard {
                        pattern: pattern.as_str(),
                        share: node.share_threshold,
                        value_to_metric: node.value_to_metric,
                    },
                ));
            } else if node.value_to_metric {
                marks.push((index, Mark::ValueToMetric));
            }
            if index == last {
                let first = node.limits.first()?;
                return Some(Matched {
                    // The node's flags and `full_key` are the same on each of its limits.
                    metric_key: metric_key(&self.name, entries, first, &marks, key_only),
                    counter_keys: counter_keys(
                        &self.key_part,
                        &key_parts,
                        entries,
                        &node.limits,
                        &node.key_suffixes,
                    ),
                    limits: &node.limits,
                    shared,
                    metadata: node.metadata.as_ref(),
                });
            }
            if node.children.is_empty() {
                // The request is deeper than the config.
                return None;
            }
            level = &node.children;
        }
        None
    }
}

/// One counter identity per limit of a node: the descriptor's part (`domain` and `levels`, built
/// once) then each limit's suffix. An unlimited limit is never charged: its identity is empty.
fn counter_keys(
    domain: &str,
    levels: &[(&str, bool)],
    entries: &[Entry],
    limits: &[Arc<Limit>],
    suffixes: &[Box<str>],
) -> SmallVec<[String; 1]> {
    if let ([limit], [suffix]) = (limits, suffixes) {
        let key = if limit.unlimited {
            String::new()
        } else {
            counter_key::assemble(domain, levels, entries, suffix)
        };
        return SmallVec::from_buf([key]);
    }
    // A `rate_limits` list: no entry is unlimited (the rules refuse it).
    let longest = suffixes.iter().map(|s| s.len()).max().unwrap_or(0);
    let base = counter_key::assemble_base(domain, levels, entries, longest);
    let mut keys = SmallVec::with_capacity(suffixes.len());
    if let Some((last, rest)) = suffixes.split_last() {
        for suffix in rest {
            let mut key = String::with_capacity(base.len() + suffix.len());
            key.push_str(&base);
            key.push_str(suffix);
            keys.push(key);
        }
        let mut key = base;
        key.push_str(last);
        keys.push(key);
    }
    keys
}

/// How one level of a request matched, where that matters to the metric key.
#[derive(Debug, Clone, Copy)]
enum Mark<'a> {
    /// A wildcard value, with the node's flags.
    Wildcard {
        pattern: &'a str,
        share: bool,
        value_to_metric: bool,
    },
    /// An exact or key-only node with `value_to_metric`.
    ValueToMetric,
}

/// The key envoyproxy/ratelimit counts a matched limit's statistics under, when it is not the
/// limit's `full_key`: with `detailed_metric` on the node holding the limit, every level's
/// request value (a `share_threshold` wildcard keeps its pattern); else, when a level has
/// `value_to_metric`, the request's value at those levels. `None` means `full_key`.
fn metric_key(
    domain: &str,
    entries: &[Entry],
    limit: &Limit,
    marks: &[(usize, Mark<'_>)],
    key_only: u64,
) -> Option<String> {
    let mark = |index: usize| marks.iter().find(|(i, _)| *i == index).map(|(_, m)| *m);
    if limit.detailed_metric {
        let mut key = String::from(domain);
        let any_share = marks
            .iter()
            .any(|(_, m)| matches!(m, Mark::Wildcard { share: true, .. }));
        for (index, entry) in entries.iter().enumerate() {
            key.push('.');
            key.push_str(&entry.key);
            match mark(index) {
                Some(Mark::Wildcard {
                    pattern,
                    share: true,
                    ..
                }) => {
                    key.push('_');
                    key.push_str(pattern);
                }
                // Without a shared level every value is written, even an empty one (`key_`).
                _ if !any_share || !entry.value.is_empty() => {
                    key.push('_');
                    key.push_str(&entry.value);
                }
                _ => {}
            }
        }
        return Some(key);
    }
    if !marks.iter().any(|(_, m)| {
        matches!(
            m,
            Mark::ValueToMetric
                | Mark::Wildcard {
                    value_to_metric: true,
                    share: false,
                    ..
                }
        )
    }) {
        return None;
    }
    // Built only past the check above: most limits use their rule's key, and a decision should
    // not allocate one to drop it.
    let mut key = String::from(domain);
    for (index, entry) in entries.iter().enumerate() {
        key.push('.');
        key.push_str(&entry.key);
        let value = match mark(index) {
            Some(Mark::Wildcard {
                pattern,
                share,
                value_to_metric,
            }) => {
                if value_to_metric && !share {
                    entry.value.as_str()
                } else {
                    pattern
                }
            }
            Some(Mark::ValueToMetric) => entry.value.as_str(),
            // Key-only: nothing; an exact value: the request's, which equals the config's.
            None if 1u64
                .checked_shl(index as u32)
                .is_some_and(|bit| key_only & bit != 0) =>
            {
                ""
            }
            None => entry.value.as_str(),
        };
        if !value.is_empty() {
            key.push('_');
            key.push_str(value);
        }
    }
    (key != limit.full_key).then_some(key)
}

/// The children of a node (or the top of a domain), by descriptor key.
pub(super) type Level = LookupMap<String, KeyNodes>;

/// The most nodes [`Domain::order_entries`] visits looking for a path that holds a bucket's keys.
const PATH_SEARCH_BUDGET: usize = 10_000;

/// Finds a path down `level` that takes each of `keys` once (indexes into `keys`, in nesting
/// order), trying the keys in their order; false when none does within `budget` nodes.
fn nest(level: &Level, keys: &[&str], path: &mut Vec<usize>, budget: &mut usize) -> bool {
    if path.len() == keys.len() {
        return true;
    }
    for (index, key) in keys.iter().enumerate() {
        if path.contains(&index) {
            continue;
        }
        let Some(nodes) = level.get(*key) else {
            continue;
        };
        path.push(index);
        if path.len() == keys.len() {
            return true;
        }
        for node in &nodes.nodes {
            if *budget == 0 {
                path.pop();
                return false;
            }
            *budget -= 1;
            if nest(&node.children, keys, path, budget) {
                return true;
            }
        }
        path.pop();
    }
    false
}

/// Every node declared with one key at one level.
#[derive(Debug)]
pub(super) struct KeyNodes {
    /// The level's piece of a counter identity when the request's value follows it (`|key=`).
    key_part: Box<str>,
    /// The nodes, in config order; the fields below index into it.
    nodes: Vec<TreeNode>,
    /// Nodes by their literal `value` (wildcard values included, as the reference also matches
    /// a request value equal to the pattern text exactly).
    exact: LookupMap<String, usize>,
    /// Nodes whose `value` contains `*`, in config order.
    wildcards: Vec<(Pattern, usize)>,
    /// The node without a `value`.
    key_only: Option<usize>,
}

impl KeyNodes {
    /// No nodes yet, for descriptor key `key`.
    pub fn new(key: &str) -> Self {
        KeyNodes {
            key_part: counter_key::level_part(key, None),
            nodes: Vec::new(),
            exact: LookupMap::default(),
            wildcards: Vec::new(),
            key_only: None,
        }
    }

    /// Adds a node declared with `value` (empty for key-only), indexing it for lookups; `pattern`
    /// is `value`'s wildcard pattern, if it has one. A later node with the same value takes the
    /// earlier one's place in the index (the rules refuse such duplicates).
    pub fn push(&mut self, value: &str, pattern: Option<Pattern>, node: TreeNode) {
        let index = self.nodes.len();
        self.nodes.push(node);
        if value.is_empty() {
            self.key_only = Some(index);
        } else {
            self.exact.insert(value.to_string(), index);
            if let Some(pattern) = pattern {
                self.wildcards.push((pattern, index));
            }
        }
    }
}

impl KeyNodes {
    /// Adds every node of `other` after these, in `other`'s order.
    fn append(&mut self, other: KeyNodes) {
        // Each node's value, from the indexes that hold it.
        let mut values: Vec<String> = vec![String::new(); other.nodes.len()];
        for (value, index) in other.exact {
            if let Some(slot) = values.get_mut(index) {
                *slot = value;
            }
        }
        for (node, value) in other.nodes.into_iter().zip(values) {
            let pattern = Pattern::new(&value);
            self.push(&value, pattern, node);
        }
    }
}

/// One descriptor node.
#[derive(Debug)]
pub(super) struct TreeNode {
    /// Its `rate_limit`, or each of its `rate_limits` in declaration order; empty for an
    /// allow-list entry or a parent without a limit of its own.
    pub limits: Vec<Arc<Limit>>,
    /// Its `metadata`, if any and not empty.
    pub metadata: Option<MetaValue>,
    /// Whether the values its wildcard matches share one counter.
    pub share_threshold: bool,
    /// With `share_threshold`, the level's piece of a counter identity when the wildcard
    /// matched (`|key~pattern`), which stands for the request's value; else empty.
    pub shared_key_part: Box<str>,
    /// The last piece of each of its limits' counter identities (`@c60000`), one per limit in
    /// the order of `limits`.
    pub key_suffixes: Vec<Box<str>>,
    /// Whether the request's value stands in metric keys instead of the config's.
    pub value_to_metric: bool,
    /// The level below it.
    pub children: Level,
}

/// A `value` with `*` wildcards, each matching any run of characters (including none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pattern {
    text: String,
    /// The literal pieces between the `*`s (at least two).
    parts: Vec<String>,
    /// The total length of the literal pieces.
    fixed: usize,
}

impl Pattern {
    /// A pattern for `text`, or `None` when it contains no `*`.
    pub fn new(text: &str) -> Option<Pattern> {
        if !text.contains('*') {
            return None;
        }
        let parts: Vec<String> = text.split('*').map(str::to_string).collect();
        let fixed = parts.iter().map(String::len).sum();
        Some(Pattern {
            text: text.to_string(),
            parts,
            fixed,
        })
    }

    /// The pattern as written in the config.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether `value` matches: it starts with the first piece, ends with the last, and holds
    /// the middle pieces in order in between, without overlaps.
    pub fn matches(&self, value: &str) -> bool {
        let (Some(first), Some(last)) = (self.parts.first(), self.parts.last()) else {
            return false;
        };
        if value.len() < self.fixed || !value.starts_with(first.as_str()) {
            return false;
        }
        if !value.ends_with(last.as_str()) {
            return false;
        }
        // `fixed <= len` guarantees the prefix and suffix do not overlap, so this slice is valid
        // and falls on character boundaries (both ends are boundaries of matched literals).
        let Some(mut rest) = value.get(first.len()..value.len() - last.len()) else {
            return false;
        };
        for middle in &self.parts[1..self.parts.len() - 1] {
            match rest.find(middle.as_str()) {
                Some(at) => rest = &rest[at + middle.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_patterns_match_like_the_reference() {
        let cases = [
            ("foo*", "foo", true),
            ("foo*", "foo1", true),
            ("foo*", "fo", false),
            ("*", "", true),
            ("*", "anything", true),
            ("*bar", "foobar", true),
            ("*bar", "barfoo", false),
            ("bar*b", "barb", true),
            ("bar*b", "bar123b", true),
            ("bar*b", "bara", false),
            ("bar*b", "xbarb", false),
            ("ab*ba", "aba", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foo123baz", false),
            ("foo*bar*baz", "foobazbar", false),
            ("a**b", "ab", true),
            ("é*ü", "éxü", true),
            ("é*ü", "éü", true),
            ("é*ü", "ü", false),
        ];
        for (pattern, value, expected) in cases {
            let compiled = Pattern::new(pattern).unwrap();
            assert_eq!(compiled.matches(value), expected, "{pattern} ~ {value}");
        }
        assert_eq!(Pattern::new("plain"), None);
    }
}
