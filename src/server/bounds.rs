//! Bounds on what one client can hold of tollgate, whatever it sends: streams per gRPC
//! connection, bytes of request messages still arriving (per connection and in all), how long a
//! request message may take to arrive, how long a connection may stay without a request, and on
//! the admin port how long a request's headers may take and how many connections are open.
//!
//! The libraries do most of it when told: HTTP/2's `MAX_CONCURRENT_STREAMS` and flow-control
//! windows (hyper's 1 MiB per connection: what h2 buffers for a connection's streams before they
//! are read), hyper's HTTP/1 header read timeout. What they cannot know is what a gRPC handler
//! keeps: a handler reads its body as it arrives and gathers a message until it is whole, up to
//! the 4 MiB a message may have, releasing the flow-control window as it goes. So each request
//! body is wrapped in a [`BoundedBody`] that follows the gRPC framing and counts the bytes of the
//! message not yet whole against its connection's bound and the process's; past either, or past
//! the body's deadline, the body fails with `RESOURCE_EXHAUSTED` (`DEADLINE_EXCEEDED`), which both
//! ShouldRateLimit paths and tonic's services answer as the call's status, and the stream ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as HttpBody, Frame, SizeHint};
use prost::bytes::{Buf, Bytes};
use tokio::time::Sleep;
use tonic::Status;
use tonic::codegen::{Service, http};

use super::rls::SHOULD_RATE_LIMIT;

/// Every bound, with the defaults of `tollgate serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// `MAX_CONCURRENT_STREAMS`, advertised in every gRPC connection's HTTP/2 settings: the
    /// most calls and streams open at once on one connection.
    pub grpc_max_concurrent_streams: u32,
    /// How long a request message may take to arrive whole once its first byte has, and a unary
    /// call's whole body once the call has begun.
    pub grpc_body_timeout: Duration,
    /// The most bytes of request messages not yet whole on one gRPC connection.
    pub grpc_unfinished_bytes_per_connection: usize,
    /// The most bytes of request messages not yet whole on all gRPC connections together.
    pub grpc_unfinished_bytes: usize,
    /// How long a gRPC connection may stay open without sending a request (after its TLS
    /// handshake, when TLS is on).
    pub grpc_first_request_timeout: Duration,
    /// How long an admin (or debug, or metrics) connection may take to send a request's headers,
    /// counted from the connection's start or the end of its previous answer, and then the
    /// request's body: it closes silent connections, idle kept-alive ones and headers or bodies
    /// dribbled byte by byte alike.
    pub admin_header_read_timeout: Duration,
    /// The most connections open at once on each HTTP listener (admin, debug, metrics); past
    /// it, new connections wait in the kernel's backlog until one closes.
    pub admin_max_connections: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            grpc_max_concurrent_streams: 1024,
            grpc_body_timeout: Duration::from_secs(10),
            grpc_unfinished_bytes_per_connection: 8 << 20,
            grpc_unfinished_bytes: 64 << 20,
            grpc_first_request_timeout: Duration::from_secs(30),
            admin_header_read_timeout: Duration::from_secs(10),
            admin_max_connections: 256,
        }
    }
}

/// What one gRPC connection holds, shared by its requests (tonic hands it to each request as the
/// connection's connect info) and its socket ([`super::incoming::Conn`]).
#[derive(Debug, Default)]
pub struct Connection {
    /// Whether a request has arrived on it, which disarms the first-request timeout.
    requested: AtomicBool,
    /// Bytes of request messages not yet whole, on all its streams.
    unfinished: AtomicUsize,
}

impl Connection {
    /// Whether a request has arrived on this connection.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }
}

/// The process's side of the bounds on unfinished request messages.
#[derive(Debug)]
pub struct BodyBudget {
    /// Bytes of request messages not yet whole, on every connection.
    unfinished: AtomicUsize,
    per_connection: usize,
    total: usize,
    timeout: Duration,
}

impl BodyBudget {
    /// The budget of `bounds`.
    pub fn new(bounds: &Bounds) -> Self {
        BodyBudget {
            unfinished: AtomicUsize::new(0),
            per_connection: bounds.grpc_unfinished_bytes_per_connection,
            total: bounds.grpc_unfinished_bytes,
            timeout: bounds.grpc_body_timeout,
        }
    }

    /// Bytes of request messages not yet whole, on every connection.
    pub fn unfinished(&self) -> usize {
        self.unfinished.load(Ordering::Relaxed)
    }
}

/// A gRPC service whose requests mark their connection as used and have their bodies bounded.
#[derive(Debug, Clone)]
pub struct Bounded<S> {
    inner: S,
    budget: Arc<BodyBudget>,
}

impl<S> Bounded<S> {
    /// `inner`, its request bodies counted against `budget`.
    pub fn new(inner: S, budget: Arc<BodyBudget>) -> Self {
        Bounded { inner, budget }
    }
}

impl<S> Service<http::Request<tonic::body::Body>> for Bounded<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let connection = request.extensions().get::<Arc<Connection>>().cloned();
        if let Some(connection) = &connection
            && !connection.requested()
        {
            connection.requested.store(true, Ordering::Relaxed);
        }
        let unary = is_unary(request.uri().path());
        let budget = Arc::clone(&self.budget);
        let request = request.map(|body| {
            tonic::body::Body::new(BoundedBody {
                inner: body,
                budget,
                connection,
                framing: Framing::default(),
                held: 0,
                unary,
                deadline: None,
                done: false,
            })
        });
        self.inner.call(request)
    }
}

/// The unary methods served: their whole body must arrive within the body timeout. Every other
/// method streams, and only each of its messages is held to it once begun.
fn is_unary(path: &str) -> bool {
    path == SHOULD_RATE_LIMIT || path == "/grpc.health.v1.Health/Check"
}

/// A request body whose message in progress counts against its connection's and the process's
/// bounds, and must arrive within the body timeout.
pub struct BoundedBody<B> {
    inner: B,
    budget: Arc<BodyBudget>,
    connection: Option<Arc<Connection>>,
    framing: Framing,
    /// Bytes of the message in progress counted against the bounds.
    held: usize,
    unary: bool,
    /// Set the first time the body waits while the deadline applies.
    deadline: Option<Pin<Box<Sleep>>>,
    /// An error was answered: the body ends.
    done: bool,
}

impl<B> BoundedBody<B> {
    /// Counts `held` bytes instead of `self.held`, or refuses them past a bound (and releases
    /// what was counted).
    fn hold(&mut self, held: usize) -> Result<(), Status> {
        if held <= self.held {
            self.release(self.held - held);
            return Ok(());
        }
        let more = held - self.held;
        let total = self.budget.unfinished.fetch_add(more, Ordering::Relaxed) + more;
        let mine = self.connection.as_ref().map_or(0, |c| {
            c.unfinished.fetch_add(more, Ordering::Relaxed) + more
        });
        self.held = held;
        if mine > self.budget.per_connection {
            self.release(self.held);
            return Err(Status::resource_exhausted(format!(
                "request messages still arriving on this connection are over {} bytes \
                 (--grpc-unfinished-bytes-per-connection)",
                self.budget.per_connection
            )));
        }
        if total > self.budget.total {
            self.release(self.held);
            return Err(Status::resource_exhausted(format!(
                "request messages still arriving on all connections are over {} bytes \
                 (--grpc-unfinished-bytes)",
                self.budget.total
            )));
        }
        Ok(())
    }

    fn release(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        self.held -= bytes;
        self.budget.unfinished.fetch_sub(bytes, Ordering::Relaxed);
        if let Some(connection) = &self.connection {
            connection.unfinished.fetch_sub(bytes, Ordering::Relaxed);
        }
    }

    fn fail(&mut self, status: Status) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        self.release(self.held);
        self.deadline = None;
        self.done = true;
        Poll::Ready(Some(Err(status)))
    }
}

impl<B> Drop for BoundedBody<B> {
    fn drop(&mut self) {
        self.release(self.held);
    }
}

impl<B> HttpBody for BoundedBody<B>
where
    B: HttpBody<Data = Bytes, Error = Status> + Unpin,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let held = this.framing.advance(data);
                    if let Err(status) = this.hold(held) {
                        return this.fail(status);
                    }
                    if held == 0 && !this.unary {
                        // A whole message: the next one has a deadline of its own.
                        this.deadline = None;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => {
                this.release(this.held);
                this.deadline = None;
                this.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(status))) => Poll::Ready(Some(Err(status))),
            Poll::Pending => {
                if this.unary || this.held > 0 {
                    let timeout = this.budget.timeout;
                    let deadline = this
                        .deadline
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                    if deadline.as_mut().poll(cx).is_ready() {
                        return this.fail(Status::deadline_exceeded(format!(
                            "the request message did not arrive whole within {} \
                             (--grpc-body-timeout)",
                            humantime::format_duration(timeout)
                        )));
                    }
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Where a body stands in gRPC's framing: each message is a flag byte, a 4-byte length, then
/// that many bytes.
#[derive(Debug, Default)]
struct Framing {
    /// The bytes of the current prefix seen so far (up to 5).
    prefix: usize,
    /// The length the current prefix announces, as its bytes arrive.
    length: u32,
    /// Bytes of the current message still to come, once its prefix is whole.
    remaining: usize,
    /// Bytes of the message in progress seen so far, prefix included.
    held: usize,
}

impl Framing {
    /// Reads `data` and answers how many bytes of a message in progress are held (0 when the
    /// data ends on a message's end).
    fn advance(&mut self, mut data: &[u8]) -> usize {
        while data.has_remaining() {
            if self.prefix < PREFIX_BYTES {
                let byte = data.get_u8();
                if self.prefix > 0 {
                    self.length = (self.length << 8) | u32::from(byte);
                }
                self.prefix += 1;
                self.held += 1;
                if self.prefix == PREFIX_BYTES {
                    self.remaining = self.length as usize;
                    self.finish_if_whole();
                }
                continue;
            }
            let take = self.remaining.min(data.remaining());
            data.advance(take);
            self.remaining -= take;
            self.held += take;
            self.finish_if_whole();
        }
        self.held
    }

    fn finish_if_whole(&mut self) {
        if self.prefix == PREFIX_BYTES && self.remaining == 0 {
            *self = Framing::default();
        }
    }
}

/// The bytes before each message of a gRPC body: the compressed flag and the length.
const PREFIX_BYTES: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;

    fn message(length: u32) -> Vec<u8> {
        let mut bytes = vec![0];
        bytes.extend_from_slice(&length.to_be_bytes());
        bytes.extend(std::iter::repeat_n(7, length as usize));
        bytes
    }

    #[test]
    fn whole_messages_hold_nothing_and_a_partial_one_its_bytes() {
        let mut framing = Framing::default();
        let mut bytes = message(10);
        bytes.extend(message(0));
        bytes.extend(&message(100)[..42]);
        assert_eq!(framing.advance(&bytes), 42);
        assert_eq!(framing.advance(&[7; 62]), 104);
        assert_eq!(framing.advance(&[7]), 0);
    }

    #[test]
    fn a_prefix_split_across_frames_is_read_whole() {
        let mut framing = Framing::default();
        let bytes = message(300);
        for (n, byte) in bytes.iter().enumerate() {
            let held = framing.advance(&[*byte]);
            let expected = if n + 1 == bytes.len() { 0 } else { n + 1 };
            assert_eq!(held, expected, "after byte {n}");
        }
    }
}
