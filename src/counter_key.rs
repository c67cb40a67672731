//! The identity of a counter: the string that names, in every backend, the counter a
//! descriptor's hits go to under one limit.
//!
//! Two different descriptors must never share a counter by accident, so every component is
//! escaped before it is joined: the separators (`|`, `=`, `~`, `@`), the escape character `%`,
//! the hash-tag braces `{` `}` and control characters are percent-encoded. The encoding is
//! injective, and the result contains no brace, so a backend may wrap it in a Redis hash tag.
//!
//! An identity reads `domain|key=value|key~pattern@c60000`. Everything but the request's values
//! is fixed by the config, so the config escapes those pieces once when it is built
//! (`domain_part`, `level_part`, `suffix`) and a decision only copies them around the
//! escaped values (`assemble`). [`limiter_key`] writes the same pieces in the same order from
//! scratch, for limits that are not in the config (a descriptor's own `limit`).

use std::fmt::Write as _;

use crate::descriptor::Entry;
use crate::window::Algorithm;

/// Builds the identity of the counter for `entries` of `domain` under one algorithm and window:
/// which counter a descriptor's hits go to.
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
        match shared.iter().find(|(l, _)| *l == level) {
            Some((_, pattern)) => push_level(&mut key, &entry.key, Some(pattern)),
            None => {
                push_level(&mut key, &entry.key, None);
                escape_into(&mut key, &entry.value);
            }
        }
    }
    push_suffix(&mut key, algorithm, window_ms);
    key
}

/// The first piece of every identity in a domain: its escaped name.
pub(crate) fn domain_part(domain: &str) -> Box<str> {
    let mut part = String::new();
    escape_into(&mut part, domain);
    part.into_boxed_str()
}

/// The piece one descriptor level writes before its request value (`|key=`), or, for a level
/// matched by a `share_threshold` wildcard, instead of it (`|key~pattern`).
pub(crate) fn level_part(key: &str, shared_pattern: Option<&str>) -> Box<str> {
    let mut part = String::new();
    push_level(&mut part, key, shared_pattern);
    part.into_boxed_str()
}

/// The last piece of every identity of a limit: its algorithm and window (`@c60000`).
pub(crate) fn suffix(algorithm: Algorithm, window_ms: u64) -> Box<str> {
    let mut part = String::new();
    push_suffix(&mut part, algorithm, window_ms);
    part.into_boxed_str()
}

/// The identity [`limiter_key`] builds, from the config's pieces: `domain` (a [`domain_part`]),
/// then per level of `entries` its [`level_part`] and, unless the level is shared, the escaped
/// request value, then `suffix`. `levels` holds, per entry, the level's part and whether the
/// value follows it.
pub(crate) fn assemble(
    domain: &str,
    levels: &[(&str, bool)],
    entries: &[Entry],
    suffix: &str,
) -> String {
    let mut key = assemble_base(domain, levels, entries, suffix.len());
    key.push_str(suffix);
    key
}

/// What [`assemble`] builds before the suffix: the part of the identity every limit of one
/// descriptor shares, with room for `suffix_len` more bytes.
pub(crate) fn assemble_base(
    domain: &str,
    levels: &[(&str, bool)],
    entries: &[Entry],
    suffix_len: usize,
) -> String {
    let mut length = domain.len() + suffix_len;
    for ((part, with_value), entry) in levels.iter().zip(entries) {
        length += part.len() + if *with_value { entry.value.len() } else { 0 };
    }
    let mut key = String::with_capacity(length);
    key.push_str(domain);
    for ((part, with_value), entry) in levels.iter().zip(entries) {
        key.push_str(part);
        if *with_value {
            escape_into(&mut key, &entry.value);
        }
    }
    key
}

/// Appends one level's separator and escaped key, and the shared pattern if there is one.
fn push_level(out: &mut String, key: &str, shared_pattern: Option<&str>) {
    out.push('|');
    escape_into(out, key);
    match shared_pattern {
        Some(pattern) => {
            out.push('~');
            escape_into(out, pattern);
        }
        None => out.push('='),
    }
}

/// Appends the algorithm's letter and the window in decimal milliseconds.
fn push_suffix(out: &mut String, algorithm: Algorithm, window_ms: u64) {
    out.push('@');
    out.push(match algorithm {
        Algorithm::SlidingWindowCounter => 'c',
        Algorithm::SlidingWindowLog => 'l',
    });
    push_decimal(out, window_ms);
}

/// Appends `n` in decimal; the formatting machinery of `write!` costs more than the whole key,
/// and a descriptor's own `limit` builds its identity on every decision.
fn push_decimal(out: &mut String, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Always ASCII digits, so always valid UTF-8.
    if let Ok(text) = std::str::from_utf8(&digits[start..]) {
        out.push_str(text);
    }
}

/// Appends `text` with the separators, `%`, braces and control characters percent-encoded.
/// Inlined: a key is three or more short texts, and most need no escaping at all, which costs
/// less than calling a function to find out.
#[inline]
fn escape_into(out: &mut String, text: &str) {
    match text.bytes().position(may_need_escape) {
        None => out.push_str(text),
        Some(clean) => escape_from(out, text, clean),
    }
}

/// [`escape_into`] of a `text` whose first `clean` bytes need no escaping.
#[inline(never)]
fn escape_from(out: &mut String, text: &str, clean: usize) {
    // Copy the clean prefix at once, then go char by char.
    // `clean` is at a char boundary: every byte it can stop at is ASCII or a UTF-8 lead byte.
    let (plain, rest) = text.split_at(clean);
    out.push_str(plain);
    for c in rest.chars() {
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

/// Whether `byte` may start a character that [`escape_into`] encodes: the separators, ASCII
/// controls, or 0xC2, the lead byte of the C1 controls U+0080..U+009F. A table, as every byte of
/// every key is tested.
fn may_need_escape(byte: u8) -> bool {
    MAY_NEED_ESCAPE[usize::from(byte)]
}

/// [`may_need_escape`] of every byte.
static MAY_NEED_ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = matches!(
            byte as u8,
            b'%' | b'|' | b'=' | b'~' | b'@' | b'{' | b'}' | 0x00..=0x1F | 0x7F | 0xC2
        );
        byte += 1;
    }
    table
};

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
    fn windows_are_written_in_decimal() {
        let entries = vec![Entry::new("k", "v")];
        for window in [0, 1, 9, 10, 1000, 60_000, u64::MAX] {
            let key = limiter_key("d", &entries, &[], Algorithm::SlidingWindowLog, window);
            assert_eq!(key, format!("d|k=v@l{window}"));
        }
    }

    #[test]
    fn control_characters_are_encoded() {
        assert_eq!(key("d", &[("k", "a\nb")]), "d|k=a%0Ab@c60000");
        // C1 controls are two bytes in UTF-8, each encoded; other 0xC2 characters stay.
        assert_eq!(key("d", &[("k", "x\u{85}y")]), "d|k=x%C2%85y@c60000");
        assert_eq!(key("d", &[("k", "\u{a0}é\u{7f}")]), "d|k=\u{a0}é%7F@c60000");
    }

    #[test]
    fn the_clean_prefix_shortcut_changes_nothing() {
        // The plain char-by-char encoding the shortcut must agree with.
        fn reference(text: &str) -> String {
            let mut out = String::new();
            for c in text.chars() {
                match c {
                    '%' | '|' | '=' | '~' | '@' | '{' | '}' => push_percent(&mut out, c as u32),
                    c if c.is_control() => {
                        let mut buf = [0u8; 4];
                        for byte in c.encode_utf8(&mut buf).bytes() {
                            push_percent(&mut out, u32::from(byte));
                        }
                    }
                    c => out.push(c),
                }
            }
            out
        }
        let samples = (0u32..0x800)
            .chain([0x2028, 0xFEFF, 0x1F600])
            .filter_map(char::from_u32);
        for c in samples {
            for text in [format!("{c}"), format!("ab{c}cd"), format!("{c}x{c}")] {
                let mut fast = String::new();
                escape_into(&mut fast, &text);
                assert_eq!(fast, reference(&text), "U+{:04X}", c as u32);
            }
        }
    }

    #[test]
    fn text_after_an_escape_is_still_escaped() {
        assert_eq!(
            key("d", &[("k", "ü=a|b%\u{85}")]),
            "d|k=ü%3Da%7Cb%25%C2%85@c60000"
        );
    }
}
