//! Readings from Linux `/proc` (CPU time of a process, the load average), and the processes
//! and tools the benchmarks run.

use std::path::PathBuf;

use anyhow::{Context, anyhow};

/// A tool the benchmarks run: the path in `$env_var` when it is set, else `name` on the `PATH`;
/// `install` says where to get it when it is neither.
pub fn find_tool(env_var: &str, name: &str, install: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(path));
    }
    std::env::var_os("PATH")
        .and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .find(|path| path.is_file())
        })
        .ok_or_else(|| anyhow!("{name} is not installed: {install}, or set ${env_var}"))
}

/// User + system CPU seconds process `pid` has used so far (all its threads).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat_cpu(&stat).with_context(|| format!("parsing {path}"))
}

/// User + system CPU seconds this process has used so far (all its threads, living or not).
///
/// From getrusage(2), to the microsecond: `/proc/self/stat` counts whole clock ticks, too
/// coarse for the generator's share of a short run.
pub fn own_cpu_seconds() -> anyhow::Result<f64> {
    // SAFETY: an all-zero rusage is a valid value for getrusage(2) to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage(2) writes only into `usage`, which lives across the call.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage(RUSAGE_SELF)");
    }
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    Ok(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// The resident set size of process `pid` (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in {path}"))?;
    Ok(kib * 1024)
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|field| field.parse().unwrap_or(0.0));
    [(); 3].map(|()| fields.next().unwrap_or(0.0))
}

/// The CPUs this machine has online, by index.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// While alive, processes moved to some of the CPUs keep them; dropping it gives every one of
/// them every CPU back.
#[derive(Debug)]
pub struct Pinned {
    cpus: usize,
    pids: Vec<u32>,
}

impl Pinned {
    /// A guard over `pids` (0: this process) on a machine of `cpus` CPUs. Made before the first
    /// pin, so that a failure part way still undoes every pin made.
    pub fn new(cpus: usize, pids: impl IntoIterator<Item = u32>) -> Pinned {
        Pinned {
            cpus,
            pids: pids.into_iter().collect(),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // A server that has exited since needs nothing back.
            if let Err(error) = pin(pid, 0..self.cpus)
                && pid == 0
            {
                eprintln!("tollgate-bench: giving the generator every CPU back: {error:#}");
            }
        }
    }
}

/// How a scenario shares the machine's CPUs between the servers it measures (tollgate, an empty
/// server), the Redis processes behind them and the load generator (this process).
///
/// A server sizes its runtime by the CPUs it may use when it starts (a worker per CPU), as a
/// sidecar held to fewer CPUs would. Moved onto fewer CPUs after it starts, it would keep a
/// worker per CPU of the machine, taking turns on the cores it has, which lengthens its tail for
/// no gain. So servers are started on their CPUs ([`Layout::start_servers`]) and only then is
/// everything else moved ([`Layout::apply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Servers and Redis on CPU 0, the generator on the others. Sharing cores, a generator
    /// sending more than a server answers competes with it for the same CPU, and its own
    /// backlog then shows as latency of the server's answers.
    GeneratorApart,
}

/// The CPUs each party runs on under a [`Layout`], by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// The measured servers'.
    pub servers: std::ops::Range<usize>,
    /// The Redis processes'.
    pub redis: std::ops::Range<usize>,
    /// The load generator's (this process).
    pub generator: std::ops::Range<usize>,
}

impl Layout {
    /// Each party's CPUs on a machine of `cpus` CPUs; `None` with one CPU, where nothing is
    /// split and everything runs where it was started.
    pub fn split(self, cpus: usize) -> Option<Split> {
        if cpus < 2 {
            return None;
        }
        Some(match self {
            Layout::GeneratorApart => Split {
                servers: 0..1,
                redis: 0..1,
                generator: 1..cpus,
            },
        })
    }

    /// Runs `start` with this process held to the servers' CPUs, so that every process it
    /// starts is born on them and sizes its runtime to them; then gives this process every CPU
    /// back.
    pub fn start_servers<T>(self, start: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
        born_on(self.split(online_cpus()).map(|split| split.servers), start)
    }

    /// Moves `servers`, `redis` and this process onto their CPUs until the guard is dropped.
    /// `None` on a machine with one CPU.
    pub fn apply(self, servers: &[u32], redis: &[u32]) -> anyhow::Result<Option<Pinned>> {
        let cpus = online_cpus();
        let Some(split) = self.split(cpus) else {
            return Ok(None);
        };
        // The guard exists before the first pin, so a failure part way still undoes them all.
        let pinned = Pinned::new(cpus, servers.iter().chain(redis).copied().chain([0]));
        for &server in servers {
            pin(server, split.servers.clone())?;
        }
        for &node in redis {
            pin(node, split.redis.clone())?;
        }
        pin(0, split.generator)?;
        Ok(Some(pinned))
    }
}

/// Runs `start` with this process held to `cpus` (children and threads inherit the CPUs of the
/// thread that makes them), then gives it every CPU back; with no CPUs given, as it is.
fn born_on<T>(
    cpus: Option<std::ops::Range<usize>>,
    start: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let Some(cpus) = cpus else {
        return start();
    };
    let _born = Pinned::new(online_cpus(), [0]);
    pin(0, cpus)?;
    start()
}

/// Restricts every thread of process `pid` (0: this process) to `cpus`; threads it starts later
/// inherit the set from the thread that starts them.
pub fn pin(pid: u32, cpus: std::ops::Range<usize>) -> anyhow::Result<()> {
    let pid = if pid == 0 { std::process::id() } else { pid };
    // SAFETY: an all-zero cpu_set_t is the empty set, which CPU_SET then fills.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for cpu in cpus.clone() {
        // SAFETY: CPU_SET writes the bit for `cpu` inside `set`; indexes past the set's size
        // are ignored by the libc implementation.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let tasks = format!("/proc/{pid}/task");
    for entry in std::fs::read_dir(&tasks).with_context(|| format!("reading {tasks}"))? {
        let tid: libc::pid_t = entry?
            .file_name()
            .to_string_lossy()
            .parse()
            .context("a task id is not a number")?;
        // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel only reads it.
        let status =
            unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        // A thread that ended since the directory was read is no error.
        if status != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("pinning thread {tid} of {pid} to CPUs {cpus:?}"));
        }
    }
    Ok(())
}

/// Holds processes to a share of one CPU by stopping and resuming them in a short cycle
/// (`SIGSTOP`, `SIGCONT`), the way a saturated or CPU-starved server behaves: it answers in
/// bursts, and at most `share` of the rate it could answer alone. Dropping it resumes them.
#[derive(Debug)]
pub struct Throttle {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cycler: Option<std::thread::JoinHandle<()>>,
}

impl Throttle {
    /// Runs `pids` for `share` (0 < share < 1) of every `period`, on average over the time since
    /// the start.
    pub fn start(pids: Vec<u32>, share: f64, period: std::time::Duration) -> Throttle {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A share of zero would never resume them; a thousandth is as little as is useful.
        let share = share.clamp(1e-3, 1.0);
        let running = period.mul_f64(share);
        let signal = move |pids: &[u32], signal: libc::c_int| {
            for &pid in pids {
                // SAFETY: kill only sends a signal; a pid that has exited is reported, not
                // touched.
                unsafe { libc::kill(pid as libc::pid_t, signal) };
            }
        };
        let cycler = {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                // A sleep on a busy machine overruns by up to a scheduling slice, which would
                // hand the processes more than their share at random, and by a different amount
                // in every run. So each pause lasts until the time they were let run is `share`
                // of the time since the start: an overrun is paid back by the next pause.
                let start = std::time::Instant::now();
                let mut ran = std::time::Duration::ZERO;
                while !stop.load(Ordering::Relaxed) {
                    let resumed = std::time::Instant::now();
                    std::thread::sleep(running);
                    signal(&pids, libc::SIGSTOP);
                    ran += resumed.elapsed();
                    let resume_at = start + ran.div_f64(share);
                    std::thread::sleep(
                        resume_at.saturating_duration_since(std::time::Instant::now()),
                    );
                    signal(&pids, libc::SIGCONT);
                }
            })
        };
        Throttle {
            stop,
            cycler: Some(cycler),
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        // The cycler always ends a cycle with SIGCONT, so the processes run on afterwards.
        if let Some(cycler) = self.cycler.take() {
            let _ = cycler.join();
        }
    }
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn parse_stat_cpu(stat: &str) -> anyhow::Result<f64> {
    // The command name (field 2) is in parentheses and may hold spaces; after it come field 3
    // (state) onwards, with utime and stime as fields 14 and 15.
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or_else(|| anyhow!("no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .ok_or_else(|| anyhow!("too few fields"))?
            .parse()
            .context("a CPU time field is not a number")
    };
    Ok((ticks(11)? + ticks(12)?) as f64 / clock_ticks_per_second())
}

/// A process a scenario started (a server it measures), killed and reaped when dropped, so
/// none outlives the scenario, whichever way the scenario ends.
pub struct OwnedChild {
    child: std::process::Child,
}

impl OwnedChild {
    /// Takes ownership of `child`.
    pub fn new(child: std::process::Child) -> OwnedChild {
        OwnedChild { child }
    }

    /// The process itself (its pipes, its exit status).
    pub fn child(&mut self) -> &mut std::process::Child {
        &mut self.child
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for OwnedChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layout_gives_each_party_its_cpus_and_splits_nothing_on_one_cpu() {
        assert_eq!(Layout::GeneratorApart.split(1), None);
        assert_eq!(
            Layout::GeneratorApart.split(4),
            Some(Split {
                servers: 0..1,
                redis: 0..1,
                generator: 1..4,
            })
        );
    }

    #[test]
    fn stat_cpu_fields_are_found_after_the_name() {
        let stat = "4242 (tokio (x) y) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0";
        let seconds = parse_stat_cpu(stat).unwrap();
        assert!((seconds - 400.0 / clock_ticks_per_second()).abs() < 1e-9);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }

    #[test]
    fn own_cpu_time_counts_less_than_a_clock_tick() {
        let before = own_cpu_seconds().unwrap();
        // Two milliseconds of work: under one clock tick, which /proc/self/stat could miss.
        let start = std::time::Instant::now();
        let mut spins = 0_u64;
        while start.elapsed() < std::time::Duration::from_millis(2) {
            spins = std::hint::black_box(spins + 1);
        }
        let after = own_cpu_seconds().unwrap();
        assert!(after > before, "{before} -> {after} after {spins} spins");
        // The ticks /proc counts are never ahead of the precise reading by more than a tick.
        let ticks = cpu_seconds(std::process::id()).unwrap();
        assert!(
            ticks <= after + 1.0 / clock_ticks_per_second(),
            "{ticks} vs {after}"
        );
    }
}
