//! The rate-limit request as the limiter sees it: a domain and descriptors, free of any gRPC type.
//!
//! The server converts the Envoy protobuf request into these types; the config matcher and the
//! limiter read them. Its strings are [`Text`]: a request's domain, keys and values are short, so
//! they are kept inline and reading a request allocates only its lists.

use std::fmt;

/// A request's text: up to 23 bytes inline, longer ones behind one shared allocation. Reads as a
/// `&str`, and compares and hashes as one.
pub use smol_str::SmolStr as Text;

/// One `key=value` pair of a descriptor, e.g. `remote_address=10.0.0.1`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The descriptor key; never empty in a validated request.
    pub key: Text,
    /// The value; may be empty.
    pub value: Text,
}

impl Entry {
    /// Builds an entry from anything string-like (handy in tests).
    pub fn new(key: impl Into<Text>, value: impl Into<Text>) -> Self {
        Entry {
            key: key.into(),
            value: value.into(),
        }
    }
}

/// A limit the caller sends with a descriptor, replacing whatever the config says for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOverride {
    /// Hits allowed per `unit`.
    pub requests_per_unit: u32,
    /// The window; `None` when the caller sent UNKNOWN (the override is then ignored).
    pub unit: Option<Unit>,
}

/// One descriptor of a request: what the request is limited by.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Descriptor {
    /// The entries, outermost first.
    pub entries: Vec<Entry>,
    /// A caller-provided limit that replaces the configured one.
    pub limit: Option<LimitOverride>,
    /// The cost of this descriptor's hit, overriding the request's; `Some(0)` means check only.
    pub hits_addend: Option<u64>,
}

/// A whole rate-limit request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Request {
    /// The policy domain, e.g. `edge`.
    pub domain: Text,
    /// The descriptors, answered one status each in this order.
    pub descriptors: Vec<Descriptor>,
    /// The cost of the request; 0 is read as 1.
    pub hits_addend: u32,
}

/// A named unit of time, as used by `rate_limit.unit` and by the RLS protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3600 seconds.
    Hour,
    /// 86 400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days, as envoyproxy/ratelimit counts a month.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    /// Every unit, shortest first.
    pub const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The length of the unit in milliseconds.
    pub fn millis(self) -> u64 {
        const SECOND: u64 = 1000;
        const DAY: u64 = 86_400 * SECOND;
        match self {
            Unit::Second => SECOND,
            Unit::Minute => 60 * SECOND,
            Unit::Hour => 3600 * SECOND,
            Unit::Day => DAY,
            Unit::Week => 7 * DAY,
            Unit::Month => 30 * DAY,
            Unit::Year => 365 * DAY,
        }
    }

    /// The unit whose length is exactly `millis`, if there is one.
    pub fn from_millis(millis: u64) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.millis() == millis)
    }

    /// The config-file spelling (`second`, `minute`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// Parses the config-file spelling, case-insensitively as envoyproxy/ratelimit does.
    pub fn parse(text: &str) -> Option<Unit> {
        Unit::ALL
            .into_iter()
            .find(|u| u.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
