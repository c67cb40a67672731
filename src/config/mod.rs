//! Policies: the envoyproxy/ratelimit YAML format (plus tollgate's `rate_limit` extensions and
//! `rate_limits`, several limits on one descriptor), loaded into an immutable [`Config`] snapshot
//! that answers "which limits apply to this descriptor?" ([`Domain::resolve`]).
//!
//! Every source yields the same snapshot through one set of rules:
//!
//! ```text
//! source              schema tree          rules               snapshot
//! file.rs: YAML  ──►  schema::Policy  ──►  rules::Snapshot ──► Config { Domain, Limit }
//! xds/:  RateLimitConfig ──►  schema::Policy  ──►  (the same rules) ──► Config
//! ```
//!
//! - `schema`: what a policy can say, as a source-neutral tree of descriptor
//!   nodes, and which keys a file allows where;
//! - `file`: the file source (listing, reading, YAML into the schema tree); `yaml`: the
//!   positioned YAML parser it uses;
//! - `xds`: the xDS source (an ADS client receiving `RateLimitConfig` resources, converted into
//!   the same schema tree);
//! - `rules`: the validation that turns a schema tree into a [`Domain`] and [`Limit`]s, and
//!   domains into a snapshot;
//! - `diagnostics`: locations, [`ConfigError`], warnings and `did you mean` hints;
//! - `domain`: the descriptor tree of one domain and the lookup the limiter runs on it.
//!
//! Public items the limiter, the server and `tollgate check` rely on: `Config::load`,
//! `Config::from_yaml`, `Config::domain`, `Config::limits`, `Config::table`, `Config::warnings`,
//! `Domain::resolve`, `Limit`, `Matched`, `MetaValue`, `FailureMode`, `ConfigError`.

pub(crate) mod diagnostics;
mod discovery;
mod domain;
mod file;
mod rules;
mod schema;
pub mod xds;
pub(crate) mod yaml;

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use smallvec::SmallVec;

use crate::descriptor::Unit;
use crate::window::{Algorithm, Counting};

pub use diagnostics::ConfigError;

/// The config's lookup tables (domains, descriptor keys and values). Their keys come from the
/// policies and requests only look them up, so no request can fill a table with colliding keys:
/// a fast, seeded hash is safe here, where SipHash would cost more than the rest of a lookup.
pub(crate) type LookupMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
pub use discovery::{FileSource, RuntimeLayout};
pub use domain::Domain;

/// How a source gathers its policies into one snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Several policies (files, xDS resources) may declare the same domain; their top-level
    /// descriptors are merged into one domain, as envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`
    /// does. A top-level descriptor declared by two of them is an error. Off (the default): a
    /// domain declared twice is an error.
    pub merge_domains: bool,
}

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

/// One resolved `rate_limit` (or one entry of a `rate_limits` list), with the flags of the
/// descriptor node that declares it.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The reference's key: domain and the path of `key_value` / `key` nodes joined with `.`,
    /// e.g. `edge.user_alice.path`, the same for every limit of one descriptor. Used in logs and
    /// metrics; tables list [`Limit::series_key`].
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
    /// `rate_limit.lease`: instances answer this limit from slices of its quota reserved in the
    /// store (Redis), instead of calling the store for every hit.
    pub lease: bool,
    /// `rate_limit.counting`: which hits this limit records; `None` means "the `--counting`
    /// flag" (under `tollgate serve` admitted hits only, under the `ratelimit` entry point every
    /// hit).
    pub counting: Option<Counting>,
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
    /// Declared in a `rate_limits` list: decided together with the other limits of its
    /// descriptor (all charged or none), and its store keys share the descriptor's hash tag.
    /// false for `rate_limit` and descriptor overrides ([`Limit::plain`]).
    pub joint: bool,
    /// The key the statistics count this limit under (before request-built keys): `full_key`
    /// for a descriptor's only limit; for one of a `rate_limits` list, `full_key` then `.` and
    /// its name, or its 1-based position in the list when it has no name (`edge.user.burst`,
    /// `edge.user.2`).
    pub series_key: String,
    /// What the statistics keep for this limit, made at its first decision.
    pub attached: Attached,
}

impl Limit {
    /// `requests_per_unit` hits a `unit` under `full_key`, with no name and every option at its
    /// default: what a descriptor's own `limit` override makes.
    pub fn plain(full_key: String, requests_per_unit: u32, unit: Unit) -> Limit {
        Limit {
            series_key: full_key.clone(),
            joint: false,
            full_key,
            name: None,
            requests_per_unit,
            unit: Some(unit),
            window_ms: unit.millis(),
            algorithm: Algorithm::default(),
            shards: 1,
            lease: false,
            counting: None,
            failure_mode: None,
            unlimited: false,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            replaces: Vec::new(),
            attached: Attached::default(),
        }
    }

    /// The order limits are listed in ([`Config::limits`], [`Config::table`]): by `series_key`,
    /// then window.
    pub(crate) fn listing_order(a: &Arc<Limit>, b: &Arc<Limit>) -> std::cmp::Ordering {
        a.series_key
            .cmp(&b.series_key)
            .then(a.window_ms.cmp(&b.window_ms))
    }
}

/// What other layers keep for one limit (the statistics keep the series the limit counts into,
/// the admin page its recent history), made at the limit's first use and dropped with it, so
/// that a decision finds it without a lookup by key. The config neither reads nor compares it: a
/// copy of a limit starts with nothing attached, and two limits equal in every field are equal
/// whatever is attached.
#[derive(Default)]
pub struct Attached([OnceLock<Box<dyn Any + Send + Sync>>; ATTACHED_SLOTS]);

/// How many different things may be attached to one limit (one of each type).
const ATTACHED_SLOTS: usize = 2;

impl Attached {
    /// What is attached of type `T`; when nothing of that type is attached yet and a slot is
    /// free, `make`'s value first. `None` when every slot holds another type.
    pub fn get_or_attach<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<&T> {
        let mut make = Some(make);
        for slot in &self.0 {
            let held = slot.get_or_init(|| match make.take() {
                Some(make) => Box::new(make()),
                // Only reached if an earlier slot was filled by another type meanwhile.
                None => Box::new(()),
            });
            if let Some(found) = held.downcast_ref::<T>() {
                return Some(found);
            }
        }
        None
    }
}

impl Clone for Attached {
    fn clone(&self) -> Self {
        Attached::default()
    }
}

impl PartialEq for Attached {
    fn eq(&self, _: &Attached) -> bool {
        true
    }
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.iter().any(|slot| slot.get().is_some()) {
            "Attached(..)"
        } else {
            "Attached(-)"
        })
    }
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
    /// The limits that apply, in declaration order (one for `rate_limit`).
    pub limits: &'a [Arc<Limit>],
    /// Levels (entry indexes) matched by a `share_threshold` wildcard, with that wildcard's pattern:
    /// the counter is keyed by the pattern there instead of the request's value.
    pub shared: SmallVec<[(usize, &'a str); 2]>,
    /// The matched node's `metadata`, if any.
    pub metadata: Option<&'a MetaValue>,
    /// One counter identity per limit, same order: what
    /// [`limiter_key`](crate::counter_key::limiter_key) builds for it. An unlimited limit, which is
    /// never charged, has an empty identity.
    pub counter_keys: SmallVec<[String; 1]>,
    /// The key envoyproxy/ratelimit counts this match's statistics under, when it is built from
    /// the request (`detailed_metric`, `value_to_metric`), for the descriptor as a whole; `None`
    /// means the limits' key.
    pub metric_key: Option<String>,
}

/// An immutable snapshot of every loaded policy file: the domains and their limits.
///
/// Built once per (re)load and shared behind an `Arc`; matching never locks or allocates for
/// exact and key-only matches.
#[derive(Debug, Default)]
pub struct Config {
    domains: LookupMap<String, Domain>,
    /// Every limit of every domain (each of a `rate_limits` list too), sorted by `series_key`,
    /// then window.
    limits: Vec<Arc<Limit>>,
    warnings: Vec<String>,
    /// Entries of a config directory that were not read (not `*.yaml` / `*.yml`).
    skipped: Vec<std::path::PathBuf>,
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
        file::load(path, LoadOptions::default())
    }

    /// Loads like [`Config::load`], gathering the files as `options` say.
    pub fn load_with(path: &Path, options: LoadOptions) -> Result<Config, ConfigError> {
        file::load(path, options)
    }

    /// Loads one file's text; `file` names it in errors.
    pub fn from_yaml(file: &str, text: &str) -> Result<Config, ConfigError> {
        file::from_text(Path::new(file), text)
    }

    /// The domain called `name`, if any file declares it.
    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, sorted by name.
    pub fn domains(&self) -> Vec<&Domain> {
        let mut domains: Vec<&Domain> = self.domains.values().collect();
        domains.sort_by(|a, b| a.name().cmp(b.name()));
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

    /// Every limit of every domain (each of a `rate_limits` list too), sorted by `series_key`,
    /// then window.
    pub fn limits(&self) -> Vec<&Arc<Limit>> {
        self.limits.iter().collect()
    }

    /// The series keys ([`Limit::series_key`]) of the limits `self` has and `next` does not, in
    /// order, each once: what replacing `self` by `next` drops (a limit whose numbers changed is
    /// still there). A reload says these at WARN, so a file cut short that is still valid YAML
    /// does not take limits away unseen.
    pub fn dropped_limits(&self, next: &Config) -> Vec<String> {
        let kept: std::collections::HashSet<&str> =
            next.limits.iter().map(|l| l.series_key.as_str()).collect();
        let mut dropped: Vec<String> = self
            .limits
            .iter()
            .map(|l| l.series_key.as_str())
            .filter(|key| !kept.contains(key))
            .map(str::to_owned)
            .collect();
        dropped.dedup();
        dropped
    }

    /// Entries of a `--config` directory that were passed over because they are not `*.yaml` /
    /// `*.yml` files (dot files aside, which are never read there).
    pub fn skipped(&self) -> &[std::path::PathBuf] {
        &self.skipped
    }

    /// Non-fatal findings, each `file:line:column: warning: ...`.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// A short hash (16 hex digits of SHA-256) of the policy table: the same limits give the same
    /// hash whatever source or file layout they came from, so instances can be compared.
    pub fn content_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.table().as_bytes());
        let mut hash = String::with_capacity(16);
        for byte in digest.iter().take(8) {
            let _ = write!(hash, "{byte:02x}");
        }
        hash
    }

    /// The policy table printed by `tollgate check` and served at `/rlconfig`: one line per
    /// limit (each of a `rate_limits` list on its own line) with its series key, algorithm,
    /// limit, window and flags, in aligned columns.
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
    if limit.lease {
        flags.push("lease".to_string());
    }
    if let Some(counting) = limit.counting {
        flags.push(format!("counting={counting}"));
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
            limit.series_key.clone(),
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
        limit.series_key.clone(),
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
