//! YAML manifests as JSON values plus the line of every field, so that a bad field can be named
//! with its file and line. Built on the parser's event stream (YAML 1.2 core schema for plain
//! scalars); anchors and aliases are resolved, one value per document.

use std::collections::HashMap;

use serde_json::{Map, Number, Value};
use serde_saphyr::granit_parser::{Event, Parser, ScalarStyle};

/// One YAML document.
#[derive(Debug, Clone)]
pub struct Doc {
    pub value: Value,
    /// Field path (`spec.containers[0].image`) to its 1-based line.
    pub lines: HashMap<String, usize>,
    /// The line the document starts on.
    pub line: usize,
}

impl Doc {
    /// The line of a field, or of the nearest enclosing field that has one.
    pub fn line_of(&self, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(l) = self.lines.get(p) {
                return *l;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return self.line,
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("line {line} column {column}: {message}")]
pub struct YamlError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

enum Frame {
    Map {
        map: Map<String, Value>,
        key: Option<String>,
        path: String,
        anchor: usize,
    },
    Seq {
        items: Vec<Value>,
        path: String,
        anchor: usize,
    },
}

/// The dotted path of `key` in the mapping at `path` (the key alone at the root).
fn key_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn plain_scalar(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Value::Null,
        "true" | "True" | "TRUE" => return Value::Bool(true),
        "false" | "False" | "FALSE" => return Value::Bool(false),
        _ => {}
    }
    let digits = s.strip_prefix(['-', '+']).unwrap_or(s);
    // A leading zero means octal, as in the YAML 1.1 that Kubernetes manifests are written in
    // (`defaultMode: 0400`).
    if digits.len() > 1
        && digits.starts_with('0')
        && digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
        && let Ok(i) = i64::from_str_radix(digits, 8)
    {
        return Value::Number(if s.starts_with('-') { -i } else { i }.into());
    }
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(i) = s.parse::<i64>() {
            return Value::Number(i.into());
        }
        if let Ok(u) = s.parse::<u64>() {
            return Value::Number(u.into());
        }
    }
    if let Some(hex) = s.strip_prefix("0x")
        && let Ok(i) = i64::from_str_radix(hex, 16)
    {
        return Value::Number(i.into());
    }
    if let Some(oct) = s.strip_prefix("0o")
        && let Ok(i) = i64::from_str_radix(oct, 8)
    {
        return Value::Number(i.into());
    }
    let floaty = s
        .bytes()
        .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'-' | b'+'))
        && s.bytes().any(|b| b.is_ascii_digit());
    if floaty
        && let Ok(f) = s.parse::<f64>()
        && let Some(n) = Number::from_f64(f)
    {
        return Value::Number(n);
    }
    Value::String(s.to_string())
}

/// Where an event starts: its 1-based line and column.
#[derive(Clone, Copy)]
struct Mark {
    line: usize,
    column: usize,
}

impl Mark {
    /// An error at this place.
    fn error(self, message: impl Into<String>) -> YamlError {
        YamlError {
            line: self.line,
            column: self.column,
            message: message.into(),
        }
    }
}

/// The documents built from the event stream so far, and the one being built: its open
/// mappings and sequences, its anchors and the lines of its fields.
struct Builder {
    docs: Vec<Doc>,
    stack: Vec<Frame>,
    anchors: HashMap<usize, Value>,
    lines: HashMap<String, usize>,
    doc_line: usize,
    root: Option<Value>,
}

impl Builder {
    /// Nothing read yet: the first document starts on line 1.
    fn new() -> Builder {
        Builder {
            docs: Vec::new(),
            stack: Vec::new(),
            anchors: HashMap::new(),
            lines: HashMap::new(),
            doc_line: 1,
            root: None,
        }
    }

    /// The path of the node the next event starts (none for a mapping's key not yet read).
    fn child_path(&self) -> Option<String> {
        match self.stack.last() {
            None => Some(String::new()),
            Some(Frame::Map { key, path, .. }) => key.as_ref().map(|k| key_path(path, k)),
            Some(Frame::Seq { items, path, .. }) => Some(format!("{path}[{}]", items.len())),
        }
    }

    /// One event: the value it completes, if any, with its anchor (0 for none).
    fn event(&mut self, event: Event<'_>, at: Mark) -> Result<Option<(Value, usize)>, YamlError> {
        let line = at.line;
        Ok(match event {
            Event::DocumentStart(..) => {
                self.doc_line = line;
                self.lines.clear();
                self.anchors.clear();
                self.root = None;
                None
            }
            Event::DocumentEnd => {
                if let Some(v) = self.root.take() {
                    self.docs.push(Doc {
                        value: v,
                        lines: std::mem::take(&mut self.lines),
                        line: self.doc_line,
                    });
                }
                None
            }
            Event::MappingStart(_, anchor, _) => {
                let path = self.open(line);
                self.stack.push(Frame::Map {
                    map: Map::new(),
                    key: None,
                    path,
                    anchor,
                });
                None
            }
            Event::SequenceStart(_, anchor, _) => {
                let path = self.open(line);
                self.stack.push(Frame::Seq {
                    items: Vec::new(),
                    path,
                    anchor,
                });
                None
            }
            Event::MappingEnd => match self.stack.pop() {
                Some(Frame::Map { map, anchor, .. }) => Some((Value::Object(map), anchor)),
                _ => None,
            },
            Event::SequenceEnd => match self.stack.pop() {
                Some(Frame::Seq { items, anchor, .. }) => Some((Value::Array(items), anchor)),
                _ => None,
            },
            Event::Scalar(s, style, anchor, tag) => {
                let as_string = tag.as_ref().is_some_and(|t| t.suffix() == "str");
                self.scalar(&s, style == ScalarStyle::Plain && !as_string, anchor, line)
            }
            Event::Alias(id) => {
                let v = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| at.error("alias to an unknown anchor"))?;
                self.alias(v, line)
            }
            _ => None,
        })
    }

    /// A mapping or sequence starts: its path, its line recorded.
    fn open(&mut self, line: usize) -> String {
        let path = self.child_path().unwrap_or_default();
        if !path.is_empty() {
            self.lines.entry(path.clone()).or_insert(line);
        }
        path
    }

    /// Takes `k` as the key of the innermost mapping if it awaits one, recording its line.
    fn take_key(&mut self, k: impl FnOnce() -> String, line: usize) -> bool {
        if let Some(Frame::Map { key, path, .. }) = self.stack.last_mut()
            && key.is_none()
        {
            let k = k();
            self.lines.insert(key_path(path, &k), line);
            *key = Some(k);
            return true;
        }
        false
    }

    /// A scalar: a mapping's key, or a value (typed by the core schema if `plain`).
    fn scalar(
        &mut self,
        s: &str,
        plain: bool,
        anchor: usize,
        line: usize,
    ) -> Option<(Value, usize)> {
        if self.take_key(|| s.to_string(), line) {
            return None;
        }
        if let Some(p) = self.child_path()
            && !p.is_empty()
        {
            self.lines.entry(p).or_insert(line);
        }
        let v = if plain {
            plain_scalar(s)
        } else {
            Value::String(s.to_string())
        };
        Some((v, anchor))
    }

    /// An alias to `v`: a mapping's key (its text), or the value again.
    fn alias(&mut self, v: Value, line: usize) -> Option<(Value, usize)> {
        let as_key = || match &v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if self.take_key(as_key, line) {
            return None;
        }
        Some((v, 0))
    }

    /// A completed value goes into its mapping or sequence, or becomes the document's root.
    fn place(&mut self, v: Value, anchor: usize, at: Mark) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.insert(anchor, v.clone());
        }
        match self.stack.last_mut() {
            None => self.root = Some(v),
            Some(Frame::Map { map, key, .. }) => {
                let Some(k) = key.take() else {
                    // A complex key (a mapping or sequence used as a key).
                    return Err(at.error("mapping keys must be plain values"));
                };
                if map.contains_key(&k) {
                    return Err(at.error(format!("duplicate key {k:?}")));
                }
                map.insert(k, v);
            }
            Some(Frame::Seq { items, .. }) => items.push(v),
        }
        Ok(())
    }
}

/// Parses every document of a YAML stream.
pub fn parse(text: &str) -> Result<Vec<Doc>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::new();
    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| YamlError {
            line: e.marker().line(),
            column: e.marker().col() + 1,
            message: e.info().to_string(),
        })?;
        let at = Mark {
            line: span.start.line(),
            column: span.start.col() + 1,
        };
        if let Some((v, anchor)) = builder.event(event, at)? {
            builder.place(v, anchor, at)?;
        }
    }
    Ok(builder.docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_lines() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {app: web}\nspec:\n  containers:\n  - name: a\n    image: busybox\n    args: [\"1\", 2, true, ~]\n    ports:\n    - containerPort: 80\n---\nkind: Secret\ndata: &d\n  k: \"0123\"\ncopy: *d\n";
        let docs = parse(text).unwrap();
        assert_eq!(docs.len(), 2);
        let d = &docs[0];
        assert_eq!(d.value["metadata"]["name"], "web");
        assert_eq!(d.value["metadata"]["labels"]["app"], "web");
        assert_eq!(
            d.value["spec"]["containers"][0]["args"],
            serde_json::json!(["1", 2, true, null])
        );
        assert_eq!(
            d.value["spec"]["containers"][0]["ports"][0]["containerPort"],
            80
        );
        assert_eq!(d.lines["metadata.name"], 4);
        assert_eq!(d.lines["spec.containers[0].image"], 9);
        assert_eq!(d.line_of("spec.containers[0].ports[0].containerPort"), 12);
        assert_eq!(d.line_of("spec.containers[0].nothing"), 8);
        let s = &docs[1];
        assert_eq!(s.line, 13);
        assert_eq!(s.value["copy"]["k"], "0123");
        assert_eq!(s.lines["data.k"], 16);
    }

    #[test]
    fn errors_have_lines() {
        let e = parse("a: 1\nb: [1, 2\n").unwrap_err();
        assert!(e.line >= 2, "{e}");
        let e = parse("a: 1\na: 2\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.message.contains("duplicate"));
        assert_eq!(parse("").unwrap().len(), 0);
    }

    #[test]
    fn plain_scalars() {
        assert_eq!(plain_scalar("0x10"), serde_json::json!(16));
        assert_eq!(plain_scalar("1.5"), serde_json::json!(1.5));
        assert_eq!(plain_scalar("100Mi"), serde_json::json!("100Mi"));
        assert_eq!(plain_scalar("1e3"), serde_json::json!(1000.0));
        assert_eq!(plain_scalar("yes"), serde_json::json!("yes"));
        assert_eq!(plain_scalar("-1"), serde_json::json!(-1));
        assert_eq!(plain_scalar("0400"), serde_json::json!(256));
        assert_eq!(plain_scalar("0"), serde_json::json!(0));
        assert_eq!(plain_scalar("089"), serde_json::json!(89));
    }
}
