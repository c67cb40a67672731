//! The identity of one limiter: which counter a descriptor's hits go to.
//!
//! Two different descriptors must never share a counter by accident, so every component is
//! escaped before it is joined: the separators (`|`, `=`, `~`, `@`), the escape character `%`,
//! the hash-tag braces `{` `}` and control characters are percent-encoded. The encoding is
//! injective, and the result contains no brace, so a backend may wrap it in a Redis hash tag.

use std::fmt::Write;

use crate::descriptor::Entry;
use crate::window::Algorithm;

/// Builds the identity of the counter for `entries` of `domain` under one algorithm and window.
///
/// `shared` lists the levels matched by a `share_threshold` wildcard: there the wildcard pattern
/// (marked with `~` instead of `=`) stands for every value it matches, so they share one counter.
pub fn limiter_key(
    domain: &str,
    entries: &[Entry],
    shared: &[(usize, &str)],
    algorithm: Algorithm,
    window_ms: u64,
) -> String {
    let mut key = String::with_capacity(
        domain.len()
            + entries
                .iter()
                .map(|e| e.key.len() + e.value.len() + 2)
                .sum::<usize>()
            + 24,
    );
    escape_into(&mut key, domain);
    for (level, entry) in entries.iter().enumerate() {
        key.push('|');
        escape_into(&mut key, &entry.key);
        match shared.iter().find(|(l, _)| *l == level) {
            Some((_, pattern)) => {
                key.push('~');
                escape_into(&mut key, pattern);
            }
            None => {
                key.push('=');
                escape_into(&mut key, &entry.value);
            }
        }
    }
    let tag = match algorithm {
        Algorithm::SlidingWindowCounter => 'c',
        Algorithm::SlidingWindowLog => 'l',
    };
    // Writing into a String cannot fail.
    let _ = write!(key, "@{tag}{window_ms}");
    key
}

fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '%' | '|' | '=' | '~' | '@' | '{' | '}' => push_percent(out, c as u32),
            c if c.is_control() => {
                let mut buf = [0u8; 4];
                for byte in c.encode_utf8(&mut buf).bytes() {
                    push_percent(out, u32::from(byte));
                }
            }
            c => out.push(c),
        }
    }
}

fn push_percent(out: &mut String, byte: u32) {
    let _ = write!(out, "%{byte:02X}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(domain: &str, pairs: &[(&str, &str)]) -> String {
        let entries: Vec<Entry> = pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect();
        limiter_key(
            domain,
            &entries,
            &[],
            Algorithm::SlidingWindowCounter,
            60_000,
        )
    }

    #[test]
    fn plain_descriptors_stay_readable() {
        assert_eq!(
            key("edge", &[("user", "alice"), ("path", "/login")]),
            "edge|user=alice|path=/login@c60000"
        );
    }

    #[test]
    fn separators_in_values_cannot_forge_another_descriptor() {
        // Each pair would collide if the separators were not escaped.
        let pairs = [
            (
                key("edge", &[("a", "b|c=d")]),
                key("edge", &[("a", "b"), ("c", "d")]),
            ),
            (key("edge|a=b", &[]), key("edge", &[("a", "b")])),
            (key("e", &[("a=b", "c")]), key("e", &[("a", "b=c")])),
            (key("e", &[("a", "%7C")]), key("e", &[("a", "|")])),
            (key("e", &[("a", "x@c60000")]), key("e", &[("a", "x")])),
            (key("e", &[("a", "{tag}")]), key("e", &[("a", "tag")])),
        ];
        for (left, right) in pairs {
            assert_ne!(left, right);
        }
        assert!(!key("e", &[("a", "{x}")]).contains(['{', '}']));
    }

    #[test]
    fn shared_levels_use_the_pattern_and_differ_from_a_literal_value() {
        let entries = vec![Entry::new("path", "/api/users")];
        let shared = limiter_key(
            "edge",
            &entries,
            &[(0, "/api/*")],
            Algorithm::SlidingWindowCounter,
            1000,
        );
        let literal = limiter_key(
            "edge",
            &[Entry::new("path", "/api/*")],
            &[],
            Algorithm::SlidingWindowCounter,
            1000,
        );
        assert_eq!(shared, "edge|path~/api/*@c1000");
        assert_ne!(shared, literal);
    }

    #[test]
    fn algorithm_and_window_separate_counters() {
        let entries = vec![Entry::new("user", "bob")];
        let a = limiter_key("d", &entries, &[], Algorithm::SlidingWindowCounter, 1000);
        let b = limiter_key("d", &entries, &[], Algorithm::SlidingWindowLog, 1000);
        let c = limiter_key("d", &entries, &[], Algorithm::SlidingWindowCounter, 2000);
        assert!(a != b && a != c && b != c);
    }

    #[test]
    fn control_characters_are_encoded() {
        assert_eq!(key("d", &[("k", "a\nb")]), "d|k=a%0Ab@c60000");
    }
}
