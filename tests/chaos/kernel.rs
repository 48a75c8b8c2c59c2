//! What the kernel and the disk hold of a chaos run: its processes (pause processes and
//! monitors by the marker in their environment, containers by their command), mount points,
//! and the daemon's state files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::common::{Daemon, list_names};

/// The run's processes: pause processes and monitors (the marker in their environment) and
/// container processes (`sleep <marker>`).
pub struct Procs {
    pub pause: BTreeMap<i64, String>,
    pub sleep: BTreeMap<i64, String>,
    pub monitors: BTreeMap<i64, String>,
}

impl Procs {
    pub fn all(&self) -> impl Iterator<Item = (i64, &String)> {
        self.pause.iter().chain(&self.sleep).map(|(p, c)| (*p, c))
    }
}

pub fn processes(marker: u64, state: &Path) -> Procs {
    let mut out = Procs {
        pause: BTreeMap::new(),
        sleep: BTreeMap::new(),
        monitors: BTreeMap::new(),
    };
    let ours = format!("CRIUS_CHAOS_RUN={marker}");
    let sleep = format!("sleep {marker}");
    let bundles = state.join("containers").display().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i64>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        // Zombies are reaped by whoever owns them; only the living count.
        if !running(pid as u32) {
            continue;
        }
        let cmd = String::from_utf8_lossy(&cmd)
            .replace('\0', " ")
            .trim()
            .to_string();
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        let ours = environ.split('\0').any(|v| v == ours);
        if cmd == sleep {
            out.sleep.insert(pid, cmd);
        } else if ours && cmd.starts_with("crius pause") {
            out.pause.insert(pid, cmd);
        } else if let Some(rest) = cmd.strip_prefix("crius monitor ")
            && rest.starts_with(&bundles)
        {
            let id = rest.rsplit('/').next().unwrap_or_default().to_string();
            out.monitors.insert(pid, id);
        }
    }
    out
}

/// Whether a process runs (a killed daemon stays a zombie until the test reaps it).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

pub fn mount_points() -> BTreeSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// The daemon's own state files: records of pods, containers, images, snapshots.
pub fn state_files(d: &Daemon) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut add = |dir: &Path| {
        for n in list_names(dir) {
            let p = dir.join(n);
            if p.is_file() {
                out.push(p);
            }
        }
    };
    for kind in ["sandboxes", "containers"] {
        let top = d.state.join(kind);
        add(&top);
        for id in list_names(&top) {
            add(&top.join(id));
        }
    }
    add(&d.root.join("images"));
    let snaps = d.root.join("snapshots");
    add(&snaps);
    for id in list_names(&snaps) {
        add(&snaps.join(id));
    }
    add(&d.root.join("content/blobs/sha256"));
    out
}

/// The processes holding the listening socket bound at `path` (pid and command line).
pub fn socket_holders(path: &Path) -> Vec<String> {
    let want = path.display().to_string();
    let inodes: Vec<String> = std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split_whitespace().nth(7) == Some(want.as_str()))
        .filter_map(|l| l.split_whitespace().nth(6).map(|i| format!("socket:[{i}]")))
        .collect();
    let mut out: Vec<String> = std::fs::read_to_string("/proc/net/unix")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with(want.as_str()))
        .map(|l| format!("/proc/net/unix: {l}"))
        .collect();
    let ss = std::process::Command::new("ss").args(["-xlpn"]).output();
    if let Ok(o) = ss {
        out.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| l.contains(want.as_str()))
                .map(|l| format!("ss: {l}")),
        );
    }
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        for fd in std::fs::read_dir(e.path().join("fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let link = std::fs::read_link(fd.path()).unwrap_or_default();
            if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                out.push(format!(
                    "{pid} {}",
                    cmd.chars().take(120).collect::<String>()
                ));
            }
        }
    }
    out
}
