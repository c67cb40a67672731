//! Accepted gRPC connections for tonic when they are not plain TCP: over a unix socket, or
//! behind TLS. Accepting runs on its own task and each TLS handshake on another, so one slow or
//! hostile client delays no one else; connections reach tonic as they become ready.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tonic::transport::server::Connected;

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

/// One accepted gRPC connection.
#[derive(Debug)]
pub enum Conn {
    /// Without TLS.
    Plain(Socket),
    /// Behind TLS.
    Tls(Box<tokio_rustls::server::TlsStream<Socket>>),
}

impl Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

/// The stream of connections `listener` accepts, through `tls` when given. Accepting stops when
/// the stream is dropped.
pub fn incoming(
    listener: GrpcListener,
    tls: Option<Arc<ServerTls>>,
) -> impl futures_util::Stream<Item = Result<Conn, io::Error>> + Send + 'static {
    let (ready, connections) = mpsc::channel::<Conn>(BACKLOG);
    tokio::spawn(accept(listener, tls, ready));
    futures_util::stream::unfold(connections, |mut connections| async move {
        let conn = connections.recv().await?;
        Some((Ok(conn), connections))
    })
}

async fn accept(listener: GrpcListener, tls: Option<Arc<ServerTls>>, ready: mpsc::Sender<Conn>) {
    loop {
        let accepted = match &listener {
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
        let socket = match accepted {
            Ok(socket) => socket,
            Err(err) => {
                // Out of file descriptors and the like: pause instead of spinning.
                tracing::warn!("gRPC accept failed: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if ready.is_closed() {
            return;
        }
        match &tls {
            None => {
                if ready.send(Conn::Plain(socket)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let acceptor = tls.acceptor();
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(socket)).await {
                        Ok(Ok(stream)) => {
                            let _ = ready.send(Conn::Tls(Box::new(stream))).await;
                        }
                        Ok(Err(err)) => tracing::debug!("gRPC TLS handshake failed: {err}"),
                        Err(_) => tracing::debug!("gRPC TLS handshake timed out"),
                    }
                });
            }
        }
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

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}
