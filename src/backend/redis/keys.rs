//! How a limiter's identity becomes Redis keys.
//!
//! Every key of one limiter is `<prefix>{<tag>}<suffix>`: the hash tag puts them all in one
//! cluster slot, so one script call can touch them atomically. The tag is the identity with `%`,
//! `{`, `}` and `#` percent-escaped (so the tag never ends early and two identities never share a
//! tag), or, for identities longer than [`MAX_PLAIN_IDENTITY`] bytes, `#` and the SHA-256 of the
//! identity in hex (a `#` never starts an escaped tag, so the two forms cannot meet).

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

/// Identities longer than this many bytes are hashed into the key.
pub const MAX_PLAIN_IDENTITY: usize = 200;

/// Suffix of a sliding window counter's hash of per-window counts.
const COUNTER: &str = ":c";
/// Suffix of a sliding window log's sorted set of entries.
const LOG: &str = ":l";
/// Suffix of the hash beside a log (running sum of costs, last entry id).
const LOG_META: &str = ":s";

/// The key names of one deployment (`--key-prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
}

impl KeySpace {
    /// Key names starting with `prefix`.
    pub fn new(prefix: &str) -> KeySpace {
        KeySpace {
            prefix: prefix.to_owned(),
        }
    }

    /// The common part of every key of the limiter `identity`: prefix and hash tag. Receipts carry
    /// it, and the key functions below append their suffix to it.
    pub fn base(&self, identity: &str) -> String {
        let mut base = String::with_capacity(self.prefix.len() + identity.len().min(80) + 4);
        base.push_str(&self.prefix);
        base.push('{');
        if identity.len() > MAX_PLAIN_IDENTITY {
            base.push('#');
            for byte in Sha256::digest(identity.as_bytes()) {
                let _ = write!(base, "{byte:02x}");
            }
        } else {
            for ch in identity.chars() {
                match ch {
                    '%' => base.push_str("%25"),
                    '{' => base.push_str("%7B"),
                    '}' => base.push_str("%7D"),
                    '#' => base.push_str("%23"),
                    other => base.push(other),
                }
            }
        }
        base.push('}');
        base
    }

    /// The counter hash of a sliding window counter.
    pub fn counter(base: &str) -> String {
        format!("{base}{COUNTER}")
    }

    /// The sorted set of a sliding window log.
    pub fn log(base: &str) -> String {
        format!("{base}{LOG}")
    }

    /// The hash beside a sliding window log.
    pub fn log_meta(base: &str) -> String {
        format!("{base}{LOG_META}")
    }
}

/// The Redis Cluster slot of `key` (CRC16 of the hash tag, or of the whole key without one).
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &bytes[open + 1..];
        rest.iter()
            .position(|&b| b == b'}')
            .filter(|&len| len > 0)
            .map(|len| &rest[..len])
    });
    crc16_xmodem(tagged.unwrap_or(bytes)) % 16384
}

/// CRC-16/XMODEM, the checksum Redis Cluster assigns slots with.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn identities_with_separators_get_distinct_keys() {
        let space = KeySpace::new("tollgate:");
        let identities = [
            "edge|user=alice",
            "edge|user=alice|",
            "edge|user=ali|ce",
            "edge|user={alice}",
            "edge|user=%7Balice%7D",
            "edge|user=%7Balice}",
            "edge|user={alice%7D",
            "edge|user=}alice{",
            "edge|user:alice",
            "edge|user=alice:c",
            "edge|user=alice}:c",
            "edge:user=alice",
            "#edge",
            "%23edge",
            "%edge",
            "%25edge",
            "",
            "{",
            "}",
            "%",
            "#",
        ];
        let mut seen = HashSet::new();
        for identity in identities {
            let base = space.base(identity);
            for key in [
                KeySpace::counter(&base),
                KeySpace::log(&base),
                KeySpace::log_meta(&base),
            ] {
                assert!(seen.insert(key.clone()), "{identity:?} collides at {key:?}");
            }
        }
    }

    #[test]
    fn the_tag_spans_the_whole_identity() {
        let space = KeySpace::new("p:");
        assert_eq!(space.base("a{b}c"), "p:{a%7Bb%7Dc}");
        assert_eq!(space.base("50%#"), "p:{50%25%23}");
        let base = space.base("a}b");
        assert_eq!(slot(&KeySpace::counter(&base)), slot(&KeySpace::log(&base)));
        assert_eq!(slot(&base), crc16_xmodem(b"a%7Db") % 16384);
    }

    #[test]
    fn long_identities_are_hashed_and_stay_distinct() {
        let space = KeySpace::new("tollgate:");
        let long_a = "x".repeat(MAX_PLAIN_IDENTITY + 1);
        let long_b = format!("{}y", "x".repeat(MAX_PLAIN_IDENTITY));
        let (a, b) = (space.base(&long_a), space.base(&long_b));
        assert_ne!(a, b);
        assert!(a.starts_with("tollgate:{#") && a.len() == "tollgate:{#}".len() + 64);
        let at_limit = "x".repeat(MAX_PLAIN_IDENTITY);
        assert_eq!(space.base(&at_limit), format!("tollgate:{{{at_limit}}}"));
        // a short identity that looks like a hashed tag is escaped, so it cannot meet one
        let lookalike = &a["tollgate:{".len()..a.len() - 1];
        assert_ne!(space.base(lookalike), a);
    }

    #[test]
    fn slots_match_redis_cluster() {
        // values from the Redis Cluster specification and `CLUSTER KEYSLOT`
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), crc16_xmodem(b"foo{}{bar}") % 16384);
    }
}
