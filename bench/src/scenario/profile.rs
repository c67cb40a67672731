//! `profile`: where a decision's CPU goes, in tollgate and in the empty RLS server, sampled by
//! `perf` under the same load, with a flame graph of each.
//!
//! tollgate on the memory backend, tollgate on one Redis and the empty server
//! ([`crate::empty`]) serve the same closed loop one after the other in every run, rotating
//! which goes first. While a server is measured, `perf record` samples every thread of its
//! process (at [`FREQUENCY`] Hz, with DWARF call graphs, since release builds keep no frame
//! pointers); `perf script` prints the samples and inferno folds them into stacks. Each sample
//! is put in exactly one [`Part`] by its stack, and a part's share of the samples times the
//! server's CPU per decision is what that part costs a decision. The folded stacks of every run
//! are kept beside the records (`profile-<server>.folded`), and the report draws one flame graph
//! per server from them.
//!
//! Sampling itself costs the sampled process some CPU (the kernel copies each sample's stack),
//! the same for every server; grpc-floor measures the same servers without it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::doc::{Align, Table, count, fixed, measured, median, percent};
use crate::empty::EmptyProcess;
use crate::load::summary::Summary;
use crate::proc::OwnedChild;
use crate::scenario::{
    Algorithm, Bench, ClosedLoopOptions, Connections, Phase, Scenario, ScenarioName,
    UNREACHABLE_LIMIT, conditions_of, load_cells, per_decision_cell, policy, rotation, runs_of,
    say, uniform_shape,
};
use crate::stand::{Backend, MeasuredServer, Stand};

/// Samples a second per thread: a prime, so sampling does not beat with periodic work.
pub const FREQUENCY: u32 = 499;

/// The options of `profile`.
#[derive(Debug, Clone, clap::Args)]
pub struct ProfileOptions {
    /// The closed loop sent to each server.
    #[command(flatten)]
    pub load: ClosedLoopOptions,
}

/// The `profile` scenario.
pub struct Profile {
    options: ProfileOptions,
}

impl Profile {
    /// The scenario with `options`.
    pub fn new(options: ProfileOptions) -> Profile {
        Profile { options }
    }
}

/// Which server a run sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Server {
    /// tollgate on the memory backend.
    TollgateMemory,
    /// tollgate on one redis-server.
    TollgateRedis,
    /// The empty RLS server.
    Empty,
}

impl Server {
    const ALL: [Server; 3] = [Server::TollgateMemory, Server::TollgateRedis, Server::Empty];

    fn label(self) -> &'static str {
        match self {
            Server::TollgateMemory => "tollgate, memory backend",
            Server::TollgateRedis => "tollgate, one Redis",
            Server::Empty => "empty RLS server",
        }
    }

    /// The name of its folded stacks and of its flame graph.
    fn file_stem(self) -> &'static str {
        match self {
            Server::TollgateMemory => "profile-tollgate-memory",
            Server::TollgateRedis => "profile-tollgate-redis",
            Server::Empty => "profile-empty",
        }
    }
}

/// What a sample was doing, decided by its stack; the first that applies, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Part {
    /// Inside the service's handler (the empty server's `RateLimitService::should_rate_limit`,
    /// tollgate's `ShouldRateLimit` call): for tollgate the decision (matching, the backend,
    /// statistics), for the empty server building its OK. Both decode and encode in the gRPC
    /// stack's codec, outside the handler.
    Handler,
    /// In the redis crate (its connection task, system calls included): the Redis exchange.
    RedisClient,
    /// In the kernel: system calls (loopback TCP, futex, epoll), interrupts, and the clock
    /// the kernel maps into the process (vDSO), which perf names as kernel code too.
    Kernel,
    /// In the allocator: jemalloc, or the C library's in a build without it.
    Allocator,
    /// In the gRPC and HTTP/2 stack (tonic, tower, axum, hyper, h2, http, prost, bytes).
    Grpc,
    /// In tokio's scheduler and I/O driver, outside every task above.
    Runtime,
    /// Anything else (thread start, frames perf could not name).
    Other,
}

impl Part {
    const ALL: [Part; 7] = [
        Part::Handler,
        Part::RedisClient,
        Part::Kernel,
        Part::Allocator,
        Part::Grpc,
        Part::Runtime,
        Part::Other,
    ];

    fn column(self) -> &'static str {
        match self {
            Part::Handler => "handler",
            Part::RedisClient => "Redis client",
            Part::Kernel => "kernel",
            Part::Allocator => "allocator",
            Part::Grpc => "gRPC, HTTP/2",
            Part::Runtime => "tokio",
            Part::Other => "other",
        }
    }

    /// The part of one folded stack (frames root first, separated by `;`, kernel frames
    /// marked `_[k]`).
    pub fn of(stack: &str) -> Part {
        let frames: Vec<&str> = stack.split(';').collect();
        let leaf = frames.last().copied().unwrap_or("");
        let in_crate = |names: &[&str]| frames.iter().any(|f| names.contains(&crate_of(f)));
        // The empty server implements the generated trait; tollgate's service is written by
        // hand, its handler the `UnaryService` of `rls::ShouldRateLimit`.
        if frames.iter().any(|f| {
            f.contains("RateLimitService>::should_rate_limit")
                || f.starts_with("<tollgate::server::rls::ShouldRateLimit<")
        }) {
            Part::Handler
        } else if in_crate(&["redis"]) {
            Part::RedisClient
        } else if leaf.ends_with("_[k]") {
            Part::Kernel
        } else if is_allocator(leaf) {
            Part::Allocator
        } else if in_crate(&[
            "tonic",
            "tower",
            "axum",
            "hyper",
            "hyper_util",
            "h2",
            "http",
            "http_body",
            "http_body_util",
            "prost",
            "bytes",
        ]) {
            Part::Grpc
        } else if in_crate(&["tokio", "mio"]) {
            Part::Runtime
        } else {
            Part::Other
        }
    }
}

/// The crate a frame's function belongs to: the first path segment of the function or of the
/// type it is implemented on (`<h2::proto::Connection<T> as Future>::poll` is h2's).
fn crate_of(frame: &str) -> &str {
    let name = frame.trim_start_matches('<');
    name.split("::").next().unwrap_or(name)
}

/// Whether a leaf frame is the allocator (jemalloc, linked into the binary, or the C library's,
/// in a build without it), or Rust's entry points into it.
fn is_allocator(leaf: &str) -> bool {
    // Prefixes of the allocator's own functions only: `__libc_recv` and the like are system
    // call wrappers, not allocation. jemalloc's exported and internal functions carry the
    // `_rjem_` prefix; its inlined fast paths keep their own names.
    const PREFIXES: [&str; 27] = [
        "_rjem_",
        "<tikv_jemallocator::",
        "tikv_jemallocator::",
        "imalloc",
        "ifree",
        "isfree",
        "cache_bin_",
        "arena_",
        "malloc",
        "free",
        "realloc",
        "calloc",
        "cfree",
        "_int_malloc",
        "_int_free",
        "_int_realloc",
        "unlink_chunk",
        "tcache_",
        "sysmalloc",
        "__libc_malloc",
        "__libc_free",
        "__libc_calloc",
        "__libc_realloc",
        "__rust_alloc",
        "__rust_dealloc",
        "__rust_realloc",
        "__rustc::__rdl_",
    ];
    PREFIXES.iter().any(|prefix| leaf.starts_with(prefix))
}

/// Samples of folded stacks (`stack count` lines) by part.
pub fn parts_of(folded: &str) -> BTreeMap<Part, u64> {
    let mut parts = BTreeMap::new();
    for line in folded.lines() {
        let Some((stack, samples)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(samples) = samples.parse::<u64>() else {
            continue;
        };
        *parts.entry(Part::of(stack)).or_insert(0) += samples;
    }
    parts
}

/// One measured, sampled run of one server.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileRun {
    /// Which server.
    pub server: Server,
    /// Run number, from 1.
    pub run: u32,
    /// Calls in flight.
    pub concurrency: u32,
    /// What the load generator saw.
    pub load: Summary,
    /// CPU seconds the server process used during the run.
    pub cpu_seconds: f64,
    /// Samples perf took of the server, by part.
    pub parts: BTreeMap<Part, u64>,
}

impl ProfileRun {
    fn samples(&self) -> u64 {
        self.parts.values().sum()
    }

    /// What `part` cost a decision in this run, in µs.
    fn micros(&self, part: Part) -> Option<f64> {
        let share = share(self, part)?;
        crate::scenario::micros_per(self.cpu_seconds, self.load.decisions).map(|cpu| cpu * share)
    }
}

/// `perf record` sampling one process until stopped.
struct Recording {
    perf: OwnedChild,
    data: PathBuf,
    log: PathBuf,
}

/// How long perf may take to attach to a process and start sampling.
const ATTACH_TIMEOUT: Duration = Duration::from_secs(60);

impl Recording {
    /// Starts sampling every thread of `pid` into `data`, and returns once perf samples: it
    /// attaches with its events off and says when it has turned them on (its control and
    /// acknowledgement FIFOs), so a load sent after this returns is sampled from its start,
    /// however slowly perf attached on a busy machine.
    fn start(pid: u32, data: &Path) -> anyhow::Result<Recording> {
        let log = data.with_extension("log");
        let stderr =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let fifos = tempfile::tempdir().context("a directory for perf's control FIFOs")?;
        let control = fifo(&fifos.path().join("control"), false)?;
        let ack = fifo(&fifos.path().join("ack"), true)?;
        let perf = Command::new("perf")
            .args(["record", "--quiet", "--freq", &FREQUENCY.to_string()])
            .args(["--call-graph", "dwarf,16384", "--pid", &pid.to_string()])
            .args(["--delay=-1", "--control"])
            .arg(format!(
                "fifo:{},{}",
                fifos.path().join("control").display(),
                fifos.path().join("ack").display()
            ))
            .arg("--output")
            .arg(data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting perf record")?;
        let mut recording = Recording {
            perf: OwnedChild::new(perf),
            data: data.to_owned(),
            log,
        };
        // The FIFO keeps what is written until perf opens and reads it.
        (&control)
            .write_all(b"enable\n")
            .context("telling perf to sample")?;
        recording.await_ack(&ack)?;
        Ok(recording)
    }

    /// Waits for perf to acknowledge a command on `ack`, failing if perf ends or takes longer
    /// than [`ATTACH_TIMEOUT`].
    fn await_ack(&mut self, ack: &std::fs::File) -> anyhow::Result<()> {
        use std::io::Read as _;
        use std::os::fd::AsRawFd as _;
        let deadline = Instant::now() + ATTACH_TIMEOUT;
        let mut said = Vec::new();
        // perf writes "ack\n" with the string's terminating NUL.
        while !said.windows(4).any(|window| window == b"ack\n") {
            if let Some(status) = self.perf.child().try_wait()? {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!("perf record ended before sampling ({status}):\n{log}");
            }
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!("perf record did not start sampling within {ATTACH_TIMEOUT:?}:\n{log}");
            }
            let mut poll = libc::pollfd {
                fd: ack.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            let ready = unsafe { libc::poll(&mut poll, 1, 100) };
            if ready < 0 {
                let error = std::io::Error::last_os_error();
                if error.kind() != std::io::ErrorKind::Interrupted {
                    return Err(error).context("waiting for perf");
                }
            }
            if ready > 0 {
                let mut buffer = [0u8; 64];
                match (&*ack).read(&mut buffer) {
                    Ok(n) => said.extend_from_slice(&buffer[..n]),
                    Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(error) => return Err(error).context("reading perf's acknowledgement"),
                }
            }
        }
        Ok(())
    }

    /// Stops sampling (perf writes its file on SIGINT) and folds the samples into stacks.
    fn finish(mut self) -> anyhow::Result<String> {
        let pid = libc::pid_t::try_from(self.perf.id()).context("perf's process id")?;
        // SAFETY: kill(2) with a process id this scenario started and has not yet reaped.
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            bail!("stopping perf record: {}", std::io::Error::last_os_error());
        }
        let status = self
            .perf
            .child()
            .wait()
            .context("waiting for perf record")?;
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        if !status.success() && !self.data.exists() {
            bail!("perf record failed ({status}):\n{log}");
        }
        let script = Command::new("perf")
            .args(["script", "--no-inline", "--input"])
            .arg(&self.data)
            // Without the period, each sample counts once.
            .args(["-F", "comm,pid,tid,time,event,ip,sym,dso"])
            .stdin(Stdio::null())
            .output()
            .context("running perf script")?;
        if !script.status.success() {
            bail!(
                "perf script failed ({}):\n{}",
                script.status,
                String::from_utf8_lossy(&script.stderr)
            );
        }
        let _ = std::fs::remove_file(&self.data);
        let _ = std::fs::remove_file(&self.log);
        fold(&script.stdout)
    }
}

/// A FIFO made at `path` and opened for reading and writing, which never blocks the open (this
/// process stays a reader and a writer of it whether or not perf has opened it yet);
/// non-blocking reads when `nonblocking`.
fn fifo(path: &Path, nonblocking: bool) -> anyhow::Result<std::fs::File> {
    use std::os::unix::ffi::OsStrExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("FIFO path {}", path.display()))?;
    // SAFETY: mkfifo(3) with a NUL-terminated path that lives across the call.
    if unsafe { libc::mkfifo(name.as_ptr(), 0o600) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("making FIFO {}", path.display()));
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(if nonblocking { libc::O_NONBLOCK } else { 0 })
        .open(path)
        .with_context(|| format!("opening FIFO {}", path.display()))
}

/// `perf script` output folded into stacks, one `frames count` line each.
fn fold(script: &[u8]) -> anyhow::Result<String> {
    use inferno::collapse::Collapse as _;
    let mut options = inferno::collapse::perf::Options::default();
    options.annotate_kernel = true;
    options.nthreads = 1;
    let mut folded = Vec::new();
    inferno::collapse::perf::Folder::from(options)
        .collapse(script, &mut folded)
        .context("folding perf's samples")?;
    String::from_utf8(folded).context("folded stacks are not UTF-8")
}

/// Why perf cannot sample here, or `None` when it can: it records a process that does nothing.
fn perf_unavailable() -> Option<String> {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => return Some(format!("no temporary directory for perf: {error}")),
    };
    let output = Command::new("perf")
        .args(["record", "--quiet", "--output"])
        .arg(dir.path().join("probe.data"))
        .args(["--", "true"])
        .stdin(Stdio::null())
        .output();
    match output {
        Err(error) => Some(format!(
            "no perf ({error}): install it (Debian: apt-get install linux-perf)"
        )),
        Ok(output) if !output.status.success() => Some(format!(
            "perf cannot sample here ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Ok(_) => None,
    }
}

/// A server to sample: its process, its CPU and the generator's connections to it.
struct Sampled<'a> {
    server: Server,
    process: Box<dyn MeasuredServer + 'a>,
    connections: Connections,
}

const KEY: &str = "user";

/// Where the folded stacks of `server` are kept among the results in `dir`.
fn folded_path(dir: &Path, server: Server) -> PathBuf {
    dir.join(format!("{}.folded", server.file_stem()))
}

impl Scenario for Profile {
    fn name(&self) -> ScenarioName {
        ScenarioName::Profile
    }

    fn unavailable(&self) -> Option<String> {
        perf_unavailable()
    }

    fn run(&self, bench: &mut Bench) -> anyhow::Result<()> {
        let options = &self.options;
        let policy = policy(&[(KEY.to_owned(), Algorithm::Counter, UNREACHABLE_LIMIT, 1)]);
        bench.servers.ensure(Backend::Memory);
        bench.servers.ensure(Backend::Redis);
        let dir = bench.records.dir().to_owned();
        // Stacks of an earlier run would otherwise be drawn with this run's.
        for server in Server::ALL {
            let path = folded_path(&dir, server);
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(error).with_context(|| format!("removing {}", path.display()));
                }
                _ => {}
            }
        }
        let (servers, tools) = bench.split();
        let mut sampled = Vec::new();
        for server in Server::ALL {
            let process: Box<dyn MeasuredServer> = match server {
                Server::TollgateMemory => {
                    Box::new(Stand::start(servers, Backend::Memory, &policy, "deny")?)
                }
                Server::TollgateRedis => {
                    Box::new(Stand::start(servers, Backend::Redis, &policy, "deny")?)
                }
                Server::Empty => Box::new(EmptyProcess::start()?),
            };
            let addr = process.grpc_addr();
            let connections = tools.loader.connect(&[addr], options.load.connections)?;
            sampled.push(Sampled {
                server,
                process,
                connections,
            });
        }
        let shape = uniform_shape(vec![KEY.to_owned()], options.load.keys);
        let phase = |duration| Phase {
            shape: Arc::clone(&shape),
            concurrency: options.load.concurrency,
            rate: None,
            duration,
        };
        for s in &sampled {
            tools
                .loader
                .drive(&s.connections, &phase(tools.scale.warmup))?;
        }
        for run in 1..=tools.scale.runs {
            for index in rotation(run, sampled.len()) {
                let s = &sampled[index];
                let data = dir.join(format!("{}.perf.data", s.server.file_stem()));
                let recording = Recording::start(s.process.pid()?, &data)?;
                let before = s.process.cpu_seconds()?;
                let load = tools
                    .loader
                    .drive(&s.connections, &phase(tools.scale.duration))?;
                let cpu_seconds = s.process.cpu_seconds()? - before;
                let folded = recording.finish()?;
                if load.decisions == 0 {
                    bail!(
                        "the {} decided nothing: {:?}\n{}",
                        s.server.label(),
                        load.errors_by_code,
                        s.process.log()
                    );
                }
                let path = folded_path(&dir, s.server);
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .and_then(|mut file| file.write_all(folded.as_bytes()))
                    .with_context(|| format!("writing {}", path.display()))?;
                let parts = parts_of(&folded);
                let run_record = ProfileRun {
                    server: s.server,
                    run,
                    concurrency: options.load.concurrency,
                    load,
                    cpu_seconds,
                    parts,
                };
                say(&format!(
                    "  profile run {run} {}: {}/s, {} samples, handler {} of them",
                    s.server.label(),
                    count(Some(run_record.load.decisions_per_second)),
                    run_record.samples(),
                    percent(share(&run_record, Part::Handler)),
                ));
                tools.records.record("run", &run_record)?;
            }
        }
        Ok(())
    }

    fn render(&self, records: &[Value]) -> anyhow::Result<String> {
        render(records)
    }

    fn figures(&self, results_dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
        let mut figures = Vec::new();
        for server in Server::ALL {
            let path = folded_path(results_dir, server);
            let folded = match std::fs::read_to_string(&path) {
                Ok(folded) => folded,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(error).with_context(|| format!("reading {}", path.display()));
                }
            };
            figures.push((
                format!("{}.svg", server.file_stem()),
                flame_graph(server, &folded)?,
            ));
        }
        Ok(figures)
    }
}

/// The share of a run's samples in `part`.
fn share(run: &ProfileRun, part: Part) -> Option<f64> {
    let samples = run.samples();
    (samples > 0).then(|| *run.parts.get(&part).unwrap_or(&0) as f64 / samples as f64)
}

/// The flame graph (SVG) of one server's folded stacks.
fn flame_graph(server: Server, folded: &str) -> anyhow::Result<String> {
    let mut options = inferno::flamegraph::Options::default();
    options.title = format!("{}: every thread, closed loop", server.label());
    options.count_name = "samples".to_owned();
    // Deterministic colours, so a graph drawn again from the same stacks is the same file.
    options.hash = true;
    // Frames narrower than a pixel are left out: they cannot be read, and they would make
    // each graph several times larger.
    options.min_width = 1.0;
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, folded.lines(), &mut svg)
        .context("drawing the flame graph")?;
    String::from_utf8(svg).context("the flame graph is not UTF-8")
}

/// The profile section of the report.
pub fn render(records: &[Value]) -> anyhow::Result<String> {
    let conditions = conditions_of(records)?;
    let runs: Vec<ProfileRun> = runs_of(records, "profile")?;
    let first = &runs[0];
    let mut out = String::new();
    let _ = writeln!(out, "### Where a decision's CPU goes, sampled\n");
    let _ = writeln!(
        out,
        "{} One descriptor per request, values drawn uniformly, under a limit no load reaches \
         (a sliding window counter); closed loop, {} calls in flight; each run measures every \
         server one after the other, rotating which goes first. While a server is measured, \
         `perf record` samples every thread of its process ({} Hz, DWARF call graphs) and the \
         samples are folded into stacks with inferno. Each sample counts in the first part its \
         stack is in: the service's *handler* (`ShouldRateLimit`: tollgate's whole decision, \
         or the empty server's building of its answer; both decode the request and encode the \
         answer in the codec, outside it), the *Redis client* (the redis crate's \
         connection task), the *kernel* (a sample that stopped in a system call, an \
         interrupt or the kernel's vDSO clock), the *allocator*, the *gRPC, \
         HTTP/2* stack (tonic, tower, axum, hyper, h2, http, prost, bytes), *tokio* (its \
         scheduler and I/O driver), or *other*. A part's µs per decision is the server's CPU per decision (sampling \
         included, which costs every server alike) times the part's share of the samples; \
         the medians of the runs.\n",
        measured(&conditions),
        first.concurrency,
        FREQUENCY,
    );
    let mut columns = vec![
        ("server", Align::Left),
        ("decisions/s", Align::Right),
        ("min–max", Align::Right),
        ("p50 ms", Align::Right),
        ("p99 ms", Align::Right),
        ("samples, all runs", Align::Right),
        ("CPU µs/decision", Align::Right),
    ];
    columns.extend(Part::ALL.iter().map(|part| (part.column(), Align::Right)));
    let mut table = Table::new(&columns);
    for server in Server::ALL {
        let runs: Vec<&ProfileRun> = runs.iter().filter(|r| r.server == server).collect();
        if runs.is_empty() {
            continue;
        }
        let mut row = vec![server.label().to_owned()];
        row.extend(load_cells(runs.iter().map(|r| &r.load)));
        row.push(runs.iter().map(|r| r.samples()).sum::<u64>().to_string());
        row.push(per_decision_cell(
            runs.iter().map(|r| (r.cpu_seconds, r.load.decisions)),
        ));
        for part in Part::ALL {
            row.push(fixed(median(runs.iter().filter_map(|r| r.micros(part))), 1));
        }
        table.row(row);
    }
    out.push_str(&table.render());
    let micros = |server: Server, part: Part| {
        fixed(
            median(
                runs.iter()
                    .filter(|r| r.server == server)
                    .filter_map(|r| r.micros(part)),
            ),
            1,
        )
    };
    let _ = writeln!(
        out,
        "\nIn the handler, the decision itself: {} µs per decision on the memory backend and {} \
         on one Redis (plus {} in the Redis client), against {} for the empty server's answer; \
         the rest is the gRPC stack, the kernel, the allocator and tokio, on every server.",
        micros(Server::TollgateMemory, Part::Handler),
        micros(Server::TollgateRedis, Part::Handler),
        micros(Server::TollgateRedis, Part::RedisClient),
        micros(Server::Empty, Part::Handler),
    );
    let _ = writeln!(
        out,
        "\nFlame graphs of every run's samples (open them in a browser: they zoom and search): {}.",
        Server::ALL
            .iter()
            .map(|s| format!("[{}](flamegraphs/{}.svg)", s.label(), s.file_stem()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_counts_in_the_first_part_its_stack_is_in() {
        let handler = "tokio-rt-worker;tokio::runtime::task::harness::Harness<T,S>::poll;\
                       <tollgate::server::rls::ShouldRateLimit<B> as tonic::server::service::\
                       UnaryService<tollgate::descriptor::Request>>::call::{{closure}};malloc";
        assert_eq!(Part::of(handler), Part::Handler);
        let empty = "tokio-rt-worker;tokio::runtime::task::harness::Harness<T,S>::poll;\
                     <tollgate_bench::empty::Empty as tollgate::proto::envoy::service::\
                     ratelimit::v3::rate_limit_service_server::RateLimitService>::\
                     should_rate_limit::{{closure}};malloc";
        assert_eq!(Part::of(empty), Part::Handler);
        let redis = "tokio-rt-worker;<redis::aio::multiplexed_connection::PipelineSink<T> as \
                     futures_sink::Sink>::poll_flush;__send;tcp_sendmsg_[k]";
        assert_eq!(Part::of(redis), Part::RedisClient);
        let recv = "tokio-rt-worker;<h2::codec::framed_read::FramedRead<T> as \
                    futures_core::stream::Stream>::poll_next;__libc_recv;tcp_recvmsg_[k]";
        assert_eq!(Part::of(recv), Part::Kernel);
        let alloc = "tokio-rt-worker;h2::proto::streams::Recv::recv_data;_int_malloc";
        assert_eq!(Part::of(alloc), Part::Allocator);
        let jemalloc = "tokio-rt-worker;h2::proto::streams::Recv::recv_data;_rjem_sdallocx";
        assert_eq!(Part::of(jemalloc), Part::Allocator);
        // A system call's wrapper in the C library is not its allocator.
        let wrapper = "tokio-rt-worker;<h2::codec::framed_read::FramedRead<T> as \
                       futures_core::stream::Stream>::poll_next;__libc_recv";
        assert_eq!(Part::of(wrapper), Part::Grpc);
        let grpc = "tokio-rt-worker;tokio::runtime::task::harness::Harness<T,S>::poll;\
                    <hyper::proto::h2::server::Server<T,S,B,E> as core::future::future::\
                    Future>::poll;__memmove_avx_unaligned_erms";
        assert_eq!(Part::of(grpc), Part::Grpc);
        let park = "tokio-rt-worker;tokio::runtime::scheduler::multi_thread::worker::Context::park";
        assert_eq!(Part::of(park), Part::Runtime);
        assert_eq!(Part::of("tollgate;[unknown]"), Part::Other);
        // tollgate's own Redis backend is not the redis crate.
        assert_eq!(
            Part::of("tokio-rt-worker;tollgate::backend::redis::Redis::call"),
            Part::Other
        );
    }

    #[test]
    fn folded_stacks_add_up_by_part_and_bad_lines_are_skipped() {
        let folded = "a;tokio::x 3\na;b;c_[k] 2\nnot a count\na;tokio::y 4\n";
        let parts = parts_of(folded);
        assert_eq!(parts.get(&Part::Runtime), Some(&7));
        assert_eq!(parts.get(&Part::Kernel), Some(&2));
        assert_eq!(parts.values().sum::<u64>(), 9);
    }
}
