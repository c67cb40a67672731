//! Chaos with real servers, traffic flowing all along:
//!
//! - a Redis Cluster master is killed and its replica promoted: no limit ever admits past what it
//!   held, no refund is applied twice, every call comes back, and the same backend decides again
//!   once the replica has taken over, without a restart;
//! - a Redis server is stopped with SIGSTOP and resumed: every call comes back, answered by the
//!   failure mode while Redis is frozen (never an error to the caller), and counting resumes once
//!   it thaws;
//! - a `tollgate serve` process holding a slice of a leased limit is killed: the others admit the
//!   limit less that slice, exactly.
//!
//! Nothing here is timed: each call gets a generous client-side bound, and a call that exceeds it
//! is reported as a hang, which fails the case.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::task::block_in_place;
use tollgate::backend::redis::KeySpace;
use tollgate::backend::{Backend, Hit};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{fresh_key, hit, one};
use tollgate_testkit::in_process::InProcess;
use tollgate_testkit::rls::{client, request};
use tollgate_testkit::target::{Store, Target};

cases! {
    a_cluster_master_killed_during_traffic: [redis_cluster];
}

/// A window so long that no fixed-window boundary falls inside a test run.
const LONG_WINDOW_MS: u64 = 1 << 40;
/// The deadline of one backend call: short, as in production, so an outage fails calls fast.
const DEADLINE: Duration = Duration::from_millis(500);
/// How long past its deadline a call may take before it counts as hung.
const HANG: Duration = Duration::from_secs(15);
/// How long the cluster may take to decide again after the failover.
const RECOVERY: Duration = Duration::from_secs(60);

/// Tallies of the traffic.
#[derive(Default)]
struct Tally {
    calls: AtomicU64,
    hung: AtomicU64,
    decided: AtomicU64,
    gate_admitted: AtomicU64,
    refunds_failed: AtomicU64,
}

/// Every request charges `quota` (never full) and `gate` (full before the traffic starts), so
/// every request is rejected by the gate and gives back what the quota took, as the limiter does.
/// The quota is on the master that dies: refunds in flight meet the kill.
async fn a_cluster_master_killed_during_traffic(t: &Target) {
    let mut chaos = block_in_place(|| t.private());
    let backend = Arc::new(chaos.backend_with_timeout(DEADLINE).await);
    let patient = chaos.backend().await;
    let quota = hit(
        &fresh_key("quota"),
        Algorithm::SlidingWindowCounter,
        1_000_000_000,
        LONG_WINDOW_MS,
        Cost::Consume(1),
    );
    let gate = hit(
        &fresh_key("gate"),
        Algorithm::SlidingWindowLog,
        5,
        LONG_WINDOW_MS,
        Cost::Consume(1),
    );
    let charged = Hit {
        cost: Cost::Consume(100),
        ..quota.clone()
    };
    assert!(one(&patient, &charged).await.verdict.admitted);
    for _ in 0..5 {
        assert!(one(&patient, &gate).await.verdict.admitted);
    }
    block_in_place(|| {
        chaos
            .cluster()
            .wait_replicas_synced(Duration::from_secs(30))
    });

    let tally = Arc::new(Tally::default());
    let running = Arc::new(AtomicBool::new(true));
    let last_decided = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (backend, tally, running) = (
                Arc::clone(&backend),
                Arc::clone(&tally),
                Arc::clone(&running),
            );
            let (quota, gate, last_decided) =
                (quota.clone(), gate.clone(), Arc::clone(&last_decided));
            tokio::spawn(async move {
                while running.load(Ordering::SeqCst) {
                    tally.calls.fetch_add(1, Ordering::SeqCst);
                    let pair = [quota.clone(), gate.clone()];
                    let Ok(results) =
                        tokio::time::timeout(DEADLINE + HANG, backend.acquire(&pair)).await
                    else {
                        tally.hung.fetch_add(1, Ordering::SeqCst);
                        continue;
                    };
                    if let Ok(outcome) = &results[1] {
                        if outcome.verdict.admitted {
                            tally.gate_admitted.fetch_add(1, Ordering::SeqCst);
                        }
                        tally.decided.fetch_add(1, Ordering::SeqCst);
                        *last_decided.lock().expect("the clock") = Some(Instant::now());
                    }
                    // The request is over (or undecided): give back what the quota took.
                    let receipts: Vec<_> = results
                        .into_iter()
                        .filter_map(|result| result.ok().and_then(|outcome| outcome.receipt))
                        .collect();
                    if !receipts.is_empty() {
                        match tokio::time::timeout(DEADLINE + HANG, backend.release(&receipts))
                            .await
                        {
                            Ok(Ok(())) => {}
                            Ok(Err(_)) => {
                                tally.refunds_failed.fetch_add(1, Ordering::SeqCst);
                            }
                            Err(_) => {
                                tally.hung.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();

    // Traffic flows, then the quota's master dies mid-traffic.
    let until_flowing = Instant::now() + RECOVERY;
    while tally.decided.load(Ordering::SeqCst) < 50 {
        assert!(
            Instant::now() < until_flowing,
            "no traffic decided before the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let victim = KeySpace::counter(&KeySpace::new(chaos.prefix()).base(&quota.key));
    block_in_place(|| chaos.private_cluster().fail_over_master_of(&victim));
    // The same backend decides again, without a restart.
    let failed_over = Instant::now();
    let deadline = failed_over + RECOVERY;
    loop {
        let recovered = last_decided
            .lock()
            .expect("the clock")
            .is_some_and(|at| at > failed_over);
        if recovered && tally.decided.load(Ordering::SeqCst) > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no decision {RECOVERY:?} after the failover"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And keeps deciding for a while.
    let decided = tally.decided.load(Ordering::SeqCst);
    while tally.decided.load(Ordering::SeqCst) < decided + 50 {
        assert!(
            Instant::now() < deadline,
            "decisions stopped after the failover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    running.store(false, Ordering::SeqCst);
    for worker in workers {
        worker.await.expect("a traffic task");
    }

    assert_eq!(
        tally.hung.load(Ordering::SeqCst),
        0,
        "calls that never came back"
    );
    assert_eq!(
        tally.gate_admitted.load(Ordering::SeqCst),
        0,
        "the full gate admitted a hit"
    );
    // The quota holds at least what it held before the traffic: each request's charge was given
    // back at most once (a refund applied twice would take from the 100 charged before).
    let check = Hit {
        cost: Cost::CheckOnly,
        ..quota.clone()
    };
    let remaining = read(&patient, &check).await;
    let used = 1_000_000_000 - remaining;
    assert!(used >= 100, "the quota went below its charge: {used} used");
    let gate_check = Hit {
        cost: Cost::CheckOnly,
        ..gate.clone()
    };
    assert_eq!(read(&patient, &gate_check).await, 0);
    eprintln!(
        "chaos: {} calls, {} decided, {} refunds failed, quota {used} used",
        tally.calls.load(Ordering::SeqCst),
        tally.decided.load(Ordering::SeqCst),
        tally.refunds_failed.load(Ordering::SeqCst)
    );
}

/// What a check-only hit reads, asked until a call is answered: a connection the kill broke
/// fails its next call once (it is not resent, since it may have run), and a check changes
/// nothing, so asking again is harmless.
async fn read(backend: &impl Backend, check: &Hit) -> u64 {
    let deadline = Instant::now() + RECOVERY;
    loop {
        match backend.acquire(std::slice::from_ref(check)).await.remove(0) {
            Ok(outcome) => return outcome.verdict.remaining,
            Err(err) => {
                assert!(Instant::now() < deadline, "no answer to a check: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

const POLICY: &str = "domain: chaos
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// Redis frozen by SIGSTOP under traffic through the gRPC service: every call is answered, with
/// the failure mode while Redis is frozen, and limits count again once it is resumed.
#[test]
fn a_frozen_redis_answers_the_failure_mode_throughout() {
    let redis = tollgate_testkit::redis::RedisServer::start();
    let server = InProcess::builder()
        .policy("chaos.yaml", POLICY)
        .store(Store::Redis(redis.url()))
        .backend_timeout(DEADLINE)
        .start();
    let grpc = server.grpc_addr();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let frozen = Arc::new(AtomicBool::new(false));
    let running = Arc::new(AtomicBool::new(true));
    let answered_frozen = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hung = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (frozen, running, answered_frozen, errors, hung) = (
                Arc::clone(&frozen),
                Arc::clone(&running),
                Arc::clone(&answered_frozen),
                Arc::clone(&errors),
                Arc::clone(&hung),
            );
            runtime.spawn(async move {
                let mut rls = client(grpc).await.expect("connect");
                let mut n = 0u64;
                while running.load(Ordering::SeqCst) {
                    n += 1;
                    let was_frozen = frozen.load(Ordering::SeqCst);
                    // A user per call: each is under its limit, so OK is the only right answer.
                    let user = format!("w{worker}-{n}");
                    let call = rls.should_rate_limit(request("chaos", &[&[("user", &user)]]));
                    match tokio::time::timeout(DEADLINE + HANG, call).await {
                        Err(_) => {
                            hung.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(Err(status)) => errors.lock().expect("errors").push(status.to_string()),
                        Ok(Ok(response)) => {
                            let response = response.into_inner();
                            if response.overall_code != 1 {
                                errors
                                    .lock()
                                    .expect("errors")
                                    .push(format!("not OK: {response:?}"));
                            }
                            // Allowed by the failure mode: the limit's whole quota left.
                            let failure_mode = response.statuses[0].limit_remaining == 3;
                            if was_frozen && frozen.load(Ordering::SeqCst) && failure_mode {
                                answered_frozen.fetch_add(1, Ordering::SeqCst);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // Freeze while traffic flows; keep it frozen until several calls were answered meanwhile.
    std::thread::sleep(Duration::from_millis(500));
    redis.freeze();
    frozen.store(true, Ordering::SeqCst);
    tollgate_testkit::wait::until(
        "calls to be answered while Redis is frozen",
        Duration::from_secs(60),
        || answered_frozen.load(Ordering::SeqCst) >= 20,
    );
    frozen.store(false, Ordering::SeqCst);
    redis.thaw();
    // Counting resumes: one user's fourth hit within the hour is over the limit.
    tollgate_testkit::wait::until(
        "limits to count again after Redis resumed",
        Duration::from_secs(60),
        || {
            runtime.block_on(async {
                let mut rls = client(grpc).await.expect("connect");
                let user = fresh_key("after");
                let mut codes = Vec::new();
                for _ in 0..4 {
                    let response = rls
                        .should_rate_limit(request("chaos", &[&[("user", &user)]]))
                        .await
                        .expect("an answer");
                    codes.push(response.into_inner().overall_code);
                }
                codes == [1, 1, 1, 2]
            })
        },
    );
    running.store(false, Ordering::SeqCst);
    runtime.block_on(async {
        for worker in workers {
            worker.await.expect("a traffic task");
        }
    });
    assert_eq!(hung.load(Ordering::SeqCst), 0, "calls that never came back");
    let errors = errors.lock().expect("errors");
    assert!(errors.is_empty(), "answers other than OK: {errors:?}");
}

/// A leased limit: a window of a minute leases for a second, so a limit of 600 reserves slices
/// of 10.
const LEASED: &str = r#"
domain: leased
descriptors:
  - key: api
    rate_limit: {window: 60s, requests_per_unit: 600, algorithm: sliding_window_log, lease: true}
"#;

/// Three `tollgate serve` processes share a leased limit on one Redis, and one is killed
/// (SIGKILL) right after it reserved a slice. The two others together admit exactly the limit
/// less that one slice, with far fewer script calls than decisions.
#[test]
fn a_killed_leased_instance_strands_only_its_slice() {
    let redis = tollgate_testkit::redis::RedisServer::start();
    let prefix = tollgate_testkit::redis::unique_prefix("leased");
    let start = || {
        tollgate_testkit::tollgate::Tollgate::builder()
            .policy("leased.yaml", LEASED)
            .args(["--backend", "redis"])
            .env("TOLLGATE_REDIS_URL", &redis.url())
            .env("TOLLGATE_KEY_PREFIX", &prefix)
            .start()
    };
    let mut dying = start();
    let survivors = [start(), start()];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let ask = |addr| async move {
        let mut rls = client(addr).await.expect("connect");
        rls.should_rate_limit(request("leased", &[&[("api", "all")]]))
            .await
            .expect("an answer")
            .into_inner()
            .overall_code
    };
    assert_eq!(
        runtime.block_on(ask(dying.grpc_addr())),
        1,
        "the first hit is admitted"
    );
    dying.kill();

    redis.reset_stats();
    let started = Instant::now();
    let mut admitted = 0u64;
    runtime.block_on(async {
        loop {
            let mut any = false;
            for survivor in &survivors {
                if ask(survivor.grpc_addr()).await == 1 {
                    admitted += 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
            assert!(admitted <= 600, "beyond the limit");
        }
    });
    let calls: u64 = redis
        .command_calls()
        .iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum();
    eprintln!("leased: {admitted} admitted by the survivors, {calls} script calls");
    // Only while the minute has not turned are the counts exact (nothing left the window).
    if started.elapsed() < Duration::from_secs(50) {
        assert_eq!(
            admitted, 590,
            "the limit less the dead instance's slice of 10"
        );
    }
    assert!(
        calls * 2 < admitted,
        "{calls} script calls for {admitted} leased decisions"
    );
    // Each survivor counts what it answered from its slices, and what it reserved.
    for survivor in &survivors {
        let metrics = tollgate_testkit::net::send(
            &tollgate_testkit::net::agent(),
            "GET",
            &survivor.url("/metrics"),
            &[],
            None,
        )
        .body;
        let value = |name: &str| {
            metrics
                .lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
        };
        assert!(value("tollgate_lease_answers_total ") > 0.0, "{metrics}");
        assert!(
            value("tollgate_lease_reservations_total ") > 0.0,
            "{metrics}"
        );
    }
}
