//! A Redis user who may not run what tollgate needs fails every decision, which the service would
//! otherwise only show as failure-mode answers. The backends check at start-up (SCRIPT LOAD and a
//! harmless EVALSHA) and refuse to start with an error naming what is missing.

use tokio::task::block_in_place;
use tollgate::backend::{BackendError, ClusterBackend, RedisBackend};
use tollgate_testkit::cases;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::target::{CALL_TIMEOUT, Store, Target};

cases! {
    a_user_who_may_not_run_the_scripts_is_refused_at_start: [redis, redis_cluster];
}

/// Connects as `user` (password `pw`) to the target's store.
async fn connect_as(t: &Target, user: &str) -> Result<(), BackendError> {
    let with_user = |url: &str| url.replace("redis://", &format!("redis://{user}:pw@"));
    match t.store() {
        Store::Redis(url) => RedisBackend::connect(&with_user(url), t.prefix(), CALL_TIMEOUT)
            .await
            .map(drop),
        Store::Cluster(seeds) => {
            let seeds: Vec<String> = seeds.iter().map(|url| with_user(url)).collect();
            ClusterBackend::connect(&seeds, t.prefix(), CALL_TIMEOUT)
                .await
                .map(drop)
        }
        Store::Memory => panic!("memory has no users"),
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
    let mut all: Vec<&str> = base.to_vec();
    all.extend(["+evalsha", "+eval", "+script|load", prefix_rule.as_str()]);
    block_in_place(|| set_user(&servers, &user, &all));
    connect_as(t, &user)
        .await
        .expect("a user with the commands and keys it needs");
}
