//! Loopback ports for the servers a test starts.

use std::net::{SocketAddr, TcpListener};

/// A `127.0.0.1` address whose port was free a moment ago.
///
/// The port is released before the caller binds it, so another process may take it in between;
/// the harnesses that use it restart their server on fresh ports when it fails to bind.
pub fn free_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    listener
        .local_addr()
        .expect("local address of a bound listener")
}
