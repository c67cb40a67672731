//! The limiter's requests (`tollgate::descriptor`) built from plain entries, for tests that call
//! `Limiter::should_rate_limit` directly.

use tollgate::descriptor::{Descriptor, Entry, Request};

/// A descriptor with these `(key, value)` entries, outermost first.
pub fn descriptor(entries: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: entries.iter().map(|(k, v)| Entry::new(*k, *v)).collect(),
        ..Descriptor::default()
    }
}

/// `descriptor` with its own `hits_addend` (0: check only).
pub fn with_addend(mut descriptor: Descriptor, addend: u64) -> Descriptor {
    descriptor.hits_addend = Some(addend);
    descriptor
}

/// A request for `domain` with these descriptors and the request's `hits_addend` left at 0 (one
/// hit).
pub fn request(domain: &str, descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}
