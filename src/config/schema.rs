//! The policy schema: what a policy can say, and how a policy file spells it.
//!
//! [`Policy`] is the tree every config source builds and the rules ([`super::rules`]) check: one
//! domain and its descriptor nodes, each value with the [`Location`](super::diagnostics::Location)
//! it came from (`L`: a line and column for a file, a field path for a message). The file source
//! reads YAML into it; a source that receives envoyproxy/ratelimit's `RateLimitConfig` protobuf
//! over xDS fills in the same tree from the message, leaving out what the message cannot say, and
//! gets the same validated snapshot through the same rules.
//!
//! [`Place`] lists, for the file format, which keys exist at each place of a file; the field docs
//! below give each key's type. Unknown keys are errors, so that a typo fails loudly instead of
//! being ignored.

use super::MetaValue;

/// The most shards one limit may be split into: enough to spread a hot limit over the masters of
/// any usual cluster, while a hit still tries only two shards before it is refused.
pub(super) const MAX_SHARDS: u16 = 64;

/// A value a source gave for a key, with where the key and the value were written (for a source
/// without text both may be the same path). Errors about the key's presence point at `key_at`,
/// errors about the value at `at`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Given<T, L> {
    /// The value, typed as the schema says.
    pub value: T,
    /// Where the key was written.
    pub key_at: L,
    /// Where the value was written.
    pub at: L,
}

/// A `rate_limits` list: each item a [`RateLimitNode`] located at the item.
pub(super) type LimitList<L> = Given<Vec<Given<RateLimitNode<L>, L>>, L>;

/// One policy: a domain and its descriptor tree (one file; one `RateLimitConfig` message).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Policy<L> {
    /// The whole policy; what an error about a missing key points at.
    pub at: L,
    /// `domain` (string): the domain Envoy sends. `None` when absent.
    pub domain: Option<Given<String, L>>,
    /// `descriptors` (list of [`DescriptorNode`]). `None` when absent.
    pub descriptors: Option<Given<Vec<DescriptorNode<L>>, L>>,
}

/// One item of a `descriptors` list.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct DescriptorNode<L> {
    /// The item; what an error about a missing key or the item as a whole points at.
    pub at: L,
    /// `key` (string): the descriptor key it matches. `None` when absent; empty when written
    /// empty or null.
    pub key: Option<Given<String, L>>,
    /// `value` (string): the value it matches exactly, or a pattern with `*` wildcards; empty for
    /// a key-only node. Other scalars count as written (`value: 404` is "404").
    pub value: String,
    /// `rate_limit` (a [`RateLimitNode`] mapping). `None` for an allow-list or parent node.
    pub rate_limit: Option<Given<RateLimitNode<L>, L>>,
    /// `rate_limits` (a list of [`RateLimitNode`] mappings, each located at its item): several
    /// limits decided together, instead of `rate_limit`. `None` when absent.
    pub rate_limits: Option<LimitList<L>>,
    /// `descriptors` (list of nodes one level deeper). `None` when absent.
    pub descriptors: Option<Given<Vec<DescriptorNode<L>>, L>>,
    /// `shadow_mode` (bool): report over-limit as OK.
    pub shadow_mode: bool,
    /// `quota_mode` (bool): over only when every quota descriptor is over.
    pub quota_mode: bool,
    /// `detailed_metric` (bool): metrics per descriptor value.
    pub detailed_metric: bool,
    /// `value_to_metric` (bool): the value in metric names.
    pub value_to_metric: bool,
    /// `share_threshold` (bool): all values a wildcard matches share one counter. `None` when
    /// absent.
    pub share_threshold: Option<Given<bool, L>>,
    /// `metadata` (a mapping of any values): returned to Envoy as dynamic metadata.
    pub metadata: Option<MetaValue>,
}

/// A `rate_limit` mapping, or one item of a `rate_limits` list.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct RateLimitNode<L> {
    /// `unit` (string: second, minute, hour, day, week, month, year). `None` when absent.
    pub unit: Option<Given<String, L>>,
    /// `requests_per_unit` (integer `0..=u32::MAX`). `None` when absent.
    pub requests_per_unit: Option<Given<u32, L>>,
    /// `unlimited` (bool): never limited.
    pub unlimited: bool,
    /// `name` (string): what other limits' `replaces` name. `None` when absent.
    pub name: Option<String>,
    /// `replaces` (list of `{name}` mappings): limits this one takes the place of.
    pub replaces: Vec<ReplaceNode<L>>,
    /// `algorithm` (string: sliding_window_counter, sliding_window_log). tollgate's extension.
    pub algorithm: Option<Given<String, L>>,
    /// `window` (string: a duration such as `90s`), instead of `unit`. tollgate's extension.
    pub window: Option<Given<String, L>>,
    /// `shards` (integer `1..=`[`MAX_SHARDS`]). tollgate's extension.
    pub shards: Option<Given<u16, L>>,
    /// `failure_mode` (string: allow, deny). tollgate's extension.
    pub failure_mode: Option<Given<String, L>>,
    /// `counting` (string: admitted, all): whether refused hits are charged too. tollgate's
    /// extension.
    pub counting: Option<Given<String, L>>,
    /// `lease` (bool): instances answer from slices of the quota reserved in the store.
    /// tollgate's extension.
    pub lease: bool,
}

/// One item of a `replaces` list.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ReplaceNode<L> {
    /// The item.
    pub at: L,
    /// `name` (string): the limit replaced; empty when absent.
    pub name: String,
}

/// The mappings of a policy file, for checking their keys and for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// The file itself: [`Policy`].
    Top,
    /// A [`DescriptorNode`].
    Descriptor,
    /// A [`RateLimitNode`] under `rate_limit`.
    RateLimit,
    /// A [`RateLimitNode`] in a `rate_limits` list.
    RateLimits,
    /// A [`ReplaceNode`].
    Replaces,
}

impl Place {
    /// Every place, in the order a misplaced key looks for its home.
    pub const ALL: [Place; 5] = [
        Place::Descriptor,
        Place::RateLimit,
        Place::RateLimits,
        Place::Top,
        Place::Replaces,
    ];

    /// The keys allowed here, in the order messages list them.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Place::Top => &["domain", "descriptors"],
            Place::Descriptor => &[
                "key",
                "value",
                "rate_limit",
                "rate_limits",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "detailed_metric",
                "value_to_metric",
                "share_threshold",
                "metadata",
            ],
            Place::RateLimit | Place::RateLimits => &[
                "unit",
                "requests_per_unit",
                "unlimited",
                "name",
                "replaces",
                "algorithm",
                "window",
                "shards",
                "failure_mode",
                "counting",
                "lease",
            ],
            Place::Replaces => &["name"],
        }
    }

    /// "in a descriptor", ...: how a message says a key is here.
    pub fn inside(self) -> &'static str {
        match self {
            Place::Top => "at the top level of the file",
            Place::Descriptor => "in a descriptor",
            Place::RateLimit => "in `rate_limit`",
            Place::RateLimits => "in a `rate_limits` entry",
            Place::Replaces => "in a `replaces` entry",
        }
    }

    /// Where keys of this place go, for "belongs ..." hints.
    pub fn home(self) -> &'static str {
        match self {
            Place::Top => "at the top level of the file",
            Place::Descriptor => "in a descriptor (an item of `descriptors`)",
            Place::RateLimit => "inside `rate_limit`",
            Place::RateLimits => "in a `rate_limits` entry",
            Place::Replaces => "in a `replaces` entry",
        }
    }
}
