//! The gRPC server's settings beyond its address: TLS (the certificate and key, and the client CA
//! and SAN of mutual TLS) from the flags or the reference's `GRPC_SERVER_*` / `GRPC_CLIENT_*`
//! variables, and the connection ages.

use std::path::PathBuf;
use std::time::Duration;

use super::SettingsError;
use super::env::Env;
use super::flags::Flags;

/// The gRPC server's connection behaviour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrpcSettings {
    /// TLS, when on.
    pub tls: Option<crate::server::TlsFiles>,
    /// `GRPC_MAX_CONNECTION_AGE`: after how long a connection is sent GOAWAY (`None`: never).
    pub max_connection_age: Option<Duration>,
    /// `GRPC_MAX_CONNECTION_AGE_GRACE`: how long it may then finish its calls.
    pub max_connection_age_grace: Option<Duration>,
    /// `--grpc-fast-path`: ShouldRateLimit on the hand-written path (`false`: tonic's generated
    /// service).
    pub fast_path: bool,
}

pub(super) fn grpc_tls(
    flags: &Flags,
    env: &Env<'_>,
    notices: &mut Vec<String>,
) -> Result<Option<crate::server::TlsFiles>, SettingsError> {
    let use_tls = flags.tls_cert.is_some()
        || flags.tls_key.is_some()
        || env.boolean("GRPC_SERVER_USE_TLS")?.unwrap_or(false);
    let path = |flag: &Option<PathBuf>, var: &str| {
        flag.clone()
            .or_else(|| env.string(var).filter(|p| !p.is_empty()).map(PathBuf::from))
    };
    let client_ca = flags.tls_client_ca.clone().or_else(|| {
        ["GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"]
            .into_iter()
            .find_map(|var| env.string(var).filter(|p| !p.is_empty()))
            .map(PathBuf::from)
    });
    let client_san = flags
        .tls_client_san
        .clone()
        .or_else(|| env.string("GRPC_CLIENT_TLS_SAN"))
        .filter(|san| !san.is_empty());
    if !use_tls {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (
        path(&flags.tls_cert, "GRPC_SERVER_TLS_CERT"),
        path(&flags.tls_key, "GRPC_SERVER_TLS_KEY"),
    ) else {
        return Err(SettingsError::Invalid(
            "gRPC TLS needs a certificate and its key: set GRPC_SERVER_TLS_CERT and \
             GRPC_SERVER_TLS_KEY (or --tls-cert and --tls-key)"
                .into(),
        ));
    };
    if client_san.is_some() && client_ca.is_none() {
        notices.push(
            "GRPC_CLIENT_TLS_SAN has no effect without a client CA (GRPC_CLIENT_TLS_CACERT): \
             client certificates are not requested"
                .into(),
        );
    }
    Ok(Some(crate::server::TlsFiles {
        cert,
        key,
        client_san: client_san.filter(|_| client_ca.is_some()),
        client_ca,
    }))
}
