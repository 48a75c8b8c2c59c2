//! Checks of the source tree's layout that the compiler does not make: CRI's generated types
//! stay at the edge (`cri`, and the CRI clients `cli` and `frontend`), everything below works
//! with crius's own types; `cri` reaches containers and sandboxes only through `pod`; no files
//! import each other in a circle; `lib.rs`'s map of the modules names every one; no function
//! outside tests is longer than 150 lines (tables excepted, by name); no `Result<_, String>`
//! outside tests: errors are types that keep their causes.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn cri_types_stay_at_the_edge() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edge = ["cri", "cli", "frontend", "main.rs", "layout.rs"];
    let mut found = Vec::new();
    for f in sources(&src) {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        if edge.contains(&top.as_ref()) {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        if text.contains("cri::v1") {
            found.push(rel.display().to_string());
        }
    }
    assert!(
        found.is_empty(),
        "CRI's generated types used below cri/ (convert them at the edge): {found:?}"
    );
}

#[test]
fn every_runtime_call_goes_through_the_pod_orchestrator() {
    let cri = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/cri");
    let around: Vec<String> = sources(&cri)
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains("ContainerService") || text.contains("SandboxService")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        around.is_empty(),
        "cri/ holds the container or sandbox service instead of going through `pod`: {around:?}"
    );
}

/// The module path of a source file (`src/image/pull.rs` is `image::pull`; `mod.rs` is its
/// directory's module).
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file holding the deepest module of `path` (crate-absolute segments).
fn file_of(src: &Path, path: &[String]) -> Option<PathBuf> {
    let mut dir = src.to_path_buf();
    let mut found = Some(src.join("lib.rs"));
    for seg in path {
        let file = dir.join(format!("{seg}.rs"));
        let module = dir.join(seg).join("mod.rs");
        if file.is_file() {
            found = Some(file);
            dir = dir.join(seg);
        } else if module.is_file() {
            found = Some(module);
            dir = dir.join(seg);
        } else {
            break;
        }
    }
    found
}

/// Every path a `use` tree names, `{a, b::c}` expanded (`self` in a group is the prefix).
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let base = [prefix, head]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join("::");
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&base, &inner[start..i], out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&base, &inner[start..], out);
    } else if !tree.is_empty() {
        let tree = tree.split(" as ").next().unwrap_or(tree).trim();
        if tree == "self" {
            out.push(prefix.to_string());
        } else if prefix.is_empty() {
            out.push(tree.to_string());
        } else {
            out.push(format!("{prefix}::{tree}"));
        }
    }
}

/// The paths a file's own code (its test module, comments and strings left out) names: each
/// `use` statement's, and every path written out in place (`super::signature::check(..)`).
fn uses(text: &str) -> Vec<String> {
    let code = bare_code(text);
    let mut out = inline_paths(&code);
    let code = code.as_str();
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let at_line_start = rest[..i]
            .rsplit('\n')
            .next()
            .is_some_and(|l| l.trim().is_empty() || l.trim() == "pub" || l.trim() == "pub(crate)");
        let after = &rest[i + 4..];
        let end = after.find(';').unwrap_or(after.len());
        if at_line_start {
            expand("", &after[..end], &mut out);
        }
        rest = &after[end.min(after.len())..];
    }
    out
}

/// Paths written out in code: `crate::`, `super::` or `self::` followed by segments.
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            from = at + start.len();
            // A whole word: not the tail of another identifier or path.
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(code[at..end].trim_end_matches(':').to_string());
        }
    }
    out
}

/// File-level import edges of `src/`: a file to each other file whose module a `use` of it
/// names. A module's own file re-exporting what its submodules hold is its face, not a
/// dependency, so edges from a `mod.rs` into its own directory are left out.
fn import_edges(src: &Path) -> Vec<(PathBuf, PathBuf)> {
    let mut edges = Vec::new();
    for f in sources(src) {
        let here = module_of(src, &f);
        let text = std::fs::read_to_string(&f).unwrap();
        let is_mod = f
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs");
        for u in uses(&text) {
            let segs: Vec<&str> = u.split("::").collect();
            let mut path: Vec<String> = match segs.first() {
                Some(&"crate") => Vec::new(),
                Some(&"super") => here[..here.len().saturating_sub(1)].to_vec(),
                Some(&"self") => here.clone(),
                _ => continue,
            };
            let mut it = segs.iter().skip(1).peekable();
            while it.peek() == Some(&&"super") {
                it.next();
                path.pop();
            }
            path.extend(it.filter(|s| **s != "*").map(|s| s.to_string()));
            let Some(target) = file_of(src, &path) else {
                continue;
            };
            if target == f {
                continue;
            }
            if is_mod && target.starts_with(f.parent().unwrap()) {
                continue;
            }
            edges.push((f.clone(), target));
        }
    }
    edges.sort();
    edges.dedup();
    edges
}

/// A circle in the graph, if there is one.
fn circle(edges: &[(PathBuf, PathBuf)]) -> Option<Vec<PathBuf>> {
    use std::collections::HashMap;
    let mut next: HashMap<&PathBuf, Vec<&PathBuf>> = HashMap::new();
    for (a, b) in edges {
        next.entry(a).or_default().push(b);
    }
    // 0 unseen, 1 on the current walk, 2 done.
    let mut state: HashMap<&PathBuf, u8> = HashMap::new();
    fn walk<'a>(
        n: &'a PathBuf,
        next: &HashMap<&'a PathBuf, Vec<&'a PathBuf>>,
        state: &mut HashMap<&'a PathBuf, u8>,
        stack: &mut Vec<&'a PathBuf>,
    ) -> Option<Vec<PathBuf>> {
        state.insert(n, 1);
        stack.push(n);
        for m in next.get(n).into_iter().flatten() {
            match state.get(m).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|x| x == m).unwrap_or(0);
                    return Some(stack[from..].iter().map(|p| (*p).clone()).collect());
                }
                0 => {
                    if let Some(c) = walk(m, next, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n, 2);
        None
    }
    let nodes: Vec<&PathBuf> = next.keys().copied().collect();
    for n in nodes {
        if state.get(n).copied().unwrap_or(0) == 0
            && let Some(c) = walk(n, &next, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_file_imports_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = import_edges(&src);
    assert!(
        edges.len() > 100,
        "the graph was read: {} edges",
        edges.len()
    );
    if let Some(c) = circle(&edges) {
        let names: Vec<String> = c
            .iter()
            .map(|p| p.strip_prefix(&src).unwrap().display().to_string())
            .collect();
        panic!(
            "files importing each other in a circle: {}",
            names.join(" -> ")
        );
    }
}

#[test]
fn the_crate_map_names_every_module() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let doc: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n");
    let unnamed: Vec<&str> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or(l.trim().strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';'))
        .filter(|m| *m != "layout" && !doc.contains(&format!("`{m}`")))
        .collect();
    assert!(unnamed.is_empty(), "lib.rs's map leaves out {unnamed:?}");
}

/// A file's own code (its test module left out) with comments, strings and character literals
/// blanked to spaces, lines kept: braces and words left in it are code.
fn bare_code(text: &str) -> String {
    let code = text.split("#[cfg(test)]").next().unwrap_or(text);
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
        // Where the literal or comment starting here ends (exclusive), if one does.
        let end = if at(0) == '/' && at(1) == '/' {
            (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len())
        } else if at(0) == '/' && at(1) == '*' {
            (i + 2..c.len())
                .find(|&j| c[j - 1] == '*' && c[j] == '/' && j > i + 2)
                .map_or(c.len(), |j| j + 1)
        } else if at(0) == 'r'
            && (at(1) == '#' || at(1) == '"')
            && !is_ident(c.get(i.wrapping_sub(1)))
        {
            let hashes = (i + 1..c.len()).take_while(|&j| c[j] == '#').count();
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let open = i + 1 + hashes;
            if c.get(open) == Some(&'"') {
                let rest: String = c[open + 1..].iter().collect();
                rest.find(&close).map_or(c.len(), |k| {
                    open + 1 + rest[..k].chars().count() + close.chars().count()
                })
            } else {
                i + 1
            }
        } else if at(0) == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if at(0) == '\'' && at(1) == '\\' {
            (i + 2..c.len())
                .find(|&j| c[j] == '\'')
                .map_or(c.len(), |j| j + 1)
        } else if at(0) == '\'' && at(2) == '\'' {
            i + 3
        } else {
            i
        };
        if end > i {
            for &ch in &c[i..end.min(c.len())] {
                blank(&mut out, ch);
            }
            i = end;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn is_ident(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Each function of `code` (from `bare_code`) with its line and length in lines.
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(k) = words.iter().position(|w| *w == "fn") else {
            continue;
        };
        let qualifiers = [
            "pub",
            "pub(crate)",
            "pub(super)",
            "async",
            "const",
            "unsafe",
        ];
        if !words[..k].iter().all(|w| qualifiers.contains(w)) {
            continue;
        }
        let name = words
            .get(k + 1)
            .map(|w| w.split(['(', '<']).next().unwrap_or(w).to_string())
            .unwrap_or_default();
        // Its body: from the first `{` before a `;` to the brace that closes it.
        let mut depth = 0usize;
        let mut opened = false;
        'lines: for (m, l) in lines.iter().enumerate().skip(n) {
            for ch in l.chars() {
                match ch {
                    ';' if !opened => break 'lines,
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' if opened => {
                        depth -= 1;
                        if depth == 0 {
                            out.push((name.clone(), n + 1, m - n + 1));
                            break 'lines;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    out
}

/// The longest a function may be, in lines, outside tests.
const LONGEST_FUNCTION: usize = 150;

/// Functions that are tables, not steps: left whole on purpose.
const TABLES: [(&str, &str); 1] = [
    // The manifest fields the agent supports, ignores or leaves open, one list per object.
    ("frontend/manifest/schema.rs", "schema"),
];

#[test]
fn no_function_is_longer_than_a_screenful_of_steps() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut long = Vec::new();
    for f in sources(&src) {
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        let code = bare_code(&std::fs::read_to_string(&f).unwrap());
        for (name, line, len) in functions(&code) {
            if len > LONGEST_FUNCTION && !TABLES.contains(&(rel.as_str(), name.as_str())) {
                long.push(format!("{rel}:{line} {name} ({len} lines)"));
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines (split them into named steps): {long:#?}"
    );
}

#[test]
fn errors_are_types_not_strings() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    for f in sources(&src) {
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        let code = bare_code(&std::fs::read_to_string(&f).unwrap());
        for (n, line) in code.lines().enumerate() {
            let squeezed: String = line.split_whitespace().collect();
            if squeezed.contains(",String>") && string_error(&squeezed) {
                found.push(format!("{rel}:{}", n + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "Result<_, String> outside tests (give the error a type that keeps its cause): {found:?}"
    );
}

/// Whether a line (whitespace removed) has a `Result<..., String>`.
fn string_error(line: &str) -> bool {
    let mut rest = line;
    while let Some(i) = rest.find("Result<") {
        let after = &rest[i + "Result<".len()..];
        // The top-level arguments up to the matching `>`.
        let (mut depth, mut last_comma, mut end) = (0i32, None, None);
        for (k, ch) in after.char_indices() {
            match ch {
                '<' | '(' | '[' => depth += 1,
                ')' | ']' => depth -= 1,
                '>' if depth == 0 => {
                    end = Some(k);
                    break;
                }
                '>' => depth -= 1,
                ',' if depth == 0 => last_comma = Some(k),
                _ => {}
            }
        }
        if let (Some(c), Some(e)) = (last_comma, end)
            && &after[c + 1..e] == "String"
        {
            return true;
        }
        rest = after;
    }
    false
}

#[test]
fn the_layout_checks_read_code_as_code() {
    let text = "fn a() {\n    let s = \"}\";\n    let c = '}';\n    // }\n    let r = r#\"}\"#;\n}\n\
                fn b<'x>(v: &'x str) -> Result<(), String> { Ok(()) }\n";
    let code = bare_code(text);
    let fns = functions(&code);
    assert_eq!(fns[0], ("a".to_string(), 1, 6));
    assert_eq!(fns[1].0, "b");
    assert!(string_error("fnb()->Result<(),String>{"));
    assert!(string_error("Result<Vec<(u8,u8)>,String>"));
    assert!(!string_error("Result<(String,u8),Error>"));
    assert!(!string_error("HashMap<String,String>"));
}
