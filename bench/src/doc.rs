//! Writing results as Markdown: statistics over runs, number formats, tables, and the generated
//! sections of `docs/performance.md`, which are replaced between marker comments so the
//! hand-written text around them stays.

use std::fmt::Write as _;
use std::time::Duration;

use crate::machine::{Conditions, human};

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
pub fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    Some(if values.len() % 2 == 1 {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    })
}

/// The smallest and largest of `values`; `None` when empty.
pub fn range(values: impl IntoIterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(None, |acc, v| match acc {
            None => Some((v, v)),
            Some((low, high)) => Some((low.min(v), high.max(v))),
        })
}

/// `a / b`, when both exist and `b` is not zero.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b != 0.0 => Some(a / b),
        _ => None,
    }
}

/// What a table shows for a number that was not measured.
pub const NONE: &str = "–";

/// A whole number with thousands separators: `54,323`.
pub fn count(value: Option<f64>) -> String {
    let Some(value) = value else {
        return NONE.to_owned();
    };
    let rounded = value.round();
    let digits = format!("{:.0}", rounded.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if rounded < 0.0 {
        out.insert(0, '-');
    }
    out
}

/// `low–high` as whole numbers.
pub fn count_range(range: Option<(f64, f64)>) -> String {
    match range {
        Some((low, high)) => format!("{}–{}", count(Some(low)), count(Some(high))),
        None => NONE.to_owned(),
    }
}

/// A number with `decimals` decimals.
pub fn fixed(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| NONE.to_owned(), |v| format!("{v:.decimals$}"))
}

/// Microseconds as milliseconds with two decimals.
pub fn ms(micros: Option<f64>) -> String {
    fixed(micros.map(|us| us / 1_000.0), 2)
}

/// A ratio as `2.31×`.
pub fn times(value: Option<f64>) -> String {
    value.map_or_else(|| NONE.to_owned(), |v| format!("{v:.2}×"))
}

/// The median of per-run ratios and each of them: `0.98× (runs: 0.98×, 0.90×, 0.98×)`.
pub fn times_by_run(ratios: &[f64]) -> String {
    let runs: Vec<String> = ratios.iter().map(|r| times(Some(*r))).collect();
    format!(
        "{} (runs: {})",
        times(median(ratios.iter().copied())),
        runs.join(", ")
    )
}

/// A fraction as a whole percentage: `38%`.
pub fn percent(value: Option<f64>) -> String {
    value.map_or_else(|| NONE.to_owned(), |v| format!("{:.0}%", v * 100.0))
}

/// Load averages as `1.05, 1.76, 3.01`.
pub fn load(averages: [f64; 3]) -> String {
    let shown: Vec<String> = averages.iter().map(|v| format!("{v:.2}")).collect();
    shown.join(", ")
}

/// Seconds as `humantime` writes them (`5s`, `200ms`).
pub fn seconds(seconds: f64) -> String {
    human(Duration::from_millis((seconds * 1000.0).round() as u64))
}

/// `s` unless `n` is 1.
pub fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// The sentences that open a scenario's section: when it ran, on what build, how busy the
/// machine was, and how long each point was measured.
pub fn measured(conditions: &Conditions) -> String {
    let scale = format!(
        "Every point: a {} warmup (not counted), then {} measured run{} of {}; tables give the \
         median and the min–max of the runs.",
        seconds(conditions.warmup_seconds),
        conditions.runs,
        plural(u64::from(conditions.runs)),
        seconds(conditions.duration_seconds),
    );
    opening(conditions, &scale)
}

/// [`measured`] for a scenario that counts rather than times: `scale` says how much it counted
/// in place of the warmup and the runs' length.
pub fn opening(conditions: &Conditions, scale: &str) -> String {
    let mut text = format!(
        "Measured {} ({:.0} s) at commit `{}`, {} build, on {}; load average {} at the start, {} \
         at the end. {scale}",
        conditions.started,
        conditions.seconds,
        conditions.machine.commit,
        conditions.machine.profile,
        conditions.machine.cpus_text(),
        load(conditions.load_start),
        load(conditions.load_end),
    );
    if conditions.quick {
        text.push_str(" **A smoke run (`--quick`): too short for its numbers to mean anything.**");
    }
    if conditions.machine.profile != "release" {
        text.push_str(&format!(
            " **tollgate was a {} build: not representative.**",
            conditions.machine.profile
        ));
    }
    text
}

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A Markdown table built row by row.
#[derive(Debug, Default)]
pub struct Table {
    header: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these columns.
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            header: columns
                .iter()
                .map(|(name, align)| ((*name).to_owned(), *align))
                .collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (one cell per column).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as Markdown, ending with a newline.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let names: Vec<&str> = self.header.iter().map(|(name, _)| name.as_str()).collect();
        let _ = writeln!(out, "| {} |", names.join(" | "));
        let rules: Vec<&str> = self
            .header
            .iter()
            .map(|(_, align)| match align {
                Align::Left => "---",
                Align::Right => "---:",
            })
            .collect();
        let _ = writeln!(out, "|{}|", rules.join("|"));
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        out
    }
}

/// The comment that opens the generated section `name`.
pub fn begin_marker(name: &str) -> String {
    format!(
        "<!-- tollgate-bench report: {name} begins; edits up to its end marker are overwritten -->"
    )
}

/// The comment that closes the generated section `name`.
pub fn end_marker(name: &str) -> String {
    format!("<!-- tollgate-bench report: {name} ends -->")
}

/// Replaces the generated section `name` of `doc` with `body`; a section the document does not
/// have yet is added at its end.
pub fn splice(doc: &str, name: &str, body: &str) -> String {
    let (begin, end) = (begin_marker(name), end_marker(name));
    let body = body.trim_end();
    if let Some(start) = doc.find(&begin)
        && let Some(stop) = doc[start..].find(&end).map(|at| start + at)
    {
        return format!("{}{begin}\n{body}\n{}", &doc[..start], &doc[stop..]);
    }
    let mut out = doc.trim_end().to_owned();
    if !out.is_empty() {
        out.push_str("\n\n");
    }
    let _ = write!(out, "{begin}\n{body}\n{end}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics() {
        assert_eq!(median([3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median([4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median([]), None);
        assert_eq!(range([3.0, 1.0, 2.0]), Some((1.0, 3.0)));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
    }

    #[test]
    fn formats() {
        assert_eq!(count(Some(54_323.4)), "54,323");
        assert_eq!(count(Some(999.6)), "1,000");
        assert_eq!(count(Some(12.0)), "12");
        assert_eq!(count(None), NONE);
        assert_eq!(count_range(Some((1_000.0, 2_500_000.0))), "1,000–2,500,000");
        assert_eq!(ms(Some(5_100.0)), "5.10");
        assert_eq!(times(Some(2.314)), "2.31×");
        assert_eq!(percent(Some(0.384)), "38%");
    }

    #[test]
    fn table_renders_alignment() {
        let mut table = Table::new(&[("a", Align::Left), ("b", Align::Right)]);
        table.row(vec!["x".into(), "1".into()]);
        assert_eq!(table.render(), "| a | b |\n|---|---:|\n| x | 1 |\n");
    }

    #[test]
    fn splice_replaces_only_its_section() {
        let doc = format!(
            "# T\n\nhand\n\n{}\nold\n{}\n\nmore hand\n",
            begin_marker("a"),
            end_marker("a")
        );
        let spliced = splice(&doc, "a", "new\n");
        assert_eq!(
            spliced,
            format!(
                "# T\n\nhand\n\n{}\nnew\n{}\n\nmore hand\n",
                begin_marker("a"),
                end_marker("a")
            )
        );
        let added = splice(&spliced, "b", "bee");
        assert!(added.starts_with(&spliced.trim_end().to_string()));
        assert!(added.ends_with(&format!(
            "{}\nbee\n{}\n",
            begin_marker("b"),
            end_marker("b")
        )));
        assert_eq!(splice(&added, "b", "bee"), added);
    }
}
