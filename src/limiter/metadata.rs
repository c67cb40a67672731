//! The dynamic metadata of a response, shaped as envoyproxy/ratelimit shapes it, and what
//! tollgate adds to it: which limit refused each refused descriptor (`overLimit`).

use crate::config::MetaValue;
use crate::descriptor::{LimitOverride, Request};

/// Merges the metadata of the limits of the descriptors that passed, in request order: the first
/// writer wins per key, maps merge recursively, as envoyproxy/ratelimit does. `None` when there is
/// nothing to merge.
pub(super) fn merge_metadata<'m>(
    sources: impl IntoIterator<Item = &'m MetaValue>,
) -> Option<MetaValue> {
    let mut merged = MetaValue::Map(Vec::new());
    for value in sources {
        merge_into(&mut merged, value);
    }
    match &merged {
        MetaValue::Map(fields) if fields.is_empty() => None,
        _ => Some(merged),
    }
}

fn merge_into(dest: &mut MetaValue, src: &MetaValue) {
    let (MetaValue::Map(dest_fields), MetaValue::Map(src_fields)) = (dest, src) else {
        return;
    };
    for (key, value) in src_fields {
        match dest_fields.iter_mut().find(|(k, _)| k == key) {
            Some((_, existing)) => merge_into(existing, value),
            None => dest_fields.push((key.clone(), value.clone())),
        }
    }
}

/// The dynamic metadata of a response, in the shape envoyproxy/ratelimit gives it, so that
/// Envoy configs reading `envoy.filters.http.ratelimit` metadata work unchanged: the domain;
/// every descriptor's entries as `key=value` strings, its `limit` override in protobuf text form
/// and its own `hitsAddend` when it has them; the request's `hitsAddend` when not 0; and the
/// merged `metadata` when there is any. tollgate adds `overLimit`, one `{descriptorIndex,
/// name}` per descriptor over its limit (`over_limit`: the index and the refusing limit's name,
/// else its full key), when any is.
pub(super) fn dynamic_metadata(
    request: &Request,
    metadata: Option<MetaValue>,
    over_limit: &[(usize, &str)],
) -> MetaValue {
    let descriptors = request
        .descriptors
        .iter()
        .map(|descriptor| {
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| MetaValue::String(format!("{}={}", entry.key, entry.value)))
                .collect();
            let mut fields = vec![("entries".to_string(), MetaValue::List(entries))];
            if let Some(limit) = &descriptor.limit {
                fields.push(("limit".to_string(), MetaValue::String(override_text(limit))));
            }
            if let Some(hits) = descriptor.hits_addend {
                // A Struct number is a double, as in the reference.
                fields.push(("hitsAddend".to_string(), MetaValue::Number(hits as f64)));
            }
            MetaValue::Map(fields)
        })
        .collect();
    let mut fields = vec![
        (
            "domain".to_string(),
            MetaValue::String(request.domain.to_string()),
        ),
        ("descriptors".to_string(), MetaValue::List(descriptors)),
    ];
    if request.hits_addend != 0 {
        fields.push((
            "hitsAddend".to_string(),
            MetaValue::Number(f64::from(request.hits_addend)),
        ));
    }
    if let Some(metadata) = metadata {
        fields.push(("metadata".to_string(), metadata));
    }
    if !over_limit.is_empty() {
        let refused = over_limit
            .iter()
            .map(|(index, name)| {
                MetaValue::Map(vec![
                    // A Struct number is a double.
                    (
                        "descriptorIndex".to_string(),
                        MetaValue::Number(*index as f64),
                    ),
                    ("name".to_string(), MetaValue::String((*name).to_string())),
                ])
            })
            .collect();
        fields.push(("overLimit".to_string(), MetaValue::List(refused)));
    }
    MetaValue::Map(fields)
}

/// A descriptor's `limit` override in protobuf text form, as the reference writes it:
/// `requests_per_unit:10 unit:DAY`, fields at their zero value left out.
pub(super) fn override_text(limit: &LimitOverride) -> String {
    let mut parts = Vec::with_capacity(2);
    if limit.requests_per_unit != 0 {
        parts.push(format!("requests_per_unit:{}", limit.requests_per_unit));
    }
    if let Some(unit) = limit.unit {
        parts.push(format!("unit:{}", unit.as_str().to_ascii_uppercase()));
    }
    parts.join(" ")
}
