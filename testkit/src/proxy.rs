//! A TCP proxy in front of a real server that can cut a connection at the worst moment: after
//! the server has received a command (and run it) but before its reply reaches the client. That
//! is what a node dying or a network path breaking mid-call looks like to the client, made
//! exact: a test can then check that nothing is sent again when it may already have run.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A proxy on a free 127.0.0.1 port, forwarding every connection to `127.0.0.1:<target>`. It
/// stops accepting when dropped; connections it carries end with their peers.
pub struct CutProxy {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Bytes whose next appearance in a client's command arms a cut.
    armed: Mutex<Option<Vec<u8>>>,
    cuts: AtomicU32,
    stopped: AtomicBool,
}

impl CutProxy {
    /// Starts forwarding to `127.0.0.1:<target>`.
    pub fn start(target: u16) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let shared = Arc::new(Shared::default());
        let accepting = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if accepting.stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                carry(client, server, Arc::clone(&accepting));
            }
        });
        CutProxy { port, shared }
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Arms one cut: the next client data containing `needle` is passed on to the server, and
    /// the connection that carried it is closed before the server's reply reaches the client.
    pub fn cut_after(&self, needle: &[u8]) {
        *self.shared.armed.lock().expect("the proxy's state") = Some(needle.to_vec());
    }

    /// How many connections have been cut so far.
    pub fn cuts(&self) -> u32 {
        self.shared.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wakes the accepting thread so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Copies both ways between `client` and `server` on two threads, cutting as armed.
fn carry(client: TcpStream, server: TcpStream, shared: Arc<Shared>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let cut = Arc::new(AtomicBool::new(false));
    let (Ok(mut client_in), Ok(mut server_out)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let upstream_cut = Arc::clone(&cut);
    let upstream_shared = Arc::clone(&shared);
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            let read = match client_in.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let chunk = &buffer[..read];
            {
                let mut armed = upstream_shared.armed.lock().expect("the proxy's state");
                if armed.as_ref().is_some_and(|needle| contains(chunk, needle)) {
                    *armed = None;
                    upstream_cut.store(true, Ordering::SeqCst);
                }
            }
            if server_out.write_all(chunk).is_err() {
                break;
            }
        }
        let _ = server_out.shutdown(Shutdown::Write);
    });
    let (mut server_in, mut client_out) = (server, client);
    thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            let read = match server_in.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            if cut.load(Ordering::SeqCst) {
                // The server has answered the armed command: it ran. The client never hears so.
                shared.cuts.fetch_add(1, Ordering::SeqCst);
                let _ = client_out.shutdown(Shutdown::Both);
                let _ = server_in.shutdown(Shutdown::Both);
                return;
            }
            if client_out.write_all(&buffer[..read]).is_err() {
                break;
            }
        }
        let _ = client_out.shutdown(Shutdown::Both);
    });
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty()
        && haystack
            .windows(needle.len())
            .any(|window| window == needle)
}
