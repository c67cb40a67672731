//! The limiter's second door: slices of a descriptor's quota for a client that enforces them
//! itself (Envoy's rate-limit-quota filter, over RLQS), and charges for what such a client
//! admitted on its own. The same snapshot, the same limits and the same counters as
//! [`Limiter::should_rate_limit`]: a slice is one charge of several units against every limit
//! of the descriptor, decided as a request's hits are (together where the backend can), and
//! stamped ahead in a log for as long as its units may be spent.

use std::sync::Arc;

use super::{Hits, Limiter, Plan};
use crate::backend::{Backend, Hit, Outcome, Receipt, lease};
use crate::config::{FailureMode, Limit, MetaValue};
use crate::descriptor::{Descriptor, Entry, Request};
use crate::telemetry::{self, CallOutcome};
use crate::window::{Algorithm, Cost, Counting};

/// What a descriptor's quota answers a client that asked for a slice of it.
#[derive(Debug, Clone, PartialEq)]
pub enum Quota {
    /// No limit applies (an unknown domain, no match, an allow-list entry, a replaced limit)
    /// or the limit is `unlimited`: the client may admit everything.
    Free,
    /// Every limit that applies is in shadow mode (or the service is): the client admits
    /// everything, and what it reports is counted as the limits' use.
    Shadow(Vec<Arc<Limit>>),
    /// A slice: `units` the client may admit, until `spend_ms` after the decision.
    Granted(Grant),
    /// Not even the smallest slice asked for fits.
    Refused(Refusal),
    /// The backend could not decide; the limits' failure mode says what the client does.
    Failed(FailureMode),
}

/// A slice reserved against every limit of a descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// The units reserved, and the requests the client may admit.
    pub units: u64,
    /// How long after the decision the units may be spent: the stores stamp them as spent
    /// then, and a counter's slice ends with the fixed window it was charged to.
    pub spend_ms: u64,
    /// What the most constrained limit had left after the slice.
    pub remaining: u64,
    /// The limits charged, in declaration order.
    pub limits: Vec<Arc<Limit>>,
    /// The store's receipts, to give the slice back while it is still refundable.
    pub receipts: Vec<Receipt>,
}

/// Why no slice was reserved.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// What the most constrained refusing limit still had left: a smaller slice may fit.
    pub remaining: u64,
    /// Until a slice of the size asked for would fit, in ms (the latest refusing limit's).
    pub reset_ms: u64,
    /// The limits of the descriptor, in declaration order.
    pub limits: Vec<Arc<Limit>>,
}

impl<B: Backend> Limiter<B> {
    /// The descriptor an RLQS bucket stands for in `domain`: its entries (a bucket id is a map)
    /// in the order the domain's tree nests their keys (as they came, for a domain the policies
    /// do not declare, which limits nothing).
    pub fn bucket_descriptor(&self, domain: &str, mut entries: Vec<Entry>) -> Descriptor {
        if let Some(known) = self.config.load().domain(domain) {
            known.order_entries(&mut entries);
        }
        Descriptor {
            entries,
            limit: None,
            hits_addend: None,
        }
    }

    /// Reserves a slice of `descriptor`'s quota in `domain`, of the units `size` makes of the
    /// limits that apply (at least 1), spendable for up to `spend_ms` after the store's
    /// decision (a log stamps it that far ahead, within [`lease::MAX_SLICE_AHEAD_MS`] and a
    /// quarter of its window). All limits of the descriptor or none are charged; a refused
    /// slice charges nothing.
    pub async fn reserve(
        &self,
        domain: &str,
        descriptor: &Descriptor,
        size: impl FnOnce(&[Arc<Limit>]) -> u64,
        spend_ms: u64,
    ) -> Quota {
        let request = one_descriptor(domain, descriptor, 1);
        let Some((limits, mut hits)) = self.slice_hits(&request) else {
            return Quota::Free;
        };
        if self.settings.shadow_mode || limits.iter().all(|limit| limit.shadow_mode) {
            return Quota::Shadow(limits);
        }
        let units = size(&limits).max(1);
        for hit in hits.iter_mut() {
            hit.cost = Cost::Consume(units);
            hit.counting = Counting::Admitted;
            hit.lease_ms = spend_ms;
            hit.slice = true;
            // Given back when another limit refuses, or when a counter's window ends too soon.
            hit.tentative = true;
        }
        let results = self.acquire_slice(&hits).await;
        let mut receipts = Vec::new();
        let mut refused: Option<Refusal> = None;
        let mut failed: Option<FailureMode> = None;
        let mut granted_ms = spend_ms;
        let mut remaining = u64::MAX;
        for (index, (hit, limit)) in hits.iter().zip(&limits).enumerate() {
            match results.get(index) {
                Some(Ok(outcome)) if outcome.verdict.admitted => {
                    remaining = remaining.min(outcome.verdict.remaining);
                    granted_ms = granted_ms.min(spendable_ms(hit, outcome));
                    if let Some(receipt) = &outcome.receipt {
                        receipts.push(receipt.clone());
                    }
                }
                Some(Ok(outcome)) => {
                    let refusal = refused.get_or_insert(Refusal {
                        remaining: u64::MAX,
                        reset_ms: 0,
                        limits: limits.clone(),
                    });
                    refusal.remaining = refusal.remaining.min(outcome.verdict.remaining);
                    refusal.reset_ms = refusal.reset_ms.max(outcome.verdict.reset_ms);
                }
                Some(Err(_)) | None => {
                    failed.get_or_insert(limit.failure_mode.unwrap_or(self.settings.failure_mode));
                }
            }
        }
        if refused.is_some() || failed.is_some() {
            self.give_back_slice(&receipts).await;
            if let Some(mode) = failed {
                return Quota::Failed(mode);
            }
            if let Some(mut refusal) = refused {
                if refusal.remaining == u64::MAX {
                    refusal.remaining = 0;
                }
                return Quota::Refused(refusal);
            }
        }
        Quota::Granted(Grant {
            units,
            spend_ms: granted_ms,
            remaining: if remaining == u64::MAX { 0 } else { remaining },
            limits,
            receipts,
        })
    }

    /// Gives a slice back (all of it): one reserved too late in a counter's window to be
    /// spent, or one a client will never use. Best effort, as every release.
    pub async fn give_back_slice(&self, receipts: &[Receipt]) {
        if receipts.is_empty() {
            return;
        }
        let _ = telemetry::backend_call(
            "release",
            receipts.len(),
            || self.backend.release(receipts),
            |result| match result {
                Ok(()) => CallOutcome::Ok,
                Err(_) => CallOutcome::Error,
            },
        )
        .await;
    }

    /// Charges `units` that a client admitted without a slice (before its first assignment, or
    /// by its own fallback) to every limit of `descriptor`, whatever they have left: the
    /// charge is recorded even over the limit, so that what follows sees it. Nothing when no
    /// limit applies. Answers the limits charged.
    pub async fn charge_admitted(
        &self,
        domain: &str,
        descriptor: &Descriptor,
        units: u64,
    ) -> Vec<Arc<Limit>> {
        if units == 0 {
            return Vec::new();
        }
        let request = one_descriptor(domain, descriptor, units);
        let Some((limits, mut hits)) = self.slice_hits(&request) else {
            return Vec::new();
        };
        for hit in hits.iter_mut() {
            hit.cost = Cost::Consume(units);
            hit.counting = Counting::All;
            hit.tentative = false;
            hit.lease_ms = 0;
        }
        let _ = self.acquire_slice(&hits).await;
        limits
    }

    /// The limits `request`'s one descriptor resolves to and their hits, decided together where
    /// the backend can; `None` when nothing limits it.
    fn slice_hits(&self, request: &Request) -> Option<(Vec<Arc<Limit>>, Hits)> {
        let mut hits = Hits::new();
        let plans = {
            let config = self.config.load();
            let mut metadata: Vec<(usize, &MetaValue)> = Vec::new();
            let resolved = Self::resolve(&config, request, &mut metadata);
            self.plan(request, resolved, &mut hits)
        };
        match plans.into_iter().next() {
            Some(Plan::Limited(planned)) => {
                let limits: Vec<Arc<Limit>> = planned.into_iter().map(|p| p.limit).collect();
                Some((limits, hits))
            }
            _ => None,
        }
    }

    async fn acquire_slice(&self, hits: &Hits) -> crate::backend::Results {
        telemetry::backend_call(
            "acquire",
            hits.len(),
            || self.backend.acquire(hits),
            super::acquire_outcome,
        )
        .await
    }
}

/// How long after the decision a granted slice of `hit` may be spent: what the store stamped a
/// log's entry ahead by; for a counter, also no later than the end of the fixed window it was
/// charged to (its `reset_ms` less a window, from the decision).
fn spendable_ms(hit: &Hit, outcome: &Outcome) -> u64 {
    let ahead = lease::ahead_ms(hit);
    match hit.algorithm {
        Algorithm::SlidingWindowLog => ahead,
        Algorithm::SlidingWindowCounter => {
            ahead.min(outcome.verdict.reset_ms.saturating_sub(hit.window_ms))
        }
    }
}

/// A request of one descriptor in `domain`, costing `units`.
fn one_descriptor(domain: &str, descriptor: &Descriptor, units: u64) -> Request {
    let mut descriptor = descriptor.clone();
    descriptor.hits_addend = Some(units.max(1));
    Request {
        domain: domain.into(),
        descriptors: vec![descriptor],
        hits_addend: 0,
    }
}
