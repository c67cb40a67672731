//! Every command README.md and docs/*.md tell a user to type, run as the user would type it.
//!
//! A document's commands live in ```` ```console ```` blocks: a line starting with `$ ` is a
//! command (a line ending in `\` continues on the next), and the lines after it, up to the next
//! command or the end of the block, are what it prints on stdout. In expected output, a line
//! `...` stands for any number of lines and `[..]` for any text within a line (the conventions
//! of trycmd), so times and counters that change from run to run can be masked. Every command
//! must exit 0.
//!
//! The commands of one document run in order, in one session, from the repository root, with
//! the built `tollgate` and the test tools (grpcurl) first on `PATH`. A command that starts the
//! service (`cargo run ... -- serve ...`, `tollgate serve ...`) runs in the background until the
//! next such command or the end of the document; it is ready when it has logged its listening
//! addresses and answers `GET /healthcheck` with 200, and it must exit 0 on SIGTERM. The session
//! binds the service to free ports (`TOLLGATE_GRPC_ADDR` / `TOLLGATE_HTTP_ADDR` = port 0), and
//! `localhost:8081` / `localhost:8080` in later commands are read as the ports it actually bound,
//! so the documents can show the default ports while tests never fight over them. Documents may
//! use `$REDIS_ADDR` (a real redis-server's host:port) and `$REDIS_CLUSTER_SEEDS` (a real
//! 3-master + 3-replica Cluster's seed URLs, comma-separated); the session starts those servers
//! only when a document mentions them.
//!
//! A document may not hide a command in a `sh`/`bash`/`shell` block, where it would never run.
//! The commands not run are in `NOT_RUN`: `scripts/test`, which is the command running this
//! test, and the `scripts/bench` commands, whose scenarios bench/tests/scenarios.rs runs once
//! each at smoke scale. Any other benchmark command runs at smoke scale
//! (`TOLLGATE_BENCH_QUICK=1`, the same as its `--quick` flag, which also keeps its results out of
//! `docs/`): what is checked is that each documented command works, not what it measures.

use std::collections::BTreeSet;
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate_testkit::net::{agent, send};
use tollgate_testkit::redis::{RedisCluster, RedisServer};
use tollgate_testkit::tollgate::{listening_addrs, tollgate_bin};
use tollgate_testkit::tools::{grpcurl_bin, manifest_dir};

/// Commands a document may show that this test does not run, with the reason.
const NOT_RUN: &[(&str, &str)] = &[
    ("scripts/test", "it is the command that runs this test"),
    ("scripts/bench", BENCH_WHY),
    ("scripts/bench --scenarios hotkey --runs 5", BENCH_WHY),
    ("scripts/bench --scenarios accuracy", BENCH_WHY),
];

/// Why the benchmark commands are not run here: each scenario they run is run once at smoke scale
/// by a test of its own, so running them here would run every scenario again.
const BENCH_WHY: &str = "bench/tests/scenarios.rs runs every scenario it runs, once each, at \
                         smoke scale, and checks that it lists each one";

/// How long a service start may take: `cargo run` may have to build the binary first.
const SERVER_START: Duration = Duration::from_secs(600);
/// How long one ordinary command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(600);
/// How long the service may take to drain and exit after SIGTERM.
const SERVER_STOP: Duration = Duration::from_secs(30);

/// One command of a console block and what it should print.
#[derive(Debug)]
struct Step {
    /// `file:line` of the command, for messages.
    place: String,
    command: String,
    expected: Vec<String>,
}

/// Reads the console steps of a markdown document, refusing shell blocks that would not run.
fn steps_of(doc: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(doc)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", doc.display()));
    let name = doc
        .strip_prefix(manifest_dir())
        .unwrap_or(doc)
        .display()
        .to_string();
    let mut steps: Vec<Step> = Vec::new();
    let mut fence: Option<(String, bool)> = None; // (marker, is console)
    let mut pending: Option<(usize, String)> = None; // a command continued with `\`
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if let Some((marker, console)) = &fence {
            if trimmed.starts_with(marker.as_str()) && trimmed.trim_start_matches('`').is_empty() {
                assert!(
                    pending.is_none(),
                    "{name}:{number}: a command ends with `\\` at the end of its block"
                );
                fence = None;
                continue;
            }
            if !console {
                continue;
            }
            if let Some((start, mut command)) = pending.take() {
                command.push('\n');
                command.push_str(line);
                if line.ends_with('\\') {
                    pending = Some((start, command));
                } else {
                    steps.push(step(&name, start, command));
                }
            } else if let Some(command) = line.strip_prefix("$ ") {
                if command.ends_with('\\') {
                    pending = Some((number, command.to_string()));
                } else {
                    steps.push(step(&name, number, command.to_string()));
                }
            } else if let Some(last) = steps.last_mut() {
                last.expected.push(line.trim_end().to_string());
            } else {
                panic!("{name}:{number}: output before the first `$ ` command of a console block");
            }
            continue;
        }
        if let Some(info) = trimmed.strip_prefix("```") {
            let language = info.split([' ', ',', '{']).next().unwrap_or("").trim();
            assert!(
                !matches!(language, "sh" | "bash" | "shell" | "zsh"),
                "{name}:{number}: a `{language}` block is never run; show commands in a \
                 `console` block with `$ ` prompts and their output"
            );
            let marker: String = trimmed.chars().take_while(|c| *c == '`').collect();
            fence = Some((marker, language == "console"));
        }
    }
    assert!(fence.is_none(), "{name}: a code block is not closed");
    steps
}

fn step(name: &str, line: usize, command: String) -> Step {
    Step {
        place: format!("{name}:{line}"),
        command,
        expected: Vec::new(),
    }
}

/// Whether `actual` lines match `expected` lines with `...` and `[..]` wildcards.
fn matches(expected: &[String], actual: &[&str]) -> bool {
    match expected.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first.trim() == "..." => {
            (0..=actual.len()).any(|skip| matches(rest, &actual[skip..]))
        }
        Some((first, rest)) => match actual.split_first() {
            Some((line, others)) => line_matches(first, line) && matches(rest, others),
            None => false,
        },
    }
}

fn line_matches(expected: &str, actual: &str) -> bool {
    let actual = actual.trim_end();
    let mut parts = expected.split("[..]");
    let Some(head) = parts.next() else {
        return actual.is_empty();
    };
    let Some(mut rest) = actual.strip_prefix(head) else {
        return false;
    };
    let tail: Vec<&str> = parts.collect();
    for (index, part) in tail.iter().enumerate() {
        if index + 1 == tail.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Whether a command starts the service (after any leading `NAME=value` assignments).
fn is_server(command: &str) -> bool {
    let flat = command.replace("\\\n", " ");
    let words: Vec<&str> = flat
        .split_whitespace()
        .skip_while(|word| word.contains('=') && !word.starts_with('-'))
        .collect();
    match words.as_slice() {
        ["cargo", "run", rest @ ..] => rest.contains(&"serve"),
        ["tollgate", "serve", ..] => true,
        _ => false,
    }
}

/// `command` as bash should run it to become the service process: `exec` after any leading
/// `NAME=value` assignments (which bash would otherwise take for the program to run), so the
/// assignments reach the service's environment and SIGTERM reaches the service.
fn exec_form(command: &str) -> String {
    let flat = command.replace("\\\n", " ");
    let words: Vec<&str> = flat.split_whitespace().collect();
    let assignments = words
        .iter()
        .take_while(|word| word.contains('=') && !word.starts_with('-'))
        .count();
    let (env, program) = words.split_at(assignments);
    if env.is_empty() {
        format!("exec {command}")
    } else {
        format!("{} exec {}", env.join(" "), program.join(" "))
    }
}

/// The real servers a document's commands may name.
#[derive(Default)]
struct Backends {
    redis: Option<RedisServer>,
    cluster: Option<RedisCluster>,
}

/// One document's session: its environment and the service it started, if any.
struct Session {
    path: String,
    backends: Backends,
    env: Vec<(String, String)>,
    server: Option<Server>,
    scratch: tempfile::TempDir,
}

struct Server {
    place: String,
    child: Child,
    log: PathBuf,
    grpc: SocketAddr,
    http: SocketAddr,
}

impl Session {
    fn new() -> Session {
        let mut dirs = vec![
            tollgate_bin()
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        ];
        dirs.extend(grpcurl_bin().parent().map(Path::to_path_buf));
        dirs.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        let path = std::env::join_paths(dirs)
            .expect("a PATH of valid directories")
            .to_string_lossy()
            .into_owned();
        Session {
            path,
            backends: Backends::default(),
            env: Vec::new(),
            server: None,
            scratch: tempfile::tempdir().expect("create a temporary directory"),
        }
    }

    /// Starts what `command` names and the environment that points at it.
    fn provide(&mut self, command: &str) {
        if command.contains("REDIS_ADDR") && self.backends.redis.is_none() {
            let redis = RedisServer::start();
            self.env
                .push(("REDIS_ADDR".into(), format!("127.0.0.1:{}", redis.port())));
            self.backends.redis = Some(redis);
        }
        if command.contains("REDIS_CLUSTER_SEEDS") && self.backends.cluster.is_none() {
            let cluster = RedisCluster::start();
            self.env
                .push(("REDIS_CLUSTER_SEEDS".into(), cluster.urls().join(",")));
            self.backends.cluster = Some(cluster);
        }
    }

    /// The command with the documented default ports turned into the ones the service bound.
    fn localise(&self, command: &str) -> String {
        match &self.server {
            Some(server) => command
                .replace("localhost:8081", &server.grpc.to_string())
                .replace("localhost:8080", &server.http.to_string()),
            None => command.to_string(),
        }
    }

    fn shell(&self, command: &str) -> Command {
        let mut shell = Command::new("bash");
        shell
            .arg("-c")
            .arg(command)
            .current_dir(manifest_dir())
            .env("PATH", &self.path)
            .env("TOLLGATE_GRPC_ADDR", "127.0.0.1:0")
            .env("TOLLGATE_HTTP_ADDR", "127.0.0.1:0")
            .env("NO_COLOR", "1")
            .env("TOLLGATE_BENCH_QUICK", "1")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null());
        shell
    }

    fn run(&mut self, step: &Step) {
        if let Some((_, why)) = NOT_RUN.iter().find(|(c, _)| *c == step.command.trim()) {
            eprintln!("{}: not run: `{}` ({why})", step.place, step.command);
            return;
        }
        self.provide(&step.command);
        if is_server(&step.command) {
            assert!(
                step.expected.iter().all(|line| line.trim().is_empty()),
                "{}: a command that starts the service shows no output here",
                step.place
            );
            self.stop_server();
            self.start_server(step);
            return;
        }
        let command = self.localise(&step.command);
        let output = run_with_timeout(self.shell(&command), COMMAND_TIMEOUT, &step.place);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "{}: `{command}` exited with {}\nstdout:\n{stdout}\nstderr:\n{stderr}{}",
            step.place,
            output.status,
            self.server_log()
        );
        let actual: Vec<&str> = stdout.lines().collect();
        let mut expected = step.expected.clone();
        while expected.last().is_some_and(|line| line.trim().is_empty()) {
            expected.pop();
        }
        assert!(
            matches(&expected, &actual),
            "{}: `{command}` printed something else.\n--- expected ---\n{}\n--- actual ---\n\
             {stdout}\n--- stderr ---\n{stderr}",
            step.place,
            expected.join("\n")
        );
    }

    fn start_server(&mut self, step: &Step) {
        let log = self.scratch.path().join("server.log");
        let out = File::create(&log).expect("create the server log");
        let err = out.try_clone().expect("clone the log handle");
        let mut shell = self.shell(&exec_form(&step.command));
        shell.stdout(out).stderr(err);
        let child = tollgate_testkit::process::spawn(shell).expect("start the service command");
        let started = Instant::now();
        let mut child = child;
        let (grpc, http) = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(addrs) = listening_addrs(&text) {
                break addrs;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{}: `{}` exited with {status} before serving:\n{text}",
                    step.place, step.command
                );
            }
            assert!(
                started.elapsed() < SERVER_START,
                "{}: `{}` did not listen within {SERVER_START:?}:\n{text}",
                step.place,
                step.command
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let server = Server {
            place: step.place.clone(),
            child,
            log,
            grpc,
            http,
        };
        let url = format!("http://{}/healthcheck", server.http);
        let client = agent();
        let ready = Instant::now();
        while send(&client, "GET", &url, &[], None).status != 200 {
            assert!(
                ready.elapsed() < Duration::from_secs(60),
                "{}: the service never became healthy:\n{}",
                step.place,
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.server = Some(server);
    }

    /// Stops the running service with SIGTERM, as a container runtime would, and checks it
    /// drains and exits 0.
    fn stop_server(&mut self) {
        let Some(mut server) = self.server.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &server.child.id().to_string()])
            .status();
        let deadline = Instant::now() + SERVER_STOP;
        loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                assert!(
                    status.success(),
                    "{}: the service exited with {status} on SIGTERM:\n{}",
                    server.place,
                    std::fs::read_to_string(&server.log).unwrap_or_default()
                );
                return;
            }
            if Instant::now() > deadline {
                let _ = server.child.kill();
                panic!(
                    "{}: the service did not exit within {SERVER_STOP:?} of SIGTERM",
                    server.place
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn server_log(&self) -> String {
        match &self.server {
            Some(server) => format!(
                "\n--- service log ---\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            ),
            None => String::new(),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(server) = self.server.as_mut() {
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
    }
}

fn run_with_timeout(mut command: Command, limit: Duration, place: &str) -> std::process::Output {
    let dir = tempfile::tempdir().expect("create a temporary directory");
    let (out_path, err_path) = (dir.path().join("out"), dir.path().join("err"));
    command
        .stdout(File::create(&out_path).expect("create the output file"))
        .stderr(File::create(&err_path).expect("create the error file"));
    let mut child = command
        .spawn()
        .unwrap_or_else(|err| panic!("{place}: cannot run bash: {err}"));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(status)) = child.try_wait() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{place}: the command did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    std::process::Output {
        status,
        stdout: std::fs::read(&out_path).unwrap_or_default(),
        stderr: std::fs::read(&err_path).unwrap_or_default(),
    }
}

/// Runs every command of `doc` (relative to the repository root).
fn run_document(doc: &str) {
    let path = manifest_dir().join(doc);
    let steps = steps_of(&path);
    assert!(!steps.is_empty(), "{doc} shows no command");
    let mut session = Session::new();
    for step in &steps {
        session.run(step);
    }
    session.stop_server();
}

/// The documents with a test below; `every_document_is_run` keeps this list whole.
const DOCUMENTS: &[&str] = &[
    "README.md",
    "docs/algorithms.md",
    "docs/configuration.md",
    "docs/envoy-gateway.md",
    "docs/performance.md",
];

#[test]
fn readme() {
    run_document("README.md");
}

#[test]
fn algorithms() {
    run_document("docs/algorithms.md");
}

#[test]
fn configuration() {
    run_document("docs/configuration.md");
}

#[test]
fn performance() {
    run_document("docs/performance.md");
}

#[test]
fn envoy_gateway() {
    run_document("docs/envoy-gateway.md");
}

#[test]
fn every_document_is_run() {
    let mut found = BTreeSet::from(["README.md".to_string()]);
    if let Ok(entries) = std::fs::read_dir(manifest_dir().join("docs")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".md") {
                let doc = format!("docs/{name}");
                // A document without commands needs no session, but may not hide any.
                if steps_of(&manifest_dir().join(&doc)).is_empty() {
                    continue;
                }
                found.insert(doc);
            }
        }
    }
    let listed: BTreeSet<String> = DOCUMENTS.iter().map(|d| d.to_string()).collect();
    assert_eq!(
        found, listed,
        "every document that shows commands needs a test in tests/binary/docs.rs"
    );
}

/// The developers' notes under docs/dev/ tell what was measured and why; a command a user
/// should type belongs on a user's page, where it runs.
#[test]
fn developer_notes_show_no_commands() {
    let Ok(entries) = std::fs::read_dir(manifest_dir().join("docs/dev")) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "md") {
            let steps = steps_of(&path);
            assert!(
                steps.is_empty(),
                "{}: a command in the developers' notes never runs: {:?}",
                path.display(),
                steps.iter().map(|s| &s.place).collect::<Vec<_>>()
            );
        }
    }
}

#[test]
fn output_patterns_follow_the_trycmd_conventions() {
    let lines = |text: &str| text.lines().map(String::from).collect::<Vec<_>>();
    assert!(matches(&lines("a\n...\nd"), &["a", "b", "c", "d"]));
    assert!(matches(&lines("a\n...\nd"), &["a", "d"]));
    assert!(!matches(&lines("a\n...\nd"), &["a", "b"]));
    assert!(matches(
        &lines("\"durationUntilReset\": \"[..]s\""),
        &["\"durationUntilReset\": \"70s\""]
    ));
    assert!(!matches(&lines("x[..]y"), &["x-z"]));
    assert!(matches(&lines("[..]"), &["anything at all"]));
    assert!(!matches(&lines("a"), &["a", "b"]));
    assert!(is_server("cargo run --release -- serve --config examples/"));
    assert!(is_server(
        "RUST_LOG=debug tollgate serve --config examples/"
    ));
    assert!(!is_server("tollgate check --config examples/"));
    assert_eq!(
        exec_form("A=1 B=2 \\\n    tollgate serve"),
        "A=1 B=2 exec tollgate serve"
    );
    assert_eq!(exec_form("tollgate serve"), "exec tollgate serve");
    assert!(is_server("A=1 \\\n    B=2 tollgate serve"));
}
