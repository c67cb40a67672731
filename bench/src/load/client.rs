//! One HTTP/2 connection that makes the RLS call itself, on `h2`, with no channel in between.
//!
//! A tonic `Channel` puts a buffer task (a queue and a task hop per call), hyper's client and
//! tonic's codec between the caller and the connection; on two shared cores the generator's
//! own cost is taken from the server it measures. Here a call opens a stream, writes the
//! prefixed message with the end of the stream, reads the answer and the status from the
//! trailers: the same frames tonic sends, for fewer instructions.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, anyhow};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use prost::Message;
use tokio::net::TcpStream;
use tollgate::proto::{RateLimitRequest, RateLimitResponse};

/// The path of `ShouldRateLimit`.
const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The gRPC message prefix: one byte of flags, four of length.
const PREFIX: usize = 5;

/// One connection to an RLS server; clones share it, and each call is a stream of its own.
#[derive(Clone)]
pub struct Client {
    send: h2::client::SendRequest<Bytes>,
    uri: Uri,
}

/// A call's deadline: how long the caller waits, and the same as the `grpc-timeout` header sent
/// with the call (as tonic sends it), formatted once rather than per call.
#[derive(Debug, Clone)]
pub struct Deadline {
    timeout: Duration,
    header: HeaderValue,
}

impl Deadline {
    /// A deadline `timeout` after each call starts.
    pub fn new(timeout: Duration) -> Deadline {
        // At most eight digits, as gRPC allows.
        let ms = timeout.as_millis().min(99_999_999);
        let header = HeaderValue::from_str(&format!("{ms}m"))
            .unwrap_or(HeaderValue::from_static("99999999m"));
        Deadline { timeout, header }
    }
}

/// How a call ended without an answer, by gRPC status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed(pub tonic::Code);

impl Client {
    /// Connects to `target` (`host:port`, or `http://host:port`) and runs the connection on
    /// the current runtime.
    pub async fn connect(target: &str, timeout: Duration) -> anyhow::Result<Client> {
        let authority = match target.split_once("://") {
            None => target,
            Some(("http", rest)) => rest.trim_end_matches('/'),
            Some((scheme, _)) => {
                return Err(anyhow!(
                    "`{target}`: the load generator speaks plain HTTP/2 only, not `{scheme}`"
                ));
            }
        };
        let uri: Uri = format!("http://{authority}{PATH}")
            .parse()
            .with_context(|| format!("`{target}` is not a valid target"))?;
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(authority)
            .await
            .with_context(|| format!("cannot resolve `{target}`"))?
            .collect();
        let addr = addrs
            .first()
            .with_context(|| format!("`{target}` resolves to no address"))?;
        let tcp = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| anyhow!("connecting to {target} took longer than {timeout:?}"))?
            .with_context(|| format!("cannot connect to {target}"))?;
        tcp.set_nodelay(true)
            .with_context(|| format!("setting TCP_NODELAY towards {target}"))?;
        let (send, connection) = h2::client::handshake(tcp)
            .await
            .with_context(|| format!("HTTP/2 handshake with {target}"))?;
        tokio::spawn(async move {
            // The connection ends when every clone of the client is gone, or the server closes
            // it; a call in flight then fails with its own error.
            let _ = connection.await;
        });
        Ok(Client { send, uri })
    }

    /// Makes one `ShouldRateLimit` call, which fails with `DEADLINE_EXCEEDED` once `deadline`
    /// has passed without an answer.
    pub async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
        deadline: &Deadline,
    ) -> Result<RateLimitResponse, Failed> {
        tokio::time::timeout(deadline.timeout, self.call(request, deadline))
            .await
            .unwrap_or(Err(Failed(tonic::Code::DeadlineExceeded)))
    }

    async fn call(
        &self,
        request: &RateLimitRequest,
        deadline: &Deadline,
    ) -> Result<RateLimitResponse, Failed> {
        let unavailable = |_| Failed(tonic::Code::Unavailable);
        let mut head = Request::builder()
            .method(Method::POST)
            .uri(self.uri.clone())
            .body(())
            .map_err(|_| Failed(tonic::Code::Internal))?;
        let headers = head.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("te", HeaderValue::from_static("trailers"));
        headers.insert("grpc-timeout", deadline.header.clone());

        let mut send = self.send.clone().ready().await.map_err(unavailable)?;
        let (response, mut stream) = send.send_request(head, false).map_err(unavailable)?;
        stream
            .send_data(frame(request), true)
            .map_err(unavailable)?;

        let response = response.await.map_err(unavailable)?;
        // A call that fails before any message may answer with headers only.
        if let Some(code) = status(response.headers()) {
            return Err(Failed(code));
        }
        let mut body = response.into_body();
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(unavailable)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            message.put(chunk);
        }
        let trailers = body.trailers().await.map_err(unavailable)?;
        match trailers.as_ref().and_then(status) {
            None => return Err(Failed(tonic::Code::Internal)),
            Some(tonic::Code::Ok) => {}
            Some(code) => return Err(Failed(code)),
        }
        if message.len() < PREFIX || message[0] != 0 {
            return Err(Failed(tonic::Code::Internal));
        }
        let mut payload = message.freeze();
        payload.advance(PREFIX);
        RateLimitResponse::decode(payload).map_err(|_| Failed(tonic::Code::Internal))
    }
}

/// `request` as one uncompressed gRPC message.
fn frame(request: &RateLimitRequest) -> Bytes {
    let len = request.encoded_len();
    let mut buf = BytesMut::with_capacity(PREFIX + len);
    buf.put_u8(0);
    buf.put_u32(len as u32);
    // Cannot fail: the buffer was sized for the message.
    let _ = request.encode(&mut buf);
    buf.freeze()
}

/// The call's `grpc-status`, if `headers` carry one.
fn status(headers: &HeaderMap) -> Option<tonic::Code> {
    let value = headers
        .get("grpc-status")?
        .to_str()
        .ok()?
        .parse::<i32>()
        .ok()?;
    Some(tonic::Code::from_i32(value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_the_prefixed_message() {
        let request = RateLimitRequest {
            domain: "d".into(),
            ..Default::default()
        };
        let frame = frame(&request);
        assert_eq!(frame[0], 0);
        assert_eq!(
            u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize,
            frame.len() - PREFIX
        );
        assert_eq!(RateLimitRequest::decode(&frame[PREFIX..]).unwrap(), request);
    }

    #[test]
    fn the_deadline_is_in_milliseconds() {
        assert_eq!(Deadline::new(Duration::from_secs(2)).header, "2000m");
        assert_eq!(
            Deadline::new(Duration::from_secs(1_000_000)).header,
            "99999999m"
        );
    }

    #[tokio::test]
    async fn a_call_unanswered_by_its_deadline_fails_with_deadline_exceeded() {
        // A real HTTP/2 server that takes the call and never answers it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap().to_string();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut connection = h2::server::handshake(tcp).await.unwrap();
            let mut held = Vec::new();
            while let Some(Ok(call)) = connection.accept().await {
                held.push(call);
            }
        });
        let client = Client::connect(&target, Duration::from_secs(5))
            .await
            .unwrap();
        let (request, deadline) = (
            RateLimitRequest::default(),
            Deadline::new(Duration::from_millis(100)),
        );
        let call = client.should_rate_limit(&request, &deadline);
        // Far beyond the deadline: a client that ignored it fails here rather than hanging.
        let answer = tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("the call outlived its deadline");
        assert_eq!(answer, Err(Failed(tonic::Code::DeadlineExceeded)));
        server.abort();
    }

    #[test]
    fn a_status_is_read_from_its_header() {
        let mut headers = HeaderMap::new();
        assert_eq!(status(&headers), None);
        headers.insert("grpc-status", HeaderValue::from_static("8"));
        assert_eq!(status(&headers), Some(tonic::Code::ResourceExhausted));
    }
}
