//! The operator's scripts on a real server: `lua/peek.lua` reads a window and writes nothing (no
//! key created, no expiry moved, no entry pruned), and `lua/clear.lua` deletes every key of a
//! window and can be repeated.

use tollgate::backend::{Backend, RedisBackend, WindowState};
use tollgate::window::Cost;
use tollgate_testkit::cases;
use tollgate_testkit::hits::{ALGORITHMS, fresh_key, hit};
use tollgate_testkit::target::{CALL_TIMEOUT, Target};

cases! {
    a_peek_writes_nothing_and_a_clear_deletes_every_key: [redis];
}

/// Every key under the target's prefix that holds `key`'s window, with its content and its
/// expiry instant.
fn snapshot(t: &Target, key: &str) -> Vec<(String, String, String)> {
    let server = t.redis_server();
    let mut keys: Vec<String> = server
        .cli(&["--scan", "--pattern", &format!("{}*", t.prefix())])
        .lines()
        .filter(|line| line.contains(key))
        .map(str::to_owned)
        .collect();
    keys.sort();
    keys.into_iter()
        .map(|name| {
            let content = if name.ends_with(":l") {
                server.cli(&["ZRANGE", &name, "0", "-1", "WITHSCORES"])
            } else {
                server.cli(&["HGETALL", &name])
            };
            let expiry = server.cli(&["PEXPIRETIME", &name]);
            (name, content, expiry)
        })
        .collect()
}

async fn a_peek_writes_nothing_and_a_clear_deletes_every_key(t: &Target) {
    let backend = RedisBackend::connect(&t.redis_server().url(), t.prefix(), CALL_TIMEOUT)
        .await
        .expect("connect");
    for algorithm in ALGORITHMS {
        let key = fresh_key("peek");
        let one = hit(&key, algorithm, 5, 3_600_000, Cost::Consume(1));
        let probe = hit(&key, algorithm, 5, 3_600_000, Cost::CheckOnly);

        let idle = backend.peek(std::slice::from_ref(&probe)).await;
        assert_eq!(
            idle[0].as_ref().expect("peek"),
            &WindowState {
                used: 0,
                remaining: 5,
                reset_ms: 0
            },
            "{algorithm}"
        );
        assert!(
            snapshot(t, &key).is_empty(),
            "{algorithm}: a peek created a key"
        );

        for _ in 0..2 {
            backend.acquire(std::slice::from_ref(&one)).await[0]
                .as_ref()
                .expect("admitted");
        }
        let before = snapshot(t, &key);
        assert!(!before.is_empty(), "{algorithm}");
        for _ in 0..3 {
            let state = backend
                .peek(std::slice::from_ref(&probe))
                .await
                .remove(0)
                .expect("peek");
            assert_eq!((state.used, state.remaining), (2, 3), "{algorithm}");
            assert!(
                state.reset_ms > 3_500_000 && state.reset_ms <= 7_200_000,
                "{state:?}"
            );
        }
        assert_eq!(
            snapshot(t, &key),
            before,
            "{algorithm}: a peek changed the window"
        );

        for _ in 0..2 {
            let cleared = backend.clear(std::slice::from_ref(&probe)).await;
            assert!(cleared[0].is_ok(), "{algorithm}: {cleared:?}");
            assert!(
                snapshot(t, &key).is_empty(),
                "{algorithm}: keys left after a clear"
            );
        }
        let after = backend
            .peek(std::slice::from_ref(&probe))
            .await
            .remove(0)
            .expect("peek");
        assert_eq!(after.used, 0, "{algorithm}");
    }
}
