//! The descriptor tree of one domain and the per-request lookup.
//!
//! Each level maps a key to the nodes declared with that key, so a lookup never builds a
//! `key_value` string: exact values are a hash lookup, wildcard values are tried in config order,
//! and the key-only node is the fallback.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Limit, Matched, MetaValue};
use crate::descriptor::Entry;

/// The children of a node (or the top of a domain), by descriptor key.
pub(super) type Level = HashMap<String, KeyNodes>;

/// Every node declared with one key at one level.
#[derive(Debug, Default)]
pub(super) struct KeyNodes {
    /// The nodes, in config order; the fields below index into it.
    pub nodes: Vec<TreeNode>,
    /// Nodes by their literal `value` (wildcard values included, as the reference also matches
    /// a request value equal to the pattern text exactly).
    pub exact: HashMap<String, usize>,
    /// Nodes whose `value` contains `*`, in config order.
    pub wildcards: Vec<(Pattern, usize)>,
    /// The node without a `value`.
    pub key_only: Option<usize>,
}

/// One descriptor node.
#[derive(Debug)]
pub(super) struct TreeNode {
    pub limit: Option<Arc<Limit>>,
    pub metadata: Option<MetaValue>,
    pub share_threshold: bool,
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

/// Walks `level` with the request's entries, one level per entry, never backtracking.
pub(super) fn resolve<'a>(mut level: &'a Level, entries: &[Entry]) -> Option<Matched<'a>> {
    let last = entries.len().checked_sub(1)?;
    let mut shared = Vec::new();
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
            (candidates.key_only?, None)
        };
        let node = candidates.nodes.get(node)?;
        if let Some(pattern) = wildcard
            && node.share_threshold
        {
            shared.push((index, pattern.as_str()));
        }
        if index == last {
            return node.limit.as_ref().map(|limit| Matched {
                limit,
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
