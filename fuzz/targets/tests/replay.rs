//! Every input kept under `fuzz/corpus/<target>/` (the seeds, and whatever a fuzzing run found
//! worth keeping, crashes that were fixed included) replayed through its target: a short,
//! deterministic stand-in for fuzzing in CI.

use std::path::PathBuf;

use tollgate_fuzz_targets::TARGETS;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../corpus")
        .join(target);
    let mut inputs: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|err| panic!("{}: {err}", dir.display()))
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.is_file())
        .map(|path| {
            let bytes =
                std::fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}", path.display()));
            (path, bytes)
        })
        .collect();
    inputs.sort();
    inputs
}

fn replay(target: &str) {
    let run = TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, run)| *run)
        .expect("a known target");
    let inputs = corpus(target);
    assert!(!inputs.is_empty(), "no corpus for {target}");
    for (path, bytes) in inputs {
        let outcome = std::panic::catch_unwind(|| run(&bytes));
        assert!(outcome.is_ok(), "{target} fails on {}", path.display());
    }
}

#[test]
fn yaml_config() {
    replay("yaml_config");
}

#[test]
fn descriptor_key() {
    replay("descriptor_key");
}

#[test]
fn admin_json() {
    replay("admin_json");
}

#[test]
fn rls_request() {
    replay("rls_request");
}
