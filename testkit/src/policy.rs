//! Policy files for a tollgate under test: named YAML texts, written to a temporary directory
//! that the server reads as its config path (and watches for reloads).

use std::path::PathBuf;

use tempfile::TempDir;

/// Policy files by name, in the order they were added.
#[derive(Debug, Default, Clone)]
pub struct Policies {
    files: Vec<(String, String)>,
}

impl Policies {
    /// Adds a file named `file_name` (e.g. `edge.yaml`) with the YAML text `yaml`.
    pub fn add(&mut self, file_name: &str, yaml: &str) {
        self.files.push((file_name.to_owned(), yaml.to_owned()));
    }

    /// Writes every file into `config/` of a new temporary directory and answers the directory
    /// (removed when dropped) and that config path.
    pub fn write(&self) -> (TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("create a temporary directory");
        let config_dir = dir.path().join("config");
        std::fs::create_dir(&config_dir).expect("create the config directory");
        for (name, yaml) in &self.files {
            std::fs::write(config_dir.join(name), yaml).expect("write a policy file");
        }
        (dir, config_dir)
    }
}
