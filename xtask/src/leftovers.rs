//! What tests may leave on the machine, taken before and after CI's tiers: mounts, crius
//! processes, cgroups, network namespaces, links, iptables rules, temp directories and the
//! directories the bench's CRI-O could make. Anything new afterwards fails the run, naming it.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

#[derive(Default)]
pub struct Inventory {
    kinds: Vec<(&'static str, BTreeSet<String>)>,
}

fn mounts() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// crius's own processes (daemon, monitors, pause) and anything run from a test's temp dir.
fn processes() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let first = cmd.split(' ').next().unwrap_or("");
        if first.ends_with("/crius") || first == "crius" || cmd.contains("/tmp/crius-") {
            out.insert(format!("{name} {}", cmd.trim()));
        }
    }
    out
}

/// Cgroup directories with crius in their name, three levels deep.
fn cgroups() -> BTreeSet<String> {
    fn walk(dir: &Path, depth: u32, out: &mut BTreeSet<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let p = e.path();
            if p.to_string_lossy().contains("crius") {
                out.insert(p.display().to_string());
            } else if depth < 3 {
                walk(&p, depth + 1, out);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(Path::new("/sys/fs/cgroup"), 0, &mut out);
    out
}

fn command_lines(cmd: &str, args: &[&str]) -> BTreeSet<String> {
    Command::new(cmd)
        .args(args)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn links() -> BTreeSet<String> {
    command_lines("ip", &["-o", "link", "show"])
        .into_iter()
        .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_string()))
        .map(|n| n.split('@').next().unwrap_or_default().to_string())
        .collect()
}

fn iptables_rules() -> BTreeSet<String> {
    let out = Command::new("iptables-save").output();
    rules(
        &out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default(),
    )
}

/// The rules and chains of an `iptables-save` dump, each named with its table. A built-in
/// chain still accepting by default is left out: iptables-nft makes a table with those on its
/// first use and nothing removes it, and such a table filters nothing (a changed policy or any
/// rule still counts).
fn rules(dump: &str) -> BTreeSet<String> {
    const BUILT_IN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    let mut table = "";
    let mut out = BTreeSet::new();
    for line in dump.lines() {
        if let Some(t) = line.strip_prefix('*') {
            table = t;
            continue;
        }
        if !(line.starts_with("-A") || line.starts_with(':')) {
            continue;
        }
        // Counters change; the rule does not.
        let rule = line.split(" [").next().unwrap_or_default();
        let default_chain = rule
            .strip_prefix(':')
            .and_then(|c| c.strip_suffix(" ACCEPT"))
            .is_some_and(|c| BUILT_IN.contains(&c));
        if !default_chain {
            out.insert(format!("{table}: {rule}"));
        }
    }
    out
}

fn dir_entries(dir: &str, prefixes: &[&str]) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| prefixes.iter().any(|p| n.starts_with(p)))
        .map(|n| format!("{dir}/{n}"))
        .collect()
}

impl Inventory {
    pub fn take() -> Inventory {
        Inventory {
            kinds: vec![
                ("mount", mounts()),
                ("process", processes()),
                ("cgroup", cgroups()),
                ("network namespace", dir_entries("/run/netns", &[""])),
                ("link", links()),
                ("iptables rule or chain", iptables_rules()),
                ("temp dir", dir_entries("/tmp", &["crius-", ".tmp"])),
                // What the bench's CRI-O peer could leave outside its directory: c/image's
                // blob-info cache, and crun's root were its crun handler probed.
                (
                    "CRI-O directory",
                    dir_entries("/var/lib", &["containers"])
                        .into_iter()
                        .chain(dir_entries("/run", &["crun"]))
                        .collect(),
                ),
            ],
        }
    }

    /// Fails naming what is here now and was not `before`.
    pub fn check_since(&self, before: &Inventory, after: &str) -> Result<()> {
        let mut new = Vec::new();
        for ((kind, now), (_, then)) in self.kinds.iter().zip(&before.kinds) {
            new.extend(now.difference(then).map(|x| format!("  {kind}: {x}")));
        }
        if !new.is_empty() {
            bail!("{after} left these behind:\n{}", new.join("\n"));
        }
        eprintln!("xtask: nothing left behind after {after}");
        Ok(())
    }
}

/// Where the test harness tells what it had to kill after a daemon (tests/common `kill_strays`);
/// on the host only: the VM tier sees the tree read-only, and its suites print the same lines
/// on their own output.
const STRAYS: &str = "target/tmp/strays.log";

/// Starts the record of strays afresh.
pub fn forget_strays() {
    let _ = std::fs::remove_file(STRAYS);
}

/// Prints what the harness killed since `forget_strays`: each test still passed, but each
/// line is a process the runtime let go of, named with the test that saw it.
pub fn report_strays(after: &str) {
    if let Ok(text) = std::fs::read_to_string(STRAYS)
        && !text.trim().is_empty()
    {
        eprintln!("xtask: WARNING: {after}: the harness killed processes no record owned:\n{text}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_table_is_not_a_leftover_but_its_rules_are() {
        let dump = "# Generated by iptables-save\n*filter\n:INPUT ACCEPT [0:0]\n\
                    :FORWARD DROP [3:180]\n:CNI-FORWARD - [0:0]\n\
                    -A FORWARD -j CNI-FORWARD\nCOMMIT\n*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n";
        let got: Vec<String> = rules(dump).into_iter().collect();
        assert_eq!(
            got,
            [
                "filter: -A FORWARD -j CNI-FORWARD",
                "filter: :CNI-FORWARD -",
                "filter: :FORWARD DROP",
            ]
        );
    }
}
