//! Envoy's Rate Limit Quota Service: another door into the limiter that RLS uses. Envoy's
//! `rate_limit_quota` filter opens one stream per domain and reports, per bucket, what it
//! admitted and denied (at once for a new bucket, then every five seconds); tollgate answers
//! each bucket with what Envoy enforces on its own, with no call on the request path:
//!
//! - a bucket that resolves to a limit gets slices of the limit's quota, reserved in the same
//!   counters RLS charges ([`Limiter::reserve`]) and sent as token buckets that do not refill,
//!   renewed before they run dry or expire;
//! - a bucket no limit governs (unknown domain, no match, allow-listed, `unlimited`) gets
//!   ALLOW_ALL with a long lifetime; one whose limits are in shadow mode gets ALLOW_ALL and what
//!   Envoy reports is charged to them;
//! - what Envoy admitted beyond its slices (before the first, or by its own fallback) is charged
//!   when reported, so RLS and the other Envoys see it.
//!
//! docs/rlqs.md says what this holds exactly and what it can miss.

mod bucket;

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures_util::Stream;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status, Streaming};

use self::bucket::{Assigned, Bucket, DELIVERY_MS, FREE_TTL_S, RENEW_AFTER, SLICE_TTL_S, SPEND_MS};
use super::App;
use crate::backend::Backend;
use crate::config::{FailureMode, Limit};
use crate::descriptor::Entry;
use crate::limiter::{MAX_ENTRIES, MAX_TEXT_BYTES, Quota};
use crate::proto::rlqs::rate_limit_quota_response::BucketAction;
use crate::proto::rlqs::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use crate::proto::rlqs::rate_limit_quota_service_server::{
    RateLimitQuotaService, RateLimitQuotaServiceServer,
};
use crate::proto::rlqs::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports, RateLimitStrategy, TokenBucket,
    rate_limit_strategy,
};

/// The most buckets all streams together hold; a bucket past it gets no assignment (Envoy
/// applies its `no_assignment_behavior`) until others are abandoned.
pub const MAX_BUCKETS: usize = 100_000;

/// The most buckets one stream holds.
pub const MAX_BUCKETS_PER_STREAM: usize = 20_000;

/// The most bucket actions one response carries (a response of every bucket of a large stream
/// would be megabytes).
const ACTIONS_PER_RESPONSE: usize = 1000;

/// A token bucket's fill interval when it must not refill: a year, Envoy's slowest rate (one
/// token a year).
const NO_REFILL: prost_types::Duration = prost_types::Duration {
    seconds: 365 * 24 * 3600,
    nanos: 0,
};

/// What RLQS did, process-wide (one RLQS service per process; tests share these).
#[derive(Debug, Default)]
struct Counters {
    streams: Gauge,
    buckets: Gauge,
    assignments: Family<KindLabel, Counter>,
    slice_units: Counter,
    charged_units: Counter,
    stream_errors: Counter,
    messages: Family<DirectionLabel, Counter>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: &'static str,
}

fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<Counters> = OnceLock::new();
    COUNTERS.get_or_init(Counters::default)
}

/// Adds the RLQS metrics to `registry` (whose prefix the names get).
pub fn register(registry: &mut Registry) {
    let c = counters();
    registry.register("rlqs_streams", "RLQS streams open", c.streams.clone());
    registry.register(
        "rlqs_buckets",
        "RLQS buckets held, over every stream",
        c.buckets.clone(),
    );
    registry.register(
        "rlqs_assignments",
        "Bucket actions sent to RLQS clients, by kind (slice, allow_all, deny_all, abandon)",
        c.assignments.clone(),
    );
    registry.register(
        "rlqs_slice_units",
        "Requests reserved in the store for RLQS clients as slices",
        c.slice_units.clone(),
    );
    registry.register(
        "rlqs_charged_units",
        "Requests RLQS clients admitted beyond their slices, charged when reported",
        c.charged_units.clone(),
    );
    registry.register(
        "rlqs_stream_errors",
        "RLQS streams ended by an error (a bad report, or the transport)",
        c.stream_errors.clone(),
    );
    registry.register(
        "rlqs_messages",
        "RLQS stream messages, by direction (received: usage reports; sent: responses)",
        c.messages.clone(),
    );
}

/// Counts one stream message going `direction` (`received` or `sent`).
fn count_message(direction: &'static str) {
    counters()
        .messages
        .get_or_create(&DirectionLabel { direction })
        .inc();
}

/// Counts the actions of one response by kind.
fn count_actions(actions: &[BucketAction]) {
    for action in actions {
        let kind = match &action.bucket_action {
            Some(bucket_action::BucketAction::AbandonAction(_)) => "abandon",
            Some(bucket_action::BucketAction::QuotaAssignmentAction(assignment)) => {
                match assignment
                    .rate_limit_strategy
                    .as_ref()
                    .and_then(|s| s.strategy.as_ref())
                {
                    Some(rate_limit_strategy::Strategy::TokenBucket(_)) => "slice",
                    Some(rate_limit_strategy::Strategy::BlanketRule(rule))
                        if *rule == rate_limit_strategy::BlanketRule::AllowAll as i32 =>
                    {
                        "allow_all"
                    }
                    _ => "deny_all",
                }
            }
            None => continue,
        };
        counters()
            .assignments
            .get_or_create(&KindLabel { kind })
            .inc();
    }
}

/// Logs a stream's failure at most once a minute, with how many were not logged.
fn log_stream_error(error: &dyn std::fmt::Display) {
    static LAST: Mutex<Option<(Instant, u64)>> = Mutex::new(None);
    counters().stream_errors.inc();
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    let now = Instant::now();
    match last.as_mut() {
        Some((at, suppressed)) if now.duration_since(*at) < Duration::from_secs(60) => {
            *suppressed += 1;
        }
        _ => {
            let suppressed = last.map_or(0, |(_, n)| n);
            tracing::warn!(%error, suppressed, "an RLQS stream ended with an error");
            *last = Some((now, 0));
        }
    }
}

/// The RLQS gRPC service over the app's limiter.
pub struct QuotaService<B> {
    app: Arc<App<B>>,
    /// Turns true when the server shuts down: every stream ends.
    stop: watch::Receiver<bool>,
    /// Buckets held by all streams.
    buckets: Arc<AtomicUsize>,
}

impl<B: Backend> QuotaService<B> {
    /// The tonic service, ending its streams when `stop` turns true.
    pub fn server(
        app: Arc<App<B>>,
        stop: watch::Receiver<bool>,
    ) -> RateLimitQuotaServiceServer<QuotaService<B>> {
        RateLimitQuotaServiceServer::new(QuotaService {
            app,
            stop,
            buckets: Arc::new(AtomicUsize::new(0)),
        })
    }
}

type Responses = Pin<Box<dyn Stream<Item = Result<RateLimitQuotaResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<B: Backend> RateLimitQuotaService for QuotaService<B> {
    type StreamRateLimitQuotasStream = Responses;

    async fn stream_rate_limit_quotas(
        &self,
        request: Request<Streaming<RateLimitQuotaUsageReports>>,
    ) -> Result<Response<Responses>, Status> {
        let reports = request.into_inner();
        // A few responses in flight: a stream whose Envoy reads nothing holds no more.
        let (tx, rx) = mpsc::channel(4);
        let session = Session {
            app: Arc::clone(&self.app),
            domain: None,
            buckets: HashMap::new(),
            total: Arc::clone(&self.buckets),
            tx,
        };
        tokio::spawn(session.run(reports, self.stop.clone()));
        let responses = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|response| (response, rx))
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// A bucket's identity within a stream: its id's entries, sorted.
type BucketKey = Vec<(String, String)>;

/// One Envoy's stream.
struct Session<B> {
    app: Arc<App<B>>,
    /// The domain of the stream's first report.
    domain: Option<String>,
    buckets: HashMap<BucketKey, Bucket>,
    /// Buckets of all streams.
    total: Arc<AtomicUsize>,
    tx: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
}

impl<B: Backend> Session<B> {
    /// Serves the stream until Envoy closes it, it fails, or the server stops.
    async fn run(
        mut self,
        mut reports: Streaming<RateLimitQuotaUsageReports>,
        mut stop: watch::Receiver<bool>,
    ) {
        counters().streams.inc();
        let stopped = async move {
            let _ = stop.wait_for(|stop| *stop).await;
        };
        tokio::pin!(stopped);
        loop {
            let due = self.next_due();
            let sleep = tokio::time::sleep_until(due.into());
            tokio::select! {
                message = reports.message() => match message {
                    Ok(Some(report)) => {
                        count_message("received");
                        if let Err(status) = self.on_report(report).await {
                            log_stream_error(&status.message());
                            let _ = self.tx.send(Err(status)).await;
                            break;
                        }
                    }
                    Ok(None) => break,
                    Err(status) => {
                        log_stream_error(&status);
                        break;
                    }
                },
                () = sleep => self.on_due().await,
                () = &mut stopped => break,
                () = self.tx.closed() => break,
            }
        }
        self.total.fetch_sub(self.buckets.len(), Ordering::Relaxed);
        counters().streams.dec();
        counters()
            .buckets
            .set(i64::try_from(self.total.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
    }

    /// Counts one more bucket against both bounds, or answers false when either is reached.
    fn take_bucket_room(&self) -> bool {
        if self.buckets.len() >= MAX_BUCKETS_PER_STREAM {
            return false;
        }
        // Counted first, so that streams racing for the last room cannot overshoot it.
        if self.total.fetch_add(1, Ordering::Relaxed) >= MAX_BUCKETS {
            self.total.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// When the next bucket is due (an hour away when none is).
    fn next_due(&self) -> Instant {
        self.buckets
            .values()
            .map(|bucket| bucket.due)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600))
    }

    /// Takes in one usage report: new buckets are assigned at once, usage beyond the slices
    /// is charged, idle buckets are abandoned.
    async fn on_report(&mut self, report: RateLimitQuotaUsageReports) -> Result<(), Status> {
        match (&self.domain, report.domain.as_str()) {
            (None, "") => {
                return Err(Status::invalid_argument(
                    "the first RLQS report names no domain; set `domain` in Envoy's \
                     rate_limit_quota filter to the policy domain",
                ));
            }
            (None, domain) => self.domain = Some(domain.to_string()),
            (Some(ours), domain) if !domain.is_empty() && domain != ours => {
                return Err(Status::invalid_argument(format!(
                    "an RLQS stream serves one domain: it began with `{ours}`, and a report \
                     names `{domain}`"
                )));
            }
            _ => {}
        }
        let domain = self.domain.clone().unwrap_or_default();
        let now = Instant::now();
        let config = self.app.limiter.config();
        let mut actions = Vec::new();
        for usage in report.bucket_quota_usages {
            let Some(id) = usage.bucket_id else {
                continue;
            };
            let Some(key) = bucket_key(&id) else {
                continue;
            };
            if !self.buckets.contains_key(&key) {
                if !self.take_bucket_room() {
                    tracing::debug!(
                        "an RLQS bucket past the bucket bound gets no assignment; Envoy \
                         applies its no_assignment_behavior"
                    );
                    continue;
                }
                let entries = key
                    .iter()
                    .map(|(k, v)| Entry::new(k.as_str(), v.as_str()))
                    .collect();
                let descriptor = self.app.limiter.bucket_descriptor(&domain, entries);
                self.buckets
                    .insert(key.clone(), Bucket::new(id, descriptor, now));
            }
            let Some(bucket) = self.buckets.get_mut(&key) else {
                continue;
            };
            let charge = bucket.report(usage.num_requests_allowed, usage.num_requests_denied, now);
            self.app.metrics.observe_quota_usage(
                &domain,
                &bucket.limits,
                usage.num_requests_allowed,
                usage.num_requests_denied,
            );
            self.app.metrics.observe_quota_outcomes(
                &domain,
                &key,
                &bucket.limits,
                (usage.num_requests_allowed, usage.num_requests_denied),
            );
            if charge > 0 {
                let charged = self
                    .app
                    .limiter
                    .charge_admitted(&domain, &bucket.descriptor, charge)
                    .await;
                if !charged.is_empty() {
                    counters().charged_units.inc_by(charge);
                }
            }
            if bucket.idle() {
                actions.push(abandon(&bucket.id));
                self.buckets.remove(&key);
                self.total.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            match bucket.assigned {
                Assigned::Slice { units, sent } => {
                    // The reported rate may say the slice runs dry before its renewal.
                    bucket.due = bucket.due.min(bucket.renew_at(units, sent));
                }
                Assigned::AllowAll
                    if !bucket
                        .decided_under
                        .as_ref()
                        .is_some_and(|under| Arc::ptr_eq(under, &config)) =>
                {
                    // The policies changed since: a limit may govern the bucket now.
                    bucket.due = now;
                }
                _ => {}
            }
        }
        self.send_groups(actions.into_iter().map(|action| vec![action]).collect())
            .await;
        self.on_due().await;
        Ok(())
    }

    /// Assigns every bucket that is due, in one response. The buckets' store calls go out
    /// together, as many at a time as are due, so a stream of many buckets renews them all
    /// within their lifetime.
    async fn on_due(&mut self) {
        let now = Instant::now();
        let domain = self.domain.clone().unwrap_or_default();
        let app = &self.app;
        let due = self
            .buckets
            .values_mut()
            .filter(|bucket| bucket.due <= now)
            .map(|bucket| async {
                let mut actions = Vec::new();
                assign(app, &domain, bucket, &mut actions).await;
                actions
            });
        let groups = futures_util::future::join_all(due).await;
        self.send_groups(groups).await;
    }

    /// Sends each bucket's actions (`groups`, one per bucket), in responses of at most
    /// [`ACTIONS_PER_RESPONSE`] actions; one bucket's actions always travel together, as Envoy
    /// reads a DENY_ALL followed by a token bucket as a fresh one only within one response.
    async fn send_groups(&self, groups: Vec<Vec<BucketAction>>) {
        let mut response = Vec::new();
        for group in groups {
            if !response.is_empty() && response.len() + group.len() > ACTIONS_PER_RESPONSE {
                self.send(std::mem::take(&mut response)).await;
            }
            response.extend(group);
        }
        self.send(response).await;
    }

    async fn send(&self, actions: Vec<BucketAction>) {
        counters()
            .buckets
            .set(i64::try_from(self.total.load(Ordering::Relaxed)).unwrap_or(i64::MAX));
        if actions.is_empty() {
            return;
        }
        count_actions(&actions);
        count_message("sent");
        let _ = self
            .tx
            .send(Ok(RateLimitQuotaResponse {
                bucket_action: actions,
            }))
            .await;
    }
}

/// Decides what `bucket` gets now, and when it is due again.
async fn assign<B: Backend>(
    app: &App<B>,
    domain: &str,
    bucket: &mut Bucket,
    actions: &mut Vec<BucketAction>,
) {
    let now = Instant::now();
    let want = |limits: &[Arc<Limit>]| {
        let (limit, window_ms) = tightest(limits);
        bucket.want(limit, window_ms).min(u64::from(u32::MAX))
    };
    let mut quota = app
        .limiter
        .reserve(domain, &bucket.descriptor, want, SPEND_MS)
        .await;
    if let Quota::Refused(refusal) = &quota {
        // A smaller slice may fit: what the tightest limit still has, or, when it has nothing,
        // one unit, whose refusal says when the first unit comes free.
        let smaller = refusal.remaining.clamp(1, u64::from(u32::MAX));
        quota = app
            .limiter
            .reserve(domain, &bucket.descriptor, |_| smaller, SPEND_MS)
            .await;
    }
    match quota {
        Quota::Free | Quota::Shadow(_) => {
            bucket.limits = match quota {
                Quota::Shadow(limits) => limits,
                _ => Vec::new(),
            };
            actions.push(blanket(
                &bucket.id,
                rate_limit_strategy::BlanketRule::AllowAll,
                FREE_TTL_S,
            ));
            bucket.assigned = Assigned::AllowAll;
            bucket.decided_under = Some(app.limiter.config());
            bucket.due = now + Duration::from_secs(FREE_TTL_S / 2);
        }
        Quota::Granted(grant) => {
            bucket.limits.clone_from(&grant.limits);
            let whole_s = grant.spend_ms.saturating_sub(DELIVERY_MS) / 1000;
            // A quarter of the window (what a log may be stamped ahead) holds a whole second
            // and its delivery.
            let windows_can_carry = grant
                .limits
                .iter()
                .all(|l| l.window_ms / 4 >= 1000 + DELIVERY_MS);
            if whole_s == 0 && windows_can_carry {
                // The tail of a counter's fixed window: too little of it is left for a
                // slice's whole second. Nothing until the next window begins.
                app.limiter.give_back_slice(&grant.receipts).await;
                actions.push(blanket(
                    &bucket.id,
                    rate_limit_strategy::BlanketRule::DenyAll,
                    SLICE_TTL_S,
                ));
                bucket.assigned = Assigned::DenyAll;
                bucket.due = now + Duration::from_millis(grant.spend_ms + 20);
                return;
            }
            // A window too short for a whole second ahead is held for one second anyway (see
            // docs/rlqs.md: at most a slice per Envoy more in such a window).
            let ttl_s = whole_s.clamp(1, SLICE_TTL_S);
            // A fresh bucket: after DENY_ALL, Envoy starts the token bucket full, whatever the
            // previous one had left.
            actions.push(blanket(
                &bucket.id,
                rate_limit_strategy::BlanketRule::DenyAll,
                ttl_s,
            ));
            actions.push(slice(&bucket.id, grant.units, ttl_s));
            bucket.granted = bucket.granted.saturating_add(grant.units);
            counters().slice_units.inc_by(grant.units);
            bucket.assigned = Assigned::Slice {
                units: grant.units,
                sent: now,
            };
            bucket.due = bucket.renew_at(grant.units, now);
        }
        Quota::Refused(refusal) => {
            bucket.limits.clone_from(&refusal.limits);
            let ttl_s = refusal.reset_ms.div_ceil(1000).clamp(1, SLICE_TTL_S);
            actions.push(blanket(
                &bucket.id,
                rate_limit_strategy::BlanketRule::DenyAll,
                ttl_s,
            ));
            bucket.assigned = Assigned::DenyAll;
            let wait = Duration::from_millis(refusal.reset_ms.max(50)).min(RENEW_AFTER);
            bucket.due = now + wait;
        }
        Quota::Failed(mode) => {
            let rule = match mode {
                FailureMode::Allow => rate_limit_strategy::BlanketRule::AllowAll,
                FailureMode::Deny => rate_limit_strategy::BlanketRule::DenyAll,
            };
            actions.push(blanket(&bucket.id, rule, SLICE_TTL_S));
            bucket.assigned = match mode {
                FailureMode::Allow => Assigned::AllowAll,
                FailureMode::Deny => Assigned::DenyAll,
            };
            bucket.due = now + RENEW_AFTER;
        }
    }
}

/// The limit with the least rate among `limits`: its units and window.
fn tightest(limits: &[Arc<Limit>]) -> (u64, u64) {
    limits
        .iter()
        .map(|l| (u64::from(l.requests_per_unit), l.window_ms.max(1)))
        .min_by(|a, b| {
            (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
        })
        .unwrap_or((1, 1000))
}

/// A bucket's key: its entries, sorted; `None` for an id Envoy could never be assigned (no
/// entries) or one past the descriptor bounds.
fn bucket_key(id: &BucketId) -> Option<BucketKey> {
    if id.bucket.is_empty() || id.bucket.len() > MAX_ENTRIES {
        return None;
    }
    if id
        .bucket
        .iter()
        .any(|(k, v)| k.is_empty() || k.len() > MAX_TEXT_BYTES || v.len() > MAX_TEXT_BYTES)
    {
        return None;
    }
    let mut key: BucketKey = id
        .bucket
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    key.sort();
    Some(key)
}

fn ttl(seconds: u64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration {
        seconds: i64::try_from(seconds).unwrap_or(i64::MAX),
        nanos: 0,
    })
}

fn assignment(id: &BucketId, strategy: rate_limit_strategy::Strategy, ttl_s: u64) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
            QuotaAssignmentAction {
                assignment_time_to_live: ttl(ttl_s),
                rate_limit_strategy: Some(RateLimitStrategy {
                    strategy: Some(strategy),
                }),
            },
        )),
    }
}

fn blanket(id: &BucketId, rule: rate_limit_strategy::BlanketRule, ttl_s: u64) -> BucketAction {
    assignment(
        id,
        rate_limit_strategy::Strategy::BlanketRule(rule as i32),
        ttl_s,
    )
}

/// A slice of `units` requests: a token bucket that starts full and does not refill.
fn slice(id: &BucketId, units: u64, ttl_s: u64) -> BucketAction {
    assignment(
        id,
        rate_limit_strategy::Strategy::TokenBucket(TokenBucket {
            max_tokens: u32::try_from(units).unwrap_or(u32::MAX),
            tokens_per_fill: Some(1),
            fill_interval: Some(NO_REFILL),
        }),
        ttl_s,
    )
}

fn abandon(id: &BucketId) -> BucketAction {
    BucketAction {
        bucket_id: Some(id.clone()),
        bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
    }
}
