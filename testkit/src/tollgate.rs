//! Runs the real `tollgate` binary for a test: policies written to a temporary config directory,
//! gRPC and admin HTTP on free loopback ports, started and ready (gRPC health SERVING) before the
//! test goes on, killed when the handle drops; or stopped with SIGTERM to watch it drain.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::policy::Policies;
use crate::process;
use crate::redis::unique_prefix;
use crate::rls::health_status;

/// The gRPC health service name that is SERVING whenever tollgate runs and is not draining.
pub use tollgate::server::health::LIVENESS_SERVICE as LIVENESS;

/// How long a debug build on a busy machine may take to become SERVING.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// The `tollgate` binary: `$TOLLGATE_BIN`, else the one cargo built beside the running test or
/// benchmark (`target/<profile>/tollgate`; tests run from `target/<profile>/deps/`).
pub fn tollgate_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("TOLLGATE_BIN").filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("the path of the running executable");
    let candidates = exe
        .ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("tollgate"))
        .collect::<Vec<_>>();
    candidates
        .iter()
        .find(|path| path.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "the tollgate binary is not built (looked at {candidates:?}): run the tests with \
                 cargo test, or cargo build --bin tollgate first, or set $TOLLGATE_BIN"
            )
        })
}

/// The policy most tests need: domain `edge`, each `user` value limited to `requests` hits a
/// minute by the default algorithm.
pub fn per_user_per_minute(requests: u64) -> String {
    format!(
        "domain: edge
descriptors:
  - key: user
    rate_limit: {{unit: minute, requests_per_unit: {requests}}}
"
    )
}

/// What to start: policy files and extra `serve` flags.
///
/// Three defaults differ from `tollgate serve`'s, set through the environment so that a flag
/// given here wins: listeners on `127.0.0.1:0`, a 5 s `--backend-timeout` (the production 50 ms
/// turns decisions into failure-mode answers on a loaded test machine; pass it explicitly to
/// measure with it), and a `--key-prefix` no other instance of this process uses (pass one to
/// make instances share counts).
#[derive(Debug, Default, Clone)]
pub struct TollgateBuilder {
    policies: Policies,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    no_config: bool,
    under: Vec<String>,
}

impl TollgateBuilder {
    /// Adds a policy file named `file_name` (e.g. `edge.yaml`) with the given YAML text.
    pub fn policy(mut self, file_name: &str, yaml: &str) -> Self {
        self.policies.add(file_name, yaml);
        self
    }

    /// Adds `serve` command-line arguments, e.g. `["--backend", "redis"]`.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable of the process, e.g. the reference's
    /// `CONFIG_GRPC_XDS_SERVER_URL`.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.envs.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Passes no `--config`: the policies come from elsewhere (an xDS server).
    pub fn without_config(mut self) -> Self {
        self.no_config = true;
        self
    }

    /// Runs tollgate under another program, `command` followed by tollgate's own command line
    /// (e.g. `["valgrind", "--tool=callgrind"]`), which must keep tollgate's process id.
    pub fn under<I, S>(mut self, command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.under = command.into_iter().map(Into::into).collect();
        self
    }

    /// Starts tollgate and waits until its gRPC health service answers SERVING (policies
    /// loaded, backend answering).
    pub fn start(self) -> Tollgate {
        self.start_until("")
    }

    /// Starts tollgate and waits only until it is alive (`tollgate.liveness` SERVING), for tests
    /// whose backend is not reachable yet and so never becomes ready.
    pub fn start_alive(self) -> Tollgate {
        self.start_until(LIVENESS)
    }

    fn start_until(self, service: &str) -> Tollgate {
        let (dir, config_dir) = self.policies.write();
        let mut tollgate = Tollgate {
            child: None,
            grpc_addr: UNBOUND,
            http_addr: UNBOUND,
            log_path: dir.path().join("tollgate.log"),
            config_dir,
            args: self.args,
            envs: self.envs,
            no_config: self.no_config,
            under: self.under,
            _dir: Some(dir),
        };
        tollgate.spawn();
        if let Err(log) = tollgate.wait_serving(service) {
            panic!("tollgate did not become SERVING:\n{log}");
        }
        tollgate
    }
}

/// The address of a listener tollgate has not reported yet.
const UNBOUND: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::UNSPECIFIED,
    0,
));

/// The addresses tollgate reports once its listeners are bound, from its start-up log line
/// (`... tollgate listening grpc=127.0.0.1:41234 http=127.0.0.1:41235`, or the same fields in
/// JSON).
pub fn listening_addrs(log: &str) -> Option<(SocketAddr, SocketAddr)> {
    let line = log
        .lines()
        .find(|line| line.contains("tollgate listening"))?;
    let field = |name: &str| -> Option<SocketAddr> {
        for pattern in [format!("{name}="), format!("\"{name}\":\"")] {
            if let Some(start) = line.find(&pattern) {
                let rest = &line[start + pattern.len()..];
                let end = rest
                    .find(|c: char| c.is_whitespace() || c == '"' || c == ',')
                    .unwrap_or(rest.len());
                return rest[..end].parse().ok();
            }
        }
        None
    };
    Some((field("grpc")?, field("http")?))
}

/// A running tollgate process; dropping it kills the process.
#[derive(Debug)]
pub struct Tollgate {
    child: Option<Child>,
    grpc_addr: SocketAddr,
    http_addr: SocketAddr,
    log_path: PathBuf,
    config_dir: PathBuf,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    no_config: bool,
    under: Vec<String>,
    /// Keeps the config directory and logs alive as long as the process.
    _dir: Option<TempDir>,
}

impl Tollgate {
    /// A builder with no policies and default flags (memory backend).
    pub fn builder() -> TollgateBuilder {
        TollgateBuilder::default()
    }

    /// Starts tollgate with one policy file `config.yaml`.
    pub fn start(yaml: &str) -> Tollgate {
        Tollgate::builder().policy("config.yaml", yaml).start()
    }

    /// The gRPC address (RLS, health, reflection).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
    }

    /// The admin HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// The directory passed as `--config`.
    pub fn config_dir(&self) -> &Path {
        &self.config_dir
    }

    /// Everything tollgate has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// `http://<admin address><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http_addr)
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM (with `kill -TERM`, as a container runtime would), asking for a graceful
    /// shutdown; [`Tollgate::wait_exit`] collects the result.
    pub fn terminate(&self) {
        let pid = self.pid().expect("tollgate is running");
        let status = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(status.success(), "kill -TERM {pid} failed: {status}");
    }

    /// Waits up to `limit` for the process to exit and answers its exit status; panics (after
    /// killing it) if it is still running by then.
    pub fn wait_exit(&mut self, limit: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("tollgate is running");
        let deadline = Instant::now() + limit;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("tollgate did not exit within {limit:?}\n{}", self.log());
                }
            }
        }
    }

    /// Kills the process (as a crash or an outage would) and waits for it to exit.
    pub fn kill(&mut self) {
        process::kill(&mut self.child);
    }

    fn spawn(&mut self) {
        // Defaults through the environment, so that the caller's own flags win:
        // - port 0: tollgate binds free ports itself and logs them, so nothing can take them
        //   between choosing and binding;
        // - a generous backend deadline: on a loaded machine the production 50 ms would turn
        //   ordinary decisions into failure-mode answers;
        // - a key prefix of its own, so instances on a shared Redis count apart.
        let mut command = process::command_under(&self.under, tollgate_bin());
        command.arg("serve");
        if !self.no_config {
            command.arg("--config").arg(&self.config_dir);
        }
        command
            .args(&self.args)
            .env("TOLLGATE_GRPC_ADDR", "127.0.0.1:0")
            .env("TOLLGATE_HTTP_ADDR", "127.0.0.1:0")
            .env("TOLLGATE_BACKEND_TIMEOUT", "5s")
            .env("TOLLGATE_KEY_PREFIX", unique_prefix("tollgate-process"))
            .env("RUST_LOG", "info")
            .envs(self.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        process::log_to(&mut command, &self.log_path);
        let child = process::spawn(command).expect("spawn the tollgate binary");
        self.child = Some(child);
        self.grpc_addr = UNBOUND;
        self.http_addr = UNBOUND;
    }

    /// Polls gRPC health of `service` until SERVING; on failure returns the log.
    fn wait_serving(&mut self, service: &str) -> Result<(), String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("build a tokio runtime");
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last_answer = String::from("no answer");
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("tollgate exited with {status}\n{}", self.log()));
            }
            if self.grpc_addr == UNBOUND {
                match listening_addrs(&self.log()) {
                    Some((grpc, http)) => (self.grpc_addr, self.http_addr) = (grpc, http),
                    None => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                }
            }
            match runtime.block_on(health_status(self.grpc_addr, service)) {
                Ok(ServingStatus::Serving) => return Ok(()),
                Ok(status) => last_answer = format!("{status:?}"),
                Err(err) => last_answer = err,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Err(format!(
            "not SERVING after {START_TIMEOUT:?} (last answer: {last_answer})\n{}",
            self.log()
        ))
    }
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        self.kill();
        process::print_log_if_panicking("tollgate", &self.log_path);
    }
}
