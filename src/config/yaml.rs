//! A small YAML tree that remembers where every node came from, so that validation can point at
//! `line:column`. Built from `saphyr-parser` events.
//!
//! Scalars keep their source text; [`Scalar::resolve`] types plain scalars the way the reference
//! implementation's YAML library (YAML 1.1) does, so `yes`/`on` are booleans and `0x1F` is an
//! integer there too. Anchors and aliases are expanded (within a budget, so a "billion laughs"
//! file cannot exhaust memory) and `<<` merge keys are applied.

use std::collections::{HashMap, HashSet};

use saphyr_parser::{Event, Marker, Parser, ScalarStyle, Span, Tag};

use super::diagnostics::Pos;

/// Nesting deeper than this is refused: the tree is dropped and walked recursively, and no
/// sensible policy file comes anywhere near it.
const MAX_NESTING: usize = 128;

/// How many nodes alias expansion may produce in one file.
const MAX_NODES: usize = 1 << 20;

/// The 1-based position of a parser marker.
fn position_of(marker: &Marker) -> Pos {
    Pos {
        line: marker.line().max(1),
        column: marker.col() + 1,
    }
}

/// `pos`, or the end of the text when the parser points past it (it reports an error at the end
/// of input on the line after the last one), so a message never names a line the file lacks.
/// Lines end as YAML ends them: at `\r\n`, `\r` or `\n`.
pub(super) fn within(text: &str, pos: Pos) -> Pos {
    let lines = yaml_lines(text);
    if pos.line <= lines.len() {
        return pos;
    }
    let last = lines.last().copied().unwrap_or("");
    Pos {
        line: lines.len().max(1),
        column: last.chars().count() + 1,
    }
}

/// The lines of `text` as YAML counts them (a text always has at least one, maybe empty).
fn yaml_lines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(['\r', '\n']) {
        lines.push(&rest[..at]);
        let width = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + width..];
    }
    lines.push(rest);
    lines
}

/// A YAML syntax or structure error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct YamlError {
    pub pos: Pos,
    pub message: String,
}

/// A node and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub pos: Pos,
    pub value: Value,
}

/// The three kinds of YAML node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Scalar(Scalar),
    Seq(Vec<Node>),
    /// Pairs in file order; keys are unique by text.
    Map(Vec<(Node, Node)>),
}

/// A scalar as written.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scalar {
    pub text: String,
    /// Plain (unquoted, not a block scalar): only these are typed by their text.
    pub plain: bool,
    pub tag: Option<CoreTag>,
}

/// The explicit tags a policy file may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CoreTag {
    Str,
    Int,
    Float,
    Bool,
    Null,
}

/// A scalar's typed value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Resolved<'a> {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(&'a str),
}

impl Node {
    /// What the node is, for messages ("a mapping", "the string `x`", ...).
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Map(_) => "a mapping".to_string(),
            Value::Seq(_) => "a list".to_string(),
            Value::Scalar(scalar) => match scalar.resolve() {
                Ok(Resolved::Null) => "nothing (null)".to_string(),
                Ok(Resolved::Bool(_)) => format!("the boolean `{}`", scalar.text),
                Ok(Resolved::Int(_)) => format!("the number `{}`", scalar.text),
                Ok(Resolved::Float(_)) => format!("the number `{}`", scalar.text),
                Ok(Resolved::Str(text)) | Err(text) => format!("the string `{}`", text),
            },
        }
    }

    /// The scalar, if this is one.
    pub fn scalar(&self) -> Option<&Scalar> {
        match &self.value {
            Value::Scalar(scalar) => Some(scalar),
            _ => None,
        }
    }

    /// Whether the node is a null scalar (`~`, `null`, or nothing at all).
    pub fn is_null(&self) -> bool {
        matches!(self.scalar().map(Scalar::resolve), Some(Ok(Resolved::Null)))
    }
}

impl Scalar {
    /// The typed value; `Err(text)` when an explicit tag does not fit the text (e.g. `!!int x`).
    pub fn resolve(&self) -> Result<Resolved<'_>, &str> {
        let text = self.text.as_str();
        match self.tag {
            Some(CoreTag::Str) => Ok(Resolved::Str(text)),
            Some(CoreTag::Null) => Ok(Resolved::Null),
            Some(CoreTag::Bool) => resolve_bool(text).map(Resolved::Bool).ok_or(text),
            Some(CoreTag::Int) => resolve_int(text).map(Resolved::Int).ok_or(text),
            Some(CoreTag::Float) => resolve_float(text)
                .or_else(|| resolve_int(text).map(|i| i as f64))
                .map(Resolved::Float)
                .ok_or(text),
            None if !self.plain => Ok(Resolved::Str(text)),
            None => Ok(resolve_plain(text)),
        }
    }
}

/// Types a plain scalar as YAML 1.1 does.
fn resolve_plain(text: &str) -> Resolved<'_> {
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Resolved::Null;
    }
    if let Some(b) = resolve_bool(text) {
        return Resolved::Bool(b);
    }
    if let Some(i) = resolve_int(text) {
        return Resolved::Int(i);
    }
    if let Some(f) = resolve_float(text) {
        return Resolved::Float(f);
    }
    Resolved::Str(text)
}

fn resolve_bool(text: &str) -> Option<bool> {
    match text {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            Some(true)
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            Some(false)
        }
        _ => None,
    }
}

/// Integers as the reference reads them: optional sign, `_` separators, and the prefixes `0x`,
/// `0o`, `0b`, or a leading `0` for octal.
fn resolve_int(text: &str) -> Option<i128> {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    let (negative, digits) = match cleaned.as_bytes().first()? {
        b'-' => (true, &cleaned[1..]),
        b'+' => (false, &cleaned[1..]),
        _ => (false, cleaned.as_str()),
    };
    let (radix, body) = if let Some(rest) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (16, rest)
    } else if let Some(rest) = digits
        .strip_prefix("0o")
        .or_else(|| digits.strip_prefix("0O"))
    {
        (8, rest)
    } else if let Some(rest) = digits
        .strip_prefix("0b")
        .or_else(|| digits.strip_prefix("0B"))
    {
        (2, rest)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (8, &digits[1..])
    } else {
        (10, digits)
    };
    if body.is_empty() || !body.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    let magnitude = i128::from_str_radix(body, radix).ok()?;
    // The reference's parser holds 64-bit integers; anything wider is not an integer there.
    if magnitude > i128::from(u64::MAX) {
        return None;
    }
    Some(if negative { -magnitude } else { magnitude })
}

fn resolve_float(text: &str) -> Option<f64> {
    match text {
        ".nan" | ".NaN" | ".NAN" => return Some(f64::NAN),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => return Some(f64::INFINITY),
        "-.inf" | "-.Inf" | "-.INF" => return Some(f64::NEG_INFINITY),
        _ => {}
    }
    // `[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?`
    let bytes = text.as_bytes();
    let mut i = 0;
    if matches!(bytes.first(), Some(b'-' | b'+')) {
        i += 1;
    }
    let int_start = i;
    while i < bytes.len() && bytes[i].is_ascii_digit() {
        i += 1;
    }
    let int_digits = i - int_start;
    let mut frac_digits = 0;
    if i < bytes.len() && bytes[i] == b'.' {
        i += 1;
        let frac_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        frac_digits = i - frac_start;
    }
    if int_digits == 0 && frac_digits == 0 {
        return None;
    }
    if i < bytes.len() && (bytes[i] == b'e' || bytes[i] == b'E') {
        i += 1;
        if matches!(bytes.get(i), Some(b'-' | b'+')) {
            i += 1;
        }
        let exp_start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == exp_start {
            return None;
        }
    }
    if i != bytes.len() {
        return None;
    }
    text.parse().ok()
}

/// A collection being built.
struct Frame {
    pos: Pos,
    anchor: usize,
    /// Nodes in the subtree so far, for the alias budget.
    size: usize,
    kind: FrameKind,
}

enum FrameKind {
    Seq(Vec<Node>),
    Map {
        pairs: Vec<(Node, Node)>,
        key: Option<Node>,
        /// The line of each key seen so far, to report duplicates.
        lines: HashMap<String, usize>,
    },
}

/// Builds the tree from parser events.
struct Builder {
    stack: Vec<Frame>,
    anchors: HashMap<usize, (Node, usize)>,
    nodes: usize,
    root: Option<Node>,
    documents: usize,
}

/// Parses one YAML document. `Ok(None)` for a file without any document (empty or comments only).
pub(crate) fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder {
        stack: Vec::new(),
        anchors: HashMap::new(),
        nodes: 0,
        root: None,
        documents: 0,
    };
    for event in Parser::new_from_str(text) {
        let (event, span) = event.map_err(|e| YamlError {
            pos: within(text, position_of(e.marker())),
            message: format!("invalid YAML: {}", e.info()),
        })?;
        builder.on_event(event, span)?;
    }
    Ok(builder.root)
}

impl Builder {
    fn on_event(&mut self, event: Event<'_>, span: Span) -> Result<(), YamlError> {
        let pos = position_of(&span.start);
        match event {
            Event::DocumentStart(_) => {
                self.documents += 1;
                if self.documents > 1 {
                    return Err(YamlError {
                        pos,
                        message: "a second YAML document (after `---`); a policy file holds one \
                                  document: put each domain in its own file"
                            .to_string(),
                    });
                }
            }
            Event::Scalar(text, style, anchor, tag) => {
                let tag = core_tag(tag.as_deref(), pos)?;
                self.spend(1, pos)?;
                let node = Node {
                    pos,
                    value: Value::Scalar(Scalar {
                        text: text.into_owned(),
                        plain: style == ScalarStyle::Plain,
                        tag,
                    }),
                };
                self.finish_node(node, 1, anchor)?;
            }
            Event::Alias(id) => {
                let Some((node, size)) = self.anchors.get(&id) else {
                    return Err(YamlError {
                        pos,
                        message: "alias to an unknown anchor".to_string(),
                    });
                };
                let size = *size;
                let mut node = node.clone();
                node.pos = pos;
                self.spend(size, pos)?;
                self.finish_node(node, size, 0)?;
            }
            Event::SequenceStart(anchor, tag) => {
                collection_tag(tag.as_deref(), "seq", pos)?;
                self.open(pos, anchor, FrameKind::Seq(Vec::new()))?;
            }
            Event::MappingStart(anchor, tag) => {
                collection_tag(tag.as_deref(), "map", pos)?;
                self.open(
                    pos,
                    anchor,
                    FrameKind::Map {
                        pairs: Vec::new(),
                        key: None,
                        lines: HashMap::new(),
                    },
                )?;
            }
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some(frame) = self.stack.pop() {
                    let value = match frame.kind {
                        FrameKind::Seq(items) => Value::Seq(items),
                        FrameKind::Map { pairs, .. } => Value::Map(merge_keys(pairs)?),
                    };
                    let node = Node {
                        pos: frame.pos,
                        value,
                    };
                    self.finish_node(node, frame.size, frame.anchor)?;
                }
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
        Ok(())
    }

    fn open(&mut self, pos: Pos, anchor: usize, kind: FrameKind) -> Result<(), YamlError> {
        if self.stack.len() >= MAX_NESTING {
            return Err(YamlError {
                pos,
                message: format!("nesting deeper than {MAX_NESTING} levels"),
            });
        }
        self.spend(1, pos)?;
        self.stack.push(Frame {
            pos,
            anchor,
            size: 1,
            kind,
        });
        Ok(())
    }

    /// Counts `count` new nodes against the alias-expansion budget.
    fn spend(&mut self, count: usize, pos: Pos) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(count);
        if self.nodes > MAX_NODES {
            return Err(YamlError {
                pos,
                message: format!(
                    "the document expands to more than {MAX_NODES} nodes (aliases of aliases?)"
                ),
            });
        }
        Ok(())
    }

    /// Hands a complete node (`size` nodes in all) to its parent, or makes it the root.
    fn finish_node(&mut self, node: Node, size: usize, anchor: usize) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        let Some(frame) = self.stack.last_mut() else {
            self.root = Some(node);
            return Ok(());
        };
        frame.size = frame.size.saturating_add(size);
        match &mut frame.kind {
            FrameKind::Seq(items) => items.push(node),
            FrameKind::Map { pairs, key, lines } => match key.take() {
                None => *key = Some(node),
                Some(k) => {
                    if let Some(text) = key_text(&k)
                        && !is_merge_key(&k)
                        && let Some(first_line) = lines.insert(text.to_string(), k.pos.line)
                    {
                        return Err(YamlError {
                            pos: k.pos,
                            message: format!(
                                "duplicate key `{text}` (first at line {first_line}); keep only one"
                            ),
                        });
                    }
                    pairs.push((k, node));
                }
            },
        }
        Ok(())
    }
}

fn key_text(node: &Node) -> Option<&str> {
    node.scalar().map(|s| s.text.as_str())
}

fn is_merge_key(node: &Node) -> bool {
    node.scalar()
        .is_some_and(|s| s.plain && s.tag.is_none() && s.text == "<<")
}

/// Applies `<<` merge keys: the merged mappings' pairs are added unless the mapping sets the key
/// itself (an earlier merged mapping wins over a later one).
fn merge_keys(pairs: Vec<(Node, Node)>) -> Result<Vec<(Node, Node)>, YamlError> {
    if !pairs.iter().any(|(k, _)| is_merge_key(k)) {
        return Ok(pairs);
    }
    let mut own = Vec::with_capacity(pairs.len());
    let mut sources = Vec::new();
    for (key, value) in pairs {
        if is_merge_key(&key) {
            match value.value {
                Value::Map(merged) => sources.push(merged),
                Value::Seq(items) => {
                    for item in items {
                        match item.value {
                            Value::Map(merged) => sources.push(merged),
                            _ => return Err(merge_error(item.pos)),
                        }
                    }
                }
                Value::Scalar(_) => return Err(merge_error(value.pos)),
            }
        } else {
            own.push((key, value));
        }
    }
    let mut present: HashSet<String> = own
        .iter()
        .filter_map(|(k, _)| key_text(k).map(str::to_string))
        .collect();
    for source in sources {
        for (key, value) in source {
            let fresh = match key_text(&key) {
                Some(text) => present.insert(text.to_string()),
                None => true,
            };
            if fresh {
                own.push((key, value));
            }
        }
    }
    Ok(own)
}

fn merge_error(pos: Pos) -> YamlError {
    YamlError {
        pos,
        message: "`<<` merges a mapping or a list of mappings (write `<<: *anchor`)".to_string(),
    }
}

fn core_tag(tag: Option<&Tag>, pos: Pos) -> Result<Option<CoreTag>, YamlError> {
    let Some(tag) = tag else { return Ok(None) };
    if tag.is_yaml_core_schema() {
        let core = match tag.suffix.as_str() {
            "str" => Some(CoreTag::Str),
            "int" => Some(CoreTag::Int),
            "float" => Some(CoreTag::Float),
            "bool" => Some(CoreTag::Bool),
            "null" => Some(CoreTag::Null),
            _ => None,
        };
        if core.is_some() {
            return Ok(core);
        }
    }
    Err(unsupported_tag(tag, pos))
}

fn collection_tag(tag: Option<&Tag>, expected: &str, pos: Pos) -> Result<(), YamlError> {
    match tag {
        None => Ok(()),
        Some(tag) if tag.is_yaml_core_schema() && tag.suffix == expected => Ok(()),
        Some(tag) => Err(unsupported_tag(tag, pos)),
    }
}

fn unsupported_tag(tag: &Tag, pos: Pos) -> YamlError {
    let shown = if tag.is_yaml_core_schema() {
        format!("!!{}", tag.suffix)
    } else {
        tag.to_string()
    };
    YamlError {
        pos,
        message: format!("unsupported tag `{shown}`; remove it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_at_the_end_of_input_points_at_the_last_line() {
        let error = parse("domain: \"\"\ndescriptrequests_p").unwrap_err();
        assert_eq!((error.pos.line, error.pos.column), (2, 19), "{error:?}");
        assert_eq!(yaml_lines("a\r\nb\rc\n"), ["a", "b", "c", ""]);
        assert_eq!(yaml_lines(""), [""]);
        // A file whose lines end in a lone CR keeps the lines YAML counts.
        let error = parse("domain: d\rdescriptors: []\rdomain: e\r").unwrap_err();
        assert_eq!(error.pos.line, 3, "{error:?}");
    }

    fn root(text: &str) -> Node {
        parse(text).unwrap().unwrap()
    }

    fn map(node: &Node) -> &[(Node, Node)] {
        match &node.value {
            Value::Map(pairs) => pairs,
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn positions_are_one_based() {
        let node = root("domain: edge\ndescriptors:\n  - key: user\n");
        let pairs = map(&node);
        assert_eq!(pairs[0].0.pos, Pos { line: 1, column: 1 });
        assert_eq!(pairs[0].1.pos, Pos { line: 1, column: 9 });
        let Value::Seq(items) = &pairs[1].1.value else {
            panic!("not a list")
        };
        let item = map(&items[0]);
        assert_eq!(item[0].0.pos, Pos { line: 3, column: 5 });
        assert_eq!(
            item[0].1.pos,
            Pos {
                line: 3,
                column: 10
            }
        );
    }

    #[test]
    fn plain_scalars_resolve_like_yaml_1_1() {
        let cases = [
            ("~", Resolved::Null),
            ("", Resolved::Null),
            ("yes", Resolved::Bool(true)),
            ("Off", Resolved::Bool(false)),
            ("42", Resolved::Int(42)),
            ("-0x1F", Resolved::Int(-31)),
            ("0o17", Resolved::Int(15)),
            ("017", Resolved::Int(15)),
            ("0b101", Resolved::Int(5)),
            ("1_000", Resolved::Int(1000)),
            ("0.25", Resolved::Float(0.25)),
            ("1e3", Resolved::Float(1000.0)),
            ("1.2.3", Resolved::Str("1.2.3")),
            ("08", Resolved::Float(8.0)),
            ("0x", Resolved::Str("0x")),
            ("alice", Resolved::Str("alice")),
        ];
        for (text, expected) in cases {
            assert_eq!(resolve_plain(text), expected, "{text:?}");
        }
        let quoted = Scalar {
            text: "42".into(),
            plain: false,
            tag: None,
        };
        assert_eq!(quoted.resolve(), Ok(Resolved::Str("42")));
        let tagged = Scalar {
            text: "yes".into(),
            plain: true,
            tag: Some(CoreTag::Str),
        };
        assert_eq!(tagged.resolve(), Ok(Resolved::Str("yes")));
    }

    #[test]
    fn aliases_and_merge_keys_expand() {
        let node = root(
            "base: &b {unit: minute, requests_per_unit: 5}\n\
             copy: *b\n\
             merged:\n  <<: *b\n  requests_per_unit: 7\n",
        );
        let pairs = map(&node);
        assert_eq!(map(&pairs[1].1), map(&pairs[0].1));
        assert_eq!(pairs[1].1.pos, Pos { line: 2, column: 7 });
        let merged = map(&pairs[2].1);
        let texts: Vec<_> = merged
            .iter()
            .map(|(k, v)| (key_text(k).unwrap(), key_text(v).unwrap()))
            .collect();
        assert_eq!(texts, [("requests_per_unit", "7"), ("unit", "minute")]);
    }

    #[test]
    fn structural_errors_point_at_the_node() {
        let err = parse("a: 1\nb: 2\na: 3\n").unwrap_err();
        assert_eq!(err.pos, Pos { line: 3, column: 1 });
        assert!(err.message.contains("duplicate key `a`"), "{}", err.message);

        let err = parse("a: 1\n---\nb: 2\n").unwrap_err();
        assert_eq!(err.pos.line, 2);

        let err = parse("a: !custom 1\n").unwrap_err();
        assert!(
            err.message.contains("unsupported tag `!custom`"),
            "{}",
            err.message
        );

        let err = parse("a: [1, 2\n").unwrap_err();
        assert!(err.message.starts_with("invalid YAML"), "{}", err.message);

        let deep = "[".repeat(100_000);
        assert!(parse(&deep).is_err());
    }

    #[test]
    fn alias_bombs_are_refused() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        let err = parse(&text).unwrap_err();
        assert!(
            err.message.contains("expands to more than"),
            "{}",
            err.message
        );
    }

    #[test]
    fn empty_input_has_no_document() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# just a comment\n").unwrap(), None);
    }
}
