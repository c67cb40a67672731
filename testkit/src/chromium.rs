//! Headless Chromium (Debian's `chromium` package) for the admin page's tests: it loads a
//! loopback URL, runs the page's scripts for a few seconds of virtual time, and answers the DOM
//! as it then stands (`--dump-dom`) or a screenshot of it.
//!
//! Each run gets a profile directory of its own, resolves no host name (only loopback addresses
//! are loaded), and runs in a process group of its own that is killed when the run ends, on
//! success, failure or timeout alike: no Chromium process outlives its run.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::process;

/// How long one Chromium run may take; starting a browser on a loaded machine is slow.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// How much virtual time the page's scripts get before the DOM is read: its fetches and
/// renders finish well within it.
const VIRTUAL_TIME_MS: u32 = 5000;

/// The Chromium binary: `$CHROMIUM_BIN`, else `chromium` on `PATH` (`scripts/test` installs
/// Debian's `chromium` package).
pub fn chromium_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CHROMIUM_BIN").filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("chromium"))
            .find(|path| path.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "chromium is not installed: scripts/test installs it (apt-get install chromium), or \
             set $CHROMIUM_BIN"
        )
    })
}

/// The DOM of `url` (a loopback `http://` URL) after its scripts ran, as HTML.
pub fn dump_dom(url: &str) -> String {
    let output = run(url, &["--dump-dom".to_string()]);
    assert!(
        output.contains("<html"),
        "chromium answered no DOM for {url}:\n{output}"
    );
    output
}

/// A PNG screenshot of `url` after its scripts ran, `width` x `height` pixels, written to
/// `file`.
pub fn screenshot(url: &str, file: &Path, (width, height): (u32, u32)) {
    let _ = std::fs::remove_file(file);
    let output = run(
        url,
        &[
            format!("--screenshot={}", file.display()),
            format!("--window-size={width},{height}"),
            "--hide-scrollbars".to_string(),
        ],
    );
    assert!(
        file.is_file(),
        "chromium wrote no screenshot of {url} to {}:\n{output}",
        file.display()
    );
}

/// Runs headless Chromium on `url` with `extra` flags and answers its stdout (its stderr on
/// failure, for the message).
fn run(url: &str, extra: &[String]) -> String {
    assert!(
        url.starts_with("http://127.0.0.1:"),
        "chromium only loads loopback URLs here, not {url}"
    );
    let profile = tempfile::tempdir().expect("create a Chromium profile directory");
    let mut command = Command::new(chromium_bin());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-sync",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-dev-shm-usage",
            "--mute-audio",
            // No name is resolved (a bare `MAP *` would catch the loopback address too): nothing
            // but 127.0.0.1 is reachable.
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
        ])
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_MS}"))
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .env("HOME", profile.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // A group of its own, so the renderer and helper processes it forks die with it.
        .process_group(0);
    let mut child = process::spawn(command).expect("start chromium");
    let group = child.id() as libc::pid_t;
    let mut stdout = child.stdout.take().expect("chromium's stdout");
    let mut stderr = child.stderr.take().expect("chromium's stderr");
    let out = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    let err = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => break None,
        }
    };
    // SAFETY: signals only the process group this run created (its leader is our child).
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(status) if status.success() => stdout,
        Some(status) => panic!("chromium exited with {status} on {url}:\n{stderr}"),
        None => panic!("chromium did not finish {url} within {RUN_TIMEOUT:?}:\n{stderr}"),
    }
}
