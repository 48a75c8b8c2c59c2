//! Checks that the docs a newcomer reads stay true to the tree (test-only, like `layout`):
//! every relative link in README.md, DEVELOPERS.md and `docs/*.md` leads to a file, and where it
//! has a `#anchor`, to a heading of that file; every key `crius config default` prints is named
//! in `docs/configuration.md`; every command of the `crius` binary (`cli::args`, through clap)
//! is named in `docs/operating.md`; README opens with `hack/run.sh` and `hack/test.sh`. Reads the
//! files and `config`'s default text only.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md, DEVELOPERS.md and every `docs/*.md`, as paths under the repository.
fn pages() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from("README.md"), PathBuf::from("DEVELOPERS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The lines of a Markdown text outside fenced code blocks, with their numbers (from 1).
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line with its inline code spans taken out (a `[x](y)` inside backticks is no link).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    for (i, part) in line.split('`').enumerate() {
        if i % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The anchor GitHub gives a heading: lower case, spaces to `-`, every other character but
/// letters, digits, `-` and `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .flat_map(char::to_lowercase)
        .collect()
}

/// Every anchor of a page's headings; a heading met again gets `-1`, `-2`, ... as on GitHub.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if hashes == 0 || hashes > 6 || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor(&line[hashes..]);
        let mut name = base.clone();
        let mut n = 0;
        while out.contains(&name) {
            n += 1;
            name = format!("{base}-{n}");
        }
        out.insert(name);
    }
    out
}

/// The targets of a line's inline links, `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

/// What is wrong with one page's relative links, one line per broken link.
fn broken_links(page: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (number, line) in prose(text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = match target.split_once('#') {
                Some((p, f)) => (p, Some(f)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.to_path_buf()
            } else {
                page.parent().unwrap_or(Path::new("")).join(path)
            };
            let at = format!("{}:{number}: ({target})", page.display());
            let full = root().join(&file);
            if !full.exists() {
                out.push(format!("{at}: no file {}", file.display()));
                continue;
            }
            if let Some(fragment) = fragment {
                let target_text = if path.is_empty() {
                    text.to_string()
                } else {
                    std::fs::read_to_string(&full).unwrap_or_default()
                };
                if !anchors(&target_text).contains(fragment) {
                    out.push(format!(
                        "{at}: no heading #{fragment} in {}",
                        file.display()
                    ));
                }
            }
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(root().join(&page)).unwrap();
        broken.extend(broken_links(&page, &text));
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_catches_what_it_should() {
    let page = Path::new("docs/operating.md");
    let text = "# Top\n\
                ## Two words: `here`\n\
                [ok](configuration.md) [ok](#two-words-here) [ok](../README.md)\n\
                [web](https://example.com/x) `[code](nowhere.md)`\n\
                ```\n[fenced](nowhere.md)\n```\n\
                [bad](nowhere.md) [bad](#missing) [bad](configuration.md#no-such-heading)\n";
    let broken = broken_links(page, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(broken[0].contains("no file docs/nowhere.md"), "{broken:#?}");
    assert!(broken[1].contains("no heading #missing"), "{broken:#?}");
    assert!(broken[2].contains("#no-such-heading"), "{broken:#?}");
    assert_eq!(
        anchor("Pods without a control plane: `crius agent`"),
        "pods-without-a-control-plane-crius-agent"
    );
    let twice = anchors("## A\n## A\n");
    assert!(twice.contains("a") && twice.contains("a-1"), "{twice:?}");
}

/// Every key of the default configuration as `table.key` (plain keys of the top level as they
/// are), from the `# key = value` lines of what `crius config default` prints.
fn default_keys() -> Vec<String> {
    let mut table = String::new();
    let mut keys = Vec::new();
    for line in crate::config::DEFAULT_TEXT.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            table = name.to_string();
            continue;
        }
        let Some((key, _)) = line.strip_prefix("# ").and_then(|l| l.split_once(" = ")) else {
            continue;
        };
        if key.contains(' ') {
            continue;
        }
        keys.push(if table.is_empty() {
            key.to_string()
        } else {
            format!("{table}.{key}")
        });
    }
    keys
}

#[test]
fn every_configuration_key_is_documented() {
    let keys = default_keys();
    // The config module's own test counts them; fewer here means this parse went wrong.
    assert!(keys.len() >= 38, "{keys:?}");
    let doc = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !doc.contains(&format!("`{k}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "keys `crius config default` prints that docs/configuration.md does not name (as `table.key`): {missing:?}"
    );
}

/// Every command of the binary as typed, `crius pull`, `crius config default`, hidden ones too.
fn commands() -> Vec<String> {
    use clap::CommandFactory;
    fn walk(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in cmd.get_subcommands() {
            let name = format!("{prefix} {}", sub.get_name());
            if sub.has_subcommands() {
                walk(sub, &name, out);
            } else {
                out.push(name);
            }
        }
    }
    let mut out = Vec::new();
    walk(&crate::cli::args::Args::command(), "crius", &mut out);
    out
}

/// Whether `text` holds `words` not followed by more of a command's name (`crius rm` is not
/// found in `crius rmi`).
fn names(text: &str, words: &str) -> bool {
    text.match_indices(words).any(|(at, _)| {
        !text[at + words.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

#[test]
fn every_command_is_in_the_operating_guide() {
    use clap::CommandFactory;
    crate::cli::args::Args::command().debug_assert();
    let all = commands();
    assert!(all.iter().any(|c| c == "crius config default"), "{all:?}");
    assert!(all.iter().any(|c| c == "crius port-forward"), "{all:?}");
    assert!(!names("crius rmi IMAGE", "crius rm"));
    let doc = std::fs::read_to_string(root().join("docs/operating.md")).unwrap();
    let missing: Vec<&String> = all.iter().filter(|c| !names(&doc, c)).collect();
    assert!(
        missing.is_empty(),
        "commands of `crius` that docs/operating.md does not name: {missing:?}"
    );
}

/// CI runs README's test command, and a newcomer types README's first two commands: they stay
/// `hack/run.sh` then `hack/test.sh`, each on a line of its own, before anything else is run.
#[test]
fn readme_starts_with_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let commands: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("    ") && !l.trim().is_empty())
        .map(str::trim)
        .take(2)
        .collect();
    assert_eq!(
        commands,
        ["hack/run.sh", "hack/test.sh"],
        "README's first commands"
    );
}
