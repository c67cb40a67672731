//! The xDS source feeding the server: runs the ADS client and puts what it accepts in force
//! (the limiter's snapshot, readiness, metrics and the origin line of `/rlconfig`). The file
//! source's counterpart is `reload.rs`.

use std::sync::Arc;

use super::App;
use crate::backend::Backend;
use crate::config::LoadOptions;
use crate::config::xds::{Accepted, Events, ExtensionDefaults, Rejected, XdsClient, XdsOptions};

/// Runs the ADS client for `app` until the task is dropped.
pub async fn run<B: Backend>(
    app: Arc<App<B>>,
    options: XdsOptions,
    defaults: ExtensionDefaults,
    load_options: LoadOptions,
) {
    let feed = Feed {
        app,
        server: options.server_url.clone(),
        node: options.node_id.clone(),
    };
    feed.app
        .origin
        .set(vec![feed.origin("waiting for the first push")]);
    XdsClient::new(options, defaults, load_options)
        .run(feed)
        .await;
}

/// Where the client's reports go.
struct Feed<B> {
    app: Arc<App<B>>,
    server: String,
    node: String,
}

impl<B> Feed<B> {
    /// The `/rlconfig` origin line, ending with `state`.
    fn origin(&self, state: &str) -> String {
        format!("xds server={} node={} {state}", self.server, self.node)
    }
}

impl<B: Backend> Events for Feed<B> {
    async fn connected(&self) {
        self.app.metrics.observe_xds_connect();
    }

    async fn accepted(&self, update: Accepted) {
        let domains = update.config.len();
        let hash = update.config.content_hash();
        super::reload::log_dropped(
            &self.app.limiter.config(),
            &update.config,
            &self.origin(&format!("version={:?}", update.version)),
        );
        self.app.limiter.set_config(Arc::new(update.config));
        self.app.metrics.observe_config_load(Ok(&hash), update.at);
        self.app
            .metrics
            .observe_xds_update(&update.version, update.at);
        self.app.origin.set(vec![self.origin(&format!(
            "version={:?} resources={} accepted={}",
            update.version,
            update.resources,
            humantime::format_rfc3339_seconds(update.at),
        ))]);
        self.app.health.policies_loaded(domains).await;
    }

    async fn rejected(&self, rejected: &Rejected) {
        self.app.metrics.observe_xds_nack();
        self.app
            .metrics
            .observe_config_load(Err(()), std::time::SystemTime::now());
        // The line about the policies in force stays first; the refusal is said below it.
        let mut lines = self.app.origin.get();
        lines.truncate(1);
        lines.push(format!(
            "refused version={:?}: {}",
            rejected.version, rejected.reason
        ));
        self.app.origin.set(lines);
    }
}
