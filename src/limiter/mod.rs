//! The decision: check a request, resolve its descriptors to limits in the config snapshot, let
//! the backend charge them, and turn the verdicts into one answer. Knows nothing of gRPC; the
//! server converts at the edge.
//!
//! [`Limiter::should_rate_limit`] reads top to bottom:
//! 1. `validate`: the protocol's bounds, before anything is counted;
//! 2. `Limiter::resolve`: each descriptor's limit ([`Domain::resolve`], or the descriptor's own
//!    `limit` override) and the counter it charges ([`limiter_key`]);
//! 3. `Limiter::plan`: `replaces` and `unlimited` applied, one backend [`Hit`] per limit left;
//! 4. one [`Backend::acquire`] call for all hits;
//! 5. `Limiter::finish`: statuses, the overall code, `retry-after`, dynamic metadata, and a
//!    [`Backend::release`] of what a rejected request took.
//!
//! What a rejected request leaves behind depends on each limit's [`Counting`] (its own
//! `counting`, else [`Settings::counting`]):
//! - [`Counting::Admitted`] (tollgate's default): rejected requests consume nothing. A descriptor
//!   that is over does not count its hit, and when the request as a whole is over, the hits the
//!   other descriptors took are released again, and their statuses report what is left after
//!   that.
//! - [`Counting::All`] (envoyproxy/ratelimit's counting): every hit is charged, a refused one
//!   included, and nothing is given back. This is what keeps a token quota honest: Envoy debits
//!   the tokens a response spent with an ordinary call after the response, and ignores the
//!   answer, so a debit larger than what is left must still be charged.
//!
//! Either way a hit is admitted only when it fits (`used + c <= limit`), so no window ever admits
//! more than its limit, and a check (`hits_addend: 0`) consumes nothing and is refused only when
//! usage is above the limit.
//!
//! [`Domain::resolve`]: crate::config::Domain::resolve

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use smallvec::SmallVec;

pub use crate::counter_key::limiter_key;

mod choose;
mod inspect;
mod metadata;
mod quota;

use choose::{Answer, most_constrained, usage_of};
pub use inspect::{DescriptorUsage, InspectError, LimitUsage};
pub use quota::{Grant, Quota, Refusal};

use crate::backend::{Backend, BackendError, Hit, Outcome, Receipt, Results};
use crate::config::{Config, FailureMode, Limit, MetaValue};
use crate::descriptor::{Descriptor, Request};
use crate::telemetry::{self, CallOutcome};
use crate::window::{self, Cost, Counting};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest key or value, in bytes.
pub const MAX_TEXT_BYTES: usize = 1024;

/// The answer for one descriptor, or for the request as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// Within the limit.
    Ok,
    /// Over the limit.
    OverLimit,
}

/// The decision for one descriptor.
#[derive(Debug, Clone, PartialEq)]
pub struct Status {
    /// OK or OVER_LIMIT (a shadow-mode descriptor always reports OK).
    pub code: Code,
    /// The limit that applied; `None` when none did (no match, allow-list, replaced, unlimited).
    pub limit: Option<Arc<Limit>>,
    /// What is left of the limit: `floor(limit - used)` after this hit when it was admitted (and
    /// after it was given back, when another descriptor rejected the request under
    /// [`Counting::Admitted`]); when it was refused, what a smaller hit could still use under
    /// [`Counting::Admitted`] (the refused hit is not counted), 0 under [`Counting::All`] (it is).
    /// `u32::MAX` for unlimited, 0 when no limit applied.
    pub remaining: u32,
    /// Whole seconds until the quota is whole again (OK) or until the hit would fit (over).
    pub reset: Option<Duration>,
}

/// The decision for a whole request.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// OVER_LIMIT iff a non-shadow descriptor is over (and `--shadow-mode` is off).
    pub overall: Code,
    /// One status per request descriptor, in request order.
    pub statuses: Vec<Status>,
    /// Headers for Envoy to add to the downstream response (e.g. `retry-after`).
    pub response_headers: Vec<(String, String)>,
    /// With [`Settings::response_dynamic_metadata`], the response's dynamic metadata, shaped as
    /// envoyproxy/ratelimit shapes it: `{domain, descriptors: [{entries: ["k=v"], limit?,
    /// hitsAddend?}], hitsAddend?, metadata?}`, where `metadata` merges the `metadata` of the
    /// limits of the descriptors that passed (first writer wins per key, maps merged).
    pub dynamic_metadata: Option<MetaValue>,
    /// What each charged limit did, in request order, for the statistics the server keeps (the
    /// limiter decides, the server counts). Descriptors without a limit, and unlimited and
    /// replaced limits, have none, as envoyproxy/ratelimit counts nothing for them.
    pub reports: Vec<LimitReport>,
    /// Whether the request was over its limits but answered OK because of `--shadow-mode`.
    pub shadowed: bool,
}

/// What one charged limit did with a request's hit: the inputs of envoyproxy/ratelimit's
/// per-limit counters (`total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitReport {
    /// The request descriptor charged.
    pub descriptor: usize,
    /// The limit charged.
    pub limit: Arc<Limit>,
    /// The key the statistics are counted under when it comes from the request
    /// (`detailed_metric`, `value_to_metric`, a descriptor's own `limit`); `None`: the limit's
    /// `series_key`. See [`LimitReport::stat_key`].
    pub request_key: Option<String>,
    /// Whether the limit is the descriptor's own (Envoy's `limit` override), not the policies'.
    pub overridden: bool,
    /// The units the hit asked for (0 for a check, which counts nothing).
    pub cost: u64,
    /// What the backend made of it.
    pub usage: Usage,
    /// Whether the local over-limit cache refused it, without asking the store.
    pub local_cache: bool,
}

impl LimitReport {
    /// The key the reference counts this limit's statistics under, before its stat-name
    /// sanitising: `domain.key_value.key...`; for one of several limits of a descriptor, with
    /// its name after it ([`Limit::series_key`]).
    pub fn stat_key(&self) -> &str {
        self.request_key
            .as_deref()
            .unwrap_or(&self.limit.series_key)
    }
}

/// The usage of a limit around one hit, in whole units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// The backend decided: the usage before the hit and with it (`after = before + cost`,
    /// whether or not the hit was recorded), and whether it was admitted. A sliding window's
    /// fractional usage is rounded up, as the remaining reported to Envoy is rounded down.
    Decided {
        /// Usage before the hit.
        before: u64,
        /// Usage with the hit.
        after: u64,
        /// Whether the hit fit.
        admitted: bool,
    },
    /// The backend failed; the limit answered its failure mode.
    Failed(FailureMode),
}

/// Why a request could not be decided at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimiterError {
    /// The request breaks a rule of the protocol; nothing was counted.
    #[error("invalid rate limit request: {0}")]
    InvalidArgument(String),
}

/// Service-wide behaviour set by flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// What a limit without its own `failure_mode` answers when the backend fails.
    pub failure_mode: FailureMode,
    /// Report, never deny: the overall code is always OK (statuses and counting unchanged).
    pub shadow_mode: bool,
    /// Add `retry-after` to OVER_LIMIT responses.
    pub retry_after_header: bool,
    /// Which hits a limit without its own `counting` records. `tollgate serve` defaults to
    /// [`Counting::Admitted`]; the `ratelimit` entry point to [`Counting::All`], which is
    /// envoyproxy/ratelimit's `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`.
    pub counting: Counting,
    /// Every descriptor counts as a quota descriptor (envoyproxy/ratelimit's `QUOTA_MODE`): a
    /// request is rejected only when every descriptor that is not unlimited is over (one without
    /// a limit never is).
    pub quota_mode: bool,
    /// Return dynamic metadata in every response (envoyproxy/ratelimit's
    /// `RESPONSE_DYNAMIC_METADATA`); see [`Decision::dynamic_metadata`].
    pub response_dynamic_metadata: bool,
    /// With [`Settings::response_dynamic_metadata`], also name each refused descriptor's
    /// refusing limit in the metadata (`overLimit`). On under `tollgate serve`; off under the
    /// `ratelimit` entry point unless asked for, so its metadata is the reference's exactly.
    pub over_limit_metadata: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            failure_mode: FailureMode::Allow,
            shadow_mode: false,
            retry_after_header: true,
            counting: Counting::Admitted,
            quota_mode: false,
            response_dynamic_metadata: false,
            over_limit_metadata: true,
        }
    }
}

/// The names of the draft RateLimit response headers (envoyproxy/ratelimit's
/// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitHeaders {
    /// Carries the limit's `requests_per_unit`.
    pub limit: String,
    /// Carries what is left of it.
    pub remaining: String,
    /// Carries the seconds until the quota is whole again (OK) or the hit would fit (over).
    pub reset: String,
}

impl Default for LimitHeaders {
    fn default() -> Self {
        LimitHeaders {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Decides rate-limit requests against the current config snapshot and a backend.
#[derive(Debug)]
pub struct Limiter<B> {
    config: ArcSwap<Config>,
    backend: B,
    settings: Settings,
    limit_headers: Option<LimitHeaders>,
}

/// One limit a descriptor resolved to: the limit, the identity of the counter it charges (empty
/// when nothing will be charged) and its statistics key when the request supplies it.
struct Found<'c> {
    limit: LimitRef<'c>,
    key: String,
    request_key: Option<String>,
}

/// What one descriptor resolved to: nothing, or the limits that apply in declaration order
/// (one for `rate_limit`, several for `rate_limits`).
type Resolved<'c> = SmallVec<[Found<'c>; 1]>;

/// A limit as `resolve` found it: borrowed from the config snapshot, or a descriptor's own,
/// made for this request. Borrowing keeps the snapshot's limits uncounted until a plan needs
/// one of its own: a reference count is a cache line every worker writes at every call.
enum LimitRef<'c> {
    /// A limit of the config.
    Config(&'c Arc<Limit>),
    /// A descriptor's own limit.
    Own(Arc<Limit>),
}

impl LimitRef<'_> {
    fn arc(&self) -> &Arc<Limit> {
        match self {
            LimitRef::Config(limit) => limit,
            LimitRef::Own(limit) => limit,
        }
    }
}

/// A request's descriptors, or what is made of each, kept inline for the usual request of a
/// few descriptors: the limiter makes three such lists a decision, and each was an allocation
/// and a free on every call.
type PerDescriptor<T> = SmallVec<[T; INLINE_DESCRIPTORS]>;

/// Descriptors a request may carry before [`PerDescriptor`] allocates.
const INLINE_DESCRIPTORS: usize = 2;

/// What each descriptor resolved to.
type ResolvedAll<'c> = PerDescriptor<Resolved<'c>>;
/// What each descriptor will do.
type Plans = PerDescriptor<Plan>;
/// The backend hits of a request.
type Hits = PerDescriptor<Hit>;

/// What one descriptor resolved to before the backend is asked.
enum Plan {
    /// No limit applies.
    Free,
    /// An `unlimited` limit applies.
    Unlimited,
    /// Limits to charge, in declaration order; the hits of one descriptor are adjacent.
    Limited(SmallVec<[Planned; 1]>),
}

/// One limit of a descriptor to charge.
struct Planned {
    limit: Arc<Limit>,
    /// Indexes the request's hits.
    hit: usize,
    /// The limit's counting in force.
    counting: Counting,
    request_key: Option<String>,
    overridden: bool,
}

/// A request's statuses and reports as the backend's verdicts make them, before a rejected
/// request gives its charges back.
struct Verdicts {
    statuses: Vec<Status>,
    reports: Vec<LimitReport>,
    /// Per descriptor, which of its planned limits its status describes.
    chosen: PerDescriptor<Option<usize>>,
    /// Per descriptor, whether one of its limits refused the hit (shadow mode or not).
    refused: PerDescriptor<bool>,
    /// Over a plain limit, or over every quota limit.
    rejected: bool,
    /// The longest wait of the limits over, in seconds, for `retry-after`.
    retry_after: Option<u64>,
}

impl<B: Backend> Limiter<B> {
    /// A limiter over `backend`, starting with `config`.
    pub fn new(config: Arc<Config>, backend: B, settings: Settings) -> Self {
        Limiter {
            config: ArcSwap::new(config),
            backend,
            settings,
            limit_headers: None,
        }
    }

    /// The config snapshot in force.
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// Replaces the config; requests already in flight finish with the old one.
    pub fn set_config(&self, config: Arc<Config>) {
        self.config.store(config);
    }

    /// The backend the limiter charges.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The flags the limiter runs with.
    pub fn settings(&self) -> Settings {
        self.settings
    }

    /// Adds the draft RateLimit headers (limit, remaining, reset) of the most constrained
    /// descriptor to every response that had a limit, under `names`.
    pub fn with_limit_headers(mut self, names: LimitHeaders) -> Self {
        self.limit_headers = Some(names);
        self
    }

    /// Decides one request: charges every applicable limit, answers per descriptor in request
    /// order, and gives back what was taken when the request is rejected.
    pub async fn should_rate_limit(&self, request: &Request) -> Result<Decision, LimiterError> {
        validate(request)?;
        // One snapshot for the whole request, even if a reload swaps the config meanwhile. What
        // the rest of the decision needs of it (the limits, the metadata) is taken out before
        // the backend is awaited, so the snapshot is only borrowed, never counted.
        let mut hits = Hits::new();
        let (plans, metadata_sources) = {
            let config = self.config.load();
            let mut metadata_sources: Vec<(usize, &MetaValue)> = Vec::new();
            let resolved = Self::resolve(&config, request, &mut metadata_sources);
            let plans = self.plan(request, resolved, &mut hits);
            let metadata_sources: Vec<(usize, MetaValue)> = metadata_sources
                .into_iter()
                .map(|(index, meta)| (index, meta.clone()))
                .collect();
            (plans, metadata_sources)
        };
        let mut results = if hits.is_empty() {
            Vec::new()
        } else {
            telemetry::backend_call(
                "acquire",
                hits.len(),
                || self.backend.acquire(&hits),
                acquire_outcome,
            )
            .await
        };
        let mut verdicts = self.verdicts(request, &plans, &results);
        if verdicts.rejected || verdicts.refused.iter().any(|refused| *refused) {
            let receipts = refundable(&plans, &mut results, &verdicts);
            if !receipts.is_empty() {
                // Boxed: only a refusal with charges to return awaits a release, and its
                // future would otherwise widen the state of every decision.
                Box::pin(self.give_back(receipts, &mut verdicts)).await;
            }
        }
        Ok(self.conclude(request, &plans, verdicts, &metadata_sources))
    }

    /// The limits of each descriptor and the counters they charge: the descriptor's own
    /// `limit` override if it carries one, else what its domain's descriptor tree says.
    /// Collects the matched nodes' `metadata` by descriptor index.
    fn resolve<'c>(
        config: &'c Config,
        request: &Request,
        metadata_sources: &mut Vec<(usize, &'c MetaValue)>,
    ) -> ResolvedAll<'c> {
        let Some(domain) = config.domain(&request.domain) else {
            // An unknown domain limits nothing, overrides included.
            return request
                .descriptors
                .iter()
                .map(|_| Resolved::new())
                .collect();
        };
        let mut resolved = ResolvedAll::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let mut found = Resolved::new();
            if let Some(limit) = override_limit(&request.domain, descriptor) {
                let key = limiter_key(
                    &request.domain,
                    &descriptor.entries,
                    &[],
                    limit.algorithm,
                    limit.window_ms,
                );
                // The override's statistics are keyed by the request's entries.
                let request_key = Some(limit.full_key.clone());
                found.push(Found {
                    limit: LimitRef::Own(limit),
                    key,
                    request_key,
                });
            } else if let Some(matched) = domain.resolve(&descriptor.entries) {
                if let Some(meta) = matched.metadata {
                    metadata_sources.push((index, meta));
                }
                let metric_key = matched.metric_key;
                for (limit, key) in matched.limits.iter().zip(matched.counter_keys) {
                    found.push(Found {
                        limit: LimitRef::Config(limit),
                        key,
                        request_key: request_key(metric_key.as_deref(), limit),
                    });
                }
            }
            resolved.push(found);
        }
        resolved
    }

    /// Applies `replaces` and `unlimited`, turns the remaining limits into backend hits, and
    /// settles how each is decided: the limits of one descriptor together when the backend can
    /// ([`Backend::joint`]), and tentatively when a refusal elsewhere may give the charge back.
    fn plan(&self, request: &Request, mut resolved: ResolvedAll<'_>, hits: &mut Hits) -> Plans {
        let mut plans = Plans::new();
        for (index, descriptor) in request.descriptors.iter().enumerate() {
            let Some(found) = resolved.get(index) else {
                break;
            };
            if found.is_empty() {
                plans.push(Plan::Free);
                continue;
            }
            if found.iter().any(|f| f.limit.arc().unlimited) {
                // Only a descriptor's one `rate_limit` can be unlimited.
                plans.push(Plan::Unlimited);
                continue;
            }
            let kept: SmallVec<[bool; 4]> = found
                .iter()
                .map(|f| !is_replaced(f.limit.arc(), &resolved))
                .collect();
            let group = if kept.iter().filter(|k| **k).count() > 1 {
                u32::try_from(index + 1).unwrap_or(u32::MAX)
            } else {
                0
            };
            let mut planned = SmallVec::new();
            for (position, keep) in kept.into_iter().enumerate() {
                let Some(found) = resolved
                    .get_mut(index)
                    .and_then(|found| found.get_mut(position))
                else {
                    break;
                };
                if !keep {
                    continue;
                }
                let limit = Arc::clone(found.limit.arc());
                let counting = limit.counting.unwrap_or(self.settings.counting);
                hits.push(Hit {
                    // The key was built for this hit alone: move it rather than copy it.
                    key: std::mem::take(&mut found.key),
                    algorithm: limit.algorithm,
                    limit: u64::from(limit.requests_per_unit),
                    window_ms: limit.window_ms,
                    cost: cost_of(request, descriptor),
                    counting,
                    shards: limit.shards,
                    lease_ms: if limit.lease {
                        crate::backend::lease::lease_ms(limit.window_ms)
                    } else {
                        0
                    },
                    // Settled below, once every hit of the request is known.
                    tentative: false,
                    group,
                    descriptor_tag: limit.joint,
                    slice: false,
                });
                planned.push(Planned {
                    limit,
                    hit: hits.len() - 1,
                    counting,
                    request_key: found.request_key.take(),
                    // `resolve` takes a descriptor's own limit whenever it names a unit.
                    overridden: descriptor.limit.is_some_and(|l| l.unit.is_some()),
                });
            }
            plans.push(if planned.is_empty() {
                Plan::Free
            } else {
                Plan::Limited(planned)
            });
        }
        let total = hits.len();
        for plan in &plans {
            let Plan::Limited(planned) = plan else {
                continue;
            };
            let (Some(first), Some(last)) = (planned.first(), planned.last()) else {
                continue;
            };
            let Some(together) = hits.get_mut(first.hit..=last.hit) else {
                continue;
            };
            if together.len() > 1 && !self.backend.joint(together) {
                // Decided hit by hit: a refusal gives back what the others took.
                for hit in together.iter_mut() {
                    hit.group = 0;
                }
            }
            // A charge is given back when another limit of the request refuses it
            // (`refundable`), so every charge that a refusal does not keep is tentative unless
            // its own group is the whole request; a lone hit's charge is final.
            let decided_with = if together.first().is_some_and(|hit| hit.group != 0) {
                together.len()
            } else {
                1
            };
            if total > decided_with {
                for hit in together.iter_mut() {
                    hit.tentative = hit.counting == Counting::Admitted;
                }
            }
        }
        plans
    }

    /// What one planned limit answered: its backend result, or its failure mode.
    fn answer(
        &self,
        planned: &Planned,
        cost: u64,
        result: Option<&Result<Outcome, BackendError>>,
    ) -> Answer {
        let limit = &planned.limit;
        match result {
            Some(Ok(outcome)) if outcome.cached && outcome.verdict.admitted => Answer {
                admitted: true,
                remaining: u64::from(limit.requests_per_unit),
                reset_ms: 0,
                usage: Usage::Decided {
                    before: 0,
                    after: 0,
                    admitted: true,
                },
                local_cache: false,
                unasked: true,
            },
            Some(Ok(outcome)) => {
                let verdict = outcome.verdict;
                Answer {
                    admitted: verdict.admitted,
                    remaining: verdict.remaining,
                    reset_ms: verdict.reset_ms,
                    usage: usage_of(
                        u64::from(limit.requests_per_unit),
                        cost,
                        verdict.admitted,
                        verdict.remaining,
                        planned.counting,
                    ),
                    local_cache: outcome.cached,
                    unasked: false,
                }
            }
            Some(Err(_)) | None => {
                // The backend logs its own failures, once per burst. A missing result (a
                // backend answering fewer hits than asked) is a failure too.
                let mode = limit.failure_mode.unwrap_or(self.settings.failure_mode);
                let (admitted, remaining, reset_ms) = match mode {
                    FailureMode::Allow => (true, u64::from(limit.requests_per_unit), 0),
                    FailureMode::Deny => (false, 0, 1000),
                };
                Answer {
                    admitted,
                    remaining,
                    reset_ms,
                    usage: Usage::Failed(mode),
                    local_cache: false,
                    unasked: false,
                }
            }
        }
    }

    /// Combines the backend's verdicts into one status per descriptor and one report per charged
    /// limit, and tells whether the request is rejected. Nothing is given back yet.
    ///
    /// A descriptor of several limits is admitted when every limit admits its hit. Its status
    /// describes, when admitted, the limit with the least left (of equals, the shorter window);
    /// when refused, the refusing limit whose retry comes last, so its reset is when every
    /// limit would admit the same hit.
    fn verdicts(&self, request: &Request, plans: &Plans, results: &Results) -> Verdicts {
        let mut statuses = Vec::with_capacity(plans.len());
        let mut chosen = PerDescriptor::new();
        let mut refused = PerDescriptor::new();
        let mut rate_limits_over = 0usize;
        let (mut quota_total, mut quota_over) = (0usize, 0usize);
        let mut retry_after: Option<u64> = None;
        let mut reports = Vec::with_capacity(plans.len());

        for (descriptor, plan) in plans.iter().enumerate() {
            let planned = match plan {
                Plan::Free => {
                    // Under global quota mode a descriptor without a limit is a quota descriptor
                    // that always passes, as in envoyproxy/ratelimit.
                    if self.settings.quota_mode {
                        quota_total += 1;
                    }
                    statuses.push(Status {
                        code: Code::Ok,
                        limit: None,
                        remaining: 0,
                        reset: None,
                    });
                    chosen.push(None);
                    refused.push(false);
                    continue;
                }
                Plan::Unlimited => {
                    statuses.push(Status {
                        code: Code::Ok,
                        limit: None,
                        remaining: u32::MAX,
                        reset: None,
                    });
                    chosen.push(None);
                    refused.push(false);
                    continue;
                }
                Plan::Limited(planned) => planned,
            };
            let cost = match request.descriptors.get(descriptor) {
                Some(d) => match cost_of(request, d) {
                    Cost::Consume(units) => units,
                    Cost::CheckOnly => 0,
                },
                None => 0,
            };
            // Read in place: the receipts stay in `results` until a refusal needs them.
            let answers: SmallVec<[Answer; 1]> = planned
                .iter()
                .map(|p| self.answer(p, cost, results.get(p.hit)))
                .collect();
            for (p, answer) in planned.iter().zip(&answers) {
                if answer.unasked {
                    continue;
                }
                reports.push(LimitReport {
                    descriptor,
                    limit: Arc::clone(&p.limit),
                    request_key: p.request_key.clone(),
                    overridden: p.overridden,
                    cost,
                    usage: answer.usage,
                    local_cache: answer.local_cache,
                });
            }
            let over = answers.iter().any(|answer| !answer.admitted);
            let pick = choose::pick(
                |i| planned.get(i).map_or(0, |p| p.limit.window_ms),
                &answers,
                over,
            );
            let (Some(p), Some(answer)) = (planned.get(pick), answers.get(pick)) else {
                continue;
            };
            let limit = &p.limit;
            let mut code = if over { Code::OverLimit } else { Code::Ok };
            if code == Code::OverLimit && limit.shadow_mode {
                code = Code::Ok;
            }
            let quota = self.settings.quota_mode || limit.quota_mode;
            if quota {
                quota_total += 1;
            }
            if code == Code::OverLimit {
                if quota {
                    quota_over += 1;
                } else {
                    rate_limits_over += 1;
                }
                let seconds = window::reset_seconds(answer.reset_ms);
                retry_after = Some(retry_after.map_or(seconds, |r| r.max(seconds)));
            }
            statuses.push(Status {
                code,
                limit: Some(Arc::clone(limit)),
                remaining: u32::try_from(answer.remaining).unwrap_or(u32::MAX),
                reset: Some(Duration::from_secs(window::reset_seconds(answer.reset_ms))),
            });
            chosen.push(Some(pick));
            refused.push(over);
        }

        // As in envoyproxy/ratelimit: any plain limit over, or every quota limit over.
        let rejected = rate_limits_over > 0 || (quota_total > 0 && quota_total == quota_over);
        Verdicts {
            statuses,
            reports,
            chosen,
            refused,
            rejected,
            retry_after,
        }
    }

    /// Gives back the charges `receipts` names (by descriptor and limit); each status then
    /// reports what its limit has left.
    async fn give_back(&self, receipts: Vec<(usize, usize, Receipt)>, verdicts: &mut Verdicts) {
        let given_back: Vec<Receipt> = receipts
            .iter()
            .map(|(_, _, receipt)| receipt.clone())
            .collect();
        // Failing to give back only errs on the strict side (fewer admissions later); the
        // backend logs it, and the statuses keep what was true before.
        let released = telemetry::backend_call(
            "release",
            given_back.len(),
            || self.backend.release(&given_back),
            |result| match result {
                Ok(()) => CallOutcome::Ok,
                Err(_) => CallOutcome::Error,
            },
        )
        .await;
        if released.is_ok() {
            for (descriptor, position, receipt) in receipts {
                let described = verdicts.chosen.get(descriptor).copied().flatten();
                if described == Some(position)
                    && let Some(status) = verdicts.statuses.get_mut(descriptor)
                {
                    status.remaining =
                        u32::try_from(receipt.released_remaining).unwrap_or(u32::MAX);
                }
            }
        }
    }

    /// The decision of a request whose charges are settled: its overall code, the headers for
    /// Envoy and the dynamic metadata.
    fn conclude(
        &self,
        request: &Request,
        plans: &Plans,
        verdicts: Verdicts,
        metadata_sources: &[(usize, MetaValue)],
    ) -> Decision {
        let Verdicts {
            statuses,
            reports,
            rejected,
            retry_after,
            ..
        } = verdicts;
        let overall = if rejected && !self.settings.shadow_mode {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let mut response_headers = Vec::new();
        if let Some(seconds) = retry_after
            && overall == Code::OverLimit
            && self.settings.retry_after_header
        {
            response_headers.push(("retry-after".to_string(), seconds.to_string()));
        }
        if let Some(names) = &self.limit_headers
            && let Some(status) = most_constrained(&statuses)
            && let Some(limit) = &status.limit
        {
            let reset = status.reset.map_or(0, |reset| reset.as_secs());
            response_headers.extend([
                (names.limit.clone(), limit.requests_per_unit.to_string()),
                (names.remaining.clone(), status.remaining.to_string()),
                (names.reset.clone(), reset.to_string()),
            ]);
        }
        let dynamic_metadata = self.settings.response_dynamic_metadata.then(|| {
            // A descriptor passed when a limit of the config applied and it is not over; a
            // replaced or unlimited limit contributes nothing, as in envoyproxy/ratelimit.
            let passed = |index: usize| {
                matches!(plans.get(index), Some(Plan::Limited(_)))
                    && statuses.get(index).is_some_and(|s| s.code == Code::Ok)
            };
            let sources = metadata_sources
                .iter()
                .filter(|(index, _)| passed(*index))
                .map(|(_, meta)| meta);
            let over_limit: Vec<(usize, &str)> = statuses
                .iter()
                .enumerate()
                .filter(|_| self.settings.over_limit_metadata)
                .filter(|(_, status)| status.code == Code::OverLimit)
                .filter_map(|(index, status)| {
                    let limit = status.limit.as_ref()?;
                    Some((index, limit.name.as_deref().unwrap_or(&limit.full_key)))
                })
                .collect();
            metadata::dynamic_metadata(request, metadata::merge_metadata(sources), &over_limit)
        });
        Decision {
            overall,
            statuses,
            response_headers,
            dynamic_metadata,
            reports,
            shadowed: rejected && self.settings.shadow_mode,
        }
    }
}

/// The charges a refusal gives back, taken out of `results`, by descriptor and limit: those of
/// limits that count admitted hits only, of every descriptor when the request is rejected, else
/// of the descriptors one of whose limits refused (the limits of a descriptor are charged all
/// or none).
fn refundable(
    plans: &Plans,
    results: &mut Results,
    verdicts: &Verdicts,
) -> Vec<(usize, usize, Receipt)> {
    let mut receipts = Vec::new();
    for (descriptor, plan) in plans.iter().enumerate() {
        let Plan::Limited(planned) = plan else {
            continue;
        };
        if !verdicts.rejected && !verdicts.refused.get(descriptor).copied().unwrap_or(false) {
            continue;
        }
        for (position, p) in planned.iter().enumerate() {
            if p.counting != Counting::Admitted {
                continue;
            }
            let Some(Ok(outcome)) = results.get_mut(p.hit) else {
                continue;
            };
            if let Some(receipt) = outcome.receipt.take() {
                receipts.push((descriptor, position, receipt));
            }
        }
    }
    receipts
}

/// Checks `request` against the protocol's bounds; the error says which rule and where. Bounded
/// requests keep the work and the key length of one decision bounded whatever a client sends.
fn validate(request: &Request) -> Result<(), LimiterError> {
    let invalid = |message: String| Err(LimiterError::InvalidArgument(message));
    if request.domain.is_empty() {
        return invalid("rate limit domain must not be empty".into());
    }
    if request.domain.len() > MAX_TEXT_BYTES {
        return invalid(format!(
            "domain is {} bytes long; at most {MAX_TEXT_BYTES} are allowed",
            request.domain.len()
        ));
    }
    if request.descriptors.is_empty() {
        return invalid("rate limit descriptor list must not be empty".into());
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return invalid(format!(
            "{} descriptors in one request; at most {MAX_DESCRIPTORS} are allowed",
            request.descriptors.len()
        ));
    }
    // A descriptor with no entries is valid: it matches nothing (unless it carries its own
    // `limit`), as envoyproxy/ratelimit answers it.
    for (d, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.len() > MAX_ENTRIES {
            return invalid(format!(
                "descriptor {d} has {} entries; at most {MAX_ENTRIES} are allowed",
                descriptor.entries.len()
            ));
        }
        for (e, entry) in descriptor.entries.iter().enumerate() {
            if entry.key.is_empty() {
                return invalid(format!("descriptor {d} entry {e} has an empty key"));
            }
            if entry.key.len() > MAX_TEXT_BYTES || entry.value.len() > MAX_TEXT_BYTES {
                return invalid(format!(
                    "descriptor {d} entry {e} is longer than {MAX_TEXT_BYTES} bytes (key or value)"
                ));
            }
        }
    }
    Ok(())
}

/// Whether another applicable limit names `limit` in its `replaces`. As in envoyproxy/ratelimit,
/// unlimited limits may replace others but are never replaced (the caller checks `unlimited`
/// first).
fn is_replaced(limit: &Limit, resolved: &[Resolved<'_>]) -> bool {
    limit.name.as_deref().is_some_and(|name| {
        resolved
            .iter()
            .flatten()
            .any(|other| other.limit.arc().replaces.iter().any(|r| r == name))
    })
}

/// The statistics key a request builds for `limit` from its descriptor's (`metric_key`,
/// from `detailed_metric` or `value_to_metric`): for one of several limits of a descriptor,
/// with the limit's part of its series key after it, so each limit keeps a series of its own.
fn request_key(metric_key: Option<&str>, limit: &Limit) -> Option<String> {
    let key = metric_key?;
    match limit.series_key.strip_prefix(limit.full_key.as_str()) {
        Some(own) if limit.joint && !own.is_empty() => Some(format!("{key}{own}")),
        _ => Some(key.to_string()),
    }
}

/// The cost of one descriptor's hit: its own `hits_addend` (0 = check only), else the request's
/// (0 = 1).
fn cost_of(request: &Request, descriptor: &Descriptor) -> Cost {
    match descriptor.hits_addend {
        Some(0) => Cost::CheckOnly,
        Some(n) => Cost::Consume(n),
        None => Cost::Consume(u64::from(request.hits_addend.max(1))),
    }
}

/// The limit a descriptor carries itself (Envoy's `limit` override), which replaces the
/// configured one for any descriptor of a known domain.
fn override_limit(domain: &str, descriptor: &Descriptor) -> Option<Arc<Limit>> {
    let requested = descriptor.limit?;
    let unit = requested.unit?;
    let mut full_key = String::from(domain);
    for entry in &descriptor.entries {
        full_key.push('.');
        full_key.push_str(&entry.key);
        if !entry.value.is_empty() {
            full_key.push('_');
            full_key.push_str(&entry.value);
        }
    }
    Some(Arc::new(Limit::plain(
        full_key,
        requested.requests_per_unit,
        unit,
    )))
}

/// How an acquire call went, for its span: any failed hit makes it an error, else any refused
/// hit makes it over the limit.
#[allow(clippy::ptr_arg)] // the acquire call's own output type, passed by reference
fn acquire_outcome(results: &Vec<Result<Outcome, BackendError>>) -> CallOutcome {
    let mut outcome = CallOutcome::Ok;
    for result in results {
        match result {
            Err(_) => return CallOutcome::Error,
            Ok(o) if !o.verdict.admitted => outcome = CallOutcome::OverLimit,
            Ok(_) => {}
        }
    }
    outcome
}

#[cfg(test)]
mod tests;
