//! Loopback networking for tests: free ports for the servers a test starts, and a plain HTTP
//! client for talking to them.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

/// A `127.0.0.1` address whose port was free a moment ago.
///
/// The port is released before the caller binds it, so another process may take it in between;
/// the harnesses that use it restart their server on fresh ports when it fails to bind.
pub fn free_addr() -> SocketAddr {
    let [addr] = free_addrs();
    addr
}

/// `N` distinct `127.0.0.1` addresses whose ports were free a moment ago: one server's several
/// listeners. Every probe listener stays bound until all `N` are chosen, because the kernel may
/// hand a just-released port out again at once, and two listeners of one server on the same
/// port fail its start for good rather than for a retry.
pub fn free_addrs<const N: usize>() -> [SocketAddr; N] {
    let listeners: [TcpListener; N] = std::array::from_fn(|_| {
        TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port")
    });
    listeners.map(|listener| {
        listener
            .local_addr()
            .expect("local address of a bound listener")
    })
}

/// A `127.0.0.1` address where nothing listens, so connecting is refused at once: port 1, which
/// is privileged and unassigned, and never handed out as a free port to a server a test starts.
pub fn closed_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 1))
}

/// An HTTP client that reports every status (a 429 or 500 is an answer here, not an error).
pub fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// An HTTP response: status, headers (names lower-case, in arrival order) and body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// The headers.
    pub headers: Vec<(String, String)>,
    /// The body as text.
    pub body: String,
}

impl Reply {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }
}

/// Sends one request and collects the whole response.
pub fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Reply {
    let mut request = ureq::http::Request::builder().method(method).uri(url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(body.unwrap_or_default().to_owned())
        .expect("a well-formed request");
    let mut response = agent
        .run(request)
        .unwrap_or_else(|err| panic!("{method} {url}: {err}"));
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                String::from_utf8_lossy(value.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body = response
        .body_mut()
        .read_to_string()
        .unwrap_or_else(|err| panic!("{method} {url}: reading the body: {err}"));
    Reply {
        status,
        headers,
        body,
    }
}
