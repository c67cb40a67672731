//! Logs that stay quiet when Redis does not: connections killed every 100 ms for 6 s, and a
//! cluster master failing over, each under a steady trickle of requests, add a handful of lines
//! to a `tollgate serve` process's log (each failure kind once per interval, the `redis` crate's
//! own reconnect lines off), where they used to add a warning and a recovery line per killed
//! connection and hundreds per failover. And a reload that drops a limit says so at WARN.
//!
//! The lines are counted in the process's captured output, from the moment the trouble starts
//! until tollgate decides again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tollgate_testkit::hits::fresh_key;
use tollgate_testkit::redis::{RedisCluster, RedisServer};
use tollgate_testkit::rls::{client, request};
use tollgate_testkit::tollgate::Tollgate;
use tollgate_testkit::wait;

/// Three hits per user per hour: a fresh user's fourth hit is refused when the store decides.
const POLICY: &str = "domain: quiet
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
";

/// How long the churn lasts, and how often a connection is killed.
const CHURN: Duration = Duration::from_secs(6);
const KILL_EVERY: Duration = Duration::from_millis(100);

/// A steady trickle of requests, one user each, until dropped; counts the answers.
struct Trickle {
    running: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Trickle {
    fn start(grpc: std::net::SocketAddr) -> Trickle {
        let running = Arc::new(AtomicBool::new(true));
        let answered = Arc::new(AtomicU64::new(0));
        let (flag, count) = (Arc::clone(&running), Arc::clone(&answered));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let mut rls = client(grpc).await.expect("connect");
                let mut ticker = tokio::time::interval(Duration::from_millis(20));
                while flag.load(Ordering::SeqCst) {
                    ticker.tick().await;
                    let user = fresh_key("trickle");
                    let call = rls.should_rate_limit(request("quiet", &[&[("user", &user)]]));
                    if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(10), call).await {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        });
        Trickle {
            running,
            answered,
            thread: Some(thread),
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::SeqCst)
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.running.store(false, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether the store decides: a fresh user's four hits are admitted three times, then refused
/// (a failure-mode answer would admit the fourth).
fn decides(tollgate: &Tollgate) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let Ok(mut rls) = client(tollgate.grpc_addr()).await else {
            return false;
        };
        let user = fresh_key("check");
        let mut codes = Vec::new();
        for _ in 0..4 {
            match rls
                .should_rate_limit(request("quiet", &[&[("user", &user)]]))
                .await
            {
                Ok(response) => codes.push(response.into_inner().overall_code),
                Err(_) => return false,
            }
        }
        codes == [1, 1, 1, 2]
    })
}

/// The log lines after the first `skip`.
fn lines_after(tollgate: &Tollgate, skip: usize) -> Vec<String> {
    tollgate
        .log()
        .lines()
        .skip(skip)
        .map(str::to_owned)
        .collect()
}

#[test]
fn connections_killed_every_100ms_add_at_most_a_dozen_lines() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::builder()
        .policy("quiet.yaml", POLICY)
        .args(["--backend", "redis"])
        .env("TOLLGATE_REDIS_URL", &redis.url())
        .start();
    assert!(decides(&tollgate), "the store decides before the churn");
    let trickle = Trickle::start(tollgate.grpc_addr());
    wait::until("the trickle to flow", Duration::from_secs(30), || {
        trickle.answered() >= 10
    });
    let before = tollgate.log().lines().count();
    let answered_before = trickle.answered();

    let started = Instant::now();
    let mut kills = 0u64;
    while started.elapsed() < CHURN {
        let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        kills += killed.trim().parse::<u64>().unwrap_or(0);
        std::thread::sleep(KILL_EVERY);
    }
    wait::until(
        "tollgate to decide again after the churn",
        Duration::from_secs(30),
        || decides(&tollgate),
    );
    let answered = trickle.answered() - answered_before;
    drop(trickle);

    let added = lines_after(&tollgate, before);
    eprintln!(
        "churn: {kills} connections killed, {answered} requests answered, {} lines:\n{}",
        added.len(),
        added.join("\n")
    );
    assert!(
        kills >= 20,
        "the churn killed tollgate's connections: {kills}"
    );
    assert!(
        answered > 100,
        "the trickle was answered throughout: {answered}"
    );
    assert!(
        added
            .iter()
            .any(|line| line.contains("backend call failed")),
        "the churn failed calls, and said so once:\n{}",
        added.join("\n")
    );
    assert!(
        added.len() <= 12,
        "{} lines for 6 s of churn:\n{}",
        added.len(),
        added.join("\n")
    );
}

#[test]
fn a_cluster_master_failover_adds_at_most_fifty_lines() {
    let mut cluster = RedisCluster::start();
    let tollgate = Tollgate::builder()
        .policy("quiet.yaml", POLICY)
        .args(["--backend", "redis-cluster"])
        .env("TOLLGATE_REDIS_URL", &cluster.urls().join(","))
        .start();
    assert!(
        decides(&tollgate),
        "the cluster decides before the failover"
    );
    // Before the trickle: its writes keep the replicas' offsets moving.
    cluster.wait_replicas_synced(Duration::from_secs(30));
    let trickle = Trickle::start(tollgate.grpc_addr());
    wait::until("the trickle to flow", Duration::from_secs(30), || {
        trickle.answered() >= 10
    });
    let before = tollgate.log().lines().count();

    cluster.fail_over_master_of("any key");
    // Users land on every master: a run of fresh users all decided means every slot is served.
    wait::until(
        "tollgate to decide again on every master",
        Duration::from_secs(60),
        || (0..10).all(|_| decides(&tollgate)),
    );
    drop(trickle);

    let added = lines_after(&tollgate, before);
    eprintln!("failover: {} lines:\n{}", added.len(), added.join("\n"));
    assert!(
        !added.iter().any(|line| line.contains("redis::")),
        "the redis crate's own lines are off by default:\n{}",
        added.join("\n")
    );
    assert!(
        added.len() <= 50,
        "{} lines for one failover:\n{}",
        added.len(),
        added.join("\n")
    );
}

#[test]
fn a_reload_that_drops_a_limit_warns_naming_it() {
    let two = "domain: quiet
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 9}
";
    let tollgate = Tollgate::builder()
        .policy("quiet.yaml", two)
        .args(["--reload-interval", "100ms", "--reload-settle", "200ms"])
        .start();
    // Cut short after the first limit: still valid YAML, one limit fewer.
    let file = tollgate.config_dir().join("quiet.yaml");
    let cut = two.find("  - key: path").expect("the second limit");
    std::fs::write(&file, &two[..cut]).expect("rewrite the policy");
    wait::until("the reload to warn", Duration::from_secs(30), || {
        tollgate.log().contains("config reload drops")
    });
    let log = tollgate.log();
    let warning = log
        .lines()
        .find(|line| line.contains("config reload drops"))
        .expect("the warning");
    assert!(warning.contains("WARN"), "at WARN: {warning}");
    assert!(warning.contains("quiet.path"), "names the limit: {warning}");
    assert!(
        !warning.contains("quiet.user"),
        "only what was dropped: {warning}"
    );
}
