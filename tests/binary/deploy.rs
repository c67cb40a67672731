//! The deployment examples under `deploy/` are checked here, since no container engine or
//! Kubernetes cluster runs in the test environment: Envoy validates the bootstrap and runs it
//! against tollgate serving the example policies; the Kubernetes manifests are parsed and held to
//! the operational rules (gRPC health probes on service names tollgate answers, readiness on the
//! RLS service and liveness on one that ignores Redis, a locked-down non-root container,
//! resources, the policies ConfigMap loading with `tollgate check`); the Dockerfile is read for a
//! multi-stage static, non-root build.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use saphyr::{LoadableYamlNode, YamlOwned};
use tollgate::proto::RLS_SERVICE_NAME as RLS;
use tollgate::server::health::LIVENESS_SERVICE;
use tonic_health::pb::health_check_response::ServingStatus;

use tollgate_testkit::envoy::Envoy;
use tollgate_testkit::net::{Reply, free_addr};
use tollgate_testkit::rls::health_status;
use tollgate_testkit::tollgate::{Tollgate, tollgate_bin};
use tollgate_testkit::tools::{envoy_bin, manifest_dir};

fn repo_path(relative: &str) -> PathBuf {
    manifest_dir().join(relative)
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .unwrap_or_else(|err| panic!("read {relative}: {err}"))
}

// ---------------------------------------------------------------------------------------------
// Envoy bootstrap

#[test]
fn envoy_bootstrap_example_passes_envoy_validation() {
    let output = Command::new(envoy_bin())
        .args(["--mode", "validate", "-c"])
        .arg(repo_path("deploy/envoy/envoy.yaml"))
        .output()
        .expect("run envoy --mode validate");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "envoy --mode validate failed: {}\n{stdout}{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("OK"), "{stdout}");
}

/// Replaces the one occurrence of `from` in `text`.
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "expected {from:?} once");
    text.replacen(from, to, 1)
}

/// The example bootstrap, on free loopback ports, pointing at this tollgate and upstream.
fn local_bootstrap(
    tollgate: SocketAddr,
    app: SocketAddr,
    admin: SocketAddr,
    edge: SocketAddr,
) -> String {
    let text = read("deploy/envoy/envoy.yaml");
    let text = replace_once(
        &text,
        "{address: 127.0.0.1, port_value: 9901}",
        &format!("{{address: 127.0.0.1, port_value: {}}}", admin.port()),
    );
    let text = replace_once(
        &text,
        "{address: 0.0.0.0, port_value: 10000}",
        &format!("{{address: 127.0.0.1, port_value: {}}}", edge.port()),
    );
    let text = replace_once(
        &text,
        "{address: 127.0.0.1, port_value: 8000}",
        &format!("{{address: 127.0.0.1, port_value: {}}}", app.port()),
    );
    replace_once(
        &text,
        "{address: 127.0.0.1, port_value: 8081}",
        &format!("{{address: 127.0.0.1, port_value: {}}}", tollgate.port()),
    )
}

fn limit_header(reply: &Reply) -> &str {
    assert_eq!(reply.status, 200, "{reply:?}");
    reply
        .header("x-ratelimit-limit")
        .unwrap_or_else(|| panic!("no x-ratelimit-limit in {reply:?}"))
}

/// Every route of the example bootstrap sends descriptors that the example policies limit: the
/// `x-ratelimit-limit` header lists each policy the route's descriptors matched.
#[test]
fn envoy_bootstrap_example_matches_the_example_policies() {
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &read("examples/edge.yaml"))
        .start();
    // The application stand-in: an Envoy with no rate limits whose edge answers `200 ok`.
    let app = Envoy::builder("unused", free_addr()).start();
    let envoy = Envoy::start_with(|admin, edge, _| {
        local_bootstrap(tollgate.grpc_addr(), app.edge_addr(), admin, edge)
    });

    // global 20000/s, per address 50/s, per user 5/min (the lowest remaining leads).
    let root = envoy.get("/", &[("x-user", "alice")]);
    assert_eq!(limit_header(&root), "5, 20000;w=1, 50;w=1, 5;w=60");
    assert_eq!(root.body, "ok");
    assert_eq!(root.header("x-ratelimit-remaining"), Some("4"));

    // ... plus all logins 100/min and logins per address 5/min.
    let login = envoy.get("/login", &[]);
    assert_eq!(
        limit_header(&login),
        "5, 20000;w=1, 50;w=1, 100;w=60, 5;w=60"
    );

    // ... per user, and the shadow limit on search 20/s.
    let search = envoy.get("/search?q=x", &[("x-user", "bob")]);
    assert_eq!(
        limit_header(&search),
        "5, 20000;w=1, 50;w=1, 5;w=60, 20;w=1"
    );

    // Exports: 30 per 90 s per API key has the least remaining and leads, but its window is no
    // whole unit, so Envoy lists no `w=` entry for it.
    let export = envoy.get("/reports/export", &[("x-api-key", "k1")]);
    assert_eq!(limit_header(&export), "30, 20000;w=1, 50;w=1");
    assert_eq!(export.header("x-ratelimit-remaining"), Some("29"));

    // The allow-listed monitoring user is not limited per user.
    let monitoring = envoy.get("/", &[("x-user", "healthcheck")]);
    assert_eq!(limit_header(&monitoring), "50, 20000;w=1, 50;w=1");

    // The sixth request of a user within the minute is refused.
    for _ in 0..4 {
        assert_eq!(envoy.get("/", &[("x-user", "alice")]).status, 200);
    }
    let refused = envoy.get("/", &[("x-user", "alice")]);
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.header("retry-after").is_some(), "{refused:?}");

    // Probes are answered by Envoy itself, before any rate limit.
    let probe = envoy.get("/healthz", &[]);
    assert_eq!(probe.status, 200, "{probe:?}");
    assert_eq!(probe.header("x-ratelimit-limit"), None);
}

// ---------------------------------------------------------------------------------------------
// Kubernetes manifests

/// A manifest document with the file it came from.
struct Manifest {
    file: String,
    doc: YamlOwned,
}

impl Manifest {
    fn kind(&self) -> &str {
        str_at(&self.doc, "kind")
    }

    fn name(&self) -> &str {
        str_at(&self.doc, "metadata.name")
    }
}

/// Every document of every `deploy/kubernetes/*.yaml`, parsed.
fn manifests() -> Vec<Manifest> {
    let dir = repo_path("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read deploy/kubernetes")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| {
            path.extension()
                .is_some_and(|ext| ext == "yaml" || ext == "yml")
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let mut manifests = Vec::new();
    for path in files {
        let file = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&path).expect("read a manifest");
        let docs = YamlOwned::load_from_str(&text)
            .unwrap_or_else(|err| panic!("{file} is not valid YAML: {err}"));
        assert!(!docs.is_empty(), "{file} has no document");
        for doc in docs {
            assert!(doc.is_mapping(), "{file}: a document is not a mapping");
            manifests.push(Manifest {
                file: file.clone(),
                doc,
            });
        }
    }
    manifests
}

/// The node at a dotted path, if every step exists.
fn get<'a>(node: &'a YamlOwned, path: &str) -> Option<&'a YamlOwned> {
    path.split('.')
        .try_fold(node, |node, step| node.as_mapping_get(step))
}

fn at<'a>(node: &'a YamlOwned, path: &str) -> &'a YamlOwned {
    get(node, path).unwrap_or_else(|| panic!("missing {path}"))
}

fn str_at<'a>(node: &'a YamlOwned, path: &str) -> &'a str {
    at(node, path)
        .as_str()
        .unwrap_or_else(|| panic!("{path} is not a string"))
}

fn seq_at<'a>(node: &'a YamlOwned, path: &str) -> &'a [YamlOwned] {
    get(node, path)
        .and_then(YamlOwned::as_vec)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn bool_at(node: &YamlOwned, path: &str) -> Option<bool> {
    get(node, path).and_then(YamlOwned::as_bool)
}

fn int_at(node: &YamlOwned, path: &str) -> Option<i64> {
    get(node, path).and_then(YamlOwned::as_integer)
}

fn find<'a>(manifests: &'a [Manifest], kind: &str, name: &str) -> &'a Manifest {
    manifests
        .iter()
        .find(|manifest| manifest.kind() == kind && manifest.name() == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(deployment: &'a Manifest, name: &str) -> &'a YamlOwned {
    seq_at(&deployment.doc, "spec.template.spec.containers")
        .iter()
        .find(|container| str_at(container, "name") == name)
        .unwrap_or_else(|| panic!("no container {name} in {}", deployment.name()))
}

fn env_value<'a>(container: &'a YamlOwned, name: &str) -> Option<&'a str> {
    seq_at(container, "env")
        .iter()
        .find(|var| str_at(var, "name") == name)
        .map(|var| str_at(var, "value"))
}

fn named_port(container: &YamlOwned, name: &str) -> i64 {
    seq_at(container, "ports")
        .iter()
        .find(|port| get(port, "name").and_then(YamlOwned::as_str) == Some(name))
        .and_then(|port| int_at(port, "containerPort"))
        .unwrap_or_else(|| panic!("no port named {name}"))
}

/// The mount path of the volume that carries ConfigMap `config_map`.
fn config_map_mount<'a>(
    deployment: &'a Manifest,
    container: &'a YamlOwned,
    config_map: &str,
) -> &'a str {
    let volume = seq_at(&deployment.doc, "spec.template.spec.volumes")
        .iter()
        .find(|volume| {
            get(volume, "configMap.name").and_then(YamlOwned::as_str) == Some(config_map)
        })
        .map(|volume| str_at(volume, "name"))
        .unwrap_or_else(|| panic!("no volume of ConfigMap {config_map}"));
    let mount = seq_at(container, "volumeMounts")
        .iter()
        .find(|mount| str_at(mount, "name") == volume)
        .unwrap_or_else(|| panic!("volume {volume} is not mounted"));
    assert_eq!(
        bool_at(mount, "readOnly"),
        Some(true),
        "{volume} must be mounted read-only"
    );
    str_at(mount, "mountPath")
}

#[test]
fn every_manifest_parses_and_the_kustomization_lists_them_all() {
    let manifests = manifests();
    let mut resources = BTreeSet::new();
    let mut files = BTreeSet::new();
    for manifest in &manifests {
        assert!(
            get(&manifest.doc, "apiVersion")
                .and_then(YamlOwned::as_str)
                .is_some(),
            "{}: no apiVersion",
            manifest.file
        );
        if manifest.kind() == "Kustomization" {
            for resource in seq_at(&manifest.doc, "resources") {
                resources.insert(resource.as_str().expect("a resource path").to_owned());
            }
        } else {
            assert!(
                !manifest.name().is_empty(),
                "{}: no metadata.name",
                manifest.file
            );
            files.insert(manifest.file.clone());
        }
    }
    assert_eq!(
        resources, files,
        "kustomization.yaml resources vs the manifest files"
    );
}

/// Every container of every workload runs as non-root on a read-only root filesystem, cannot
/// escalate, drops all capabilities, and declares resources.
#[test]
fn every_container_is_locked_down_and_sized() {
    let manifests = manifests();
    let workloads: Vec<&Manifest> = manifests
        .iter()
        .filter(|manifest| manifest.kind() == "Deployment")
        .collect();
    assert!(!workloads.is_empty());
    for workload in workloads {
        let pod = at(&workload.doc, "spec.template.spec");
        let what = format!("{} {}", workload.file, workload.name());
        assert_eq!(
            bool_at(pod, "automountServiceAccountToken"),
            Some(false),
            "{what}"
        );
        assert_eq!(
            bool_at(pod, "securityContext.runAsNonRoot"),
            Some(true),
            "{what}"
        );
        assert!(
            int_at(pod, "securityContext.runAsUser").is_some_and(|uid| uid > 0),
            "{what}"
        );
        assert_eq!(
            get(pod, "securityContext.seccompProfile.type").and_then(YamlOwned::as_str),
            Some("RuntimeDefault"),
            "{what}"
        );
        let containers = seq_at(pod, "containers");
        assert!(!containers.is_empty(), "{what}");
        for container in containers {
            let what = format!("{what} container {}", str_at(container, "name"));
            let image = str_at(container, "image");
            let tag = image.rsplit_once(':').map(|(_, tag)| tag);
            assert!(
                tag.is_some_and(|tag| tag != "latest" && !tag.contains('/')),
                "{what}: pin the image tag of {image}"
            );
            assert_eq!(
                bool_at(container, "securityContext.allowPrivilegeEscalation"),
                Some(false),
                "{what}"
            );
            assert_eq!(
                bool_at(container, "securityContext.readOnlyRootFilesystem"),
                Some(true),
                "{what}"
            );
            assert_eq!(
                bool_at(container, "securityContext.runAsNonRoot"),
                Some(true),
                "{what}"
            );
            let dropped: Vec<&str> = seq_at(container, "securityContext.capabilities.drop")
                .iter()
                .filter_map(YamlOwned::as_str)
                .collect();
            assert_eq!(dropped, ["ALL"], "{what}");
            assert!(
                get(container, "securityContext.privileged").is_none(),
                "{what}"
            );
            for resource in [
                "requests.cpu",
                "requests.memory",
                "limits.cpu",
                "limits.memory",
            ] {
                let value = get(container, &format!("resources.{resource}"));
                assert!(
                    value.is_some_and(|value| value.as_str().is_some()),
                    "{what}: resources.{resource}"
                );
            }
        }
    }
}

/// tollgate runs as a sidecar beside Envoy, probed over gRPC health on its gRPC port, with its
/// policies from the ConfigMap at its `--config` path; Envoy's bootstrap is the example one and
/// reaches tollgate over the pod's loopback.
#[test]
fn tollgate_is_a_sidecar_with_grpc_health_probes() {
    let manifests = manifests();
    let deployment = find(&manifests, "Deployment", "edge-proxy");
    let tollgate = container(deployment, "tollgate");
    let envoy = container(deployment, "envoy");

    let grpc_port = named_port(tollgate, "grpc");
    let grpc_addr = env_value(tollgate, "TOLLGATE_GRPC_ADDR").unwrap_or("0.0.0.0:8081");
    assert!(
        grpc_addr.ends_with(&format!(":{grpc_port}")),
        "{grpc_addr} vs port {grpc_port}"
    );
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(
            int_at(tollgate, &format!("{probe}.grpc.port")),
            Some(grpc_port),
            "{probe}"
        );
        assert!(
            get(tollgate, &format!("{probe}.httpGet")).is_none(),
            "{probe}"
        );
    }
    // Ready only while Redis answers; alive whatever Redis does, so an outage takes the pod
    // out of the Service without restart loops, and a hung process is restarted promptly.
    assert_eq!(str_at(tollgate, "readinessProbe.grpc.service"), RLS);
    assert_eq!(
        str_at(tollgate, "livenessProbe.grpc.service"),
        LIVENESS_SERVICE
    );
    let failure_threshold = int_at(tollgate, "livenessProbe.failureThreshold").unwrap_or(3);
    let period = int_at(tollgate, "livenessProbe.periodSeconds").unwrap_or(10);
    assert!(
        (1..=5).contains(&failure_threshold) && failure_threshold * period <= 60,
        "liveness gives up after {failure_threshold} x {period} s: a hung tollgate should be \
         restarted within a minute"
    );

    // The policies: the ConfigMap mounted where --config (here its env var) points.
    let args: Vec<&str> = seq_at(tollgate, "args")
        .iter()
        .filter_map(YamlOwned::as_str)
        .collect();
    assert_eq!(args.first(), Some(&"serve"), "{args:?}");
    let config_path = env_value(tollgate, "TOLLGATE_CONFIG")
        .or_else(|| {
            args.iter()
                .position(|arg| *arg == "--config")
                .map(|at| args[at + 1])
        })
        .expect("a config path");
    assert_eq!(
        config_map_mount(deployment, tollgate, "tollgate-policies"),
        config_path
    );

    // Every environment variable is one `tollgate serve` reads.
    let help = Command::new(tollgate_bin())
        .args(["serve", "--help"])
        .output()
        .expect("run tollgate serve --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for var in seq_at(tollgate, "env") {
        let name = str_at(var, "name");
        assert!(
            help.contains(&format!("[env: {name}=")),
            "tollgate serve does not read {name}"
        );
    }

    // Envoy runs the example bootstrap from its ConfigMap.
    let envoy_args: Vec<&str> = seq_at(envoy, "args")
        .iter()
        .filter_map(YamlOwned::as_str)
        .collect();
    let bootstrap = envoy_args
        .iter()
        .position(|arg| *arg == "-c")
        .map(|at| envoy_args[at + 1])
        .expect("envoy -c");
    let mount = config_map_mount(deployment, envoy, "envoy-config");
    assert_eq!(bootstrap, format!("{mount}/envoy.yaml"));
    let envoy_config = find(&manifests, "ConfigMap", "envoy-config");
    let carried = at(&envoy_config.doc, "data")
        .as_mapping_get("envoy.yaml")
        .and_then(YamlOwned::as_str)
        .expect("envoy-config carries envoy.yaml");
    assert_eq!(
        carried,
        read("deploy/envoy/envoy.yaml"),
        "envoy-config.yaml is stale: run scripts/sync-deploy-configmaps"
    );
    assert!(carried.contains(&format!("{{address: 127.0.0.1, port_value: {grpc_port}}}")));

    // The Service sends traffic to Envoy's named port.
    let service = find(&manifests, "Service", "edge-proxy");
    for port in seq_at(&service.doc, "spec.ports") {
        let target = str_at(port, "targetPort");
        assert!(named_port(envoy, target) > 0);
    }
}

/// The gRPC health service names the tollgate probes ask for are ones tollgate answers: with the
/// example policies and a reachable backend, both are SERVING. (An unknown name would be
/// NOT_FOUND, and Kubernetes would count every probe as failed.)
#[test]
fn tollgate_probes_ask_for_services_tollgate_serves() {
    let manifests = manifests();
    let deployment = find(&manifests, "Deployment", "edge-proxy");
    let probed = container(deployment, "tollgate");
    let tollgate = Tollgate::builder()
        .policy("edge.yaml", &read("examples/edge.yaml"))
        .start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime");
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let Some(service) = get(probed, &format!("{probe}.grpc.service")) else {
            continue;
        };
        let service = service.as_str().expect("a service name");
        let status = runtime.block_on(health_status(tollgate.grpc_addr(), service));
        assert_eq!(
            status,
            Ok(ServingStatus::Serving),
            "{probe} asks for {service}"
        );
    }
}

/// The policies ConfigMap holds `*.yaml` files that `tollgate check` accepts: the example ones.
#[test]
fn policies_configmap_loads_with_tollgate_check() {
    let manifests = manifests();
    let policies = find(&manifests, "ConfigMap", "tollgate-policies");
    let data = at(&policies.doc, "data")
        .as_mapping()
        .expect("data is a mapping");
    assert!(!data.is_empty());
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (key, value) in data {
        let key = key.as_str().expect("a string key");
        assert!(
            key.ends_with(".yaml"),
            "ConfigMap key {key} must end in .yaml to be loaded"
        );
        let text = value.as_str().expect("a string value");
        std::fs::write(dir.path().join(key), text).expect("write a policy file");
        let example = Path::new("examples").join(key);
        assert_eq!(
            text,
            read(example.to_str().expect("a UTF-8 path")),
            "tollgate-policies.yaml is stale: run scripts/sync-deploy-configmaps"
        );
    }
    let check = Command::new(tollgate_bin())
        .args(["check", "--config"])
        .arg(dir.path())
        .output()
        .expect("run tollgate check");
    assert!(
        check.status.success(),
        "tollgate check failed: {}\n{}{}",
        check.status,
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(String::from_utf8_lossy(&check.stdout).contains("edge."));
}

// ---------------------------------------------------------------------------------------------
// Dockerfile

/// One Dockerfile instruction: the keyword (upper case) and its arguments, continuation lines
/// joined.
fn dockerfile_instructions(text: &str) -> Vec<(String, String)> {
    let mut instructions = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        if let Some(continued) = trimmed.strip_suffix('\\') {
            current.push_str(continued);
            current.push(' ');
            continue;
        }
        current.push_str(trimmed);
        if let Some((keyword, arguments)) = current.split_once(char::is_whitespace) {
            instructions.push((keyword.to_uppercase(), arguments.trim().to_owned()));
        }
        current.clear();
    }
    instructions
}

/// A JSON array of strings as Docker's exec form writes it (no escapes in these files).
fn exec_form(arguments: &str) -> Vec<String> {
    let inner = arguments
        .trim()
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{arguments} is not in exec form"));
    inner
        .split(',')
        .map(|item| item.trim().trim_matches('"').to_owned())
        .collect()
}

/// The image: a multi-stage build whose binary links the C library of the final base, which
/// is distroless (no shell), the same Debian release as the build stage, run as non-root.
#[test]
fn dockerfile_builds_a_small_non_root_image_on_the_build_stage_c_library() {
    let instructions = dockerfile_instructions(&read("deploy/Dockerfile"));
    let stages: Vec<usize> = instructions
        .iter()
        .enumerate()
        .filter(|(_, (keyword, _))| keyword == "FROM")
        .map(|(index, _)| index)
        .collect();
    assert!(stages.len() >= 2, "a multi-stage build");
    let (_, first_from) = &instructions[stages[0]];
    let build_stage = first_from
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .find(|pair| pair[0].eq_ignore_ascii_case("as"))
        .map(|pair| pair[1].to_owned())
        .expect("the build stage is named");
    let build = &instructions[stages[0]..*stages.last().expect("a stage")];
    let cargo = build
        .iter()
        .find(|(keyword, arguments)| keyword == "RUN" && arguments.contains("cargo build"))
        .map(|(_, arguments)| arguments.as_str())
        .expect("a cargo build step");
    for flag in ["--release", "--locked", "--bin tollgate"] {
        assert!(cargo.contains(flag), "cargo build lacks {flag}: {cargo}");
    }
    // musl's allocator costs two to three times the CPU per decision: the image runs the C
    // library the benchmarks measure.
    assert!(!cargo.contains("musl"), "a musl build: {cargo}");
    // The image is pulled beside every Envoy: no debug information (five sixths of the binary).
    assert!(
        cargo.contains("strip --strip-debug /tollgate"),
        "the binary keeps its debug information: {cargo}"
    );

    let last = &instructions[*stages.last().expect("a stage")..];
    let (_, base) = &last[0];
    assert!(
        base.starts_with("gcr.io/distroless/cc-"),
        "the final image has the C library and no shell: {base}"
    );
    // The binary asks for the glibc it was linked with, so the base may not be an older release.
    let build_image = first_from.split_whitespace().next().expect("a build image");
    for (codename, release) in [("bookworm", "debian12"), ("trixie", "debian13")] {
        if build_image.ends_with(&format!("-{codename}")) {
            assert!(
                base.contains(&format!("-{release}")),
                "built on {codename}, shipped on {base}"
            );
        }
    }
    assert!(
        ["bookworm", "trixie"]
            .iter()
            .any(|codename| build_image.ends_with(&format!("-{codename}"))),
        "the build stage names its Debian release: {build_image}"
    );
    let keyword_args = |name: &str| -> Vec<&str> {
        last.iter()
            .filter(|(keyword, _)| keyword == name)
            .map(|(_, arguments)| arguments.as_str())
            .collect()
    };
    let copied = keyword_args("COPY")
        .into_iter()
        .find(|arguments| arguments.starts_with(&format!("--from={build_stage} ")))
        .expect("the binary is copied from the build stage");
    let binary = copied.split_whitespace().last().expect("a destination");
    let user = keyword_args("USER").last().copied().expect("a USER");
    let uid = user.split(':').next().expect("a user");
    assert!(uid != "root" && uid != "0", "runs as {user}");
    let entrypoint = exec_form(keyword_args("ENTRYPOINT").last().expect("an ENTRYPOINT"));
    assert_eq!(entrypoint, [binary]);
    assert_eq!(
        exec_form(keyword_args("CMD").last().expect("a CMD")),
        ["serve", "--config", "/etc/tollgate"]
    );
    // The reference's entry point: the same binary at /bin/ratelimit (its name selects the
    // reference's defaults), with no image-wide variable that would override its RUNTIME_*.
    assert!(
        keyword_args("COPY")
            .contains(&format!("--from={build_stage} /tollgate /bin/ratelimit").as_str()),
        "/bin/ratelimit"
    );
    assert!(
        !keyword_args("ENV")
            .iter()
            .any(|env| env.starts_with("TOLLGATE_")),
        "an image-wide TOLLGATE_* variable would win over the reference's variables"
    );
    let exposed: Vec<&str> = keyword_args("EXPOSE")
        .iter()
        .flat_map(|ports| ports.split_whitespace())
        .collect();
    for port in ["8080", "8081", "6070"] {
        assert!(exposed.contains(&port), "EXPOSE {port}");
    }
}

/// The build context (`deploy/Dockerfile.dockerignore`) holds everything the build reads: the
/// manifest, and every file the sources include from outside `src/`.
#[test]
fn docker_build_context_has_what_cargo_build_reads() {
    let kept: Vec<String> = read("deploy/Dockerfile.dockerignore")
        .lines()
        .filter_map(|line| line.trim().strip_prefix('!'))
        .map(|path| path.trim_end_matches('/').to_owned())
        .collect();
    for path in &kept {
        assert!(
            repo_path(path).exists(),
            "the context keeps {path}, which does not exist"
        );
    }
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        ".cargo",
        "build.rs",
        "src",
        "proto",
    ] {
        assert!(
            kept.iter().any(|path| path == needed),
            "the context lacks {needed}"
        );
    }
    // Cargo reads every target the manifest declares, even when building one binary.
    let manifest = read("Cargo.toml");
    for (table, dir) in [
        ("[[bench]]", "benches"),
        ("[[test]]", "tests"),
        ("[[example]]", "examples"),
    ] {
        if manifest.contains(table) {
            assert!(
                kept.iter().any(|path| path == dir),
                "Cargo.toml declares {table}: the context needs {dir}/"
            );
        }
    }
    for line in manifest.lines() {
        if let Some((_, value)) = line.split_once("path = \"") {
            let path = value.split('"').next().unwrap_or_default();
            let top = path.split('/').next().unwrap_or_default();
            assert!(
                kept.iter().any(|kept| kept == top),
                "Cargo.toml refers to {path}, outside the Docker build context"
            );
        }
    }
    let mut sources = vec![repo_path("src")];
    while let Some(path) = sources.pop() {
        if path.is_dir() {
            sources.extend(
                std::fs::read_dir(&path)
                    .expect("read a source directory")
                    .map(|entry| entry.expect("an entry").path()),
            );
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for marker in ["include_str!(\"", "include_bytes!(\""] {
            for (at, _) in text.match_indices(marker) {
                let literal = &text[at + marker.len()..];
                let Some(end) = literal.find('"') else {
                    continue;
                };
                let included = path.parent().expect("a parent").join(&literal[..end]);
                let included = included
                    .canonicalize()
                    .unwrap_or_else(|err| panic!("{}: {err}", included.display()));
                let relative = included
                    .strip_prefix(manifest_dir().canonicalize().expect("the repository"))
                    .expect("inside the repository");
                let top = relative
                    .components()
                    .next()
                    .expect("a path")
                    .as_os_str()
                    .to_string_lossy()
                    .into_owned();
                assert!(
                    kept.contains(&top),
                    "{} includes {}, outside the Docker build context",
                    path.display(),
                    relative.display()
                );
            }
        }
    }
}

/// The feature sets each crate is built with, as `cargo tree` resolves them for one selection of
/// the workspace along `edges` (`normal,build`: without dev-dependencies): crate and version → every distinct set it is compiled
/// with (a crate built for the host, as a build or proc-macro dependency, and for the target
/// appears with both).
fn resolved_features(
    edges: &str,
    args: &[&str],
) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let output = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["tree", "--offline", "-e", edges, "--prefix", "none"])
        .args(["-f", "{p} {f}"])
        .args(args)
        .current_dir(manifest_dir())
        .output()
        .expect("run cargo tree");
    assert!(
        output.status.success(),
        "cargo tree {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut features = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let words: Vec<&str> = line.trim_end_matches(" (*)").split_whitespace().collect();
        if words.len() < 2 {
            continue;
        }
        let set = match words.last() {
            Some(last) if words.len() > 2 && !last.starts_with('(') => last.to_string(),
            _ => String::new(),
        };
        features
            .entry(format!("{} {}", words[0], words[1]))
            .or_default()
            .insert(set);
    }
    features
}

/// The README's `cargo run --release` builds the service alone; scripts/test's
/// `cargo build --release --workspace --bins`, run before the suite, builds every binary. If any crate of the service resolved to other features in the second, the first
/// would compile the service again inside the docs test (minutes on a small machine).
#[test]
fn the_service_alone_and_the_workspace_binaries_share_one_build() {
    let alone = resolved_features("normal,build", &["-p", "tollgate"]);
    let workspace = resolved_features("normal,build", &["--workspace"]);
    let differing = widened(&alone, &workspace);
    assert!(
        differing.is_empty(),
        "the workspace turns on features the service alone does not; add them to the service's \
         [dependencies] so one build serves both: {differing:#?}"
    );
}

/// scripts/test builds the workspace's binaries, then the test targets. If the dev-dependencies
/// turned on a feature of a crate the binaries use, the test build would compile that crate and
/// everything above it again (most of the tree: minutes of every CI run).
#[test]
fn the_test_build_reuses_the_binaries_dependencies() {
    let binaries = resolved_features("normal,build", &["--workspace"]);
    let tests = resolved_features("normal,build,dev", &["--workspace"]);
    // `cargo tree` prints a crate built for the host and for the target once when their feature
    // sets agree, so a set can vanish from the test build's listing; what matters is that the
    // test build asks for no set the binaries did not build.
    let differing: Vec<String> = tests
        .iter()
        .filter_map(|(krate, variants)| {
            let built = binaries.get(krate)?;
            let new: Vec<&String> = variants.difference(built).collect();
            (!new.is_empty()).then(|| format!("{krate}: {new:?}, the binaries built {built:?}"))
        })
        .collect();
    assert!(
        differing.is_empty(),
        "the dev-dependencies turn on features the binaries do not; add them to the service's \
         [dependencies] so the suite links the binaries' build: {differing:#?}"
    );
}

/// The crates of `narrow` that `wide` builds with other feature sets, described.
fn widened(
    narrow: &std::collections::BTreeMap<String, BTreeSet<String>>,
    wide: &std::collections::BTreeMap<String, BTreeSet<String>>,
) -> Vec<String> {
    narrow
        .iter()
        .filter_map(|(krate, variants)| {
            let wider = wide.get(krate)?;
            (wider != variants).then(|| format!("{krate}: {variants:?} and then {wider:?}"))
        })
        .collect()
}
