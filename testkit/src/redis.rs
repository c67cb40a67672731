//! Real Redis servers for the tests: single `redis-server` processes and a Redis Cluster of three
//! masters and three replicas, on free 127.0.0.1 ports, without persistence, each in a temporary
//! directory. Dropping a handle kills its processes and removes their directories.
//!
//! A test binary shares one server and one cluster among all its tests ([`RedisServer::shared`],
//! [`RedisCluster::shared`]), started on first use; tests keep apart by giving every backend its
//! own key prefix ([`unique_prefix`]). A test that stops, kills, flushes or watches a server
//! starts a private one instead.
//!
//! The binaries come from the Debian packages `redis-server` and `redis-tools`, which
//! `scripts/test` installs; `$TOLLGATE_REDIS_SERVER` / `$TOLLGATE_REDIS_CLI` override them.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::LazyLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::process;
use crate::wait;

mod sentinel;
pub use sentinel::SentinelGroup;

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

/// How long a cluster may take to become healthy on a loaded machine.
const CLUSTER_HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// How long a node of a cluster may stay silent before the others count it as failed. Long
/// enough that a node starved of CPU on a loaded machine is not failed over in the middle of a
/// test; short enough that a test that kills a master sees its replica take over in seconds.
const CLUSTER_NODE_TIMEOUT_MS: u32 = 5_000;

fn binary(env_var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var).filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "{name} is not installed: run scripts/test, which installs redis-server and \
             redis-tools from Debian packages (or set ${env_var})"
        )
    })
}

/// The `redis-server` binary.
pub fn redis_server_bin() -> PathBuf {
    binary("TOLLGATE_REDIS_SERVER", "redis-server")
}

/// The `redis-cli` binary.
pub fn redis_cli_bin() -> PathBuf {
    binary("TOLLGATE_REDIS_CLI", "redis-cli")
}

/// A key prefix no other backend of this process uses, starting with `tag`: what keeps tests that
/// share a server apart. It carries no hash-tag braces, which would pin every key to one slot.
pub fn unique_prefix(tag: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    assert!(
        !tag.contains(['{', '}']),
        "a key prefix must not carry a hash tag: {tag}"
    );
    format!(
        "{tag}-{}-{}:",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A loopback port that was free a moment ago, and (for cluster nodes) whose cluster bus port,
/// port + 10000, was too.
fn free_port(with_bus: bool) -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
        let port = listener.local_addr().expect("local address").port();
        if !with_bus {
            return port;
        }
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// Sends one inline command and reads whatever the server answers first; `None` when nothing
/// answers.
fn raw_command(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buffer = [0u8; 512];
    let read = stream.read(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..read]).into_owned())
}

/// Runs `command` to completion with its output collected, killing it after `limit`.
fn output_within(mut command: Command, limit: Duration) -> Result<Output, String> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = process::spawn(command).map_err(|err| err.to_string())?;
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|err| err.to_string()),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let output = child.wait_with_output().map_err(|err| err.to_string())?;
                return Err(format!(
                    "still running after {limit:?}: {}{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
    /// The program and flags the server runs under (valgrind), empty to run it directly.
    under: Vec<String>,
    child: Option<Child>,
    /// The TLS port, for a server started with [`RedisServer::start_tls`].
    tls_port: Option<u16>,
    /// Where the TLS certificate lives, removed on drop.
    cert_dir: Option<PathBuf>,
}

fn temp_dir(kind: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tollgate-{kind}-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a temporary directory");
    dir
}

impl RedisServer {
    /// A standalone server on a free port.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// The standalone server that every test of this binary may use, started on first use and
    /// killed when the process exits. Tests keep apart by key prefix ([`unique_prefix`]) and must
    /// not stop, flush or reconfigure it.
    pub fn shared() -> &'static RedisServer {
        static SHARED: LazyLock<RedisServer> = LazyLock::new(|| {
            let server = RedisServer::start();
            process::remove_at_exit(server.dir.clone());
            server
        });
        &SHARED
    }

    /// A standalone server on a free port with extra `redis-server` arguments (`--requirepass x`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::launch(extra.iter().map(|arg| arg.to_string()).collect(), false)
    }

    /// A standalone server on a free port, run under `under` (a program and its flags, such as
    /// `valgrind --tool=callgrind`), which may slow it down many times over.
    pub fn start_under(under: &[String]) -> RedisServer {
        RedisServer::launch_under(Vec::new(), false, under.to_vec())
    }

    /// A standalone server that also speaks TLS, on a second port, with a self-signed
    /// certificate made by `openssl` (clients must skip verification: `rediss://...#insecure`).
    pub fn start_tls() -> RedisServer {
        let cert_dir = temp_dir("redis-tls");
        let (cert, key) = (cert_dir.join("redis.crt"), cert_dir.join("redis.key"));
        let output = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .unwrap_or_else(|err| panic!("cannot run openssl: {err}"));
        assert!(
            output.status.success(),
            "openssl failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let tls_port = free_port(false);
        let mut server = RedisServer::launch(
            vec![
                "--tls-port".to_owned(),
                tls_port.to_string(),
                "--tls-cert-file".to_owned(),
                cert.display().to_string(),
                "--tls-key-file".to_owned(),
                key.display().to_string(),
                "--tls-ca-cert-file".to_owned(),
                cert.display().to_string(),
                "--tls-auth-clients".to_owned(),
                "no".to_owned(),
            ],
            false,
        );
        server.tls_port = Some(tls_port);
        server.cert_dir = Some(cert_dir);
        server
    }

    /// The TLS port of a server started with [`RedisServer::start_tls`].
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    fn launch(extra: Vec<String>, cluster_bus: bool) -> RedisServer {
        RedisServer::launch_under(extra, cluster_bus, Vec::new())
    }

    fn launch_under(extra: Vec<String>, cluster_bus: bool, under: Vec<String>) -> RedisServer {
        let dir = temp_dir("redis");
        for _attempt in 0..5 {
            let mut server = RedisServer {
                port: free_port(cluster_bus),
                dir: dir.clone(),
                extra: extra.clone(),
                under: under.clone(),
                child: None,
                tls_port: None,
                cert_dir: None,
            };
            if server.spawn() {
                return server;
            }
            // another process took the port in between; the drop cleans up the failed attempt
            server.dir = PathBuf::new();
        }
        let _ = std::fs::remove_dir_all(&dir);
        panic!("redis-server did not start on five different ports");
    }

    /// Starts the process on this server's port; false when it did not come up.
    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let dir = self.dir.display().to_string();
        let mut command = process::command_under(&self.under, redis_server_bin());
        command
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "no",
            ])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--dir", &dir, "--logfile", &format!("redis-{port}.log")])
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = process::spawn(command)
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", redis_server_bin().display()));
        self.child = Some(child);
        // valgrind alone takes seconds to start it
        let limit = if self.under.is_empty() { 10 } else { 120 };
        let deadline = Instant::now() + Duration::from_secs(limit);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_exited)) = child.try_wait()
            {
                self.child = None;
                return false;
            }
            if raw_command(self.port, "PING")
                .is_some_and(|reply| reply.starts_with("+PONG") || reply.starts_with("-NOAUTH"))
            {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the process (SIGKILL, like a crash); its data is gone.
    pub fn stop(&mut self) {
        self.kill();
        wait::until(
            "the stopped redis port to close",
            Duration::from_secs(5),
            || TcpStream::connect(("127.0.0.1", self.port)).is_err(),
        );
    }

    /// Starts the process again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Suspends the process (SIGSTOP): it keeps its connections but answers nothing, as a hung
    /// server does, until [`RedisServer::thaw`].
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Resumes a process stopped by [`RedisServer::freeze`] (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let pid = self.pid().expect("the server is running");
        let pid = libc::pid_t::try_from(pid).expect("a process id fits pid_t");
        // SAFETY: kill(2) with a pid this handle spawned and still owns.
        let status = unsafe { libc::kill(pid, signal) };
        assert_eq!(status, 0, "kill({pid}, {signal}) failed");
    }

    fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    /// Runs `redis-cli` against this server and answers its output, trimmed.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new(redis_cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", redis_cli_bin().display()));
        assert!(
            output.status.success(),
            "redis-cli {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// Empties the server's script cache (`SCRIPT FLUSH`).
    pub fn script_flush(&self) {
        assert_eq!(self.cli(&["SCRIPT", "FLUSH"]), "OK");
    }

    /// Every key matching `pattern` on this server.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cli(&["--scan", "--pattern", pattern])
            .lines()
            .filter(|key| !key.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Every key matching `pattern` with its TTL in ms (-1: none, -2: gone meanwhile).
    pub fn keys_with_ttls(&self, pattern: &str) -> Vec<(String, i64)> {
        self.keys(pattern)
            .into_iter()
            .map(|key| {
                let ttl = self.cli(&["PTTL", &key]);
                let ttl = ttl
                    .parse()
                    .unwrap_or_else(|_| panic!("PTTL {key}: {ttl:?}"));
                (key, ttl)
            })
            .collect()
    }

    /// A field of `INFO` (`role`, `master_link_status`, ...).
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        let info = self.cli(&["INFO", section]);
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("{field}:")))
            .map(|value| value.trim().to_owned())
    }

    /// Whether this server is a master (a standalone server always is).
    pub fn is_master(&self) -> bool {
        self.info_field("replication", "role").as_deref() == Some("master")
    }

    /// Calls per command since the last [`RedisServer::reset_stats`], from `INFO commandstats`
    /// (`evalsha`, `eval`, `cluster|slots`, ...).
    pub fn command_calls(&self) -> BTreeMap<String, u64> {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .filter_map(|line| {
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats
                    .split(',')
                    .find_map(|field| field.strip_prefix("calls="))?
                    .parse()
                    .ok()?;
                Some((name.to_owned(), calls))
            })
            .collect()
    }

    /// Zeroes the server's statistics (`CONFIG RESETSTAT`).
    pub fn reset_stats(&self) {
        assert_eq!(self.cli(&["CONFIG", "RESETSTAT"]), "OK");
    }

    /// This cluster node's view of which master serves which slots, from `CLUSTER NODES`: one
    /// `(node id, slot ranges)` per master that serves any slot, sorted.
    fn slot_view(&self) -> Vec<(String, Vec<String>)> {
        let mut view: Vec<(String, Vec<String>)> = self
            .cli(&["CLUSTER", "NODES"])
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let flags = fields.get(2)?;
                if !flags.split(',').any(|flag| flag == "master") || flags.contains("fail") {
                    return None;
                }
                // Slots being migrated are listed in brackets; these clusters never migrate.
                let slots: Vec<String> = fields
                    .iter()
                    .skip(8)
                    .filter(|range| !range.starts_with('['))
                    .map(|range| (*range).to_owned())
                    .collect();
                let id = (*fields.first()?).to_owned();
                (!slots.is_empty()).then_some((id, slots))
            })
            .collect();
        view.sort();
        view
    }

    /// Whether this cluster node serves `slot`, by the `myself` line of its `CLUSTER NODES`.
    fn owns_slot(&self, slot: u16) -> bool {
        let nodes = self.cli(&["CLUSTER", "NODES"]);
        let Some(myself) = nodes.lines().find(|line| line.contains("myself")) else {
            return false;
        };
        myself.split_whitespace().skip(8).any(|range| {
            let mut bounds = range.split('-');
            let low = bounds.next().and_then(|b| b.parse::<u16>().ok());
            let high = bounds.next().and_then(|b| b.parse::<u16>().ok()).or(low);
            matches!((low, high), (Some(low), Some(high)) if (low..=high).contains(&slot))
        })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if let Some(dir) = self.cert_dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A Redis Cluster of three masters and three replicas, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    /// Every node, masters and replicas in creation order (`--cluster create` makes the first
    /// three masters).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts six cluster-enabled nodes, joins them into a cluster with one replica per master,
    /// and waits until it is healthy (see [`RedisCluster::wait_healthy`]). A creation that fails
    /// on a loaded machine is tried again with fresh nodes.
    pub fn start() -> RedisCluster {
        let mut failures = Vec::new();
        for _attempt in 0..3 {
            let nodes: Vec<RedisServer> = (0..6).map(|_| RedisServer::launch_node()).collect();
            let mut create = Command::new(redis_cli_bin());
            create.arg("--cluster").arg("create");
            for node in &nodes {
                create.arg(format!("127.0.0.1:{}", node.port()));
            }
            create.args(["--cluster-replicas", "1", "--cluster-yes"]);
            match output_within(create, CLUSTER_HEALTHY_WITHIN) {
                Ok(output) if output.status.success() => {
                    let cluster = RedisCluster { nodes };
                    cluster.wait_healthy(CLUSTER_HEALTHY_WITHIN);
                    return cluster;
                }
                Ok(output) => failures.push(format!(
                    "{}: {}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                )),
                Err(err) => failures.push(err),
            }
        }
        panic!(
            "redis-cli --cluster create failed three times:\n{}",
            failures.join("\n")
        );
    }

    /// The cluster that every test of this binary may use, started on first use and killed when
    /// the process exits. Tests keep apart by key prefix ([`unique_prefix`]) and must not stop,
    /// fail over or flush its nodes.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: LazyLock<RedisCluster> = LazyLock::new(|| {
            let cluster = RedisCluster::start();
            for node in &cluster.nodes {
                process::remove_at_exit(node.dir.clone());
            }
            cluster
        });
        &SHARED
    }

    /// The seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes still running.
    pub fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.is_running())
    }

    /// The running masters.
    pub fn masters(&self) -> impl Iterator<Item = &RedisServer> {
        self.running().filter(|node| node.is_master())
    }

    /// Waits until every running node sees the cluster ok with all slots served and every node
    /// known, every running node agrees on which master serves which slots, and every running
    /// replica is in sync with its master. Only then does a client that asks any node find its
    /// way on the first try.
    pub fn wait_healthy(&self, limit: Duration) {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        wait::until("the redis cluster to be healthy", limit, || {
            let healthy = self.running().all(|node| {
                let info = node.cli(&["CLUSTER", "INFO"]);
                let ok = info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && info.contains(&known);
                let synced = match node.info_field("replication", "role").as_deref() {
                    Some("slave") => {
                        node.info_field("replication", "master_link_status")
                            .as_deref()
                            == Some("up")
                    }
                    Some("master") => true,
                    _ => false,
                };
                ok && synced
            });
            healthy && self.slot_map_agreed()
        });
    }

    /// Whether every running node reports the same masters serving the same slots.
    fn slot_map_agreed(&self) -> bool {
        let mut views = self.running().map(RedisServer::slot_view);
        let Some(first) = views.next() else {
            return false;
        };
        !first.is_empty() && views.all(|view| view == first)
    }

    /// Waits until every running master's replicas have acknowledged all of its writes, so a
    /// failover loses nothing.
    pub fn wait_replicas_synced(&self, limit: Duration) {
        wait::until("the replicas to catch up", limit, || {
            self.masters().all(|master| {
                let info = master.cli(&["INFO", "replication"]);
                let offset = info
                    .lines()
                    .find_map(|line| line.strip_prefix("master_repl_offset:"))
                    .map(str::trim);
                let replicas: Vec<&str> = info
                    .lines()
                    .filter(|line| line.starts_with("slave") && line.contains("offset="))
                    .collect();
                !replicas.is_empty()
                    && replicas.iter().all(|line| {
                        line.split(',')
                            .find_map(|field| field.strip_prefix("offset="))
                            .map(str::trim)
                            == offset
                    })
            })
        });
    }

    /// The running node that is master of `key`'s slot.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        self.masters()
            .find(|node| node.owns_slot(slot))
            .unwrap_or_else(|| panic!("no running master owns slot {slot}"))
    }

    /// Kills the master of `key`'s slot and waits until its replica has taken over and every
    /// node agrees on it. Answers the index of the killed node in [`RedisCluster::nodes`].
    pub fn fail_over_master_of(&mut self, key: &str) -> usize {
        let slot = self.slot_of(key);
        let port = self.master_of(key).port();
        let index = self
            .nodes
            .iter()
            .position(|node| node.port() == port)
            .expect("the master is one of the nodes");
        self.nodes[index].stop();
        // The replica notices after the node timeout, is elected and serves the slots; until the
        // others have marked the old master failed, they may still route to it.
        wait::until(
            "a replica to take over the killed master's slots",
            CLUSTER_HEALTHY_WITHIN,
            || {
                let promoted = self.masters().any(|node| node.owns_slot(slot));
                promoted
                    && self.running().all(|node| {
                        let info = node.cli(&["CLUSTER", "INFO"]);
                        info.contains("cluster_state:ok")
                            && info.contains("cluster_slots_ok:16384")
                            && node.cli(&["CLUSTER", "NODES"]).contains("fail")
                    })
                    && self.slot_map_agreed()
            },
        );
        index
    }

    /// Stops every node (a whole-cluster outage).
    pub fn stop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
    }

    /// Starts every node again, masters first (creation order): each comes back with its
    /// cluster config and no data. Waits until the cluster is healthy.
    pub fn restart(&mut self) {
        for node in &mut self.nodes {
            node.restart();
        }
        self.wait_healthy(CLUSTER_HEALTHY_WITHIN);
    }

    /// The cluster slot of `key`, as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> u16 {
        let any = self.running().next().expect("a running node");
        any.cli(&["CLUSTER", "KEYSLOT", key])
            .parse()
            .expect("CLUSTER KEYSLOT answers a number")
    }

    /// Runs `SCRIPT FLUSH` on every running node.
    pub fn script_flush(&self) {
        for node in self.running() {
            node.script_flush();
        }
    }

    /// Every key matching `pattern` on the running masters, with its TTL in ms.
    pub fn keys_with_ttls(&self, pattern: &str) -> Vec<(String, i64)> {
        self.masters()
            .flat_map(|node| node.keys_with_ttls(pattern))
            .collect()
    }

    /// The slot map from `CLUSTER SHARDS` of a running node: each shard's master and its slots,
    /// checked to cover all 16384 slots once.
    pub fn slot_map(&self) -> Vec<SlotOwner> {
        let any = self.running().next().expect("a running node");
        let reply = any.cli(&["--json", "CLUSTER", "SHARDS"]);
        let shards: serde_json::Value = serde_json::from_str(&reply)
            .unwrap_or_else(|err| panic!("CLUSTER SHARDS {reply}: {err}"));
        let mut owners = Vec::new();
        for shard in shards.as_array().expect("CLUSTER SHARDS answers a list") {
            let bounds: Vec<u16> = shard["slots"]
                .as_array()
                .expect("a shard's slots")
                .iter()
                .map(|b| {
                    b.as_u64()
                        .and_then(|b| u16::try_from(b).ok())
                        .expect("a slot")
                })
                .collect();
            if bounds.is_empty() {
                continue;
            }
            let master = shard["nodes"]
                .as_array()
                .expect("a shard's nodes")
                .iter()
                .find(|node| node["role"] == "master" && node["health"] == "online")
                .expect("a shard with slots has an online master");
            owners.push(SlotOwner {
                port: master["port"]
                    .as_u64()
                    .and_then(|p| u16::try_from(p).ok())
                    .expect("a port"),
                ranges: bounds.chunks(2).map(|pair| (pair[0], pair[1])).collect(),
            });
        }
        let served: u32 = owners
            .iter()
            .flat_map(|owner| &owner.ranges)
            .map(|&(first, last)| u32::from(last - first) + 1)
            .sum();
        assert_eq!(served, 16_384, "{owners:?}");
        owners
    }
}

impl RedisServer {
    /// One cluster-enabled node, not yet part of a cluster.
    fn launch_node() -> RedisServer {
        let timeout = CLUSTER_NODE_TIMEOUT_MS.to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
        ];
        RedisServer::launch(args.iter().map(|arg| arg.to_string()).collect(), true)
    }
}

/// A master of a Redis Cluster and the slots it serves, as the live cluster reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotOwner {
    /// The master's port on 127.0.0.1.
    pub port: u16,
    /// The inclusive slot ranges it serves.
    pub ranges: Vec<(u16, u16)>,
}

impl SlotOwner {
    /// Whether this master serves `slot`.
    pub fn owns(&self, slot: u16) -> bool {
        self.ranges
            .iter()
            .any(|&(first, last)| (first..=last).contains(&slot))
    }
}

/// Watches the commands clients send to some Redis servers (with `redis-cli monitor`), leaving
/// out the ones scripts run inside Redis, which `INFO commandstats` would count alike. Meant for
/// private servers: it sees every client's commands.
pub struct Monitor {
    watched: Vec<Watched>,
}

/// One `redis-cli monitor` and the thread that collects its lines up to the end marker.
struct Watched {
    port: u16,
    child: Child,
    reader: JoinHandle<Vec<String>>,
}

/// A command sent by [`Monitor::stop`] after everything it should count: the monitors read up to
/// its line, so nothing that ran before is missed, however late its line arrives.
const MONITOR_END: &str = "tollgate-monitor-end";

impl Monitor {
    /// Starts watching `servers`; returns once every monitor is live.
    pub fn watch<'a>(servers: impl IntoIterator<Item = &'a RedisServer>) -> Monitor {
        let mut watched = Vec::new();
        for server in servers {
            let mut command = Command::new(redis_cli_bin());
            command
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &server.port().to_string(),
                    "monitor",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped());
            let mut child = process::spawn(command).expect("redis-cli monitor starts");
            let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
            // MONITOR answers OK once it is watching.
            assert_eq!(lines.next().and_then(Result::ok).as_deref(), Some("OK"));
            let reader = std::thread::spawn(move || {
                lines
                    .map_while(Result::ok)
                    .take_while(|line| !line.contains(MONITOR_END))
                    .collect()
            });
            watched.push(Watched {
                port: server.port(),
                child,
                reader,
            });
        }
        Monitor { watched }
    }

    /// Stops watching and counts each client command by name (lower case).
    pub fn stop(self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for mut watched in self.watched {
            let marker = Command::new(redis_cli_bin())
                .args(["-h", "127.0.0.1", "-p", &watched.port.to_string()])
                .args(["ECHO", MONITOR_END])
                .output()
                .expect("run redis-cli ECHO");
            assert!(marker.status.success(), "{marker:?}");
            let lines = watched.reader.join().expect("the monitor reader");
            let _ = watched.child.kill();
            let _ = watched.child.wait();
            for line in lines {
                // `<time> [<db> <source>] "<command>" ...`; scripts' commands have source `lua`.
                let Some((source, rest)) = line.split_once("] ") else {
                    continue;
                };
                if source.ends_with(" lua") {
                    continue;
                }
                let name = rest.split('"').nth(1).unwrap_or("").to_ascii_lowercase();
                *counts.entry(name).or_insert(0) += 1;
            }
        }
        counts
    }
}

impl RedisServer {
    /// A standalone server that speaks only TLS on a second port with a certificate `ca`
    /// issued for 127.0.0.1 and localhost, and requires clients to present a certificate that
    /// `ca` signed. The plain port stays for the harness's own checks.
    pub fn start_mutual_tls(ca: &crate::certs::Ca, extra: &[&str]) -> RedisServer {
        let cert_dir = temp_dir("redis-mtls");
        let server = ca.issue(
            "redis",
            &["127.0.0.1", "localhost"],
            crate::certs::Usage::Server,
        );
        let (cert, key) = server.write(&cert_dir, "redis");
        let ca_path = cert_dir.join("ca.crt");
        ca.write(&ca_path);
        let tls_port = free_port(false);
        let mut args = vec![
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            cert.display().to_string(),
            "--tls-key-file".to_owned(),
            key.display().to_string(),
            "--tls-ca-cert-file".to_owned(),
            ca_path.display().to_string(),
            "--tls-auth-clients".to_owned(),
            "yes".to_owned(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        let mut server = RedisServer::launch(args, false);
        server.tls_port = Some(tls_port);
        server.cert_dir = Some(cert_dir);
        server
    }
}
