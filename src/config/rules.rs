//! The rules every policy must keep, whatever its source, checked in this one place: a [`Policy`]
//! tree becomes a [`Domain`] (its descriptor tree and [`Limit`]s), and the domains of one source
//! become a [`Config`] snapshot. Errors name the node they are about and say what to write
//! instead; warnings flag what loads but is likely a mistake.
//!
//! The rules never see a source's format. The file source has already held its YAML to the schema
//! (which keys exist, their types and ranges); a source that builds the tree from a protobuf
//! message gets the same checks and the same snapshot.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::LookupMap;
use super::diagnostics::{Finding, Location};
use super::domain::{Domain, KeyNodes, Level, Pattern, TreeNode};
use super::schema::{DescriptorNode, Given, Policy, RateLimitNode, ReplaceNode};
use super::{Attached, Config, FailureMode, Limit, LoadOptions, MetaValue};
use crate::counter_key;
use crate::descriptor::Unit;
use crate::window::{Algorithm, Counting};

/// A request descriptor carries at most this many entries, so deeper config can never match.
const MAX_DEPTH: usize = 32;

/// Below this many hits per shard, sharding makes a limit noticeably uneven.
const MIN_HITS_PER_SHARD: u32 = 10;

/// The longest `window`: one `year`, the longest unit.
const MAX_WINDOW: Duration = Duration::from_secs(365 * 86_400);

/// The domains of one source, gathered into a snapshot.
///
/// By default a domain may be declared only once, so that which limits apply never depends on
/// the order the source was read in. With [`LoadOptions::merge_domains`] several policies may
/// declare one domain, as envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG` allows: their top-level
/// descriptors are added to the domain's top level (no deeper merge), a top-level descriptor
/// declared twice is an error, and `replaces` may name a limit of any of them (checked once all
/// are in, by [`Snapshot::finish`]). Neither the limits nor their matching depend on the order
/// then, since no two policies can declare the same top-level descriptor.
#[derive(Debug)]
pub(super) struct Snapshot<L> {
    /// Each domain by name.
    domains: HashMap<String, Declared<L>>,
    /// Rendered warnings, in the order they were found.
    warnings: Vec<String>,
    options: LoadOptions,
}

/// One domain of a snapshot and where its parts were declared.
#[derive(Debug)]
struct Declared<L> {
    domain: Domain,
    /// Where the first policy declaring it wrote its `domain` key.
    at: L,
    /// Its top-level descriptors by `(key, value)`, with the source and node declaring each.
    top: HashMap<(String, String), (PathBuf, L)>,
    /// `replaces` names still to check against the whole domain (merged domains only), with the
    /// source and node of each.
    replaces: Vec<(String, PathBuf, L)>,
}

impl<L> Default for Snapshot<L> {
    fn default() -> Self {
        Snapshot::new(LoadOptions::default())
    }
}

impl<L> Snapshot<L> {
    /// An empty snapshot gathering policies as `options` say.
    pub fn new(options: LoadOptions) -> Self {
        Snapshot {
            domains: HashMap::new(),
            warnings: Vec::new(),
            options,
        }
    }
}

impl<L: Location> Snapshot<L> {
    /// Records a warning about the source as a whole, already rendered.
    pub fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    /// Checks `policy`, declared in `source`, and adds its domain (or, merging, its top-level
    /// descriptors to the domain already there).
    pub fn add(&mut self, source: &Path, policy: &Policy<L>) -> Result<(), Finding<L>> {
        let checked = check(policy)?;
        let (name, at) = checked.domain;
        let top = checked
            .top
            .into_iter()
            .map(|(key, value, at)| ((key, value), (source.to_path_buf(), at)));
        let replaces = checked
            .replaces
            .into_iter()
            .map(|(name, at)| (name, source.to_path_buf(), at));
        match self.domains.get_mut(&name) {
            Some(declared) if !self.options.merge_domains => {
                return Err(Finding::new(
                    at,
                    format!(
                        "domain `{name}` is already declared in {}:{}; keep each domain in one \
                         file (or merge the files' domains with --merge-domains)",
                        declared.domain.file().display(),
                        declared.at,
                    ),
                ));
            }
            Some(declared) => {
                for ((key, value), (_, node_at)) in top {
                    if let Some((first_source, first_at)) =
                        declared.top.get(&(key.clone(), value.clone()))
                    {
                        let segment = if value.is_empty() {
                            key
                        } else {
                            format!("{key}_{value}")
                        };
                        return Err(Finding::new(
                            node_at,
                            format!(
                                "duplicate descriptor `{name}.{segment}` (first in {}:{first_at}); \
                                 merged domains may declare each top-level descriptor once",
                                first_source.display()
                            ),
                        ));
                    }
                    declared
                        .top
                        .insert((key, value), (source.to_path_buf(), node_at));
                }
                declared.replaces.extend(replaces);
                declared
                    .domain
                    .merge(checked.tree, checked.limits, &checked.keys);
            }
            None => {
                let mut replaces: Vec<(String, PathBuf, L)> = replaces.collect();
                if !self.options.merge_domains {
                    // One policy holds the whole domain: check its `replaces` now, so the first
                    // error in reading order is the one reported.
                    check_replaces(&name, &checked.limits, &replaces)
                        .map_err(|(_, finding)| finding)?;
                    replaces.clear();
                }
                let domain = Domain::new(
                    name.clone(),
                    source.to_path_buf(),
                    checked.tree,
                    checked.limits,
                    &checked.keys,
                );
                self.domains.insert(
                    name,
                    Declared {
                        domain,
                        at,
                        top: top.collect(),
                        replaces,
                    },
                );
            }
        }
        self.warnings
            .extend(checked.warnings.iter().map(|w| w.warning(source)));
        Ok(())
    }

    /// The snapshot of every domain added; for merged domains, the first `replaces` that names
    /// no limit of its domain is an error about its source.
    pub fn finish(self) -> Result<Config, (PathBuf, Finding<L>)> {
        let mut names: Vec<&String> = self.domains.keys().collect();
        names.sort();
        for name in names {
            let declared = &self.domains[name];
            check_replaces(name, declared.domain.limits(), &declared.replaces)?;
        }
        let domains: LookupMap<String, Domain> = self
            .domains
            .into_iter()
            .map(|(name, declared)| (name, declared.domain))
            .collect();
        let mut limits: Vec<Arc<Limit>> = domains
            .values()
            .flat_map(|d| d.limits().iter().cloned())
            .collect();
        limits.sort_by(super::Limit::listing_order);
        Ok(Config {
            domains,
            limits,
            warnings: self.warnings,
            skipped: Vec::new(),
        })
    }
}

/// One policy, checked: its domain's name (and where it was written), tree, limits, top-level
/// descriptors, `replaces` names (to be checked against the domain) and warnings.
struct Checked<L> {
    domain: (String, L),
    tree: Level,
    limits: Vec<Arc<Limit>>,
    top: Vec<(String, String, L)>,
    replaces: Vec<(String, L)>,
    warnings: Vec<Finding<L>>,
    /// Every descriptor key with the level it is declared at, in file order.
    keys: Vec<(usize, String)>,
}

/// Every `replaces` must name a limit of its domain (so a typo does not silently replace
/// nothing); the error names the source of the first that does not.
fn check_replaces<L: Location>(
    domain: &str,
    limits: &[Arc<Limit>],
    replaces: &[(String, PathBuf, L)],
) -> Result<(), (PathBuf, Finding<L>)> {
    let names: HashSet<&str> = limits
        .iter()
        .filter_map(|limit| limit.name.as_deref())
        .collect();
    for (name, source, at) in replaces {
        if !names.contains(name.as_str()) {
            return Err((
                source.clone(),
                Finding::new(
                    at.clone(),
                    format!(
                        "`replaces` names `{name}`, but no limit in domain `{domain}` has \
                         `name: {name}`; fix the name or add it to the limit to replace"
                    ),
                ),
            ));
        }
    }
    Ok(())
}

/// Checks one policy and builds its domain's tree.
fn check<L: Location>(policy: &Policy<L>) -> Result<Checked<L>, Finding<L>> {
    let domain = match &policy.domain {
        None => {
            return Err(Finding::new(
                policy.at.clone(),
                "missing `domain`; write `domain: <name>` at the top of the file",
            ));
        }
        Some(domain) if domain.value.is_empty() => {
            return Err(Finding::new(
                domain.at.clone(),
                "`domain` is empty; write `domain: <name>` (the domain Envoy sends)",
            ));
        }
        Some(domain) => domain,
    };
    let mut checker = Checker {
        limits: Vec::new(),
        warnings: Vec::new(),
        replaces: Vec::new(),
        keys: Vec::new(),
    };
    let mut tree = Level::default();
    let mut top = Vec::new();
    if let Some(descriptors) = &policy.descriptors {
        checker.descriptors(descriptors, &domain.value, 1, &mut tree)?;
        top = descriptors
            .value
            .iter()
            .filter_map(|node| {
                let key = node.key.as_ref()?;
                Some((key.value.clone(), node.value.clone(), node.at.clone()))
            })
            .collect();
    }
    Ok(Checked {
        domain: (domain.value.clone(), domain.at.clone()),
        tree,
        limits: checker.limits,
        top,
        replaces: checker
            .replaces
            .into_iter()
            .map(|(name, at)| (name.to_string(), at))
            .collect(),
        warnings: checker.warnings,
        keys: checker.keys,
    })
}

/// What checking one policy gathers on its way down the tree.
struct Checker<'p, L> {
    limits: Vec<Arc<Limit>>,
    warnings: Vec<Finding<L>>,
    /// Every `replaces` name, checked against the domain's limit names once the domain is whole.
    replaces: Vec<(&'p str, L)>,
    /// Every descriptor key with its level, in file order.
    keys: Vec<(usize, String)>,
}

impl<'p, L: Location> Checker<'p, L> {
    /// Adds a `descriptors` list to `level`; `parent` is the full key of the enclosing node.
    fn descriptors(
        &mut self,
        list: &'p Given<Vec<DescriptorNode<L>>, L>,
        parent: &str,
        depth: usize,
        level: &mut Level,
    ) -> Result<(), Finding<L>> {
        if depth > MAX_DEPTH {
            return Err(Finding::new(
                list.key_at.clone(),
                format!(
                    "descriptors nest deeper than {MAX_DEPTH} levels; a request descriptor \
                     carries at most {MAX_DEPTH} entries, so this could never match"
                ),
            ));
        }
        let mut seen: HashMap<(&str, &str), &L> = HashMap::new();
        for node in &list.value {
            let key = match &node.key {
                None => {
                    return Err(Finding::new(
                        node.at.clone(),
                        "descriptor has no `key`; write e.g. `key: remote_address`",
                    ));
                }
                Some(key) if key.value.is_empty() => {
                    return Err(Finding::new(
                        key.at.clone(),
                        "descriptor has an empty `key`; write e.g. `key: remote_address`",
                    ));
                }
                Some(key) => key.value.as_str(),
            };
            self.keys.push((depth, key.to_string()));
            let value = node.value.as_str();
            let segment = if value.is_empty() {
                key.to_string()
            } else {
                format!("{key}_{value}")
            };
            let full_key = format!("{parent}.{segment}");
            if let Some(first) = seen.insert((key, value), &node.at) {
                return Err(Finding::new(
                    node.at.clone(),
                    format!(
                        "duplicate descriptor `{full_key}` (first at {}); merge the two",
                        first.describe()
                    ),
                ));
            }

            let pattern = Pattern::new(value);
            let share_threshold = match &node.share_threshold {
                Some(share) if share.value && pattern.is_none() => {
                    return Err(Finding::new(
                        share.key_at.clone(),
                        format!(
                            "share_threshold needs a wildcard `value` (containing `*`, e.g. \
                             `files/*`), but `{segment}` has none; remove share_threshold"
                        ),
                    ));
                }
                Some(share) => share.value,
                None => false,
            };
            let limits = self.limits(node, &full_key)?;
            self.limits.extend(limits.iter().cloned());
            // An empty mapping is no metadata, as in envoyproxy/ratelimit.
            let metadata = node
                .metadata
                .clone()
                .filter(|m| !matches!(m, MetaValue::Map(pairs) if pairs.is_empty()));
            let mut children = Level::default();
            if let Some(list) = &node.descriptors {
                self.descriptors(list, &full_key, depth + 1, &mut children)?;
            }
            let shared_key_part = match (&pattern, share_threshold) {
                (Some(pattern), true) => counter_key::level_part(key, Some(pattern.as_str())),
                _ => Box::default(),
            };
            let key_suffixes = limits
                .iter()
                .map(|limit| counter_key::suffix(limit.algorithm, limit.window_ms))
                .collect();
            level
                .entry(key.to_string())
                .or_insert_with(|| KeyNodes::new(key))
                .push(
                    value,
                    pattern,
                    TreeNode {
                        limits,
                        metadata,
                        share_threshold,
                        shared_key_part,
                        key_suffixes,
                        value_to_metric: node.value_to_metric,
                        children,
                    },
                );
        }
        Ok(())
    }

    /// The limits descriptor `node` declares, in declaration order: its `rate_limit`, or each
    /// of its `rate_limits`; none for an allow-list entry or a parent.
    fn limits(
        &mut self,
        node: &'p DescriptorNode<L>,
        full_key: &str,
    ) -> Result<Vec<Arc<Limit>>, Finding<L>> {
        let list = match (&node.rate_limit, &node.rate_limits) {
            (None, None) => return Ok(Vec::new()),
            (Some(rate_limit), None) => {
                let limit = self.rate_limit(rate_limit, full_key, node, None)?;
                return Ok(vec![Arc::new(limit)]);
            }
            (Some(_), Some(list)) => {
                return Err(Finding::new(
                    list.key_at.clone(),
                    format!(
                        "`{full_key}` has both `rate_limit` and `rate_limits`; give one: move \
                         the `rate_limit` into the `rate_limits` list"
                    ),
                ));
            }
            (None, Some(list)) => list,
        };
        if list.value.is_empty() {
            return Err(Finding::new(
                list.at.clone(),
                format!(
                    "`rate_limits` of `{full_key}` is empty; list at least one limit such as \
                     `- {{unit: second, requests_per_unit: 10}}`, or remove `rate_limits` to \
                     allow every request"
                ),
            ));
        }
        let mut limits: Vec<(Arc<Limit>, &L)> = Vec::with_capacity(list.value.len());
        for (index, entry) in list.value.iter().enumerate() {
            if entry.value.unlimited {
                return Err(Finding::new(
                    entry.at.clone(),
                    format!(
                        "a `rate_limits` entry cannot be `unlimited: true`: the other limits of \
                         `{full_key}` would still limit it; to never limit the descriptor, write \
                         `rate_limit: {{unlimited: true}}` instead of `rate_limits`"
                    ),
                ));
            }
            let limit = self.rate_limit(entry, full_key, node, Some(index))?;
            for (other, other_at) in &limits {
                if limit.name.is_some() && other.name == limit.name {
                    return Err(Finding::new(
                        entry.at.clone(),
                        format!(
                            "two limits of `{full_key}` are named `{}` (the first at {}); give \
                             each limit of `rate_limits` its own name",
                            limit.name.as_deref().unwrap_or(""),
                            other_at.describe()
                        ),
                    ));
                }
                if other.algorithm == limit.algorithm && other.window_ms == limit.window_ms {
                    return Err(Finding::new(
                        entry.at.clone(),
                        format!(
                            "this limit of `{full_key}` has the same algorithm ({}) and window \
                             ({}) as the one at {}, so the two would share one counter; give \
                             them different windows (or algorithms), or keep only the lower \
                             limit",
                            limit.algorithm.as_str(),
                            window_text(&limit),
                            other_at.describe()
                        ),
                    ));
                }
            }
            limits.push((Arc::new(limit), &entry.at));
        }
        Ok(limits.into_iter().map(|(limit, _)| limit).collect())
    }

    /// The limit a `rate_limit` (or item `position` of a `rate_limits` list) declares, carrying
    /// the flags of its descriptor `node`.
    fn rate_limit(
        &mut self,
        rate_limit: &'p Given<RateLimitNode<L>, L>,
        full_key: &str,
        node: &DescriptorNode<L>,
        position: Option<usize>,
    ) -> Result<Limit, Finding<L>> {
        let fields = &rate_limit.value;
        let name = fields.name.as_deref().filter(|n| !n.is_empty());
        let series_key = match (position, name) {
            (None, _) => full_key.to_string(),
            (Some(_), Some(name)) => format!("{full_key}.{name}"),
            (Some(index), None) => format!("{full_key}.{}", index + 1),
        };
        let what = if position.is_some() {
            "a `rate_limits` entry"
        } else {
            "`rate_limit`"
        };
        let unlimited = fields.unlimited;
        let unit = match &fields.unit {
            Some(unit) if !unit.value.is_empty() => Some((
                unit,
                Unit::parse(&unit.value).ok_or_else(|| {
                    Finding::new(
                        unit.at.clone(),
                        format!(
                            "unknown unit `{}`; write second, minute, hour, day, week, month or \
                             year (or `window: 90s` for other lengths)",
                            unit.value
                        ),
                    )
                })?,
            )),
            _ => None,
        };
        let window = match &fields.window {
            Some(window) => Some((window, parse_window(window)?)),
            None => None,
        };
        let replaces = self.replaces(&fields.replaces, name)?;
        let algorithm = match &fields.algorithm {
            Some(algorithm) => Algorithm::parse(&algorithm.value).ok_or_else(|| {
                Finding::new(
                    algorithm.at.clone(),
                    format!(
                        "unknown algorithm `{}`; write sliding_window_counter (the default) or \
                         sliding_window_log",
                        algorithm.value
                    ),
                )
            })?,
            None => Algorithm::default(),
        };
        let failure_mode = match &fields.failure_mode {
            Some(mode) => Some(FailureMode::parse(&mode.value).ok_or_else(|| {
                Finding::new(
                    mode.at.clone(),
                    format!("unknown failure_mode `{}`; write allow or deny", mode.value),
                )
            })?),
            None => None,
        };
        let counting = match &fields.counting {
            Some(counting) => Some(Counting::parse(&counting.value).ok_or_else(|| {
                Finding::new(
                    counting.at.clone(),
                    format!(
                        "unknown counting `{}`; write admitted (refused hits are not charged) \
                         or all (every hit is charged, as envoyproxy/ratelimit counts)",
                        counting.value
                    ),
                )
            })?),
            None => None,
        };

        let (unit, window_ms, requests_per_unit) = if unlimited {
            if let Some((unit, _)) = unit {
                return Err(Finding::new(
                    unit.key_at.clone(),
                    "`unlimited: true` takes no `unit`; remove `unit` or `unlimited`",
                ));
            }
            if let Some((window, _)) = window {
                return Err(Finding::new(
                    window.key_at.clone(),
                    "`unlimited: true` takes no `window`; remove `window` or `unlimited`",
                ));
            }
            (None, 0, 0)
        } else {
            let (unit, window_ms) = match (unit, window) {
                (Some(_), Some((window, _))) => {
                    return Err(Finding::new(
                        window.key_at.clone(),
                        "give either `unit` or `window`, not both; remove one",
                    ));
                }
                (Some((_, unit)), None) => (Some(unit), unit.millis()),
                (None, Some((_, window_ms))) => (Unit::from_millis(window_ms), window_ms),
                (None, None) => {
                    let or_unlimited = if position.is_some() {
                        ""
                    } else {
                        ", or `unlimited: true`"
                    };
                    return Err(Finding::new(
                        rate_limit.key_at.clone(),
                        format!(
                            "{what} needs a `unit` (second, minute, hour, day, week, month, \
                             year) or a `window` (e.g. `window: 90s`){or_unlimited}"
                        ),
                    ));
                }
            };
            let requests_per_unit = match &fields.requests_per_unit {
                Some(requests) => requests.value,
                None => {
                    self.warnings.push(Finding::new(
                        rate_limit.key_at.clone(),
                        format!(
                            "`{series_key}` has no requests_per_unit, so it admits nothing; write \
                             `requests_per_unit: 0` if that is meant"
                        ),
                    ));
                    0
                }
            };
            (unit, window_ms, requests_per_unit)
        };

        let shards = match &fields.shards {
            Some(shards) => {
                let n = shards.value;
                let per_shard = requests_per_unit / u32::from(n.max(1));
                if n > 1 && !unlimited && per_shard < MIN_HITS_PER_SHARD {
                    self.warnings.push(Finding::new(
                        shards.at.clone(),
                        format!(
                            "`{series_key}` splits {requests_per_unit} hits over {n} shards, \
                             {per_shard} per shard; with fewer than {MIN_HITS_PER_SHARD} per \
                             shard the limit gets uneven: lower `shards`"
                        ),
                    ));
                }
                n
            }
            None => 1,
        };

        Ok(Limit {
            full_key: full_key.to_string(),
            name: name.map(str::to_string),
            requests_per_unit,
            unit,
            window_ms,
            algorithm,
            shards,
            lease: fields.lease && !unlimited,
            counting,
            failure_mode,
            unlimited,
            shadow_mode: node.shadow_mode,
            quota_mode: node.quota_mode,
            detailed_metric: node.detailed_metric,
            value_to_metric: node.value_to_metric,
            replaces,
            joint: position.is_some(),
            series_key,
            attached: Attached::default(),
        })
    }

    /// The names a `replaces` list gives; none may be empty or the limit's own `name`.
    fn replaces(
        &mut self,
        items: &'p [ReplaceNode<L>],
        own_name: Option<&str>,
    ) -> Result<Vec<String>, Finding<L>> {
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            let name = item.name.as_str();
            if name.is_empty() {
                return Err(Finding::new(
                    item.at.clone(),
                    "empty `replaces` entry; write `- name: <name of the limit to replace>`",
                ));
            }
            if Some(name) == own_name {
                return Err(Finding::new(
                    item.at.clone(),
                    format!(
                        "a limit cannot replace itself: `{name}` is this limit's own `name`; \
                         name another limit"
                    ),
                ));
            }
            self.replaces.push((name, item.at.clone()));
            names.push(name.to_string());
        }
        Ok(names)
    }
}

/// A limit's window as messages write it: its unit, or a compact duration (`90s`).
fn window_text(limit: &Limit) -> String {
    match limit.unit {
        Some(unit) => unit.as_str().to_string(),
        None => super::compact_duration(limit.window_ms / 1000),
    }
}

/// A `window` duration in milliseconds: whole seconds, 1 s up to a year.
fn parse_window<L: Location>(window: &Given<String, L>) -> Result<u64, Finding<L>> {
    let text = window.value.as_str();
    let invalid = |message: String| Err(Finding::new(window.at.clone(), message));
    let Ok(duration) = humantime::parse_duration(text) else {
        return invalid(format!(
            "`window` must be a duration such as 30s, 90s, 5m or 1h, found `{text}`"
        ));
    };
    if duration < Duration::from_secs(1) {
        return invalid(format!("`window` must be at least 1s, found `{text}`"));
    }
    if duration.subsec_nanos() != 0 {
        return invalid(format!(
            "`window` must be a whole number of seconds (e.g. 2s, not 1500ms), found `{text}`"
        ));
    }
    if duration > MAX_WINDOW {
        return invalid(format!(
            "`window` must be at most 365d (one year), found `{text}`"
        ));
    }
    Ok(duration.as_secs() * 1000)
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use super::*;
    use crate::descriptor::Entry;

    /// A location as a source without text would give it: the path of a field in a message.
    #[derive(Debug, Clone, PartialEq)]
    struct FieldPath(&'static str);

    impl fmt::Display for FieldPath {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }

    impl Location for FieldPath {
        fn describe(&self) -> String {
            format!("`{}`", self.0)
        }
    }

    fn given<T>(value: T, path: &'static str) -> Given<T, FieldPath> {
        Given {
            value,
            key_at: FieldPath(path),
            at: FieldPath(path),
        }
    }

    /// `key: value` at `path` with `requests` per minute.
    fn node(
        path: &'static str,
        key: &str,
        value: &str,
        requests: u32,
    ) -> DescriptorNode<FieldPath> {
        let rate_limit = RateLimitNode {
            unit: Some(given("minute".to_string(), path)),
            requests_per_unit: Some(given(requests, path)),
            unlimited: false,
            name: None,
            replaces: Vec::new(),
            algorithm: None,
            window: None,
            shards: None,
            failure_mode: None,
            counting: None,
            lease: false,
        };
        DescriptorNode {
            at: FieldPath(path),
            key: Some(given(key.to_string(), path)),
            value: value.to_string(),
            rate_limit: Some(given(rate_limit, path)),
            rate_limits: None,
            descriptors: None,
            shadow_mode: false,
            quota_mode: false,
            detailed_metric: false,
            value_to_metric: false,
            share_threshold: None,
            metadata: None,
        }
    }

    fn policy(nodes: Vec<DescriptorNode<FieldPath>>) -> Policy<FieldPath> {
        Policy {
            at: FieldPath("config"),
            domain: Some(given("edge".to_string(), "config.domain")),
            descriptors: Some(given(nodes, "config.descriptors")),
        }
    }

    #[test]
    fn a_tree_built_from_a_message_gets_the_same_rules_and_snapshot() {
        let mut snapshot = Snapshot::default();
        let tree = policy(vec![node("config.descriptors[0]", "user", "alice", 5)]);
        snapshot.add(Path::new("edge-resource"), &tree).unwrap();
        let config = snapshot.finish().unwrap();
        let domain = config.domain("edge").unwrap();
        assert_eq!(domain.file(), Path::new("edge-resource"));
        let matched = domain.resolve(&[Entry::new("user", "alice")]).unwrap();
        assert_eq!(matched.limits[0].full_key, "edge.user_alice");
        assert_eq!(
            (
                matched.limits[0].requests_per_unit,
                matched.limits[0].window_ms
            ),
            (5, 60_000)
        );

        let duplicated = policy(vec![
            node("config.descriptors[0]", "user", "alice", 5),
            node("config.descriptors[1]", "user", "alice", 7),
        ]);
        let error = Snapshot::default()
            .add(Path::new("edge-resource"), &duplicated)
            .unwrap_err();
        assert_eq!(error.at, FieldPath("config.descriptors[1]"));
        assert_eq!(
            error.message,
            "duplicate descriptor `edge.user_alice` (first at `config.descriptors[0]`); merge \
             the two"
        );
    }
}
