//! The file source: a policy path (one YAML file, or a directory of them) read into a snapshot.
//!
//! Each file's text is parsed into a positioned YAML tree ([`super::yaml`]), read into a
//! [`Policy`] against the file schema (known keys, their types and ranges; [`super::schema`]),
//! and handed to the rules ([`super::rules`]), which build the snapshot. Every error names the
//! file and the `line:column` of the offending node.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::diagnostics::{ConfigError, Finding, Pos, unknown_key_message};
use super::rules::Snapshot;
use super::schema::{DescriptorNode, Given, MAX_SHARDS, Place, Policy, RateLimitNode, ReplaceNode};
use super::yaml::{self, Node, Resolved, Value};
use super::{Config, LoadOptions, MetaValue};

/// Loads a policy file, or every `*.yaml` / `*.yml` file of a directory in file-name order.
///
/// In a directory, names starting with `.` are skipped and symlinks are followed, which is what a
/// Kubernetes ConfigMap mount needs (its files are symlinks into a `..data` dir).
pub(super) fn load(path: &Path, options: LoadOptions) -> Result<Config, ConfigError> {
    let metadata = fs::metadata(path)
        .map_err(|e| ConfigError::file(path, format!("cannot read the config: {e}")))?;
    let mut snapshot = Snapshot::new(options);
    if metadata.is_dir() {
        let (files, skipped) = policy_files(path)?;
        if files.is_empty() {
            snapshot.warn(format!(
                "{}:1:1: warning: no policy files (*.yaml, *.yml) here; every request will be \
                 allowed",
                path.display()
            ));
        }
        let mut config = load_into(snapshot, &files)?;
        config.skipped = skipped;
        Ok(config)
    } else {
        let text = read_policy_file(path)?
            .ok_or_else(|| ConfigError::file(path, "cannot read the config: not found"))?;
        add(&mut snapshot, path, &text)?;
        finish(snapshot)
    }
}

/// Loads every one of `files`, in order; a file that vanished since it was listed is passed over.
pub(super) fn load_files(files: &[PathBuf], options: LoadOptions) -> Result<Config, ConfigError> {
    load_into(Snapshot::new(options), files)
}

fn load_into(mut snapshot: Snapshot<Pos>, files: &[PathBuf]) -> Result<Config, ConfigError> {
    for file in files {
        let Some(text) = read_policy_file(file)? else {
            continue;
        };
        add(&mut snapshot, file, &text)?;
    }
    finish(snapshot)
}

/// Loads one file's text; `file` names it in errors.
pub(super) fn from_text(file: &Path, text: &str) -> Result<Config, ConfigError> {
    let mut snapshot = Snapshot::default();
    add(&mut snapshot, file, text)?;
    finish(snapshot)
}

/// The snapshot of every file added, or the error of the file it is about.
fn finish(snapshot: Snapshot<Pos>) -> Result<Config, ConfigError> {
    snapshot
        .finish()
        .map_err(|(file, finding)| finding.into_error(&file))
}

/// Reads the policy in `text` and adds it to `snapshot`.
fn add(snapshot: &mut Snapshot<Pos>, file: &Path, text: &str) -> Result<(), ConfigError> {
    // A node the parser places at the end of input (an empty value after the last line break)
    // is reported on the last line, which is where an editor shows the end of the file.
    let located = |mut finding: Finding<Pos>| {
        finding.at = yaml::within(text, finding.at);
        finding.into_error(file)
    };
    let policy = read(text).map_err(located)?;
    snapshot.add(file, &policy).map_err(located)
}

/// The `*.yaml` / `*.yml` files of a directory (not its subdirectories), sorted by name, and the
/// other entries that were passed over (dot files aside), so that a user who expected them to
/// load can be told.
fn policy_files(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), ConfigError> {
    let entries = fs::read_dir(dir)
        .map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|e| ConfigError::file(dir, format!("cannot list the directory: {e}")))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            skipped.push(entry.path());
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
            skipped.push(entry.path());
            continue;
        }
        let path = entry.path();
        // `fs::metadata` follows symlinks; a directory named `x.yaml` is not a policy file.
        match fs::metadata(&path) {
            Ok(metadata) if metadata.is_file() => files.push(path),
            Ok(_) => skipped.push(path),
            // A ConfigMap update can leave a dangling link for a moment; it is no file of ours.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(ConfigError::file(&path, format!("cannot read: {e}"))),
        }
    }
    files.sort();
    skipped.sort();
    Ok((files, skipped))
}

/// A file's text; `None` if it vanished since it was listed.
fn read_policy_file(path: &Path) -> Result<Option<String>, ConfigError> {
    match fs::read(path) {
        Ok(bytes) => String::from_utf8(bytes).map(Some).map_err(|e| {
            let prefix = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let text = String::from_utf8_lossy(prefix);
            let line = text.matches('\n').count() + 1;
            let column = text.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            Finding::new(Pos { line, column }, "the file is not UTF-8 text").into_error(path)
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ConfigError::file(path, format!("cannot read: {e}"))),
    }
}

/// What reading a file into the schema answers: the value, or the first node that does not fit.
type Read<T> = Result<T, Finding<Pos>>;

/// Reads one file's text, `source`, into a policy, holding every mapping to the keys the schema allows at
/// its place and every value to its key's type.
fn read(source: &str) -> Read<Policy<Pos>> {
    let root = yaml::parse(source).map_err(|e| Finding::new(e.pos, e.message))?;
    let Some(root) = root else {
        return Err(Finding::new(
            Pos { line: 1, column: 1 },
            "the file is empty; a policy file needs `domain: <name>` and `descriptors:`",
        ));
    };
    if !matches!(root.value, Value::Map(_)) {
        return Err(Finding::new(
            root.pos,
            format!(
                "a policy file must be a mapping with `domain` and `descriptors`, found {}",
                root.describe()
            ),
        ));
    }
    let fields = fields(&root, Place::Top)?;
    Ok(Policy {
        at: root.pos,
        domain: fields.get("domain").map(|f| given(f, text)).transpose()?,
        descriptors: fields
            .get("descriptors")
            .map(|f| given(f, descriptors))
            .transpose()?,
    })
}

/// A key and its value in a mapping.
#[derive(Debug, Clone, Copy)]
struct Field<'n> {
    name: &'n str,
    key: &'n Node,
    value: &'n Node,
}

/// The checked keys of one mapping.
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

/// `field` read with `read`, keeping where its key and value are.
fn given<'n, T>(field: Field<'n>, read: impl FnOnce(Field<'n>) -> Read<T>) -> Read<Given<T, Pos>> {
    Ok(Given {
        value: read(field)?,
        key_at: field.key.pos,
        at: field.value.pos,
    })
}

/// The keys of a mapping at `place`, each a string the schema allows there.
fn fields(node: &Node, place: Place) -> Read<Fields<'_>> {
    let Value::Map(pairs) = &node.value else {
        return Err(Finding::new(
            node.pos,
            format!("expected a mapping, found {}", node.describe()),
        ));
    };
    let mut fields = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        let name = match key.scalar().map(|s| s.resolve()) {
            Some(Ok(Resolved::Str(name))) => name,
            Some(_) => {
                return Err(Finding::new(
                    key.pos,
                    format!(
                        "key `{}` is not a string; keys are names such as `{}`",
                        key.scalar().map_or("", |s| s.text.as_str()),
                        place.keys()[0]
                    ),
                ));
            }
            None => {
                return Err(Finding::new(
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
            return Err(Finding::new(key.pos, unknown_key_message(name, place)));
        }
        fields.push(Field { name, key, value });
    }
    Ok(Fields(fields))
}

/// A string field; `None` when null. Scalars of other types are read as written, as the
/// reference does (`value: 404` is the string "404").
fn string<'n>(field: Field<'n>) -> Read<Option<&'n str>> {
    match &field.value.value {
        Value::Scalar(scalar) => match scalar.resolve() {
            Ok(Resolved::Null) => Ok(None),
            _ => Ok(Some(scalar.text.as_str())),
        },
        _ => Err(Finding::new(
            field.value.pos,
            format!(
                "`{}` must be a string, found {}",
                field.name,
                field.value.describe()
            ),
        )),
    }
}

/// A string field's text; empty when null.
fn text(field: Field<'_>) -> Read<String> {
    Ok(string(field)?.unwrap_or("").to_string())
}

/// A boolean field; false when absent or null.
fn boolean(field: Option<Field<'_>>) -> Read<bool> {
    let Some(field) = field else { return Ok(false) };
    match field.value.scalar().map(|s| s.resolve()) {
        Some(Ok(Resolved::Bool(b))) => Ok(b),
        Some(Ok(Resolved::Null)) => Ok(false),
        _ => Err(Finding::new(
            field.value.pos,
            format!(
                "`{}` must be true or false, found {}",
                field.name,
                field.value.describe()
            ),
        )),
    }
}

/// An integer field within `min..=max`.
fn integer(field: Field<'_>, min: i128, max: i128) -> Read<i128> {
    match field.value.scalar().map(|s| s.resolve()) {
        Some(Ok(Resolved::Int(i))) if (min..=max).contains(&i) => Ok(i),
        _ => Err(Finding::new(
            field.value.pos,
            format!(
                "`{}` must be a whole number from {min} to {max}, found {}",
                field.name,
                field.value.describe()
            ),
        )),
    }
}

/// A `descriptors` list.
fn descriptors(field: Field<'_>) -> Read<Vec<DescriptorNode<Pos>>> {
    let Value::Seq(items) = &field.value.value else {
        return Err(Finding::new(
            field.value.pos,
            format!(
                "`descriptors` must be a list of descriptors (`- key: ...`), found {}",
                field.value.describe()
            ),
        ));
    };
    items.iter().map(descriptor).collect()
}

/// One item of a `descriptors` list.
fn descriptor(item: &Node) -> Read<DescriptorNode<Pos>> {
    if !matches!(item.value, Value::Map(_)) {
        return Err(Finding::new(
            item.pos,
            format!(
                "each item of `descriptors` must be a mapping such as `- key: user`, found {}",
                item.describe()
            ),
        ));
    }
    let fields = fields(item, Place::Descriptor)?;
    Ok(DescriptorNode {
        at: item.pos,
        // A null `key` is an empty one, which the rules refuse with a hint.
        key: fields.raw("key").map(|f| given(f, text)).transpose()?,
        value: match fields.get("value") {
            Some(f) => string(f)?.unwrap_or("").to_string(),
            None => String::new(),
        },
        share_threshold: fields
            .get("share_threshold")
            .map(|f| given(f, |f| boolean(Some(f))))
            .transpose()?,
        shadow_mode: boolean(fields.get("shadow_mode"))?,
        quota_mode: boolean(fields.get("quota_mode"))?,
        detailed_metric: boolean(fields.get("detailed_metric"))?,
        value_to_metric: boolean(fields.get("value_to_metric"))?,
        rate_limit: fields
            .get("rate_limit")
            .map(|f| given(f, rate_limit))
            .transpose()?,
        rate_limits: fields
            .get("rate_limits")
            .map(|f| given(f, rate_limits))
            .transpose()?,
        metadata: fields.get("metadata").map(metadata).transpose()?,
        descriptors: fields
            .get("descriptors")
            .map(|f| given(f, descriptors))
            .transpose()?,
    })
}

/// A `rate_limit` mapping.
fn rate_limit(field: Field<'_>) -> Read<RateLimitNode<Pos>> {
    if !matches!(field.value.value, Value::Map(_)) {
        return Err(Finding::new(
            field.value.pos,
            format!(
                "`rate_limit` must be a mapping such as `{{unit: minute, requests_per_unit: \
                 10}}`, found {}",
                field.value.describe()
            ),
        ));
    }
    limit_fields(field.value, Place::RateLimit)
}

/// A `rate_limits` list of `rate_limit` mappings, each located at its item.
fn rate_limits(field: Field<'_>) -> Read<Vec<Given<RateLimitNode<Pos>, Pos>>> {
    let Value::Seq(items) = &field.value.value else {
        return Err(Finding::new(
            field.value.pos,
            format!(
                "`rate_limits` must be a list of limits such as `- {{unit: second, \
                 requests_per_unit: 10}}`, found {}",
                field.value.describe()
            ),
        ));
    };
    let mut limits = Vec::with_capacity(items.len());
    for item in items {
        if !matches!(item.value, Value::Map(_)) {
            return Err(Finding::new(
                item.pos,
                format!(
                    "each item of `rate_limits` must be a mapping such as `- {{unit: second, \
                     requests_per_unit: 10}}`, found {}",
                    item.describe()
                ),
            ));
        }
        limits.push(Given {
            value: limit_fields(item, Place::RateLimits)?,
            key_at: item.pos,
            at: item.pos,
        });
    }
    Ok(limits)
}

/// The keys of one limit's mapping, `node`, at `place` (`rate_limit` or a `rate_limits` item).
fn limit_fields(node: &Node, place: Place) -> Read<RateLimitNode<Pos>> {
    let fields = fields(node, place)?;
    let optional_text = |name: &str| -> Read<Option<Given<String, Pos>>> {
        fields.get(name).map(|f| given(f, text)).transpose()
    };
    Ok(RateLimitNode {
        unlimited: boolean(fields.get("unlimited"))?,
        unit: optional_text("unit")?,
        window: optional_text("window")?,
        requests_per_unit: fields
            .get("requests_per_unit")
            .map(|f| {
                given(f, |f| {
                    let n = integer(f, 0, i128::from(u32::MAX))?;
                    Ok(u32::try_from(n).unwrap_or(u32::MAX))
                })
            })
            .transpose()?,
        name: match fields.get("name") {
            Some(f) => string(f)?.map(str::to_string),
            None => None,
        },
        replaces: match fields.get("replaces") {
            Some(f) => replaces(f)?,
            None => Vec::new(),
        },
        algorithm: optional_text("algorithm")?,
        shards: fields
            .get("shards")
            .map(|f| {
                given(f, |f| {
                    let n = integer(f, 1, i128::from(MAX_SHARDS))?;
                    Ok(u16::try_from(n).unwrap_or(1))
                })
            })
            .transpose()?,
        failure_mode: optional_text("failure_mode")?,
        counting: optional_text("counting")?,
        lease: boolean(fields.get("lease"))?,
    })
}

/// A `replaces` list of `{name}` mappings.
fn replaces(field: Field<'_>) -> Read<Vec<ReplaceNode<Pos>>> {
    let Value::Seq(items) = &field.value.value else {
        return Err(Finding::new(
            field.value.pos,
            format!(
                "`replaces` must be a list such as `- name: other_limit`, found {}",
                field.value.describe()
            ),
        ));
    };
    let mut entries = Vec::with_capacity(items.len());
    for item in items {
        if !matches!(item.value, Value::Map(_)) {
            return Err(Finding::new(
                item.pos,
                format!(
                    "each `replaces` entry must be a mapping such as `- name: other_limit`, \
                     found {}",
                    item.describe()
                ),
            ));
        }
        let fields = fields(item, Place::Replaces)?;
        let name = match fields.get("name") {
            Some(f) => string(f)?.unwrap_or(""),
            None => "",
        };
        entries.push(ReplaceNode {
            at: item.pos,
            name: name.to_string(),
        });
    }
    Ok(entries)
}

/// A `metadata` mapping, any values inside.
fn metadata(field: Field<'_>) -> Read<MetaValue> {
    if !matches!(field.value.value, Value::Map(_)) {
        return Err(Finding::new(
            field.value.pos,
            format!(
                "`metadata` must be a mapping such as `{{team: payments}}`, found {}",
                field.value.describe()
            ),
        ));
    }
    meta_value(field.value)
}

/// Any YAML value as metadata.
fn meta_value(node: &Node) -> Read<MetaValue> {
    Ok(match &node.value {
        Value::Scalar(scalar) => match scalar.resolve() {
            Ok(Resolved::Null) => MetaValue::Null,
            Ok(Resolved::Bool(b)) => MetaValue::Bool(b),
            Ok(Resolved::Int(i)) => MetaValue::Number(i as f64),
            Ok(Resolved::Float(f)) => MetaValue::Number(f),
            Ok(Resolved::Str(s)) => MetaValue::String(s.to_string()),
            Err(text) => {
                return Err(Finding::new(
                    node.pos,
                    format!("`{text}` does not fit its tag; remove the tag or fix the value"),
                ));
            }
        },
        Value::Seq(items) => MetaValue::List(items.iter().map(meta_value).collect::<Read<_>>()?),
        Value::Map(pairs) => {
            let mut out = Vec::with_capacity(pairs.len());
            for (key, value) in pairs {
                let Some(scalar) = key.scalar() else {
                    return Err(Finding::new(
                        key.pos,
                        format!("metadata keys must be strings, found {}", key.describe()),
                    ));
                };
                out.push((scalar.text.clone(), meta_value(value)?));
            }
            MetaValue::Map(out)
        }
    })
}
