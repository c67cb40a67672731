//! The command line: `tollgate check` prints the policy table, its warnings, or the first error
//! as `file:line:column: message` (exit 1), and `serve` refuses a broken config with the same
//! line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tollgate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("the tollgate binary runs")
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn check_prints_one_line_per_limit_of_the_examples() {
    let out = tollgate(&["check", "--config", &examples().display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    for expected in [
        "edge.user ",
        "edge.path_/login.remote_address ",
        "sliding_window_log",
        "edge.api_key ",
        "edge.partner.partner_burst ",
        "edge.partner.partner_daily ",
        "shards=8",
        "failure_mode=deny",
        "internal.client_batch-* ",
    ] {
        assert!(
            table.contains(expected),
            "{expected:?} missing from:\n{table}"
        );
    }
}

#[test]
fn check_lists_every_limit_of_a_rate_limits_list() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("several.yaml"),
        r#"domain: edge
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: burst}
      - {unit: hour, requests_per_unit: 1000, name: sustained, algorithm: sliding_window_log}
      - {window: 90s, requests_per_unit: 50}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .expect("write the policy");
    let out = tollgate(&["check", "--config", &dir.path().display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    let lines: Vec<Vec<&str>> = table
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines,
        [
            vec!["edge.path", "sliding_window_counter", "5", "minute", "-"],
            vec!["edge.user.3", "sliding_window_counter", "50", "1m30s", "-"],
            vec![
                "edge.user.burst",
                "sliding_window_counter",
                "10",
                "second",
                "name=burst"
            ],
            vec![
                "edge.user.sustained",
                "sliding_window_log",
                "1000",
                "hour",
                "name=sustained"
            ],
        ],
        "{table}"
    );
}

#[test]
fn check_and_serve_report_the_same_error_with_its_position() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("broken.yaml");
    std::fs::write(
        &file,
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limt: {unit: second, requests_per_unit: 1}\n",
    )
    .expect("write the policy");
    let path = dir.path().display().to_string();

    let check = tollgate(&["check", "--config", &path]);
    assert_eq!(check.status.code(), Some(1));
    let message = text(&check.stderr);
    let expected_prefix = format!("{}:4:5: unknown key `rate_limt`", file.display());
    assert!(message.starts_with(&expected_prefix), "{message}");
    assert!(message.contains("did you mean `rate_limit`"), "{message}");

    // serve never binds: it stops at the config with exactly check's line.
    let serve = tollgate(&[
        "serve",
        "--config",
        &path,
        "--grpc-addr",
        "127.0.0.1:0",
        "--http-addr",
        "127.0.0.1:0",
    ]);
    assert!(!serve.status.success());
    assert!(
        text(&serve.stderr).contains(message.trim()),
        "{}",
        text(&serve.stderr)
    );
}

#[test]
fn flags_read_their_environment_variables() {
    let help = text(&tollgate(&["serve", "--help"]).stdout);
    for variable in [
        "TOLLGATE_GRPC_ADDR",
        "TOLLGATE_HTTP_ADDR",
        "TOLLGATE_BACKEND",
        "TOLLGATE_REDIS_URL",
        "TOLLGATE_KEY_PREFIX",
        "TOLLGATE_BACKEND_TIMEOUT",
        "TOLLGATE_FAILURE_MODE",
        "TOLLGATE_SHADOW_MODE",
        "TOLLGATE_RETRY_AFTER_HEADER",
        "TOLLGATE_LOG_FORMAT",
    ] {
        assert!(
            help.contains(variable),
            "{variable} missing from serve --help"
        );
    }
    // An invalid value from the environment is refused like the flag would be.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config", &examples().display().to_string()])
        .env("TOLLGATE_BACKEND", "etcd")
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("etcd"), "{}", text(&out.stderr));
}

#[test]
fn a_key_prefix_with_a_hash_tag_is_refused() {
    let out = tollgate(&[
        "serve",
        "--config",
        &examples().display().to_string(),
        "--key-prefix",
        "team{a}:",
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("must not contain"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn boolean_flags_take_explicit_values() {
    // A broken value is rejected by the parser before anything starts.
    let out = tollgate(&["serve", "--config", "/nonexistent", "--shadow-mode=maybe"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("maybe"), "{}", text(&out.stderr));
    // Accepted spellings get past the parser and stop at the missing config instead.
    for flag in [
        "--shadow-mode",
        "--shadow-mode=true",
        "--retry-after-header=false",
    ] {
        let out = tollgate(&["serve", "--config", "/nonexistent/tollgate", flag]);
        assert!(!out.status.success());
        let stderr = text(&out.stderr);
        assert!(stderr.contains("/nonexistent/tollgate"), "{flag}: {stderr}");
    }
}

#[test]
fn check_warns_when_shards_get_fewer_than_ten_hits() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(
        dir.path().join("thin.yaml"),
        r#"domain: thin
descriptors:
  - key: tenant
    value: thin
    rate_limit: {unit: minute, requests_per_unit: 79, shards: 8}
  - key: tenant
    value: enough
    rate_limit: {unit: minute, requests_per_unit: 80, shards: 8}
  - key: tenant
    value: unsharded
    rate_limit: {unit: minute, requests_per_unit: 5}
"#,
    )
    .expect("write the policy");
    let out = tollgate(&["check", "--config", &dir.path().display().to_string()]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(warnings.len(), 1, "{stderr}");
    assert!(
        warnings[0].ends_with(
            "thin.yaml:5:63: warning: `thin.tenant_thin` splits 79 hits over 8 shards, 9 per \
             shard; with fewer than 10 per shard the limit gets uneven: lower `shards`"
        ),
        "{stderr}"
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("shards=8"), "{stdout}");
}

#[test]
fn check_merges_domains_across_files_when_asked() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("a.yaml"),
        "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("write a policy");
    std::fs::write(
        dir.path().join("b.yaml"),
        "domain: shop\ndescriptors:\n  - key: tokens\n    rate_limit: {unit: hour, requests_per_unit: 1000, counting: all}\n",
    )
    .expect("write a policy");
    let path = dir.path().display().to_string();

    let separate = tollgate(&["check", "--config", &path]);
    assert_eq!(separate.status.code(), Some(1));
    assert!(
        text(&separate.stderr).contains("domain `shop` is already declared"),
        "{}",
        text(&separate.stderr)
    );

    for merged in [
        tollgate(&["check", "--config", &path, "--merge-domains"]),
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check", "--config", &path])
            .env("TOLLGATE_MERGE_DOMAINS", "true")
            .output()
            .expect("the tollgate binary runs"),
    ] {
        assert!(merged.status.success(), "{}", text(&merged.stderr));
        let table = text(&merged.stdout);
        assert!(table.contains("shop.user "), "{table}");
        assert!(
            table.contains("shop.tokens ") && table.contains("counting=all"),
            "{table}"
        );
    }
}

/// The service allocates with jemalloc and reads its options: a background thread that returns
/// freed pages while no traffic arrives runs beside the workers. (Without the `jemalloc` feature
/// the C library's allocator runs, and has no such thread.)
#[test]
fn serve_runs_jemalloc_with_its_background_purge() {
    let tollgate = tollgate_testkit::tollgate::Tollgate::start(
        &tollgate_testkit::tollgate::per_user_per_minute(5),
    );
    let pid = tollgate.pid().expect("tollgate is running");
    let threads = || -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("read the process's threads")
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .collect()
    };
    let purging = || threads().iter().any(|name| name == "jemalloc_bg_thd");
    if cfg!(feature = "jemalloc") {
        // The thread starts with the allocator, but names itself once it first runs, which a
        // loaded machine may delay.
        tollgate_testkit::wait::until(
            "jemalloc's background thread",
            std::time::Duration::from_secs(10),
            purging,
        );
    } else {
        assert!(!purging(), "threads of tollgate: {:?}", threads());
    }
}
