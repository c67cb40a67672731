//! One push, converted: the `RateLimitConfig` resources of a `DiscoveryResponse` become the same
//! schema tree a policy file becomes ([`Policy`]), located by field paths instead of lines, and
//! go through the same rules into the same [`Config`] snapshot. Nothing here decides whether a
//! policy is valid beyond what the message's types say; the rules do.
//!
//! The message has a field for every key of the reference's format except `share_threshold` and
//! `value_to_metric` (which the reference does not carry over xDS either). tollgate's extensions
//! arrive in `RateLimitPolicy.tollgate` (`LimitExtension`) with the spellings a file uses;
//! [`ExtensionDefaults`] fills in what a control plane that does not know them leaves out. A
//! file's `rate_limits` list arrives as a `rate_limit` whose extension lists further limits
//! (`LimitExtension.rate_limits`): the node gets the list `[rate_limit, further limits...]`.

use std::fmt;
use std::path::Path;

use prost::Message;
use prost_types::value::Kind;

use super::super::diagnostics::{Finding, Location};
use super::super::rules::Snapshot;
use super::super::schema::{
    DescriptorNode, Given, LimitList, MAX_SHARDS, Policy, RateLimitNode, ReplaceNode,
};
use super::super::{Config, LoadOptions, MetaValue};
use crate::proto::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace, RateLimitUnit,
};
use crate::proto::tollgate::config::v1::FurtherLimit;
use crate::window::Algorithm;

/// The type URL of the resources the client subscribes to.
pub const RATE_LIMIT_CONFIG_TYPE_URL: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// What a limit delivered over xDS gets when its `tollgate` extension leaves a key out, for
/// control planes (Envoy Gateway, Envoy AI Gateway) that cannot set the extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExtensionDefaults {
    /// The algorithm of a limit that names none (`--xds-default-algorithm`); `None` keeps
    /// tollgate's default, the sliding window counter.
    pub algorithm: Option<Algorithm>,
}

/// Why a push was refused: which resource, where in it, and what is wrong. Its text is the NACK's
/// `error_detail.message`, `<resource>: <field path>: <message>`, as precise as a file's
/// `<file>:<line>:<column>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{resource}: {}{message}", if at.is_empty() { String::new() } else { format!("{at}: ") })]
pub struct Rejection {
    /// The resource's `name`, or `resources[<index>]` when it has none.
    pub resource: String,
    /// The field path inside the resource (`descriptors[0].rate_limit.unit`); empty for the
    /// resource as a whole.
    pub at: String,
    /// What is wrong and, where it helps, what to send instead.
    pub message: String,
}

/// Where a node sits inside a `RateLimitConfig`: the path of fields from the resource down, as
/// `descriptors[1].descriptors[0].rate_limit.unit`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct FieldPath(String);

impl FieldPath {
    /// The field `name` inside this one.
    fn field(&self, name: &str) -> FieldPath {
        if self.0.is_empty() {
            FieldPath(name.to_string())
        } else {
            FieldPath(format!("{}.{name}", self.0))
        }
    }

    /// Item `index` of this repeated field.
    fn item(&self, index: usize) -> FieldPath {
        FieldPath(format!("{}[{index}]", self.0))
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            f.write_str("(resource)")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl Location for FieldPath {
    fn describe(&self) -> String {
        format!("`{self}`")
    }
}

/// The snapshot of one push: every resource decoded, converted and checked, all or nothing.
/// Each push is the whole set, so a domain absent from `resources` is absent from the snapshot.
pub fn snapshot(
    resources: &[prost_types::Any],
    defaults: &ExtensionDefaults,
    options: LoadOptions,
) -> Result<Config, Rejection> {
    let mut snapshot = Snapshot::new(options);
    for (index, any) in resources.iter().enumerate() {
        let config = decode(index, any)?;
        let resource = if config.name.is_empty() {
            format!("resources[{index}]")
        } else {
            config.name.clone()
        };
        let reject = |finding: Finding<FieldPath>| Rejection {
            resource: resource.clone(),
            at: finding.at.0,
            message: finding.message,
        };
        let policy = policy(&config, defaults).map_err(reject)?;
        snapshot
            .add(Path::new(&resource), &policy)
            .map_err(reject)?;
    }
    snapshot.finish().map_err(|(resource, finding)| Rejection {
        resource: resource.display().to_string(),
        at: finding.at.0,
        message: finding.message,
    })
}

/// Unpacks one `Any`, which must hold a `RateLimitConfig`.
fn decode(index: usize, any: &prost_types::Any) -> Result<RateLimitConfig, Rejection> {
    let resource = format!("resources[{index}]");
    // A type URL names the message after its last `/`, whatever the host before it.
    let expected = RATE_LIMIT_CONFIG_TYPE_URL.rsplit('/').next().unwrap_or("");
    let found = any.type_url.rsplit('/').next().unwrap_or("");
    if found != expected {
        return Err(Rejection {
            resource,
            at: String::new(),
            message: format!(
                "holds `{}`, not a RateLimitConfig ({RATE_LIMIT_CONFIG_TYPE_URL})",
                any.type_url
            ),
        });
    }
    RateLimitConfig::decode(any.value.as_slice()).map_err(|error| Rejection {
        resource,
        at: String::new(),
        message: format!("is not a valid RateLimitConfig message: {error}"),
    })
}

/// The schema tree of one resource.
fn policy(
    config: &RateLimitConfig,
    defaults: &ExtensionDefaults,
) -> Result<Policy<FieldPath>, Finding<FieldPath>> {
    let root = FieldPath::default();
    let list = root.field("descriptors");
    Ok(Policy {
        at: root.clone(),
        domain: Some(given(config.domain.clone(), root.field("domain"))),
        descriptors: Some(given(
            descriptors(&config.descriptors, &list, defaults)?,
            list,
        )),
    })
}

/// A value with both of its locations at `at` (a message has no separate key to point at).
fn given<T>(value: T, at: FieldPath) -> Given<T, FieldPath> {
    Given {
        value,
        key_at: at.clone(),
        at,
    }
}

/// The nodes of a `descriptors` field at `path`.
fn descriptors(
    list: &[RateLimitDescriptor],
    path: &FieldPath,
    defaults: &ExtensionDefaults,
) -> Result<Vec<DescriptorNode<FieldPath>>, Finding<FieldPath>> {
    list.iter()
        .enumerate()
        .map(|(index, node)| descriptor(node, &path.item(index), defaults))
        .collect()
}

/// One descriptor node at `at`.
fn descriptor(
    node: &RateLimitDescriptor,
    at: &FieldPath,
    defaults: &ExtensionDefaults,
) -> Result<DescriptorNode<FieldPath>, Finding<FieldPath>> {
    let children = at.field("descriptors");
    let (rate_limit, rate_limits) = match &node.rate_limit {
        Some(policy) => limits(policy, &at.field("rate_limit"), defaults)?,
        None => (None, None),
    };
    Ok(DescriptorNode {
        at: at.clone(),
        key: Some(given(node.key.clone(), at.field("key"))),
        value: node.value.clone(),
        rate_limit,
        rate_limits,
        descriptors: if node.descriptors.is_empty() {
            None
        } else {
            Some(given(
                descriptors(&node.descriptors, &children, defaults)?,
                children,
            ))
        },
        shadow_mode: node.shadow_mode,
        quota_mode: node.quota_mode,
        detailed_metric: node.detailed_metric,
        value_to_metric: false,
        share_threshold: None,
        metadata: node.metadata.as_ref().map(meta_struct),
    })
}

/// A node's limits: its `rate_limit`, or its `rate_limits` list (never both).
type NodeLimits = (
    Option<Given<RateLimitNode<FieldPath>, FieldPath>>,
    Option<LimitList<FieldPath>>,
);

/// A node's limits: its `rate_limit` at `at` alone, or, when the extension lists further limits,
/// a `rate_limits` list of the `rate_limit` then the further ones.
fn limits(
    policy: &RateLimitPolicy,
    at: &FieldPath,
    defaults: &ExtensionDefaults,
) -> Result<NodeLimits, Finding<FieldPath>> {
    let first = given(rate_limit(policy, at, defaults)?, at.clone());
    let further = policy
        .tollgate
        .as_ref()
        .map_or(&[][..], |extension| extension.rate_limits.as_slice());
    if further.is_empty() {
        return Ok((Some(first), None));
    }
    let list_at = at.field("tollgate").field("rate_limits");
    let mut list = Vec::with_capacity(further.len() + 1);
    list.push(first);
    for (index, limit) in further.iter().enumerate() {
        let item_at = list_at.item(index);
        list.push(given(further_limit(limit, &item_at, defaults)?, item_at));
    }
    Ok((None, Some(given(list, list_at))))
}

/// One further limit at `at`, read as the `RateLimitPolicy` it stands for.
fn further_limit(
    limit: &FurtherLimit,
    at: &FieldPath,
    defaults: &ExtensionDefaults,
) -> Result<RateLimitNode<FieldPath>, Finding<FieldPath>> {
    if limit
        .tollgate
        .as_ref()
        .is_some_and(|extension| !extension.rate_limits.is_empty())
    {
        return Err(Finding::new(
            at.field("tollgate").field("rate_limits"),
            "a further limit cannot list further limits of its own; list every limit of the \
             descriptor in its `rate_limit.tollgate.rate_limits`",
        ));
    }
    let policy = RateLimitPolicy {
        unit: limit.unit,
        requests_per_unit: limit.requests_per_unit,
        unlimited: false,
        name: limit.name.clone(),
        replaces: limit
            .replaces
            .iter()
            .map(|name| RateLimitReplace { name: name.clone() })
            .collect(),
        tollgate: limit.tollgate.clone(),
    };
    rate_limit(&policy, at, defaults)
}

/// A `rate_limit` at `at`, with tollgate's extension if the control plane set it.
fn rate_limit(
    policy: &RateLimitPolicy,
    at: &FieldPath,
    defaults: &ExtensionDefaults,
) -> Result<RateLimitNode<FieldPath>, Finding<FieldPath>> {
    let extension = policy.tollgate.clone().unwrap_or_default();
    let ext_at = at.field("tollgate");
    let text = |value: &str, field: &str| -> Option<Given<String, FieldPath>> {
        (!value.is_empty()).then(|| given(value.to_string(), ext_at.field(field)))
    };
    let shards = match extension.shards {
        0 => None,
        n => match u16::try_from(n) {
            Ok(n) if (1..=MAX_SHARDS).contains(&n) => Some(given(n, ext_at.field("shards"))),
            _ => {
                return Err(Finding::new(
                    ext_at.field("shards"),
                    format!("`shards` must be a whole number from 1 to {MAX_SHARDS}, found {n}"),
                ));
            }
        },
    };
    let algorithm = text(&extension.algorithm, "algorithm").or_else(|| {
        defaults.algorithm.map(|algorithm| {
            given(
                algorithm.as_str().to_string(),
                FieldPath("--xds-default-algorithm".to_string()),
            )
        })
    });
    Ok(RateLimitNode {
        unit: unit_name(policy.unit).map(|unit| given(unit, at.field("unit"))),
        requests_per_unit: Some(given(
            policy.requests_per_unit,
            at.field("requests_per_unit"),
        )),
        unlimited: policy.unlimited,
        name: (!policy.name.is_empty()).then(|| policy.name.clone()),
        replaces: policy
            .replaces
            .iter()
            .enumerate()
            .map(|(index, replace)| ReplaceNode {
                at: at.field("replaces").item(index),
                name: replace.name.clone(),
            })
            .collect(),
        algorithm,
        window: text(&extension.window, "window"),
        shards,
        failure_mode: text(&extension.failure_mode, "failure_mode"),
        counting: text(&extension.counting, "counting"),
        lease: extension.lease,
    })
}

/// The unit as a file spells it; `None` for UNKNOWN (no unit given). A number outside the enum
/// is passed on as written, for the rules to refuse by name.
fn unit_name(unit: i32) -> Option<String> {
    let name = match RateLimitUnit::try_from(unit) {
        Ok(RateLimitUnit::Unknown) => return None,
        Ok(RateLimitUnit::Second) => "second",
        Ok(RateLimitUnit::Minute) => "minute",
        Ok(RateLimitUnit::Hour) => "hour",
        Ok(RateLimitUnit::Day) => "day",
        Ok(RateLimitUnit::Week) => "week",
        Ok(RateLimitUnit::Month) => "month",
        Ok(RateLimitUnit::Year) => "year",
        Err(_) => return Some(unit.to_string()),
    };
    Some(name.to_string())
}

/// A `google.protobuf.Struct` as metadata.
fn meta_struct(value: &prost_types::Struct) -> MetaValue {
    MetaValue::Map(
        value
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), meta_value(value)))
            .collect(),
    )
}

fn meta_value(value: &prost_types::Value) -> MetaValue {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => MetaValue::Null,
        Some(Kind::NumberValue(n)) => MetaValue::Number(*n),
        Some(Kind::StringValue(s)) => MetaValue::String(s.clone()),
        Some(Kind::BoolValue(b)) => MetaValue::Bool(*b),
        Some(Kind::StructValue(s)) => meta_struct(s),
        Some(Kind::ListValue(list)) => {
            MetaValue::List(list.values.iter().map(meta_value).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::descriptor::{Entry, Unit};
    use crate::proto::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use crate::proto::tollgate::config::v1::{LimitExtension, LimitUnit};

    fn pack(config: &RateLimitConfig) -> prost_types::Any {
        prost_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.to_string(),
            value: config.encode_to_vec(),
        }
    }

    fn limit(unit: RateLimitUnit, requests: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: requests,
            ..Default::default()
        })
    }

    fn node(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.to_string(),
            value: value.to_string(),
            rate_limit,
            ..Default::default()
        }
    }

    fn resource(
        name: &str,
        domain: &str,
        descriptors: Vec<RateLimitDescriptor>,
    ) -> RateLimitConfig {
        RateLimitConfig {
            name: name.to_string(),
            domain: domain.to_string(),
            descriptors,
        }
    }

    fn load(configs: &[RateLimitConfig]) -> Result<Config, Rejection> {
        let resources: Vec<_> = configs.iter().map(pack).collect();
        snapshot(
            &resources,
            &ExtensionDefaults::default(),
            LoadOptions::default(),
        )
    }

    fn entries(pairs: &[(&str, &str)]) -> Vec<Entry> {
        pairs.iter().map(|(k, v)| Entry::new(*k, *v)).collect()
    }

    /// The reference's own nested example, field for field: every flag lands on its limit.
    #[test]
    fn every_reference_field_reaches_the_snapshot() {
        let mut k2 = node("k2", "", None);
        k2.rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        k2.descriptors = vec![node("k3", "v3", limit(RateLimitUnit::Week, 15))];
        let mut shadowed = node("j1", "v2", limit(RateLimitUnit::Day, 15));
        shadowed.shadow_mode = true;
        shadowed.quota_mode = true;
        shadowed.detailed_metric = true;
        shadowed.metadata = Some(prost_types::Struct {
            fields: BTreeMap::from([
                (
                    "team".to_string(),
                    prost_types::Value {
                        kind: Some(Kind::StringValue("edge".into())),
                    },
                ),
                (
                    "weight".to_string(),
                    prost_types::Value {
                        kind: Some(Kind::NumberValue(2.5)),
                    },
                ),
            ]),
        });
        let mut named = node("k1", "v1", limit(RateLimitUnit::Minute, 10));
        named.rate_limit.as_mut().unwrap().name = "per_k1".into();
        named.descriptors = vec![k2];
        let mut replacing = node("k4", "", limit(RateLimitUnit::Hour, 3));
        replacing.rate_limit.as_mut().unwrap().replaces = vec![RateLimitReplace {
            name: "per_k1".into(),
        }];
        let config = load(&[
            resource("foo", "foo", vec![named, shadowed, replacing]),
            resource(
                "bar",
                "bar",
                vec![node("k1", "v1", limit(RateLimitUnit::Month, 100))],
            ),
        ])
        .unwrap();

        let keys: Vec<&str> = config
            .limits()
            .iter()
            .map(|l| l.full_key.as_str())
            .collect();
        assert_eq!(
            keys,
            [
                "bar.k1_v1",
                "foo.j1_v2",
                "foo.k1_v1",
                "foo.k1_v1.k2",
                "foo.k1_v1.k2.k3_v3",
                "foo.k4"
            ]
        );
        let foo = config.domain("foo").unwrap();
        assert_eq!(foo.file(), Path::new("foo"));
        let matched = foo.resolve(&entries(&[("j1", "v2")])).unwrap();
        let shadow = &matched.limits[0];
        assert!(shadow.shadow_mode && shadow.quota_mode && shadow.detailed_metric);
        assert_eq!(
            (shadow.unit, shadow.requests_per_unit),
            (Some(Unit::Day), 15)
        );
        assert_eq!(
            matched.metadata,
            Some(&MetaValue::Map(vec![
                ("team".into(), MetaValue::String("edge".into())),
                ("weight".into(), MetaValue::Number(2.5)),
            ]))
        );
        let unlimited = foo.resolve(&entries(&[("k1", "v1"), ("k2", "x")])).unwrap();
        assert!(unlimited.limits[0].unlimited);
        let week = foo
            .resolve(&entries(&[("k1", "v1"), ("k2", "x"), ("k3", "v3")]))
            .unwrap();
        assert_eq!(week.limits[0].unit, Some(Unit::Week));
        let named = foo.resolve(&entries(&[("k1", "v1")])).unwrap();
        assert_eq!(named.limits[0].name.as_deref(), Some("per_k1"));
        let replacing = foo.resolve(&entries(&[("k4", "any")])).unwrap();
        assert_eq!(replacing.limits[0].replaces, vec!["per_k1".to_string()]);
        assert_eq!(
            config.domain("bar").unwrap().limits()[0].unit,
            Some(Unit::Month)
        );
    }

    #[test]
    fn an_empty_push_is_an_empty_snapshot() {
        let config = load(&[]).unwrap();
        assert!(config.is_empty());
    }

    #[test]
    fn errors_name_the_resource_and_the_field_path() {
        let mut parent = node("user", "", None);
        parent.descriptors = vec![
            node("path", "/a", limit(RateLimitUnit::Minute, 1)),
            node("path", "/b", limit(RateLimitUnit::Unknown, 1)),
        ];
        let error = load(&[resource("edge-limits", "edge", vec![parent])]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "edge-limits: descriptors[0].descriptors[1].rate_limit: `rate_limit` needs a `unit` \
             (second, minute, hour, day, week, month, year) or a `window` (e.g. `window: 90s`), \
             or `unlimited: true`"
        );

        let out_of_range = node("user", "", limit(RateLimitUnit::Minute, 1))
            .rate_limit
            .map(|mut policy| {
                policy.unit = 9;
                policy
            });
        let error =
            load(&[resource("x", "edge", vec![node("user", "", out_of_range)])]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "x: descriptors[0].rate_limit.unit: unknown unit `9`; write second, minute, hour, \
             day, week, month or year (or `window: 90s` for other lengths)"
        );

        let error = load(&[resource("", "", vec![])]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "resources[0]: domain: `domain` is empty; write `domain: <name>` (the domain Envoy \
             sends)"
        );

        let twice = vec![
            node("user", "alice", limit(RateLimitUnit::Minute, 1)),
            node("user", "alice", limit(RateLimitUnit::Minute, 2)),
        ];
        let error = load(&[resource("dup", "edge", twice)]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "dup: descriptors[1]: duplicate descriptor `edge.user_alice` (first at \
             `descriptors[0]`); merge the two"
        );

        let mut unlimited_with_unit = limit(RateLimitUnit::Second, 0).unwrap();
        unlimited_with_unit.unlimited = true;
        let error = load(&[resource(
            "u",
            "edge",
            vec![node("k", "", Some(unlimited_with_unit))],
        )])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "u: descriptors[0].rate_limit.unit: `unlimited: true` takes no `unit`; remove `unit` \
             or `unlimited`"
        );

        let mut self_replacing = limit(RateLimitUnit::Second, 1).unwrap();
        self_replacing.name = "me".into();
        self_replacing.replaces = vec![RateLimitReplace { name: "me".into() }];
        let error = load(&[resource(
            "r",
            "edge",
            vec![node("k", "", Some(self_replacing))],
        )])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "r: descriptors[0].rate_limit.replaces[0]: a limit cannot replace itself: `me` is \
             this limit's own `name`; name another limit"
        );

        let error =
            load(&[resource("a", "edge", vec![]), resource("b", "edge", vec![])]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "b: domain: domain `edge` is already declared in a:domain; keep each domain in one \
             file (or merge the files' domains with --merge-domains)"
        );
    }

    #[test]
    fn a_resource_of_another_type_or_undecodable_is_refused() {
        let wrong = prost_types::Any {
            type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
            value: Vec::new(),
        };
        let error = snapshot(
            &[wrong],
            &ExtensionDefaults::default(),
            LoadOptions::default(),
        )
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "resources[0]: holds `type.googleapis.com/envoy.config.cluster.v3.Cluster`, not a \
             RateLimitConfig (type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig)"
        );
        let garbage = prost_types::Any {
            type_url: RATE_LIMIT_CONFIG_TYPE_URL.into(),
            value: vec![0x0a, 0xff],
        };
        let error = snapshot(
            &[garbage],
            &ExtensionDefaults::default(),
            LoadOptions::default(),
        )
        .unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("resources[0]: is not a valid RateLimitConfig message: "),
            "{error}"
        );
    }

    #[test]
    fn tollgates_extension_and_defaults() {
        let mut policy = limit(RateLimitUnit::Unknown, 1000).unwrap();
        policy.tollgate = Some(LimitExtension {
            algorithm: "sliding_window_log".into(),
            window: "90s".into(),
            shards: 4,
            failure_mode: "deny".into(),
            counting: "all".into(),
            lease: true,
            rate_limits: Vec::new(),
        });
        let plain = node("user", "", limit(RateLimitUnit::Minute, 5));
        let config = load(&[resource(
            "ext",
            "edge",
            vec![node("tenant", "", Some(policy)), plain.clone()],
        )])
        .unwrap();
        let domain = config.domain("edge").unwrap();
        let tenant = &domain
            .resolve(&entries(&[("tenant", "t1")]))
            .unwrap()
            .limits[0];
        assert_eq!(tenant.algorithm, Algorithm::SlidingWindowLog);
        assert_eq!((tenant.window_ms, tenant.unit), (90_000, None));
        assert_eq!(tenant.shards, 4);
        assert!(tenant.lease, "the extension's lease reaches the limit");
        assert_eq!(tenant.failure_mode, Some(crate::config::FailureMode::Deny));
        assert_eq!(tenant.counting, Some(crate::window::Counting::All));
        let user = &domain.resolve(&entries(&[("user", "u")])).unwrap().limits[0];
        assert_eq!(user.algorithm, Algorithm::SlidingWindowCounter);

        let defaults = ExtensionDefaults {
            algorithm: Some(Algorithm::SlidingWindowLog),
        };
        let config = snapshot(
            &[pack(&resource("d", "edge", vec![plain]))],
            &defaults,
            LoadOptions::default(),
        )
        .unwrap();
        let user = config.domain("edge").unwrap().limits()[0].clone();
        assert_eq!(user.algorithm, Algorithm::SlidingWindowLog);

        let mut bad = limit(RateLimitUnit::Minute, 5).unwrap();
        bad.tollgate = Some(LimitExtension {
            algorithm: "fixed_window".into(),
            ..Default::default()
        });
        let error = load(&[resource(
            "e",
            "edge",
            vec![node("k", "", Some(bad.clone()))],
        )])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "e: descriptors[0].rate_limit.tollgate.algorithm: unknown algorithm `fixed_window`; \
             write sliding_window_counter (the default) or sliding_window_log"
        );
        bad.tollgate = Some(LimitExtension {
            shards: 65,
            ..Default::default()
        });
        let error = load(&[resource(
            "e",
            "edge",
            vec![node("k", "", Some(bad.clone()))],
        )])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "e: descriptors[0].rate_limit.tollgate.shards: `shards` must be a whole number from \
             1 to 64, found 65"
        );
        bad.tollgate = Some(LimitExtension {
            window: "90s".into(),
            ..Default::default()
        });
        let error = load(&[resource("e", "edge", vec![node("k", "", Some(bad))])]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "e: descriptors[0].rate_limit.tollgate.window: give either `unit` or `window`, not \
             both; remove one"
        );
    }

    /// A `rate_limit` with further limits in its extension is the schema's `rate_limits` list.
    #[test]
    fn further_limits_become_a_rate_limits_list() {
        let mut burst = limit(RateLimitUnit::Second, 10).unwrap();
        burst.name = "burst".into();
        burst.tollgate = Some(LimitExtension {
            rate_limits: vec![
                FurtherLimit {
                    unit: LimitUnit::Hour as i32,
                    requests_per_unit: 1000,
                    name: "sustained".into(),
                    replaces: vec!["other".into()],
                    tollgate: Some(LimitExtension {
                        algorithm: "sliding_window_log".into(),
                        ..Default::default()
                    }),
                },
                FurtherLimit {
                    requests_per_unit: 50,
                    tollgate: Some(LimitExtension {
                        window: "90s".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        });
        let mut other = limit(RateLimitUnit::Minute, 5).unwrap();
        other.name = "other".into();
        other.replaces = vec![RateLimitReplace {
            name: "burst".into(),
        }];
        let config = load(&[resource(
            "several",
            "edge",
            vec![
                node("user", "", Some(burst.clone())),
                node("other", "", Some(other)),
            ],
        )])
        .unwrap();
        let domain = config.domain("edge").unwrap();
        let matched = domain.resolve(&entries(&[("user", "alice")])).unwrap();
        let summary: Vec<_> = matched
            .limits
            .iter()
            .map(|l| {
                (
                    l.series_key.as_str(),
                    l.joint,
                    l.requests_per_unit,
                    l.window_ms,
                    l.algorithm,
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "edge.user.burst",
                    true,
                    10,
                    1000,
                    Algorithm::SlidingWindowCounter
                ),
                (
                    "edge.user.sustained",
                    true,
                    1000,
                    3_600_000,
                    Algorithm::SlidingWindowLog
                ),
                (
                    "edge.user.3",
                    true,
                    50,
                    90_000,
                    Algorithm::SlidingWindowCounter
                ),
            ]
        );
        assert_eq!(matched.limits[1].replaces, ["other"]);
        assert_eq!(matched.counter_keys.len(), 3);
        let plain = domain.resolve(&entries(&[("other", "x")])).unwrap();
        assert!(!plain.limits[0].joint);

        let with = |further: FurtherLimit| {
            let mut policy = burst.clone();
            if let Some(extension) = policy.tollgate.as_mut() {
                extension.rate_limits.push(further);
            }
            load(&[resource("e", "edge", vec![node("user", "", Some(policy))])])
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            with(FurtherLimit {
                unit: 9,
                requests_per_unit: 1,
                ..Default::default()
            }),
            "e: descriptors[0].rate_limit.tollgate.rate_limits[2].unit: unknown unit `9`; write \
             second, minute, hour, day, week, month or year (or `window: 90s` for other lengths)"
        );
        assert_eq!(
            with(FurtherLimit {
                unit: LimitUnit::Second as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            "e: descriptors[0].rate_limit.tollgate.rate_limits[2]: this limit of `edge.user` has \
             the same algorithm (sliding_window_counter) and window (second) as the one at \
             `descriptors[0].rate_limit`, so the two would share one counter; give them \
             different windows (or algorithms), or keep only the lower limit"
        );
        assert_eq!(
            with(FurtherLimit {
                unit: LimitUnit::Day as i32,
                name: "burst".into(),
                ..Default::default()
            }),
            "e: descriptors[0].rate_limit.tollgate.rate_limits[2]: two limits of `edge.user` are \
             named `burst` (the first at `descriptors[0].rate_limit`); give each limit of \
             `rate_limits` its own name"
        );
        assert_eq!(
            with(FurtherLimit {
                unit: LimitUnit::Day as i32,
                tollgate: Some(LimitExtension {
                    rate_limits: vec![FurtherLimit::default()],
                    ..Default::default()
                }),
                ..Default::default()
            }),
            "e: descriptors[0].rate_limit.tollgate.rate_limits[2].tollgate.rate_limits: a \
             further limit cannot list further limits of its own; list every limit of the \
             descriptor in its `rate_limit.tollgate.rate_limits`"
        );
        let mut unlimited = burst.clone();
        unlimited.unit = RateLimitUnit::Unknown as i32;
        unlimited.unlimited = true;
        let error = load(&[resource(
            "u",
            "edge",
            vec![node("user", "", Some(unlimited))],
        )])
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "u: descriptors[0].rate_limit: a `rate_limits` entry cannot be `unlimited: true`: the \
             other limits of `edge.user` would still limit it; to never limit the descriptor, \
             write `rate_limit: {unlimited: true}` instead of `rate_limits`"
        );
    }
}
