//! One unary gRPC call, read and answered straight from its HTTP/2 request: the request's
//! message is read from the body's data frames, and the answer goes back as one data frame and a
//! `grpc-status: 0` trailer.
//!
//! tonic's `Grpc::unary` does the same through its streaming machinery, built for every kind of
//! call: the body wrapped and boxed, an 8 KiB buffer to gather it in, a metadata map and an
//! extension map rebuilt from the headers, a boxed stream encoding the one answer and a second
//! header map for its status. A rate-limit call is one small message each way, and that machinery
//! cost nearly as much as the decision itself: about 3,800 instructions a call, beside the
//! decision's 4,700 (the benchmark's `instructions` scenario, one descriptor on the memory
//! backend). What a call must check is kept here, each refused with tonic's own status and
//! message, so a client cannot tell the two apart: the items of the checklist in
//! [`super`] marked `unary`, which the tests compare with tonic's `Grpc::unary` on the generated
//! stubs' codec for any body cut into any frames.

use std::future::poll_fn;
use std::pin::Pin;
use std::pin::pin;
use std::task::{Context, Poll};

use http_body::{Body as HttpBody, Frame};
use prost::bytes::{Buf, BufMut, Bytes, BytesMut};
use tonic::codegen::{StdError, http};
use tonic::{Code, Status};

/// The longest request message read, as tonic's default.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// The bytes before each message of a gRPC body: the compressed flag and the length.
const PREFIX_BYTES: usize = 5;

/// Reads the request of a unary call: its headers, and the first message of its body as
/// `decode` reads it (every message is decoded; an error in any fails the call).
pub async fn read_request<B, T>(
    request: http::Request<B>,
    mut decode: impl FnMut(&[u8]) -> Result<T, Status>,
) -> Result<(http::HeaderMap, T), Status>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<StdError>,
{
    check_encoding(request.headers())?;
    let (parts, body) = request.into_parts();
    let mut body = pin!(body);
    let mut first = None;
    // What is left of a message split across frames; empty in the usual call, whose message
    // arrives whole in one frame and is read where it lies.
    let mut pending = BytesMut::new();
    loop {
        let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await else {
            // The body ended: inside a message, the message is cut short. tonic's reader has
            // taken a whole prefix off its buffer by then, and refuses only bytes left after
            // it, so a body that ends right after a prefix, with none of its message, ends the
            // request as if that prefix were not there.
            if !pending.is_empty() && pending.len() != PREFIX_BYTES {
                return Err(Status::internal("Unexpected EOF decoding stream."));
            }
            break;
        };
        let data = match frame.map(Frame::into_data) {
            Ok(Ok(data)) => data,
            // Trailers end the request.
            Ok(Err(_)) => break,
            Err(error) => {
                let status = Status::from_error(error.into());
                // A client that gives up ends its request; what it sent before still counts.
                if status.code() == Code::Cancelled {
                    break;
                }
                return Err(status);
            }
        };
        if pending.is_empty() {
            let read = read_messages(&data, &mut decode, &mut first)?;
            pending.extend_from_slice(&data[read..]);
        } else {
            pending.extend_from_slice(&data);
            let read = read_messages(&pending, &mut decode, &mut first)?;
            pending.advance(read);
        }
    }
    match first {
        Some(message) => Ok((parts.headers, message)),
        None => Err(Status::internal("Missing request message.")),
    }
}

/// The header that names a request's compression. Built once: a header looked up by its text
/// has that text parsed on every call (counted: 410 instructions a call against 190 by this
/// name, for a header clients seldom send).
static GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");

/// Refuses a request compressed with any encoding but `identity`: none is enabled.
fn check_encoding(headers: &http::HeaderMap) -> Result<(), Status> {
    let Some(encoding) = headers.get(&GRPC_ENCODING) else {
        return Ok(());
    };
    let encoding = encoding.as_bytes();
    if encoding == b"identity" {
        return Ok(());
    }
    let name = match std::str::from_utf8(encoding) {
        Ok(name) => name.to_owned(),
        Err(_) => format!("{encoding:?}"),
    };
    let mut status = Status::unimplemented(format!(
        "Content is compressed with `{name}` which isn't supported"
    ));
    status.metadata_mut().insert(
        "grpc-accept-encoding",
        tonic::metadata::MetadataValue::from_static("identity"),
    );
    Err(status)
}

/// Decodes every whole message at the start of `bytes`, keeping the first in `first`, and
/// answers how many bytes were read. A prefix is checked as soon as it is there, before the
/// message it announces has arrived.
fn read_messages<T>(
    bytes: &[u8],
    decode: &mut impl FnMut(&[u8]) -> Result<T, Status>,
    first: &mut Option<T>,
) -> Result<usize, Status> {
    let mut rest = bytes;
    while let Some((&flag, length)) = rest.first().zip(rest.get(1..PREFIX_BYTES)) {
        match flag {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no \
                     grpc-encoding was specified",
                ));
            }
            flag => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {flag} \
                     (valid flags are 0 and 1), while sending request"
                )));
            }
        }
        let mut length = length;
        let length = length.get_u32() as usize;
        if length > MAX_MESSAGE_BYTES {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {length} bytes, the limit is: \
                 {MAX_MESSAGE_BYTES} bytes"
            )));
        }
        let Some(message) = rest.get(PREFIX_BYTES..PREFIX_BYTES + length) else {
            break;
        };
        let message = decode(message)?;
        if first.is_none() {
            *first = Some(message);
        }
        rest = &rest[PREFIX_BYTES + length..];
    }
    Ok(bytes.len() - rest.len())
}

/// The answer to a unary call: `write` appends the message to the buffer it is given, and the
/// answer carries it as one data frame, then `grpc-status: 0`. A message written past 4 GiB,
/// which a gRPC prefix cannot announce, is refused as tonic refuses it.
pub fn answer<E>(
    write: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    failed: impl FnOnce(E) -> Status,
) -> http::Response<tonic::body::Body> {
    let mut frame = BytesMut::with_capacity(256);
    frame.put_bytes(0, PREFIX_BYTES);
    if let Err(error) = write(&mut frame) {
        return failed(error).into_http();
    }
    let Ok(length) = u32::try_from(frame.len() - PREFIX_BYTES) else {
        return Status::resource_exhausted(format!(
            "Cannot return body with more than 4GB of data but got {} bytes",
            frame.len() - PREFIX_BYTES
        ))
        .into_http();
    };
    frame[1..PREFIX_BYTES].copy_from_slice(&length.to_be_bytes());
    let mut response = http::Response::new(tonic::body::Body::new(OneMessage {
        message: Some(frame.freeze()),
        status: true,
    }));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A body of one message, then the trailers of an OK status.
struct OneMessage {
    message: Option<Bytes>,
    status: bool,
}

impl HttpBody for OneMessage {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(message) = this.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(message))));
        }
        if std::mem::take(&mut this.status) {
            let mut trailers = http::HeaderMap::with_capacity(1);
            trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && !self.status
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;
    use prost::Message;
    use tonic::server::{Grpc, UnaryService};
    use tonic::{Request as GrpcRequest, Response as GrpcResponse};
    use tonic_prost::ProstCodec;

    use super::super::{decode_failed, encode_failed};
    use super::*;
    use crate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};

    /// A request body sent as these frames, or ending with this error.
    struct Frames(VecDeque<Result<Frame<Bytes>, Status>>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.get_mut().0.pop_front())
        }
    }

    /// The answer to a request: its overall code is the request's count of descriptors, so
    /// answering another message than the first shows.
    fn answer_to(request: &RateLimitRequest) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: request.descriptors.len() as i32,
            ..RateLimitResponse::default()
        }
    }

    /// The same call answered by tonic's `Grpc::unary`, with the generated stubs' codec.
    #[derive(Clone)]
    struct Generated;

    impl UnaryService<RateLimitRequest> for Generated {
        type Response = RateLimitResponse;
        type Future = std::future::Ready<Result<GrpcResponse<RateLimitResponse>, Status>>;

        fn call(&mut self, request: GrpcRequest<RateLimitRequest>) -> Self::Future {
            std::future::ready(Ok(GrpcResponse::new(answer_to(request.get_ref()))))
        }
    }

    /// What a client sees of a response: the status line's headers, the body's data, and its
    /// trailers.
    #[derive(Debug, PartialEq)]
    struct Seen {
        headers: Vec<(String, Vec<u8>)>,
        data: Vec<u8>,
        trailers: Vec<(String, Vec<u8>)>,
    }

    fn pairs(headers: &http::HeaderMap) -> Vec<(String, Vec<u8>)> {
        let mut pairs: Vec<_> = headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
            .collect();
        pairs.sort();
        pairs
    }

    async fn seen(response: http::Response<tonic::body::Body>) -> Seen {
        let (parts, body) = response.into_parts();
        let mut body = pin!(body);
        let mut seen = Seen {
            headers: pairs(&parts.headers),
            data: Vec::new(),
            trailers: Vec::new(),
        };
        while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
            let frame = frame.expect("the answer's body does not fail");
            match frame.into_data() {
                Ok(data) => seen.data.extend_from_slice(&data),
                Err(frame) => {
                    let trailers = frame.into_trailers().expect("data or trailers");
                    seen.trailers.extend(pairs(&trailers));
                }
            }
        }
        seen
    }

    fn request(
        encoding: Option<&'static str>,
        frames: Vec<Result<Frame<Bytes>, Status>>,
    ) -> http::Request<Frames> {
        let mut request = http::Request::new(Frames(frames.into()));
        if let Some(encoding) = encoding {
            request
                .headers_mut()
                .insert("grpc-encoding", http::HeaderValue::from_static(encoding));
        }
        request
    }

    /// Both answers to one request, tonic's first.
    fn both(
        encoding: Option<&'static str>,
        frames: Vec<Result<Frame<Bytes>, Status>>,
    ) -> (Seen, Seen) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let generated = Grpc::new(ProstCodec::<RateLimitResponse, RateLimitRequest>::default())
                .unary(
                    Generated,
                    request(encoding, frames.iter().map(copy).collect()),
                )
                .await;
            let direct = match read_request(request(encoding, frames), |mut message| {
                RateLimitRequest::decode(&mut message).map_err(decode_failed)
            })
            .await
            {
                Ok((_, message)) => answer(|out| answer_to(&message).encode(out), encode_failed),
                Err(status) => status.into_http(),
            };
            (seen(generated).await, seen(direct).await)
        })
    }

    fn copy(frame: &Result<Frame<Bytes>, Status>) -> Result<Frame<Bytes>, Status> {
        match frame {
            Ok(frame) => Ok(match frame.data_ref() {
                Some(data) => Frame::data(data.clone()),
                None => Frame::trailers(frame.trailers_ref().cloned().unwrap_or_default()),
            }),
            Err(status) => Err(status.clone()),
        }
    }

    /// One message of a body: a prefix (flag, length) and the bytes.
    fn message(flag: u8, bytes: &[u8]) -> Vec<u8> {
        let mut message = vec![flag];
        message.extend((bytes.len() as u32).to_be_bytes());
        message.extend(bytes);
        message
    }

    fn rls_request(descriptors: usize) -> Vec<u8> {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor::default(); descriptors],
            hits_addend: 0,
        }
        .encode_to_vec()
    }

    /// A body's bytes cut into frames at these points.
    fn cut(bytes: &[u8], points: &[prop::sample::Index]) -> Vec<Result<Frame<Bytes>, Status>> {
        let mut points: Vec<usize> = points.iter().map(|p| p.index(bytes.len() + 1)).collect();
        points.push(0);
        points.push(bytes.len());
        points.sort();
        points.dedup();
        points
            .windows(2)
            .map(|w| Ok(Frame::data(Bytes::copy_from_slice(&bytes[w[0]..w[1]]))))
            .collect()
    }

    fn part() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            4 => (0usize..4).prop_map(|n| message(0, &rls_request(n))),
            1 => (0u8..4, prop::collection::vec(any::<u8>(), 0..12))
                .prop_map(|(flag, bytes)| message(flag, &bytes)),
            1 => prop::collection::vec(any::<u8>(), 0..7),
            // A message cut short: only a body's last part stays so.
            2 => (0usize..4, any::<prop::sample::Index>()).prop_map(|(n, at)| {
                let whole = message(0, &rls_request(n));
                whole[..at.index(whole.len())].to_vec()
            }),
            1 => Just(vec![0, 0, 0x40, 0, 1]),
        ]
    }

    /// How a request body ends after its data.
    #[derive(Debug, Clone, Copy)]
    enum Ending {
        Plain,
        Trailers,
        Cancelled,
        Failed,
    }

    impl Ending {
        fn frame(self) -> Option<Result<Frame<Bytes>, Status>> {
            match self {
                Ending::Plain => None,
                Ending::Trailers => Some(Ok(Frame::trailers(http::HeaderMap::new()))),
                Ending::Cancelled => Some(Err(Status::cancelled("gone"))),
                Ending::Failed => Some(Err(Status::internal("reset"))),
            }
        }
    }

    fn ending() -> impl Strategy<Value = Ending> {
        prop_oneof![
            Just(Ending::Plain),
            Just(Ending::Trailers),
            Just(Ending::Cancelled),
            Just(Ending::Failed),
        ]
    }

    proptest! {
        /// Any body, cut into any frames and ended any way, gets the answer tonic gives it:
        /// the same headers, data and trailers, refusals included.
        #[test]
        fn answers_every_body_as_tonic_does(
            parts in prop::collection::vec(part(), 0..4),
            points in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            end in ending(),
            encoding in prop_oneof![Just(None), Just(Some("identity")), Just(Some("gzip"))],
        ) {
            let bytes = parts.concat();
            let mut frames = cut(&bytes, &points);
            frames.extend(end.frame());
            let (generated, direct) = both(encoding, frames);
            prop_assert_eq!(direct, generated);
        }
    }

    /// A body that ends right after a prefix, with no byte of its message, is read as tonic
    /// reads it: the prefix is ignored, so the message before it is answered, and with none
    /// before it the request has no message.
    #[test]
    fn a_body_that_ends_after_a_prefix_alone_ends_as_in_tonic() {
        let prefix_alone = vec![0, 0, 0, 0, 10];
        for (body, answered) in [
            (prefix_alone.clone(), false),
            ([message(0, &rls_request(1)), prefix_alone].concat(), true),
        ] {
            let frames = vec![Ok(Frame::data(Bytes::from(body)))];
            let (generated, direct) = both(None, frames);
            assert_eq!(direct, generated);
            assert_eq!(!direct.data.is_empty(), answered, "{direct:?}");
        }
    }

    #[test]
    fn a_message_split_across_frames_is_read_whole() {
        let body = message(0, &rls_request(2));
        let frames = body
            .iter()
            .map(|&byte| Ok(Frame::data(Bytes::copy_from_slice(&[byte]))))
            .collect();
        let (generated, direct) = both(None, frames);
        assert_eq!(direct.data, message(0, &[0x08, 2]));
        assert_eq!(
            direct.trailers,
            vec![("grpc-status".to_owned(), b"0".to_vec())]
        );
        assert_eq!(direct, generated);
    }

    #[test]
    fn the_first_of_two_messages_is_answered_and_both_are_read() {
        let mut body = message(0, &rls_request(1));
        body.extend(message(0, &rls_request(3)));
        let (generated, direct) = both(None, vec![Ok(Frame::data(body.into()))]);
        assert_eq!(direct.data, message(0, &[0x08, 1]));
        assert_eq!(direct, generated);

        let mut body = message(0, &rls_request(1));
        body.extend(message(0, &[0xff]));
        let (generated, direct) = both(None, vec![Ok(Frame::data(body.into()))]);
        assert!(direct.data.is_empty(), "{direct:?}");
        assert_eq!(direct, generated);
    }

    #[test]
    fn trailers_end_the_request_even_inside_a_message() {
        let mut body = message(0, &rls_request(1));
        body.extend(&message(0, &rls_request(2))[..7]);
        let trailers = Ok(Frame::trailers(http::HeaderMap::new()));
        let (generated, direct) = both(None, vec![Ok(Frame::data(body.into())), trailers]);
        assert_eq!(direct.data, message(0, &[0x08, 1]));
        assert_eq!(direct, generated);
    }

    #[test]
    fn a_message_too_long_is_refused_before_it_arrives() {
        let prefix = [0, 0, 0x40, 0, 1];
        let (generated, direct) =
            both(None, vec![Ok(Frame::data(Bytes::copy_from_slice(&prefix)))]);
        assert!(
            direct
                .headers
                .contains(&("grpc-status".to_owned(), b"11".to_vec())),
            "{direct:?}"
        );
        assert_eq!(direct, generated);
    }

    #[test]
    fn a_compressed_request_is_refused_naming_its_encoding() {
        let body = message(0, &rls_request(1));
        let (generated, direct) = both(Some("gzip"), vec![Ok(Frame::data(body.into()))]);
        assert!(
            direct
                .headers
                .contains(&("grpc-accept-encoding".to_owned(), b"identity".to_vec())),
            "{direct:?}"
        );
        assert_eq!(direct, generated);
    }
}
