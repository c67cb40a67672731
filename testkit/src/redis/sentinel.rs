//! A Redis master with replicas under a quorum of `redis-sentinel` processes, for the failover
//! tests of Sentinel's clients; built from the same launch helpers as the servers of
//! [`super`].

use super::*;

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
        wait::until(
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
        wait::until("the replicas to catch up", limit, || {
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
        wait::until("a new master", Duration::from_secs(60), || {
            self.sentinels.iter().all(|s| {
                let reply = s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name]);
                reply.lines().nth(1).map(str::trim) != Some(old.to_string().as_str())
            })
        });
        let new = self.master_port();
        wait::until(
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
