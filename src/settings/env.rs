//! The reference's environment variables, read with its rules (Go's envconfig): what a value
//! means ([`Env`]'s typed readers, Go's number and duration syntax, Go's listen addresses) and
//! how a malformed one is reported (the variable named, a secret never printed).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::time::Duration;

use super::SettingsError;
use super::flags::LogLevel;
use crate::backend::redis::connect;

/// The process environment as [`Settings::resolve`](super::Settings::resolve) reads it (a value
/// that is not UTF-8 is read lossily).
pub fn process_env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|value| value.to_string_lossy().into_owned())
}

/// Reads the boolean variable `name` from `get` with the reference's rules (`1`, `t`, `TRUE`,
/// ...); unset or empty is `None`.
pub fn boolean_var(
    name: &str,
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<bool>, SettingsError> {
    Env { get }.boolean(name)
}

/// Reads variables with the reference's (Go envconfig's) rules.
pub(super) struct Env<'a> {
    pub(super) get: &'a dyn Fn(&str) -> Option<String>,
}

/// Variables whose value is never printed.
const SECRETS: &[&str] = &[
    "REDIS_AUTH",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
];

impl Env<'_> {
    pub(super) fn string(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }

    /// A secret: empty means none.
    pub(super) fn secret(&self, name: &str) -> Option<String> {
        self.string(name).filter(|s| !s.is_empty())
    }

    pub(super) fn malformed(&self, name: &str, expected: &str) -> SettingsError {
        let value = self.string(name).unwrap_or_default();
        let value = if SECRETS.contains(&name) {
            "<redacted>".to_owned()
        } else if name.contains("URL") {
            connect::redact(&value)
        } else {
            value
        };
        SettingsError::Malformed {
            name: name.to_owned(),
            value,
            expected: format!("expected {expected}"),
        }
    }

    pub(super) fn boolean(&self, name: &str) -> Result<Option<bool>, SettingsError> {
        match self.string(name).as_deref() {
            None => Ok(None),
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(Some(true)),
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(Some(false)),
            Some(_) => Err(self.malformed(name, "true or false (also 1, 0, t, f, TRUE, FALSE)")),
        }
    }

    pub(super) fn int(&self, name: &str) -> Result<Option<i64>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => go_int(&text)
                .map(Some)
                .ok_or_else(|| self.malformed(name, "a whole number")),
        }
    }

    /// A positive whole number; unset or empty is `None`.
    pub(super) fn count(&self, name: &str) -> Result<Option<NonZeroUsize>, SettingsError> {
        match self.string(name).as_deref().map(str::trim) {
            None | Some("") => Ok(None),
            Some(text) => text
                .parse::<NonZeroUsize>()
                .map(Some)
                .map_err(|_| self.malformed(name, "a whole number of 1 or more")),
        }
    }

    pub(super) fn float(&self, name: &str) -> Result<Option<f64>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => text
                .parse::<f64>()
                .map(Some)
                .map_err(|_| self.malformed(name, "a number such as 0.8")),
        }
    }

    pub(super) fn duration(&self, name: &str) -> Result<Option<Duration>, SettingsError> {
        match self.string(name) {
            None => Ok(None),
            Some(text) => go_duration(&text).map(Some).ok_or_else(|| {
                self.malformed(
                    name,
                    "a duration such as 10s, 250ms or 1h30m (units ns, us, ms, s, m, h)",
                )
            }),
        }
    }

    pub(super) fn map(&self, name: &str) -> Result<Option<Vec<(String, String)>>, SettingsError> {
        let Some(text) = self.string(name) else {
            return Ok(None);
        };
        if text.trim().is_empty() {
            return Ok(Some(Vec::new()));
        }
        text.split(',')
            .map(|item| {
                let parts: Vec<&str> = item.split(':').collect();
                match parts.as_slice() {
                    [key, value] => Ok(((*key).to_owned(), (*value).to_owned())),
                    _ => Err(self.malformed(name, "key:value pairs separated by commas")),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A host variable and a port variable as one address; `None` when neither is set.
    pub(super) fn host_port(
        &self,
        host_var: &str,
        port_var: &str,
        default_port: u16,
    ) -> Result<Option<SocketAddr>, SettingsError> {
        let host = self.string(host_var);
        let port = match self.int(port_var) {
            Ok(None) => None,
            Ok(Some(port)) => Some(
                u16::try_from(port)
                    .map_err(|_| self.malformed(port_var, "a port number from 0 to 65535"))?,
            ),
            Err(_) => {
                return Err(self.malformed(port_var, "a port number from 0 to 65535, such as 8080"));
            }
        };
        if host.is_none() && port.is_none() {
            return Ok(None);
        }
        let host = host.unwrap_or_else(|| "0.0.0.0".into());
        let port = port.unwrap_or(default_port);
        resolve(&host, port)
            .map(Some)
            .ok_or_else(|| self.malformed(host_var, "an IP address or a host name that resolves"))
    }

    pub(super) fn log_level(&self) -> Result<Option<LogLevel>, SettingsError> {
        let Some(text) = self.string("LOG_LEVEL") else {
            return Ok(None);
        };
        match text.to_ascii_lowercase().as_str() {
            "trace" => Ok(Some(LogLevel::Trace)),
            "debug" => Ok(Some(LogLevel::Debug)),
            "info" => Ok(Some(LogLevel::Info)),
            "warn" | "warning" => Ok(Some(LogLevel::Warn)),
            "error" | "fatal" | "panic" => Ok(Some(LogLevel::Error)),
            _ => Err(self.malformed(
                "LOG_LEVEL",
                "trace, debug, info, warn (warning), error, fatal or panic",
            )),
        }
    }
}

/// A listen address in Go's forms: `:9090` (every interface), `host:9090`, `[::1]:9090`.
pub(super) fn listen_addr(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    resolve(host.trim_start_matches('[').trim_end_matches(']'), port)
}

/// `host` (empty: every interface) and `port` as one address, resolving a host name.
fn resolve(host: &str, port: u16) -> Option<SocketAddr> {
    if host.is_empty() {
        return Some(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Some(SocketAddr::new(ip, port));
    }
    (host, port).to_socket_addrs().ok()?.next()
}

/// Go's `strconv.ParseInt(text, 0, 64)`: an optional sign, then `0x`/`0o`/`0b` or a leading `0`
/// (octal) for the base, with `_` allowed between digits when a base prefix is given.
pub(super) fn go_int(text: &str) -> Option<i64> {
    let (negative, digits) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    let lower = digits.to_ascii_lowercase();
    let (radix, body, prefixed): (u32, String, bool) = if let Some(rest) = lower.strip_prefix("0x")
    {
        (16, rest.to_owned(), true)
    } else if let Some(rest) = lower.strip_prefix("0o") {
        (8, rest.to_owned(), true)
    } else if let Some(rest) = lower.strip_prefix("0b") {
        (2, rest.to_owned(), true)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, lower[1..].to_owned(), true)
    } else {
        (10, lower.clone(), false)
    };
    if body.is_empty() || body.starts_with('_') || body.ends_with('_') || body.contains("__") {
        return None;
    }
    // Base 0 allows `_` between digits, with or without a prefix (`1_000` parses).
    let _ = prefixed;
    let clean: String = body.chars().filter(|c| *c != '_').collect();
    if !clean.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(&clean, radix).ok()?;
    let value = if negative { -magnitude } else { magnitude };
    i64::try_from(value).ok()
}

/// Go's `time.ParseDuration`: a sequence of decimal numbers, each with an optional fraction and
/// a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), with an optional sign; `0` alone is allowed.
/// A negative duration reads as zero (the reference treats both alike).
pub(super) fn go_duration(text: &str) -> Option<Duration> {
    let (negative, mut rest) = match text.as_bytes().first()? {
        b'-' => (true, &text[1..]),
        b'+' => (false, &text[1..]),
        _ => (false, text),
    };
    if rest == "0" {
        return Some(Duration::ZERO);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." || number.matches('.').count() > 1 {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let nanos_per_unit = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit_end..];
        total_nanos += value * nanos_per_unit;
    }
    if negative || total_nanos <= 0.0 {
        return Some(Duration::ZERO);
    }
    Some(Duration::from_nanos(total_nanos.min(u64::MAX as f64) as u64))
}
