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

/// Parses every document of a YAML stream.
pub fn parse(text: &str) -> Result<Vec<Doc>, YamlError> {
    let mut parser = Parser::new_from_str(text);
    let mut docs = Vec::new();
    let mut stack: Vec<Frame> = Vec::new();
    let mut anchors: HashMap<usize, Value> = HashMap::new();
    let mut lines: HashMap<String, usize> = HashMap::new();
    let mut doc_line = 1;
    let mut root: Option<Value> = None;

    while let Some(next) = parser.next_event() {
        let (event, span) = next.map_err(|e| YamlError {
            line: e.marker().line(),
            column: e.marker().col() + 1,
            message: e.info().to_string(),
        })?;
        let line = span.start.line();
        // The path of the node this event starts, and record its line.
        let child_path = |stack: &mut Vec<Frame>| -> Option<String> {
            match stack.last_mut() {
                None => Some(String::new()),
                Some(Frame::Map { key, path, .. }) => key.as_ref().map(|k| key_path(path, k)),
                Some(Frame::Seq { items, path, .. }) => Some(format!("{path}[{}]", items.len())),
            }
        };
        let mut value: Option<(Value, usize)> = None;
        match event {
            Event::StreamStart | Event::StreamEnd => {}
            Event::DocumentStart(..) => {
                doc_line = line;
                lines.clear();
                anchors.clear();
                root = None;
            }
            Event::DocumentEnd => {
                if let Some(v) = root.take() {
                    docs.push(Doc {
                        value: v,
                        lines: std::mem::take(&mut lines),
                        line: doc_line,
                    });
                }
            }
            Event::MappingStart(_, anchor, _) => {
                let path = child_path(&mut stack).unwrap_or_default();
                if !path.is_empty() {
                    lines.entry(path.clone()).or_insert(line);
                }
                stack.push(Frame::Map {
                    map: Map::new(),
                    key: None,
                    path,
                    anchor,
                });
            }
            Event::SequenceStart(_, anchor, _) => {
                let path = child_path(&mut stack).unwrap_or_default();
                if !path.is_empty() {
                    lines.entry(path.clone()).or_insert(line);
                }
                stack.push(Frame::Seq {
                    items: Vec::new(),
                    path,
                    anchor,
                });
            }
            Event::MappingEnd => {
                if let Some(Frame::Map { map, anchor, .. }) = stack.pop() {
                    value = Some((Value::Object(map), anchor));
                }
            }
            Event::SequenceEnd => {
                if let Some(Frame::Seq { items, anchor, .. }) = stack.pop() {
                    value = Some((Value::Array(items), anchor));
                }
            }
            Event::Scalar(s, style, anchor, tag) => {
                // A mapping key: remember it and where it is.
                if let Some(Frame::Map { key, path, .. }) = stack.last_mut()
                    && key.is_none()
                {
                    let k = s.to_string();
                    lines.insert(key_path(path, &k), line);
                    *key = Some(k);
                    continue;
                }
                if let Some(p) = child_path(&mut stack)
                    && !p.is_empty()
                {
                    lines.entry(p).or_insert(line);
                }
                let as_string = tag.as_ref().is_some_and(|t| t.suffix() == "str");
                let v = if style == ScalarStyle::Plain && !as_string {
                    plain_scalar(&s)
                } else {
                    Value::String(s.to_string())
                };
                value = Some((v, anchor));
            }
            Event::Alias(id) => {
                let v = anchors.get(&id).cloned().ok_or_else(|| YamlError {
                    line,
                    column: span.start.col() + 1,
                    message: "alias to an unknown anchor".into(),
                })?;
                if let Some(Frame::Map { key, path, .. }) = stack.last_mut()
                    && key.is_none()
                {
                    let k = match &v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    lines.insert(key_path(path, &k), line);
                    *key = Some(k);
                    continue;
                }
                value = Some((v, 0));
            }
            _ => {}
        }
        let Some((v, anchor)) = value else {
            continue;
        };
        if anchor != 0 {
            anchors.insert(anchor, v.clone());
        }
        match stack.last_mut() {
            None => root = Some(v),
            Some(Frame::Map { map, key, .. }) => {
                if let Some(k) = key.take() {
                    if map.contains_key(&k) {
                        return Err(YamlError {
                            line,
                            column: span.start.col() + 1,
                            message: format!("duplicate key {k:?}"),
                        });
                    }
                    map.insert(k, v);
                } else {
                    // A complex key (a mapping or sequence used as a key).
                    return Err(YamlError {
                        line,
                        column: span.start.col() + 1,
                        message: "mapping keys must be plain values".into(),
                    });
                }
            }
            Some(Frame::Seq { items, .. }) => items.push(v),
        }
    }
    Ok(docs)
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
