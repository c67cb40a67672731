//! Serving an HTTP listener (admin, debug, metrics) with bounds: at most so many connections open
//! at once, request headers, then the request's body, that must each arrive within a timeout,
//! and an accept loop that survives running out of file descriptors.
//!
//! `axum::serve` offers none of these (its hyper has no timer, so no header read timeout; it
//! accepts without limit), so connections are served here with hyper's HTTP/1 server as
//! `axum::serve` serves them otherwise.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Sleep;
use tonic::codegen::Service;

use super::incoming::AcceptErrors;

/// The bounds of one HTTP listener.
#[derive(Debug, Clone, Copy)]
pub struct HttpBounds {
    /// How long a connection may take to send a request's headers, from its start or the end of
    /// its previous answer.
    pub header_read_timeout: Duration,
    /// The most connections open at once; past it, new ones wait in the kernel's backlog.
    pub max_connections: usize,
}

/// Serves `router` on `listener` until `stop` resolves, then lets the open connections finish
/// their requests (idle ones close at once). `name` names the listener in logs.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    bounds: HttpBounds,
    name: &'static str,
    stop: impl Future<Output = ()>,
) {
    // Semaphore permits are a u32 when taken together, at the end.
    let max_connections = bounds.max_connections.clamp(1, u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(max_connections));
    let (closing, close) = watch::channel(false);
    let mut errors = AcceptErrors::new(name);
    let mut stop = pin!(stop);
    loop {
        let slot = tokio::select! {
            () = &mut stop => break,
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    errors.pause(&error).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let timeout = bounds.header_read_timeout;
        let service = hyper::service::service_fn(move |request: axum::http::Request<Incoming>| {
            let request = request.map(|body| axum::body::Body::new(TimedBody::new(body, timeout)));
            // A router is always ready (`poll_ready` answers at once), as `axum::serve` relies on.
            Service::call(&mut router.clone(), request)
        });
        let mut close = close.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(bounds.header_read_timeout)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::trace!("{name} connection ended: {error}");
                    }
                    return;
                }
                _ = close.wait_for(|closing| *closing) => connection.as_mut().graceful_shutdown(),
            }
            if let Err(error) = connection.await {
                tracing::trace!("{name} connection ended: {error}");
            }
        });
    }
    drop(listener);
    let _ = closing.send(true);
    // Every connection gives its slot back when it ends.
    let _ = slots.acquire_many(max_connections as u32).await;
}

/// A request body that must arrive whole within a timeout of its request's head, so a body
/// dribbled byte by byte holds its connection (and what the handler has gathered) no longer
/// than headers dribbled would.
struct TimedBody {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
}

impl TimedBody {
    fn new(inner: Incoming, timeout: Duration) -> Self {
        TimedBody {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Pending => {
                if this.deadline.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Some(Err(format!(
                        "the request body did not arrive within {} (--admin-header-read-timeout)",
                        humantime::format_duration(this.timeout)
                    )
                    .into())));
                }
                Poll::Pending
            }
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
