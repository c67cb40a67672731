//! Where policies come from: a `--config` path, the reference's runtime directory layout
//! (`RUNTIME_*`), or an xDS management server (`--xds-server-url`, `CONFIG_TYPE=GRPC_XDS_SOTW`
//! with the reference's `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*` variables).

use std::path::PathBuf;

use super::env::Env;
use super::flags::{AlgorithmArg, Flags};
use super::{Entry, SettingsError};
use crate::config::xds::{ExtensionDefaults, XdsOptions};
use crate::config::{FileSource, RuntimeLayout};
use crate::window::Algorithm;

/// Where policies come from.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicySettings {
    /// Files: a path, or the reference's runtime layout.
    Files(FileSource),
    /// An xDS server (`--xds-server-url`, or `CONFIG_TYPE=GRPC_XDS_SOTW`).
    XdsSotw {
        /// The client's settings, from `CONFIG_GRPC_XDS_*` and `XDS_CLIENT_*`.
        options: Box<XdsOptions>,
        /// What limits get when a push leaves tollgate's extensions out.
        defaults: ExtensionDefaults,
    },
}

pub(super) fn policies(
    entry: Entry,
    flags: &Flags,
    env: &Env<'_>,
) -> Result<PolicySettings, SettingsError> {
    let xds_wanted = match env.string("CONFIG_TYPE").as_deref() {
        None | Some("FILE") => false,
        Some("GRPC_XDS_SOTW") => true,
        Some(_) => return Err(env.malformed("CONFIG_TYPE", "FILE or GRPC_XDS_SOTW")),
    };
    // A flag wins over the environment: --config reads files whatever CONFIG_TYPE says.
    match (&flags.config, &flags.xds_server_url) {
        (Some(_), Some(_)) => {
            return Err(SettingsError::Invalid(
                "give either --config or --xds-server-url, not both".into(),
            ));
        }
        (Some(path), None) => return Ok(PolicySettings::Files(FileSource::Path(path.clone()))),
        (None, Some(url)) => return xds_policies(flags, env, Some(url)),
        (None, None) if xds_wanted => return xds_policies(flags, env, None),
        (None, None) => {}
    }
    const RUNTIME: [&str; 5] = [
        "RUNTIME_ROOT",
        "RUNTIME_SUBDIRECTORY",
        "RUNTIME_APPDIRECTORY",
        "RUNTIME_WATCH_ROOT",
        "RUNTIME_IGNOREDOTFILES",
    ];
    if entry == Entry::Tollgate && RUNTIME.iter().all(|var| env.string(var).is_none()) {
        return Err(SettingsError::Invalid(
            "no policies: pass --config PATH (or TOLLGATE_CONFIG), or set the reference's \
             RUNTIME_ROOT / RUNTIME_SUBDIRECTORY / RUNTIME_APPDIRECTORY"
                .into(),
        ));
    }
    Ok(PolicySettings::Files(FileSource::Runtime(RuntimeLayout {
        root: PathBuf::from(
            env.string("RUNTIME_ROOT")
                .unwrap_or_else(|| "/srv/runtime_data/current".into()),
        ),
        subdirectory: env.string("RUNTIME_SUBDIRECTORY").unwrap_or_default(),
        appdirectory: env
            .string("RUNTIME_APPDIRECTORY")
            .unwrap_or_else(|| "config".into()),
        watch_root: env.boolean("RUNTIME_WATCH_ROOT")?.unwrap_or(true),
        ignore_dot_files: env.boolean("RUNTIME_IGNOREDOTFILES")?.unwrap_or(false),
    })))
}

/// The xDS source: its client settings from the reference's variables, the server from
/// `--xds-server-url` when given; files it names must be readable now.
fn xds_policies(
    flags: &Flags,
    env: &Env<'_>,
    server_url: Option<&String>,
) -> Result<PolicySettings, SettingsError> {
    let invalid =
        |error: crate::config::xds::XdsOptionsError| SettingsError::Invalid(error.to_string());
    let mut options = XdsOptions::from_env(|name| env.string(name)).map_err(invalid)?;
    if let Some(url) = server_url {
        options.server_url = url.clone();
    }
    // Whether its TLS files can be read is checked at start-up, not here, where settings are
    // only resolved.
    options.validate().map_err(invalid)?;
    let defaults = ExtensionDefaults {
        algorithm: flags
            .xds_default_algorithm
            .map(|algorithm| match algorithm {
                AlgorithmArg::SlidingWindowCounter => Algorithm::SlidingWindowCounter,
                AlgorithmArg::SlidingWindowLog => Algorithm::SlidingWindowLog,
            }),
    };
    Ok(PolicySettings::XdsSotw {
        options: Box::new(options),
        defaults,
    })
}
