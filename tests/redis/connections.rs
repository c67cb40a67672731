//! How the single-server backend reaches its server: credentials from the URL, TLS with
//! `rediss://`. Each case starts a server configured for it.

use tokio::task::block_in_place;
use tollgate::backend::{Backend, RedisBackend};
use tollgate::window::{Algorithm, Cost};
use tollgate_testkit::cases;
use tollgate_testkit::hits::{fresh_key, hit, one};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::target::{CALL_TIMEOUT, Target};

cases! {
    password_from_the_url: [redis];
    tls_from_a_rediss_url: [redis];
}

const HOUR_MS: u64 = 3_600_000;

async fn connect(url: &str, t: &Target) -> RedisBackend {
    RedisBackend::connect(url, t.prefix(), CALL_TIMEOUT)
        .await
        .unwrap_or_else(|err| panic!("{url}: {err}"))
}

/// A server with a password: the URL's credentials are used, with or without a user name; a
/// wrong password fails every call, and a malformed URL is refused at once.
async fn password_from_the_url(t: &Target) {
    let server = block_in_place(|| RedisServer::start_with(&["--requirepass", "s3cret"]));
    let h = hit(
        &fresh_key("auth"),
        Algorithm::SlidingWindowCounter,
        2,
        HOUR_MS,
        Cost::Consume(1),
    );
    let url = format!("redis://:s3cret@127.0.0.1:{}", server.port());
    assert_eq!(one(&connect(&url, t).await, &h).await.verdict.remaining, 1);
    let user_url = format!("redis://default:s3cret@127.0.0.1:{}", server.port());
    assert_eq!(
        one(&connect(&user_url, t).await, &h)
            .await
            .verdict
            .remaining,
        0
    );

    let wrong = format!("redis://:wrong@127.0.0.1:{}", server.port());
    let refused = connect(&wrong, t).await;
    assert!(refused.acquire(std::slice::from_ref(&h)).await[0].is_err());
    assert!(
        RedisBackend::connect("not a url", t.prefix(), CALL_TIMEOUT)
            .await
            .is_err()
    );
}

/// `rediss://`: the same backend over TLS (the test server's certificate is self-signed, so the
/// URL asks to skip verification).
async fn tls_from_a_rediss_url(t: &Target) {
    let server = block_in_place(RedisServer::start_tls);
    let port = server.tls_port().expect("a TLS port");
    let backend = connect(&format!("rediss://127.0.0.1:{port}/#insecure"), t).await;
    let h = hit(
        &fresh_key("tls"),
        Algorithm::SlidingWindowLog,
        2,
        HOUR_MS,
        Cost::Consume(1),
    );
    assert_eq!(one(&backend, &h).await.verdict.remaining, 1);
    backend.ping().await.expect("ping over TLS");
    // the plain port sees the same data: the log and its sum
    let keys = block_in_place(|| server.keys(&format!("{}*", t.prefix())));
    assert_eq!(keys.len(), 2, "{keys:?}");
}
