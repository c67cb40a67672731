//! Which files a file source reads, and when they changed.
//!
//! Two ways to name them:
//!
//! - a path (`tollgate serve --config PATH`): one YAML file, or the top-level `*.yaml` / `*.yml`
//!   files of a directory, dot files skipped;
//! - envoyproxy/ratelimit's runtime layout (`RUNTIME_ROOT`, `RUNTIME_SUBDIRECTORY`,
//!   `RUNTIME_APPDIRECTORY`, `RUNTIME_WATCH_ROOT`, `RUNTIME_IGNOREDOTFILES`), read as the
//!   reference reads it: every regular file under the config directory, recursively, whatever
//!   its name, so that a deployment written for the reference loads the same files here.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use super::{Config, ConfigError, LoadOptions, file};

/// Where a file source's policies live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileSource {
    /// A YAML file, or the top-level `*.yaml` / `*.yml` files of a directory.
    Path(PathBuf),
    /// envoyproxy/ratelimit's runtime directory layout.
    Runtime(RuntimeLayout),
}

/// envoyproxy/ratelimit's runtime directory layout.
///
/// With `watch_root` (the reference's default, made for a `current` symlink that a deploy
/// swaps), the files are those under `root/subdirectory` whose path there, with `/` read as `.`,
/// starts with `appdirectory.`: in effect the tree `root/subdirectory/appdirectory/`, and any
/// file directly in `root/subdirectory` named `appdirectory.*`. An empty `subdirectory` means no
/// files at all. Without it (the layout Kubernetes deployments use), the files are every file of
/// the tree `root/subdirectory/appdirectory/`, which must exist; an empty `appdirectory` means no
/// files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeLayout {
    /// `RUNTIME_ROOT`.
    pub root: PathBuf,
    /// `RUNTIME_SUBDIRECTORY`.
    pub subdirectory: String,
    /// `RUNTIME_APPDIRECTORY`.
    pub appdirectory: String,
    /// `RUNTIME_WATCH_ROOT`.
    pub watch_root: bool,
    /// `RUNTIME_IGNOREDOTFILES`: skip files and whole directories whose name starts with `.`,
    /// which a Kubernetes ConfigMap mount needs (its `..<timestamp>/` copy of every file would
    /// otherwise load each domain twice).
    pub ignore_dot_files: bool,
}

impl RuntimeLayout {
    /// The directory walked.
    pub fn directory(&self) -> PathBuf {
        let base = self.root.join(&self.subdirectory);
        if self.watch_root {
            base
        } else {
            base.join(&self.appdirectory)
        }
    }

    /// Why no file can be read at all, if so (as the reference's nil loader).
    fn reads_nothing(&self) -> Option<&'static str> {
        if self.watch_root && self.subdirectory.is_empty() {
            Some("RUNTIME_SUBDIRECTORY is empty, so no policy file is read")
        } else if !self.watch_root && self.appdirectory.is_empty() {
            Some("RUNTIME_APPDIRECTORY is empty, so no policy file is read")
        } else {
            None
        }
    }

    /// Every file of the layout, sorted.
    fn files(&self) -> Result<Vec<PathBuf>, ConfigError> {
        if self.reads_nothing().is_some() {
            return Ok(Vec::new());
        }
        let directory = self.directory();
        if !directory.is_dir() {
            if self.watch_root {
                // The symlink a deploy swaps may not be there yet; it is polled for.
                return Ok(Vec::new());
            }
            return Err(ConfigError::file(
                &directory,
                "the policy directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY) \
                 does not exist",
            ));
        }
        let mut files = Vec::new();
        walk(&directory, self.ignore_dot_files, &mut files)?;
        if self.watch_root {
            let prefix = format!("{}.", self.appdirectory);
            files.retain(|file| {
                file.strip_prefix(&directory)
                    .is_ok_and(|relative| dotted(relative).starts_with(&prefix))
            });
        }
        files.sort();
        Ok(files)
    }
}

/// A relative path with its separators read as `.`, as the reference keys its files.
fn dotted(relative: &Path) -> String {
    relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy())
        .collect::<Vec<_>>()
        .join(".")
}

/// Collects the regular files under `dir`, recursively. Symlinks to files count (a ConfigMap's
/// files are symlinks); symlinks to directories are not followed, as the reference does not.
fn walk(dir: &Path, ignore_dot_files: bool, files: &mut Vec<PathBuf>) -> Result<(), ConfigError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
    for entry in entries {
        let entry =
            entry.map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
        if ignore_dot_files && entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            walk(&path, ignore_dot_files, files)?;
        } else if kind.is_file() || (kind.is_symlink() && path.is_file()) {
            files.push(path);
        }
    }
    Ok(())
}

impl FileSource {
    /// Loads the policies with the default options. A runtime layout that names no files gives an
    /// empty config.
    pub fn load(&self) -> Result<Config, ConfigError> {
        self.load_with(LoadOptions::default())
    }

    /// Loads the policies, gathered as `options` say.
    pub fn load_with(&self, options: LoadOptions) -> Result<Config, ConfigError> {
        match self {
            FileSource::Path(path) => Config::load_with(path, options),
            FileSource::Runtime(layout) => file::load_files(&layout.files()?, options),
        }
    }

    /// A digest of every file the source would read, names and contents, so a reload is needed
    /// exactly when it changes (a ConfigMap symlink swap included).
    pub fn fingerprint(&self) -> u64 {
        let mut hasher = DefaultHasher::new();
        let files = match self {
            FileSource::Path(path) => match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut files: Vec<PathBuf> = entries
                        .flatten()
                        .map(|entry| entry.path())
                        .filter(|file| is_policy_file(file))
                        .collect();
                    files.sort();
                    files
                }
                Err(_) => vec![path.clone()],
            },
            FileSource::Runtime(layout) => layout.files().unwrap_or_default(),
        };
        for file in files {
            file.hash(&mut hasher);
            std::fs::read(&file).ok().hash(&mut hasher);
        }
        hasher.finish()
    }

    /// What the source reads, for logs.
    pub fn describe(&self) -> String {
        match self {
            FileSource::Path(path) => path.display().to_string(),
            FileSource::Runtime(layout) => match layout.reads_nothing() {
                Some(why) => format!("no files ({why})"),
                None => format!("{} (recursively)", layout.directory().display()),
            },
        }
    }

    /// Why the source yields no policies, as far as its files tell: links that lead nowhere (a
    /// ConfigMap's `..data` swapped away), no policy file at all, or files that declare no
    /// domain. For the log line of a reload that found nothing.
    pub fn why_empty(&self) -> String {
        let directory = match self {
            FileSource::Path(path) if path.is_file() => {
                return "the policy file declares no domain".to_owned();
            }
            FileSource::Path(path) => path.clone(),
            FileSource::Runtime(layout) => {
                if let Some(why) = layout.reads_nothing() {
                    return why.to_owned();
                }
                layout.directory()
            }
        };
        let Ok(entries) = std::fs::read_dir(&directory) else {
            return format!("{} cannot be listed", directory.display());
        };
        let mut dangling: Vec<String> = entries
            .flatten()
            .filter(|entry| {
                entry.file_type().is_ok_and(|kind| kind.is_symlink())
                    && std::fs::metadata(entry.path()).is_err()
            })
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        dangling.sort();
        let files = match self {
            FileSource::Path(path) => std::fs::read_dir(path).map_or(0, |entries| {
                entries
                    .flatten()
                    .filter(|entry| is_policy_file(&entry.path()))
                    .count()
            }),
            FileSource::Runtime(layout) => layout.files().map_or(0, |files| files.len()),
        };
        match (dangling.is_empty(), files) {
            (false, _) => format!("dangling symlinks: {}", dangling.join(", ")),
            (true, 0) => match self {
                FileSource::Path(_) => "no *.yaml or *.yml files".to_owned(),
                FileSource::Runtime(_) => "no files".to_owned(),
            },
            (true, _) => "the policy files declare no domain".to_owned(),
        }
    }

    /// A note for the start-up log when the source can read nothing, as configured.
    pub fn reads_nothing(&self) -> Option<&'static str> {
        match self {
            FileSource::Path(_) => None,
            FileSource::Runtime(layout) => layout.reads_nothing(),
        }
    }
}

/// Whether a directory entry is one `Config::load` reads: a visible `*.yaml` / `*.yml` file.
fn is_policy_file(path: &Path) -> bool {
    let visible = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| !n.starts_with('.'));
    let yaml = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e == "yaml" || e == "yml");
    visible && yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

    fn layout(root: &Path, watch_root: bool, ignore_dot_files: bool) -> RuntimeLayout {
        RuntimeLayout {
            root: root.to_path_buf(),
            subdirectory: "ratelimit".into(),
            appdirectory: "config".into(),
            watch_root,
            ignore_dot_files,
        }
    }

    /// A ConfigMap mount: a `..<timestamp>/` copy of every file, `..data` pointing at it, and
    /// each file a symlink through `..data`.
    fn config_map(dir: &Path, files: &[(&str, &str)]) {
        let stamp = dir.join("..2026_01_01_00_00_00.1");
        std::fs::create_dir_all(&stamp).unwrap();
        for (name, text) in files {
            std::fs::write(stamp.join(name), text).unwrap();
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        std::os::unix::fs::symlink("..2026_01_01_00_00_00.1", dir.join("..data")).unwrap();
    }

    #[test]
    fn without_watch_root_every_file_of_the_app_directory_loads_recursively() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ratelimit/config");
        std::fs::create_dir_all(dir.join("nested")).unwrap();
        std::fs::write(dir.join("a.conf"), POLICY).unwrap();
        std::fs::write(
            dir.join("nested/b"),
            POLICY.replace("domain: d", "domain: e"),
        )
        .unwrap();
        let source = FileSource::Runtime(layout(root.path(), false, true));
        let config = source.load().unwrap();
        assert_eq!(config.len(), 2);
    }

    #[test]
    fn a_config_map_loads_once_with_dot_files_ignored_and_twice_without() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ratelimit/config");
        std::fs::create_dir_all(&dir).unwrap();
        config_map(&dir, &[("edge.yaml", POLICY)]);
        let ignoring = FileSource::Runtime(layout(root.path(), false, true));
        assert_eq!(ignoring.load().unwrap().len(), 1);
        let reading_all = FileSource::Runtime(layout(root.path(), false, false));
        let err = reading_all.load().unwrap_err().to_string();
        assert!(err.contains("already declared"), "{err}");
    }

    #[test]
    fn with_watch_root_only_the_app_directory_and_its_dotted_siblings_load() {
        let root = tempfile::tempdir().unwrap();
        let base = root.path().join("ratelimit");
        std::fs::create_dir_all(base.join("config")).unwrap();
        std::fs::create_dir_all(base.join("other")).unwrap();
        std::fs::write(base.join("config/a.yaml"), POLICY).unwrap();
        std::fs::write(
            base.join("config.extra"),
            POLICY.replace("domain: d", "domain: e"),
        )
        .unwrap();
        std::fs::write(base.join("other/x.yaml"), "not: a policy").unwrap();
        let source = FileSource::Runtime(layout(root.path(), true, false));
        let config = source.load().unwrap();
        assert_eq!(config.len(), 2);
        assert!(config.domain("d").is_some() && config.domain("e").is_some());
    }

    #[test]
    fn empty_names_read_nothing_and_a_missing_directory_is_an_error_only_without_watch_root() {
        let root = tempfile::tempdir().unwrap();
        let mut no_sub = layout(root.path(), true, false);
        no_sub.subdirectory.clear();
        let source = FileSource::Runtime(no_sub);
        assert!(source.reads_nothing().is_some());
        assert!(source.load().unwrap().is_empty());
        assert!(
            FileSource::Runtime(layout(root.path(), true, false))
                .load()
                .unwrap()
                .is_empty()
        );
        let err = FileSource::Runtime(layout(root.path(), false, false))
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not exist"), "{err}");
    }

    #[test]
    fn an_empty_source_says_why() {
        let root = tempfile::tempdir().unwrap();
        let source = FileSource::Path(root.path().to_path_buf());
        assert_eq!(source.why_empty(), "no *.yaml or *.yml files");
        std::fs::write(root.path().join("a.yaml"), "domain: d\n").unwrap();
        assert_eq!(source.why_empty(), "the policy files declare no domain");
        std::fs::remove_file(root.path().join("a.yaml")).unwrap();
        // A ConfigMap whose `..data` now names a directory that is not there.
        std::os::unix::fs::symlink("..gone", root.path().join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/a.yaml", root.path().join("a.yaml")).unwrap();
        assert_eq!(source.why_empty(), "dangling symlinks: ..data, a.yaml");
        let mut layout = layout(root.path(), true, false);
        layout.subdirectory.clear();
        assert!(
            FileSource::Runtime(layout)
                .why_empty()
                .contains("RUNTIME_SUBDIRECTORY")
        );
    }

    #[test]
    fn the_fingerprint_follows_content_changes() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ratelimit/config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a"), POLICY).unwrap();
        let source = FileSource::Runtime(layout(root.path(), false, true));
        let before = source.fingerprint();
        std::fs::write(dir.join("a"), POLICY.replace("1}", "2}")).unwrap();
        assert_ne!(before, source.fingerprint());
    }
}
