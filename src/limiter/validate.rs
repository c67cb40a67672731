//! The protocol rules a request must keep before anything is counted.

use super::LimiterError;
use crate::descriptor::Request;

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest key or value, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

/// Checks `request` against the protocol rules; the error says which rule and where.
pub fn request(request: &Request) -> Result<(), LimiterError> {
    let invalid = |message: String| Err(LimiterError::InvalidArgument(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > MAX_TEXT_BYTES {
        return invalid(format!(
            "domain is {} bytes long; at most {MAX_TEXT_BYTES} are allowed",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "{} descriptors in one request; at most {MAX_DESCRIPTORS} are allowed",
            request.descriptors.len()
        ));
    }
    for (d, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() {
            return invalid(format!("descriptor {d} has no entries"));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptor {d} has {} entries; at most {MAX_ENTRIES} are allowed",
                descriptor.entries.len()
            ));
        }
        for (e, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return invalid(format!("descriptor {d} entry {e} has an empty key"));
            }
            if entry.key.len() > MAX_TEXT_BYTES || entry.value.len() > MAX_TEXT_BYTES {
                return invalid(format!(
                    "descriptor {d} entry {e} is longer than {MAX_TEXT_BYTES} bytes (key or value)"
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::descriptor::{Descriptor, Entry};

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
        assert_eq!(request(&r), Ok(()));
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
            (request_with(vec![descriptor(vec![])]), "has no entries"),
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
            match request(&req) {
                Err(LimiterError::InvalidArgument(m)) => {
                    assert!(m.contains(expected), "{m:?} should mention {expected:?}")
                }
                other => panic!("expected an error mentioning {expected:?}, got {other:?}"),
            }
        }
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
        assert_eq!(request(&r), Ok(()));
    }
}
