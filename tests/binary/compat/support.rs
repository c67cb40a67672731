//! The suite's vocabulary: policies from `fixtures/`, requests as Envoy sends them, the answers
//! envoyproxy/ratelimit gives, and a runner that asks tollgate the same, step by step, at the
//! wire level (`tollgate::server::rls::decide`: protobuf in, protobuf or gRPC status out).
//!
//! On the `memory_grpc` and `memory_tonic` targets every request also goes over gRPC, to tollgate
//! serving the scenario's limiter in this process on the hand-written fast path or on tonic's
//! generated service (`--grpc-fast-path=false`): each answer must be the expected one and,
//! field for field (status code and message included), what `rls::decide` answers on a twin
//! limiter told the same time, so any difference between the two paths fails a named test.
//!
//! A scenario is a policy, the settings a user switching over runs with, and steps. Each step is
//! one request and the reference's answer to it; where tollgate answers differently on purpose,
//! the step says so with tollgate's answer and the reason ([`Step::differs`]), so every difference
//! is written down next to the case it concerns and counted by [`Scenario::tally`]. Steps marked
//! [`Step::setup`] only bring counters to the state a case starts from (the reference's unit tests
//! inject such states into mocks); they are asserted too but not counted as cases.
//!
//! Windows: the reference counts fixed windows, tollgate sliding ones. Both agree while every hit
//! of a case falls in one window that started empty, so clocked runs start at a day boundary
//! ([`START_MS`]) and advance the clock only where a case says so. A target that cannot be told
//! the time (a Redis Cluster reads its own) runs only scenarios whose windows are an hour or longer
//! and that never advance the clock.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prost_types::value::Kind;
use serde_json::{Map, Value as Json};
use tokio::sync::oneshot;
use tollgate::clock::ManualClock;
use tollgate::config::{Config, LoadOptions};
use tollgate::limiter::{Limiter, Settings};
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::Code as ProtoCode;
use tollgate::proto::rate_limit_response::rate_limit::Unit as ProtoUnit;
use tollgate::proto::rate_limit_service_client::RateLimitServiceClient;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest, RateLimitResponse};
use tollgate::server::{self, Listeners, ServeOptions, rls};
use tollgate::window::Counting;
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::target::{Store, Target, Via};
use tonic::transport::Channel;

/// A day boundary (so second, minute, hour and day windows all start here), in ms.
pub const START_MS: u64 = 1_700_006_400_000;

/// The backend deadline of the scenario whose backend is unreachable: the production default.
const OUTAGE_TIMEOUT: Duration = Duration::from_millis(50);

/// The directory of the suite's fixtures.
pub fn fixtures(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/binary/compat/fixtures")
        .join(path)
}

/// The policies of `fixtures/<dir>`, which must load.
pub fn policy(dir: &str) -> Arc<Config> {
    let path = fixtures(dir);
    Arc::new(
        Config::load_with(&path, LoadOptions::default())
            .unwrap_or_else(|err| panic!("{}: {err}", path.display())),
    )
}

/// The settings a deployment of envoyproxy/ratelimit runs with by default, as tollgate's
/// `ratelimit` entry point applies them: every hit counts (its
/// `STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=false`), no quota mode, no dynamic metadata (and no
/// `overLimit` in it when it is asked for), and no
/// `retry-after` (the reference adds no header unless asked).
pub fn reference_defaults() -> Settings {
    Settings {
        counting: Counting::All,
        retry_after_header: false,
        over_limit_metadata: false,
        ..Settings::default()
    }
}

// ------------------------------------------------------------------------------------------------
// Requests

/// A descriptor with these entries, as Envoy builds it from a route's actions.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// `descriptor` with its own `hits_addend` (Envoy's route-level `hits_addend`; 0 checks only).
pub fn addend(mut descriptor: RateLimitDescriptor, hits: u64) -> RateLimitDescriptor {
    descriptor.hits_addend = Some(hits);
    descriptor
}

/// A request for `domain` with the request-level `hits_addend` left at 0 (one hit each).
pub fn rq(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

// ------------------------------------------------------------------------------------------------
// Answers

/// One descriptor's status: code, `current_limit` (requests per unit, unit, name) and
/// `limit_remaining`. The duration until reset is a fixed window's in the reference and a
/// sliding window's here, so it is not compared (see [`Step::reset_shrinks`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct St {
    code: ProtoCode,
    limit: Option<(u32, ProtoUnit, String)>,
    remaining: u32,
}

impl St {
    /// The status with the limit's `name`.
    pub fn named(mut self, name: &str) -> St {
        if let Some((_, _, slot)) = &mut self.limit {
            *slot = name.to_owned();
        }
        self
    }
}

/// OK under a limit of `rpu` per `unit`, with `remaining` left.
pub fn ok(rpu: u32, unit: ProtoUnit, remaining: u32) -> St {
    St {
        code: ProtoCode::Ok,
        limit: Some((rpu, unit, String::new())),
        remaining,
    }
}

/// OVER_LIMIT under a limit of `rpu` per `unit`, with `remaining` left.
pub fn over(rpu: u32, unit: ProtoUnit, remaining: u32) -> St {
    St {
        code: ProtoCode::OverLimit,
        limit: Some((rpu, unit, String::new())),
        remaining,
    }
}

/// OK with no limit: unknown domain, no match, an allow-list entry, a replaced limit.
pub fn free() -> St {
    St {
        code: ProtoCode::Ok,
        limit: None,
        remaining: 0,
    }
}

/// OK for an `unlimited` limit: no `current_limit`, remaining 2^32 - 1.
pub fn unlimited() -> St {
    St {
        code: ProtoCode::Ok,
        limit: None,
        remaining: u32::MAX,
    }
}

/// What a request is answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A response.
    Response {
        /// `overall_code`.
        overall: ProtoCode,
        /// One status per descriptor.
        statuses: Vec<St>,
        /// The names of `response_headers_to_add`, in order, when the case checks them.
        headers: Option<Vec<&'static str>>,
        /// `dynamic_metadata` as JSON, when the case checks it (`null`: none at all).
        metadata: Option<Json>,
    },
    /// A failed call: its gRPC code and a text its message contains.
    Error(tonic::Code, &'static str),
}

/// A response with overall OK.
pub fn pass(statuses: Vec<St>) -> Answer {
    Answer::Response {
        overall: ProtoCode::Ok,
        statuses,
        headers: None,
        metadata: None,
    }
}

/// A response with overall OVER_LIMIT.
pub fn reject(statuses: Vec<St>) -> Answer {
    Answer::Response {
        overall: ProtoCode::OverLimit,
        statuses,
        headers: None,
        metadata: None,
    }
}

impl Answer {
    /// The same answer, whose response headers (by name, in order) the case checks.
    pub fn headers(self, names: &[&'static str]) -> Answer {
        match self {
            Answer::Response {
                overall,
                statuses,
                metadata,
                ..
            } => Answer::Response {
                overall,
                statuses,
                headers: Some(names.to_vec()),
                metadata,
            },
            error => error,
        }
    }

    /// The same answer, whose dynamic metadata the case checks (`Json::Null`: none).
    pub fn metadata(self, json: Json) -> Answer {
        match self {
            Answer::Response {
                overall,
                statuses,
                headers,
                ..
            } => Answer::Response {
                overall,
                statuses,
                headers,
                metadata: Some(json),
            },
            error => error,
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Steps and scenarios

/// What a step does.
#[derive(Debug, Clone)]
enum Action {
    /// Ask this request.
    Ask(RateLimitRequest),
    /// Install this config, as a reload does.
    Reload(Arc<Config>),
}

/// One step of a scenario.
#[derive(Debug, Clone)]
pub struct Step {
    label: String,
    action: Action,
    reference: Answer,
    /// tollgate's own answer and why, where it differs on purpose.
    tollgate: Option<(Answer, &'static str)>,
    /// Not a case of the reference's: a request setting counters up, or a check of tollgate's own
    /// (such as a restated expectation); asserted, not counted.
    setup: bool,
    /// How far the clock moves before the step.
    after_ms: u64,
    /// The first status's duration until reset must be shorter than the previous step's.
    reset_shrinks: bool,
}

/// A step asking `request`, which the reference answers `reference`; `label` names it in
/// failures (e.g. the reference's test and iteration).
pub fn ask(label: impl Into<String>, request: RateLimitRequest, reference: Answer) -> Step {
    Step {
        label: label.into(),
        action: Action::Ask(request),
        reference,
        tollgate: None,
        setup: false,
        after_ms: 0,
        reset_shrinks: false,
    }
}

/// A step installing `config`, as a reload of the files does.
pub fn reload(label: impl Into<String>, config: Arc<Config>) -> Step {
    Step {
        label: label.into(),
        action: Action::Reload(config),
        reference: pass(Vec::new()),
        tollgate: None,
        setup: true,
        after_ms: 0,
        reset_shrinks: false,
    }
}

impl Step {
    /// Marks the step as no case of the reference's (it sets counters up, or checks something of
    /// tollgate's own): asserted, but not counted.
    pub fn setup(mut self) -> Step {
        self.setup = true;
        self
    }

    /// Moves the clock `ms` forward before the step.
    pub fn after(mut self, ms: u64) -> Step {
        self.after_ms = ms;
        self
    }

    /// tollgate answers `answer` instead, on purpose, for `why`.
    pub fn differs(mut self, answer: Answer, why: &'static str) -> Step {
        self.tollgate = Some((answer, why));
        self
    }

    /// The first status's duration until reset must be shorter than the previous step's.
    pub fn reset_shrinks(mut self) -> Step {
        self.reset_shrinks = true;
        self
    }
}

/// `count` steps from `make(i)`, for the reference's loops.
pub fn repeat(count: u32, make: impl Fn(u32) -> Step) -> Vec<Step> {
    (0..count).map(make).collect()
}

/// Where a scenario's backend is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The target's store.
    Working,
    /// Where nothing listens, so every call fails.
    Unreachable,
}

/// A policy, settings and steps taken from one of the reference's tests.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name in failure messages.
    pub name: &'static str,
    /// The reference's test it comes from (`path:line` at envoyproxy/ratelimit f2fb157).
    pub source: &'static str,
    /// The policy in force at the start.
    pub policy: Arc<Config>,
    /// The service settings.
    pub settings: Settings,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// Where the backend is.
    pub backend: Backend,
}

impl Scenario {
    /// A scenario over a working backend.
    pub fn new(
        name: &'static str,
        source: &'static str,
        policy: Arc<Config>,
        settings: Settings,
        steps: Vec<Step>,
    ) -> Scenario {
        Scenario {
            name,
            source,
            policy,
            settings,
            steps,
            backend: Backend::Working,
        }
    }

    /// The same scenario over an unreachable backend.
    pub fn unreachable(mut self) -> Scenario {
        self.backend = Backend::Unreachable;
        self
    }

    /// The cases (steps that are not setup) and how many tollgate answers as the reference does.
    pub fn tally(&self) -> Tally {
        let cases: Vec<&Step> = self.steps.iter().filter(|s| !s.setup).collect();
        Tally {
            cases: cases.len(),
            same: cases.iter().filter(|s| s.tollgate.is_none()).count(),
        }
    }

    /// Each deliberate difference: `(scenario, step, why)`.
    pub fn differences(&self) -> Vec<(&'static str, String, &'static str)> {
        self.steps
            .iter()
            .filter(|s| !s.setup)
            .filter_map(|s| {
                s.tollgate
                    .as_ref()
                    .map(|(_, why)| (self.name, s.label.clone(), *why))
            })
            .collect()
    }

    /// Whether every window is an hour or longer and the clock never moves, so the scenario's
    /// answers do not depend on the instant it runs at.
    fn clock_free(&self) -> bool {
        let long_windows = self
            .policy
            .limits()
            .iter()
            .all(|limit| limit.unlimited || limit.window_ms >= 3_600_000);
        long_windows && self.steps.iter().all(|s| s.after_ms == 0)
    }
}

/// Cases and matches, added up over scenarios.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Steps that are cases of the reference's.
    pub cases: usize,
    /// Of those, the ones tollgate answers as the reference does.
    pub same: usize,
}

impl std::ops::Add for Tally {
    type Output = Tally;

    fn add(self, other: Tally) -> Tally {
        Tally {
            cases: self.cases + other.cases,
            same: self.same + other.same,
        }
    }
}

/// Runs `scenario` against `t`: each step's answer must be tollgate's expected one (the
/// reference's, unless the step differs on purpose).
pub async fn run(t: &Target, scenario: &Scenario) {
    let clock = ManualClock::new(START_MS);
    let limiter = Arc::new(scenario_limiter(t, scenario, &clock).await);
    let mut grpc = match t.via() {
        Via::Library => None,
        Via::Grpc { fast_path } => {
            // What the server answers is compared with what the library answers on a limiter of
            // its own, told the same time and given the same requests.
            let twin = scenario_limiter(t, scenario, &clock).await;
            Some((Grpc::serve(Arc::clone(&limiter), fast_path).await, twin))
        }
    };
    let mut previous_reset: Option<Duration> = None;
    for (index, step) in scenario.steps.iter().enumerate() {
        let place = format!(
            "{} step {index} ({}), from {}",
            scenario.name, step.label, scenario.source
        );
        clock.advance(step.after_ms);
        let request = match &step.action {
            Action::Reload(config) => {
                limiter.set_config(Arc::clone(config));
                if let Some((_, twin)) = &grpc {
                    twin.set_config(Arc::clone(config));
                }
                continue;
            }
            Action::Ask(request) => request.clone(),
        };
        let expected = match &step.tollgate {
            Some((answer, _)) => answer,
            None => &step.reference,
        };
        let result = match &mut grpc {
            None => rls::decide(&limiter, request).await,
            Some((server, twin)) => {
                let answered = server.ask(request.clone()).await;
                let decided = rls::decide(twin, request).await;
                assert_eq!(
                    outcome(&answered),
                    outcome(&decided),
                    "{place}: over gRPC ({}) and from the library",
                    t.name()
                );
                answered
            }
        };
        if !scenario.settings.response_dynamic_metadata
            && let Ok(response) = &result
        {
            assert_eq!(
                response.dynamic_metadata, None,
                "{place}: metadata without asking"
            );
        }
        check(&place, expected, &result);
        if let Ok(response) = &result {
            let reset = response
                .statuses
                .first()
                .and_then(|s| s.duration_until_reset)
                .map(|d| Duration::from_secs(u64::try_from(d.seconds).unwrap_or(0)));
            if step.reset_shrinks {
                assert!(
                    reset < previous_reset && reset.is_some(),
                    "{place}: reset {reset:?} not shorter than {previous_reset:?}"
                );
            }
            previous_reset = reset;
        }
    }
}

/// A limiter of `scenario`'s policy and settings on a backend of `t`, told the time by `clock`
/// where the store can be.
async fn scenario_limiter(
    t: &Target,
    scenario: &Scenario,
    clock: &ManualClock,
) -> Limiter<TestBackend> {
    let clocked = !matches!(t.store(), Store::Cluster(_));
    let backend = match scenario.backend {
        Backend::Unreachable => t.unreachable().backend_with_timeout(OUTAGE_TIMEOUT).await,
        Backend::Working if clocked => t.clocked_backend(clock).await,
        Backend::Working => {
            assert!(
                scenario.clock_free(),
                "{}: needs a clock, which {} cannot be told",
                scenario.name,
                t.name()
            );
            t.backend().await
        }
    };
    Limiter::new(Arc::clone(&scenario.policy), backend, scenario.settings)
}

/// An answer as comparable data: the response, or the status's code and message.
fn outcome(
    result: &Result<RateLimitResponse, tonic::Status>,
) -> Result<&RateLimitResponse, (tonic::Code, &str)> {
    result
        .as_ref()
        .map_err(|status| (status.code(), status.message()))
}

/// tollgate serving a limiter over gRPC in this process, and a client of it; dropping it stops
/// the server.
struct Grpc {
    client: RateLimitServiceClient<Channel>,
    _stop: oneshot::Sender<()>,
}

impl Grpc {
    /// Serves `limiter` on loopback, on the fast path or on tonic's generated service.
    async fn serve(limiter: Arc<Limiter<TestBackend>>, fast_path: bool) -> Grpc {
        let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let listeners = Listeners::bind(loopback, loopback)
            .await
            .expect("bind two loopback listeners");
        let addr = listeners.grpc_addr().expect("the gRPC address");
        // No policy files: the scenario's steps install its configs. The bound on decisions in
        // flight is off, as a scenario asks one request at a time.
        let options = ServeOptions {
            max_in_flight: None,
            grpc_fast_path: fast_path,
            ..ServeOptions::files(PathBuf::from("/nonexistent/tollgate-compat"))
        };
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(server::serve(limiter, listeners, options, async move {
            let _ = stopped.await;
        }));
        let client = tollgate_testkit::rls::client(addr)
            .await
            .expect("connect to the in-process server");
        Grpc {
            client,
            _stop: stop,
        }
    }

    /// Asks `request` over gRPC.
    async fn ask(&mut self, request: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        self.client
            .should_rate_limit(request)
            .await
            .map(tonic::Response::into_inner)
    }
}

/// Asserts that `result` is the `expected` answer.
fn check(place: &str, expected: &Answer, result: &Result<RateLimitResponse, tonic::Status>) {
    match (expected, result) {
        (Answer::Error(code, text), Err(status)) => {
            assert_eq!(status.code(), *code, "{place}: {status:?}");
            assert!(status.message().contains(text), "{place}: {status:?}");
        }
        (
            Answer::Response {
                overall,
                statuses,
                headers,
                metadata,
            },
            Ok(response),
        ) => {
            let actual: Vec<St> = response
                .statuses
                .iter()
                .map(|s| St {
                    code: ProtoCode::try_from(s.code).unwrap_or(ProtoCode::Unknown),
                    limit: s.current_limit.as_ref().map(|l| {
                        (
                            l.requests_per_unit,
                            ProtoUnit::try_from(l.unit).unwrap_or(ProtoUnit::Unknown),
                            l.name.clone(),
                        )
                    }),
                    remaining: s.limit_remaining,
                })
                .collect();
            assert_eq!(
                (response.overall_code, &actual),
                (*overall as i32, statuses),
                "{place}: {response:?}"
            );
            if let Some(names) = headers {
                let actual: Vec<&str> = response
                    .response_headers_to_add
                    .iter()
                    .map(|h| h.key.as_str())
                    .collect();
                assert_eq!(&actual, names, "{place}: {response:?}");
            }
            if let Some(json) = metadata {
                let actual = response
                    .dynamic_metadata
                    .as_ref()
                    .map_or(Json::Null, struct_json);
                assert_eq!(&actual, json, "{place}");
            }
        }
        (expected, actual) => panic!("{place}: expected {expected:?}, got {actual:?}"),
    }
}

/// A protobuf `Struct` as JSON.
pub fn struct_json(value: &prost_types::Struct) -> Json {
    Json::Object(
        value
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), value_json(value)))
            .collect::<Map<String, Json>>(),
    )
}

fn value_json(value: &prost_types::Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => Json::Bool(*b),
        // Whole numbers as integers, so expectations can write `5` for the double 5.0.
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() < 9e15 => Json::from(*n as i64),
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Json::Null, Json::Number)
        }
        Some(Kind::StringValue(s)) => Json::String(s.clone()),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(s)) => struct_json(s),
    }
}
