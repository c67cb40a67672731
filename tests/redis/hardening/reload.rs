//! Reloads that would take the policies away or apply half a file: an emptied config directory,
//! a ConfigMap whose `..data` link dangles, every file removed, and a file caught mid-write whose
//! first part is valid YAML on its own. Each keeps the policies in force; the opt-in
//! `--allow-empty-config` applies an empty config.
//!
//! Each case waits well past the reload interval and settle time before it checks that nothing
//! changed; the waits only give a faulty reload the chance to show, and a correct one passes
//! however long they take.

use std::path::Path;
use std::time::{Duration, Instant};

use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::net::{agent, send};
use tollgate_testkit::wait;

const POLICY: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";

/// Long enough for several polls and settles of the servers below.
const GIVE_IT_TIME: Duration = Duration::from_secs(3);

fn server(allow_empty: bool) -> InProcess {
    InProcess::builder()
        .policy("edge.yaml", POLICY)
        .reload_interval(Duration::from_millis(100))
        .reload_settle(Duration::from_millis(300))
        .allow_empty_config(allow_empty)
        .start()
}

fn rlconfig(server: &InProcess) -> String {
    send(&agent(), "GET", &server.url("/rlconfig"), &[], None).body
}

/// Whether user `who` is over the edge limit after three hits: the policy is in force.
fn limited(server: &InProcess, who: &str) -> bool {
    let body = format!(
        r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{who}"}}]}}]}}"#
    );
    (0..3)
        .map(|_| send(&agent(), "POST", &server.url("/json"), &[], Some(&body)).status)
        .any(|status| status == 429)
}

fn settle() {
    std::thread::sleep(GIVE_IT_TIME);
}

fn clear(dir: &Path) {
    for entry in std::fs::read_dir(dir)
        .expect("list the config dir")
        .flatten()
    {
        let path = entry.path();
        if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(path).expect("remove a dir");
        } else {
            std::fs::remove_file(path).expect("remove a file");
        }
    }
}

#[test]
fn an_emptied_directory_keeps_the_last_good_policies() {
    let server = server(false);
    assert!(rlconfig(&server).contains("edge.user"));
    clear(server.config_dir());
    settle();
    assert!(
        rlconfig(&server).contains("edge.user"),
        "{}",
        rlconfig(&server)
    );
    assert!(limited(&server, "alice"), "the policy still limits");
    // A config that has policies again is applied as usual.
    std::fs::write(
        server.config_dir().join("edge.yaml"),
        POLICY.replace("user", "tenant"),
    )
    .expect("write the policy");
    wait::until("the new policy to load", Duration::from_secs(30), || {
        rlconfig(&server).contains("edge.tenant")
    });
}

/// The layout Kubernetes mounts a ConfigMap with: `edge.yaml -> ..data/edge.yaml`, `..data ->
/// ..<timestamp>`. An update that leaves `..data` pointing nowhere leaves every file dangling.
#[test]
fn a_dangling_configmap_link_keeps_the_last_good_policies() {
    let server = InProcess::builder()
        .policy("placeholder.yaml", "domain: placeholder\ndescriptors: []\n")
        .reload_interval(Duration::from_millis(100))
        .reload_settle(Duration::from_millis(300))
        .start();
    let dir = server.config_dir();
    clear(dir);
    std::fs::create_dir(dir.join("..2026_01_01")).expect("a timestamped dir");
    std::fs::write(dir.join("..2026_01_01/edge.yaml"), POLICY).expect("the policy");
    std::os::unix::fs::symlink("..2026_01_01", dir.join("..data")).expect("..data");
    std::os::unix::fs::symlink("..data/edge.yaml", dir.join("edge.yaml")).expect("edge.yaml");
    wait::until(
        "the ConfigMap layout to load",
        Duration::from_secs(30),
        || rlconfig(&server).contains("edge.user"),
    );
    // The swap goes wrong: `..data` now names a directory that is not there.
    std::fs::remove_file(dir.join("..data")).expect("unlink ..data");
    std::os::unix::fs::symlink("..2026_01_02", dir.join("..data")).expect("dangling ..data");
    std::fs::remove_dir_all(dir.join("..2026_01_01")).expect("the old data");
    settle();
    assert!(
        rlconfig(&server).contains("edge.user"),
        "{}",
        rlconfig(&server)
    );
    assert!(limited(&server, "bob"));
}

#[test]
fn an_empty_config_is_applied_when_allowed() {
    let server = server(true);
    assert!(limited(&server, "carol"));
    clear(server.config_dir());
    wait::until("the empty config to load", Duration::from_secs(30), || {
        !rlconfig(&server).contains("edge.user")
    });
    assert!(
        !limited(&server, "dave"),
        "every request is allowed, as asked"
    );
}

/// A file written in two steps, the first of which is a valid policy on its own (one descriptor
/// of two): what is loaded is the whole file, never the first step.
#[test]
fn a_file_caught_mid_write_is_not_loaded_half_written() {
    let server = InProcess::builder()
        .policy("edge.yaml", "domain: old\ndescriptors: []\n")
        .reload_interval(Duration::from_millis(100))
        // Far longer than the writer's pause, so a loaded machine that stretches the pause does
        // not make the first part look settled.
        .reload_settle(Duration::from_secs(5))
        .start();
    let first = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
";
    let second = "  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 50}
";
    let path = server.config_dir().join("edge.yaml");
    let watching = {
        let url = server.url("/rlconfig");
        std::thread::spawn(move || {
            // Everything /rlconfig shows until the whole file is in.
            let mut seen = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let body = send(&agent(), "GET", &url, &[], None).body;
                let done = body.contains("edge.tenant");
                seen.push(body);
                if done {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        })
    };
    let mut file = std::fs::File::create(&path).expect("open the policy");
    std::io::Write::write_all(&mut file, first.as_bytes()).expect("the first part");
    std::io::Write::flush(&mut file).expect("flush");
    // A writer that pauses: long past the reload interval, short of the settle time.
    std::thread::sleep(Duration::from_millis(500));
    std::io::Write::write_all(&mut file, second.as_bytes()).expect("the second part");
    drop(file);
    let seen = watching.join().expect("the watcher");
    assert!(
        seen.last().is_some_and(|body| body.contains("edge.tenant")),
        "the whole file loaded: {:?}",
        seen.last()
    );
    assert!(
        seen.iter()
            .all(|body| !body.contains("edge.user") || body.contains("edge.tenant")),
        "the first part alone was loaded: {seen:?}"
    );
}
