//! The statsd-to-Prometheus mapping envoyproxy/ratelimit applies to its statistics (the
//! statsd_exporter mapping-file format), so that tollgate's series carry the names and labels the
//! reference's users already query and graph.
//!
//! The reference names each statistic in statsd form (`ratelimit.service.rate_limit.<key>.<stat>`)
//! and a list of rules turns the name into a Prometheus name and labels. The embedded
//! [`DEFAULT_MAPPING`] is the reference's own; `PROMETHEUS_MAPPER_YAML` names another file in
//! the same format. Supported: `mappings` with `match`, `match_type` (`glob`, `regex`), `name`,
//! `labels` (with `$n` / `${n}` captures), `match_metric_type`, `action` (`map`, `drop`) and
//! `scale`, and `defaults.match_type`; keys that only change how the exporter builds its
//! histograms or expires series are read and named in [`Mapper::unsupported`].
//!
//! Matching follows statsd_exporter: every glob rule is tried before any regex rule, the first
//! glob in file order wins, a glob `*` is one whole dot-separated field, and regexes are not
//! anchored unless they say so.

use crate::config::yaml::{self, Node, Resolved, Value};

/// The reference's default mapping file, which it embeds.
pub const DEFAULT_MAPPING: &str = include_str!("default_mapper.yaml");

/// The kind of statistic a name is mapped for (a rule's `match_metric_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    /// A counter.
    Counter,
    /// A gauge.
    Gauge,
    /// A timer or histogram observation.
    Observer,
}

/// What a statsd name maps to.
#[derive(Debug, Clone, PartialEq)]
pub enum Mapping {
    /// A Prometheus series: name, labels in rule order, and the factor values are scaled by.
    Series {
        /// The Prometheus metric name.
        name: String,
        /// Label names and values.
        labels: Vec<(String, String)>,
        /// `scale` (1 when absent).
        scale: f64,
    },
    /// A `drop` rule matched: the statistic is not exported.
    Dropped,
    /// No rule matched: statsd_exporter exports the escaped name with no labels.
    Unmapped(String),
}

/// Why a mapping file cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapperError {
    /// The file is not YAML.
    #[error("line {line}: {message}")]
    Yaml {
        /// Where.
        line: usize,
        /// What.
        message: String,
    },
    /// A rule is malformed.
    #[error("mapping {index}: {message}")]
    Rule {
        /// The rule's position in `mappings` (0-based).
        index: usize,
        /// What is wrong.
        message: String,
    },
}

#[derive(Debug, Clone)]
enum Matcher {
    /// Fields; `None` is a `*`.
    Glob(Vec<Option<String>>),
    Regex(regex::Regex),
}

#[derive(Debug, Clone)]
struct Rule {
    matcher: Matcher,
    name: String,
    labels: Vec<(String, String)>,
    kind: Option<StatKind>,
    drop: bool,
    scale: f64,
}

/// A parsed mapping file.
#[derive(Debug, Clone)]
pub struct Mapper {
    globs: Vec<Rule>,
    regexes: Vec<Rule>,
    unsupported: Vec<String>,
}

impl Mapper {
    /// The reference's default mapping.
    pub fn default_mapping() -> Mapper {
        // The embedded file is tested to parse; an empty mapper is the harmless fallback.
        Mapper::parse(DEFAULT_MAPPING).unwrap_or_else(|_| Mapper {
            globs: Vec::new(),
            regexes: Vec::new(),
            unsupported: Vec::new(),
        })
    }

    /// The reference's default mapping with `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`: the
    /// response time keeps milliseconds (its `scale` is dropped), as the reference does it.
    pub fn default_mapping_in_milliseconds() -> Mapper {
        let mut mapper = Mapper::default_mapping();
        for rule in mapper.globs.iter_mut().chain(mapper.regexes.iter_mut()) {
            if rule.name == "ratelimit_service_response_time_seconds" {
                rule.scale = 1.0;
            }
        }
        mapper
    }

    /// Parses a statsd_exporter mapping file.
    pub fn parse(text: &str) -> Result<Mapper, MapperError> {
        let root = yaml::parse(text).map_err(|e| MapperError::Yaml {
            line: e.pos.line,
            message: e.message,
        })?;
        let mut mapper = Mapper {
            globs: Vec::new(),
            regexes: Vec::new(),
            unsupported: Vec::new(),
        };
        let Some(root) = root else {
            return Ok(mapper);
        };
        let Value::Map(top) = &root.value else {
            return Err(MapperError::Yaml {
                line: root.pos.line,
                message: "a mapping file is a mapping with `mappings:`".into(),
            });
        };
        let mut default_regex = false;
        for (key, value) in top {
            match text_of(key).as_deref() {
                Some("defaults") => {
                    let Value::Map(fields) = &value.value else {
                        continue;
                    };
                    for (k, v) in fields {
                        match text_of(k).as_deref() {
                            Some("match_type") => {
                                default_regex = text_of(v).as_deref() == Some("regex")
                            }
                            Some(other) => mapper.note(format!("defaults.{other}")),
                            None => {}
                        }
                    }
                }
                Some("mappings") => {}
                Some(other) => mapper.note(other.to_string()),
                None => {}
            }
        }
        let mappings = top
            .iter()
            .find(|(k, _)| text_of(k).as_deref() == Some("mappings"))
            .map(|(_, v)| v);
        let Some(mappings) = mappings else {
            return Ok(mapper);
        };
        let Value::Seq(list) = &mappings.value else {
            return Err(MapperError::Yaml {
                line: mappings.pos.line,
                message: "`mappings` must be a list".into(),
            });
        };
        for (index, node) in list.iter().enumerate() {
            let rule_error = |message: String| MapperError::Rule { index, message };
            let Value::Map(fields) = &node.value else {
                return Err(rule_error("a mapping is a mapping of keys".into()));
            };
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| text_of(k).as_deref() == Some(name))
                    .map(|(_, v)| v)
            };
            let pattern = field("match")
                .and_then(text_of)
                .ok_or_else(|| rule_error("`match` is required".into()))?;
            let regex = match field("match_type").and_then(text_of).as_deref() {
                Some("regex") => true,
                Some("glob") => false,
                Some("") | None => default_regex,
                Some(other) => {
                    return Err(rule_error(format!("match_type `{other}`: glob or regex")));
                }
            };
            let drop = match field("action").and_then(text_of).as_deref() {
                Some("drop") => true,
                Some("map" | "") | None => false,
                Some(other) => return Err(rule_error(format!("action `{other}`: map or drop"))),
            };
            let name = field("name").and_then(text_of).unwrap_or_default();
            if name.is_empty() && !drop {
                return Err(rule_error("`name` is required".into()));
            }
            let kind = match field("match_metric_type").and_then(text_of).as_deref() {
                Some("counter") => Some(StatKind::Counter),
                Some("gauge") => Some(StatKind::Gauge),
                Some("observer" | "timer") => Some(StatKind::Observer),
                Some("") | None => None,
                Some(other) => {
                    return Err(rule_error(format!(
                        "match_metric_type `{other}`: counter, gauge or observer"
                    )));
                }
            };
            let scale = match field("scale").map(|v| v.scalar().map(|s| s.resolve())) {
                Some(Some(Ok(Resolved::Float(f)))) => f,
                Some(Some(Ok(Resolved::Int(i)))) => i as f64,
                None => 1.0,
                Some(_) => return Err(rule_error("`scale` must be a number".into())),
            };
            let mut labels = Vec::new();
            if let Some(node) = field("labels") {
                let Value::Map(pairs) = &node.value else {
                    return Err(rule_error("`labels` must be a mapping".into()));
                };
                for (k, v) in pairs {
                    let (Some(k), Some(v)) = (text_of(k), text_of(v)) else {
                        return Err(rule_error("label names and values must be text".into()));
                    };
                    labels.push((k, v));
                }
            }
            for (key, _) in fields {
                match text_of(key).as_deref() {
                    Some(
                        "match" | "match_type" | "name" | "labels" | "match_metric_type" | "action"
                        | "scale" | "help",
                    ) => {}
                    // Only observations are shaped by these; the reference's statistics that
                    // become histograms are kept as the default buckets whatever they say.
                    Some("timer_type" | "observer_type") => {}
                    Some(other) => mapper.note(format!("mappings[].{other}")),
                    None => {}
                }
            }
            let matcher = if regex {
                Matcher::Regex(
                    regex::Regex::new(&pattern)
                        .map_err(|e| rule_error(format!("regex `{pattern}`: {e}")))?,
                )
            } else {
                Matcher::Glob(
                    pattern
                        .split('.')
                        .map(|f| (f != "*").then(|| f.to_string()))
                        .collect(),
                )
            };
            let rule = Rule {
                matcher,
                name,
                labels,
                kind,
                drop,
                scale,
            };
            if regex {
                mapper.regexes.push(rule);
            } else {
                mapper.globs.push(rule);
            }
        }
        Ok(mapper)
    }

    /// The keys the file uses that tollgate reads but does not act on, once each.
    pub fn unsupported(&self) -> &[String] {
        &self.unsupported
    }

    fn note(&mut self, what: String) {
        if !self.unsupported.contains(&what) {
            self.unsupported.push(what);
        }
    }

    /// Maps one statsd name of a statistic of `kind`.
    pub fn map(&self, statsd_name: &str, kind: StatKind) -> Mapping {
        let fits = |rule: &Rule| rule.kind.is_none_or(|k| k == kind);
        let fields: Vec<&str> = statsd_name.split('.').collect();
        for rule in self.globs.iter().filter(|r| fits(r)) {
            let Matcher::Glob(pattern) = &rule.matcher else {
                continue;
            };
            if pattern.len() != fields.len() {
                continue;
            }
            let mut captures = Vec::new();
            let matched = pattern.iter().zip(&fields).all(|(p, f)| match p {
                Some(literal) => literal == f,
                None => {
                    captures.push(*f);
                    true
                }
            });
            if matched {
                return rule.apply(|name| {
                    name.parse::<usize>()
                        .ok()
                        .and_then(|n| n.checked_sub(1))
                        .and_then(|n| captures.get(n).copied())
                        .unwrap_or("")
                        .to_string()
                });
            }
        }
        for rule in &self.regexes {
            let Matcher::Regex(regex) = &rule.matcher else {
                continue;
            };
            let Some(captures) = regex.captures(statsd_name) else {
                continue;
            };
            if !fits(rule) {
                continue;
            }
            return rule.apply(|name| {
                let group = match name.parse::<usize>() {
                    Ok(n) => captures.get(n),
                    Err(_) => captures.name(name),
                };
                group.map_or_else(String::new, |m| m.as_str().to_string())
            });
        }
        Mapping::Unmapped(escape_metric_name(statsd_name))
    }
}

impl Rule {
    fn apply(&self, capture: impl Fn(&str) -> String) -> Mapping {
        if self.drop {
            return Mapping::Dropped;
        }
        Mapping::Series {
            name: escape_metric_name(&expand(&self.name, &capture)),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), expand(v, &capture)))
                .collect(),
            scale: self.scale,
        }
    }
}

/// The text of a scalar node, as written.
fn text_of(node: &Node) -> Option<String> {
    node.scalar().map(|s| s.text.clone())
}

/// Replaces `$name` and `${name}` in `template` with `capture(name)`, as Go's `Expand` does: a
/// bare name is the longest run of letters, digits and `_`; `$$` is a `$`.
fn expand(template: &str, capture: &impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
        } else if let Some(braced) = rest.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => {
                    out.push_str(&capture(&braced[..end]));
                    rest = &braced[end + 1..];
                }
                None => {
                    out.push('$');
                }
            }
        } else {
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if end == 0 {
                out.push('$');
            } else {
                out.push_str(&capture(&rest[..end]));
                rest = &rest[end..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// statsd_exporter's metric-name escaping: every character outside `[A-Za-z0-9_]` becomes `_`
/// (a `-` right after a `-` is dropped), and a leading digit gets a `_` in front.
pub fn escape_metric_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 1);
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        out.push('_');
    }
    let mut previous_dash = false;
    for c in name.chars() {
        if c == '-' && previous_dash {
            continue;
        }
        previous_dash = c == '-';
        if c.is_ascii_alphanumeric() || c == '_' {
            out.push(c);
        } else {
            out.push('_');
        }
    }
    out
}

/// The reference's stat-name sanitising of a rate-limit key: `:` and `|` become `_`, and the dots
/// of anything shaped like an IPv4 address (`\d{1,3}(\.\d{1,3}){3}`, leftmost, not overlapping)
/// become `_`, so addresses do not split into fields. Other dots stay and separate fields.
pub fn sanitize_stat_key(key: &str) -> String {
    let mut out: Vec<u8> = key
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut at = 0;
    while at < out.len() {
        match ipv4_at(&out, at) {
            Some(end) => {
                for byte in &mut out[at..end] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes, so the text is still UTF-8.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The end of the leftmost-first match of `\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}` starting at
/// `start`, as Go's regexp finds it (greedy digit runs, backtracking to shorter ones).
fn ipv4_at(bytes: &[u8], start: usize) -> Option<usize> {
    fn digits(bytes: &[u8], at: usize, group: usize) -> Option<usize> {
        // Try 3, 2, 1 digits, as a greedy `\d{1,3}` does.
        let run = bytes[at.min(bytes.len())..]
            .iter()
            .take(3)
            .take_while(|b| b.is_ascii_digit())
            .count();
        for len in (1..=run).rev() {
            let end = at + len;
            if group == 3 {
                return Some(end);
            }
            if bytes.get(end) == Some(&b'.')
                && let Some(found) = digits(bytes, end + 1, group + 1)
            {
                return Some(found);
            }
        }
        None
    }
    digits(bytes, start, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, labels: &[(&str, &str)]) -> Mapping {
        Mapping::Series {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            scale: 1.0,
        }
    }

    #[test]
    fn the_default_mapping_gives_the_references_series() {
        let mapper = Mapper::default_mapping();
        assert!(
            mapper.unsupported().is_empty(),
            "{:?}",
            mapper.unsupported()
        );
        let cases = [
            (
                "ratelimit.service.rate_limit.another.key2.total_hits",
                series(
                    "ratelimit_service_rate_limit_total_hits",
                    &[("domain", "another"), ("key1", "key2")],
                ),
            ),
            (
                "ratelimit.service.rate_limit.domain1.key3_val3.key4_val4.key5_val5.near_limit",
                series(
                    "ratelimit_service_rate_limit_near_limit",
                    &[
                        ("domain", "domain1"),
                        ("key1", "key3_val3"),
                        ("key2", "key4_val4"),
                    ],
                ),
            ),
            (
                "ratelimit.service.rate_limit.d.k_v.over_limit_with_local_cache",
                Mapping::Unmapped(
                    "ratelimit_service_rate_limit_d_k_v_over_limit_with_local_cache".into(),
                ),
            ),
            (
                "ratelimit.service.call.should_rate_limit.redis_error",
                series(
                    "ratelimit_service_should_rate_limit_error",
                    &[("err_type", "redis_error")],
                ),
            ),
            (
                "ratelimit.service.config_load_success",
                series("ratelimit_service_config_load_success", &[]),
            ),
            (
                "ratelimit.service.global_shadow_mode",
                Mapping::Unmapped("ratelimit_service_global_shadow_mode".into()),
            ),
        ];
        for (name, expected) in cases {
            assert_eq!(mapper.map(name, StatKind::Counter), expected, "{name}");
        }
        let Mapping::Series { name, scale, .. } = mapper.map(
            "ratelimit_server.ShouldRateLimit.response_time",
            StatKind::Observer,
        ) else {
            panic!("response_time is mapped");
        };
        assert_eq!(
            (name.as_str(), scale),
            ("ratelimit_service_response_time_seconds", 0.001)
        );
        // A counter rule does not map a timer of the same name.
        assert_eq!(
            mapper.map("ratelimit.service.config_load_success", StatKind::Observer),
            Mapping::Unmapped("ratelimit_service_config_load_success".into())
        );
    }

    #[test]
    fn keys_are_sanitised_as_the_reference_does() {
        assert_eq!(sanitize_stat_key("path_/foo:*:bar"), "path_/foo_*_bar");
        assert_eq!(sanitize_stat_key("path_/foo|bar|baz"), "path_/foo_bar_baz");
        assert_eq!(
            sanitize_stat_key("d.masked_remote_address_0.0.0.0/0"),
            "d.masked_remote_address_0_0_0_0/0"
        );
        assert_eq!(sanitize_stat_key("d.k_1234.5.6.7"), "d.k_1234_5_6_7");
        assert_eq!(
            sanitize_stat_key("example.com.k_api.v1"),
            "example.com.k_api.v1"
        );
    }

    #[test]
    fn names_are_escaped_as_statsd_exporter_does() {
        assert_eq!(escape_metric_name("a--b.c"), "a_b_c");
        assert_eq!(escape_metric_name("1x"), "_1x");
        assert_eq!(escape_metric_name("wild_foo*"), "wild_foo_");
    }

    #[test]
    fn other_files_map_with_their_own_rules() {
        let mapper = Mapper::parse(
            "defaults:\n  ttl: 1m\nmappings:\n\
             - match: \"ratelimit.service.rate_limit.*.*.*.total_hits\"\n  name: \"hits\"\n  labels:\n    d: \"$1\"\n    k: \"${2}_$3\"\n\
             - match: \"ratelimit\\\\.(.*)\"\n  match_type: regex\n  action: drop\n  name: x\n\
             - match: \"a.*\"\n  name: \"a_$1\"\n  ttl: 5m\n",
        )
        .unwrap();
        assert_eq!(
            mapper.map(
                "ratelimit.service.rate_limit.d.k1.k2.total_hits",
                StatKind::Counter
            ),
            series("hits", &[("d", "d"), ("k", "k1_k2")])
        );
        assert_eq!(
            mapper.map("ratelimit.service.config_load_error", StatKind::Counter),
            Mapping::Dropped
        );
        assert_eq!(mapper.map("a.b-c", StatKind::Gauge), series("a_b_c", &[]));
        assert_eq!(mapper.unsupported(), ["defaults.ttl", "mappings[].ttl"]);
        assert!(Mapper::parse("mappings:\n- name: x\n").is_err());
        assert!(
            Mapper::parse("mappings:\n- match: \"(\"\n  match_type: regex\n  name: x\n").is_err()
        );
    }
}
