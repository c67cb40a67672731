//! What a scenario measures: tollgate started as a process on one backend, and the Redis servers
//! behind it, with the readings the reports need (CPU time of each process, script calls per
//! Redis node).
//!
//! The Redis servers are started once per `tollgate-bench` run, on first use, by the testkit
//! (free loopback ports, no persistence) and shared by every scenario; each scenario empties them
//! before it measures. Everything started dies with this process, however it ends.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use anyhow::{Context, anyhow, bail};
use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use tollgate_testkit::redis::{RedisCluster, RedisServer};
use tollgate_testkit::tollgate::Tollgate;

use crate::proc::{Layout, Pinned};

/// The key prefix tollgate is started with.
pub const KEY_PREFIX: &str = "tollgate:";

/// Where tollgate keeps its counters.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// In the tollgate process.
    Memory,
    /// One `redis-server`.
    Redis,
    /// A Redis Cluster of three masters and three replicas.
    RedisCluster,
}

impl Backend {
    /// The name `tollgate serve --backend` takes.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis => "redis",
            Backend::RedisCluster => "redis-cluster",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The Redis servers of a run, started on first use.
#[derive(Default)]
pub struct Servers {
    redis: Option<RedisServer>,
    cluster: Option<RedisCluster>,
}

impl Servers {
    /// Starts what `backend` needs, unless it runs already.
    pub fn ensure(&mut self, backend: Backend) {
        match backend {
            Backend::Memory => {}
            Backend::Redis => {
                self.redis.get_or_insert_with(RedisServer::start);
            }
            Backend::RedisCluster => {
                self.cluster.get_or_insert_with(RedisCluster::start);
            }
        }
    }

    /// The Redis processes behind `backend` (empty for memory); [`Servers::ensure`] first.
    pub fn nodes(&self, backend: Backend) -> anyhow::Result<Nodes<'_>> {
        let not_started = || anyhow!("the {backend} servers were not started");
        Ok(match backend {
            Backend::Memory => Nodes {
                backend,
                all: Vec::new(),
                masters: Vec::new(),
            },
            Backend::Redis => {
                let server = self.redis.as_ref().ok_or_else(not_started)?;
                Nodes {
                    backend,
                    all: vec![server],
                    masters: vec![server],
                }
            }
            Backend::RedisCluster => {
                let cluster = self.cluster.as_ref().ok_or_else(not_started)?;
                Nodes {
                    backend,
                    all: cluster.running().collect(),
                    masters: cluster.masters().collect(),
                }
            }
        })
    }
}

/// The Redis processes of one backend: every node, and the masters that serve the calls.
pub struct Nodes<'a> {
    backend: Backend,
    all: Vec<&'a RedisServer>,
    masters: Vec<&'a RedisServer>,
}

impl<'a> Nodes<'a> {
    /// The nodes that serve calls (the one server, or the cluster's masters).
    pub fn masters(&self) -> &[&'a RedisServer] {
        &self.masters
    }

    /// The `--redis-url` tollgate needs for them.
    fn url(&self) -> String {
        let urls: Vec<String> = self.all.iter().map(|node| node.url()).collect();
        urls.join(",")
    }

    /// Deletes every key (`FLUSHALL` on each master; replicas follow).
    pub fn flush(&self) {
        for master in &self.masters {
            master.cli(&["FLUSHALL"]);
        }
    }

    /// Zeroes every node's statistics (`CONFIG RESETSTAT`), so `INFO commandstats` counts from
    /// here.
    pub fn reset_stats(&self) {
        for node in &self.all {
            node.reset_stats();
        }
    }

    /// Script calls (`EVALSHA` and `EVAL`, as clients sent them) served by each master since the
    /// last [`Nodes::reset_stats`], by port.
    pub fn script_calls(&self) -> anyhow::Result<BTreeMap<u16, u64>> {
        self.masters
            .iter()
            .map(|master| Ok((master.port(), script_calls(&command_stats(master)?))))
            .collect()
    }

    /// The slot ranges each master serves, by port (`0-5460`), empty for a single server.
    pub fn slots(&self) -> BTreeMap<u16, String> {
        if self.backend != Backend::RedisCluster {
            return BTreeMap::new();
        }
        self.masters
            .iter()
            .map(|master| {
                let nodes = master.cli(&["CLUSTER", "NODES"]);
                let ranges = nodes
                    .lines()
                    .find(|line| line.contains("myself"))
                    .map(|line| {
                        line.split_whitespace()
                            .skip(8)
                            .collect::<Vec<_>>()
                            .join(" ")
                    })
                    .unwrap_or_default();
                (master.port(), ranges)
            })
            .collect()
    }

    /// CPU seconds each node has used so far, by port.
    pub fn cpu_seconds(&self) -> anyhow::Result<BTreeMap<u16, f64>> {
        self.all
            .iter()
            .map(|node| Ok((node.port(), cpu_seconds(node)?)))
            .collect()
    }
}

/// User + system CPU seconds `server` has used so far, from its `INFO cpu`.
///
/// Redis reads these from getrusage(2), to the microsecond. `/proc/<pid>/stat` counts in clock
/// ticks (10 ms here) and truncates user and system time apart, so a short run of a few
/// thousand script calls could read as no CPU at all.
pub fn cpu_seconds(server: &RedisServer) -> anyhow::Result<f64> {
    parse_cpu_seconds(&server.cli(&["INFO", "cpu"]))
        .with_context(|| format!("INFO cpu of redis-server :{}", server.port()))
}

fn parse_cpu_seconds(info: &str) -> anyhow::Result<f64> {
    let field = |name: &str| -> anyhow::Result<f64> {
        info.lines()
            .find_map(|line| line.trim().strip_prefix(name)?.strip_prefix(':'))
            .ok_or_else(|| anyhow!("no {name}"))?
            .parse()
            .with_context(|| format!("{name} is not a number"))
    };
    Ok(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// Calls and CPU time of one command, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CommandStat {
    /// Times it ran (commands a script runs count here too).
    pub calls: u64,
    /// Microseconds of Redis CPU it took (a script's own commands are inside its time).
    pub usec: u64,
    /// Times it answered an error (Redis 7 and later count these; older servers leave 0).
    #[serde(default)]
    pub failed_calls: u64,
}

/// `INFO commandstats` of `server`, by command name (`evalsha`, `hset`, `cluster|slots`, ...).
pub fn command_stats(server: &RedisServer) -> anyhow::Result<BTreeMap<String, CommandStat>> {
    parse_command_stats(&server.cli(&["INFO", "commandstats"]))
}

fn parse_command_stats(info: &str) -> anyhow::Result<BTreeMap<String, CommandStat>> {
    let mut stats = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
            continue;
        };
        let (name, fields) = rest
            .split_once(':')
            .with_context(|| format!("INFO commandstats line `{line}`"))?;
        let mut stat = CommandStat::default();
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", value)) => stat.calls = value.parse()?,
                Some(("usec", value)) => stat.usec = value.parse()?,
                Some(("failed_calls", value)) => stat.failed_calls = value.parse()?,
                _ => {}
            }
        }
        stats.insert(name.to_owned(), stat);
    }
    Ok(stats)
}

/// The script calls among `stats`: what clients sent as `EVALSHA` or `EVAL`.
pub fn script_calls(stats: &BTreeMap<String, CommandStat>) -> u64 {
    ["evalsha", "eval"]
        .iter()
        .filter_map(|name| stats.get(*name))
        .map(|stat| stat.calls)
        .sum()
}

/// A server process a scenario sends load to and measures: tollgate on its stand, or the empty
/// RLS server it is compared with. Scenarios that load both ask them the same questions here.
pub trait MeasuredServer {
    /// The gRPC address to send load to.
    fn grpc_addr(&self) -> SocketAddr;

    /// The server process's id, or an error when it is no longer running.
    fn pid(&self) -> anyhow::Result<u32>;

    /// CPU seconds the server process has used so far (all its threads).
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        crate::proc::cpu_seconds(self.pid()?)
    }

    /// What the server logged, to explain a failure; empty for a server that logs nothing.
    fn log(&self) -> String;
}

impl MeasuredServer for Stand<'_> {
    fn grpc_addr(&self) -> SocketAddr {
        Stand::grpc_addr(self)
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.tollgate_pid()
    }

    fn log(&self) -> String {
        self.tollgate.log()
    }
}

/// tollgate serving one policy on one backend, and the Redis processes behind it.
pub struct Stand<'a> {
    /// Holds tollgate, Redis and the generator on the CPUs of a [`Layout`], if one was asked.
    _layout: Option<Pinned>,
    /// The tollgate process.
    pub tollgate: Tollgate,
    /// The Redis processes behind it.
    pub nodes: Nodes<'a>,
}

impl<'a> Stand<'a> {
    /// Starts `tollgate serve` with `policy` (one YAML file, domain `bench`) on `backend`, whose
    /// servers must have been started with [`Servers::ensure`], and waits until it is SERVING.
    ///
    /// `failure_mode` (`allow` or `deny`) is what a limit answers when its backend call fails or
    /// times out; a scenario picks the answer its traffic never gets otherwise, so that failures
    /// show.
    pub fn start(
        servers: &'a Servers,
        backend: Backend,
        policy: &str,
        failure_mode: &str,
    ) -> anyhow::Result<Self> {
        Stand::start_with(servers, backend, policy, failure_mode, &[])
    }

    /// [`Stand::start`] with more `tollgate serve` flags (`--max-in-flight 256`, ...).
    pub fn start_with(
        servers: &'a Servers,
        backend: Backend,
        policy: &str,
        failure_mode: &str,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        Stand::start_under(servers, backend, policy, failure_mode, extra, &[], &[])
    }

    /// [`Stand::start_with`] with environment variables of the process (`DISABLE_STATS`, ...),
    /// and tollgate run under `under` (a program and its flags, e.g. valgrind's, which keeps
    /// tollgate's process id; empty: tollgate itself).
    pub fn start_under(
        servers: &'a Servers,
        backend: Backend,
        policy: &str,
        failure_mode: &str,
        extra: &[String],
        envs: &[(&str, &str)],
        under: &[String],
    ) -> anyhow::Result<Self> {
        let nodes = servers.nodes(backend)?;
        let mut args = vec![
            "--backend".to_owned(),
            backend.name().to_owned(),
            "--failure-mode".to_owned(),
            failure_mode.to_owned(),
            "--key-prefix".to_owned(),
            KEY_PREFIX.to_owned(),
        ];
        if backend != Backend::Memory {
            args.extend(["--redis-url".to_owned(), nodes.url()]);
        }
        args.extend(extra.iter().cloned());
        let mut builder = Tollgate::builder()
            .policy("bench.yaml", policy)
            .args(args)
            .under(under.iter().cloned());
        for (name, value) in envs {
            builder = builder.env(name, value);
        }
        let tollgate = builder.start();
        Ok(Stand {
            _layout: None,
            tollgate,
            nodes,
        })
    }

    /// The gRPC address to send load to.
    pub fn grpc_addr(&self) -> SocketAddr {
        self.tollgate.grpc_addr()
    }

    /// The tollgate process's id, or what it logged when it is no longer running.
    pub fn tollgate_pid(&self) -> anyhow::Result<u32> {
        match self.tollgate.pid() {
            Some(pid) => Ok(pid),
            None => bail!("tollgate is not running:\n{}", self.tollgate.log()),
        }
    }

    /// CPU seconds the tollgate process has used so far.
    pub fn tollgate_cpu_seconds(&self) -> anyhow::Result<f64> {
        let pid = self.tollgate_pid()?;
        crate::proc::cpu_seconds(pid)
    }

    /// The resident memory of the tollgate process now, in bytes.
    pub fn tollgate_rss_bytes(&self) -> anyhow::Result<u64> {
        let pid = self.tollgate_pid()?;
        crate::proc::rss_bytes(pid)
    }

    /// CPU seconds all Redis processes behind it have used so far.
    pub fn redis_cpu_seconds(&self) -> anyhow::Result<f64> {
        Ok(self.nodes.cpu_seconds()?.values().sum())
    }

    /// [`Stand::start_with`] under `layout`: tollgate is started on the servers' CPUs, so it
    /// sizes its runtime to them, then Redis and this process (the generator) are moved onto
    /// theirs. They stay there until the stand is dropped.
    pub fn start_laid_out(
        servers: &'a Servers,
        backend: Backend,
        policy: &str,
        failure_mode: &str,
        extra: &[String],
        layout: Layout,
    ) -> anyhow::Result<Self> {
        let mut stand = layout
            .start_servers(|| Stand::start_with(servers, backend, policy, failure_mode, extra))?;
        let redis: Vec<u32> = stand
            .nodes
            .all
            .iter()
            .filter_map(|node| node.pid())
            .collect();
        stand._layout = layout.apply(&[stand.tollgate_pid()?], &redis)?;
        Ok(stand)
    }
}

impl Nodes<'_> {
    /// Holds every Redis process to `share` of a CPU ([`crate::proc::Throttle`]) until the
    /// guard is dropped: a slow backend, which a server can only answer by queueing or
    /// refusing.
    pub fn throttle(&self, share: f64) -> crate::proc::Throttle {
        let pids = self.all.iter().filter_map(|node| node.pid()).collect();
        crate::proc::Throttle::start(pids, share, std::time::Duration::from_millis(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_user_plus_system_of_the_whole_process() {
        let info = "# CPU\r\n\
            used_cpu_sys:1.250000\r\n\
            used_cpu_user:0.004512\r\n\
            used_cpu_sys_children:7.000000\r\n\
            used_cpu_user_children:7.000000\r\n\
            used_cpu_sys_main_thread:1.000000\r\n\
            used_cpu_user_main_thread:0.004000\r\n";
        assert!((parse_cpu_seconds(info).unwrap() - 1.254512).abs() < 1e-9);
        let error = parse_cpu_seconds("# CPU\r\nused_cpu_sys:1.0\r\n").unwrap_err();
        assert_eq!(error.to_string(), "no used_cpu_user");
    }

    #[test]
    fn command_stats_are_read_by_name() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=10000,usec=141746,usec_per_call=14.17,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_eval:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=2\r\n\
            cmdstat_cluster|slots:calls=2,usec=40,usec_per_call=20.00,rejected_calls=0,failed_calls=0\r\n";
        let stats = parse_command_stats(info).unwrap();
        assert_eq!(
            stats["evalsha"],
            CommandStat {
                calls: 10_000,
                usec: 141_746,
                failed_calls: 0
            }
        );
        assert_eq!(stats["eval"].failed_calls, 2);
        assert_eq!(stats["cluster|slots"].calls, 2);
        assert_eq!(script_calls(&stats), 10_003);
    }
}
