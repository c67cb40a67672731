//! The protobuf codec of every gRPC service and client generated here: prost reading each
//! message from the slice tonic hands over, buffers sized for rate-limit messages, and an
//! encoder that writes small messages on the stack first.

#![warn(missing_docs, clippy::all)]

use std::any::Any;
use std::marker::PhantomData;

use prost::bytes::{Buf, BufMut};
use prost::{DecodeError, EncodeError, Message};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

use super::{RateLimitResponse, answer};

/// The buffer each call starts with to decode its request and to encode its answer. tonic's
/// default is 8 KiB each way per call, two allocations too large for the allocator's per-thread
/// caches on every decision, where a request or an answer is a few hundred bytes. A larger
/// message (an xDS push) grows the buffer at once to the length its gRPC prefix announces (no
/// compression is built in, which would grow it in steps of this size instead).
pub const BUFFER_BYTES: usize = 512;

/// Work encoded before a streaming call yields to the runtime: tonic's default.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// The largest message encoded on the stack first (an answer with several statuses fits).
const STACK_ENCODE_BYTES: usize = 512;

/// [`SliceDecoder`] and [`StackEncoder`], with [`BUFFER_BYTES`] buffers; the generated stubs
/// create one per call.
#[derive(Debug, Clone)]
pub struct Protobuf<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Protobuf<T, U> {
    fn default() -> Self {
        Protobuf(PhantomData)
    }
}

/// The buffer settings of every codec here: [`BUFFER_BYTES`] each way, tonic's yield threshold.
pub fn buffers() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for Protobuf<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = StackEncoder<T>;
    type Decoder = SliceDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        StackEncoder(PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        SliceDecoder(PhantomData)
    }
}

/// Decodes a message with prost from the bytes tonic hands over as one slice
/// ([`read_contiguous`]); a malformed message is [`decode_failed`].
#[derive(Debug)]
pub struct SliceDecoder<U>(PhantomData<U>);

impl<U: Message + Default> Decoder for SliceDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        read_contiguous(src, |bytes| U::decode(bytes))
            .map(Some)
            .map_err(decode_failed)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffers()
    }
}

/// Reads the whole message in `src` with `read`, as a plain slice, and consumes it.
///
/// tonic hands over a message in one contiguous buffer. Read as a slice, each varint and string
/// costs a bounds check and a pointer bump; read through [`DecodeBuf`], each step went through
/// the shared buffer's own bookkeeping: a third of the instructions of reading a rate-limit
/// request. A message in pieces, which tonic does not hand over, is copied into one first.
pub fn read_contiguous<T>(src: &mut DecodeBuf<'_>, read: impl FnOnce(&mut &[u8]) -> T) -> T {
    let whole = src.remaining();
    if src.chunk().len() == whole {
        let read = read(&mut src.chunk());
        src.advance(whole);
        read
    } else {
        let message = src.copy_to_bytes(whole);
        read(&mut message.as_ref())
    }
}

/// Encodes a message into a buffer on the stack, then copies it into tonic's in one piece
/// (the rate-limit answer by [`answer::encode`], the rest by prost).
///
/// prost writes a message a field at a time, a tag and a varint per call, and tonic's buffer
/// checks its capacity on each: an answer of one status took two dozen such calls. A plain
/// slice takes each write as a store. A message larger than `STACK_ENCODE_BYTES` (512 bytes)
/// is refused by the slice before anything is written (prost checks the length first) and is
/// encoded into tonic's buffer directly, as tonic's own encoder does.
#[derive(Debug)]
pub struct StackEncoder<T>(PhantomData<T>);

impl<T: Message + 'static> Encoder for StackEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        encode_via_stack(&item, dst).map_err(encode_failed)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffers()
    }
}

/// The status of a message that could not be encoded, for every encoder here.
pub fn encode_failed(error: EncodeError) -> Status {
    Status::internal(format!("encoding the message: {error}"))
}

/// The status of a message that could not be decoded, for every decoder here: `INTERNAL` with
/// prost's words, as tonic's own prost decoder answers.
pub fn decode_failed(error: DecodeError) -> Status {
    Status::internal(error.to_string())
}

/// Encodes `item` into `dst`, through a slice on the stack when it fits there. A
/// `RateLimitResponse` (answered by a service on the generated stubs, such as the benchmark's
/// empty server; tollgate's own service writes its answer from the decision) is written by
/// [`answer::encode`] when it can be.
fn encode_via_stack<T: Message + 'static>(
    item: &T,
    dst: &mut impl BufMut,
) -> Result<(), EncodeError> {
    // The type is known when the encoder is compiled, so this test costs nothing at run time.
    if let Some(answer) = (item as &dyn Any).downcast_ref::<RateLimitResponse>()
        && put_via_stack(dst, |stack| answer::encode(answer, stack))
    {
        return Ok(());
    }
    let written = put_via_stack(dst, |stack| {
        let mut free = &mut stack[..];
        item.encode(&mut free).ok()?;
        Some(STACK_ENCODE_BYTES - free.len())
    });
    if written {
        return Ok(());
    }
    // tonic's buffer grows to whatever the message needs, so this does not run out of room.
    item.encode(dst)
}

/// Lets `write` fill a buffer on the stack and answer how many bytes it wrote, then copies them
/// into `dst` in one piece. `false`, with nothing put in `dst`, when `write` answers `None` (the
/// message does not fit, or is not of the shape `write` knows).
pub fn put_via_stack(
    dst: &mut impl BufMut,
    write: impl FnOnce(&mut [u8]) -> Option<usize>,
) -> bool {
    let mut stack = [0u8; STACK_ENCODE_BYTES];
    match write(&mut stack).and_then(|written| stack.get(..written)) {
        Some(bytes) => {
            dst.put_slice(bytes);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use prost::bytes::BytesMut;

    use super::*;
    use crate::proto::RateLimitResponse;
    use crate::proto::rate_limit_response::{Code, DescriptorStatus, RateLimit};

    fn answer(statuses: usize) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: Code::OverLimit as i32,
            statuses: (0..statuses)
                .map(|i| DescriptorStatus {
                    code: Code::Ok as i32,
                    current_limit: Some(RateLimit {
                        name: format!("limit {i}"),
                        requests_per_unit: 1_000_000 + i as u32,
                        unit: 2,
                    }),
                    limit_remaining: 999_999,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn writes_what_prost_writes_on_either_side_of_the_stack_buffer() {
        for statuses in [0, 1, 4, 40] {
            let message = answer(statuses);
            let expected = message.encode_to_vec();
            assert_eq!(
                expected.len() > STACK_ENCODE_BYTES,
                statuses == 40,
                "the cases should cover both paths ({statuses} statuses: {} bytes)",
                expected.len()
            );
            let mut dst = BytesMut::from(&b"prefix"[..]);
            encode_via_stack(&message, &mut dst).unwrap();
            assert_eq!(&dst[..6], b"prefix");
            assert_eq!(&dst[6..], &expected[..], "{statuses} statuses");
        }
    }
}
