//! How config problems are reported, whatever found them: where a node is, what is wrong with it,
//! the error a file source returns, and the `did you mean` hint for an unknown key.
//!
//! The rules never print a location themselves: they attach a [`Location`] (a line and column for
//! a file; whatever a source without text can point at, such as the field path inside a message)
//! and the source renders it.

use std::fmt;
use std::path::{Path, PathBuf};

use super::schema::Place;

/// A 1-based position in a text file (the column counts characters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Pos {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub column: usize,
}

/// Where a node of a policy came from, as its source can tell: a [`Pos`] for a file, a field path
/// for a message. Displayed as it follows a source's name (`file.yaml` `:` `3:5`).
pub(super) trait Location: Clone + fmt::Display {
    /// How a message about another node refers to this one, as in "first at line 3".
    fn describe(&self) -> String;
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

impl Location for Pos {
    fn describe(&self) -> String {
        format!("line {}", self.line)
    }
}

/// One thing wrong (an error) or doubtful (a warning) about the node at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Finding<L> {
    /// The node it is about.
    pub at: L,
    /// What is wrong and, where it helps, what to write instead.
    pub message: String,
}

impl<L: Location> Finding<L> {
    /// A finding about the node at `at`.
    pub fn new(at: L, message: impl Into<String>) -> Self {
        Finding {
            at,
            message: message.into(),
        }
    }

    /// The finding as a warning line about `source`: `source:location: warning: message`.
    pub fn warning(&self, source: &Path) -> String {
        format!(
            "{}:{}: warning: {}",
            source.display(),
            self.at,
            self.message
        )
    }
}

impl Finding<Pos> {
    /// The finding as the error of the file `file`.
    pub fn into_error(self, file: &Path) -> ConfigError {
        ConfigError {
            file: file.to_path_buf(),
            line: self.at.line,
            column: self.at.column,
            message: self.message,
        }
    }
}

/// A config that failed to load, pointing at the offending spot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct ConfigError {
    /// The file (as given or found in the directory).
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong and, where it helps, what to write instead.
    pub message: String,
}

impl ConfigError {
    /// An error about a whole file (it cannot be read, ...), reported at its first line.
    pub(super) fn file(file: &Path, message: impl Into<String>) -> ConfigError {
        Finding::new(Pos { line: 1, column: 1 }, message).into_error(file)
    }
}

/// Explains an unknown key at `place`: where it belongs if it is known elsewhere, else the
/// closest known key here and the full list.
pub(super) fn unknown_key_message(name: &str, place: Place) -> String {
    if let Some(home) = Place::ALL
        .into_iter()
        .find(|other| *other != place && other.keys().contains(&name))
    {
        return format!(
            "`{name}` is not allowed {}; it belongs {}",
            place.inside(),
            home.home()
        );
    }
    let known = place.keys();
    let list = known
        .iter()
        .map(|k| format!("`{k}`"))
        .collect::<Vec<_>>()
        .join(", ");
    match closest(name, known) {
        Some(guess) => format!(
            "unknown key `{name}` {}; did you mean `{guess}`? (allowed: {list})",
            place.inside()
        ),
        None => format!("unknown key `{name}` {} (allowed: {list})", place.inside()),
    }
}

/// The known key a typo most likely meant: the same once case, `_` and `-` are ignored, else the
/// nearest within two edits.
fn closest<'k>(name: &str, known: &[&'k str]) -> Option<&'k str> {
    let squash = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let squashed = squash(name);
    if let Some(k) = known.iter().find(|k| squash(k) == squashed) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edit_distance(&squashed, &squash(k)), *k))
        .filter(|(d, _)| *d <= 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// The Levenshtein distance between `a` and `b`, in characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_suggestion() {
        let descriptor = Place::Descriptor.keys();
        let rate_limit = Place::RateLimit.keys();
        assert_eq!(closest("ratelimit", descriptor), Some("rate_limit"));
        assert_eq!(
            closest("requestsperunit", rate_limit),
            Some("requests_per_unit")
        );
        assert_eq!(closest("descriptor", descriptor), Some("descriptors"));
        assert_eq!(closest("Shadow-Mode", descriptor), Some("shadow_mode"));
        assert_eq!(closest("algoritm", rate_limit), Some("algorithm"));
        assert_eq!(closest("completely_else", descriptor), None);
    }

    #[test]
    fn misplaced_keys_say_where_they_belong() {
        assert_eq!(
            unknown_key_message("unit", Place::Descriptor),
            "`unit` is not allowed in a descriptor; it belongs inside `rate_limit`"
        );
        assert_eq!(
            unknown_key_message("key", Place::Top),
            "`key` is not allowed at the top level of the file; it belongs in a descriptor \
             (an item of `descriptors`)"
        );
    }

    #[test]
    fn locations_render_as_a_source_suffix() {
        let at = Pos { line: 3, column: 7 };
        assert_eq!(at.to_string(), "3:7");
        assert_eq!(at.describe(), "line 3");
        let finding = Finding::new(at, "odd");
        assert_eq!(
            finding.warning(Path::new("a.yaml")),
            "a.yaml:3:7: warning: odd"
        );
        assert_eq!(
            finding.into_error(Path::new("a.yaml")).to_string(),
            "a.yaml:3:7: odd"
        );
    }
}
