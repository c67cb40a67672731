//! The protobuf types and gRPC stubs, generated at build time from `proto/`: Envoy's RLS v3 and
//! Rate Limit Quota Service (the services tollgate serves) and the xDS messages of its policy client (ADS, `RateLimitConfig`).
//! The module tree mirrors the protobuf packages because the generated code refers to its
//! neighbours by relative paths.

#![allow(missing_docs, clippy::all)]

/// Envoy's protobuf packages (the subset tollgate vendors).
pub mod envoy {
    pub mod service {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod rate_limit_quota {
            pub mod v3 {
                tonic::include_proto!("envoy.service.rate_limit_quota.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
}

/// xDS discovery (`envoy.service.discovery.v3`): the ADS service and its messages.
pub mod discovery {
    pub use super::envoy::service::discovery::v3::*;
}

/// envoyproxy/ratelimit's policy resource, `ratelimit.config.ratelimit.v3.RateLimitConfig`.
pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// tollgate's own messages: the extension of a limit delivered over xDS.
pub mod tollgate {
    pub mod config {
        pub mod v1 {
            tonic::include_proto!("tollgate.config.v1");
        }
    }
}

/// `google.rpc.Status`, the reason of an xDS NACK.
pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

/// cncf/xds core types a node may carry.
pub mod xds {
    pub mod core {
        pub mod v3 {
            tonic::include_proto!("xds.core.v3");
        }
    }
}

pub use envoy::config::core::v3::HeaderValue;
pub use envoy::extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor};
pub use envoy::service::ratelimit::v3::*;
pub use envoy::r#type::v3::RateLimitUnit;

/// The full gRPC name of the rate-limit service.
pub const RLS_SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// Envoy's Rate Limit Quota Service (`envoy.filters.http.rate_limit_quota`'s server side).
pub mod rlqs {
    pub use super::envoy::service::rate_limit_quota::v3::*;
    pub use super::envoy::r#type::v3::{RateLimitStrategy, TokenBucket, rate_limit_strategy};
}

/// The full gRPC name of the Rate Limit Quota Service.
pub const RLQS_SERVICE_NAME: &str = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService";

/// The encoded `FileDescriptorSet` of every proto above, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/rls_descriptor.bin"));

/// Every vendored file's descriptors (RLS and xDS), for the tests that pin field numbers.
#[cfg(test)]
const ALL_DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/all_descriptor.bin"));

#[cfg(test)]
mod tests {
    use prost_reflect::{DescriptorPool, Kind};

    /// Envoy's wire contract, field by field: (message, field, number).
    const FIELDS: &[(&str, &str, u32)] = &[
        ("envoy.service.ratelimit.v3.RateLimitRequest", "domain", 1),
        (
            "envoy.service.ratelimit.v3.RateLimitRequest",
            "descriptors",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitRequest",
            "hits_addend",
            3,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "overall_code",
            1,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "statuses",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "response_headers_to_add",
            3,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "request_headers_to_add",
            4,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "raw_body",
            5,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse",
            "dynamic_metadata",
            6,
        ),
        ("envoy.service.ratelimit.v3.RateLimitResponse", "quota", 7),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit",
            "name",
            3,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit",
            "requests_per_unit",
            1,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit",
            "unit",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
            "code",
            1,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
            "current_limit",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
            "limit_remaining",
            3,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
            "duration_until_reset",
            4,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.DescriptorStatus",
            "quota",
            5,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.Quota",
            "requests",
            1,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.Quota",
            "valid_until",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.Quota",
            "id",
            3,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
            "entries",
            1,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
            "limit",
            2,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor",
            "hits_addend",
            3,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry",
            "key",
            1,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry",
            "value",
            2,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride",
            "requests_per_unit",
            1,
        ),
        (
            "envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride",
            "unit",
            2,
        ),
        ("envoy.config.core.v3.HeaderValue", "key", 1),
        ("envoy.config.core.v3.HeaderValue", "value", 2),
        ("envoy.config.core.v3.HeaderValue", "raw_value", 3),
    ];

    /// (enum, value name, number).
    const ENUM_VALUES: &[(&str, &str, i32)] = &[
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.Code",
            "UNKNOWN",
            0,
        ),
        ("envoy.service.ratelimit.v3.RateLimitResponse.Code", "OK", 1),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.Code",
            "OVER_LIMIT",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "SECOND",
            1,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "MINUTE",
            2,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "HOUR",
            3,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "DAY",
            4,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "MONTH",
            5,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "YEAR",
            6,
        ),
        (
            "envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit",
            "WEEK",
            7,
        ),
        ("envoy.type.v3.RateLimitUnit", "SECOND", 1),
        ("envoy.type.v3.RateLimitUnit", "YEAR", 6),
    ];

    /// Every `(message, field, number)` of `fields` is in `pool` with that number.
    fn assert_field_numbers(pool: &DescriptorPool, fields: &[(&str, &str, u32)]) {
        for (message, field, number) in fields {
            let descriptor = pool
                .get_message_by_name(message)
                .unwrap_or_else(|| panic!("{message} is missing"));
            let found = descriptor
                .get_field_by_name(field)
                .unwrap_or_else(|| panic!("{message}.{field} is missing"));
            assert_eq!(found.number(), *number, "{message}.{field}");
        }
    }

    #[test]
    fn vendored_protos_match_envoys_field_numbers() {
        let pool = DescriptorPool::decode(super::FILE_DESCRIPTOR_SET).expect("descriptor set");
        assert_field_numbers(&pool, FIELDS);
        for (name, value, number) in ENUM_VALUES {
            let descriptor = pool
                .get_enum_by_name(name)
                .unwrap_or_else(|| panic!("{name} is missing"));
            let found = descriptor
                .get_value_by_name(value)
                .unwrap_or_else(|| panic!("{name}.{value} is missing"));
            assert_eq!(found.number(), *number, "{name}.{value}");
        }
        // hits_addend is a UInt64Value wrapper, so "0" and "unset" differ on the wire.
        let descriptor = pool
            .get_message_by_name("envoy.extensions.common.ratelimit.v3.RateLimitDescriptor")
            .expect("descriptor");
        let hits = descriptor.get_field_by_name("hits_addend").expect("field");
        match hits.kind() {
            Kind::Message(m) => assert_eq!(m.full_name(), "google.protobuf.UInt64Value"),
            other => panic!("hits_addend is {other:?}"),
        }
        let service = pool
            .get_service_by_name(super::RLS_SERVICE_NAME)
            .expect("the RLS service");
        assert!(service.methods().any(|m| m.name() == "ShouldRateLimit"));
    }

    /// Envoy's RLQS wire contract (data-plane-api's rlqs.proto, ratelimit_strategy.proto and
    /// token_bucket.proto), field by field.
    const RLQS_FIELDS: &[(&str, &str, u32)] = &[
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports",
            "domain",
            1,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports",
            "bucket_quota_usages",
            2,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports.BucketQuotaUsage",
            "bucket_id",
            1,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports.BucketQuotaUsage",
            "time_elapsed",
            2,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports.BucketQuotaUsage",
            "num_requests_allowed",
            3,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaUsageReports.BucketQuotaUsage",
            "num_requests_denied",
            4,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse",
            "bucket_action",
            1,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction",
            "bucket_id",
            1,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction",
            "quota_assignment_action",
            2,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction",
            "abandon_action",
            3,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction.QuotaAssignmentAction",
            "assignment_time_to_live",
            2,
        ),
        (
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaResponse.BucketAction.QuotaAssignmentAction",
            "rate_limit_strategy",
            3,
        ),
        ("envoy.service.rate_limit_quota.v3.BucketId", "bucket", 1),
        ("envoy.type.v3.RateLimitStrategy", "blanket_rule", 1),
        (
            "envoy.type.v3.RateLimitStrategy",
            "requests_per_time_unit",
            2,
        ),
        ("envoy.type.v3.RateLimitStrategy", "token_bucket", 3),
        ("envoy.type.v3.TokenBucket", "max_tokens", 1),
        ("envoy.type.v3.TokenBucket", "tokens_per_fill", 2),
        ("envoy.type.v3.TokenBucket", "fill_interval", 3),
    ];

    #[test]
    fn vendored_rlqs_protos_match_envoys_field_numbers() {
        let pool = DescriptorPool::decode(super::FILE_DESCRIPTOR_SET).expect("descriptor set");
        assert_field_numbers(&pool, RLQS_FIELDS);
        let rule = pool
            .get_enum_by_name("envoy.type.v3.RateLimitStrategy.BlanketRule")
            .expect("BlanketRule");
        let values: Vec<(String, i32)> = rule
            .values()
            .map(|v| (v.name().to_string(), v.number()))
            .collect();
        assert_eq!(
            values,
            [("ALLOW_ALL".to_string(), 0), ("DENY_ALL".to_string(), 1)]
        );
        // Reflection lists the quota service beside RLS.
        let service = pool
            .get_service_by_name(super::RLQS_SERVICE_NAME)
            .expect("the RLQS service");
        assert!(
            service
                .methods()
                .any(|m| m.name() == "StreamRateLimitQuotas")
        );
    }

    /// The xDS wire contract: data-plane-api's discovery messages and node, googleapis' status,
    /// and envoyproxy/ratelimit's RateLimitConfig, field by field.
    const XDS_FIELDS: &[(&str, &str, u32)] = &[
        (
            "envoy.service.discovery.v3.DiscoveryRequest",
            "version_info",
            1,
        ),
        ("envoy.service.discovery.v3.DiscoveryRequest", "node", 2),
        (
            "envoy.service.discovery.v3.DiscoveryRequest",
            "resource_names",
            3,
        ),
        ("envoy.service.discovery.v3.DiscoveryRequest", "type_url", 4),
        (
            "envoy.service.discovery.v3.DiscoveryRequest",
            "response_nonce",
            5,
        ),
        (
            "envoy.service.discovery.v3.DiscoveryRequest",
            "error_detail",
            6,
        ),
        (
            "envoy.service.discovery.v3.DiscoveryResponse",
            "version_info",
            1,
        ),
        (
            "envoy.service.discovery.v3.DiscoveryResponse",
            "resources",
            2,
        ),
        ("envoy.service.discovery.v3.DiscoveryResponse", "canary", 3),
        (
            "envoy.service.discovery.v3.DiscoveryResponse",
            "type_url",
            4,
        ),
        ("envoy.service.discovery.v3.DiscoveryResponse", "nonce", 5),
        (
            "envoy.service.discovery.v3.DiscoveryResponse",
            "control_plane",
            6,
        ),
        ("envoy.config.core.v3.Node", "id", 1),
        ("envoy.config.core.v3.Node", "cluster", 2),
        ("envoy.config.core.v3.Node", "metadata", 3),
        ("envoy.config.core.v3.Node", "locality", 4),
        ("envoy.config.core.v3.Node", "user_agent_name", 6),
        ("envoy.config.core.v3.Node", "user_agent_version", 7),
        ("envoy.config.core.v3.Node", "user_agent_build_version", 8),
        ("envoy.config.core.v3.Node", "extensions", 9),
        ("envoy.config.core.v3.Node", "client_features", 10),
        ("envoy.config.core.v3.Node", "dynamic_parameters", 12),
        ("google.rpc.Status", "code", 1),
        ("google.rpc.Status", "message", 2),
        ("google.rpc.Status", "details", 3),
        ("ratelimit.config.ratelimit.v3.RateLimitConfig", "name", 1),
        ("ratelimit.config.ratelimit.v3.RateLimitConfig", "domain", 2),
        (
            "ratelimit.config.ratelimit.v3.RateLimitConfig",
            "descriptors",
            3,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "key",
            1,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "value",
            2,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "rate_limit",
            3,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "descriptors",
            4,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "shadow_mode",
            5,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "detailed_metric",
            6,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "quota_mode",
            7,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitDescriptor",
            "metadata",
            8,
        ),
        ("ratelimit.config.ratelimit.v3.RateLimitPolicy", "unit", 1),
        (
            "ratelimit.config.ratelimit.v3.RateLimitPolicy",
            "requests_per_unit",
            2,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitPolicy",
            "unlimited",
            3,
        ),
        ("ratelimit.config.ratelimit.v3.RateLimitPolicy", "name", 4),
        (
            "ratelimit.config.ratelimit.v3.RateLimitPolicy",
            "replaces",
            5,
        ),
        (
            "ratelimit.config.ratelimit.v3.RateLimitPolicy",
            "tollgate",
            1000,
        ),
        ("ratelimit.config.ratelimit.v3.RateLimitReplace", "name", 1),
        ("tollgate.config.v1.LimitExtension", "algorithm", 1),
        ("tollgate.config.v1.LimitExtension", "window", 2),
        ("tollgate.config.v1.LimitExtension", "shards", 3),
        ("tollgate.config.v1.LimitExtension", "failure_mode", 4),
        ("tollgate.config.v1.LimitExtension", "counting", 5),
        ("tollgate.config.v1.LimitExtension", "lease", 6),
        ("tollgate.config.v1.LimitExtension", "rate_limits", 7),
        ("tollgate.config.v1.FurtherLimit", "unit", 1),
        ("tollgate.config.v1.FurtherLimit", "requests_per_unit", 2),
        ("tollgate.config.v1.FurtherLimit", "name", 3),
        ("tollgate.config.v1.FurtherLimit", "replaces", 4),
        ("tollgate.config.v1.FurtherLimit", "tollgate", 5),
    ];

    #[test]
    fn vendored_xds_protos_match_the_upstream_field_numbers() {
        let pool = DescriptorPool::decode(super::ALL_DESCRIPTORS).expect("descriptor set");
        assert_field_numbers(&pool, XDS_FIELDS);
        let units = pool
            .get_enum_by_name("ratelimit.config.ratelimit.v3.RateLimitUnit")
            .expect("RateLimitUnit");
        let mut numbers: Vec<(String, i32)> = units
            .values()
            .map(|v| (v.name().to_string(), v.number()))
            .collect();
        numbers.sort_by_key(|(_, number)| *number);
        let expected = [
            ("UNKNOWN", 0),
            ("SECOND", 1),
            ("MINUTE", 2),
            ("HOUR", 3),
            ("DAY", 4),
            ("MONTH", 5),
            ("YEAR", 6),
            ("WEEK", 7),
        ];
        assert_eq!(
            numbers,
            expected
                .iter()
                .map(|(n, v)| (n.to_string(), *v))
                .collect::<Vec<_>>()
        );
        let ads = pool
            .get_service_by_name("envoy.service.discovery.v3.AggregatedDiscoveryService")
            .expect("the ADS service");
        assert!(
            ads.methods()
                .any(|m| m.name() == "StreamAggregatedResources")
        );
        // Reflection lists only what tollgate serves: the ADS service is not in its set.
        let served = DescriptorPool::decode(super::FILE_DESCRIPTOR_SET).expect("descriptor set");
        assert!(
            served
                .get_service_by_name("envoy.service.discovery.v3.AggregatedDiscoveryService")
                .is_none()
        );
    }
}
