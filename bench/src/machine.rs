//! The conditions of a run: the machine, the software measured and how busy the machine was,
//! kept with every scenario's results so a report says what its numbers mean.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

/// The machine and the software measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// CPUs this process may run on.
    pub cpus: usize,
    /// CPU model name.
    pub model: String,
    /// Hypervisor vendor when the machine is a virtual machine, else empty.
    pub hypervisor: String,
    /// Physical memory in GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// `redis-server --version`, up to the build details.
    pub redis: String,
    /// `rustc --version`.
    pub rustc: String,
    /// `git describe --always --dirty` of the tree.
    pub commit: String,
    /// The tollgate binary measured.
    pub tollgate_bin: String,
    /// Its build profile, from its path (`release`, `debug`, or `unknown`).
    pub profile: String,
}

impl Machine {
    /// The CPUs as a report names them: "2 CPUs (model, KVM guest)".
    pub fn cpus_text(&self) -> String {
        let model = if self.model.is_empty() {
            "unknown CPU".to_owned()
        } else if self.hypervisor.is_empty() {
            self.model.clone()
        } else {
            format!("{}, {} guest", self.model, self.hypervisor)
        };
        format!("{} CPUs ({model})", self.cpus)
    }

    /// Describes this machine and the tollgate binary at `tollgate_bin`.
    pub fn describe(tollgate_bin: &Path) -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                (name.trim() == "model name").then(|| value.trim().to_owned())
            })
            .unwrap_or_default();
        let hypervisor = command_output("lscpu", &[])
            .lines()
            .find_map(|line| line.strip_prefix("Hypervisor vendor:"))
            .map(|vendor| vendor.trim().to_owned())
            .unwrap_or_default();
        let memory_kib: f64 = std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
            .find_map(|line| line.strip_prefix("MemTotal:"))
            .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let redis_server = std::env::var("TOLLGATE_REDIS_SERVER")
            .ok()
            .filter(|path| !path.is_empty())
            .unwrap_or_else(|| "redis-server".to_owned());
        let redis = command_output(&redis_server, &["--version"]);
        let redis = redis.split(" sha=").next().unwrap_or_default().to_owned();
        let root = tollgate_testkit::tools::manifest_dir();
        let root = root.display().to_string();
        let profile = tollgate_bin
            .parent()
            .and_then(Path::file_name)
            .and_then(|name| name.to_str())
            .filter(|name| matches!(*name, "release" | "debug"))
            .unwrap_or("unknown")
            .to_owned();
        Machine {
            cpus: std::thread::available_parallelism().map_or(0, usize::from),
            model,
            hypervisor,
            memory_gib: (memory_kib / (1024.0 * 1024.0) * 10.0).round() / 10.0,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .unwrap_or_default()
                .trim()
                .to_owned(),
            redis,
            rustc: command_output("rustc", &["--version"]),
            commit: command_output("git", &["-C", &root, "describe", "--always", "--dirty"]),
            tollgate_bin: tollgate_bin.display().to_string(),
            profile,
        }
    }
}

/// When a scenario ran, at what scale, and how busy the machine was: the first record of every
/// scenario's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conditions {
    /// Start, UTC, RFC 3339 to the second.
    pub started: String,
    /// Wall-clock seconds the scenario took.
    pub seconds: f64,
    /// Load averages (1, 5, 15 min) at the start.
    pub load_start: [f64; 3],
    /// Load averages at the end.
    pub load_end: [f64; 3],
    /// Measured runs per point.
    pub runs: u32,
    /// Seconds of one measured run.
    pub duration_seconds: f64,
    /// Seconds of warmup per point.
    pub warmup_seconds: f64,
    /// Whether this was a smoke run (`--quick`).
    pub quick: bool,
    /// The machine and software.
    pub machine: Machine,
}

/// `2026-11-21T11:04:05Z` for `time`.
pub fn utc(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

/// A duration as `humantime` writes it (`5s`, `200ms`).
pub fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// The trimmed standard output of a command, or empty when it cannot run or fails.
fn command_output(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_default()
}
