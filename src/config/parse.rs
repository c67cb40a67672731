//! Turns one file's YAML tree into a domain's descriptor tree, validating as it goes. Every error
//! names the offending node's `line:column` and says what to write instead.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::matcher::{Level, Pattern, TreeNode};
use super::yaml::{self, Node, Pos, Resolved, Value};
use super::{ConfigError, FailureMode, Limit, MetaValue};
use crate::descriptor::Unit;
use crate::window::Algorithm;

/// A request descriptor carries at most this many entries, so deeper config can never match.
const MAX_DEPTH: usize = 32;

/// The most shards one limit may be split into.
const MAX_SHARDS: i128 = 64;

/// Below this many hits per shard, sharding makes a limit noticeably uneven.
const MIN_HITS_PER_SHARD: u32 = 10;

/// The longest `window`: one `year`, the longest unit.
const MAX_WINDOW: Duration = Duration::from_secs(365 * 86_400);

const TOP_KEYS: &[&str] = &["domain", "descriptors"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "descriptors",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "algorithm",
    "window",
    "shards",
    "failure_mode",
];
const REPLACES_KEYS: &[&str] = &["name"];

/// Where a mapping sits, for key validation and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Top,
    Descriptor,
    RateLimit,
    Replaces,
}

impl Place {
    const ALL: [Place; 4] = [
        Place::Descriptor,
        Place::RateLimit,
        Place::Top,
        Place::Replaces,
    ];

    fn keys(self) -> &'static [&'static str] {
        match self {
            Place::Top => TOP_KEYS,
            Place::Descriptor => DESCRIPTOR_KEYS,
            Place::RateLimit => RATE_LIMIT_KEYS,
            Place::Replaces => REPLACES_KEYS,
        }
    }

    /// "in a descriptor", ...
    fn inside(self) -> &'static str {
        match self {
            Place::Top => "at the top level of the file",
            Place::Descriptor => "in a descriptor",
            Place::RateLimit => "in `rate_limit`",
            Place::Replaces => "in a `replaces` entry",
        }
    }

    /// Where keys of this place go, for "belongs ..." hints.
    fn home(self) -> &'static str {
        match self {
            Place::Top => "at the top level of the file",
            Place::Descriptor => "in a descriptor (an item of `descriptors`)",
            Place::RateLimit => "inside `rate_limit`",
            Place::Replaces => "in a `replaces` entry",
        }
    }
}

/// One file, loaded.
#[derive(Debug)]
pub(super) struct Loaded {
    pub domain: String,
    pub domain_pos: Pos,
    pub tree: Level,
    pub limits: Vec<Arc<Limit>>,
    pub warnings: Vec<String>,
}

/// Loads one policy file's text.
pub(super) fn parse_file(file: &Path, text: &str) -> Result<Loaded, ConfigError> {
    let root = yaml::parse(text).map_err(|e| error(file, e.pos, e.message))?;
    let mut parser = FileParser {
        file,
        domain: String::new(),
        limits: Vec::new(),
        warnings: Vec::new(),
        replaces: Vec::new(),
    };
    let Some(root) = root else {
        return Err(error(
            file,
            Pos { line: 1, column: 1 },
            "the file is empty; a policy file needs `domain: <name>` and `descriptors:`",
        ));
    };
    if !matches!(root.value, Value::Map(_)) {
        return Err(parser.error(
            root.pos,
            format!(
                "a policy file must be a mapping with `domain` and `descriptors`, found {}",
                root.describe()
            ),
        ));
    }
    let fields = parser.fields(&root, Place::Top)?;
    let (domain, domain_pos) = match fields.get("domain") {
        None => {
            return Err(parser.error(
                root.pos,
                "missing `domain`; write `domain: <name>` at the top of the file",
            ));
        }
        Some(field) => match parser.string(field)? {
            Some(domain) if !domain.is_empty() => (domain.to_string(), field.value.pos),
            _ => {
                return Err(parser.error(
                    field.value.pos,
                    "`domain` is empty; write `domain: <name>` (the domain Envoy sends)",
                ));
            }
        },
    };
    parser.domain = domain;
    let mut tree = Level::new();
    if let Some(field) = fields.get("descriptors") {
        let domain = parser.domain.clone();
        parser.descriptors(field, &domain, 1, &mut tree)?;
    }
    parser.check_replaces()?;
    let FileParser {
        domain,
        limits,
        warnings,
        ..
    } = parser;
    Ok(Loaded {
        domain,
        domain_pos,
        tree,
        limits,
        warnings,
    })
}

fn error(file: &Path, pos: Pos, message: impl Into<String>) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        line: pos.line,
        column: pos.column,
        message: message.into(),
    }
}

/// A key and its value in a mapping.
#[derive(Debug, Clone, Copy)]
struct Field<'n> {
    name: &'n str,
    key: &'n Node,
    value: &'n Node,
}

/// The validated keys of one mapping.
struct Fields<'n>(Vec<Field<'n>>);

impl<'n> Fields<'n> {
    /// The field, unless absent or null (the reference treats both alike).
    fn get(&self, name: &str) -> Option<Field<'n>> {
        self.0
            .iter()
            .find(|f| f.name == name && !f.value.is_null())
            .copied()
    }

    /// The field even when its value is null.
    fn raw(&self, name: &str) -> Option<Field<'n>> {
        self.0.iter().find(|f| f.name == name).copied()
    }
}

/// The flags of a descriptor node that its limit carries.
struct NodeFlags {
    shadow_mode: bool,
    quota_mode: bool,
    detailed_metric: bool,
    value_to_metric: bool,
}

struct FileParser<'f> {
    file: &'f Path,
    domain: String,
    limits: Vec<Arc<Limit>>,
    warnings: Vec<String>,
    /// Every `replaces` name, checked against the domain's limit names at the end.
    replaces: Vec<(String, Pos)>,
}

impl FileParser<'_> {
    fn error(&self, pos: Pos, message: impl Into<String>) -> ConfigError {
        error(self.file, pos, message)
    }

    fn warn(&mut self, pos: Pos, message: impl AsRef<str>) {
        self.warnings.push(format!(
            "{}:{}:{}: warning: {}",
            self.file.display(),
            pos.line,
            pos.column,
            message.as_ref()
        ));
    }

    /// The keys of a mapping at `place`, each a known string key.
    fn fields<'n>(&self, node: &'n Node, place: Place) -> Result<Fields<'n>, ConfigError> {
        let Value::Map(pairs) = &node.value else {
            return Err(self.error(
                node.pos,
                format!("expected a mapping, found {}", node.describe()),
            ));
        };
        let mut fields = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let name = match key.scalar().map(|s| s.resolve()) {
                Some(Ok(Resolved::Str(name))) => name,
                Some(_) => {
                    return Err(self.error(
                        key.pos,
                        format!(
                            "key `{}` is not a string; keys are names such as `{}`",
                            key.scalar().map_or("", |s| s.text.as_str()),
                            place.keys()[0]
                        ),
                    ));
                }
                None => {
                    return Err(self.error(
                        key.pos,
                        format!(
                            "a key must be a name such as `{}`, found {}",
                            place.keys()[0],
                            key.describe()
                        ),
                    ));
                }
            };
            if !place.keys().contains(&name) {
                return Err(self.error(key.pos, unknown_key_message(name, place)));
            }
            fields.push(Field { name, key, value });
        }
        Ok(Fields(fields))
    }

    /// A string field; `None` when null. Scalars of other types are read as written, as the
    /// reference does (`value: 404` is the string "404").
    fn string<'n>(&self, field: Field<'n>) -> Result<Option<&'n str>, ConfigError> {
        match &field.value.value {
            Value::Scalar(scalar) => match scalar.resolve() {
                Ok(Resolved::Null) => Ok(None),
                _ => Ok(Some(scalar.text.as_str())),
            },
            _ => Err(self.error(
                field.value.pos,
                format!(
                    "`{}` must be a string, found {}",
                    field.name,
                    field.value.describe()
                ),
            )),
        }
    }

    fn boolean(&self, field: Option<Field<'_>>) -> Result<bool, ConfigError> {
        let Some(field) = field else { return Ok(false) };
        match field.value.scalar().map(|s| s.resolve()) {
            Some(Ok(Resolved::Bool(b))) => Ok(b),
            Some(Ok(Resolved::Null)) => Ok(false),
            _ => Err(self.error(
                field.value.pos,
                format!(
                    "`{}` must be true or false, found {}",
                    field.name,
                    field.value.describe()
                ),
            )),
        }
    }

    /// An integer field within `min..=max`; `None` when null.
    fn integer(&self, field: Field<'_>, min: i128, max: i128) -> Result<i128, ConfigError> {
        match field.value.scalar().map(|s| s.resolve()) {
            Some(Ok(Resolved::Int(i))) if (min..=max).contains(&i) => Ok(i),
            _ => Err(self.error(
                field.value.pos,
                format!(
                    "`{}` must be a whole number from {min} to {max}, found {}",
                    field.name,
                    field.value.describe()
                ),
            )),
        }
    }

    /// Loads a `descriptors` list into `level`; `parent` is the full key of the enclosing node.
    fn descriptors(
        &mut self,
        field: Field<'_>,
        parent: &str,
        depth: usize,
        level: &mut Level,
    ) -> Result<(), ConfigError> {
        let Value::Seq(items) = &field.value.value else {
            return Err(self.error(
                field.value.pos,
                format!(
                    "`descriptors` must be a list of descriptors (`- key: ...`), found {}",
                    field.value.describe()
                ),
            ));
        };
        if depth > MAX_DEPTH {
            return Err(self.error(
                field.key.pos,
                format!(
                    "descriptors nest deeper than {MAX_DEPTH} levels; a request descriptor \
                     carries at most {MAX_DEPTH} entries, so this could never match"
                ),
            ));
        }
        let mut seen: HashMap<(&str, &str), Pos> = HashMap::new();
        for item in items {
            if !matches!(item.value, Value::Map(_)) {
                return Err(self.error(
                    item.pos,
                    format!(
                        "each item of `descriptors` must be a mapping such as `- key: user`, \
                         found {}",
                        item.describe()
                    ),
                ));
            }
            let fields = self.fields(item, Place::Descriptor)?;
            let key = match fields.raw("key") {
                None => {
                    return Err(self.error(
                        item.pos,
                        "descriptor has no `key`; write e.g. `key: remote_address`",
                    ));
                }
                Some(field) => match self.string(field)? {
                    Some(key) if !key.is_empty() => key,
                    _ => {
                        return Err(self.error(
                            field.value.pos,
                            "descriptor has an empty `key`; write e.g. `key: remote_address`",
                        ));
                    }
                },
            };
            let value = match fields.get("value") {
                Some(field) => self.string(field)?.unwrap_or(""),
                None => "",
            };
            let segment = if value.is_empty() {
                key.to_string()
            } else {
                format!("{key}_{value}")
            };
            let full_key = format!("{parent}.{segment}");
            if let Some(first) = seen.insert((key, value), item.pos) {
                return Err(self.error(
                    item.pos,
                    format!(
                        "duplicate descriptor `{full_key}` (first at line {}); merge the two",
                        first.line
                    ),
                ));
            }

            let share_threshold = self.boolean(fields.get("share_threshold"))?;
            let pattern = Pattern::new(value);
            if share_threshold
                && pattern.is_none()
                && let Some(field) = fields.get("share_threshold")
            {
                return Err(self.error(
                    field.key.pos,
                    format!(
                        "share_threshold needs a wildcard `value` (containing `*`, e.g. \
                         `files/*`), but `{segment}` has none; remove share_threshold"
                    ),
                ));
            }
            let flags = NodeFlags {
                shadow_mode: self.boolean(fields.get("shadow_mode"))?,
                quota_mode: self.boolean(fields.get("quota_mode"))?,
                detailed_metric: self.boolean(fields.get("detailed_metric"))?,
                value_to_metric: self.boolean(fields.get("value_to_metric"))?,
            };
            let limit = match fields.get("rate_limit") {
                Some(field) => Some(Arc::new(self.rate_limit(field, &full_key, flags)?)),
                None => None,
            };
            if let Some(limit) = &limit {
                self.limits.push(Arc::clone(limit));
            }
            let metadata = match fields.get("metadata") {
                Some(field) => self.metadata(field)?,
                None => None,
            };
            let mut children = Level::new();
            if let Some(field) = fields.get("descriptors") {
                self.descriptors(field, &full_key, depth + 1, &mut children)?;
            }

            let nodes = level.entry(key.to_string()).or_default();
            let index = nodes.nodes.len();
            nodes.nodes.push(TreeNode {
                limit,
                metadata,
                share_threshold,
                children,
            });
            if value.is_empty() {
                nodes.key_only = Some(index);
            } else {
                nodes.exact.insert(value.to_string(), index);
                if let Some(pattern) = pattern {
                    nodes.wildcards.push((pattern, index));
                }
            }
        }
        Ok(())
    }

    fn rate_limit(
        &mut self,
        field: Field<'_>,
        full_key: &str,
        flags: NodeFlags,
    ) -> Result<Limit, ConfigError> {
        if !matches!(field.value.value, Value::Map(_)) {
            return Err(self.error(
                field.value.pos,
                format!(
                    "`rate_limit` must be a mapping such as `{{unit: minute, \
                     requests_per_unit: 10}}`, found {}",
                    field.value.describe()
                ),
            ));
        }
        let fields = self.fields(field.value, Place::RateLimit)?;
        let unlimited = self.boolean(fields.get("unlimited"))?;

        let unit = match fields.get("unit") {
            Some(f) => match self.string(f)?.filter(|u| !u.is_empty()) {
                Some(text) => Some((
                    f,
                    Unit::parse(text).ok_or_else(|| {
                        self.error(
                            f.value.pos,
                            format!(
                                "unknown unit `{text}`; write second, minute, hour, day, week, \
                                 month or year (or `window: 90s` for other lengths)"
                            ),
                        )
                    })?,
                )),
                None => None,
            },
            None => None,
        };
        let window = match fields.get("window") {
            Some(f) => Some((f, self.window(f)?)),
            None => None,
        };
        let requests = match fields.get("requests_per_unit") {
            Some(f) => Some((f, self.integer(f, 0, i128::from(u32::MAX))?)),
            None => None,
        };
        let name = match fields.get("name") {
            Some(f) => self.string(f)?.filter(|n| !n.is_empty()),
            None => None,
        };
        let replaces = match fields.get("replaces") {
            Some(f) => self.replaces(f, name)?,
            None => Vec::new(),
        };
        let algorithm = match fields.get("algorithm") {
            Some(f) => {
                let text = self.string(f)?.unwrap_or("");
                Algorithm::parse(text).ok_or_else(|| {
                    self.error(
                        f.value.pos,
                        format!(
                            "unknown algorithm `{text}`; write sliding_window_counter (the \
                             default) or sliding_window_log"
                        ),
                    )
                })?
            }
            None => Algorithm::default(),
        };
        let shards = match fields.get("shards") {
            Some(f) => Some((f, self.integer(f, 1, MAX_SHARDS)?)),
            None => None,
        };
        let failure_mode = match fields.get("failure_mode") {
            Some(f) => {
                let text = self.string(f)?.unwrap_or("");
                Some(FailureMode::parse(text).ok_or_else(|| {
                    self.error(
                        f.value.pos,
                        format!("unknown failure_mode `{text}`; write allow or deny"),
                    )
                })?)
            }
            None => None,
        };

        let (unit, window_ms, requests_per_unit) = if unlimited {
            if let Some((f, _)) = unit {
                return Err(self.error(
                    f.key.pos,
                    "`unlimited: true` takes no `unit`; remove `unit` or `unlimited`",
                ));
            }
            if let Some((f, _)) = window {
                return Err(self.error(
                    f.key.pos,
                    "`unlimited: true` takes no `window`; remove `window` or `unlimited`",
                ));
            }
            (None, 0, 0)
        } else {
            let (unit, window_ms) = match (unit, window) {
                (Some(_), Some((f, _))) => {
                    return Err(self.error(
                        f.key.pos,
                        "give either `unit` or `window`, not both; remove one",
                    ));
                }
                (Some((_, unit)), None) => (Some(unit), unit.millis()),
                (None, Some((_, window_ms))) => (Unit::from_millis(window_ms), window_ms),
                (None, None) => {
                    return Err(self.error(
                        field.key.pos,
                        "`rate_limit` needs a `unit` (second, minute, hour, day, week, month, \
                         year) or a `window` (e.g. `window: 90s`), or `unlimited: true`",
                    ));
                }
            };
            let requests_per_unit = match requests {
                Some((_, n)) => u32::try_from(n).unwrap_or(u32::MAX),
                None => {
                    self.warn(
                        field.key.pos,
                        format!(
                            "`{full_key}` has no requests_per_unit, so it admits nothing; write \
                             `requests_per_unit: 0` if that is meant"
                        ),
                    );
                    0
                }
            };
            (unit, window_ms, requests_per_unit)
        };

        let shards = match shards {
            Some((f, n)) => {
                let n = u16::try_from(n).unwrap_or(1);
                let per_shard = requests_per_unit / u32::from(n);
                if n > 1 && !unlimited && per_shard < MIN_HITS_PER_SHARD {
                    self.warn(
                        f.value.pos,
                        format!(
                            "`{full_key}` splits {requests_per_unit} hits over {n} shards, \
                             {per_shard} per shard; with fewer than {MIN_HITS_PER_SHARD} per \
                             shard the limit gets uneven: lower `shards`"
                        ),
                    );
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
            failure_mode,
            unlimited,
            shadow_mode: flags.shadow_mode,
            quota_mode: flags.quota_mode,
            detailed_metric: flags.detailed_metric,
            value_to_metric: flags.value_to_metric,
            replaces,
        })
    }

    /// A `window` duration in milliseconds: whole seconds, 1 s up to a year.
    fn window(&self, field: Field<'_>) -> Result<u64, ConfigError> {
        let text = self.string(field)?.unwrap_or("");
        let duration = humantime::parse_duration(text).map_err(|_| {
            self.error(
                field.value.pos,
                format!("`window` must be a duration such as 30s, 90s, 5m or 1h, found `{text}`"),
            )
        })?;
        if duration < Duration::from_secs(1) {
            return Err(self.error(
                field.value.pos,
                format!("`window` must be at least 1s, found `{text}`"),
            ));
        }
        if duration.subsec_nanos() != 0 {
            return Err(self.error(
                field.value.pos,
                format!(
                    "`window` must be a whole number of seconds (e.g. 2s, not 1500ms), found \
                     `{text}`"
                ),
            ));
        }
        if duration > MAX_WINDOW {
            return Err(self.error(
                field.value.pos,
                format!("`window` must be at most 365d (one year), found `{text}`"),
            ));
        }
        Ok(duration.as_secs() * 1000)
    }

    fn replaces(
        &mut self,
        field: Field<'_>,
        own_name: Option<&str>,
    ) -> Result<Vec<String>, ConfigError> {
        let Value::Seq(items) = &field.value.value else {
            return Err(self.error(
                field.value.pos,
                format!(
                    "`replaces` must be a list such as `- name: other_limit`, found {}",
                    field.value.describe()
                ),
            ));
        };
        let mut names = Vec::with_capacity(items.len());
        for item in items {
            if !matches!(item.value, Value::Map(_)) {
                return Err(self.error(
                    item.pos,
                    format!(
                        "each `replaces` entry must be a mapping such as `- name: other_limit`, \
                         found {}",
                        item.describe()
                    ),
                ));
            }
            let fields = self.fields(item, Place::Replaces)?;
            let name = match fields.get("name") {
                Some(f) => self.string(f)?.unwrap_or(""),
                None => "",
            };
            if name.is_empty() {
                return Err(self.error(
                    item.pos,
                    "empty `replaces` entry; write `- name: <name of the limit to replace>`",
                ));
            }
            if Some(name) == own_name {
                return Err(self.error(
                    item.pos,
                    format!(
                        "a limit cannot replace itself: `{name}` is this limit's own `name`; \
                         name another limit"
                    ),
                ));
            }
            self.replaces.push((name.to_string(), item.pos));
            names.push(name.to_string());
        }
        Ok(names)
    }

    /// A `metadata` mapping; `None` when empty (as the reference).
    fn metadata(&self, field: Field<'_>) -> Result<Option<MetaValue>, ConfigError> {
        if !matches!(field.value.value, Value::Map(_)) {
            return Err(self.error(
                field.value.pos,
                format!(
                    "`metadata` must be a mapping such as `{{team: payments}}`, found {}",
                    field.value.describe()
                ),
            ));
        }
        match self.meta_value(field.value)? {
            MetaValue::Map(pairs) if pairs.is_empty() => Ok(None),
            value => Ok(Some(value)),
        }
    }

    fn meta_value(&self, node: &Node) -> Result<MetaValue, ConfigError> {
        Ok(match &node.value {
            Value::Scalar(scalar) => match scalar.resolve() {
                Ok(Resolved::Null) => MetaValue::Null,
                Ok(Resolved::Bool(b)) => MetaValue::Bool(b),
                Ok(Resolved::Int(i)) => MetaValue::Number(i as f64),
                Ok(Resolved::Float(f)) => MetaValue::Number(f),
                Ok(Resolved::Str(s)) => MetaValue::String(s.to_string()),
                Err(text) => {
                    return Err(self.error(
                        node.pos,
                        format!("`{text}` does not fit its tag; remove the tag or fix the value"),
                    ));
                }
            },
            Value::Seq(items) => MetaValue::List(
                items
                    .iter()
                    .map(|item| self.meta_value(item))
                    .collect::<Result<_, _>>()?,
            ),
            Value::Map(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (key, value) in pairs {
                    let Some(scalar) = key.scalar() else {
                        return Err(self.error(
                            key.pos,
                            format!("metadata keys must be strings, found {}", key.describe()),
                        ));
                    };
                    out.push((scalar.text.clone(), self.meta_value(value)?));
                }
                MetaValue::Map(out)
            }
        })
    }

    /// Every `replaces` must name a limit of this domain (so a typo does not silently replace
    /// nothing).
    fn check_replaces(&self) -> Result<(), ConfigError> {
        let names: HashSet<&str> = self
            .limits
            .iter()
            .filter_map(|limit| limit.name.as_deref())
            .collect();
        for (name, pos) in &self.replaces {
            if !names.contains(name.as_str()) {
                return Err(self.error(
                    *pos,
                    format!(
                        "`replaces` names `{name}`, but no limit in domain `{}` has \
                         `name: {name}`; fix the name or add it to the limit to replace",
                        self.domain
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Explains an unknown key: where it belongs if it is known elsewhere, else the closest known
/// key here and the full list.
fn unknown_key_message(name: &str, place: Place) -> String {
    if let Some(home) = Place::ALL
        .into_iter()
        .find(|other| *other != place && other.keys().contains(&name))
    {
        return format!(
            "`{name}` is not allowed {}; it belongs {}",
            place.inside(),
            home.home()
        );
    }
    let known = place.keys();
    let list = known
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match closest(name, known) {
        Some(guess) => format!(
            "unknown key `{name}` {}; did you mean `{guess}`? (allowed: {list})",
            place.inside()
        ),
        None => format!("unknown key `{name}` {} (allowed: {list})", place.inside()),
    }
}

/// The known key a typo most likely meant.
fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let squashed = squash(name);
    if let Some(k) = known.iter().find(|k| squash(k) == squashed) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edit_distance(&squashed, &squash(k)), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(closest("ratelimit", DESCRIPTOR_KEYS), Some("rate_limit"));
        assert_eq!(
            closest("requestsperunit", RATE_LIMIT_KEYS),
            Some("requests_per_unit")
        );
        assert_eq!(closest("descriptor", DESCRIPTOR_KEYS), Some("descriptors"));
        assert_eq!(closest("Shadow-Mode", DESCRIPTOR_KEYS), Some("shadow_mode"));
        assert_eq!(closest("algoritm", RATE_LIMIT_KEYS), Some("algorithm"));
        assert_eq!(closest("completely_else", DESCRIPTOR_KEYS), None);
    }

    #[test]
    fn misplaced_keys_say_where_they_belong() {
        assert_eq!(
            unknown_key_message("unit", Place::Descriptor),
            "`unit` is not allowed in a descriptor; it belongs inside `rate_limit`"
        );
        assert_eq!(
            unknown_key_message("key", Place::Top),
            "`key` is not allowed at the top level of the file; it belongs in a descriptor \
             (an item of `descriptors`)"
        );
    }
}
