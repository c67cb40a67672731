//! Readings from Linux `/proc`: CPU time of a process and the load average.

use anyhow::{Context, anyhow};

/// User + system CPU seconds process `pid` has used so far (all its threads).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat_cpu(&stat).with_context(|| format!("parsing {path}"))
}

/// User + system CPU seconds this process has used so far.
pub fn own_cpu_seconds() -> anyhow::Result<f64> {
    cpu_seconds(std::process::id())
}

/// The resident set size of process `pid` (`VmRSS`), in bytes.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| anyhow!("no VmRSS in {path}"))?;
    Ok(kib * 1024)
}

/// The 1, 5 and 15 minute load averages.
pub fn load_average() -> [f64; 3] {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut fields = text
        .split_whitespace()
        .map(|field| field.parse().unwrap_or(0.0));
    [(); 3].map(|()| fields.next().unwrap_or(0.0))
}

fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

fn parse_stat_cpu(stat: &str) -> anyhow::Result<f64> {
    // The command name (field 2) is in parentheses and may hold spaces; after it come field 3
    // (state) onwards, with utime and stime as fields 14 and 15.
    let after_name = stat
        .rfind(')')
        .map(|end| &stat[end + 1..])
        .ok_or_else(|| anyhow!("no command name"))?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| -> anyhow::Result<u64> {
        fields
            .get(index)
            .ok_or_else(|| anyhow!("too few fields"))?
            .parse()
            .context("a CPU time field is not a number")
    };
    Ok((ticks(11)? + ticks(12)?) as f64 / clock_ticks_per_second())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cpu_fields_are_found_after_the_name() {
        let stat = "4242 (tokio (x) y) S 1 2 3 4 5 6 7 8 9 10 250 150 0 0 20 0";
        let seconds = parse_stat_cpu(stat).unwrap();
        assert!((seconds - 400.0 / clock_ticks_per_second()).abs() < 1e-9);
        assert!(own_cpu_seconds().unwrap() >= 0.0);
        assert!(rss_bytes(std::process::id()).unwrap() > 0);
    }
}
