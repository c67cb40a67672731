//! The limiter's own rules, checked without a backend: request validation and counter identities.

use super::*;
use crate::descriptor::{Descriptor, Entry};

mod validation {
    use super::*;

    fn request_with(descriptors: Vec<Descriptor>) -> Request {
        Request {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    fn descriptor(entries: Vec<Entry>) -> Descriptor {
        Descriptor {
            entries,
            ..Descriptor::default()
        }
    }

    #[test]
    fn accepts_a_plain_request() {
        let r = request_with(vec![descriptor(vec![Entry::new("user", "alice")])]);
        assert_eq!(validate(&r), Ok(()));
    }

    #[test]
    fn rejects_each_broken_rule_with_a_message() {
        let long = "x".repeat(MAX_TEXT_BYTES + 1);
        let one = || descriptor(vec![Entry::new("k", "v")]);
        let cases = [
            (
                Request {
                    domain: String::new(),
                    ..request_with(vec![one()])
                },
                "domain must not be empty",
            ),
            (request_with(vec![]), "descriptor list must not be empty"),
            (
                request_with(vec![descriptor(vec![Entry::new("", "v")])]),
                "empty key",
            ),
            (
                request_with((0..=MAX_DESCRIPTORS).map(|_| one()).collect()),
                "65 descriptors",
            ),
            (
                request_with(vec![descriptor(
                    (0..=MAX_ENTRIES).map(|_| Entry::new("k", "v")).collect(),
                )]),
                "33 entries",
            ),
            (
                request_with(vec![descriptor(vec![Entry::new("k", long.clone())])]),
                "longer than 1024",
            ),
            (
                request_with(vec![descriptor(vec![Entry::new(long, "v")])]),
                "longer than 1024",
            ),
        ];
        for (req, expected) in cases {
            match validate(&req) {
                Err(LimiterError::InvalidArgument(m)) => {
                    assert!(m.contains(expected), "{m:?} should mention {expected:?}")
                }
                other => panic!("expected an error mentioning {expected:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn accepts_a_descriptor_without_entries() {
        // envoyproxy/ratelimit answers it OK with no limit; clients other than Envoy send them.
        let r = request_with(vec![
            descriptor(vec![]),
            descriptor(vec![Entry::new("k", "v")]),
        ]);
        assert_eq!(validate(&r), Ok(()));
    }

    #[test]
    fn accepts_the_limits_themselves() {
        let max = "x".repeat(MAX_TEXT_BYTES);
        let r = request_with(
            (0..MAX_DESCRIPTORS)
                .map(|_| {
                    descriptor(
                        (0..MAX_ENTRIES)
                            .map(|_| Entry::new(max.clone(), max.clone()))
                            .collect(),
                    )
                })
                .collect(),
        );
        assert_eq!(validate(&r), Ok(()));
    }
}

mod identity {
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

mod dynamic_metadata {
    use super::*;

    fn map(fields: &[(&str, MetaValue)]) -> MetaValue {
        MetaValue::Map(
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        )
    }

    fn text(s: &str) -> MetaValue {
        MetaValue::String(s.to_string())
    }

    #[test]
    fn has_the_reference_shape() {
        let request = Request {
            domain: "edge".into(),
            descriptors: vec![
                Descriptor {
                    entries: vec![Entry::new("user", "alice"), Entry::new("path", "/a")],
                    limit: Some(LimitOverride {
                        requests_per_unit: 10,
                        unit: Some(crate::descriptor::Unit::Day),
                    }),
                    hits_addend: Some(0),
                },
                Descriptor::default(),
            ],
            hits_addend: 5,
        };
        let merged = Some(map(&[("name", text("service_1"))]));
        let expected = map(&[
            ("domain", text("edge")),
            (
                "descriptors",
                MetaValue::List(vec![
                    map(&[
                        (
                            "entries",
                            MetaValue::List(vec![text("user=alice"), text("path=/a")]),
                        ),
                        ("limit", text("requests_per_unit:10 unit:DAY")),
                        ("hitsAddend", MetaValue::Number(0.0)),
                    ]),
                    map(&[("entries", MetaValue::List(vec![]))]),
                ]),
            ),
            ("hitsAddend", MetaValue::Number(5.0)),
            ("metadata", map(&[("name", text("service_1"))])),
        ]);
        assert_eq!(dynamic_metadata(&request, merged), expected);

        // A request hits_addend of 0 and no metadata leave their keys out.
        let plain = Request {
            domain: "d".into(),
            descriptors: vec![Descriptor {
                entries: vec![Entry::new("k", "v")],
                ..Descriptor::default()
            }],
            hits_addend: 0,
        };
        assert_eq!(
            dynamic_metadata(&plain, None),
            map(&[
                ("domain", text("d")),
                (
                    "descriptors",
                    MetaValue::List(vec![map(&[(
                        "entries",
                        MetaValue::List(vec![text("k=v")])
                    )])])
                ),
            ])
        );
    }

    #[test]
    fn override_text_leaves_zero_fields_out() {
        let text = |requests_per_unit, unit| {
            override_text(&LimitOverride {
                requests_per_unit,
                unit,
            })
        };
        use crate::descriptor::Unit;
        assert_eq!(text(7, Some(Unit::Hour)), "requests_per_unit:7 unit:HOUR");
        assert_eq!(text(0, Some(Unit::Second)), "unit:SECOND");
        assert_eq!(text(3, None), "requests_per_unit:3");
        assert_eq!(text(0, None), "");
    }

    #[test]
    fn merging_keeps_the_first_value_and_merges_maps() {
        let first = map(&[
            ("name", text("service_1")),
            ("nested", map(&[("a", text("1"))])),
            ("list", MetaValue::List(vec![text("x")])),
        ]);
        let second = map(&[
            ("name", text("service_2")),
            ("nested", map(&[("a", text("2")), ("b", text("3"))])),
            ("list", MetaValue::List(vec![text("y")])),
            ("other", MetaValue::Bool(true)),
        ]);
        assert_eq!(
            merge_metadata([&first, &second]),
            Some(map(&[
                ("name", text("service_1")),
                ("nested", map(&[("a", text("1")), ("b", text("3"))])),
                ("list", MetaValue::List(vec![text("x")])),
                ("other", MetaValue::Bool(true)),
            ]))
        );
        assert_eq!(merge_metadata([]), None);
        assert_eq!(merge_metadata([&map(&[])]), None);
    }
}
