//! Accepted gRPC connections for tonic: over TCP or a unix socket, behind TLS or not. With TLS,
//! accepting runs on its own task and each handshake on another, so one slow or hostile client
//! delays no one else; connections reach tonic as they become ready. Every connection is closed
//! if it sends no request within the first-request timeout, and an accept that fails (out of
//! file descriptors) pauses briefly and accepts again, logged at most once per interval.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::Either;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use super::bounds::Connection;
use super::tls::ServerTls;

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections handed over but not yet taken by the server.
const BACKLOG: usize = 64;

/// Where gRPC listens.
#[derive(Debug)]
pub enum GrpcListener {
    /// A TCP address.
    Tcp(TcpListener),
    /// A unix socket (the reference's `GRPC_UDS`).
    Unix {
        /// The listener.
        listener: UnixListener,
        /// Its path, for logs.
        path: PathBuf,
    },
}

impl GrpcListener {
    /// The address for logs: `ip:port` or the socket path.
    pub fn describe(&self) -> String {
        match self {
            GrpcListener::Tcp(listener) => listener
                .local_addr()
                .map_or_else(|_| "?".into(), |addr| addr.to_string()),
            GrpcListener::Unix { path, .. } => path.display().to_string(),
        }
    }

    /// The TCP address, if it is one.
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            GrpcListener::Tcp(listener) => listener.local_addr().ok(),
            GrpcListener::Unix { .. } => None,
        }
    }
}

/// A socket before TLS.
#[derive(Debug)]
pub enum Socket {
    /// TCP.
    Tcp(TcpStream),
    /// A unix socket.
    Unix(UnixStream),
}

/// What an accepted gRPC connection carries.
#[derive(Debug)]
pub enum Stream {
    /// Without TLS.
    Plain(Socket),
    /// Behind TLS.
    Tls(Box<tokio_rustls::server::TlsStream<Socket>>),
}

/// One accepted gRPC connection: its stream, and what it holds ([`Connection`]), which tonic
/// hands to each of its requests. Until its first request, reading fails once the first-request
/// timeout has passed, so a connection that never asks anything is closed.
#[derive(Debug)]
pub struct Conn {
    stream: Stream,
    connection: Arc<Connection>,
    /// Disarmed (`None`) once a request has arrived.
    silent: Option<Pin<Box<Sleep>>>,
}

impl Conn {
    /// `stream`, to be closed if no request arrives within `first_request`.
    pub fn new(stream: Stream, first_request: Duration) -> Conn {
        Conn {
            stream,
            connection: Arc::default(),
            silent: Some(Box::pin(tokio::time::sleep(first_request))),
        }
    }
}

impl Connected for Conn {
    type ConnectInfo = Arc<Connection>;

    fn connect_info(&self) -> Self::ConnectInfo {
        Arc::clone(&self.connection)
    }
}

/// The stream of connections `listener` accepts, through `tls` when given, each closed if it
/// sends no request within `first_request`. Accepting stops when the stream is dropped; running
/// out of file descriptors pauses it briefly ([`AcceptErrors`]), never ends it.
pub fn incoming(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
    first_request: Duration,
) -> impl futures_util::Stream<Item = Result<Conn, io::Error>> + Send + 'static {
    match tls {
        // Accepted where tonic asks for the next connection: no task or channel in between.
        None => Either::Left(futures_util::stream::unfold(
            (listener, AcceptErrors::new("gRPC")),
            move |(listener, mut errors)| async move {
                let socket = accept_socket(&listener, &mut errors).await;
                let conn = Conn::new(Stream::Plain(socket), first_request);
                Some((Ok(conn), (listener, errors)))
            },
        )),
        Some(tls) => {
            let (ready, connections) = mpsc::channel::<Conn>(BACKLOG);
            tokio::spawn(accept_tls(listener, tls, first_request, ready));
            Either::Right(futures_util::stream::unfold(
                connections,
                |mut connections| async move {
                    let conn = connections.recv().await?;
                    Some((Ok(conn), connections))
                },
            ))
        }
    }
}

/// Accepts the next socket, pausing after failures that are not the peer's.
async fn accept_socket(listener: &GrpcListener, errors: &mut AcceptErrors) -> Socket {
    loop {
        let accepted = match listener {
            GrpcListener::Tcp(listener) => listener.accept().await.map(|(stream, _)| {
                // Without it a response queued behind an unacknowledged one waits for the
                // peer's delayed ACK.
                let _ = stream.set_nodelay(true);
                Socket::Tcp(stream)
            }),
            GrpcListener::Unix { listener, .. } => listener
                .accept()
                .await
                .map(|(stream, _)| Socket::Unix(stream)),
        };
        match accepted {
            Ok(socket) => return socket,
            Err(error) => errors.pause(&error).await,
        }
    }
}

async fn accept_tls(
    listener: GrpcListener,
    tls: Arc<ServerTls>,
    first_request: Duration,
    ready: mpsc::Sender<Conn>,
) {
    let mut errors = AcceptErrors::new("gRPC");
    loop {
        let socket = tokio::select! {
            socket = accept_socket(&listener, &mut errors) => socket,
            () = ready.closed() => return,
        };
        let acceptor = tls.acceptor();
        let ready = ready.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                Ok(Ok(stream)) => {
                    let conn = Conn::new(Stream::Tls(Box::new(stream)), first_request);
                    let _ = ready.send(conn).await;
                }
                Ok(Err(err)) => tracing::debug!("gRPC TLS handshake failed: {err}"),
                Err(_) => tracing::debug!("gRPC TLS handshake timed out"),
            }
        });
    }
}

/// How long accepting pauses after a failure that is not the peer's (out of file descriptors,
/// out of memory): the connection waiting stays in the backlog and would fail again at once.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// How often an accept failure is logged at most, with the count of those not logged.
const ACCEPT_LOG_EVERY: Duration = Duration::from_secs(10);

/// The accept failures of one listener: each pauses accepting briefly, and they are logged at
/// most once per [`ACCEPT_LOG_EVERY`] with the count of the others, so a process out of file
/// descriptors keeps accepting as soon as one is free, without a log line per attempt.
#[derive(Debug)]
pub(crate) struct AcceptErrors {
    listener: &'static str,
    logged: Option<Instant>,
    suppressed: u64,
}

impl AcceptErrors {
    /// No failure yet on the listener named `listener` (for the log).
    pub(crate) fn new(listener: &'static str) -> Self {
        AcceptErrors {
            listener,
            logged: None,
            suppressed: 0,
        }
    }

    /// Logs `error` unless one was logged lately, and pauses unless the peer caused it (a
    /// connection reset before it was accepted leaves the next one ready).
    pub(crate) async fn pause(&mut self, error: &io::Error) {
        if matches!(
            error.kind(),
            io::ErrorKind::ConnectionAborted
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionRefused
        ) {
            return;
        }
        let now = Instant::now();
        match self.logged {
            Some(at) if now.duration_since(at) < ACCEPT_LOG_EVERY => self.suppressed += 1,
            _ => {
                tracing::warn!(
                    listener = self.listener,
                    suppressed = self.suppressed,
                    "accepting a connection failed: {error}; retrying every {}ms (logged at \
                     most every {}s, `suppressed` failures since the last line)",
                    ACCEPT_PAUSE.as_millis(),
                    ACCEPT_LOG_EVERY.as_secs(),
                );
                self.logged = Some(now);
                self.suppressed = 0;
            }
        }
        tokio::time::sleep(ACCEPT_PAUSE).await;
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Socket::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_flush(cx),
            Socket::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Socket::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Socket::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Socket::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Tcp(s) => s.is_write_vectored(),
            Socket::Unix(s) => s.is_write_vectored(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(silent) = &mut this.silent {
            if this.connection.requested() {
                this.silent = None;
            } else if silent.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no request within --grpc-first-request-timeout",
                )));
            }
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
