//! Policy files: the envoyproxy/ratelimit YAML format (plus tollgate's `rate_limit` extensions),
//! loaded into an immutable snapshot that answers "which limit applies to this descriptor?".
//!
//! CONTRACT (used by the limiter, the server and `tollgate check`; keep these public items and
//! signatures): `Config::load`, `Config::from_yaml`, `Config::domain`, `Config::limits`,
//! `Config::table`, `Config::warnings`, `Domain::resolve`, `Limit`, `Matched`, `MetaValue`,
//! `FailureMode`, `ConfigError`.

mod matcher;
mod parse;
mod yaml;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::descriptor::{Entry, Unit};
use crate::window::Algorithm;

/// What a limit answers when the backend cannot decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum FailureMode {
    /// Let the request through.
    #[default]
    Allow,
    /// Reject the request.
    Deny,
}

impl FailureMode {
    /// Parses `allow` / `deny`.
    pub fn parse(text: &str) -> Option<FailureMode> {
        match text {
            "allow" => Some(FailureMode::Allow),
            "deny" => Some(FailureMode::Deny),
            _ => None,
        }
    }

    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Allow => "allow",
            FailureMode::Deny => "deny",
        }
    }
}

/// One resolved `rate_limit`, with the flags of the descriptor node that declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The reference's key: domain and the path of `key_value` / `key` nodes joined with `.`,
    /// e.g. `edge.user_alice.path`. Used in tables, logs and metrics.
    pub full_key: String,
    /// `rate_limit.name`, if any (target of other limits' `replaces`).
    pub name: Option<String>,
    /// Hits admitted per window (0 for `unlimited`).
    pub requests_per_unit: u32,
    /// The unit reported to Envoy: the declared `unit`, or the unit equal to `window`, or `None`
    /// (UNKNOWN) when the window is not a whole unit. `None` also for `unlimited`.
    pub unit: Option<Unit>,
    /// The window length in milliseconds (0 for `unlimited`).
    pub window_ms: u64,
    /// `rate_limit.algorithm`.
    pub algorithm: Algorithm,
    /// `rate_limit.shards` (1 when absent).
    pub shards: u16,
    /// `rate_limit.failure_mode`; `None` means "the --failure-mode flag".
    pub failure_mode: Option<FailureMode>,
    /// `rate_limit.unlimited`.
    pub unlimited: bool,
    /// The node's `shadow_mode`.
    pub shadow_mode: bool,
    /// The node's `quota_mode`.
    pub quota_mode: bool,
    /// The node's `detailed_metric`.
    pub detailed_metric: bool,
    /// The node's `value_to_metric`.
    pub value_to_metric: bool,
    /// Names from `rate_limit.replaces`.
    pub replaces: Vec<String>,
}

/// A JSON-like value from a descriptor node's `metadata`, returned to Envoy as dynamic metadata.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    /// `~` / `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// Any number.
    Number(f64),
    /// A string.
    String(String),
    /// A sequence.
    List(Vec<MetaValue>),
    /// A mapping, in file order.
    Map(Vec<(String, MetaValue)>),
}

/// The result of matching one request descriptor against a domain.
#[derive(Debug, Clone, PartialEq)]
pub struct Matched<'a> {
    /// The limit that applies.
    pub limit: &'a Arc<Limit>,
    /// Levels (entry indexes) matched by a `share_threshold` wildcard, with that wildcard's pattern:
    /// the counter is keyed by the pattern there instead of the request's value.
    pub shared: Vec<(usize, &'a str)>,
    /// The matched node's `metadata`, if any.
    pub metadata: Option<&'a MetaValue>,
}

/// A config that failed to load, pointing at the offending spot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct ConfigError {
    /// The file (as given or found in the directory).
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong and, where it helps, what to write instead.
    pub message: String,
}

impl ConfigError {
    /// An error about a whole file (it cannot be read, ...), reported at its first line.
    fn file(file: &Path, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
            message: message.into(),
        }
    }
}

/// An immutable snapshot of every loaded policy file: the domains and their limits.
///
/// Built once per (re)load and shared behind an `Arc`; matching never locks or allocates for
/// exact and key-only matches.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Domain>,
    /// Every limit of every domain, sorted by `full_key`.
    limits: Vec<Arc<Limit>>,
    warnings: Vec<String>,
}

/// One domain's descriptor tree.
#[derive(Debug)]
pub struct Domain {
    name: String,
    file: PathBuf,
    tree: matcher::Level,
    /// This domain's limits, sorted by `full_key`.
    limits: Vec<Arc<Limit>>,
}

impl Config {
    /// A config without any domain: every request is allowed.
    pub fn empty() -> Config {
        Config::default()
    }

    /// Loads a policy file, or every `*.yaml` / `*.yml` file of a directory in file-name order.
    ///
    /// In a directory, names starting with `.` are skipped and symlinks are followed, which is
    /// what a Kubernetes ConfigMap mount needs (its files are symlinks into a `..data` dir).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let metadata = fs::metadata(path)
            .map_err(|e| ConfigError::file(path, format!("cannot read the config: {e}")))?;
        let mut builder = Builder::default();
        if metadata.is_dir() {
            let files = policy_files(path)?;
            if files.is_empty() {
                builder.warnings.push(format!(
                    "{}:1:1: warning: no policy files (*.yaml, *.yml) here; every request will \
                     be allowed",
                    path.display()
                ));
            }
            for file in files {
                let Some(text) = read_policy_file(&file)? else {
                    continue;
                };
                builder.add(&file, &text)?;
            }
        } else {
            let text = read_policy_file(path)?
                .ok_or_else(|| ConfigError::file(path, "cannot read the config: not found"))?;
            builder.add(path, &text)?;
        }
        Ok(builder.finish())
    }

    /// Loads one file's text; `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<Config, ConfigError> {
        let mut builder = Builder::default();
        builder.add(Path::new(file), text)?;
        Ok(builder.finish())
    }

    /// The domain called `name`, if any file declares it.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, sorted by name.
    pub fn domains(&self) -> Vec<&Domain> {
        let mut domains: Vec<&Domain> = self.domains.values().collect();
        domains.sort_by(|a, b| a.name.cmp(&b.name));
        domains
    }

    /// How many domains are loaded.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether no domain is loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every limit of every domain, sorted by `full_key`.
    pub fn limits(&self) -> Vec<&Arc<Limit>> {
        self.limits.iter().collect()
    }

    /// Non-fatal findings, each `file:line:column: warning: ...`.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The policy table printed by `tollgate check` and served at `/rlconfig`: one line per
    /// limit with its full key, algorithm, limit, window and flags, in aligned columns.
    pub fn table(&self) -> String {
        let rows: Vec<[String; 5]> = self.limits.iter().map(|limit| table_row(limit)).collect();
        let mut widths = [0; 4];
        for row in &rows {
            for (width, cell) in widths.iter_mut().zip(row.iter()) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for row in &rows {
            let [key, algorithm, limit, window, flags] = row;
            let _ = writeln!(
                out,
                "{key:<w0$}  {algorithm:<w1$}  {limit:>w2$}  {window:<w3$}  {flags}",
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2],
                w3 = widths[3],
            );
        }
        out
    }
}

impl Domain {
    /// The domain's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The file that declares the domain.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// This domain's limits, sorted by `full_key`.
    pub fn limits(&self) -> &[Arc<Limit>] {
        &self.limits
    }

    /// The limit that applies to a request descriptor, as envoyproxy/ratelimit decides it: per
    /// level an exact `key`/`value` node wins over a wildcard value (first in config order),
    /// which wins over a key-only node; the descriptor must end exactly at a node that has a
    /// limit; there is no backtracking. `None` when nothing matches or the node is an allow-list
    /// entry (no `rate_limit`).
    pub fn resolve<'a>(&'a self, entries: &[Entry]) -> Option<Matched<'a>> {
        matcher::resolve(&self.tree, entries)
    }
}

/// Accumulates files into a config, refusing a domain declared twice.
#[derive(Default)]
struct Builder {
    domains: HashMap<String, (Domain, usize, usize)>,
    warnings: Vec<String>,
}

impl Builder {
    fn add(&mut self, file: &Path, text: &str) -> Result<(), ConfigError> {
        let loaded = parse::parse_file(file, text)?;
        if let Some((first, line, column)) = self.domains.get(&loaded.domain) {
            return Err(ConfigError {
                file: file.to_path_buf(),
                line: loaded.domain_pos.line,
                column: loaded.domain_pos.column,
                message: format!(
                    "domain `{}` is already declared in {}:{line}:{column}; keep each domain in \
                     one file",
                    loaded.domain,
                    first.file.display(),
                ),
            });
        }
        self.warnings.extend(loaded.warnings);
        let mut limits = loaded.limits;
        limits.sort_by(|a, b| a.full_key.cmp(&b.full_key));
        let domain = Domain {
            name: loaded.domain.clone(),
            file: file.to_path_buf(),
            tree: loaded.tree,
            limits,
        };
        self.domains.insert(
            loaded.domain,
            (domain, loaded.domain_pos.line, loaded.domain_pos.column),
        );
        Ok(())
    }

    fn finish(self) -> Config {
        let domains: HashMap<String, Domain> = self
            .domains
            .into_iter()
            .map(|(name, (domain, _, _))| (name, domain))
            .collect();
        let mut limits: Vec<Arc<Limit>> = domains
            .values()
            .flat_map(|d| d.limits.iter().cloned())
            .collect();
        limits.sort_by(|a, b| a.full_key.cmp(&b.full_key));
        Config {
            domains,
            limits,
            warnings: self.warnings,
        }
    }
}

/// The `*.yaml` / `*.yml` files of a directory (not its subdirectories), sorted by name.
fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries = fs::read_dir(dir)
        .map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with('.') || !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks; a directory named `x.yaml` is not a policy file.
        match fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => files.push(path),
            Ok(_) => {}
            // A ConfigMap update can leave a dangling link for a moment; it is no file of ours.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ConfigError::file(&path, format!("cannot read: {e}"))),
        }
    }
    files.sort();
    Ok(files)
}

/// A file's text; `None` if it vanished since it was listed.
fn read_policy_file(path: &Path) -> Result<Option<String>, ConfigError> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|e| {
            let prefix = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let text = String::from_utf8_lossy(prefix);
            let line = text.matches('\n').count() + 1;
            let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            ConfigError {
                file: path.to_path_buf(),
                line,
                column,
                message: "the file is not UTF-8 text".to_string(),
            }
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::file(path, format!("cannot read: {e}"))),
    }
}

/// The cells of one `table` line.
fn table_row(limit: &Limit) -> [String; 5] {
    let mut flags = Vec::new();
    if limit.unlimited {
        flags.push("unlimited".to_string());
    }
    if limit.shadow_mode {
        flags.push("shadow".to_string());
    }
    if limit.quota_mode {
        flags.push("quota".to_string());
    }
    if limit.shards > 1 {
        flags.push(format!("shards={}", limit.shards));
    }
    if let Some(mode) = limit.failure_mode {
        flags.push(format!("failure_mode={}", mode.as_str()));
    }
    if let Some(name) = &limit.name {
        flags.push(format!("name={name}"));
    }
    if !limit.replaces.is_empty() {
        flags.push(format!("replaces={}", limit.replaces.join(",")));
    }
    if limit.detailed_metric {
        flags.push("detailed_metric".to_string());
    }
    if limit.value_to_metric {
        flags.push("value_to_metric".to_string());
    }
    let flags = if flags.is_empty() {
        "-".to_string()
    } else {
        flags.join(" ")
    };
    if limit.unlimited {
        return [
            limit.full_key.clone(),
            "-".to_string(),
            "-".to_string(),
            "-".to_string(),
            flags,
        ];
    }
    let window = match limit.unit {
        Some(unit) => unit.as_str().to_string(),
        None => compact_duration(limit.window_ms / 1000),
    };
    [
        limit.full_key.clone(),
        limit.algorithm.as_str().to_string(),
        limit.requests_per_unit.to_string(),
        window,
        flags,
    ]
}

/// `90` → `1m30s`, `86400` → `1d`: a duration without spaces, so table columns split on them.
fn compact_duration(seconds: u64) -> String {
    if seconds == 0 {
        return "0s".to_string();
    }
    let mut rest = seconds;
    let mut out = String::new();
    for (size, suffix) in [(86_400, 'd'), (3600, 'h'), (60, 'm'), (1, 's')] {
        if rest >= size {
            let _ = write!(out, "{}{suffix}", rest / size);
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests;
