//! What an operator asks of the limiter about one client: the usage of every limit a request's
//! descriptors resolve to, read without consuming anything ([`Limiter::inspect`]), and forgetting
//! it ([`Limiter::reset`]). The descriptors resolve exactly as a decision resolves them, so the
//! windows read and cleared are the ones a decision charges.

use std::sync::Arc;

use super::{Limiter, LimiterError, Resolved, validate};
use crate::backend::{Backend, BackendError, Hit, WindowState, lease};
use crate::config::{Config, Limit};
use crate::descriptor::{Entry, Request};
use crate::window::Cost;

/// One limit a descriptor resolves to and what its window holds.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitUsage {
    /// The limit, as the config snapshot in force (or the descriptor's own `limit`) has it.
    pub limit: Arc<Limit>,
    /// Its window as it stood when read (for a reset: just before it was cleared).
    pub state: WindowState,
}

/// The limits one request descriptor resolves to, in declaration order; empty when none applies
/// (unknown domain, no match, `unlimited`).
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorUsage {
    /// The descriptor's entries, as asked.
    pub entries: Vec<Entry>,
    /// Each limit's usage.
    pub limits: Vec<LimitUsage>,
}

/// Why an operator's question could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InspectError {
    /// The request breaks a rule of the protocol; nothing was read or cleared.
    #[error(transparent)]
    Invalid(#[from] LimiterError),
    /// The store failed to read or clear a window.
    #[error("{0}")]
    Backend(#[from] BackendError),
}

impl<B: Backend> Limiter<B> {
    /// The usage of every limit each descriptor of `request` resolves to, consuming nothing:
    /// no window is charged, created or extended, and `remaining` is what a check
    /// (`hits_addend: 0`) would answer now. `replaces` is not applied: every limit that matched
    /// is shown.
    pub async fn inspect(&self, request: &Request) -> Result<Vec<DescriptorUsage>, InspectError> {
        validate(request)?;
        let (hits, shape) = self.windows(request);
        let states = if hits.is_empty() {
            Vec::new()
        } else {
            self.backend.peek(&hits).await
        };
        answer(request, &shape, states)
    }

    /// Clears the windows of every limit each descriptor of `request` resolves to (every shard,
    /// and what leases hold in the store), and answers what they held just before. Safe to
    /// repeat. Other instances may still admit from slices they leased, at most one lease time
    /// (a second) of them, and from refusals their local caches hold until those end.
    pub async fn reset(&self, request: &Request) -> Result<Vec<DescriptorUsage>, InspectError> {
        validate(request)?;
        let (hits, shape) = self.windows(request);
        if hits.is_empty() {
            return answer(request, &shape, Vec::new());
        }
        let states = self.backend.peek(&hits).await;
        for cleared in self.backend.clear(&hits).await {
            cleared?;
        }
        answer(request, &shape, states)
    }

    /// One read-only hit per limit each descriptor resolves to, in order, and the limits of
    /// each descriptor.
    fn windows(&self, request: &Request) -> (Vec<Hit>, Vec<Vec<Arc<Limit>>>) {
        let config: Arc<Config> = self.config.load_full();
        let mut unused = Vec::new();
        let resolved = Self::resolve(&config, request, &mut unused);
        let mut hits = Vec::new();
        let mut shape = Vec::with_capacity(resolved.len());
        for found in resolved.iter() {
            shape.push(self.window_hits(found, &mut hits));
        }
        (hits, shape)
    }

    fn window_hits(&self, found: &Resolved<'_>, hits: &mut Vec<Hit>) -> Vec<Arc<Limit>> {
        if found.iter().any(|f| f.limit.arc().unlimited) {
            return Vec::new();
        }
        found
            .iter()
            .map(|f| {
                let limit = Arc::clone(f.limit.arc());
                hits.push(Hit {
                    key: f.key.clone(),
                    algorithm: limit.algorithm,
                    limit: u64::from(limit.requests_per_unit),
                    window_ms: limit.window_ms,
                    cost: Cost::CheckOnly,
                    counting: limit.counting.unwrap_or(self.settings.counting),
                    shards: limit.shards,
                    lease_ms: if limit.lease {
                        lease::lease_ms(limit.window_ms)
                    } else {
                        0
                    },
                    tentative: false,
                    group: 0,
                    descriptor_tag: limit.joint,
                    slice: false,
                });
                limit
            })
            .collect()
    }
}

/// Puts the states read back on the descriptors they belong to.
fn answer(
    request: &Request,
    shape: &[Vec<Arc<Limit>>],
    states: Vec<Result<WindowState, BackendError>>,
) -> Result<Vec<DescriptorUsage>, InspectError> {
    let mut states = states.into_iter();
    let mut answers = Vec::with_capacity(shape.len());
    for (descriptor, limits) in request.descriptors.iter().zip(shape) {
        let mut usages = Vec::with_capacity(limits.len());
        for limit in limits {
            let state = states.next().ok_or_else(|| {
                BackendError::Protocol("the backend answered fewer windows than asked".into())
            })??;
            usages.push(LimitUsage {
                limit: Arc::clone(limit),
                state,
            });
        }
        answers.push(DescriptorUsage {
            entries: descriptor.entries.clone(),
            limits: usages,
        });
    }
    Ok(answers)
}
