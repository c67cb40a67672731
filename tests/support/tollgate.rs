//! Runs the real `tollgate` binary for a test: policies written to a temporary config directory,
//! gRPC and admin HTTP on free loopback ports, started and ready (gRPC health SERVING) before the
//! test goes on, killed when the handle drops; or stopped with SIGTERM to watch it drain.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::net::free_addr;

/// The gRPC health service name that is SERVING whenever tollgate runs and is not draining.
pub use tollgate::server::health::LIVENESS_SERVICE as LIVENESS;

/// How long a debug build on a busy machine may take to become SERVING.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts with fresh ports when the chosen ones were taken before tollgate bound them.
const START_ATTEMPTS: usize = 3;

/// The path of the `tollgate` binary cargo built for the integration tests.
pub fn tollgate_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tollgate"))
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
#[derive(Debug, Default, Clone)]
pub struct TollgateBuilder {
    policies: Vec<(String, String)>,
    args: Vec<String>,
}

impl TollgateBuilder {
    /// Adds a policy file named `file_name` (e.g. `edge.yaml`) with the given YAML text.
    pub fn policy(mut self, file_name: &str, yaml: &str) -> Self {
        self.policies.push((file_name.to_owned(), yaml.to_owned()));
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
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir).expect("create the config directory");
        for (name, yaml) in &self.policies {
            std::fs::write(config_dir.join(name), yaml).expect("write a policy file");
        }
        let mut last_log = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let mut tollgate = Tollgate {
                child: None,
                grpc_addr: free_addr(),
                http_addr: free_addr(),
                log_path: dir.path().join(format!("tollgate-{attempt}.log")),
                config_dir: config_dir.clone(),
                args: self.args.clone(),
                _dir: None,
            };
            tollgate.spawn();
            match tollgate.wait_serving(service) {
                Ok(()) => {
                    tollgate._dir = Some(dir);
                    return tollgate;
                }
                Err(log) if port_taken(&log) => last_log = log,
                Err(log) => panic!("tollgate did not become SERVING:\n{log}"),
            }
        }
        panic!("tollgate could not bind free ports in {START_ATTEMPTS} attempts:\n{last_log}");
    }
}

fn port_taken(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("AddrInUse")
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn(&mut self) {
        let log = File::create(&self.log_path).expect("create the tollgate log file");
        let stderr = log.try_clone().expect("clone the log file handle");
        let child = Command::new(tollgate_bin())
            .arg("serve")
            .arg("--config")
            .arg(&self.config_dir)
            .arg("--grpc-addr")
            .arg(self.grpc_addr.to_string())
            .arg("--http-addr")
            .arg(self.http_addr.to_string())
            .args(&self.args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .spawn()
            .expect("spawn the tollgate binary");
        self.child = Some(child);
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

/// Asks `grpc.health.v1.Health/Check` for `service` once.
pub async fn health_status(addr: SocketAddr, service: &str) -> Result<ServingStatus, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|err| err.to_string())?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2));
    let channel = endpoint.connect().await.map_err(|err| err.to_string())?;
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_err(|status| status.to_string())?;
    Ok(ServingStatus::try_from(response.into_inner().status).unwrap_or(ServingStatus::Unknown))
}

impl Drop for Tollgate {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "---- tollgate log ({}) ----\n{}",
                self.log_path.display(),
                self.log()
            );
        }
    }
}
