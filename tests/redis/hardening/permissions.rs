//! A Redis user who may not run what tollgate needs fails every decision, which the service would
//! otherwise only show as failure-mode answers. The backends check at start-up (SCRIPT LOAD, every
//! command the scripts run inside, a harmless EVALSHA) and refuse to start with an error naming
//! what is missing. The user docs/security.md recommends is the one these tests create: it starts,
//! decides and writes its keys, on one server and on the cluster.

use tokio::task::block_in_place;
use tollgate::backend::redis::acl_rule;
use tollgate::backend::{Backend, BackendError, ClusterBackend, RedisBackend};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{fresh_key, hit, one};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::target::{CALL_TIMEOUT, Store, Target};

cases! {
    a_user_who_may_not_run_the_scripts_is_refused_at_start: [redis, redis_cluster];
    the_documented_user_decides_and_one_without_time_is_refused: [redis, redis_cluster];
}

/// The ACL rules docs/security.md gives for keys under `prefix`, on one server or on a cluster:
/// the line after `# one Redis server` or `# a Redis Cluster` in its ACL block, less
/// `ACL SETUSER <user> on ><password>`.
pub fn documented_rules(prefix: &str, cluster: bool) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md");
    let text = std::fs::read_to_string(&path).expect("docs/security.md");
    let heading = if cluster {
        "# a Redis Cluster"
    } else {
        "# one Redis server"
    };
    let mut lines = text.lines().skip_while(|line| line.trim() != heading);
    let rule = lines
        .nth(1)
        .unwrap_or_else(|| panic!("docs/security.md has no `{heading}` line and rule after it"));
    let rule = rule
        .trim()
        .strip_prefix("ACL SETUSER <user> on ><password> ")
        .unwrap_or_else(|| panic!("not an ACL SETUSER line: {rule}"));
    rule.split_whitespace()
        .map(|word| word.replace("<prefix>", prefix))
        .collect()
}

/// Connects as `user` (password `pw`) to the target's store.
async fn connect_as(t: &Target, user: &str) -> Result<(), BackendError> {
    connect_backend(t, user).await.map(drop)
}

/// A backend of the target's store, logged in as `user` (password `pw`).
async fn connect_backend(t: &Target, user: &str) -> Result<Connected, BackendError> {
    let with_user = |url: &str| url.replace("redis://", &format!("redis://{user}:pw@"));
    match t.store() {
        Store::Redis(url) => RedisBackend::connect(&with_user(url), t.prefix(), CALL_TIMEOUT)
            .await
            .map(Connected::Single),
        Store::Cluster(seeds) => {
            let seeds: Vec<String> = seeds.iter().map(|url| with_user(url)).collect();
            ClusterBackend::connect(&seeds, t.prefix(), CALL_TIMEOUT)
                .await
                .map(Connected::Cluster)
        }
        Store::Memory => panic!("memory has no users"),
    }
}

/// A backend of either kind.
enum Connected {
    Single(RedisBackend),
    Cluster(ClusterBackend),
}

/// Six hits on a limit of five per hour, with each algorithm: five admitted, the sixth refused.
async fn decide_six(backend: &impl Backend) {
    for algorithm in [Algorithm::SlidingWindowCounter, Algorithm::SlidingWindowLog] {
        let h = hit(
            &fresh_key("documented"),
            algorithm,
            5,
            3_600_000,
            Cost::Consume(1),
        );
        let mut admitted = Vec::new();
        for _ in 0..6 {
            admitted.push(one(backend, &h).await.verdict.admitted);
        }
        assert_eq!(
            admitted,
            [true, true, true, true, true, false],
            "{algorithm:?}: the limit is enforced"
        );
    }
}

/// Runs `ACL SETUSER <user> <rules...>` on every server of the store.
fn set_user(servers: &[&RedisServer], user: &str, rules: &[&str]) {
    for server in servers {
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", ">pw"];
        args.extend_from_slice(rules);
        assert_eq!(server.cli(&args), "OK");
    }
}

async fn a_user_who_may_not_run_the_scripts_is_refused_at_start(t: &Target) {
    let servers: Vec<&RedisServer> = match t.store() {
        Store::Cluster(_) => t.cluster().running().collect(),
        _ => vec![t.redis_server()],
    };
    let tag = t.prefix().trim_end_matches(':').replace(['-', ':'], "_");
    let prefix_rule = format!("~{}*", t.prefix());
    // The cluster client needs CLUSTER SLOTS and the handshake commands besides tollgate's own.
    let base = [
        "+ping",
        "+hello",
        "+client",
        "+cluster",
        "+info",
        "+readonly",
    ];
    let cases: [(&str, Vec<&str>, &str); 3] = [
        (
            "noevalsha",
            vec!["+script|load", "+eval", prefix_rule.as_str()],
            "may not run EVALSHA",
        ),
        (
            "noload",
            vec!["+evalsha", "+eval", prefix_rule.as_str()],
            "may not run SCRIPT LOAD",
        ),
        (
            "nokeys",
            vec!["+evalsha", "+eval", "+script|load", "~elsewhere:*"],
            "may not touch tollgate's keys",
        ),
    ];
    for (name, rules, expected) in cases {
        let user = format!("{name}_{tag}");
        let mut all: Vec<&str> = base.to_vec();
        all.extend(rules);
        block_in_place(|| set_user(&servers, &user, &all));
        let refused = connect_as(t, &user).await;
        let Err(BackendError::Protocol(message)) = &refused else {
            panic!("{user}: started anyway: {refused:?}");
        };
        assert!(message.contains(expected), "{user}: {message}");
        assert!(
            message.contains(&user),
            "the message names the user: {message}"
        );
        assert!(!message.contains("pw@"), "no password in errors: {message}");
    }
    // And a user with what tollgate needs starts.
    let user = format!("ok_{tag}");
    let cluster = matches!(t.store(), Store::Cluster(_));
    let rules = documented_rules(t.prefix(), cluster);
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    block_in_place(|| set_user(&servers, &user, &rules));
    connect_as(t, &user)
        .await
        .expect("a user with the commands and keys it needs");
}

/// The user docs/security.md recommends decides (limits enforced, keys written under the prefix),
/// and the same user without TIME, which the scripts run first, is refused at start with an
/// error naming TIME and the rule that grants it.
async fn the_documented_user_decides_and_one_without_time_is_refused(t: &Target) {
    let servers: Vec<&RedisServer> = match t.store() {
        Store::Cluster(_) => t.cluster().running().collect(),
        _ => vec![t.redis_server()],
    };
    let cluster = matches!(t.store(), Store::Cluster(_));
    let tag = t.prefix().trim_end_matches(':').replace(['-', ':'], "_");
    let rules = documented_rules(t.prefix(), cluster);
    assert_eq!(
        rules.join(" "),
        acl_rule(t.prefix(), cluster).trim(),
        "docs/security.md gives the rule the start-up error gives"
    );
    let documented: Vec<&str> = rules.iter().map(String::as_str).collect();

    let user = format!("documented_{tag}");
    block_in_place(|| set_user(&servers, &user, &documented));
    let backend = connect_backend(t, &user)
        .await
        .expect("the documented user starts");
    match &backend {
        Connected::Single(backend) => decide_six(backend).await,
        Connected::Cluster(backend) => decide_six(backend).await,
    }
    let keys = block_in_place(|| t.keys_with_ttls());
    assert!(
        keys.iter().any(|(key, _)| key.contains("documented")),
        "the decisions wrote their keys: {keys:?}"
    );
    // TIME taken away while serving: each decision fails as a permission refused (kind
    // `noperm`, with the hint), not as a script error.
    block_in_place(|| {
        for server in &servers {
            assert_eq!(server.cli(&["ACL", "SETUSER", &user, "-time"]), "OK");
        }
    });
    let lost = [hit(
        &fresh_key("lost"),
        Algorithm::SlidingWindowCounter,
        5,
        3_600_000,
        Cost::Consume(1),
    )];
    let mut results = match &backend {
        Connected::Single(backend) => backend.acquire(&lost).await,
        Connected::Cluster(backend) => backend.acquire(&lost).await,
    };
    let failed = results
        .remove(0)
        .expect_err("a decision without TIME fails");
    assert!(
        failed
            .to_string()
            .contains("may not run what the scripts run"),
        "a permission failure: {failed}"
    );

    let user = format!("notime_{tag}");
    let without_time: Vec<&str> = documented
        .iter()
        .copied()
        .filter(|rule| *rule != "+time")
        .collect();
    assert!(
        without_time.len() < documented.len(),
        "the rule grants TIME"
    );
    block_in_place(|| set_user(&servers, &user, &without_time));
    let refused = connect_as(t, &user).await;
    let Err(BackendError::Protocol(message)) = &refused else {
        panic!("{user}: started anyway: {refused:?}");
    };
    assert!(message.contains("may not run TIME"), "{message}");
    assert!(
        message.contains(&user),
        "the message names the user: {message}"
    );
    assert!(
        message.contains(&acl_rule(t.prefix(), cluster)),
        "the message gives the rule: {message}"
    );
}
