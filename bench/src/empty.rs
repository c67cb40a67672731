//! An empty RLS v3 server: the same gRPC service tollgate serves, with the same transport
//! (tonic, TCP_NODELAY, tokio's multi-threaded runtime), answering every call with OK and one
//! OK status per descriptor without looking at anything else. It is the floor a decision's cost
//! is measured against: what gRPC itself costs on this machine.
//!
//! `tollgate-bench empty-server` runs it as a process of its own, so that it is measured exactly
//! as tollgate is (beside, not inside, the load generator); it prints `listening on ADDR` once
//! bound. [`EmptyProcess`] starts it so from a scenario.

use std::io::{BufRead as _, BufReader, Write as _};
use std::net::SocketAddr;
use std::process::Stdio;

use anyhow::{Context, bail};
use tokio::net::TcpListener;
use tollgate::proto::rate_limit_response::{Code, DescriptorStatus};
use tollgate::proto::rate_limit_service_server::{RateLimitService, RateLimitServiceServer};
use tollgate::proto::{RateLimitRequest, RateLimitResponse};
use tollgate::server::runtime::{self, Wakeups};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

use crate::proc::OwnedChild;
use crate::stand::MeasuredServer;

/// The empty server as a child process, killed when dropped.
pub struct EmptyProcess {
    process: OwnedChild,
    addr: SocketAddr,
}

impl EmptyProcess {
    /// Starts the empty server on a free loopback port and waits until it listens.
    pub fn start() -> anyhow::Result<EmptyProcess> {
        EmptyProcess::start_under(&[])
    }

    /// [`EmptyProcess::start`], run under `under` (a program and its flags, e.g. valgrind's),
    /// which keeps the server's process id.
    pub fn start_under(under: &[String]) -> anyhow::Result<EmptyProcess> {
        let exe = std::env::current_exe().context("finding tollgate-bench itself")?;
        let mut process = OwnedChild::new(
            tollgate_testkit::process::command_under(under, exe)
                .args(["empty-server", "--listen", "127.0.0.1:0"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .context("starting the empty RLS server")?,
        );
        let mut line = String::new();
        if let Some(stdout) = process.child().stdout.take() {
            BufReader::new(stdout).read_line(&mut line)?;
        }
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|addr| addr.parse().ok());
        match addr {
            Some(addr) => Ok(EmptyProcess { process, addr }),
            None => bail!("the empty RLS server did not say where it listens: {line:?}"),
        }
    }
}

impl MeasuredServer for EmptyProcess {
    fn grpc_addr(&self) -> SocketAddr {
        self.addr
    }

    fn pid(&self) -> anyhow::Result<u32> {
        Ok(self.process.id())
    }

    fn log(&self) -> String {
        // Its output is only the address it listens on; it reports nothing else.
        String::new()
    }
}

/// The options of `tollgate-bench empty-server`.
#[derive(Debug, Clone, clap::Args)]
pub struct EmptyServerArgs {
    /// Address to listen on; port 0 picks a free one (the one bound is printed).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
}

/// The service: every descriptor OK, nothing counted.
struct Empty;

#[tonic::async_trait]
impl RateLimitService for Empty {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let statuses = request
            .get_ref()
            .descriptors
            .iter()
            .map(|_| DescriptorStatus {
                code: Code::Ok as i32,
                ..DescriptorStatus::default()
            })
            .collect();
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

/// Serves the empty service on `listener` until the process ends.
pub async fn serve(listener: TcpListener) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .add_service(RateLimitServiceServer::new(Empty))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await
        .context("serving the empty RLS server")
}

/// `tollgate-bench empty-server`: binds, says where, serves on a runtime like tollgate's.
pub fn run(args: &EmptyServerArgs) -> anyhow::Result<()> {
    let workers = std::thread::available_parallelism().context("counting the CPUs")?;
    // Scheduled as tollgate schedules the memory backend, the one this server is the floor of.
    let runtime = runtime::build(workers, Wakeups::RunFirst).context("starting the runtime")?;
    runtime.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("binding {}", args.listen))?;
        let addr = listener.local_addr()?;
        let mut out = std::io::stdout().lock();
        writeln!(out, "listening on {addr}")?;
        out.flush()?;
        drop(out);
        serve(listener).await
    })
}
