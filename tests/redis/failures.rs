//! Redis misbehaving under a working backend: a server that stops and comes back empty, one that
//! hangs, one that loses its script cache, a cluster master that dies. Each case has servers of
//! its own.

use std::time::{Duration, Instant};

use tokio::task::block_in_place;
use tollgate::backend::redis::KeySpace;
use tollgate::backend::{Backend, BackendError};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::backends::TestBackend;
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, assert_admitted, fresh_key, hit, one};
use tollgate_testkit::target::Target;

cases! {
    stopped_redis_fails_fast_and_recovers: [redis];
    script_flush_is_survived: [redis, redis_cluster];
    cluster_failover_is_followed: [redis_cluster];
}

const HOUR_MS: u64 = 3_600_000;
/// A window so long that no fixed-window boundary falls inside a test run.
const LONG_WINDOW_MS: u64 = 1 << 40;
/// How long a failed call may take beyond its deadline: the point is that it ends, not how fast.
const DEADLINE_SLACK: Duration = Duration::from_secs(5);
/// How long a backend may take to answer again once its server is back.
const RECOVERY: Duration = Duration::from_secs(60);

/// Waits until `backend` answers a ping again.
async fn answers_again(backend: &TestBackend) {
    let deadline = Instant::now() + RECOVERY;
    while let Err(err) = backend.ping().await {
        assert!(
            Instant::now() < deadline,
            "no answer {RECOVERY:?} after the server came back: {err}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis stops: calls fail within the deadline, for the affected hits only, and the backend
/// answers again once Redis is back, without being rebuilt. Then a server that hangs: timeouts.
///
/// Two backend instances on the server: an impatient one whose short deadline is the point, and
/// a patient one for the counts, which a loaded machine must not turn into timeouts.
async fn stopped_redis_fails_fast_and_recovers(t: &Target) {
    let mut outage = block_in_place(|| t.private());
    let timeout = Duration::from_millis(200);
    let impatient = outage.backend_with_timeout(timeout).await;
    let patient = outage.backend().await;
    let key = fresh_key("outage");
    let h = hit(
        &key,
        Algorithm::SlidingWindowLog,
        100,
        HOUR_MS,
        Cost::Consume(1),
    );
    assert!(one(&patient, &h).await.verdict.admitted);

    block_in_place(|| outage.stop());
    for _ in 0..20 {
        let started = Instant::now();
        let bad = hit(&key, Algorithm::SlidingWindowLog, 100, 0, Cost::Consume(1));
        let results = impatient.acquire(&[h.clone(), bad]).await;
        assert!(started.elapsed() < timeout + DEADLINE_SLACK);
        assert!(
            matches!(
                results[0],
                Err(BackendError::Unavailable(_) | BackendError::Timeout(_))
            ),
            "{results:?}"
        );
        assert!(
            matches!(results[1], Err(BackendError::Protocol(_))),
            "{results:?}"
        );
        // The patient instance fails alike (refused, not waited for), and so leaves behind
        // every connection the outage broke: a connection that broke while unused fails its
        // next call once, which would be the first call after the restart.
        let results = patient.acquire(std::slice::from_ref(&h)).await;
        assert!(
            matches!(
                results[0],
                Err(BackendError::Unavailable(_) | BackendError::Timeout(_))
            ),
            "{results:?}"
        );
    }
    assert!(impatient.ping().await.is_err());

    block_in_place(|| outage.restart());
    answers_again(&impatient).await;
    answers_again(&patient).await;
    // the restarted server is empty and has no scripts cached: the scripts are sent again
    assert_eq!(one(&patient, &h).await.verdict.remaining, 99);

    // a server that reads nothing (stopped by SIGSTOP) yields timeouts within the deadline
    outage.redis_server().freeze();
    let started = Instant::now();
    let result = impatient.acquire(std::slice::from_ref(&h)).await.remove(0);
    let waited = started.elapsed();
    outage.redis_server().thaw();
    assert_eq!(result, Err(BackendError::Timeout(timeout)));
    assert!(waited < timeout + DEADLINE_SLACK, "{waited:?}");
    answers_again(&impatient).await;
    // The timed-out call ran once the server woke if it had been written to the connection
    // before the deadline, which depends on how far its lane's connection got: once at most.
    let left = one(&patient, &h).await.verdict.remaining;
    assert!((97..=98).contains(&left), "{left}");
}

/// SCRIPT FLUSH empties the script cache; the next calls reload the scripts and the counts carry
/// on, releases included.
async fn script_flush_is_survived(t: &Target) {
    let flushed = block_in_place(|| t.private());
    let backend = flushed.backend().await;
    for algorithm in ALGORITHMS {
        let key = fresh_key("flush");
        let h = hit(&key, algorithm, 10, LONG_WINDOW_MS, Cost::Consume(1));
        let pair = [h.clone(), h.clone()];
        for (left_after_pair, flush) in [(8, false), (6, true), (4, true)] {
            if flush {
                block_in_place(|| flushed.script_flush());
            }
            let mut left: Vec<u64> = backend
                .acquire(&pair)
                .await
                .into_iter()
                .map(|result| {
                    result
                        .expect("decided after SCRIPT FLUSH")
                        .verdict
                        .remaining
                })
                .collect();
            // Both hits count. Which of the two ran first is not fixed: a cluster runs them
            // concurrently, and after NOSCRIPT each is sent again on its own.
            left.sort_unstable();
            assert_eq!(left, [left_after_pair, left_after_pair + 1], "{algorithm}");
            let receipt = one(&backend, &h).await.receipt.expect("a receipt");
            if flush {
                block_in_place(|| flushed.script_flush());
            }
            backend
                .release(&[receipt])
                .await
                .expect("release after flush");
        }
    }
}

/// A cluster master dies; once its replica has taken over, the backend (the same instance, not
/// rebuilt) answers again with the counts the replica had, and limiters on other masters are
/// unaffected.
async fn cluster_failover_is_followed(t: &Target) {
    let mut failing = block_in_place(|| t.private());
    let backend = failing.backend().await;
    let mut victims = Vec::new();
    for algorithm in ALGORITHMS {
        let h = hit(
            &fresh_key("failover"),
            algorithm,
            10,
            LONG_WINDOW_MS,
            Cost::Consume(1),
        );
        for _ in 0..3 {
            assert!(one(&backend, &h).await.verdict.admitted);
        }
        victims.push(h);
    }
    // the replica must hold the writes before its master dies
    block_in_place(|| {
        failing
            .cluster()
            .wait_replicas_synced(Duration::from_secs(30))
    });
    let space = KeySpace::new(failing.prefix());
    let victim_key = KeySpace::counter(&space.base(&victims[0].key));
    let killed = block_in_place(|| failing.private_cluster().fail_over_master_of(&victim_key));
    assert!(!failing.cluster().nodes[killed].is_running());

    for h in &victims {
        let deadline = Instant::now() + RECOVERY;
        let answered = loop {
            match backend.acquire(std::slice::from_ref(h)).await.remove(0) {
                Ok(outcome) => break outcome,
                Err(err) => {
                    assert!(Instant::now() < deadline, "no answer after failover: {err}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        assert_admitted(&answered, true, 6);
        // and it keeps counting on the new master up to the limit, never past it
        let mut admitted = 1;
        for _ in 0..10 {
            if one(&backend, h).await.verdict.admitted {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 7);
    }
    // limiters anywhere in the cluster work
    for n in 0..30 {
        let h = hit(
            &fresh_key(&format!("after-{n}")),
            Algorithm::SlidingWindowCounter,
            2,
            HOUR_MS,
            Cost::Consume(2),
        );
        assert_admitted(&one(&backend, &h).await, true, 0);
    }
    backend.ping().await.expect("all running masters answer");
}
