//! Directories shaped like a Kubernetes ConfigMap or Secret volume: every file is a symlink
//! through `..data`, itself a symlink to a `..<generation>` directory holding the real files. An
//! update writes a new generation and swaps `..data` with one atomic rename, exactly as the
//! kubelet does, so readers see the old files or the new ones, never a mix.

use std::path::{Path, PathBuf};

/// A ConfigMap- or Secret-shaped directory.
#[derive(Debug)]
pub struct Mount {
    dir: PathBuf,
    generation: u32,
    names: Vec<String>,
}

impl Mount {
    /// Creates the mount at `dir` (which must not exist yet, or be empty) holding `files`.
    pub fn create(dir: &Path, files: &[(&str, &[u8])]) -> Mount {
        std::fs::create_dir_all(dir).expect("create the mount directory");
        let mut mount = Mount {
            dir: dir.to_path_buf(),
            generation: 0,
            names: Vec::new(),
        };
        mount.update(files);
        mount
    }

    /// The mount directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path a file is read at (`<dir>/<name>`).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Replaces the whole content with `files`, atomically.
    pub fn update(&mut self, files: &[(&str, &[u8])]) {
        self.generation += 1;
        let generation = format!(
            "..2026_01_01_00_00_{:02}.{}",
            self.generation % 60,
            self.generation
        );
        let target = self.dir.join(&generation);
        std::fs::create_dir(&target).expect("create a generation directory");
        for (name, content) in files {
            std::fs::write(target.join(name), content).expect("write a mounted file");
        }
        let staged = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&staged);
        std::os::unix::fs::symlink(&generation, &staged).expect("link the new generation");
        std::fs::rename(&staged, self.dir.join("..data")).expect("swap ..data");
        for (name, _) in files {
            let link = self.dir.join(name);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{name}"), &link)
                    .expect("link a mounted file");
            }
        }
        // Files no longer present: their links go, as the kubelet removes them.
        for old in &self.names {
            if !files.iter().any(|(name, _)| name == old) {
                let _ = std::fs::remove_file(self.dir.join(old));
            }
        }
        // The previous generation goes too.
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("..2026") && name != generation {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        self.names = files.iter().map(|(name, _)| (*name).to_owned()).collect();
    }
}
