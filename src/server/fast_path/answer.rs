//! The `RateLimitResponse` of a decision, written by hand field by field into a slice.
//!
//! prost encodes a message by first asking its length, which asks the length of every nested
//! message, and then writes each nested message behind its length, which asks that length again:
//! an answer's limit and reset are measured three times and written once, through a call per
//! field. [`Writer`] writes the answer's usual shape in one pass: each status's nested lengths
//! are summed from a few integers just before the status is written. The bytes are prost's
//! (fields in tag order, proto3 defaults omitted, negative enums as ten-byte varints), which the
//! tests of [`super::wire`] check against prost for every decision.
//!
//! The writer takes each status and header as plain fields ([`StatusFields`], shared with the
//! conversion of a decision into the protobuf struct in `server::rls`), so the answer is written
//! from the limiter's decision with no protobuf structs between. Anything outside that shape
//! (dynamic metadata) is left to prost by the caller.

use prost::encoding::encoded_len_varint;

/// The tag of `RateLimitResponse.response_headers_to_add`.
pub const RESPONSE_HEADER: u8 = 3;

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

    /// One `HeaderValue` under `tag` ([`RESPONSE_HEADER`]).
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

    /// Numbers at every varint length boundary, negatives and the extremes (the numbers of the
    /// RLS request's and decision's tests in [`super::super::wire`]).
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
}
