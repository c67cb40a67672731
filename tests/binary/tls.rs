//! tollgate where Envoy Gateway runs envoyproxy/ratelimit: the binary started as `ratelimit`
//! with no arguments and Envoy Gateway's environment (its variables and values; paths under a
//! temporary directory, certificates made by the test), serving a real Envoy over mutual TLS.
//!
//! The policies arrive as Envoy Gateway delivers them: over xDS from a management server (the
//! test kit's, standing in for `envoy-gateway:18001`) that requires mutual TLS with certificates
//! of the same CA as the rate-limit service's own. The one departure from Envoy Gateway's
//! environment, marked in [`envoy_gateway_env`]: the listeners bind free loopback ports instead
//! of 8081/8080/6070/19001, so tests can run side by side.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;
use tollgate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use tollgate_testkit::certs::{Ca, Issued, Usage, presented_certificate};
use tollgate_testkit::envoy::{Action, Envoy};
use tollgate_testkit::mount::Mount;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::pki::Issued as PkiIssued;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{Ratelimit, RatelimitBuilder};
use tollgate_testkit::tools::grpcurl_bin;
use tollgate_testkit::wait;
use tollgate_testkit::xds::ManagementServer;

/// The server name Envoy Gateway's certificate for the rate-limit service carries.
const SERVICE_NAME: &str = "envoy-ratelimit.envoy-gateway-system.svc.cluster.local";

/// Envoy Gateway's node id for its rate-limit service.
const NODE: &str = "envoy-ratelimit";

/// The policy Envoy Gateway pushes in these tests: in domain `edge`, each `user` value gets three
/// hits a minute.
fn policy() -> RateLimitConfig {
    RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: 3,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

/// A Kubernetes-like pod filesystem (the `certs` Secret mount: tls.crt, tls.key, ca.crt, as
/// Envoy Gateway's `envoy-rate-limit` Secret has them), and Envoy Gateway's xDS server, whose
/// certificate the same CA signed.
struct Pod {
    dir: TempDir,
    ca: Ca,
    certs: Mount,
    xds: ManagementServer,
}

impl Pod {
    fn new() -> Pod {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let ca = Ca::new("envoy-gateway");
        let server = ca.issue(
            "envoy-ratelimit",
            &[SERVICE_NAME, "localhost", "127.0.0.1"],
            Usage::Both,
        );
        let certs = Mount::create(&dir.path().join("certs"), &secret(&server, &ca));
        let control_plane = ca.issue(
            "envoy-gateway",
            &["envoy-gateway", "127.0.0.1"],
            Usage::Both,
        );
        let xds_certs = dir.path().join("envoy-gateway-certs");
        std::fs::create_dir(&xds_certs).expect("a directory for the xDS server's certificate");
        for (name, contents) in secret(&control_plane, &ca) {
            std::fs::write(xds_certs.join(name), contents).expect("write the xDS server's files");
        }
        let xds = ManagementServer::builder()
            .node_id(NODE)
            .mutual_tls(&PkiIssued::from_dir(xds_certs))
            .start();
        xds.push("1", &[policy()]);
        Pod {
            dir,
            ca,
            certs,
            xds,
        }
    }

    /// Starts `ratelimit` and waits until it is healthy and has taken (and acknowledged) the
    /// control plane's first push.
    fn start(&self, ratelimit: RatelimitBuilder) -> Ratelimit {
        let ratelimit = ratelimit.start_healthy();
        self.xds.wait_for_ack("1");
        ratelimit
    }

    fn path(&self, relative: &str) -> String {
        self.dir.path().join(relative).display().to_string()
    }

    /// Writes a client's certificate and key as files, answering their paths.
    fn client_files(&self, issued: &Issued, name: &str) -> (PathBuf, PathBuf) {
        issued.write(self.dir.path(), name)
    }

    fn ca_path(&self) -> PathBuf {
        self.certs.path("ca.crt")
    }
}

fn secret<'a>(server: &'a Issued, ca: &'a Ca) -> [(&'static str, &'a [u8]); 3] {
    [
        ("tls.crt", server.cert_pem.as_bytes()),
        ("tls.key", server.key_pem.as_bytes()),
        ("ca.crt", ca.pem().as_bytes()),
    ]
}

/// Envoy Gateway's environment for the rate-limit container (its values; paths moved under the
/// pod directory), with a Redis backend at `redis`.
fn envoy_gateway_env(pod: &Pod, redis: &RedisServer) -> RatelimitBuilder {
    Ratelimit::builder()
        .env("RUNTIME_ROOT", pod.path("data"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("RUNTIME_IGNOREDOTFILES", "true")
        .env("RUNTIME_WATCH_ROOT", "false")
        .env("LOG_LEVEL", "info")
        .env("USE_STATSD", "false")
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("CONFIG_GRPC_XDS_SERVER_URL", pod.xds.url())
        .env("CONFIG_GRPC_XDS_NODE_ID", NODE)
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", pod.path("certs/tls.crt"))
        .env("GRPC_SERVER_TLS_KEY", pod.path("certs/tls.key"))
        .env("GRPC_SERVER_TLS_CA_CERT", pod.path("certs/ca.crt"))
        .env("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", pod.path("certs/tls.crt"))
        .env("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", pod.path("certs/tls.key"))
        .env(
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
            pod.path("certs/ca.crt"),
        )
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .env("REDIS_SOCKET_TYPE", "tcp")
        .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
        .env("USE_PROMETHEUS", "true")
        .env("PROMETHEUS_ADDR", "127.0.0.1:0")
        .env(
            "PROMETHEUS_MAPPER_YAML",
            pod.path("statsd-exporter/conf.yaml"),
        )
        // Departure: free loopback ports instead of 8081, 8080, 6070 (and 19001 above).
        .loopback_ports()
        // Certificate files are polled this often; short so rotation is seen promptly.
        .env("TOLLGATE_RELOAD_INTERVAL", "200ms")
}

/// The generated Envoy bootstrap, with the rate-limit cluster over mutual TLS as Envoy Gateway
/// configures it: its own certificate, the CA as the only trust, TLS 1.3 at most, no SNI and no
/// SAN match.
fn envoy_over_mtls(rls: SocketAddr, cert: &Path, key: &Path, ca: &Path) -> Envoy {
    let builder = Envoy::builder("edge", rls).descriptor(vec![Action::header("x-user", "user")]);
    let transport = format!(
        r#"  - name: tollgate
    type: STATIC
    connect_timeout: 1s
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        common_tls_context:
          tls_params: {{tls_maximum_protocol_version: TLSv1_3}}
          tls_certificates:
          - certificate_chain: {{filename: "{cert}"}}
            private_key: {{filename: "{key}"}}
          validation_context:
            trusted_ca: {{filename: "{ca}"}}
"#,
        cert = cert.display(),
        key = key.display(),
        ca = ca.display(),
    );
    Envoy::start_with(move |admin, edge, spare| {
        let bootstrap = builder.bootstrap(admin, edge, spare);
        let plain = "  - name: tollgate\n    type: STATIC\n    connect_timeout: 1s\n";
        assert_eq!(bootstrap.matches(plain).count(), 1, "the tollgate cluster");
        bootstrap.replacen(plain, &transport, 1)
    })
}

/// `grpcurl` against `addr` over TLS with `ca`, presenting `client` if given: (succeeded,
/// stdout, stderr).
fn grpcurl(
    addr: SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
    call: &[&str],
) -> (bool, String, String) {
    let mut command = Command::new(grpcurl_bin());
    command.arg("-cacert").arg(ca);
    if let Some((cert, key)) = client {
        command.arg("-cert").arg(cert).arg("-key").arg(key);
    }
    // Flags come before the address, the method after it.
    let (method, flags) = call.split_last().expect("a method or `list`");
    let output = command
        .args(["-max-time", "10"])
        .args(flags)
        .arg(addr.to_string())
        .arg(method)
        .stdin(Stdio::null())
        .output()
        .expect("run grpcurl");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const DECIDE: &[&str] = &[
    "-d",
    r#"{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"grpcurl"}]}]}"#,
    "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
];

#[test]
fn envoy_gateways_environment_serves_envoy_over_mutual_tls() {
    let redis = RedisServer::start();
    let pod = Pod::new();
    let ratelimit = pod.start(envoy_gateway_env(&pod, &redis));
    let log = ratelimit.log();
    assert!(log.contains("tls=\"mutual\""), "{log}");
    assert!(log.contains("PROMETHEUS_MAPPER_YAML"), "{log}");
    let grpc = ratelimit.addr("grpc");

    // Envoy, with a client certificate from the same CA (as Envoy Gateway issues Envoy's).
    let envoy_cert = pod.ca.issue("envoy", &["envoy"], Usage::Client);
    let (cert, key) = pod.client_files(&envoy_cert, "envoy");
    let envoy = envoy_over_mtls(grpc, &cert, &key, &pod.ca_path());
    let codes: Vec<u16> = (0..4)
        .map(|_| envoy.get("/", &[("x-user", "alice")]).status)
        .collect();
    assert_eq!(codes, [200, 200, 200, 429], "{}", envoy.log());
    assert_eq!(envoy.get("/", &[("x-user", "bob")]).status, 200);

    // The probes Envoy Gateway configures: plain HTTP /healthcheck on the HTTP port.
    let client = agent();
    let health = send(&client, "GET", &ratelimit.url("/healthcheck"), &[], None);
    assert_eq!((health.status, health.body.trim()), (200, "OK"));
    // Metrics on PROMETHEUS_ADDR, at PROMETHEUS_PATH's default.
    let metrics_url = format!("http://{}/metrics", ratelimit.addr("metrics"));
    let metrics = send(&client, "GET", &metrics_url, &[], None);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("tollgate_requests_total{code=\"over_limit\"} 1"),
        "{}",
        metrics.body
    );
    // The debug port answers the loaded policies.
    let rlconfig = send(
        &client,
        "GET",
        &format!("http://{}/rlconfig", ratelimit.addr("debug")),
        &[],
        None,
    );
    assert!(rlconfig.body.contains("edge.user"), "{}", rlconfig.body);
    // ... which came over xDS, from a control plane that saw tollgate's client certificate.
    assert!(rlconfig.body.contains("version=\"1\""), "{}", rlconfig.body);
    assert!(pod.xds.received()[0].client_certificates >= 1);

    // A client with a certificate from the CA is served: the RLS, health and reflection all on
    // the one TLS listener.
    let ca = pod.ca_path();
    let allowed = (cert.as_path(), key.as_path());
    let (ok, out, err) = grpcurl(grpc, &ca, Some(allowed), DECIDE);
    assert!(ok && out.contains("\"overallCode\": \"OK\""), "{out}{err}");
    let (ok, out, err) = grpcurl(grpc, &ca, Some(allowed), &["grpc.health.v1.Health/Check"]);
    assert!(ok && out.contains("SERVING"), "{out}{err}");
    let (ok, out, err) = grpcurl(grpc, &ca, Some(allowed), &["list"]);
    assert!(
        ok && out.contains("envoy.service.ratelimit.v3.RateLimitService"),
        "{out}{err}"
    );

    // No client certificate, or one another CA signed: refused.
    let (ok, out, err) = grpcurl(grpc, &ca, None, DECIDE);
    assert!(!ok, "served without a client certificate: {out}");
    assert!(!err.is_empty());
    let stranger = Ca::new("somebody else").issue("envoy", &["envoy"], Usage::Client);
    let (cert, key) = pod.client_files(&stranger, "stranger");
    let (ok, out, _) = grpcurl(grpc, &ca, Some((&cert, &key)), DECIDE);
    assert!(!ok, "served a certificate of another CA: {out}");
    // Plain text on the TLS port: refused too.
    let plain = Command::new(grpcurl_bin())
        .args(["-plaintext", "-max-time", "5", &grpc.to_string(), "list"])
        .output()
        .expect("run grpcurl");
    assert!(!plain.status.success());
}

#[test]
fn a_client_certificate_without_the_required_san_is_refused() {
    let redis = RedisServer::start();
    let pod = Pod::new();
    let ratelimit = pod.start(
        envoy_gateway_env(&pod, &redis)
            .env("GRPC_CLIENT_TLS_CACERT", pod.path("certs/ca.crt"))
            .env("GRPC_CLIENT_TLS_SAN", "envoy.envoy-gateway-system"),
    );
    let grpc = ratelimit.addr("grpc");
    let ca = pod.ca_path();
    let right = pod.ca.issue(
        "envoy",
        &["envoy.envoy-gateway-system", "other.example"],
        Usage::Client,
    );
    let (cert, key) = pod.client_files(&right, "right");
    let (ok, out, err) = grpcurl(grpc, &ca, Some((&cert, &key)), DECIDE);
    assert!(ok, "the client with the SAN was refused: {out}{err}");
    let wrong = pod.ca.issue("envoy", &["envoy.elsewhere"], Usage::Client);
    let (cert, key) = pod.client_files(&wrong, "wrong");
    let (ok, out, _) = grpcurl(grpc, &ca, Some((&cert, &key)), DECIDE);
    assert!(!ok, "served a client without the required SAN: {out}");
}

#[test]
fn rotating_the_server_certificate_in_place_keeps_serving() {
    let redis = RedisServer::start();
    let mut pod = Pod::new();
    let ratelimit = pod.start(envoy_gateway_env(&pod, &redis));
    let grpc = ratelimit.addr("grpc");
    let client = pod.ca.issue("client", &["client"], Usage::Client);
    let (cert, key) = pod.client_files(&client, "client");
    let ca = pod.ca_path();
    let before =
        presented_certificate(grpc, "localhost", pod.ca.pem(), Some(&client)).expect("a handshake");

    // An established call (a health Watch stream) and an Envoy connection span the rotation.
    let mut watch = Command::new(grpcurl_bin())
        .arg("-cacert")
        .arg(&ca)
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .arg(grpc.to_string())
        .arg("grpc.health.v1.Health/Watch")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .expect("run grpcurl");
    let envoy_cert = pod.ca.issue("envoy", &["envoy"], Usage::Client);
    let (envoy_crt, envoy_key) = pod.client_files(&envoy_cert, "envoy");
    let envoy = envoy_over_mtls(grpc, &envoy_crt, &envoy_key, &ca);
    assert_eq!(envoy.get("/", &[("x-user", "carol")]).status, 200);

    // cert-manager renews: a new key pair, swapped into the Secret mount in one rename.
    let renewed = pod.ca.issue(
        "envoy-ratelimit",
        &[SERVICE_NAME, "localhost", "127.0.0.1"],
        Usage::Both,
    );
    assert_ne!(renewed.cert_der, before);
    let files = secret(&renewed, &pod.ca);
    pod.certs.update(&files);
    wait::until(
        "new connections to be served the renewed certificate",
        Duration::from_secs(30),
        || {
            presented_certificate(grpc, "localhost", pod.ca.pem(), Some(&client))
                .is_ok_and(|presented| presented == renewed.cert_der)
        },
    );
    assert!(
        ratelimit.log().contains("gRPC TLS certificate reloaded"),
        "{}",
        ratelimit.log()
    );

    // Still serving, to old connections and new ones.
    assert_eq!(envoy.get("/", &[("x-user", "carol")]).status, 200);
    let (ok, out, err) = grpcurl(grpc, &ca, Some((&cert, &key)), DECIDE);
    assert!(ok, "{out}{err}");
    assert!(
        watch.try_wait().expect("poll grpcurl").is_none(),
        "the Watch stream ended at the rotation"
    );
    let _ = watch.kill();
    let output = watch.wait_with_output().expect("grpcurl output");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("SERVING"),
        "the Watch stream saw no status"
    );
}

#[test]
fn a_renewal_that_does_not_load_keeps_the_last_good_certificate() {
    let redis = RedisServer::start();
    let mut pod = Pod::new();
    let ratelimit = pod.start(envoy_gateway_env(&pod, &redis));
    let grpc = ratelimit.addr("grpc");
    let client = pod.ca.issue("client", &["client"], Usage::Client);
    let presented = || presented_certificate(grpc, "localhost", pod.ca.pem(), Some(&client));
    let before = presented().expect("a handshake");

    // A certificate with somebody else's key (files caught half-written, or a broken Secret).
    let renewed = pod
        .ca
        .issue("envoy-ratelimit", &["localhost", "127.0.0.1"], Usage::Both);
    let other = pod.ca.issue("other", &["localhost"], Usage::Both);
    pod.certs.update(&[
        ("tls.crt", renewed.cert_pem.as_bytes()),
        ("tls.key", other.key_pem.as_bytes()),
        ("ca.crt", pod.ca.pem().as_bytes()),
    ]);
    wait::until(
        "the failed reload to be logged",
        Duration::from_secs(30),
        || ratelimit.log().contains("gRPC TLS reload failed"),
    );
    assert_eq!(presented().expect("a handshake"), before);

    // The matching key arrives: the renewed certificate is served.
    pod.certs.update(&secret(&renewed, &pod.ca));
    wait::until("the renewed certificate", Duration::from_secs(30), || {
        presented().is_ok_and(|cert| cert == renewed.cert_der)
    });
}
