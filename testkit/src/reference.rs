//! Runs the tollgate binary the way a Deployment written for envoyproxy/ratelimit does: under
//! the name `ratelimit`, with no arguments, configured only by environment variables. The
//! environment is exactly what the test gives (nothing inherited but `PATH`), so a test says
//! every variable the service sees.

use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::net::{agent, send};
use crate::tollgate::tollgate_bin;

/// How long a debug build on a busy machine may take to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What to start.
#[derive(Debug, Default, Clone)]
pub struct RatelimitBuilder {
    env: Vec<(String, String)>,
    args: Vec<String>,
}

impl RatelimitBuilder {
    /// Sets one variable.
    pub fn env(mut self, name: &str, value: impl Into<String>) -> Self {
        self.env.retain(|(n, _)| n != name);
        self.env.push((name.to_owned(), value.into()));
        self
    }

    /// Listens on free loopback ports of the system's choosing instead of the reference's 8081,
    /// 8080 and 6070 (`GRPC_*`, `HOST`/`PORT`, `DEBUG_*`), so tests never race for a port.
    pub fn loopback_ports(self) -> Self {
        self.envs([
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
        ])
    }

    /// Sets several variables.
    pub fn envs<'a>(mut self, vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        for (name, value) in vars {
            self = self.env(name, value);
        }
        self
    }

    /// Adds command-line arguments (the reference takes none; tollgate's flags still work).
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Starts the process and waits until it listens (its start-up log line).
    pub fn start(self) -> Ratelimit {
        let mut process = self.spawn();
        if let Err(log) = process.wait_listening() {
            panic!("ratelimit did not start:\n{log}");
        }
        process
    }

    /// Starts the process and waits until `GET /healthcheck` answers 200.
    pub fn start_healthy(self) -> Ratelimit {
        let process = self.start();
        process.wait_healthy();
        process
    }

    /// Runs the process until it exits (a start-up failure), answering its status and log.
    pub fn run_to_exit(self) -> (ExitStatus, String) {
        let mut process = self.spawn();
        let mut child = process.child.take().expect("running");
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return (status, process.log());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ratelimit kept running:\n{}", process.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(self) -> Ratelimit {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("create a bin directory");
        let ratelimit = bin.join("ratelimit");
        std::os::unix::fs::symlink(tollgate_bin(), &ratelimit).expect("link bin/ratelimit");
        let log_path = dir.path().join("ratelimit.log");
        let log = File::create(&log_path).expect("create the log file");
        let stderr = log.try_clone().expect("clone the log handle");
        let mut command = Command::new(&ratelimit);
        command
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        let child = crate::process::spawn(command).expect("spawn bin/ratelimit");
        Ratelimit {
            child: Some(child),
            log_path,
            _dir: dir,
        }
    }
}

/// A running `ratelimit` process; dropping it kills it.
#[derive(Debug)]
pub struct Ratelimit {
    child: Option<Child>,
    log_path: PathBuf,
    _dir: TempDir,
}

impl Ratelimit {
    /// A builder with an empty environment.
    pub fn builder() -> RatelimitBuilder {
        RatelimitBuilder::default()
    }

    /// Everything logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The address a listener reported in the start-up line: `grpc`, `http`, `debug` or
    /// `metrics`.
    pub fn addr(&self, listener: &str) -> SocketAddr {
        let log = self.log();
        log_field(&log, listener)
            .and_then(|text| text.parse::<SocketAddr>().ok())
            .map(|addr| {
                if addr.ip().is_unspecified() {
                    SocketAddr::new([127, 0, 0, 1].into(), addr.port())
                } else {
                    addr
                }
            })
            .unwrap_or_else(|| panic!("no {listener} address in the start-up line:\n{log}"))
    }

    /// `http://<the admin listener><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr("http"))
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ratelimit did not exit on SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until `GET /healthcheck` answers 200.
    pub fn wait_healthy(&self) {
        let url = self.url("/healthcheck");
        let client = agent();
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let reply = send(&client, "GET", &url, &[], None);
            if reply.status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not healthy after {START_TIMEOUT:?} ({} {}):\n{}",
                reply.status,
                reply.body,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("exited with {status}\n{}", self.log()));
            }
            if self.log().contains("tollgate listening") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "no start-up line after {START_TIMEOUT:?}\n{}",
            self.log()
        ))
    }
}

/// A `name=value` field of the start-up line (`tollgate listening grpc=... http=...`).
pub fn log_field(log: &str, name: &str) -> Option<String> {
    let line = log
        .lines()
        .find(|line| line.contains("tollgate listening"))?;
    let pattern = format!(" {name}=");
    let start = line.find(&pattern)? + pattern.len();
    let rest = &line[start..];
    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"').to_owned())
}

impl Drop for Ratelimit {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- ratelimit log ----\n{}", self.log());
        }
    }
}

/// A file of `dir`, for environment values.
pub fn path_str(path: &Path) -> String {
    path.display().to_string()
}
