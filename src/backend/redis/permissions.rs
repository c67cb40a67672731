//! What a Redis user must be allowed for tollgate to decide, and the check that it is: the
//! commands tollgate sends ([`CLIENT_COMMANDS`]), the commands its scripts run inside
//! ([`SCRIPT_COMMANDS`]; Redis checks each against the user's ACL as the script runs), what the
//! cluster client sends besides ([`CLUSTER_COMMANDS`]), and the key prefix. [`acl_rule`] is the
//! rule docs/security.md and every permission error give; the check (`lua/permissions.lua`) runs
//! every script command on keys of its own, so a user who may call the scripts but not what is
//! inside them is named at start-up instead of failing every decision open.

use redis::{Cmd, RedisError};

use super::keys::{KeySpace, LOG_KEYS};
use crate::backend::BackendError;

/// The commands tollgate sends itself: the scripts by hash, by text when a server lost them,
/// their loading, and the health check.
pub const CLIENT_COMMANDS: &[&str] = &["evalsha", "eval", "script|load", "ping"];

/// The commands the scripts of `lua/` run (`redis.call`), each checked by Redis against the
/// user's ACL when the script reaches it.
pub const SCRIPT_COMMANDS: &[&str] = &[
    "time",
    "hget",
    "hmget",
    "hgetall",
    "hkeys",
    "hlen",
    "hset",
    "hincrby",
    "hdel",
    "pexpire",
    "pexpireat",
    "del",
    "zadd",
    "zcard",
    "zrange",
    "zrangebyscore",
    "zrem",
    "zremrangebyscore",
    "zscore",
];

/// What the `redis` crate's cluster client sends besides, to learn the slot map when it
/// connects and after a failover.
pub const CLUSTER_COMMANDS: &[&str] = &["cluster|slots"];

/// The check script (see its header).
const CHECK: &str = include_str!("../../../lua/permissions.lua");

/// The ACL rule a user needs, for keys starting with `prefix`, on a cluster or one server:
/// `+evalsha +eval ... ~<prefix>*`.
pub fn acl_rule(prefix: &str, cluster: bool) -> String {
    let mut rule = String::new();
    let extra: &[&str] = if cluster { CLUSTER_COMMANDS } else { &[] };
    for command in CLIENT_COMMANDS.iter().chain(SCRIPT_COMMANDS).chain(extra) {
        rule.push('+');
        rule.push_str(command);
        rule.push(' ');
    }
    rule.push('~');
    rule.push_str(prefix);
    rule.push('*');
    rule
}

/// The check's call: `EVAL` of `lua/permissions.lua` on a log's keys of its own under the prefix
/// (one hash tag, so one slot on a cluster). `EVAL` rather than `EVALSHA`: it runs once per new
/// connection, and needs no loading of its own.
pub(super) fn check_command(keys: &KeySpace) -> Cmd {
    let base = keys.base("tollgate-permission-check");
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(CHECK).arg(LOG_KEYS.len());
    for suffix in LOG_KEYS {
        cmd.arg(format!("{base}{suffix}"));
    }
    cmd
}

/// The commands the check's reply names as refused for want of a permission (upper case, as
/// Redis spells them in its docs); failures of another kind (OOM on a write) are not a
/// permission matter and are left to the calls that meet them.
pub(super) fn refused_commands(reply: &[String]) -> Vec<String> {
    reply
        .chunks(2)
        .filter(|pair| pair.get(1).is_some_and(|err| is_permission_text(err)))
        .filter_map(|pair| pair.first().map(|command| command.to_ascii_uppercase()))
        .collect()
}

/// Whether a server error's text says the user lacks a permission: `NOPERM` from a command, or
/// what a script's `redis.call` raises (Redis 7.0: "The user executing the script can't run this
/// command or subcommand" / "can't access at least one of the keys"; later versions: "no
/// permissions to run / access").
pub fn is_permission_text(detail: &str) -> bool {
    let lower = detail.to_ascii_lowercase();
    lower.contains("noperm")
        || lower.contains("can't run this command")
        || lower.contains("can't access at least one of the keys")
        || lower.contains("no permissions to")
}

/// Finishes a permission check after its probe (a check-only decision by `EVALSHA`, whose
/// outcome is `probed`): a probe refused for `EVALSHA` itself or for the keys is answered as it
/// is; otherwise `lua/permissions.lua` runs every command the scripts run, and the ones refused
/// are named. The error says whether it is a permission refused (`true`: every decision would
/// fail) or the check could not be made (`false`: the server is down, slow or loading).
pub(super) async fn check_inside<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    keys: &KeySpace,
    user: &str,
    rule: &str,
    probed: Result<(), RedisError>,
) -> Result<(), (bool, BackendError)> {
    let classify = |err: RedisError| match permission_error(&err, user, rule) {
        Some(refused) => (true, refused),
        None => (false, super::backend_error(&err)),
    };
    if let Err(err) = &probed {
        let command_level = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm);
        if command_level || !is_permission_text(&err.to_string()) {
            return Err(classify(err.clone()));
        }
    }
    let failed: Vec<String> = check_command(keys)
        .query_async(conn)
        .await
        .map_err(classify)?;
    let commands = refused_commands(&failed);
    if !commands.is_empty() {
        return Err((true, refused(user, rule, &commands)));
    }
    probed.map_err(classify)
}

/// The start-up (or reconnect) error for a user refused `commands` inside the scripts.
pub(super) fn refused(user: &str, rule: &str, commands: &[String]) -> BackendError {
    BackendError::Protocol(format!(
        "the Redis user {user} may not run {} (the scripts run {}); tollgate needs: ACL SETUSER \
         {user} {rule}",
        commands.join(", "),
        if commands.len() == 1 { "it" } else { "them" },
    ))
}

/// What a failed check call found, when it is a permission refused: the error names what the
/// user may not do and the rule that grants it. `None` for any other failure.
pub(super) fn permission_error(err: &RedisError, user: &str, rule: &str) -> Option<BackendError> {
    let detail = err.to_string();
    let noperm = err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm);
    if !noperm && !is_permission_text(&detail) {
        return None;
    }
    let lower = detail.to_ascii_lowercase();
    let what = ["script|load", "evalsha", "eval", "script", "ping"]
        .into_iter()
        .find(|command| lower.contains(&format!("'{command}'")))
        .map(|command| {
            format!(
                "may not run {}",
                command.to_ascii_uppercase().replace('|', " ")
            )
        })
        .unwrap_or_else(|| {
            if lower.contains("access") || lower.contains("keys") {
                "may not touch tollgate's keys".to_owned()
            } else {
                "may not run a command the scripts run".to_owned()
            }
        });
    Some(BackendError::Protocol(format!(
        "the Redis user {user} {what} ({detail}); tollgate needs: ACL SETUSER {user} {rule}"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command any script of `lua/` calls, read from the files themselves.
    fn called_by(text: &str) -> Vec<String> {
        let mut found = Vec::new();
        for piece in text.split("redis.call(").skip(1) {
            let quoted = piece.trim_start();
            let Some(quote) = quoted.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                continue;
            };
            if let Some(name) = quoted[1..].split(quote).next() {
                found.push(name.to_ascii_lowercase());
            }
        }
        found
    }

    #[test]
    fn the_rule_and_the_check_cover_every_command_the_scripts_run() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut scripts = 0;
        for entry in std::fs::read_dir(&dir).expect("lua/") {
            let path = entry.expect("an entry").path();
            if path.file_name().is_some_and(|n| n == "permissions.lua") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a script");
            scripts += 1;
            for command in called_by(&text) {
                assert!(
                    SCRIPT_COMMANDS.contains(&command.as_str()),
                    "{} runs {command}, which the ACL rule does not grant",
                    path.display()
                );
                assert!(
                    CHECK.contains(&format!("try('{}'", command.to_ascii_uppercase())),
                    "{} runs {command}, which lua/permissions.lua does not check",
                    path.display()
                );
            }
        }
        assert!(scripts >= 6, "the scripts were read");
        for command in SCRIPT_COMMANDS {
            assert!(
                CHECK.contains(&format!("try('{}'", command.to_ascii_uppercase())),
                "{command} is granted but never checked"
            );
        }
    }

    #[test]
    fn the_rule_lists_every_command_and_the_prefix() {
        let rule = acl_rule("tollgate:", false);
        assert!(rule.starts_with("+evalsha +eval +script|load +ping +time "));
        assert!(rule.ends_with(" ~tollgate:*"));
        assert!(!rule.contains("cluster"));
        assert!(acl_rule("p:", true).contains("+cluster|slots ~p:*"));
    }

    #[test]
    fn the_docs_give_the_rule_the_errors_give() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/security.md");
        let docs = std::fs::read_to_string(path).expect("docs/security.md");
        for cluster in [false, true] {
            let line = format!(
                "ACL SETUSER <user> on ><password> {}\n",
                acl_rule("<prefix>", cluster)
            );
            assert!(docs.contains(&line), "docs/security.md lacks {line}");
        }
    }

    #[test]
    fn only_permission_failures_count_as_refused() {
        let reply: Vec<String> = [
            "TIME",
            "ERR The user executing the script can't run this command or subcommand",
            "HSET",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ZADD",
            "NOPERM User u has no permissions to run the 'zadd' command",
        ]
        .map(str::to_owned)
        .to_vec();
        assert_eq!(refused_commands(&reply), ["TIME", "ZADD"]);
        let message = refused("app", &acl_rule("p:", false), &["TIME".to_owned()]).to_string();
        assert!(message.contains("may not run TIME"), "{message}");
        assert!(message.contains("ACL SETUSER app +evalsha"), "{message}");
    }
}
