//! The limiter's own rules, checked without a backend: request validation and counter identities.

use super::metadata::{dynamic_metadata, merge_metadata, override_text};
use super::*;
use crate::descriptor::{Descriptor, Entry, LimitOverride, Text};

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
                    domain: Text::default(),
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
        assert_eq!(dynamic_metadata(&request, merged, &[]), expected);

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
            dynamic_metadata(&plain, None, &[]),
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
