//! Runs a real Envoy for a test, with a bootstrap generated for it: one edge listener whose HTTP
//! rate-limit filter calls tollgate over gRPC, routing to a cluster that is a second listener of
//! the same Envoy answering `200 ok` with a direct response. (Envoy's rate-limit filter does not
//! call the service for a direct-response route, so the edge route must go to a cluster.)

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use tempfile::TempDir;

use super::net::{Reply, agent, free_addrs, send};
use super::tools::envoy_bin;

/// How long Envoy may take to report LIVE on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Attempts with fresh ports when the chosen ones were taken before Envoy bound them.
const START_ATTEMPTS: usize = 3;

/// One Envoy rate-limit action: it adds one entry to the descriptor it belongs to.
#[derive(Debug, Clone)]
pub enum Action {
    /// `request_headers`: the value of `header` as the entry `key`; the whole descriptor is left
    /// out when the header is absent.
    RequestHeader {
        /// The request header to read.
        header: String,
        /// The descriptor key.
        key: String,
    },
    /// `generic_key`: a constant entry; `key` defaults to `generic_key` in Envoy.
    GenericKey {
        /// The descriptor key, or Envoy's default `generic_key`.
        key: Option<String>,
        /// The descriptor value.
        value: String,
    },
    /// `remote_address`: the client address as the entry `remote_address`.
    RemoteAddress,
}

impl Action {
    /// A `request_headers` action.
    pub fn header(header: &str, key: &str) -> Action {
        Action::RequestHeader {
            header: header.to_owned(),
            key: key.to_owned(),
        }
    }

    /// A `generic_key` action with Envoy's default key `generic_key`.
    pub fn generic(value: &str) -> Action {
        Action::GenericKey {
            key: None,
            value: value.to_owned(),
        }
    }

    /// A `generic_key` action with an explicit key.
    pub fn generic_keyed(key: &str, value: &str) -> Action {
        Action::GenericKey {
            key: Some(key.to_owned()),
            value: value.to_owned(),
        }
    }

    fn to_yaml(&self) -> String {
        match self {
            Action::RequestHeader { header, key } => format!(
                "request_headers: {{header_name: {}, descriptor_key: {}}}",
                quote(header),
                quote(key)
            ),
            Action::GenericKey { key: None, value } => {
                format!("generic_key: {{descriptor_value: {}}}", quote(value))
            }
            Action::GenericKey {
                key: Some(key),
                value,
            } => format!(
                "generic_key: {{descriptor_key: {}, descriptor_value: {}}}",
                quote(key),
                quote(value)
            ),
            Action::RemoteAddress => "remote_address: {}".to_owned(),
        }
    }
}

/// A YAML double-quoted scalar (the test inputs are plain ASCII).
fn quote(text: &str) -> String {
    format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""))
}

/// What the generated bootstrap contains.
#[derive(Debug, Clone)]
pub struct EnvoyBuilder {
    domain: String,
    rls_addr: SocketAddr,
    failure_mode_deny: bool,
    /// Whether the edge listener runs the rate-limit filter at all.
    filter: bool,
    descriptors: Vec<Vec<Action>>,
    /// The edge listener's access log: its format and the file it goes to.
    access_log: Option<(String, std::sync::Arc<tempfile::NamedTempFile>)>,
}

impl EnvoyBuilder {
    /// A bootstrap whose rate-limit filter calls the RLS at `rls_addr` with `domain`.
    pub fn new(domain: &str, rls_addr: SocketAddr) -> EnvoyBuilder {
        EnvoyBuilder {
            domain: domain.to_owned(),
            rls_addr,
            failure_mode_deny: false,
            filter: true,
            descriptors: Vec::new(),
            access_log: None,
        }
    }

    /// Writes an access log line of `format` (Envoy's format string, a newline added) for
    /// every request to the edge listener; [`Envoy::access_log`] reads them.
    pub fn access_log(mut self, format: &str) -> Self {
        let file = tempfile::NamedTempFile::new().expect("create the access log file");
        self.access_log = Some((format!("{format}\n"), std::sync::Arc::new(file)));
        self
    }

    /// Adds a `rate_limits` entry: one descriptor made of these actions' entries, in order.
    pub fn descriptor(mut self, actions: Vec<Action>) -> Self {
        self.descriptors.push(actions);
        self
    }

    /// The filter's `failure_mode_deny`: answer 500 instead of letting the request through when
    /// the rate-limit service cannot be reached.
    pub fn failure_mode_deny(mut self, deny: bool) -> Self {
        self.failure_mode_deny = deny;
        self
    }

    /// No rate-limit filter on the edge listener: Envoy alone, the floor a benchmark measures
    /// the filters beside.
    pub fn without_filter(mut self) -> Self {
        self.filter = false;
        self
    }

    /// The bootstrap YAML for these ports.
    pub fn bootstrap(&self, admin: SocketAddr, edge: SocketAddr, upstream: SocketAddr) -> String {
        let mut rate_limits = String::new();
        for actions in &self.descriptors {
            rate_limits.push_str("                  - actions:\n");
            for action in actions {
                let _ = writeln!(rate_limits, "                    - {}", action.to_yaml());
            }
        }
        if rate_limits.is_empty() {
            rate_limits.push_str("                  []\n");
        }
        format!(
            r#"admin:
  address:
    socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}
static_resources:
  listeners:
  - name: edge
    address:
      socket_address: {{address: 127.0.0.1, port_value: {edge_port}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          use_remote_address: true
{access_log}          route_config:
            name: edge
            virtual_hosts:
            - name: edge
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route:
                  cluster: upstream
                  rate_limits:
{rate_limits}          http_filters:
{filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{rest}"#,
            admin_port = admin.port(),
            edge_port = edge.port(),
            filter = self.filter_yaml(),
            access_log = self.access_log_yaml(),
            rest = upstream_and_clusters(upstream, self.rls_addr),
        )
    }

    fn filter_yaml(&self) -> String {
        if !self.filter {
            return String::new();
        }
        format!(
            r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: {domain}
              failure_mode_deny: {failure_mode_deny}
              enable_x_ratelimit_headers: DRAFT_VERSION_03
              # Envoy's default of 20 ms is too tight for a debug build on a shared machine.
              timeout: 5s
              rate_limit_service:
                transport_api_version: V3
                grpc_service:
                  envoy_grpc: {{cluster_name: tollgate}}
"#,
            domain = quote(&self.domain),
            failure_mode_deny = self.failure_mode_deny,
        )
    }

    fn access_log_yaml(&self) -> String {
        let Some((format, file)) = &self.access_log else {
            return String::new();
        };
        format!(
            r#"          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {path}
              log_format:
                text_format_source: {{inline_string: {format}}}
"#,
            path = quote(&file.path().display().to_string()),
            format = quote(format).replace('\n', "\\n"),
        )
    }

    /// Starts Envoy with this bootstrap and waits until its admin `/ready` answers `LIVE`.
    pub fn start(mut self) -> Envoy {
        let access_log = self
            .access_log
            .as_ref()
            .map(|(_, file)| file.path().to_owned());
        let mut envoy =
            Envoy::start_with(|admin, edge, upstream| self.bootstrap(admin, edge, upstream));
        envoy.access_log = access_log.zip(self.access_log.take().map(|(_, file)| file));
        envoy
    }
}

/// The end of both bootstraps: the upstream listener that answers every request `200 ok` at
/// `upstream`, and the clusters to it and to tollgate at `tollgate` (HTTP/2).
fn upstream_and_clusters(upstream: SocketAddr, tollgate: SocketAddr) -> String {
    format!(
        r#"  - name: upstream
    address:
      socket_address: {{address: 127.0.0.1, port_value: {upstream_port}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: upstream
          route_config:
            name: upstream
            virtual_hosts:
            - name: upstream
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                direct_response:
                  status: 200
                  body: {{inline_string: "ok"}}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{address: 127.0.0.1, port_value: {upstream_port}}}
  - name: tollgate
    type: STATIC
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options: {{}}
    load_assignment:
      cluster_name: tollgate
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{address: {tollgate_ip}, port_value: {tollgate_port}}}
"#,
        upstream_port = upstream.port(),
        tollgate_ip = tollgate.ip(),
        tollgate_port = tollgate.port(),
    )
}

/// A bootstrap whose edge listener runs Envoy's `rate_limit_quota` filter against the RLQS
/// server at `rlqs_addr` in `domain`: a request with the header `x-user` belongs to the bucket
/// `{user: <x-user>}`, one without to `{anonymous: "true"}`. Without an assignment a bucket
/// admits (Envoy's default); once an assignment expires it denies for a minute, so an outage
/// of the server never admits past the limit. Start it with [`Envoy::start_with`].
pub fn rlqs_bootstrap(
    domain: &str,
    rlqs_addr: SocketAddr,
) -> impl Fn(SocketAddr, SocketAddr, SocketAddr) -> String {
    rlqs_bootstrap_by(domain, rlqs_addr, "x-user")
}

/// [`rlqs_bootstrap`] whose per-user buckets take their value from the request header `header`
/// (`:path` too: a benchmark varies the path where it cannot vary a header).
pub fn rlqs_bootstrap_by(
    domain: &str,
    rlqs_addr: SocketAddr,
    header: &str,
) -> impl Fn(SocketAddr, SocketAddr, SocketAddr) -> String {
    let domain = quote(domain);
    let header = quote(header);
    move |admin, edge, upstream| {
        format!(
            r#"admin:
  address:
    socket_address: {{address: 127.0.0.1, port_value: {admin_port}}}
static_resources:
  listeners:
  - name: edge
    address:
      socket_address: {{address: 127.0.0.1, port_value: {edge_port}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            name: edge
            virtual_hosts:
            - name: edge
              domains: ["*"]
              routes:
              - match: {{prefix: "/"}}
                route: {{cluster: upstream}}
          http_filters:
          - name: envoy.filters.http.rate_limit_quota
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig
              rlqs_server: {{envoy_grpc: {{cluster_name: tollgate}}}}
              domain: {domain}
              bucket_matchers:
                matcher_list:
                  matchers:
                  - predicate:
                      single_predicate:
                        input:
                          name: user
                          typed_config:
                            "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                            header_name: {header}
                        value_match: {{safe_regex: {{google_re2: {{}}, regex: ".+"}}}}
                    on_match:
                      action:
                        name: per-user
                        typed_config:
                          "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                          bucket_id_builder:
                            bucket_id_builder:
                              user:
                                custom_value:
                                  name: user
                                  typed_config:
                                    "@type": type.googleapis.com/envoy.type.matcher.v3.HttpRequestHeaderMatchInput
                                    header_name: {header}
                          reporting_interval: 5s
                          expired_assignment_behavior:
                            fallback_rate_limit: {{blanket_rule: DENY_ALL}}
                            expired_assignment_behavior_timeout: 60s
                          deny_response_settings: {{http_status: {{code: 429}}}}
                on_no_match:
                  action:
                    name: anonymous
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings
                      bucket_id_builder:
                        bucket_id_builder:
                          anonymous: {{string_value: "true"}}
                      reporting_interval: 5s
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
{rest}"#,
            admin_port = admin.port(),
            edge_port = edge.port(),
            rest = upstream_and_clusters(upstream, rlqs_addr),
        )
    }
}

/// A running Envoy; dropping it kills the process.
#[derive(Debug)]
pub struct Envoy {
    child: Option<Child>,
    admin: SocketAddr,
    edge: SocketAddr,
    log_path: PathBuf,
    bootstrap_path: PathBuf,
    agent: ureq::Agent,
    /// Keeps the bootstrap and logs alive as long as the process.
    _dir: Option<TempDir>,
    /// The access log, when the bootstrap has one, and the file that keeps it.
    access_log: Option<(PathBuf, std::sync::Arc<tempfile::NamedTempFile>)>,
}

impl Envoy {
    /// A builder for a bootstrap that calls the RLS at `rls_addr` with `domain`.
    pub fn builder(domain: &str, rls_addr: SocketAddr) -> EnvoyBuilder {
        EnvoyBuilder::new(domain, rls_addr)
    }

    /// Starts Envoy with the bootstrap `render(admin, edge, spare)` returns for three free
    /// loopback addresses: the admin listener, the listener tests send requests to, and one more
    /// (the generated bootstraps put their upstream listener there). Waits until `/ready` answers
    /// `LIVE`, choosing fresh ports when the first ones were taken meanwhile.
    pub fn start_with(render: impl Fn(SocketAddr, SocketAddr, SocketAddr) -> String) -> Envoy {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let mut last_log = String::new();
        for attempt in 1..=START_ATTEMPTS {
            let [admin, edge, spare] = free_addrs();
            let bootstrap_path = dir.path().join(format!("envoy-{attempt}.yaml"));
            std::fs::write(&bootstrap_path, render(admin, edge, spare))
                .expect("write the Envoy bootstrap");
            let mut envoy = Envoy {
                child: None,
                admin,
                edge,
                log_path: dir.path().join(format!("envoy-{attempt}.log")),
                bootstrap_path,
                agent: agent(),
                _dir: None,
                access_log: None,
            };
            envoy.spawn();
            match envoy.wait_live() {
                Ok(()) => {
                    envoy._dir = Some(dir);
                    return envoy;
                }
                Err(log) if log.contains("Address already in use") => last_log = log,
                Err(log) => panic!("Envoy did not become LIVE:\n{log}"),
            }
        }
        panic!("Envoy could not bind free ports in {START_ATTEMPTS} attempts:\n{last_log}");
    }

    /// The edge listener's address (the one with the rate-limit filter).
    pub fn edge_addr(&self) -> SocketAddr {
        self.edge
    }

    /// The Envoy process's id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `GET path` on the edge listener with extra request headers.
    pub fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        send(
            &self.agent,
            "GET",
            &format!("http://{}{path}", self.edge),
            headers,
            None,
        )
    }

    /// The access log lines Envoy has written so far (it flushes them about once a second).
    pub fn access_log(&self) -> Vec<String> {
        self.access_log
            .as_ref()
            .and_then(|(path, _)| std::fs::read_to_string(path).ok())
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Everything Envoy has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn spawn(&mut self) {
        let mut command = Command::new(envoy_bin());
        command
            .arg("-c")
            .arg(&self.bootstrap_path)
            .args(["--disable-hot-restart", "--concurrency", "1"])
            .args(["--log-level", "warn"]);
        crate::process::log_to(&mut command, &self.log_path);
        let child = crate::process::spawn(command).expect("spawn the Envoy binary");
        self.child = Some(child);
    }

    /// Polls the admin `/ready` until it answers `LIVE`; on failure returns the log.
    fn wait_live(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + START_TIMEOUT;
        let url = format!("http://{}/ready", self.admin);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("Envoy exited with {status}\n{}", self.log()));
            }
            if let Ok(mut response) = self.agent.get(&url).call()
                && response.status() == 200
                && response
                    .body_mut()
                    .read_to_string()
                    .is_ok_and(|body| body.trim() == "LIVE")
            {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
        Err(format!("not LIVE after {START_TIMEOUT:?}\n{}", self.log()))
    }

    fn kill(&mut self) {
        crate::process::kill(&mut self.child);
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        self.kill();
        crate::process::print_log_if_panicking("Envoy", &self.log_path);
    }
}
