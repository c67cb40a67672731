//! How a limiter's identity becomes Redis keys.
//!
//! Every key of one limiter is `<prefix>{<tag>}<suffix>`: the hash tag puts them all in one
//! cluster slot, so one script call can touch them atomically. The tag is the identity with `%`,
//! `{`, `}` and `#` percent-escaped (so the tag never ends early and two identities never share a
//! tag), or, for identities longer than [`MAX_PLAIN_IDENTITY`] bytes, `#` and the SHA-256 of the
//! identity in hex (a `#` never starts an escaped tag, so the two forms cannot meet).
//!
//! The limits declared together in one descriptor's list ([`crate::backend::Hit::descriptor_tag`])
//! are decided together by one script call, so their keys must share one slot: their tag leaves
//! out the identity's last part, `@<algorithm><window>`, which follows the closing brace
//! ([`KeySpace::descriptor_base`]). Every other key keeps the whole identity in its tag.
//!
//! A sharded limit (`shards: N`, one hot limit's budget split over N windows so that it is not one
//! key on one node) names each shard window with [`KeySpace::shard_identity`], an identity whose
//! hash tag is steered towards its own part of the slot space, so the shards of one hot limit land
//! on different slots and spread over the cluster's masters.

use std::borrow::Cow;
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

/// The suffixes of a sliding window counter's keys, in the order its scripts take them.
pub const COUNTER_KEYS: &[&str] = &[COUNTER];
/// The suffixes of a sliding window log's keys, in the order its scripts take them.
pub const LOG_KEYS: &[&str] = &[LOG, LOG_META];

/// Number of Redis Cluster hash slots.
const SLOTS: u32 = 16_384;

/// The most suffixes tried when steering one shard's hash tag; past it the closest slot seen is
/// kept. Each try is a CRC16 over a handful of bytes, so the bound caps the work per hit at a few
/// microseconds even for shard counts whose targets are too narrow to hit (more shards than
/// slots).
const MAX_STEERING_TRIES: u32 = 2_048;

/// The longest shard suffix a shard identity gets: `{65535:2047}`. Identities longer than
/// [`MAX_PLAIN_IDENTITY`] minus this are digested first, so a shard identity is never hashed again
/// by [`KeySpace::base`] and its tag stays cheap to steer.
const MAX_SHARD_SUFFIX: usize = "{65535:2047}".len();

/// The key names of one deployment (`--key-prefix`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpace {
    prefix: String,
    /// The CRC16 state reached by the bytes of the hash tag that come before the escaped identity,
    /// or `None` when the prefix alone decides the slot (it holds a hash tag of its own), so
    /// steering shards is pointless.
    tag_start: Option<u16>,
}

impl KeySpace {
    /// Key names starting with `prefix`.
    pub fn new(prefix: &str) -> KeySpace {
        KeySpace {
            prefix: prefix.to_owned(),
            tag_start: tag_start(prefix),
        }
    }

    /// The prefix every key starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The common part of every key of the limiter `identity`: prefix and hash tag. Receipts carry
    /// it, and the key functions below append their suffix to it.
    pub fn base(&self, identity: &str) -> String {
        // A digested tag is `#` and 64 hex digits, shorter than any identity that gets one.
        let mut base =
            String::with_capacity(self.prefix.len() + identity.len().min(MAX_PLAIN_IDENTITY) + 2);
        base.push_str(&self.prefix);
        base.push('{');
        push_tag(&mut base, identity);
        base.push('}');
        base
    }

    /// The key base of the limiter `identity` declared in a descriptor's list of limits
    /// ([`crate::backend::Hit::descriptor_tag`]): `<prefix>{<tag of the head>}<rest>`, where the
    /// head is the identity up to its last `@` and the rest (`@<algorithm><window>`, escaped as a
    /// tag is) follows the closing brace. Every limit of one descriptor differs only in the rest,
    /// so all of them share one hash tag, one cluster slot. An identity without an `@`, or with
    /// nothing before it, keeps the whole identity in its tag, as [`KeySpace::base`] does.
    ///
    /// Such a base never equals one [`KeySpace::base`] makes: that one ends with the tag's `}`,
    /// this one with the rest, which is not empty and holds no raw brace. Two of them are equal
    /// only for equal identities: the tag holds no raw `}`, so it ends at the first one, and both
    /// the tag and the escaping of the rest are one-to-one.
    pub fn descriptor_base(&self, identity: &str) -> String {
        let Some(at) = identity.rfind('@').filter(|&at| at > 0) else {
            return self.base(identity);
        };
        let (head, rest) = identity.split_at(at);
        let mut base = String::with_capacity(
            self.prefix.len() + head.len().min(MAX_PLAIN_IDENTITY) + rest.len() + 2,
        );
        base.push_str(&self.prefix);
        base.push('{');
        push_tag(&mut base, head);
        base.push('}');
        push_escaped(&mut base, rest);
        base
    }

    /// The key base of a hit on the limiter `identity`: [`KeySpace::descriptor_base`] when its
    /// hit carries the descriptor's tag (`descriptor_tag`), else [`KeySpace::base`].
    pub fn hit_base(&self, identity: &str, descriptor_tag: bool) -> String {
        if descriptor_tag {
            self.descriptor_base(identity)
        } else {
            self.base(identity)
        }
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

    /// The identity of shard `shard` of `shards` of the limiter `identity`, to be used like any
    /// identity (it becomes a hash tag through [`KeySpace::base`]).
    ///
    /// It is `<identity>{<shard>:<j>}`, or `{<SHA-256 of identity>}{<shard>:<j>}` for identities
    /// too long to stay plain once suffixed. Limiter identities hold no raw brace, so a shard
    /// identity never equals an unsharded one; the shard number in it keeps shards apart, and the
    /// count of `{` (one or two) keeps the plain and digested forms apart.
    ///
    /// `j` steers the hash tag: it is the first of a bounded run of suffixes whose slot lies near
    /// the middle of the shard's own part of the slot space (shard `i` of `N` aims at
    /// `(i + 1/2) * 16384 / N`, within an eighth of a part either side), or failing that the
    /// closest one tried. The shards thus land on different slots spread evenly over the slot
    /// space. On a cluster laid out as `redis-cli --cluster create` does (contiguous, nearly
    /// equal ranges) with up to four masters, they reach every master whenever there are at
    /// least as many shards as masters (the tests check every count up to 64); with more masters
    /// a target close to a range boundary can fall to the neighbour. The choice depends only on
    /// the prefix, the identity and the shard numbers, so every tollgate instance picks the
    /// same keys.
    pub fn shard_identity(&self, identity: &str, shard: u16, shards: u16) -> String {
        let head: Cow<'_, str> = if identity.len() > MAX_PLAIN_IDENTITY - MAX_SHARD_SUFFIX {
            let mut digest = String::with_capacity(66);
            digest.push('{');
            for byte in Sha256::digest(identity.as_bytes()) {
                let _ = write!(digest, "{byte:02x}");
            }
            digest.push('}');
            Cow::Owned(digest)
        } else {
            Cow::Borrowed(identity)
        };
        let suffix = self.steer(&head, shard, shards);
        let mut out = String::with_capacity(head.len() + MAX_SHARD_SUFFIX);
        out.push_str(&head);
        // Writing into a String cannot fail.
        let _ = write!(out, "{{{shard}:{suffix}}}");
        out
    }

    /// The suffix `j` for shard `shard` of `head` (see [`KeySpace::shard_identity`]).
    fn steer(&self, head: &str, shard: u16, shards: u16) -> u32 {
        let Some(start) = self.tag_start else {
            return 0;
        };
        if shard >= shards {
            return 0;
        }
        let parts = u32::from(shards);
        let center = (2 * u32::from(shard) + 1) * SLOTS / (2 * parts);
        let tolerance = SLOTS / (8 * parts);

        // The tag is the escaped identity: `<escaped head>%7B<shard>:<j>%7D`. Everything before
        // `<j>` is the same for every try, so its CRC is computed once.
        let mut crc = start;
        let mut buf = [0u8; 4];
        for ch in head.chars() {
            crc = crc16_update(crc, escape_char(ch, &mut buf).as_bytes());
        }
        crc = crc16_update(crc, b"%7B");
        crc = crc16_update(crc, decimal(u32::from(shard), &mut [0; 10]));
        crc = crc16_update(crc, b":");

        let mut best = (u32::MAX, 0);
        for j in 0..MAX_STEERING_TRIES {
            let tag_crc = crc16_update(crc16_update(crc, decimal(j, &mut [0; 10])), b"%7D");
            let slot = u32::from(tag_crc) % SLOTS;
            let distance = slot.abs_diff(center);
            if distance <= tolerance {
                return j;
            }
            if distance < best.0 {
                best = (distance, j);
            }
        }
        best.1
    }
}

/// Where the hash tag of `<prefix>{<escaped identity>}<suffix>` starts, as the CRC16 state of the
/// tag bytes before the escaped identity; `None` when the prefix pins the slot by itself.
///
/// Redis hashes the text between the first `{` of the key and the first `}` after it. With no `{`
/// in the prefix that is exactly the escaped identity (which holds no raw brace). With a `{` in the
/// prefix and no `}` after it, the tag starts inside the prefix and runs on through the identity's
/// own `{`. With a `{` and then a `}` in the prefix, the prefix decides (or, for an empty `{}`,
/// the whole key is hashed): no identity steers that.
fn tag_start(prefix: &str) -> Option<u16> {
    let Some(open) = prefix.find('{') else {
        return Some(0);
    };
    let inside = &prefix[open + 1..];
    if inside.contains('}') {
        return None;
    }
    Some(crc16_update(crc16_update(0, inside.as_bytes()), b"{"))
}

/// Writes the hash tag of `identity` (without its braces): the identity escaped, or for one
/// longer than [`MAX_PLAIN_IDENTITY`] bytes `#` and its SHA-256 in hex.
fn push_tag(out: &mut String, identity: &str) {
    if identity.len() > MAX_PLAIN_IDENTITY {
        out.push('#');
        for byte in Sha256::digest(identity.as_bytes()) {
            let _ = write!(out, "{byte:02x}");
        }
    } else {
        push_escaped(out, identity);
    }
}

/// Writes `text` with `%`, `{`, `}` and `#` percent-escaped ([`escape_char`]).
fn push_escaped(out: &mut String, text: &str) {
    // The escaped characters are ASCII, so the text between them is copied whole; it is
    // usually all of the identity.
    let mut rest = text;
    while let Some(at) = rest
        .bytes()
        .position(|byte| matches!(byte, b'%' | b'{' | b'}' | b'#'))
    {
        out.push_str(&rest[..at]);
        let mut buf = [0u8; 4];
        out.push_str(escape_char(char::from(rest.as_bytes()[at]), &mut buf));
        rest = &rest[at + 1..];
    }
    out.push_str(rest);
}

/// What [`KeySpace::base`] writes for `ch` in a plain (not digested) tag.
fn escape_char(ch: char, buf: &mut [u8; 4]) -> &str {
    match ch {
        '%' => "%25",
        '{' => "%7B",
        '}' => "%7D",
        '#' => "%23",
        other => other.encode_utf8(buf),
    }
}

/// `n` in decimal, written into the end of `buf`.
fn decimal(mut n: u32, buf: &mut [u8; 10]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        // A digit, so the cast cannot truncate.
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
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
    crc16_update(0, bytes)
}

/// Continues a CRC-16/XMODEM over `bytes` from the state `crc` (XMODEM has no final xor, so the
/// CRC of `a ++ b` is `crc16_update(crc16_xmodem(a), b)`).
fn crc16_update(mut crc: u16, bytes: &[u8]) -> u16 {
    for &byte in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)];
    }
    crc
}

/// The CRC-16/XMODEM (polynomial 0x1021) of each byte value, a byte at a time.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

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
    fn base_escapes_exactly_like_a_char_by_char_walk() {
        let space = KeySpace::new("p:");
        let mut identities: Vec<String> = vec![
            String::new(),
            "edge|user=alice@c60000".into(),
            "%{}#".into(),
            "a%b{c}d#e".into(),
            "{{x}}".into(),
            "%%".into(),
            "dom|city=Zürich%|日本={東京}#".into(),
        ];
        identities.extend(('\u{0}'..='\u{7ff}').map(|ch| format!("{ch}a{ch}%{ch}")));
        for identity in identities {
            let mut expected = String::from("p:{");
            let mut buf = [0u8; 4];
            for ch in identity.chars() {
                expected.push_str(escape_char(ch, &mut buf));
            }
            expected.push('}');
            assert_eq!(space.base(&identity), expected, "{identity:?}");
        }
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

    /// The slot of every key of the limiter `identity`, checked to be one slot.
    fn slot_of_identity(space: &KeySpace, identity: &str) -> u16 {
        let base = space.base(identity);
        let slot = slot(&KeySpace::counter(&base));
        assert_eq!(slot, self::slot(&KeySpace::log(&base)));
        assert_eq!(slot, self::slot(&KeySpace::log_meta(&base)));
        slot
    }

    /// Where shard `shard` of `shards` aims, and how far off it may land.
    fn target(shard: u16, shards: u16) -> (u32, u32) {
        let n = u32::from(shards);
        (
            (2 * u32::from(shard) + 1) * SLOTS / (2 * n),
            SLOTS / (8 * n),
        )
    }

    /// The suffix `shard_identity` should pick, found the slow way: building every candidate
    /// identity's full key and asking [`slot`] for its slot.
    fn reference_suffix(space: &KeySpace, head: &str, shard: u16, shards: u16) -> u32 {
        if space.tag_start.is_none() {
            return 0;
        }
        let (center, tolerance) = target(shard, shards);
        let mut best = (u32::MAX, 0);
        for j in 0..MAX_STEERING_TRIES {
            let candidate = format!("{head}{{{shard}:{j}}}");
            let distance = u32::from(slot_of_identity(space, &candidate)).abs_diff(center);
            if distance <= tolerance {
                return j;
            }
            if distance < best.0 {
                best = (distance, j);
            }
        }
        best.1
    }

    fn identities() -> Vec<String> {
        vec![
            "edge|user=alice@c60000".to_owned(),
            "d|k=%7Bv%7D@l1000".to_owned(),
            "#edge|x=50%25@c1000".to_owned(),
            "dom|city=Zürich|日本=東京@c3600000".to_owned(),
            String::new(),
            "x".repeat(MAX_PLAIN_IDENTITY - MAX_SHARD_SUFFIX),
            "x".repeat(MAX_PLAIN_IDENTITY - MAX_SHARD_SUFFIX + 1),
            "y".repeat(5_000),
        ]
    }

    #[test]
    fn shard_identities_follow_the_slow_path_exactly() {
        // Prefixes where the tag is the escaped identity, or starts inside the prefix.
        for prefix in ["tollgate:", "", "p{q:", "{"] {
            let space = KeySpace::new(prefix);
            for identity in identities() {
                for shards in [1u16, 2, 3, 5, 8, 64] {
                    for shard in 0..shards {
                        let shard_identity = space.shard_identity(&identity, shard, shards);
                        let (head, suffix) =
                            shard_identity.rsplit_once('{').expect("a shard suffix");
                        let (number, j) = suffix
                            .trim_end_matches('}')
                            .split_once(':')
                            .expect("shard:j");
                        assert_eq!(number, shard.to_string());
                        let expected = reference_suffix(&space, head, shard, shards);
                        assert_eq!(j, expected.to_string(), "{prefix:?} {identity:?} {shard}");
                    }
                }
            }
        }
    }

    #[test]
    fn shards_land_on_distinct_slots_near_their_targets() {
        let space = KeySpace::new("tollgate:");
        let mut far = 0;
        let mut total = 0;
        for identity in identities() {
            for shards in 2..=64u16 {
                let mut slots = HashSet::new();
                for shard in 0..shards {
                    let slot =
                        slot_of_identity(&space, &space.shard_identity(&identity, shard, shards));
                    let (center, tolerance) = target(shard, shards);
                    total += 1;
                    if u32::from(slot).abs_diff(center) > tolerance {
                        // Only likely for many shards, where each target is narrow.
                        assert!(shards > 16, "{identity:?} shard {shard}/{shards} at {slot}");
                        far += 1;
                    }
                    slots.insert(slot);
                }
                assert_eq!(slots.len(), usize::from(shards), "{identity:?} {shards}");
            }
        }
        assert!(far * 1_000 <= total, "{far} of {total} shards off target");
    }

    /// The slot ranges `redis-cli --cluster create` gives `masters` masters.
    fn redis_cli_layout(masters: u32) -> Vec<(u32, u32)> {
        let per = f64::from(SLOTS) / f64::from(masters);
        let mut ranges = Vec::new();
        let mut first = 0;
        for index in 0..masters {
            let mut last = (f64::from(index + 1) * per - 1.0).round() as u32;
            if last >= SLOTS || index == masters - 1 {
                last = SLOTS - 1;
            }
            ranges.push((first, last));
            first = last + 1;
        }
        ranges
    }

    #[test]
    fn at_least_as_many_shards_as_masters_reach_every_master() {
        assert_eq!(
            redis_cli_layout(3),
            [(0, 5460), (5461, 10922), (10923, 16383)]
        );
        let space = KeySpace::new("tollgate:");
        for masters in 1..=4u32 {
            let layout = redis_cli_layout(masters);
            for identity in identities() {
                for shards in masters..=64 {
                    let shards = u16::try_from(shards).unwrap();
                    let reached: HashSet<usize> = (0..shards)
                        .map(|shard| {
                            let slot = u32::from(slot_of_identity(
                                &space,
                                &space.shard_identity(&identity, shard, shards),
                            ));
                            layout
                                .iter()
                                .position(|&(first, last)| (first..=last).contains(&slot))
                                .unwrap()
                        })
                        .collect();
                    assert_eq!(reached.len(), layout.len(), "{identity:?} over {shards}");
                }
            }
        }
    }

    #[test]
    fn shard_identities_never_meet_identities_or_each_other() {
        let space = KeySpace::new("tollgate:");
        let mut plain: Vec<String> = identities();
        // Identities that look like shard identities once escaped or digested.
        plain.extend(["v%7B0:1%7D", "v%7B0:1%7D%7B0:1%7D", "%7Babc%7D"].map(String::from));
        let mut plain_bases = HashSet::new();
        for identity in &plain {
            assert!(plain_bases.insert(space.base(identity)), "{identity:?}");
        }
        for shards in [1u16, 2, 7, 64] {
            let mut shard_bases = HashSet::new();
            for identity in &plain {
                for shard in 0..shards {
                    let shard_identity = space.shard_identity(identity, shard, shards);
                    // Short enough that `base` never digests it again.
                    assert!(shard_identity.len() <= MAX_PLAIN_IDENTITY);
                    let base = space.base(&shard_identity);
                    assert!(!base.starts_with("tollgate:{#"), "{base}");
                    assert!(!plain_bases.contains(&base), "{shard_identity:?}");
                    assert!(shard_bases.insert(base), "{identity:?} {shard}/{shards}");
                }
            }
        }
        // Two identities sharing a digest form would need a SHA-256 collision; check the forms
        // differ where they could: a long identity vs a short one made of its digest.
        let long = "z".repeat(1_000);
        let digested = space.shard_identity(&long, 0, 2);
        assert!(digested.starts_with('{') && digested.matches('{').count() == 2);
        let short = space.shard_identity("z", 0, 2);
        assert_eq!(short.matches('{').count(), 1);
        // Deterministic across instances.
        let again = KeySpace::new("tollgate:");
        for shard in 0..8 {
            assert_eq!(
                again.shard_identity("edge|user=alice@c60000", shard, 8),
                space.shard_identity("edge|user=alice@c60000", shard, 8)
            );
            assert_eq!(
                again.shard_identity(&long, shard, 8),
                space.shard_identity(&long, shard, 8)
            );
        }
    }

    #[test]
    fn a_prefix_with_its_own_tag_pins_every_shard_and_keeps_them_apart() {
        for prefix in ["tg{x}:", "tg{}:", "a{b}{c"] {
            let space = KeySpace::new(prefix);
            assert_eq!(space.tag_start, None);
            let keys: HashSet<String> = (0..8)
                .map(|shard| space.shard_identity("edge|u=a@c1000", shard, 8))
                .collect();
            assert_eq!(keys.len(), 8);
            assert!(keys.iter().all(|key| key.ends_with(":0}")));
        }
    }

    #[test]
    fn the_limits_of_one_descriptor_share_a_slot_and_keep_apart() {
        let heads = [
            "edge|user=alice".to_owned(),
            "d|k=%7Bv%7D|x~a%23b".to_owned(),
            "dom|city=Zürich|日本=東京".to_owned(),
            "x".repeat(MAX_PLAIN_IDENTITY + 5),
        ];
        let rests = ["@c1000", "@c3600000", "@l1000", "@l86400000"];
        for prefix in ["tollgate:", "", "p{q:", "tg{x}:"] {
            let space = KeySpace::new(prefix);
            let mut seen = HashSet::new();
            for head in &heads {
                let mut slots = HashSet::new();
                for rest in rests {
                    let identity = format!("{head}{rest}");
                    let tagged = space.descriptor_base(&identity);
                    let plain = space.base(&identity);
                    assert_ne!(tagged, plain);
                    assert_eq!(space.hit_base(&identity, true), tagged);
                    assert_eq!(space.hit_base(&identity, false), plain);
                    assert!(tagged.ends_with(rest), "{tagged}");
                    for base in [&tagged, &plain] {
                        for key in [
                            KeySpace::counter(base),
                            KeySpace::log(base),
                            KeySpace::log_meta(base),
                        ] {
                            assert!(seen.insert(key.clone()), "{identity:?} collides at {key}");
                        }
                    }
                    for key in [
                        KeySpace::counter(&tagged),
                        KeySpace::log(&tagged),
                        KeySpace::log_meta(&tagged),
                    ] {
                        slots.insert(slot(&key));
                    }
                }
                assert_eq!(slots.len(), 1, "{prefix:?} {head:?}: {slots:?}");
                // the slot of the head's own tag, as a tag of the whole head would have it
                let head_slot = slot(&space.base(head));
                assert!(slots.contains(&head_slot), "{prefix:?} {head:?}");
            }
        }
        let space = KeySpace::new("p:");
        assert_eq!(space.descriptor_base("a{b}@c1000"), "p:{a%7Bb%7D}@c1000");
        // a long head is digested, and the rest still follows the tag
        let long = format!("{}@c1000", "y".repeat(300));
        let base = space.descriptor_base(&long);
        assert!(
            base.starts_with("p:{#") && base.ends_with("}@c1000"),
            "{base}"
        );
        // no `@`, or nothing before it: the whole identity is the tag
        assert_eq!(space.descriptor_base("plain"), space.base("plain"));
        assert_eq!(space.descriptor_base("@c1000"), space.base("@c1000"));
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
