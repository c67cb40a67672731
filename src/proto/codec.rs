//! The protobuf codec of every gRPC service and client generated here: tonic's prost codec with
//! buffers sized for rate-limit messages.

#![warn(missing_docs, clippy::all)]

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::{ProstCodec, ProstDecoder, ProstEncoder};

/// The buffer each call starts with to decode its request and to encode its answer. tonic's
/// default is 8 KiB each way per call, two allocations too large for the allocator's per-thread
/// caches on every decision, where a request or an answer is a few hundred bytes. A larger
/// message (an xDS push) grows the buffer at once to the length its gRPC prefix announces (no
/// compression is built in, which would grow it in steps of this size instead).
pub const BUFFER_BYTES: usize = 512;

/// Work encoded before a streaming call yields to the runtime: tonic's default.
const YIELD_THRESHOLD: usize = 32 * 1024;

/// [`ProstCodec`] with [`BUFFER_BYTES`] buffers; the generated stubs create one per call.
#[derive(Debug, Clone)]
pub struct Protobuf<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for Protobuf<T, U> {
    fn default() -> Self {
        Protobuf(PhantomData)
    }
}

fn buffers() -> BufferSettings {
    BufferSettings::new(BUFFER_BYTES, YIELD_THRESHOLD)
}

impl<T, U> Codec for Protobuf<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(buffers())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(buffers())
    }
}
