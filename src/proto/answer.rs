//! `RateLimitResponse` written by hand: tollgate's answer to every decision (written from the
//! decision through [`Writer`]), and any `RateLimitResponse` a service on the generated stubs
//! answers (the benchmark's empty server), through [`encode`].
//!
//! prost encodes a message by first asking its length, which asks the length of every nested
//! message, and then writes each nested message behind its length, which asks that length again:
//! an answer's limit and reset are measured three times and written once, through a call per
//! field. This writes the answer's usual shape in one pass: each status's nested lengths are
//! summed from a few integers just before the status is written. The bytes are prost's (fields
//! in tag order, proto3 defaults omitted, negative enums as ten-byte varints), which the tests
//! check against prost on every field.
//!
//! Anything outside the usual shape (a body, dynamic metadata, a quota assignment) is left to
//! prost: [`encode`] then answers `None` having written nothing that counts.
//!
//! The [`Writer`] takes each status and header as plain fields, so the gRPC service writes its
//! answer from the limiter's decision through the same code, with no protobuf structs between.
//!
//! Every message is taken apart field by field, with no `..`: a field added to the vendored
//! protos does not compile here until this encoder writes it or leaves its message to prost.

#![warn(missing_docs, clippy::all)]

use prost::encoding::encoded_len_varint;
use prost_types::Duration;

use super::HeaderValue;
use super::RateLimitResponse;
use super::rate_limit_response::{DescriptorStatus, RateLimit};

/// Writes `answer` into the start of `out` and answers how many bytes it took, or `None` when
/// the answer has a field this encoder leaves to prost or does not fit in `out`.
pub fn encode(answer: &RateLimitResponse, out: &mut [u8]) -> Option<usize> {
    let RateLimitResponse {
        overall_code,
        statuses,
        response_headers_to_add,
        request_headers_to_add,
        raw_body,
        dynamic_metadata,
        quota,
    } = answer;
    if !raw_body.is_empty() || dynamic_metadata.is_some() || quota.is_some() {
        return None;
    }
    let mut w = Writer::new(out);
    w.overall_code(*overall_code)?;
    for status in statuses {
        w.status(status)?;
    }
    for header in response_headers_to_add {
        w.header(RESPONSE_HEADER, header)?;
    }
    for header in request_headers_to_add {
        w.header(REQUEST_HEADER, header)?;
    }
    Some(w.written())
}

/// The tag of `RateLimitResponse.response_headers_to_add`.
pub const RESPONSE_HEADER: u8 = 3;
/// The tag of `RateLimitResponse.request_headers_to_add`.
pub const REQUEST_HEADER: u8 = 4;

/// One `DescriptorStatus.current_limit`, as plain fields.
#[derive(Debug, Clone, Copy)]
pub struct LimitFields<'a> {
    /// `name`.
    pub name: &'a str,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`, the enum's number.
    pub unit: i32,
}

/// One `DescriptorStatus` of the usual shape (no quota), as plain fields.
#[derive(Debug, Clone, Copy)]
pub struct StatusFields<'a> {
    /// `code`, the enum's number.
    pub code: i32,
    /// `current_limit`.
    pub limit: Option<LimitFields<'a>>,
    /// `limit_remaining`.
    pub remaining: u32,
    /// `duration_until_reset`, as seconds and nanoseconds.
    pub reset: Option<(i64, i32)>,
}

/// A `RateLimitResponse` written field by field, in tag order, into the start of a slice; every
/// write answers `None` once the slice is full, where prost's own writers would panic on a full
/// slice. The caller writes the overall code, then the statuses, then the headers.
#[derive(Debug)]
pub struct Writer<'a> {
    out: &'a mut [u8],
    at: usize,
}

/// Wire type of varint fields.
const VARINT: u8 = 0;
/// Wire type of length-delimited fields (strings, bytes, messages).
const DELIMITED: u8 = 2;

impl<'a> Writer<'a> {
    /// A writer at the start of `out`.
    pub fn new(out: &'a mut [u8]) -> Self {
        Writer { out, at: 0 }
    }

    /// The bytes written so far.
    pub fn written(&self) -> usize {
        self.at
    }

    /// `overall_code`, the enum's number.
    pub fn overall_code(&mut self, code: i32) -> Option<()> {
        self.enumeration(1, code)
    }

    fn byte(&mut self, byte: u8) -> Option<()> {
        *self.out.get_mut(self.at)? = byte;
        self.at += 1;
        Some(())
    }

    fn varint(&mut self, mut value: u64) -> Option<()> {
        while value >= 0x80 {
            self.byte((value as u8) | 0x80)?;
            value >>= 7;
        }
        self.byte(value as u8)
    }

    /// A field's key. Every field written here has a tag below 16, so the key is one byte.
    fn key(&mut self, tag: u8, wire: u8) -> Option<()> {
        self.byte((tag << 3) | wire)
    }

    fn uint(&mut self, tag: u8, value: u64) -> Option<()> {
        if value == 0 {
            return Some(());
        }
        self.key(tag, VARINT)?;
        self.varint(value)
    }

    /// An `int32` or enum field: a negative value is sign-extended to ten bytes, as protobuf
    /// says and prost does.
    fn enumeration(&mut self, tag: u8, value: i32) -> Option<()> {
        self.uint(tag, i64::from(value) as u64)
    }

    fn bytes(&mut self, tag: u8, value: &[u8]) -> Option<()> {
        if value.is_empty() {
            return Some(());
        }
        self.key(tag, DELIMITED)?;
        self.varint(value.len() as u64)?;
        let end = self.at.checked_add(value.len())?;
        self.out.get_mut(self.at..end)?.copy_from_slice(value);
        self.at = end;
        Some(())
    }

    /// The key and length of a nested message, which the caller writes next.
    fn nested(&mut self, tag: u8, len: usize) -> Option<()> {
        self.key(tag, DELIMITED)?;
        self.varint(len as u64)
    }

    fn status(&mut self, status: &DescriptorStatus) -> Option<()> {
        let DescriptorStatus {
            code,
            current_limit,
            limit_remaining,
            duration_until_reset,
            quota,
        } = status;
        if quota.is_some() {
            return None;
        }
        self.status_fields(StatusFields {
            code: *code,
            limit: current_limit.as_ref().map(
                |RateLimit {
                     name,
                     requests_per_unit,
                     unit,
                 }| LimitFields {
                    name,
                    requests_per_unit: *requests_per_unit,
                    unit: *unit,
                },
            ),
            remaining: *limit_remaining,
            reset: duration_until_reset
                .as_ref()
                .map(|Duration { seconds, nanos }| (*seconds, *nanos)),
        })
    }

    /// One entry of `statuses`.
    pub fn status_fields(&mut self, status: StatusFields<'_>) -> Option<()> {
        let StatusFields {
            code,
            limit,
            remaining,
            reset,
        } = status;
        let limit_len = limit.as_ref().map(limit_len);
        let reset_len = reset.map(duration_len);
        let len = enumeration_len(code)
            + limit_len.map_or(0, nested_len)
            + uint_len(u64::from(remaining))
            + reset_len.map_or(0, nested_len);
        self.nested(2, len)?;
        self.enumeration(1, code)?;
        if let (Some(limit), Some(len)) = (limit, limit_len) {
            self.nested(2, len)?;
            self.uint(1, u64::from(limit.requests_per_unit))?;
            self.enumeration(2, limit.unit)?;
            self.bytes(3, limit.name.as_bytes())?;
        }
        self.uint(3, u64::from(remaining))?;
        if let (Some((seconds, nanos)), Some(len)) = (reset, reset_len) {
            self.nested(4, len)?;
            self.uint(1, seconds as u64)?;
            self.enumeration(2, nanos)?;
        }
        Some(())
    }

    fn header(&mut self, tag: u8, header: &HeaderValue) -> Option<()> {
        let HeaderValue {
            key,
            value,
            raw_value,
        } = header;
        self.header_fields(tag, key.as_bytes(), value.as_bytes(), raw_value)
    }

    /// One `HeaderValue` under `tag` ([`RESPONSE_HEADER`] or [`REQUEST_HEADER`]).
    pub fn header_fields(
        &mut self,
        tag: u8,
        key: &[u8],
        value: &[u8],
        raw_value: &[u8],
    ) -> Option<()> {
        let len = bytes_len(key.len()) + bytes_len(value.len()) + bytes_len(raw_value.len());
        self.nested(tag, len)?;
        self.bytes(1, key)?;
        self.bytes(2, value)?;
        self.bytes(3, raw_value)
    }
}

/// Bytes of a varint field of `value` (nothing when it is 0).
fn uint_len(value: u64) -> usize {
    if value == 0 {
        0
    } else {
        1 + encoded_len_varint(value)
    }
}

fn enumeration_len(value: i32) -> usize {
    uint_len(i64::from(value) as u64)
}

/// Bytes of a string or bytes field `len` long (nothing when empty).
fn bytes_len(len: usize) -> usize {
    if len == 0 {
        0
    } else {
        1 + encoded_len_varint(len as u64) + len
    }
}

/// Bytes of a nested message field whose message is `len` long (written even when empty).
fn nested_len(len: usize) -> usize {
    1 + encoded_len_varint(len as u64) + len
}

fn limit_len(limit: &LimitFields<'_>) -> usize {
    uint_len(u64::from(limit.requests_per_unit))
        + enumeration_len(limit.unit)
        + bytes_len(limit.name.len())
}

fn duration_len((seconds, nanos): (i64, i32)) -> usize {
    uint_len(seconds as u64) + enumeration_len(nanos)
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;
    use prost::Message;

    use super::*;
    use crate::proto::rate_limit_response::Quota;

    /// Numbers at every varint length boundary, negatives and the extremes (also the numbers of
    /// the RLS request's and decision's tests in `server::wire`).
    pub(crate) fn edge_i64() -> impl Strategy<Value = i64> {
        prop_oneof![
            Just(0i64),
            Just(1),
            Just(127),
            Just(128),
            Just(16_383),
            Just(16_384),
            Just(i64::from(u32::MAX)),
            Just(i64::MAX),
            Just(-1),
            Just(i64::MIN),
            any::<i64>(),
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![Just(String::new()), "[a-z-]{1,8}", "[a-z]{120,140}"]
    }

    fn header() -> impl Strategy<Value = HeaderValue> {
        (text(), text(), prop::collection::vec(any::<u8>(), 0..3)).prop_map(
            |(key, value, raw_value)| HeaderValue {
                key,
                value,
                raw_value,
            },
        )
    }

    fn status() -> impl Strategy<Value = DescriptorStatus> {
        (
            edge_i64(),
            prop::option::of((edge_i64(), edge_i64(), text())),
            edge_i64(),
            prop::option::of((edge_i64(), edge_i64())),
        )
            .prop_map(|(code, limit, remaining, reset)| DescriptorStatus {
                code: code as i32,
                current_limit: limit.map(|(per_unit, unit, name)| RateLimit {
                    name,
                    requests_per_unit: per_unit as u32,
                    unit: unit as i32,
                }),
                limit_remaining: remaining as u32,
                duration_until_reset: reset.map(|(seconds, nanos)| Duration {
                    seconds,
                    nanos: nanos as i32,
                }),
                quota: None,
            })
    }

    fn answer() -> impl Strategy<Value = RateLimitResponse> {
        (
            edge_i64(),
            prop::collection::vec(status(), 0..5),
            prop::collection::vec(header(), 0..3),
            prop::collection::vec(header(), 0..2),
        )
            .prop_map(|(code, statuses, response, request)| RateLimitResponse {
                overall_code: code as i32,
                statuses,
                response_headers_to_add: response,
                request_headers_to_add: request,
                ..RateLimitResponse::default()
            })
    }

    proptest! {
        /// Every answer of the usual shape comes out as prost writes it, and an output too small
        /// for it is refused rather than cut short.
        #[test]
        fn writes_what_prost_writes(answer in answer()) {
            writes_exactly(&answer.encode_to_vec(), |out| encode(&answer, out))?;
        }
    }

    /// Checks that `write` puts `expected` at the start of a large output, and refuses an
    /// output one byte too small rather than cutting the message short.
    pub(crate) fn writes_exactly(
        expected: &[u8],
        write: impl Fn(&mut [u8]) -> Option<usize>,
    ) -> Result<(), TestCaseError> {
        let mut out = vec![0u8; 8192];
        let written = write(&mut out);
        prop_assert_eq!(written.map(|n| &out[..n]), Some(expected));
        if !expected.is_empty() {
            let mut short = vec![0u8; expected.len() - 1];
            prop_assert_eq!(write(&mut short), None);
        }
        Ok(())
    }

    #[test]
    fn leaves_the_rest_to_prost() {
        let mut out = [0u8; 256];
        let body = RateLimitResponse {
            raw_body: b"denied".to_vec(),
            ..RateLimitResponse::default()
        };
        assert_eq!(encode(&body, &mut out), None);
        let metadata = RateLimitResponse {
            dynamic_metadata: Some(prost_types::Struct::default()),
            ..RateLimitResponse::default()
        };
        assert_eq!(encode(&metadata, &mut out), None);
        let quota = RateLimitResponse {
            statuses: vec![DescriptorStatus {
                quota: Some(Quota::default()),
                ..DescriptorStatus::default()
            }],
            ..RateLimitResponse::default()
        };
        assert_eq!(encode(&quota, &mut out), None);
        assert_eq!(encode(&RateLimitResponse::default(), &mut out), Some(0));
    }
}
