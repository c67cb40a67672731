//! How the xDS client is set up: [`XdsOptions`], read from envoyproxy/ratelimit's variables
//! (`CONFIG_GRPC_XDS_*`, `XDS_CLIENT_*`, `FORCE_START_WITHOUT_INITIAL_CONFIG`) with the
//! reference's names, defaults and formats, so that a Deployment written for the reference (the
//! one Envoy Gateway generates included) configures tollgate unchanged.
//!
//! Formats follow the reference's settings library: durations as Go writes them (`10s`,
//! `1m30s`, `250ms`), booleans as Go's `strconv.ParseBool` reads them (`1`, `t`, `true`, `TRUE`,
//! ...), maps as `key:value,key:value`. Where the reference silently drops a malformed entry,
//! tollgate refuses to start and names it: a setting that does nothing is worse than none.

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue};

/// The largest message the client accepts from the server unless told otherwise: 4 MiB, gRPC's
/// usual default and the reference's.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// The reference's variable names, in one place for messages and docs.
pub mod vars {
    /// The management server, `host:port` (or a `http://` / `https://` URL).
    pub const SERVER_URL: &str = "CONFIG_GRPC_XDS_SERVER_URL";
    /// The node id the server selects resources by.
    pub const NODE_ID: &str = "CONFIG_GRPC_XDS_NODE_ID";
    /// Node metadata, `key=value,key=value`.
    pub const NODE_METADATA: &str = "CONFIG_GRPC_XDS_NODE_METADATA";
    /// Connect over TLS.
    pub const USE_TLS: &str = "CONFIG_GRPC_XDS_SERVER_USE_TLS";
    /// The client certificate chain (PEM) for mutual TLS.
    pub const CLIENT_CERT: &str = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT";
    /// The client private key (PEM: PKCS#1, PKCS#8 or SEC1).
    pub const CLIENT_KEY: &str = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY";
    /// The CA certificates (PEM) the server's certificate must chain to.
    pub const SERVER_CA: &str = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT";
    /// The name the server's certificate must carry, instead of the URL's host.
    pub const SERVER_SAN: &str = "CONFIG_GRPC_XDS_SERVER_TLS_SAN";
    /// Extra request headers on the stream, `key:value,key:value`.
    pub const ADDITIONAL_HEADERS: &str = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS";
    /// Delay between failed connection attempts.
    pub const CONNECT_RETRY_INTERVAL: &str = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL";
    /// Reconnect backoff: first delay.
    pub const BACKOFF_INITIAL: &str = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL";
    /// Reconnect backoff: largest delay.
    pub const BACKOFF_MAX: &str = "XDS_CLIENT_BACKOFF_MAX_INTERVAL";
    /// Reconnect backoff: growth factor per attempt.
    pub const BACKOFF_RANDOM_FACTOR: &str = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR";
    /// Reconnect backoff: randomise each delay.
    pub const BACKOFF_JITTER: &str = "XDS_CLIENT_BACKOFF_JITTER";
    /// The largest message accepted from the server, in bytes.
    pub const MAX_MESSAGE_SIZE: &str = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES";
    /// Serve before the first policies arrive (every request allowed until then).
    pub const FORCE_START: &str = "FORCE_START_WITHOUT_INITIAL_CONFIG";
}

/// The reconnect delays after a stream to the server breaks, as the reference computes them (see
/// [`super::backoff::Backoff`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BackoffOptions {
    /// `XDS_CLIENT_BACKOFF_INITIAL_INTERVAL` (default 10s): the first delay, and the shortest.
    pub initial: Duration,
    /// `XDS_CLIENT_BACKOFF_MAX_INTERVAL` (default 60s): the longest delay.
    pub max: Duration,
    /// `XDS_CLIENT_BACKOFF_RANDOM_FACTOR` (default 0.5): each attempt multiplies the delay by
    /// this. Below 1 the delay never grows, so the reference's defaults wait a constant 10 s.
    pub factor: f64,
    /// `XDS_CLIENT_BACKOFF_JITTER` (default true): pick each delay at random between the
    /// initial one and the computed one.
    pub jitter: bool,
}

impl Default for BackoffOptions {
    fn default() -> Self {
        BackoffOptions {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
            factor: 0.5,
            jitter: true,
        }
    }
}

/// Everything the xDS client needs: where the management server is, who this node is, how to
/// trust the server and prove itself to it, and how to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct XdsOptions {
    /// `CONFIG_GRPC_XDS_SERVER_URL`: `host:port` as the reference takes it (Envoy Gateway:
    /// `envoy-gateway:18001`), or a `http://` / `https://` URL. Required.
    pub server_url: String,
    /// `CONFIG_GRPC_XDS_NODE_ID` (default `default`; Envoy Gateway serves `envoy-ratelimit`).
    pub node_id: String,
    /// `CONFIG_GRPC_XDS_NODE_METADATA`: `key=value` pairs sent as string values of the node's
    /// metadata.
    pub node_metadata: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_USE_TLS` (default false). A `https://` URL turns it on too.
    pub use_tls: bool,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_CERT`: the client certificate chain for mutual TLS.
    pub client_cert: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_CLIENT_TLS_KEY`: its private key.
    pub client_key: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_CACERT`: CA certificates the server must chain to, trusted
    /// in addition to the system's.
    pub server_ca: Option<PathBuf>,
    /// `CONFIG_GRPC_XDS_SERVER_TLS_SAN`: the name the server's certificate must be valid for
    /// (also sent as SNI), instead of the URL's host.
    pub server_san: Option<String>,
    /// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: request headers sent on the stream, keys
    /// lower-cased. Values may be credentials and are never printed.
    pub additional_headers: Vec<(String, String)>,
    /// `CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL` (default 3s): the wait between failed
    /// attempts to connect.
    pub connect_retry_interval: Duration,
    /// The wait before reconnecting after a stream broke.
    pub backoff: BackoffOptions,
    /// `XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES` (default 4 MiB): the largest response accepted.
    pub max_message_size: usize,
    /// `FORCE_START_WITHOUT_INITIAL_CONFIG` (default false): serve before the first policies
    /// arrive, allowing every request until then, instead of staying not ready.
    pub force_start_without_initial_config: bool,
}

impl Default for XdsOptions {
    fn default() -> Self {
        XdsOptions {
            server_url: String::new(),
            node_id: "default".to_string(),
            node_metadata: Vec::new(),
            use_tls: false,
            client_cert: None,
            client_key: None,
            server_ca: None,
            server_san: None,
            additional_headers: Vec::new(),
            connect_retry_interval: Duration::from_secs(3),
            backoff: BackoffOptions::default(),
            max_message_size: DEFAULT_MAX_MESSAGE_SIZE,
            force_start_without_initial_config: false,
        }
    }
}

/// A setting that cannot be used, named with what is wrong. Never carries a header value or any
/// other secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XdsOptionsError {
    /// A required setting is missing.
    #[error("{name} is not set; {hint}")]
    Missing {
        /// The variable.
        name: &'static str,
        /// What to set.
        hint: &'static str,
    },
    /// A setting's value cannot be used.
    #[error("{name}: {problem}")]
    Invalid {
        /// The variable.
        name: &'static str,
        /// What is wrong and what to write instead.
        problem: String,
    },
}

fn invalid(name: &'static str, problem: impl Into<String>) -> XdsOptionsError {
    XdsOptionsError::Invalid {
        name,
        problem: problem.into(),
    }
}

impl XdsOptions {
    /// Reads the reference's variables through `lookup` (e.g. `|name| std::env::var(name).ok()`);
    /// an unset or empty variable takes its default. The server URL may be left unset here (a
    /// flag can give it); [`XdsOptions::validate`] requires it.
    pub fn from_env(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<XdsOptions, XdsOptionsError> {
        let get = |name: &str| lookup(name).filter(|value| !value.is_empty());
        let defaults = XdsOptions::default();
        let path = |name: &str| get(name).map(PathBuf::from);
        let duration = |name: &'static str, default: Duration| match get(name) {
            Some(text) => parse_go_duration(&text).ok_or_else(|| {
                invalid(
                    name,
                    format!("`{text}` is not a duration; write e.g. 10s, 1m30s or 500ms"),
                )
            }),
            None => Ok(default),
        };
        let boolean = |name: &'static str, default: bool| match get(name) {
            Some(text) => parse_go_bool(name, &text),
            None => Ok(default),
        };

        let backoff = BackoffOptions {
            initial: duration(vars::BACKOFF_INITIAL, defaults.backoff.initial)?,
            max: duration(vars::BACKOFF_MAX, defaults.backoff.max)?,
            factor: match get(vars::BACKOFF_RANDOM_FACTOR) {
                Some(text) => match text.trim().parse::<f64>() {
                    Ok(factor) if factor.is_finite() => factor,
                    _ => {
                        return Err(invalid(
                            vars::BACKOFF_RANDOM_FACTOR,
                            format!("`{text}` is not a number; write e.g. 0.5 or 2"),
                        ));
                    }
                },
                None => defaults.backoff.factor,
            },
            jitter: boolean(vars::BACKOFF_JITTER, defaults.backoff.jitter)?,
        };
        let max_message_size = match get(vars::MAX_MESSAGE_SIZE) {
            Some(text) => match text.trim().parse::<usize>() {
                Ok(size) if size > 0 => size,
                _ => {
                    return Err(invalid(
                        vars::MAX_MESSAGE_SIZE,
                        format!("`{text}` is not a positive number of bytes"),
                    ));
                }
            },
            None => defaults.max_message_size,
        };

        Ok(XdsOptions {
            server_url: get(vars::SERVER_URL).unwrap_or_default(),
            node_id: get(vars::NODE_ID).unwrap_or(defaults.node_id),
            node_metadata: match get(vars::NODE_METADATA) {
                Some(text) => parse_node_metadata(&text)?,
                None => Vec::new(),
            },
            use_tls: boolean(vars::USE_TLS, defaults.use_tls)?,
            client_cert: path(vars::CLIENT_CERT),
            client_key: path(vars::CLIENT_KEY),
            server_ca: path(vars::SERVER_CA),
            server_san: get(vars::SERVER_SAN),
            additional_headers: match get(vars::ADDITIONAL_HEADERS) {
                Some(text) => parse_headers(&text)?,
                None => Vec::new(),
            },
            connect_retry_interval: duration(
                vars::CONNECT_RETRY_INTERVAL,
                defaults.connect_retry_interval,
            )?,
            backoff,
            max_message_size,
            force_start_without_initial_config: boolean(
                vars::FORCE_START,
                defaults.force_start_without_initial_config,
            )?,
        })
    }

    /// Checks what reading the variables alone cannot: a server URL is given and usable, the
    /// client certificate comes with its key, and TLS files are not given without TLS.
    pub fn validate(&self) -> Result<(), XdsOptionsError> {
        self.endpoint()?;
        match (&self.client_cert, &self.client_key) {
            (Some(_), None) => {
                return Err(XdsOptionsError::Missing {
                    name: vars::CLIENT_KEY,
                    hint: "the client certificate needs its private key",
                });
            }
            (None, Some(_)) => {
                return Err(XdsOptionsError::Missing {
                    name: vars::CLIENT_CERT,
                    hint: "the client private key needs its certificate",
                });
            }
            _ => {}
        }
        if !self.tls() {
            let given = [
                (vars::CLIENT_CERT, self.client_cert.is_some()),
                (vars::SERVER_CA, self.server_ca.is_some()),
                (vars::SERVER_SAN, self.server_san.is_some()),
            ];
            if let Some((name, _)) = given.iter().find(|(_, set)| *set) {
                return Err(invalid(
                    name,
                    format!(
                        "is set but TLS is off, so it would be ignored; set {}=true (or use a \
                         https:// server URL)",
                        vars::USE_TLS
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that the TLS files given can be read and hold PEM, so that a wrong path stops the
    /// start instead of failing every connection. (They are read again at every connection, so
    /// a rotated certificate is picked up.)
    pub fn check_files(&self) -> Result<(), XdsOptionsError> {
        let files = [
            (vars::CLIENT_CERT, &self.client_cert),
            (vars::CLIENT_KEY, &self.client_key),
            (vars::SERVER_CA, &self.server_ca),
        ];
        for (name, path) in files {
            let Some(path) = path else { continue };
            let contents = std::fs::read(path)
                .map_err(|e| invalid(name, format!("cannot read {}: {e}", path.display())))?;
            if !contents.windows(11).any(|w| w == b"-----BEGIN ") {
                return Err(invalid(
                    name,
                    format!("{} holds no PEM block", path.display()),
                ));
            }
        }
        Ok(())
    }

    /// Whether the connection uses TLS: `CONFIG_GRPC_XDS_SERVER_USE_TLS` or a `https://` URL.
    pub fn tls(&self) -> bool {
        self.use_tls || self.server_url.starts_with("https://")
    }

    /// The server as a URL tonic can dial: `host:port` becomes `http://host:port`, or
    /// `https://host:port` with TLS.
    pub fn endpoint(&self) -> Result<String, XdsOptionsError> {
        let url = self.server_url.trim();
        if url.is_empty() {
            return Err(XdsOptionsError::Missing {
                name: vars::SERVER_URL,
                hint: "give the xDS management server as host:port (Envoy Gateway: \
                       envoy-gateway:18001)",
            });
        }
        let (scheme, rest) = match url.split_once("://") {
            Some(("http", _)) if self.use_tls => {
                return Err(invalid(
                    vars::SERVER_URL,
                    format!(
                        "`{url}` is plaintext but {}=true; write the server as host:port or \
                         https://host:port",
                        vars::USE_TLS
                    ),
                ));
            }
            Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
            Some((scheme, _)) => {
                return Err(invalid(
                    vars::SERVER_URL,
                    format!("scheme `{scheme}://` is not supported; write host:port"),
                ));
            }
            None => (if self.tls() { "https" } else { "http" }, url),
        };
        let authority = rest.trim_end_matches('/');
        let valid = !authority.is_empty()
            && !authority.contains('/')
            && authority
                .parse::<tonic::transport::Uri>()
                .is_ok_and(|uri| uri.host().is_some() && uri.port().is_some());
        if !valid {
            return Err(invalid(
                vars::SERVER_URL,
                format!("`{url}` is not host:port; write e.g. envoy-gateway:18001"),
            ));
        }
        Ok(format!("{scheme}://{authority}"))
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it.
pub fn parse_go_bool(name: &'static str, text: &str) -> Result<bool, XdsOptionsError> {
    match text.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        other => Err(invalid(
            name,
            format!("`{other}` is not a boolean; write true or false"),
        )),
    }
}

/// A duration as Go's `time.ParseDuration` reads it: a sequence of decimal numbers, each with a
/// unit (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), such as `1h30m`, `1.5s` or `250ms`; `0` alone
/// is zero. Negative durations are refused (no setting here can use one).
pub fn parse_go_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    if text == "0" {
        return Some(Duration::ZERO);
    }
    if text.is_empty() {
        return None;
    }
    let mut rest = text;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let nanos_per_unit = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total_nanos += value * nanos_per_unit;
        rest = tail;
    }
    // Go's durations are int64 nanoseconds: about 292 years at most.
    if !total_nanos.is_finite() || total_nanos > i64::MAX as f64 {
        return None;
    }
    Some(Duration::from_nanos(total_nanos.round() as u64))
}

/// `CONFIG_GRPC_XDS_NODE_METADATA`: `key=value` entries separated by commas, split at the first
/// `=` (so values may contain `=`). Empty entries (a trailing comma) are skipped; an entry
/// without `=`, which the reference drops without a word, is an error.
fn parse_node_metadata(text: &str) -> Result<Vec<(String, String)>, XdsOptionsError> {
    let mut pairs = Vec::new();
    for (index, entry) in text.split(',').enumerate() {
        if entry.is_empty() {
            continue;
        }
        match entry.split_once('=') {
            Some((key, value)) if !key.is_empty() => {
                pairs.push((key.to_string(), value.to_string()));
            }
            _ => {
                return Err(invalid(
                    vars::NODE_METADATA,
                    format!(
                        "entry {} (`{entry}`) is not key=value; write e.g. \
                         zone=eu-west-1,team=edge",
                        index + 1
                    ),
                ));
            }
        }
    }
    Ok(pairs)
}

/// `CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`: `key:value` items separated by commas, each with
/// exactly one `:` (the reference's map format); keys are lower-cased, as gRPC metadata keys
/// are. Messages name the item by position and key only: values are often credentials.
fn parse_headers(text: &str) -> Result<Vec<(String, String)>, XdsOptionsError> {
    let mut headers = Vec::new();
    for (index, item) in text.split(',').enumerate() {
        let position = index + 1;
        let parts: Vec<&str> = item.split(':').collect();
        let [key, value] = parts.as_slice() else {
            return Err(invalid(
                vars::ADDITIONAL_HEADERS,
                format!(
                    "item {position} is not key:value with exactly one `:`; write e.g. \
                     x-tenant:edge,authorization:token"
                ),
            ));
        };
        let key = key.to_ascii_lowercase();
        if key.is_empty() || AsciiMetadataKey::from_bytes(key.as_bytes()).is_err() {
            return Err(invalid(
                vars::ADDITIONAL_HEADERS,
                format!("item {position}: `{key}` is not a valid header name"),
            ));
        }
        if AsciiMetadataValue::try_from(*value).is_err() {
            return Err(invalid(
                vars::ADDITIONAL_HEADERS,
                format!(
                    "item {position} (`{key}`): the value is not a valid header value \
                     (visible ASCII only)"
                ),
            ));
        }
        headers.push((key, value.to_string()));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<XdsOptions, XdsOptionsError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        XdsOptions::from_env(|name| map.get(name).cloned())
    }

    #[test]
    fn nothing_set_gives_the_references_defaults() {
        let options = from(&[]).unwrap();
        assert_eq!(options, XdsOptions::default());
        assert_eq!(options.node_id, "default");
        assert_eq!(options.connect_retry_interval, Duration::from_secs(3));
        assert_eq!(options.backoff.initial, Duration::from_secs(10));
        assert_eq!(options.backoff.max, Duration::from_secs(60));
        assert_eq!(options.backoff.factor, 0.5);
        assert!(options.backoff.jitter);
        assert_eq!(options.max_message_size, 4_194_304);
        assert!(!options.force_start_without_initial_config);
        assert_eq!(
            options.validate(),
            Err(XdsOptionsError::Missing {
                name: vars::SERVER_URL,
                hint: "give the xDS management server as host:port (Envoy Gateway: \
                       envoy-gateway:18001)"
            })
        );
    }

    #[test]
    fn envoy_gateways_environment_reads_as_it_means() {
        let options = from(&[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001"),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
        ])
        .unwrap();
        assert_eq!(options.node_id, "envoy-ratelimit");
        assert!(options.tls());
        assert_eq!(options.client_cert, Some(PathBuf::from("/certs/tls.crt")));
        assert_eq!(options.client_key, Some(PathBuf::from("/certs/tls.key")));
        assert_eq!(options.server_ca, Some(PathBuf::from("/certs/ca.crt")));
        assert!(options.force_start_without_initial_config);
        assert_eq!(options.validate(), Ok(()));
        assert_eq!(
            options.endpoint().unwrap(),
            "https://envoy-gateway:18001".to_string()
        );
    }

    #[test]
    fn every_setting_is_read_in_the_references_format() {
        let options = from(&[
            ("CONFIG_GRPC_XDS_SERVER_URL", "127.0.0.1:18000"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=eu,expr=a=b,"),
            ("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds.internal"),
            ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "T"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "X-Tenant:edge,authorization:secret-token",
            ),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1.5s"),
            ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "250ms"),
            ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "1m30s"),
            ("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"),
            ("XDS_CLIENT_BACKOFF_JITTER", "0"),
            ("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "1024"),
        ])
        .unwrap();
        assert_eq!(
            options.node_metadata,
            vec![
                ("zone".to_string(), "eu".to_string()),
                ("expr".to_string(), "a=b".to_string())
            ]
        );
        assert_eq!(options.server_san.as_deref(), Some("xds.internal"));
        assert_eq!(
            options.additional_headers,
            vec![
                ("x-tenant".to_string(), "edge".to_string()),
                ("authorization".to_string(), "secret-token".to_string())
            ]
        );
        assert_eq!(options.connect_retry_interval, Duration::from_millis(1500));
        assert_eq!(
            options.backoff,
            BackoffOptions {
                initial: Duration::from_millis(250),
                max: Duration::from_secs(90),
                factor: 2.0,
                jitter: false,
            }
        );
        assert_eq!(options.max_message_size, 1024);
        assert_eq!(options.endpoint().unwrap(), "https://127.0.0.1:18000");
    }

    #[test]
    fn malformed_settings_are_named_and_secrets_are_not_printed() {
        let error = from(&[(
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
            "x-tenant:edge,authorization:Bearer a:b",
        )])
        .unwrap_err();
        let text = error.to_string();
        assert_eq!(
            text,
            "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: item 2 is not key:value with exactly \
             one `:`; write e.g. x-tenant:edge,authorization:token"
        );
        assert!(!text.contains("Bearer"), "{text}");

        let error = from(&[("CONFIG_GRPC_XDS_NODE_METADATA", "key1:val1,key2=val2")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "CONFIG_GRPC_XDS_NODE_METADATA: entry 1 (`key1:val1`) is not key=value; write e.g. \
             zone=eu-west-1,team=edge"
        );
        let error = from(&[("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL: `10` is not a duration; write e.g. 10s, 1m30s \
             or 500ms"
        );
        let error = from(&[("XDS_CLIENT_BACKOFF_JITTER", "yes")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "XDS_CLIENT_BACKOFF_JITTER: `yes` is not a boolean; write true or false"
        );
        let error = from(&[("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1")]).unwrap_err();
        assert_eq!(
            error.to_string(),
            "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: `-1` is not a positive number of bytes"
        );
    }

    #[test]
    fn validation_catches_contradictions() {
        let with = |pairs: &[(&str, &str)]| from(pairs).unwrap().validate();
        assert_eq!(
            with(&[
                ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
                ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true"),
                ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"),
            ])
            .unwrap_err()
            .to_string(),
            "CONFIG_GRPC_XDS_CLIENT_TLS_KEY is not set; the client certificate needs its private \
             key"
        );
        assert_eq!(
            with(&[
                ("CONFIG_GRPC_XDS_SERVER_URL", "xds:18000"),
                ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
            ])
            .unwrap_err()
            .to_string(),
            "CONFIG_GRPC_XDS_SERVER_TLS_CACERT: is set but TLS is off, so it would be ignored; \
             set CONFIG_GRPC_XDS_SERVER_USE_TLS=true (or use a https:// server URL)"
        );
        assert_eq!(
            with(&[("CONFIG_GRPC_XDS_SERVER_URL", "xds")])
                .unwrap_err()
                .to_string(),
            "CONFIG_GRPC_XDS_SERVER_URL: `xds` is not host:port; write e.g. envoy-gateway:18001"
        );
        assert_eq!(
            with(&[("CONFIG_GRPC_XDS_SERVER_URL", "dns:///xds:18000")])
                .unwrap_err()
                .to_string(),
            "CONFIG_GRPC_XDS_SERVER_URL: scheme `dns://` is not supported; write host:port"
        );
        let plain = from(&[("CONFIG_GRPC_XDS_SERVER_URL", "http://[::1]:18000/")]).unwrap();
        assert_eq!(plain.endpoint().unwrap(), "http://[::1]:18000");
        let tls = from(&[("CONFIG_GRPC_XDS_SERVER_URL", "https://xds:443")]).unwrap();
        assert!(tls.tls());
        assert_eq!(tls.validate(), Ok(()));
    }

    #[test]
    fn go_durations() {
        let ms = |n| Some(Duration::from_millis(n));
        assert_eq!(parse_go_duration("0"), ms(0));
        assert_eq!(parse_go_duration("10s"), ms(10_000));
        assert_eq!(parse_go_duration("1m30s"), ms(90_000));
        assert_eq!(parse_go_duration("1h2m3s"), ms(3_723_000));
        assert_eq!(parse_go_duration("1.5s"), ms(1500));
        assert_eq!(parse_go_duration(".5s"), ms(500));
        assert_eq!(parse_go_duration("250ms"), ms(250));
        assert_eq!(parse_go_duration("300us"), Some(Duration::from_micros(300)));
        assert_eq!(parse_go_duration("300µs"), Some(Duration::from_micros(300)));
        assert_eq!(parse_go_duration("7ns"), Some(Duration::from_nanos(7)));
        for bad in ["", "10", "s", "1.2.3s", "1d", "-1s", "1 s", "."] {
            assert_eq!(parse_go_duration(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn go_booleans() {
        for yes in ["1", "t", "T", "true", "TRUE", "True"] {
            assert_eq!(parse_go_bool("X", yes), Ok(true));
        }
        for no in ["0", "f", "F", "false", "FALSE", "False"] {
            assert_eq!(parse_go_bool("X", no), Ok(false));
        }
        assert!(parse_go_bool("X", "yes").is_err());
        assert!(parse_go_bool("X", "tRuE").is_err());
    }
}
