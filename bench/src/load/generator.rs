//! Sending the load: the request shape, the call schedule and the workers that keep calls in flight.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context, anyhow};
use fastrand::Rng;
use hdrhistogram::Histogram;
use tokio::time::Instant;
use tollgate::proto::rate_limit_descriptor::Entry;
use tollgate::proto::rate_limit_response::Code;
use tollgate::proto::{RateLimitDescriptor, RateLimitRequest};

use crate::load::args::Stop;
use crate::load::client::{Client, Deadline, Failed};
use crate::load::keys::KeySampler;

/// Latencies are recorded in nanoseconds, from 1 µs resolution up to an hour; anything longer
/// is clamped (a call cannot outlive the run).
const LOWEST_LATENCY_NS: u64 = 1_000;
const HIGHEST_LATENCY_NS: u64 = 3_600 * 1_000_000_000;

/// How long to wait for each connection to the target before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Workers record into a few shared tallies rather than one each, so that memory stays small with
/// many thousands of in-flight calls while the locks stay uncontended.
const MAX_TALLY_SHARDS: usize = 32;

/// What every request looks like; values are drawn per call.
#[derive(Debug)]
pub struct Shape {
    /// The request `domain`.
    pub domain: String,
    /// The entry key of each descriptor, in request order.
    pub entry_keys: Vec<String>,
    /// Draws each descriptor's value.
    pub sampler: KeySampler,
    /// The request-level `hits_addend`.
    pub hits_addend: u32,
    /// Each descriptor's own `hits_addend`, when set.
    pub descriptor_hits_addend: Option<u64>,
}

impl Shape {
    fn request(&self, rng: &mut Rng) -> RateLimitRequest {
        let descriptors = self
            .entry_keys
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.clone(),
                    value: self.sampler.sample(rng).to_string(),
                }],
                limit: None,
                hits_addend: self.descriptor_hits_addend,
            })
            .collect();
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: self.hits_addend,
        }
    }
}

/// The outcome counts and latencies of a phase.
#[derive(Debug)]
pub struct Tally {
    /// Latency of every answered call, in nanoseconds.
    pub latency: Histogram<u64>,
    /// Calls answered with overall code OK.
    pub ok: u64,
    /// Calls answered with overall code OVER_LIMIT.
    pub over_limit: u64,
    /// Calls answered with overall code UNKNOWN (or a code this client does not know).
    pub unknown: u64,
    /// Failed calls by gRPC status name.
    pub errors: BTreeMap<&'static str, u64>,
}

impl Tally {
    fn new() -> anyhow::Result<Self> {
        let latency = Histogram::new_with_bounds(LOWEST_LATENCY_NS, HIGHEST_LATENCY_NS, 3)
            .map_err(|e| anyhow!("latency histogram: {e}"))?;
        Ok(Tally {
            latency,
            ok: 0,
            over_limit: 0,
            unknown: 0,
            errors: BTreeMap::new(),
        })
    }

    fn merge(&mut self, other: &Tally) -> anyhow::Result<()> {
        self.latency
            .add(&other.latency)
            .map_err(|e| anyhow!("merging latency histograms: {e:?}"))?;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.unknown += other.unknown;
        for (code, count) in &other.errors {
            *self.errors.entry(code).or_default() += count;
        }
        Ok(())
    }

    fn record(&mut self, outcome: Outcome, latency: Duration) {
        match outcome {
            Outcome::Answered(code) => {
                match code {
                    Some(Code::Ok) => self.ok += 1,
                    Some(Code::OverLimit) => self.over_limit += 1,
                    Some(Code::Unknown) | None => self.unknown += 1,
                }
                let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
                self.latency.saturating_record(nanos);
            }
            Outcome::Failed(code) => *self.errors.entry(grpc_code_name(code)).or_default() += 1,
        }
    }

    /// Calls answered with a decision.
    pub fn decisions(&self) -> u64 {
        self.ok + self.over_limit + self.unknown
    }

    /// Calls that failed.
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

enum Outcome {
    Answered(Option<Code>),
    Failed(tonic::Code),
}

/// The result of one phase of load.
#[derive(Debug)]
pub struct Measured {
    /// Outcomes and latencies.
    pub tally: Tally,
    /// From the start of the phase until its last call returned.
    pub elapsed: Duration,
}

/// Hands out call slots and decides when the phase is over.
struct Schedule {
    start: Instant,
    next: AtomicU64,
    stop: Stop,
    rate: Option<f64>,
}

/// One call to make; `intended` is its scheduled send time in open loop.
struct Slot {
    intended: Option<Instant>,
}

impl Schedule {
    fn claim(&self) -> Option<Slot> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let offset = self
            .rate
            .map(|rate| Duration::from_secs_f64(index as f64 / rate));
        match self.stop {
            Stop::Count(count) if index >= count => return None,
            Stop::Count(_) => {}
            Stop::After(duration) => {
                // Open loop: no slot is scheduled past the end, and a generator that fell behind
                // does not keep sending a backlog after the end either.
                if offset.is_some_and(|offset| offset >= duration)
                    || self.start.elapsed() >= duration
                {
                    return None;
                }
            }
        }
        Some(Slot {
            intended: offset.map(|offset| self.start + offset),
        })
    }
}

/// A load generator connected to its target.
pub struct Load {
    /// One client per HTTP/2 connection.
    pub clients: Vec<Client>,
    /// Calls in flight at once.
    pub concurrency: u32,
    /// Open-loop rate in calls per second, or closed loop.
    pub rate: Option<f64>,
    /// Deadline of one call.
    pub timeout: Duration,
    /// What requests look like.
    pub shape: Arc<Shape>,
    /// Base seed of the value draws.
    pub seed: u64,
}

impl Load {
    /// Runs one phase until `stop`, with `concurrency` workers spread over the connections.
    /// `phase` varies the value draws between phases.
    pub async fn run(&self, stop: Stop, phase: u64) -> anyhow::Result<Measured> {
        if self.clients.is_empty() {
            return Err(anyhow!("no connection to send on"));
        }
        let shards = (self.concurrency as usize).clamp(1, MAX_TALLY_SHARDS);
        let tallies: Arc<Vec<Mutex<Tally>>> = Arc::new(
            (0..shards)
                .map(|_| Tally::new().map(Mutex::new))
                .collect::<anyhow::Result<_>>()?,
        );
        let schedule = Arc::new(Schedule {
            start: Instant::now(),
            next: AtomicU64::new(0),
            stop,
            rate: self.rate,
        });

        let deadline = Deadline::new(self.timeout);
        let mut workers = Vec::with_capacity(self.concurrency as usize);
        for worker in 0..self.concurrency as usize {
            let client = self.clients[worker % self.clients.len()].clone();
            let context = Worker {
                client,
                schedule: Arc::clone(&schedule),
                shape: Arc::clone(&self.shape),
                tallies: Arc::clone(&tallies),
                shard: worker % shards,
                deadline: deadline.clone(),
                // Distinct, repeatable streams per worker and phase.
                rng: Rng::with_seed(
                    self.seed
                        ^ phase.wrapping_mul(0xA24B_AED4_963E_E407)
                        ^ (worker as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                ),
            };
            workers.push(tokio::spawn(context.run()));
        }
        for worker in workers {
            worker.await.context("a load worker stopped abnormally")?;
        }
        let elapsed = schedule.start.elapsed();

        let mut total = Tally::new()?;
        for shard in tallies.iter() {
            let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
            total.merge(&shard)?;
        }
        Ok(Measured {
            tally: total,
            elapsed,
        })
    }
}

/// Opens `connections` separate HTTP/2 connections to `target`, so calls really are spread over
/// that many TCP connections.
pub async fn connect(target: &str, connections: u32) -> anyhow::Result<Vec<Client>> {
    let mut clients = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        clients.push(Client::connect(target, CONNECT_TIMEOUT).await?);
    }
    Ok(clients)
}

struct Worker {
    client: Client,
    schedule: Arc<Schedule>,
    shape: Arc<Shape>,
    tallies: Arc<Vec<Mutex<Tally>>>,
    shard: usize,
    deadline: Deadline,
    rng: Rng,
}

impl Worker {
    async fn run(mut self) {
        while let Some(slot) = self.schedule.claim() {
            let request = self.shape.request(&mut self.rng);
            let measured_from = match slot.intended {
                // Behind schedule: the wait for a free slot is part of what the caller would see.
                Some(intended) if intended <= Instant::now() => intended,
                // Ahead of schedule: measure from the actual send, so that the timer's own
                // (millisecond) lateness is not blamed on the server.
                Some(intended) => {
                    tokio::time::sleep_until(intended).await;
                    Instant::now()
                }
                None => Instant::now(),
            };
            let outcome = match self
                .client
                .should_rate_limit(&request, &self.deadline)
                .await
            {
                Ok(response) => Outcome::Answered(Code::try_from(response.overall_code).ok()),
                Err(Failed(code)) => Outcome::Failed(code),
            };
            let latency = measured_from.elapsed();
            let mut tally = self.tallies[self.shard]
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            tally.record(outcome, latency);
        }
    }
}

/// The canonical gRPC name of a status code, as other gRPC tools print it.
fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code as C;
    match code {
        C::Ok => "OK",
        C::Cancelled => "CANCELLED",
        C::Unknown => "UNKNOWN",
        C::InvalidArgument => "INVALID_ARGUMENT",
        C::DeadlineExceeded => "DEADLINE_EXCEEDED",
        C::NotFound => "NOT_FOUND",
        C::AlreadyExists => "ALREADY_EXISTS",
        C::PermissionDenied => "PERMISSION_DENIED",
        C::ResourceExhausted => "RESOURCE_EXHAUSTED",
        C::FailedPrecondition => "FAILED_PRECONDITION",
        C::Aborted => "ABORTED",
        C::OutOfRange => "OUT_OF_RANGE",
        C::Unimplemented => "UNIMPLEMENTED",
        C::Internal => "INTERNAL",
        C::Unavailable => "UNAVAILABLE",
        C::DataLoss => "DATA_LOSS",
        C::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(stop: Stop, rate: Option<f64>) -> Schedule {
        Schedule {
            start: Instant::now(),
            next: AtomicU64::new(0),
            stop,
            rate,
        }
    }

    #[test]
    fn count_stop_hands_out_exactly_that_many_slots() {
        let schedule = schedule(Stop::Count(5), None);
        assert_eq!(std::iter::from_fn(|| schedule.claim()).count(), 5);
        assert!(schedule.claim().is_none());
    }

    #[test]
    fn open_loop_slots_are_evenly_spaced_and_end_with_the_duration() {
        let schedule = schedule(Stop::After(Duration::from_secs(1)), Some(4.0));
        let times: Vec<Instant> = std::iter::from_fn(|| schedule.claim())
            .map(|slot| slot.intended.unwrap())
            .collect();
        let offsets: Vec<Duration> = times.iter().map(|t| *t - schedule.start).collect();
        assert_eq!(
            offsets,
            [0, 250, 500, 750].map(Duration::from_millis).to_vec()
        );
    }

    #[test]
    fn request_has_the_configured_shape() {
        let shape = Shape {
            domain: "d".into(),
            entry_keys: vec!["a".into(), "b".into()],
            sampler: KeySampler::uniform(3),
            hits_addend: 2,
            descriptor_hits_addend: Some(0),
        };
        let request = shape.request(&mut Rng::with_seed(1));
        assert_eq!(request.domain, "d");
        assert_eq!(request.hits_addend, 2);
        let keys: Vec<&str> = request
            .descriptors
            .iter()
            .map(|d| d.entries[0].key.as_str())
            .collect();
        assert_eq!(keys, ["a", "b"]);
        for descriptor in &request.descriptors {
            assert_eq!(descriptor.hits_addend, Some(0));
            let value: u64 = descriptor.entries[0].value.parse().unwrap();
            assert!(value < 3);
        }
    }

    #[test]
    fn tally_counts_and_merges() {
        let mut a = Tally::new().unwrap();
        a.record(
            Outcome::Answered(Some(Code::Ok)),
            Duration::from_micros(100),
        );
        a.record(
            Outcome::Answered(Some(Code::OverLimit)),
            Duration::from_millis(2),
        );
        let mut b = Tally::new().unwrap();
        b.record(Outcome::Answered(None), Duration::from_micros(50));
        b.record(Outcome::Failed(tonic::Code::Unavailable), Duration::ZERO);
        a.merge(&b).unwrap();
        assert_eq!((a.ok, a.over_limit, a.unknown), (1, 1, 1));
        assert_eq!(a.decisions(), 3);
        assert_eq!(a.error_count(), 1);
        assert_eq!(a.errors.get("UNAVAILABLE"), Some(&1));
        assert_eq!(a.latency.len(), 3);
    }
}
