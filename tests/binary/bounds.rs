//! What a hostile client can hold of the `tollgate` binary, over real sockets on loopback: one
//! HTTP/2 connection stalling 100 requests of 4 MiB messages (on the fast path and on tonic's
//! generated service), silent connections on both ports, admin connections past the file limit,
//! and admin headers dribbled byte by byte. Every bound is set short here so the tests end
//! quickly; their defaults are in docs/security.md ("Bounds").

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use prost::Message as _;
use prost::bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;
use tonic::codegen::http;

use tollgate_testkit::net::{agent, send};
use tollgate_testkit::rls::{client, request};
use tollgate_testkit::tollgate::{Tollgate, per_user_per_minute};
use tollgate_testkit::wait;

const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// How long an answer may take on a loaded machine before a test gives up on it.
const PATIENCE: Duration = Duration::from_secs(30);

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// How many file descriptors process `pid` has open.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// One ordinary ShouldRateLimit call on a connection of its own: `Ok` when answered OK.
async fn ordinary_call(grpc: SocketAddr, user: &str) -> Result<(), String> {
    let mut rls = client(grpc).await.map_err(|err| err.to_string())?;
    rls.should_rate_limit(request("edge", &[&[("user", user)]]))
        .await
        .map(|_| ())
        .map_err(|status| status.to_string())
}

/// The headers of a ShouldRateLimit call, for a stream of the test's own.
fn should_rate_limit_headers(grpc: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!("http://{grpc}{SHOULD_RATE_LIMIT}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a request")
}

/// One whole ShouldRateLimit call on an HTTP/2 connection of the test's own: how it ended.
async fn call_on(h2: &h2::client::SendRequest<Bytes>, grpc: SocketAddr) -> Result<Ended, String> {
    let mut h2 = h2.clone().ready().await.map_err(|err| err.to_string())?;
    let message = request("edge", &[&[("user", "on-h2")]]).encode_to_vec();
    let mut body = BytesMut::new();
    body.put_u8(0);
    body.put_u32(u32::try_from(message.len()).expect("a small message"));
    body.put_slice(&message);
    let (response, mut stream) = h2
        .send_request(should_rate_limit_headers(grpc), false)
        .map_err(|err| err.to_string())?;
    stream
        .send_data(body.freeze(), true)
        .map_err(|err| err.to_string())?;
    Ok(ended(response).await)
}

/// How a stalled stream ended: the gRPC status it was answered with, or the reset it got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ended {
    Status(String),
    Reset(String),
}

/// Waits for the answer of one stalled stream.
async fn ended(response: h2::client::ResponseFuture) -> Ended {
    let response = match response.await {
        Ok(response) => response,
        Err(err) => return Ended::Reset(err.to_string()),
    };
    if let Some(status) = response.headers().get("grpc-status") {
        return Ended::Status(status.to_str().unwrap_or("?").to_owned());
    }
    let mut body = response.into_body();
    while let Some(data) = body.data().await {
        if let Err(err) = data {
            return Ended::Reset(err.to_string());
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => Ended::Status(
            trailers
                .get("grpc-status")
                .and_then(|s| s.to_str().ok())
                .unwrap_or("?")
                .to_owned(),
        ),
        Ok(None) => Ended::Status("none".into()),
        Err(err) => Ended::Reset(err.to_string()),
    }
}

/// One connection opens 100 ShouldRateLimit calls, each sending the first 3 MiB of a 4 MiB
/// message and then nothing. tollgate stays under 200 MB, answers an ordinary call on another
/// connection meanwhile, refuses most of the stalled calls at once (RESOURCE_EXHAUSTED: the
/// connection's bound on unfinished messages) and the rest at the body timeout; it advertises its
/// bound on streams.
fn stalled_streams_are_bounded(fast_path: bool) {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &per_user_per_minute(1000))
        .args([
            "--grpc-body-timeout",
            "3s",
            "--grpc-max-concurrent-streams",
            "64",
            &format!("--grpc-fast-path={fast_path}"),
        ])
        .start();
    let pid = tollgate.pid().expect("tollgate's process id");
    let grpc = tollgate.grpc_addr();
    let runtime = runtime();
    let before = rss(pid);

    let (mut answers, streams, h2) = runtime.block_on(async {
        let tcp = TcpStream::connect(grpc).await.expect("connect to gRPC");
        let (mut h2, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        tokio::spawn(connection);
        // The first 3 MiB of a message announced as 4 MiB (the largest tollgate reads).
        let mut part = BytesMut::with_capacity(3 << 20);
        part.put_u8(0);
        part.put_u32(4 << 20);
        part.put_bytes(0x0a, (3 << 20) - 5);
        let part: Bytes = part.freeze();
        let mut answers = JoinSet::new();
        let mut streams = Vec::new();
        for _ in 0..100 {
            h2 = h2
                .ready()
                .await
                .expect("the connection takes another stream");
            let (response, mut stream) = h2
                .send_request(should_rate_limit_headers(grpc), false)
                .expect("open a stream");
            // h2 queues what flow control does not let through yet; the stream is never ended.
            stream
                .send_data(part.clone(), false)
                .expect("queue the part");
            streams.push(stream);
            answers.spawn(ended(response));
        }
        (answers, streams, h2)
    });

    // Meanwhile: memory stays bounded and an ordinary call is answered.
    let answered = runtime.block_on(ordinary_call(grpc, "meanwhile"));
    assert_eq!(answered, Ok(()), "an ordinary call while 100 streams stall");
    let mut peak = before;
    let ends = runtime.block_on(async {
        let mut ends = Vec::new();
        let deadline = tokio::time::Instant::now() + PATIENCE;
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        while ends.len() < 100 {
            tokio::select! {
                end = answers.join_next() => match end {
                    Some(end) => ends.push(end.expect("the answer's task")),
                    None => break,
                },
                _ = ticker.tick() => peak = peak.max(rss(pid)),
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        ends
    });
    drop(streams);
    peak = peak.max(rss(pid));
    eprintln!(
        "RSS {} MiB before, {} MiB at the peak; the stalled streams ended: {ends:?}",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < 200 << 20,
        "tollgate's RSS peaked at {} MiB (from {} MiB) while 100 streams stalled",
        peak >> 20,
        before >> 20
    );
    assert_eq!(ends.len(), 100, "every stalled stream ended: {ends:?}");
    // Read once the server's settings have certainly arrived: answers came after them.
    assert_eq!(
        h2.current_max_send_streams(),
        64,
        "MAX_CONCURRENT_STREAMS as set"
    );
    let exhausted = ends
        .iter()
        .filter(|end| **end == Ended::Status("8".into()))
        .count();
    let past_deadline = ends
        .iter()
        .filter(|end| **end == Ended::Status("4".into()))
        .count();
    let reset = ends
        .iter()
        .filter(|end| matches!(end, Ended::Reset(_)))
        .count();
    assert!(
        exhausted >= 1 && exhausted + reset >= 50,
        "most stalled streams refused at once: {ends:?}"
    );
    assert!(
        ends.iter().all(
            |end| matches!(end, Ended::Status(code) if code == "8" || code == "4")
                || matches!(end, Ended::Reset(_))
        ),
        "every stalled stream refused, cut at its deadline or reset: {ends:?}"
    );
    assert!(
        exhausted + past_deadline > 0,
        "at least one answer is tollgate's own: {ends:?}"
    );
    // And afterwards, tollgate still answers.
    let answered = runtime.block_on(ordinary_call(grpc, "after"));
    assert_eq!(answered, Ok(()), "an ordinary call afterwards");
}

#[test]
fn stalled_streams_are_bounded_on_the_fast_path() {
    stalled_streams_are_bounded(true);
}

#[test]
fn stalled_streams_are_bounded_on_tonics_service() {
    stalled_streams_are_bounded(false);
}

/// Waits until every socket of `sockets` is closed by the far end (end of file or a reset), each
/// within `limit`; answers when the last was.
async fn closed_by_server(sockets: Vec<TcpStream>, limit: Duration) -> Result<Instant, String> {
    let mut waits = JoinSet::new();
    for mut socket in sockets {
        waits.spawn(async move {
            let mut buf = [0_u8; 256];
            loop {
                match tokio::time::timeout(limit, socket.read(&mut buf)).await {
                    Err(_) => return Err("still open".to_owned()),
                    Ok(Ok(0) | Err(_)) => return Ok(()),
                    // The server's own HTTP/2 settings, or an error answer: read on.
                    Ok(Ok(_)) => {}
                }
            }
        });
    }
    let mut open = 0;
    while let Some(result) = waits.join_next().await {
        if !matches!(result, Ok(Ok(()))) {
            open += 1;
        }
    }
    if open > 0 {
        return Err(format!("{open} connections still open after {limit:?}"));
    }
    Ok(Instant::now())
}

async fn connect_many(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut sockets = Vec::with_capacity(count);
    for _ in 0..count {
        sockets.push(TcpStream::connect(addr).await.expect("connect"));
    }
    sockets
}

/// 200 connections to each port that never send anything are closed within 30 s (at the
/// timeouts set here), while a gRPC connection that made a call before them stays open.
#[test]
fn silent_connections_are_closed() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &per_user_per_minute(1000))
        .args([
            "--grpc-first-request-timeout",
            "2s",
            "--admin-header-read-timeout",
            "2s",
        ])
        .start();
    let grpc = tollgate.grpc_addr();
    let runtime = runtime();
    runtime.block_on(async {
        // A connection in use: its first request disarms the timeout.
        let tcp = TcpStream::connect(grpc).await.expect("connect to gRPC");
        let (used, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        tokio::spawn(connection);
        let first = call_on(&used, grpc).await;
        assert_eq!(
            first,
            Ok(Ended::Status("0".into())),
            "a call on the used connection"
        );
        let opened = Instant::now();
        let silent_grpc = connect_many(grpc, 200).await;
        let silent_admin = connect_many(tollgate.http_addr(), 200).await;
        let limit = Duration::from_secs(30);
        let (grpc_closed, admin_closed) = tokio::join!(
            closed_by_server(silent_grpc, limit),
            closed_by_server(silent_admin, limit)
        );
        let grpc_took = grpc_closed.expect("silent gRPC connections closed") - opened;
        let admin_took = admin_closed.expect("silent admin connections closed") - opened;
        assert!(
            grpc_took >= Duration::from_millis(1500) && admin_took >= Duration::from_millis(1500),
            "closed at the timeout, not before: gRPC {grpc_took:?}, admin {admin_took:?}"
        );
        // The connection in use outlived the timeout.
        let again = call_on(&used, grpc).await;
        assert_eq!(
            again,
            Ok(Ended::Status("0".into())),
            "the connection in use is still open"
        );
    });
}

/// With the process limited to 512 files, 600 silent admin connections do not stop a new gRPC
/// client from being served: the admin listener holds at most its connection cap (256 by
/// default) and leaves the rest in the kernel's backlog.
#[test]
fn silent_admin_connections_past_the_file_limit_leave_grpc_served() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &per_user_per_minute(1000))
        // Long enough that the silent connections stay while gRPC is tried.
        .args(["--admin-header-read-timeout", "60s"])
        .under(["prlimit", "--nofile=512:512"])
        .start();
    let pid = tollgate.pid().expect("tollgate's process id");
    let runtime = runtime();
    let admin = tollgate.http_addr();
    let held = runtime.block_on(async {
        let mut connects = JoinSet::new();
        for _ in 0..600 {
            // Past the cap and the backlog, a connection may wait: the test does not need it.
            connects.spawn(tokio::time::timeout(
                Duration::from_secs(2),
                TcpStream::connect(admin),
            ));
        }
        let mut held = Vec::new();
        while let Some(connected) = connects.join_next().await {
            if let Ok(Ok(Ok(socket))) = connected {
                held.push(socket);
            }
        }
        held
    });
    assert!(
        held.len() > 300,
        "more silent connections than the cap: {} of 600 connected",
        held.len()
    );
    wait::until(
        "tollgate holding the admin connection cap",
        PATIENCE,
        || open_files(pid) >= 256,
    );
    let answered = runtime.block_on(ordinary_call(tollgate.grpc_addr(), "new"));
    assert_eq!(answered, Ok(()), "a new gRPC client is served");
    assert!(
        open_files(pid) < 400,
        "the admin listener stays at its cap: {} files open",
        open_files(pid)
    );
    drop(held);
}

/// Past the file limit, accepting fails (EMFILE) and pauses instead of ending: once the silent
/// connections are closed at the header timeout, both listeners accept again, and the failures
/// are logged a few times, not once per attempt.
#[test]
fn accepting_survives_running_out_of_files() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &per_user_per_minute(1000))
        .args([
            "--admin-max-connections",
            "2000",
            "--admin-header-read-timeout",
            "3s",
        ])
        .under(["prlimit", "--nofile=512:512"])
        .start();
    let pid = tollgate.pid().expect("tollgate's process id");
    let runtime = runtime();
    let sockets = runtime.block_on(connect_many(tollgate.http_addr(), 600));
    wait::until("tollgate out of files", PATIENCE, || {
        tollgate.log().contains("accepting a connection failed")
    });
    let closed = runtime.block_on(closed_by_server(sockets, PATIENCE));
    closed.expect("every silent admin connection closed in the end");
    wait::until("files given back", PATIENCE, || open_files(pid) < 100);
    let answered = runtime.block_on(ordinary_call(tollgate.grpc_addr(), "after"));
    assert_eq!(answered, Ok(()), "gRPC accepts again");
    let health = send(&agent(), "GET", &tollgate.url("/healthcheck"), &[], None);
    assert_eq!(health.status, 200, "admin accepts again: {}", health.body);
    let lines = tollgate
        .log()
        .lines()
        .filter(|line| line.contains("accepting a connection failed"))
        .count();
    assert!(
        (1..=4).contains(&lines),
        "accept failures logged at most once per 10 s: {lines} lines"
    );
}

/// Sends `head` over a new connection to `addr`, then `then` over and over, one byte every
/// 100 ms, until the server closes it (at most 15 s); answers how long the server took and what
/// it answered.
async fn dribble(addr: SocketAddr, head: &'static [u8], then: &'static [u8]) -> (Duration, String) {
    let socket = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = socket.into_split();
    let started = Instant::now();
    let read = tokio::spawn(async move {
        let mut answer = Vec::new();
        let _ = reader.read_to_end(&mut answer).await;
        (
            started.elapsed(),
            String::from_utf8_lossy(&answer).into_owned(),
        )
    });
    writer.write_all(head).await.expect("send the head");
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    for byte in then.iter().cycle().take(150) {
        ticker.tick().await;
        if read.is_finished() || writer.write_all(&[*byte]).await.is_err() {
            break;
        }
    }
    read.await.expect("the reader")
}

/// Headers dribbled byte by byte to the admin port are cut at the header read timeout, with no
/// answer; so is a body dribbled after whole headers.
#[test]
fn admin_headers_dribbled_are_cut_at_the_header_timeout() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &per_user_per_minute(1000))
        .args(["--admin-header-read-timeout", "2s"])
        .start();
    let admin = tollgate.http_addr();
    let runtime = runtime();
    let (headers, body) = runtime.block_on(async {
        tokio::join!(
            dribble(
                admin,
                b"GET /healthcheck HTTP/1.1\r\nHost: x\r\n",
                b"X-Slow: y\r\n"
            ),
            dribble(
                admin,
                b"POST /json HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
                b" ",
            )
        )
    });
    for (what, (took, answer)) in [("headers", headers), ("body", body)] {
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_secs(10),
            "{what} cut at the 2 s timeout, after {took:?}"
        );
        assert!(
            !answer.contains(" 200 "),
            "no answer to {what} never finished: {answer}"
        );
    }
}
