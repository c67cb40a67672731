//! Real Redis servers for the tests: single `redis-server` processes and a Redis Cluster of three
//! masters and three replicas, on free 127.0.0.1 ports, without persistence, each in a temporary
//! directory. Dropping a handle kills its processes and removes their directories.
//!
//! The binaries come from the Debian packages `redis-server` and `redis-tools`, which
//! `scripts/test` installs; `$TOLLGATE_REDIS_SERVER` / `$TOLLGATE_REDIS_CLI` override them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);

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

/// Polls `check` until it holds, panicking with `what` after `limit`.
pub fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    extra: Vec<String>,
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

    /// A standalone server on a free port with extra `redis-server` arguments (`--requirepass x`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::launch(extra.iter().map(|arg| arg.to_string()).collect(), false)
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
        let dir = temp_dir("redis");
        for _attempt in 0..5 {
            let mut server = RedisServer {
                port: free_port(cluster_bus),
                dir: dir.clone(),
                extra: extra.clone(),
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
        let mut command = Command::new(redis_server_bin());
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
        let child = crate::process::spawn(command)
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", redis_server_bin().display()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
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
        wait_until(
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

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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

    /// Every key matching `pattern` with its TTL in ms (-1: none, -2: gone meanwhile).
    pub fn keys_with_ttls(&self, pattern: &str) -> Vec<(String, i64)> {
        let listing = self.cli(&["--scan", "--pattern", pattern]);
        listing
            .lines()
            .filter(|key| !key.is_empty())
            .map(|key| {
                let ttl = self.cli(&["PTTL", key]);
                let ttl = ttl
                    .parse()
                    .unwrap_or_else(|_| panic!("PTTL {key}: {ttl:?}"));
                (key.to_owned(), ttl)
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
    /// and waits until every node reports the cluster ok and every replica is in sync.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..6)
            .map(|_| {
                RedisServer::launch(
                    [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "1000",
                    ]
                    .iter()
                    .map(|arg| arg.to_string())
                    .collect(),
                    true,
                )
            })
            .collect();
        let mut create = Command::new(redis_cli_bin());
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let output = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap_or_else(|err| panic!("cannot run redis-cli --cluster create: {err}"));
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    /// The seed URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes still running.
    pub fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.is_running())
    }

    /// Waits until every running node sees the cluster ok with all slots served and agrees on
    /// the topology, and every running replica is in sync with its master.
    pub fn wait_healthy(&self, limit: Duration) {
        wait_until("the redis cluster to be healthy", limit, || {
            self.running().all(|node| {
                let info = node.cli(&["CLUSTER", "INFO"]);
                let ok =
                    info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384");
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
            })
        });
    }

    /// Waits until every running master's replicas have acknowledged all of its writes, so a
    /// failover loses nothing.
    pub fn wait_replicas_synced(&self, limit: Duration) {
        wait_until("the replicas to catch up", limit, || {
            self.running()
                .filter(|node| node.info_field("replication", "role").as_deref() == Some("master"))
                .all(|master| {
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
        self.running()
            .find(|node| {
                node.info_field("replication", "role").as_deref() == Some("master")
                    && node.owns_slot(slot)
            })
            .unwrap_or_else(|| panic!("no running master owns slot {slot}"))
    }

    /// Kills the master of `key`'s slot and waits until its replica has taken over and the
    /// cluster is ok again. Answers the index of the killed node in [`RedisCluster::nodes`].
    pub fn fail_over_master_of(&mut self, key: &str) -> usize {
        let slot = self.slot_of(key);
        let port = self.master_of(key).port();
        let index = self
            .nodes
            .iter()
            .position(|node| node.port() == port)
            .expect("the master is one of the nodes");
        self.nodes[index].stop();
        // the replica notices after the node timeout (1 s), is elected and serves the slots;
        // until the others notice too, they may still call the cluster ok
        wait_until(
            "a replica to take over the killed master's slots",
            Duration::from_secs(60),
            || {
                let promoted = self.running().any(|node| {
                    node.info_field("replication", "role").as_deref() == Some("master")
                        && node.owns_slot(slot)
                });
                promoted
                    && self.running().all(|node| {
                        let info = node.cli(&["CLUSTER", "INFO"]);
                        info.contains("cluster_state:ok")
                            && info.contains("cluster_slots_ok:16384")
                            && node.cli(&["CLUSTER", "NODES"]).contains("fail")
                    })
            },
        );
        index
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
        self.running()
            .filter(|node| node.info_field("replication", "role").as_deref() == Some("master"))
            .flat_map(|node| node.keys_with_ttls(pattern))
            .collect()
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

impl RedisCluster {
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

    /// The running masters.
    pub fn masters(&self) -> impl Iterator<Item = &RedisServer> {
        self.running()
            .filter(|node| node.info_field("replication", "role").as_deref() == Some("master"))
    }
}

impl RedisServer {
    /// Every key matching `pattern` on this server.
    pub fn keys(&self, pattern: &str) -> Vec<String> {
        self.cli(&["--scan", "--pattern", pattern])
            .lines()
            .filter(|key| !key.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Calls per command since the last [`RedisServer::reset_stats`], from `INFO commandstats`
    /// (`evalsha`, `eval`, `cluster|slots`, ...).
    pub fn command_calls(&self) -> std::collections::BTreeMap<String, u64> {
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

/// A Redis master with replicas watched by a quorum of `redis-sentinel` processes
/// (`redis-server --sentinel`), all on free loopback ports, for failover tests.
pub struct SentinelGroup {
    /// The data nodes: the first starts as master, the others replicate it.
    pub servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    master_name: String,
}

/// One `redis-server --sentinel` process.
struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl SentinelGroup {
    /// A master named `master_name` with `replicas` replicas and `sentinels` sentinels whose
    /// quorum is a majority; waits until every sentinel knows every replica and the other
    /// sentinels, and every replica is in sync.
    pub fn start(master_name: &str, replicas: usize, sentinels: usize) -> SentinelGroup {
        let master = RedisServer::start();
        let mut servers = vec![master];
        let master_port = servers[0].port().to_string();
        for _ in 0..replicas {
            servers.push(RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &master_port,
                "--replica-announce-ip",
                "127.0.0.1",
            ]));
        }
        let quorum = sentinels / 2 + 1;
        let sentinels: Vec<SentinelProcess> = (0..sentinels)
            .map(|_| SentinelProcess::start(master_name, servers[0].port(), quorum))
            .collect();
        let group = SentinelGroup {
            servers,
            sentinels,
            master_name: master_name.to_owned(),
        };
        let others = group.sentinels.len() - 1;
        wait_until(
            "the sentinels to discover the replicas and each other",
            Duration::from_secs(60),
            || {
                group.sentinels.iter().all(|sentinel| {
                    let replicas = sentinel.count(&["SENTINEL", "REPLICAS", master_name]);
                    let peers = sentinel.count(&["SENTINEL", "SENTINELS", master_name]);
                    replicas == replicas_expected(&group) && peers == others
                })
            },
        );
        group.wait_replicas_synced(Duration::from_secs(30));
        group
    }

    /// The master name the sentinels watch.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinels' addresses, `127.0.0.1:<port>`.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// The reference's sentinel `REDIS_URL`: `<master name>,<sentinel>,<sentinel>...`.
    pub fn url(&self) -> String {
        let mut parts = vec![self.master_name.clone()];
        parts.extend(self.sentinel_addrs());
        parts.join(",")
    }

    /// The port of the master the sentinels name now.
    pub fn master_port(&self) -> u16 {
        let reply =
            self.sentinels[0].cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name]);
        reply
            .lines()
            .nth(1)
            .and_then(|port| port.trim().parse().ok())
            .unwrap_or_else(|| panic!("SENTINEL GET-MASTER-ADDR-BY-NAME answered {reply:?}"))
    }

    /// The data node that is master now.
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .expect("the master is one of the servers")
    }

    /// Waits until the master's replicas have acknowledged all its writes.
    pub fn wait_replicas_synced(&self, limit: Duration) {
        wait_until("the replicas to catch up", limit, || {
            let master = self.master();
            let info = master.cli(&["INFO", "replication"]);
            let offset = info
                .lines()
                .find_map(|line| line.strip_prefix("master_repl_offset:"))
                .map(str::trim);
            let replicas: Vec<&str> = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains("offset="))
                .collect();
            replicas.len() == self.servers.len() - 1
                && replicas.iter().all(|line| {
                    line.split(',')
                        .find_map(|field| field.strip_prefix("offset="))
                        .map(str::trim)
                        == offset
                })
        });
    }

    /// Forces a failover (`SENTINEL FAILOVER`) and waits until the sentinels name a new master
    /// that serves writes and the old one has turned replica. Answers the new master's port.
    pub fn fail_over(&self) -> u16 {
        let old = self.master_port();
        let answer = self.sentinels[0].cli(&["SENTINEL", "FAILOVER", &self.master_name]);
        assert_eq!(answer, "OK", "SENTINEL FAILOVER answered {answer:?}");
        wait_until("a new master", Duration::from_secs(60), || {
            self.sentinels.iter().all(|s| {
                let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name]);
                reply.lines().nth(1).map(str::trim) != Some(old.to_string().as_str())
            })
        });
        let new = self.master_port();
        wait_until(
            "the new master to serve and the old one to replicate it",
            Duration::from_secs(60),
            || {
                let role = |port: u16| {
                    self.servers
                        .iter()
                        .find(|s| s.port() == port)
                        .and_then(|s| s.info_field("replication", "role"))
                };
                role(new).as_deref() == Some("master") && role(old).as_deref() == Some("slave")
            },
        );
        new
    }
}

fn replicas_expected(group: &SentinelGroup) -> usize {
    group.servers.len() - 1
}

impl SentinelProcess {
    fn start(master_name: &str, master_port: u16, quorum: usize) -> SentinelProcess {
        for _attempt in 0..5 {
            let port = free_port(false);
            let dir = temp_dir("sentinel");
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     logfile sentinel-{port}.log\n\
                     sentinel announce-ip 127.0.0.1\n\
                     sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n\
                     sentinel down-after-milliseconds {master_name} 2000\n\
                     sentinel failover-timeout {master_name} 10000\n\
                     sentinel parallel-syncs {master_name} 1\n",
                    dir = dir.display()
                ),
            )
            .expect("write sentinel.conf");
            let mut command = Command::new(redis_server_bin());
            command
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            let child = crate::process::spawn(command)
                .unwrap_or_else(|err| panic!("cannot run redis-server --sentinel: {err}"));
            let mut sentinel = SentinelProcess {
                port,
                dir,
                child: Some(child),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Some(child) = sentinel.child.as_mut()
                    && let Ok(Some(_)) = child.try_wait()
                {
                    sentinel.child = None;
                    break;
                }
                if raw_command(port, "PING").is_some_and(|reply| reply.starts_with("+PONG")) {
                    return sentinel;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("redis-server --sentinel did not start on five different ports");
    }

    fn cli(&self, args: &[&str]) -> String {
        let output = Command::new(redis_cli_bin())
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", redis_cli_bin().display()));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// How many entries a `SENTINEL REPLICAS|SENTINELS` listing has (each begins with `name`).
    fn count(&self, args: &[&str]) -> usize {
        self.cli(args)
            .lines()
            .filter(|line| line.trim() == "name")
            .count()
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
