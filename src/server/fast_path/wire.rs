//! The `ShouldRateLimit` call's two messages, read and written between protobuf bytes and the
//! limiter's own types: the request is decoded straight into a [`Request`], and the answer is
//! written straight from the [`Decision`].
//!
//! The generated structs were built only to be taken apart again: every call decoded a
//! `RateLimitRequest`, converted it into the limiter's request (a new list per descriptor),
//! converted the decision into a `RateLimitResponse` (a list of statuses, a copy of each
//! limit's name) and encoded that. What is read and written here is what the generated code
//! reads and writes: the tests decode every request (damaged ones and arbitrary bytes too) both
//! here and through the generated code and compare, error messages included, and compare every
//! answer written here with prost's bytes for the response the `/json` path builds.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, decode_varint, int32, merge_loop,
    skip_field, string, uint32, uint64,
};
use prost::{DecodeError, EncodeError};

use super::answer::{self, Writer};
use crate::descriptor::{Descriptor, Entry, LimitOverride, Request, Text};
use crate::limiter::Decision;
use crate::server::rls::{code_to_proto, response_to_proto, status_fields, unit_from_proto};

/// The largest answer written on the stack first (an answer with several statuses fits).
const STACK_ENCODE_BYTES: usize = 512;

/// Appends `decision` to `dst` as a `RateLimitResponse`: by [`write_decision`] through a buffer
/// on the stack, or, for an answer that does not fit there or carries dynamic metadata, through
/// the generated struct and prost.
pub fn encode_decision(decision: Decision, dst: &mut impl BufMut) -> Result<(), EncodeError> {
    if put_via_stack(dst, |stack| write_decision(&decision, stack)) {
        return Ok(());
    }
    response_to_proto(decision).encode(dst)
}

/// Lets `write` fill a buffer on the stack and answer how many bytes it wrote, then copies them
/// into `dst` in one piece. `false`, with nothing put in `dst`, when `write` answers `None` (the
/// message does not fit, or is not of the shape `write` knows).
///
/// prost writes a message a field at a time, and the frame's growable buffer checks its
/// capacity on each write; a plain slice takes each write as a store.
fn put_via_stack(dst: &mut impl BufMut, write: impl FnOnce(&mut [u8]) -> Option<usize>) -> bool {
    let mut stack = [0u8; STACK_ENCODE_BYTES];
    match write(&mut stack).and_then(|written| stack.get(..written)) {
        Some(bytes) => {
            dst.put_slice(bytes);
            true
        }
        None => false,
    }
}

/// Writes `decision` as a `RateLimitResponse` into the start of `out` and answers how many
/// bytes it took, or `None` when it carries dynamic metadata (left to prost) or does not fit.
pub fn write_decision(decision: &Decision, out: &mut [u8]) -> Option<usize> {
    // Taken apart with no `..`: a field added to the decision does not compile here until it is
    // written or said to have no place in the answer.
    let Decision {
        overall,
        statuses,
        response_headers,
        dynamic_metadata,
        reports: _,
        shadowed: _,
    } = decision;
    if dynamic_metadata.is_some() {
        return None;
    }
    let mut w = Writer::new(out);
    w.overall_code(code_to_proto(*overall) as i32)?;
    for status in statuses {
        w.status_fields(status_fields(status))?;
    }
    for (key, value) in response_headers {
        w.header_fields(
            answer::RESPONSE_HEADER,
            key.as_bytes(),
            value.as_bytes(),
            &[],
        )?;
    }
    Some(w.written())
}

/// The messages' names and fields, as prost's errors name them.
const REQUEST: &str = "RateLimitRequest";
const DESCRIPTOR: &str = "RateLimitDescriptor";
const ENTRY: &str = "Entry";
const OVERRIDE: &str = "RateLimitOverride";

/// Names the field a decoding error came from, as the generated code does.
fn at(message: &'static str, field: &'static str) -> impl FnOnce(DecodeError) -> DecodeError {
    move |mut error| {
        error.push(message, field);
        error
    }
}

/// Decodes a whole `RateLimitRequest` (`domain` = 1, `descriptors` = 2, `hits_addend` = 3),
/// read as one slice.
///
/// Unknown fields are skipped, a repeated scalar's last value wins and a nested message seen
/// twice is merged, as protobuf says. One difference from generated code: a nested message's
/// unknown fields are skipped with the whole recursion budget (prost does not let code outside
/// it spend from the budget), so a group nested 98 to 100 deep inside a descriptor is skipped
/// where prost would refuse it.
pub fn decode_request(buf: &mut &[u8]) -> Result<Request, DecodeError> {
    let mut request = Request::default();
    let ctx = DecodeContext::default();
    while buf.has_remaining() {
        let (tag, wire_type) = decode_key(buf)?;
        match tag {
            1 => merge_text(wire_type, &mut request.domain, buf).map_err(at(REQUEST, "domain"))?,
            2 => {
                let mut descriptor = Descriptor::default();
                nested(wire_type, &mut descriptor, buf, descriptor_field)
                    .map_err(at(REQUEST, "descriptors"))?;
                request.descriptors.push(descriptor);
            }
            3 => uint32::merge(wire_type, &mut request.hits_addend, buf, ctx.clone())
                .map_err(at(REQUEST, "hits_addend"))?,
            _ => skip_field(wire_type, tag, buf, ctx.clone())?,
        }
    }
    Ok(request)
}

/// Reads a string field into `value`, as prost's `string::merge` reads one into a `String`: the
/// last occurrence wins, and a field cut short or not UTF-8 is refused with prost's own error.
/// The text is taken straight from the slice; short text is kept inline ([`Text`]), with no
/// allocation.
fn merge_text(wire_type: WireType, value: &mut Text, buf: &mut &[u8]) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    let mut rest = *buf;
    let length = decode_varint(&mut rest)?;
    if let Some(length) = usize::try_from(length)
        .ok()
        .filter(|&length| length <= rest.len())
        && let Ok(text) = std::str::from_utf8(&rest[..length])
    {
        *value = Text::new(text);
        *buf = &rest[length..];
        return Ok(());
    }
    // Cut short or not UTF-8: prost reads the same bytes, for the error generated code gives.
    let mut read = String::new();
    string::merge(wire_type, &mut read, buf, DecodeContext::default())?;
    *value = Text::from(read);
    Ok(())
}

/// Reads a length-delimited message into `value`, one field at a time by `field`.
fn nested<T>(
    wire_type: WireType,
    value: &mut T,
    buf: &mut &[u8],
    mut field: impl FnMut(&mut T, u32, WireType, &mut &[u8]) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    check_wire_type(WireType::LengthDelimited, wire_type)?;
    merge_loop(value, buf, DecodeContext::default(), |value, buf, _| {
        let (tag, wire_type) = decode_key(buf)?;
        field(value, tag, wire_type, buf)
    })
}

/// One field of a `RateLimitDescriptor` (`entries` = 1, `limit` = 2, `hits_addend` = 3, a
/// `google.protobuf.UInt64Value`).
fn descriptor_field(
    descriptor: &mut Descriptor,
    tag: u32,
    wire_type: WireType,
    buf: &mut &[u8],
) -> Result<(), DecodeError> {
    let ctx = DecodeContext::default();
    match tag {
        1 => {
            let mut entry = Entry {
                key: Text::default(),
                value: Text::default(),
            };
            nested(wire_type, &mut entry, buf, entry_field).map_err(at(DESCRIPTOR, "entries"))?;
            descriptor.entries.push(entry);
            Ok(())
        }
        2 => {
            let limit = descriptor.limit.get_or_insert(LimitOverride {
                requests_per_unit: 0,
                unit: None,
            });
            nested(wire_type, limit, buf, override_field).map_err(at(DESCRIPTOR, "limit"))
        }
        3 => {
            let hits = descriptor.hits_addend.get_or_insert(0);
            nested(wire_type, hits, buf, |hits, tag, wire_type, buf| {
                if tag == 1 {
                    uint64::merge(wire_type, hits, buf, ctx.clone())
                } else {
                    skip_field(wire_type, tag, buf, ctx.clone())
                }
            })
            .map_err(at(DESCRIPTOR, "hits_addend"))
        }
        _ => skip_field(wire_type, tag, buf, ctx),
    }
}

/// One field of an `Entry` (`key` = 1, `value` = 2).
fn entry_field(
    entry: &mut Entry,
    tag: u32,
    wire_type: WireType,
    buf: &mut &[u8],
) -> Result<(), DecodeError> {
    let ctx = DecodeContext::default();
    match tag {
        1 => merge_text(wire_type, &mut entry.key, buf).map_err(at(ENTRY, "key")),
        2 => merge_text(wire_type, &mut entry.value, buf).map_err(at(ENTRY, "value")),
        _ => skip_field(wire_type, tag, buf, ctx),
    }
}

/// One field of a `RateLimitOverride` (`requests_per_unit` = 1, `unit` = 2). A unit this
/// protocol does not name reads as none, as UNKNOWN does.
fn override_field(
    limit: &mut LimitOverride,
    tag: u32,
    wire_type: WireType,
    buf: &mut &[u8],
) -> Result<(), DecodeError> {
    let ctx = DecodeContext::default();
    match tag {
        1 => uint32::merge(wire_type, &mut limit.requests_per_unit, buf, ctx)
            .map_err(at(OVERRIDE, "requests_per_unit")),
        2 => {
            let mut unit = 0;
            int32::merge(wire_type, &mut unit, buf, ctx).map_err(at(OVERRIDE, "unit"))?;
            limit.unit = unit_from_proto(unit);
            Ok(())
        }
        _ => skip_field(wire_type, tag, buf, ctx),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::config::{Limit, MetaValue};
    use crate::descriptor::Unit;
    use crate::limiter::{Code, Status};
    use crate::proto::RateLimitRequest;
    use crate::proto::rate_limit_descriptor::{Entry as ProtoEntry, RateLimitOverride};
    use crate::proto::{RateLimitDescriptor, RateLimitResponse};
    use crate::server::fast_path::answer::tests::{edge_i64, writes_exactly};
    use crate::server::rls::request_from_proto;

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[a-z_.]{1,8}",
            // Either side of the longest text kept inline (23 bytes).
            "[a-z]{21,26}",
            "[a-z]{120,140}",
            "\\PC{0,4}"
        ]
    }

    /// Every varint length boundary and the extremes, as unsigned numbers.
    fn number() -> impl Strategy<Value = u64> {
        edge_i64().prop_map(|n| n as u64)
    }

    fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
        (
            prop::collection::vec((text(), text()), 0..4),
            prop::option::of((number(), -2i32..9)),
            prop::option::of(number()),
        )
            .prop_map(|(entries, limit, hits)| RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| ProtoEntry { key, value })
                    .collect(),
                limit: limit.map(|(requests, unit)| RateLimitOverride {
                    requests_per_unit: requests as u32,
                    unit,
                }),
                hits_addend: hits,
            })
    }

    fn request() -> impl Strategy<Value = RateLimitRequest> {
        (text(), prop::collection::vec(descriptor(), 0..4), number()).prop_map(
            |(domain, descriptors, hits)| RateLimitRequest {
                domain,
                descriptors,
                hits_addend: hits as u32,
            },
        )
    }

    /// What the generated code makes of `bytes`, converted as the `/json` path converts it.
    fn generated(mut bytes: &[u8]) -> Result<Request, String> {
        RateLimitRequest::decode(&mut bytes)
            .map(request_from_proto)
            .map_err(|error| error.to_string())
    }

    fn direct(mut bytes: &[u8]) -> Result<Request, String> {
        decode_request(&mut bytes).map_err(|error| error.to_string())
    }

    fn limit(name: Option<String>, requests: u32, unit: Option<Unit>) -> Arc<Limit> {
        Arc::new(Limit {
            name,
            unit,
            ..Limit::plain("edge.user".into(), requests, Unit::Minute)
        })
    }

    fn unit() -> impl Strategy<Value = Option<Unit>> {
        prop_oneof![
            Just(None),
            Just(Some(Unit::Second)),
            Just(Some(Unit::Minute)),
            Just(Some(Unit::Hour)),
            Just(Some(Unit::Day)),
            Just(Some(Unit::Week)),
            Just(Some(Unit::Month)),
            Just(Some(Unit::Year)),
        ]
    }

    fn code() -> impl Strategy<Value = Code> {
        prop_oneof![Just(Code::Ok), Just(Code::OverLimit)]
    }

    fn status() -> impl Strategy<Value = Status> {
        (
            code(),
            prop::option::of((prop::option::of(text()), number(), unit())),
            number(),
            prop::option::of(number()),
        )
            .prop_map(|(code, applied, remaining, reset)| Status {
                code,
                limit: applied.map(|(name, requests, unit)| limit(name, requests as u32, unit)),
                remaining: remaining as u32,
                reset: reset.map(Duration::from_secs),
            })
    }

    fn decision() -> impl Strategy<Value = Decision> {
        (
            code(),
            prop::collection::vec(status(), 0..5),
            prop::collection::vec((text(), text()), 0..3),
            any::<bool>(),
        )
            .prop_map(|(overall, statuses, response_headers, shadowed)| Decision {
                overall,
                statuses,
                response_headers,
                dynamic_metadata: None,
                reports: Vec::new(),
                shadowed,
            })
    }

    proptest! {
        /// Every request decodes as the generated code decodes it and the server converts it.
        #[test]
        fn decodes_what_the_generated_code_decodes(request in request()) {
            let bytes = request.encode_to_vec();
            prop_assert_eq!(direct(&bytes), generated(&bytes));
        }

        /// Cut short, or with a byte changed, a request fails (or not) exactly as it does in
        /// the generated code, with the same error.
        #[test]
        fn damaged_requests_fail_alike(
            request in request(),
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            let bytes = request.encode_to_vec();
            if !bytes.is_empty() {
                let short = &bytes[..cut.index(bytes.len())];
                prop_assert_eq!(direct(short), generated(short));
                let mut changed = bytes.clone();
                changed[flip.index(bytes.len())] = byte;
                prop_assert_eq!(direct(&changed), generated(&changed));
            }
        }

        /// Arbitrary bytes decode, or fail, as in the generated code.
        #[test]
        fn arbitrary_bytes_decode_alike(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(direct(&bytes), generated(&bytes));
        }

        /// Every decision is written as prost writes the response the `/json` path builds from
        /// it, and an output too small for it is refused rather than cut short.
        #[test]
        fn writes_what_prost_writes_of_the_converted_decision(decision in decision()) {
            let expected = response_to_proto(decision.clone()).encode_to_vec();
            writes_exactly(&expected, |out| write_decision(&decision, out))?;
        }
    }

    #[test]
    fn a_text_field_seen_twice_keeps_the_last() {
        // The domain twice (long, then short) and an entry's value twice (short, then long,
        // past what is kept inline), as a client may concatenate two encoded messages.
        let long = "v".repeat(40);
        let first = RateLimitRequest {
            domain: "d".repeat(30),
            descriptors: Vec::new(),
            hits_addend: 0,
        };
        let second = RateLimitRequest {
            domain: "edge".into(),
            ..first.clone()
        };
        let mut bytes = first.encode_to_vec();
        bytes.extend(second.encode_to_vec());
        let mut entry = ProtoEntry {
            key: "user".into(),
            value: "alice".into(),
        }
        .encode_to_vec();
        entry.extend([0x12, 40]);
        entry.extend(long.as_bytes());
        bytes.extend([0x12, entry.len() as u8 + 2, 0x0a, entry.len() as u8]);
        bytes.extend(&entry);
        let decoded = direct(&bytes).expect("decodes");
        assert_eq!(decoded.domain, "edge");
        assert_eq!(decoded.descriptors[0].entries[0].value, long.as_str());
        assert_eq!(Ok(decoded), generated(&bytes));
    }

    #[test]
    fn unknown_fields_are_skipped_at_every_level() {
        // A request with an unknown field (15, a string) at the top, in a descriptor, in an
        // entry and in an override, beside the known ones.
        let mut entry = ProtoEntry {
            key: "user".into(),
            value: "alice".into(),
        }
        .encode_to_vec();
        entry.extend([0x7a, 1, b'x']);
        let mut limit = RateLimitOverride {
            requests_per_unit: 5,
            unit: 2,
        }
        .encode_to_vec();
        limit.extend([0x7a, 1, b'y']);
        let mut descriptor = vec![0x0a, entry.len() as u8];
        descriptor.extend(&entry);
        descriptor.extend([0x12, limit.len() as u8]);
        descriptor.extend(&limit);
        descriptor.extend([0x7a, 1, b'z']);
        let mut bytes = vec![0x0a, 4];
        bytes.extend(b"edge");
        bytes.extend([0x12, descriptor.len() as u8]);
        bytes.extend(&descriptor);
        bytes.extend([0x7a, 1, b'w']);
        let request = direct(&bytes).unwrap();
        assert_eq!(Ok(request.clone()), generated(&bytes));
        assert_eq!(request.domain, "edge");
        assert_eq!(
            request.descriptors[0].entries,
            vec![Entry::new("user", "alice")]
        );
        assert_eq!(
            request.descriptors[0].limit,
            Some(LimitOverride {
                requests_per_unit: 5,
                unit: Some(Unit::Minute)
            })
        );
    }

    #[test]
    fn an_answer_too_large_for_the_stack_is_left_to_prost() {
        let status = Status {
            code: Code::Ok,
            limit: Some(limit(Some("per user".into()), 1_000_000, Some(Unit::Hour))),
            remaining: 999_999,
            reset: Some(Duration::from_secs(3_600)),
        };
        let decision = Decision {
            overall: Code::Ok,
            statuses: vec![status; 40],
            response_headers: Vec::new(),
            dynamic_metadata: None,
            reports: Vec::new(),
            shadowed: false,
        };
        let expected = response_to_proto(decision.clone()).encode_to_vec();
        assert!(expected.len() > 512, "{} bytes", expected.len());
        let mut dst = prost::bytes::BytesMut::from(&b"prefix"[..]);
        encode_decision(decision, &mut dst).unwrap();
        assert_eq!(&dst[..6], b"prefix");
        assert_eq!(&dst[6..], &expected[..]);
    }

    #[test]
    fn an_answer_with_dynamic_metadata_is_left_to_prost() {
        let decision = Decision {
            overall: Code::Ok,
            statuses: Vec::new(),
            response_headers: Vec::new(),
            dynamic_metadata: Some(MetaValue::Map(vec![(
                "domain".into(),
                MetaValue::String("edge".into()),
            )])),
            reports: Vec::new(),
            shadowed: false,
        };
        let mut out = [0u8; 256];
        assert_eq!(write_decision(&decision, &mut out), None);
        let mut dst = prost::bytes::BytesMut::new();
        let expected = response_to_proto(decision.clone());
        assert!(expected.dynamic_metadata.is_some());
        encode_decision(decision, &mut dst).unwrap();
        assert_eq!(RateLimitResponse::decode(&dst[..]).unwrap(), expected);
    }
}
