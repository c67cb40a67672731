//! `tollgate-bench report`: runs the chosen scenarios and writes `docs/performance.md`.
//!
//! The document has one generated section per scenario and one describing the machine, each
//! between marker comments; everything outside them is written by hand and kept as it is. A
//! section whose scenario did not run this time keeps its earlier contents.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use crate::doc::{begin_marker, end_marker, load, splice};
use crate::machine::Conditions;
use crate::scenario::{
    Bench, ScaleArgs, Scenario, ScenarioName, conditions_of, read_records, scenario,
};

/// The flags of `report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Scenarios to run, comma-separated; each is run with its default options.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ScenarioName::ALL)]
    pub scenarios: Vec<ScenarioName>,

    /// How long and how often to measure.
    #[command(flatten)]
    pub scale: ScaleArgs,

    /// The report to write; its hand-written parts are kept [default: docs/performance.md, or
    /// with --quick performance.md in the results directory: smoke numbers do not belong in the
    /// docs].
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Do not measure: write the report from the results an earlier run left in --results-dir.
    #[arg(long)]
    pub render_only: bool,
}

impl ReportArgs {
    /// Where the report goes.
    pub fn out(&self) -> PathBuf {
        match &self.out {
            Some(out) => out.clone(),
            None if self.scale.quick => self.scale.results_dir().join("performance.md"),
            None => tollgate_testkit::tools::manifest_dir().join("docs/performance.md"),
        }
    }
}

/// The name of the generated section describing the machine.
const MACHINE: &str = "machine";

/// Runs `report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let mut results: Vec<(ScenarioName, Vec<Value>)> = Vec::new();
    if args.render_only {
        for &name in &args.scenarios {
            let dir = args.scale.results_dir();
            // A scenario this machine cannot run leaves no results unless it ran elsewhere
            // into the same directory; its section then stays as it was.
            let absent = !dir.join(format!("{}.jsonl", name.name())).exists();
            if let Some(reason) = scenario(name).unavailable().filter(|_| absent) {
                skipping(name, &reason);
                continue;
            }
            results.push((name, read_records(&dir, name)?));
        }
    } else {
        let mut bench = Bench::new(args.scale.scale(), &args.scale.results_dir())?;
        for &name in &args.scenarios {
            let scenario = scenario(name);
            if let Some(reason) = scenario.unavailable() {
                skipping(name, &reason);
                continue;
            }
            let records = bench.run(scenario.as_ref())?;
            results.push((name, records));
        }
    }
    let out = args.out();
    // The machine section speaks for every section; a report of some scenarios leaves it to
    // the last whole report, and each section names its own machine.
    let whole = ScenarioName::ALL
        .iter()
        .all(|name| args.scenarios.contains(name));
    write(&out, &results, whole)?;
    crate::scenario::say(&format!("wrote {}", out.display()));
    let beside = out.parent().unwrap_or(Path::new("."));
    for (name, _) in &results {
        write_figures(scenario(*name).as_ref(), &args.scale.results_dir(), beside)?;
    }
    Ok(())
}

/// Writes the figures `scenario` draws from what it left in `results_dir` into `flamegraphs/`
/// under `beside` (the report's directory), and says where each went.
pub fn write_figures(
    scenario: &dyn Scenario,
    results_dir: &Path,
    beside: &Path,
) -> anyhow::Result<()> {
    let figures = scenario.figures(results_dir)?;
    if figures.is_empty() {
        return Ok(());
    }
    let dir = beside.join("flamegraphs");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in figures {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        crate::scenario::say(&format!("wrote {}", path.display()));
    }
    Ok(())
}

/// Says that scenario `name` cannot run here, and why.
fn skipping(name: ScenarioName, reason: &str) {
    crate::scenario::say(&format!(
        "skipping {}, its section stays as it was: {reason}",
        name.name()
    ));
}

/// Writes the sections of `results` into the document at `path`, creating it when missing; the
/// machine section too when `whole` (every scenario was asked for) or when it has none yet.
pub fn write(
    path: &Path,
    results: &[(ScenarioName, Vec<Value>)],
    whole: bool,
) -> anyhow::Result<()> {
    let mut doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => skeleton(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let conditions: Vec<Conditions> = results
        .iter()
        .map(|(_, records)| conditions_of(records))
        .collect::<anyhow::Result<_>>()?;
    if !conditions.is_empty() && (whole || !has_machine(&doc)) {
        doc = splice(&doc, MACHINE, &machine_section(&conditions));
    }
    for (name, records) in results {
        let section = scenario(*name)
            .render(records)
            .with_context(|| format!("writing the {} section", name.name()))?;
        doc = splice(&doc, name.name(), &section);
    }
    if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, doc).with_context(|| format!("writing {}", path.display()))
}

/// Whether `doc` describes a machine already (a machine section that is not empty).
fn has_machine(doc: &str) -> bool {
    let begin = begin_marker(MACHINE);
    doc.contains(&begin) && !doc.contains(&format!("{begin}\n{}", end_marker(MACHINE)))
}

/// A new report: a title and the generated sections in order.
fn skeleton() -> String {
    let mut doc = String::from("# Performance\n\nWritten by `tollgate-bench report`.\n");
    for name in std::iter::once(MACHINE).chain(ScenarioName::ALL.iter().map(|s| s.name())) {
        doc.push_str(&format!("\n{}\n{}\n", begin_marker(name), end_marker(name)));
    }
    doc
}

/// The machine the scenarios of this report ran on, and how busy it was.
fn machine_section(conditions: &[Conditions]) -> String {
    let first = &conditions[0];
    let machine = &first.machine;
    let last = &conditions[conditions.len() - 1];
    format!(
        "- {}, {} GiB, Linux {}; {}; {}; tollgate `{}` ({} build).\n\
         - **{} cores shared by everything.** The load generator (in `tollgate-bench`), tollgate \
         and every Redis process (one server, or the six nodes of the cluster) run on the same \
         cores, so every number includes the cost of generating the load, and other jobs on the \
         machine run at the same time (load average {} when the first scenario started, {} when \
         the last ended). Absolute numbers are rough; ratios of numbers measured in the same run \
         are what to compare.\n",
        machine.cpus_text(),
        machine.memory_gib,
        machine.kernel,
        if machine.redis.is_empty() {
            "Redis version unknown"
        } else {
            machine.redis.as_str()
        },
        machine.rustc,
        machine.commit,
        machine.profile,
        machine.cpus,
        load(first.load_start),
        load(last.load_end),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_empty_or_missing_machine_section_counts_as_none() {
        assert!(!has_machine("# Performance\n"));
        assert!(!has_machine(&skeleton()));
        let described = splice(&skeleton(), MACHINE, "- 2 CPUs (a model)");
        assert!(has_machine(&described));
    }
}
