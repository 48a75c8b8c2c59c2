//! What `cargo xtask arch` draws, read from the tree: the top-level modules `src/lib.rs`
//! declares, the dependencies between them that the `crate::` and `super::` paths of their code
//! make, and the helpers `src/main.rs` dispatches before any runtime starts, with the module
//! each runs and the modules that spawn it. A reader of text, not a parser: comments, string
//! literals and `#[cfg(test)]` items are blanked first, so what is read is code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The tree as the drawing needs it.
pub struct Tree {
    /// The top-level modules, in lib.rs's order.
    pub modules: Vec<String>,
    /// Each module's dependencies: `uses[a]` holds `b` when a's code names `crate::b`.
    pub uses: BTreeMap<String, BTreeSet<String>>,
    /// The helpers, in main.rs's order.
    pub helpers: Vec<Helper>,
}

/// A helper subcommand the daemon runs from its own binary (`crius monitor DIR`).
pub struct Helper {
    /// The subcommand, as main.rs matches it.
    pub name: String,
    /// The module whose `main` it runs, `runtime::monitor`.
    pub runs: String,
    /// The top-level modules whose code starts it (an `.arg("NAME")` on a command).
    pub spawned_by: Vec<String>,
}

/// Reads the tree under the repository's `root`.
pub fn read(root: &Path) -> Result<Tree> {
    let src = root.join("src");
    let lib = read_text(&src.join("lib.rs"))?;
    let modules = declared_modules(&lib);
    if modules.is_empty() {
        bail!("src/lib.rs declares no modules (read as `pub mod NAME;` lines)");
    }
    let mut uses = BTreeMap::new();
    let mut spawns: Vec<(String, String)> = Vec::new();
    for m in &modules {
        let mut deps = BTreeSet::new();
        for file in files_of(&src, m)? {
            let code = Code::of(&read_text(&file)?);
            let here = module_path(&src, &file);
            for path in code.paths() {
                if let Some(top) = resolve(&path, &here)
                    && top != *m
                    && modules.contains(&top)
                {
                    deps.insert(top);
                }
            }
            spawns.extend(code.arg_literals().into_iter().map(|a| (a, m.clone())));
        }
        uses.insert(m.clone(), deps);
    }
    let main = Code::of(&read_text(&src.join("main.rs"))?);
    let mut helpers = main.helper_dispatch();
    if helpers.is_empty() {
        bail!(
            "found no helpers in src/main.rs (read as `Some(\"NAME\") => Some(crius::PATH::main(..))`)"
        );
    }
    for h in &mut helpers {
        let mut by: Vec<String> = spawns
            .iter()
            .filter(|(arg, _)| *arg == h.name)
            .map(|(_, m)| m.clone())
            .collect();
        by.dedup();
        h.spawned_by = by;
    }
    Ok(Tree {
        modules,
        uses,
        helpers,
    })
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The modules a crate root declares, `pub mod NAME;`, less those under `#[cfg(test)]`.
fn declared_modules(lib: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut test_only = false;
    for line in lib.lines().map(str::trim) {
        if line == "#[cfg(test)]" {
            test_only = true;
            continue;
        }
        let item = line
            .strip_prefix("pub(crate) ")
            .or_else(|| line.strip_prefix("pub "))
            .unwrap_or(line);
        if let Some(name) = item.strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
            if !test_only {
                out.push(name.trim().to_string());
            }
            test_only = false;
        } else if !line.starts_with("#[") {
            test_only = false;
        }
    }
    out
}

/// The files of a top-level module: `src/NAME.rs` and everything under `src/NAME/`, sorted.
fn files_of(src: &Path, module: &str) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let file = src.join(format!("{module}.rs"));
    if file.is_file() {
        out.push(file);
    }
    let mut dirs = vec![src.join(module)];
    while let Some(dir) = dirs.pop() {
        if !dir.is_dir() {
            continue;
        }
        for entry in
            std::fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))?
        {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                out.push(path);
            }
        }
    }
    if out.is_empty() {
        bail!("module `{module}` of src/lib.rs has no file under src/");
    }
    out.sort();
    Ok(out)
}

/// A file's module path from the crate root: `src/image/pull.rs` is `image::pull`, a `mod.rs`
/// its directory's module.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut path: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if path.last().is_some_and(|l| l == "mod") {
        path.pop();
    }
    path
}

/// The top-level module a path names from the file at `here`, if it names one of this crate's:
/// `crate::image::Store` is `image`; `super::x` from a top-level module's own file is `x`.
fn resolve(path: &[String], here: &[String]) -> Option<String> {
    match path.first()?.as_str() {
        "crate" => path.get(1).cloned(),
        "super" => {
            let ups = path.iter().take_while(|s| *s == "super").count();
            let base = &here[..here.len().saturating_sub(ups)];
            match base.first() {
                Some(top) => Some(top.clone()),
                None => path.get(ups).cloned(),
            }
        }
        "self" => here.first().cloned(),
        _ => None,
    }
}

/// A source file's code twice over, at the same byte offsets: comments and `#[cfg(test)]` items
/// blanked in both, string literals blanked in `bare` and kept in `with_strings`.
struct Code {
    bare: String,
    with_strings: String,
}

/// How far a literal or comment starting at `i` of `c` reaches (exclusive), and whether it is
/// a string literal; `None` where none starts.
fn token_end(c: &[char], i: usize) -> Option<(usize, bool)> {
    let at = |k: usize| c.get(i + k).copied().unwrap_or('\0');
    let ident_before = i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_');
    if at(0) == '/' && at(1) == '/' {
        let end = (i..c.len()).find(|&j| c[j] == '\n').unwrap_or(c.len());
        return Some((end, false));
    }
    if at(0) == '/' && at(1) == '*' {
        // Block comments nest.
        let (mut depth, mut j) = (0usize, i);
        while j < c.len() {
            if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                depth += 1;
                j += 2;
            } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                depth -= 1;
                j += 2;
                if depth == 0 {
                    break;
                }
            } else {
                j += 1;
            }
        }
        return Some((j.min(c.len()), false));
    }
    if at(0) == 'r' && (at(1) == '"' || at(1) == '#') && !ident_before {
        let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
        let open = i + 1 + hashes;
        if c.get(open) != Some(&'"') {
            return None;
        }
        let closes = |j: usize| c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#'));
        let end = (open + 1..c.len())
            .find(|&j| closes(j))
            .map_or(c.len(), |j| j + 1 + hashes);
        return Some((end, true));
    }
    if at(0) == '"' {
        let mut j = i + 1;
        while j < c.len() && c[j] != '"' {
            j += if c[j] == '\\' { 2 } else { 1 };
        }
        return Some(((j + 1).min(c.len()), true));
    }
    // A character literal, not a lifetime: `'x'` or an escape `'\n'`.
    if at(0) == '\'' && at(1) == '\\' {
        let end = (i + 3..c.len())
            .find(|&j| c[j] == '\'')
            .map_or(c.len(), |j| j + 1);
        return Some((end, true));
    }
    if at(0) == '\'' && at(2) == '\'' {
        return Some((i + 3, true));
    }
    None
}

/// Spaces for every byte of `s`, its line breaks kept.
fn blank(s: &str, out: &mut String) {
    for ch in s.chars() {
        if ch == '\n' {
            out.push('\n');
        } else {
            out.extend(std::iter::repeat_n(' ', ch.len_utf8()));
        }
    }
}

/// Where the item an attribute ending at `from` is on ends: its `;` or its closing brace.
fn item_end(code: &str, from: usize) -> usize {
    let mut depth = 0usize;
    for (i, b) in code.bytes().enumerate().skip(from) {
        match b {
            b';' if depth == 0 => return i + 1,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl Code {
    fn of(text: &str) -> Code {
        let c: Vec<char> = text.chars().collect();
        let (mut bare, mut with_strings) = (String::new(), String::new());
        let mut i = 0;
        while i < c.len() {
            match token_end(&c, i) {
                Some((end, string)) => {
                    let token: String = c[i..end].iter().collect();
                    blank(&token, &mut bare);
                    if string {
                        with_strings.push_str(&token);
                    } else {
                        blank(&token, &mut with_strings);
                    }
                    i = end;
                }
                None => {
                    bare.push(c[i]);
                    with_strings.push(c[i]);
                    i += 1;
                }
            }
        }
        // Test code is not a dependency: blank each `#[cfg(test)]` item, whole.
        const TEST: &str = "#[cfg(test)]";
        let mut from = 0;
        while let Some(found) = bare[from..].find(TEST) {
            let at = from + found;
            let end = item_end(&bare, at + TEST.len());
            let mut spaces = String::new();
            blank(&bare[at..end], &mut spaces);
            bare.replace_range(at..end, &spaces);
            with_strings.replace_range(at..end, &spaces);
            from = end;
        }
        Code { bare, with_strings }
    }

    /// Every path the code names: each `use` tree's, expanded, and each written out in place
    /// from `crate::` or `super::`, as segments.
    fn paths(&self) -> Vec<Vec<String>> {
        let code = self.bare.as_str();
        let bytes = code.as_bytes();
        let mut out = Vec::new();
        for (at, _) in code.match_indices("use") {
            let word = (at == 0 || !is_ident(bytes[at - 1]))
                && bytes.get(at + 3).is_some_and(u8::is_ascii_whitespace);
            if !word {
                continue;
            }
            let tree = &code[at + 3..];
            let tree = &tree[..tree.find(';').unwrap_or(tree.len())];
            use_tree(&[], tree, &mut out);
        }
        for start in ["crate::", "super::"] {
            for (at, _) in code.match_indices(start) {
                // Not the middle of a longer path (`super::super::x` is read from its first).
                if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
                    continue;
                }
                let len = code[at..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'))
                    .unwrap_or(code.len() - at);
                let segments = code[at..at + len]
                    .split("::")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
                out.push(segments);
            }
        }
        out
    }

    /// The string literals passed to `.arg(..)`, each as written.
    fn arg_literals(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (at, call) in self.bare.match_indices(".arg(") {
            let rest = self.with_strings[at + call.len()..].trim_start();
            if let Some(literal) = rest.strip_prefix('"')
                && let Some(end) = literal.find('"')
            {
                out.push(literal[..end].to_string());
            }
        }
        out
    }

    /// The helpers of main.rs's dispatch: `Some("NAME") => Some(crius::PATH::main(..))`.
    fn helper_dispatch(&self) -> Vec<Helper> {
        let mut out = Vec::new();
        for (at, open) in self.with_strings.match_indices("Some(\"") {
            let rest = &self.with_strings[at + open.len()..];
            let Some(end) = rest.find('"') else { continue };
            let name = &rest[..end];
            let Some(call) = rest[end..]
                .strip_prefix("\")")
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix("=>"))
                .map(str::trim_start)
                .and_then(|r| r.strip_prefix("Some(crius::"))
            else {
                continue;
            };
            let path_len = call
                .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_' || ch == ':'))
                .unwrap_or(call.len());
            if let Some(runs) = call[..path_len].strip_suffix("::main") {
                out.push(Helper {
                    name: name.to_string(),
                    runs: runs.to_string(),
                    spawned_by: Vec::new(),
                });
            }
        }
        out
    }
}

/// Every path a `use` tree names under `prefix`, groups expanded (`self` in a group is the
/// prefix itself), each as segments.
fn use_tree(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    let mut path = prefix.to_vec();
    let Some(open) = tree.find('{') else {
        let name = tree.split(" as ").next().unwrap_or(tree).trim();
        path.extend(
            name.split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty() && *s != "self" && *s != "*")
                .map(str::to_string),
        );
        out.push(path);
        return;
    };
    path.extend(
        tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string),
    );
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0usize, 0);
    for (i, b) in inner.bytes().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b',' if depth == 0 => {
                use_tree(&path, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    use_tree(&path, &inner[start..], out);
}
