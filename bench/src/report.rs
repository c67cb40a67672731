//! `tollgate-bench report`: runs the chosen scenarios and writes `docs/performance.md`.
//!
//! The document has one generated section per scenario and one describing the machine, each
//! between marker comments; everything outside them is written by hand and kept as it is. A
//! section whose scenario did not run this time keeps its earlier contents.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

use crate::doc::{begin_marker, end_marker, splice};
use crate::machine::Conditions;
use crate::scenario::{Bench, ScaleArgs, ScenarioName, conditions_of, read_records, scenario};

/// The flags of `report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// Scenarios to run, comma-separated; each is run with its default options.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ScenarioName::ALL)]
    pub scenarios: Vec<ScenarioName>,

    /// How long and how often to measure.
    #[command(flatten)]
    pub scale: ScaleArgs,

    /// The report to write, every section in it; its hand-written parts are kept [default:
    /// docs/performance.md, and the accuracy section in docs/algorithms.md beside it, or with
    /// --quick the same pages in the results directory: smoke numbers do not belong in the docs].
    #[arg(long)]
    pub out: Option<PathBuf>,

    /// Do not measure: write the report from the results an earlier run left in --results-dir.
    #[arg(long)]
    pub render_only: bool,
}

impl ReportArgs {
    /// Where the report goes: the page of every section but those of other pages.
    pub fn out(&self) -> PathBuf {
        match &self.out {
            Some(out) => out.clone(),
            None if self.scale.quick => self.scale.results_dir().join("performance.md"),
            None => tollgate_testkit::tools::manifest_dir().join("docs/performance.md"),
        }
    }

    /// The page scenario `name`'s section goes on: `--out` when given, else its own page
    /// beside [`ReportArgs::out`].
    pub fn page(&self, name: ScenarioName) -> PathBuf {
        match &self.out {
            Some(out) => out.clone(),
            None => self.out().with_file_name(name.page()),
        }
    }
}

/// Scenarios' sections with the records they are rendered from.
type Sections = Vec<(ScenarioName, Vec<Value>)>;

/// The name of the generated section describing the machine.
const MACHINE: &str = "machine";

/// Runs `report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let mut results: Sections = Vec::new();
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
    let mut pages: Vec<(PathBuf, Sections)> = vec![(out.clone(), vec![])];
    for (name, records) in results {
        let page = args.page(name);
        match pages.iter_mut().find(|(path, _)| *path == page) {
            Some((_, sections)) => sections.push((name, records)),
            None => pages.push((page, vec![(name, records)])),
        }
    }
    for (path, sections) in &pages {
        if *path != out && sections.is_empty() {
            continue;
        }
        write(path, sections, whole, *path == out)?;
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

/// Writes the sections of `results` into the document at `path`, creating it when missing; on
/// the `main` page the machine section too, when `whole` (every scenario was asked for) or when
/// it has none yet.
pub fn write(
    path: &Path,
    results: &[(ScenarioName, Vec<Value>)],
    whole: bool,
    main: bool,
) -> anyhow::Result<()> {
    let mut doc = match std::fs::read_to_string(path) {
        Ok(doc) => doc,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound && main => skeleton(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let conditions: Vec<Conditions> = results
        .iter()
        .map(|(_, records)| conditions_of(records))
        .collect::<anyhow::Result<_>>()?;
    if main && !conditions.is_empty() && (whole || !has_machine(&doc)) {
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
    let own = ScenarioName::ALL
        .iter()
        .filter(|s| s.page() == "performance.md")
        .map(|s| s.name());
    for name in std::iter::once(MACHINE).chain(own) {
        doc.push_str(&format!("\n{}\n{}\n", begin_marker(name), end_marker(name)));
    }
    doc
}

/// The machine the scenarios of this report ran on, the commit and the date, in one line.
fn machine_section(conditions: &[Conditions]) -> String {
    let first = &conditions[0];
    let machine = &first.machine;
    format!(
        "{}, {} GiB, Linux {}; {}; {}; tollgate `{}` ({} build), {}; the load generator, \
         tollgate and every Redis process share these {} cores.\n",
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
        first.started.get(..10).unwrap_or(&first.started),
        machine.cpus,
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
