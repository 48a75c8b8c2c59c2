//! cgroup v2, managed directly through the unified hierarchy (the cgroupfs driver): finding it
//! and its controllers, creating a pod's and a container's cgroups with the controllers they
//! need enabled on the way down, turning CRI resources into cgroup files (typed fields first,
//! then `unified` verbatim so kubelet's `memory.swap.max`, `memory.high` and `memory.oom.group`
//! win), reading usage for stats and OOM kills, and taking cgroups down.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The cgroup v2 filesystem's magic number (statfs).
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Where cgroup v2 is mounted and what it offers.
#[derive(Debug, Clone)]
pub struct Hierarchy {
    pub root: PathBuf,
    pub controllers: Vec<String>,
}

impl Hierarchy {
    /// The unified hierarchy at /sys/fs/cgroup, if that is what is mounted there (not on a v1 or
    /// hybrid host, where /sys/fs/cgroup is a tmpfs of v1 controllers).
    pub fn detect() -> Option<Hierarchy> {
        Self::at(Path::new("/sys/fs/cgroup"))
    }

    pub fn at(root: &Path) -> Option<Hierarchy> {
        let st = nix::sys::statfs::statfs(root).ok()?;
        if st.filesystem_type().0 as i64 != CGROUP2_SUPER_MAGIC {
            return None;
        }
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok()?;
        Some(Hierarchy {
            root: root.to_path_buf(),
            controllers: controllers.split_whitespace().map(str::to_string).collect(),
        })
    }

    pub fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    /// The cgroup at `rel` (relative to the root; `..` refused).
    pub fn cgroup(&self, rel: &str) -> io::Result<Cgroup> {
        let mut path = self.root.clone();
        for c in Path::new(rel).components() {
            match c {
                Component::Normal(s) => path.push(s),
                Component::RootDir | Component::CurDir => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("cgroup path {rel:?} must not contain \"..\""),
                    ));
                }
            }
        }
        Ok(Cgroup {
            root: self.root.clone(),
            path,
        })
    }
}

/// One cgroup directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    pub root: PathBuf,
    pub path: PathBuf,
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    std::fs::write(path, value)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

impl Cgroup {
    /// Creates the cgroup (and its ancestors), enabling `controllers` in every ancestor's
    /// `cgroup.subtree_control` so they reach it. Controllers an ancestor cannot offer are
    /// skipped; what the cgroup ends up with is in its `cgroup.controllers`.
    pub fn create(&self, controllers: &[&str]) -> io::Result<()> {
        let rel = self
            .path
            .strip_prefix(&self.root)
            .map_err(|_| io::Error::other("cgroup outside its hierarchy"))?;
        let mut cur = self.root.clone();
        for comp in rel.components() {
            let available =
                std::fs::read_to_string(cur.join("cgroup.controllers")).unwrap_or_default();
            let enabled =
                std::fs::read_to_string(cur.join("cgroup.subtree_control")).unwrap_or_default();
            let want: Vec<String> = controllers
                .iter()
                .filter(|c| {
                    available.split_whitespace().any(|a| a == **c)
                        && !enabled.split_whitespace().any(|e| e == **c)
                })
                .map(|c| format!("+{c}"))
                .collect();
            if !want.is_empty() {
                write(&cur.join("cgroup.subtree_control"), &want.join(" "))?;
            }
            cur.push(comp);
            match std::fs::create_dir(&cur) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", cur.display()))),
            }
        }
        crate::fault::point("cgroup.create.after");
        Ok(())
    }

    pub fn exists(&self) -> bool {
        self.path.join("cgroup.procs").exists()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub fn set(&self, name: &str, value: &str) -> io::Result<()> {
        crate::fault::point("cgroup.write.before");
        write(&self.file(name), value)
    }

    pub fn read(&self, name: &str) -> io::Result<String> {
        std::fs::read_to_string(self.file(name))
    }

    /// Writes `files` in order, all or none: when the kernel refuses one (a CPU the node lacks),
    /// those written before it get their old values back, so a refused update leaves the limits
    /// as they were (and as the record says). Returns the refused file, its value and why.
    pub fn set_all(&self, files: &[(String, String)]) -> Result<(), (String, String, io::Error)> {
        let mut before: Vec<(&str, Option<String>)> = Vec::new();
        for (file, value) in files {
            let old = self.read(file).ok();
            if let Err(e) = self.set(file, value) {
                for (f, old) in before.into_iter().rev() {
                    if let Some(old) = old {
                        let _ = self.set(f, old_value(&old));
                    }
                }
                return Err((file.clone(), value.clone(), e));
            }
            before.push((file.as_str(), old));
        }
        Ok(())
    }

    /// Moves a process (0: the caller) into the cgroup.
    pub fn add(&self, pid: i32) -> io::Result<()> {
        self.set("cgroup.procs", &pid.to_string())
    }

    /// Pids of the processes in the cgroup.
    pub fn pids(&self) -> Vec<i32> {
        self.read("cgroup.procs")
            .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// SIGKILLs every process in the cgroup and below (`cgroup.kill`, kernel 5.14+).
    pub fn kill(&self) -> io::Result<()> {
        self.set("cgroup.kill", "1")
    }

    /// Freezes (or thaws) every process in the cgroup and below (`cgroup.freeze`).
    pub fn freeze(&self, frozen: bool) -> io::Result<()> {
        self.set("cgroup.freeze", if frozen { "1" } else { "0" })
    }

    /// Whether the kernel reports every process in the cgroup frozen (`cgroup.events`).
    pub fn is_frozen(&self) -> bool {
        self.keyed("cgroup.events").get("frozen") == Some(&1)
    }

    /// Removes the cgroup and any children it has, killing what still runs in them.
    pub fn remove(&self) -> io::Result<()> {
        if !self.path.exists() {
            return Ok(());
        }
        if let Ok(entries) = std::fs::read_dir(&self.path) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    Cgroup {
                        root: self.root.clone(),
                        path: e.path(),
                    }
                    .remove()?;
                }
            }
        }
        // Killed processes leave in their own time: a loaded (or emulated) machine may take
        // seconds to end a few of them.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut killed = false;
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    // Busy: processes (or zombies) still in it.
                    if !killed {
                        let _ = self.kill();
                        killed = true;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        }
    }

    /// A `key value` file (memory.stat, cpu.stat, memory.events) as a map.
    pub fn keyed(&self, name: &str) -> BTreeMap<String, u64> {
        read_keyed(&self.file(name)).unwrap_or_default()
    }

    /// A single-number file; `max` and missing files are `None`.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.read(name).ok()?.trim().parse().ok()
    }
}

/// A `key value` cgroup file at `path` as a map.
pub fn read_keyed(path: &Path) -> io::Result<BTreeMap<String, u64>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(|l| {
            let mut p = l.split_whitespace();
            Some((p.next()?.to_string(), p.next()?.parse().ok()?))
        })
        .collect())
}

/// CRI's LinuxContainerResources, as plain numbers (0: unset).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resources {
    pub cpu_period: i64,
    pub cpu_quota: i64,
    pub cpu_shares: i64,
    pub memory_limit: i64,
    pub memory_swap_limit: i64,
    pub cpuset_cpus: String,
    pub cpuset_mems: String,
    /// (page size as CRI names it, e.g. "2MB"; limit in bytes)
    pub hugepage_limits: Vec<(String, u64)>,
    pub pids_limit: i64,
    pub unified: BTreeMap<String, String>,
}

impl Resources {
    /// Whether anything here limits the container (shares alone only weigh it).
    pub fn limits_anything(&self) -> bool {
        self.cpu_quota > 0
            || self.memory_limit > 0
            || self.memory_swap_limit > 0
            || !self.cpuset_cpus.is_empty()
            || !self.cpuset_mems.is_empty()
            || !self.hugepage_limits.is_empty()
            || self.pids_limit > 0
            || !self.unified.is_empty()
    }
}

/// Why resources or a cgroup name cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    #[error("hugepage size {0:?} is not valid")]
    HugepageSize(String),
    #[error("memory_swap_limit_in_bytes {swap} is below memory_limit_in_bytes {memory}")]
    SwapBelowMemory { swap: i64, memory: i64 },
    #[error("memory_swap_limit_in_bytes needs memory_limit_in_bytes")]
    SwapWithoutMemory,
    #[error("unified key {0:?} is not a cgroup interface file")]
    UnifiedKey(String),
    #[error("{0:?} is not a slice")]
    NotASlice(String),
    #[error("{0:?} is not a valid slice name")]
    SliceName(String),
    #[error(
        "{0:?} is not a slice name, as the systemd cgroup driver needs (kubelet's cgroupDriver must be systemd too)"
    )]
    ParentNotSlice(String),
    #[error("cgroup_parent {0:?} must not contain \"..\"")]
    ParentDotDot(String),
}

/// `cpu.weight` from CPU shares (the kernel's and kubelet's conversion).
pub fn cpu_weight(shares: i64) -> u64 {
    let shares = shares.clamp(2, 262_144) as u64;
    1 + ((shares - 2) * 9999) / 262_142
}

/// CPU shares of a `cpu.weight` (the inverse of `cpu_weight`, as kubelet computes it).
pub fn cpu_shares(weight: u64) -> i64 {
    let weight = weight.clamp(1, 10_000);
    (2 + ((weight - 1) * 262_142) / 9999) as i64
}

/// "2MB" → "2MB" as cgroup v2 names hugetlb files (`hugetlb.2MB.max`); CRI and the kernel agree.
fn hugetlb_file(size: &str) -> Result<String, LimitError> {
    let ok = !size.is_empty() && size.chars().all(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(format!("hugetlb.{size}.max"))
    } else {
        Err(LimitError::HugepageSize(size.to_string()))
    }
}

/// The cgroup files and values for `r`, in the order they must be written: typed fields, then
/// `unified` verbatim (it wins).
pub fn files(r: &Resources) -> Result<Vec<(String, String)>, LimitError> {
    let mut out: Vec<(String, String)> = Vec::new();
    if r.cpu_shares > 0 {
        out.push(("cpu.weight".into(), cpu_weight(r.cpu_shares).to_string()));
    }
    if r.cpu_quota > 0 || r.cpu_period > 0 {
        let period = if r.cpu_period > 0 {
            r.cpu_period
        } else {
            100_000
        };
        let quota = if r.cpu_quota > 0 {
            r.cpu_quota.to_string()
        } else {
            "max".to_string()
        };
        out.push(("cpu.max".into(), format!("{quota} {period}")));
    }
    if !r.cpuset_cpus.is_empty() {
        out.push(("cpuset.cpus".into(), r.cpuset_cpus.clone()));
    }
    if !r.cpuset_mems.is_empty() {
        out.push(("cpuset.mems".into(), r.cpuset_mems.clone()));
    }
    if r.memory_limit > 0 {
        out.push(("memory.max".into(), r.memory_limit.to_string()));
        // CRI's swap limit is memory plus swap, as docker's --memory-swap; without one the
        // container gets no swap at all (what containerd and CRI-O do).
        let swap = match r.memory_swap_limit {
            0 => "0".to_string(),
            -1 => "max".to_string(),
            s if s >= r.memory_limit => (s - r.memory_limit).to_string(),
            s => {
                return Err(LimitError::SwapBelowMemory {
                    swap: s,
                    memory: r.memory_limit,
                });
            }
        };
        out.push(("memory.swap.max".into(), swap));
    } else if r.memory_swap_limit > 0 {
        return Err(LimitError::SwapWithoutMemory);
    }
    if r.pids_limit > 0 {
        out.push(("pids.max".into(), r.pids_limit.to_string()));
    }
    for (size, limit) in &r.hugepage_limits {
        out.push((hugetlb_file(size)?, limit.to_string()));
    }
    for (k, v) in &r.unified {
        if k.is_empty() || k.contains('/') || k.starts_with('.') || k.starts_with("cgroup.") {
            return Err(LimitError::UnifiedKey(k.clone()));
        }
        out.retain(|(f, _)| f != k);
        out.push((k.clone(), v.clone()));
    }
    Ok(out)
}

/// How this node enforces limits: the hierarchy (none on a v1 or hybrid host) and the operator's
/// choices from the `[cgroup]` config.
#[derive(Debug, Clone)]
pub struct Policy {
    pub hierarchy: Option<Hierarchy>,
    /// cgroup v1's devices hierarchy, the device control of a node without v2.
    pub devices_v1: Option<super::devices::V1>,
    pub systemd: bool,
    pub parent: String,
    pub allow_unenforced: bool,
}

/// The controllers pods and containers get, where the hierarchy offers them.
pub const CONTROLLERS: [&str; 6] = ["cpu", "cpuset", "memory", "pids", "io", "hugetlb"];

impl Policy {
    /// The pod's cgroup relative to the root: the parent kubelet named (a path for cgroupfs, a
    /// slice for systemd), else crius's own `<parent>/<sandbox id>`. The flag says whether crius
    /// owns it (and removes it with the pod).
    pub fn pod_path(
        &self,
        cgroup_parent: &str,
        sandbox_id: &str,
    ) -> Result<(String, bool), LimitError> {
        if cgroup_parent.is_empty() {
            if self.systemd {
                // A slice of crius's own below `<parent>.slice`, as kubelet makes pod slices.
                return Ok((
                    expand_slice(&format!("{}-{sandbox_id}.slice", self.parent))?,
                    true,
                ));
            }
            return Ok((format!("{}/{sandbox_id}", self.parent), true));
        }
        if self.systemd {
            // As runc's systemd driver: a parent must be a slice, or systemd could not hold
            // the pod's scopes.
            // kubelet sends the slice's whole path (`/kubepods.slice/kubepods-burstable.slice/
            // kubepods-burstable-pod<uid>.slice`), older ones the name alone; as containerd,
            // the last slice is the one.
            let parts: Vec<&str> = cgroup_parent.split('/').filter(|p| !p.is_empty()).collect();
            if let Some(last) = parts.last()
                && parts.iter().all(|p| p.ends_with(".slice"))
            {
                return Ok((expand_slice(last)?, false));
            }
            return Err(LimitError::ParentNotSlice(cgroup_parent.to_string()));
        }
        if cgroup_parent.split('/').any(|c| c == "..") {
            return Err(LimitError::ParentDotDot(cgroup_parent.to_string()));
        }
        Ok((cgroup_parent.trim_start_matches('/').to_string(), false))
    }
}

impl Policy {
    /// The cgroup directory of a pause process or container below its pod's: under systemd a
    /// scope unit's name (`crius-<id>.scope`, as runc names `cri-containerd-<id>.scope`), else
    /// the ID itself.
    pub fn leaf(&self, id: &str) -> String {
        if self.systemd {
            format!("crius-{id}.scope")
        } else {
            id.to_string()
        }
    }

    /// A container's devices cgroup on a node without cgroup v2 (`<devices>/<parent>/<id>`);
    /// none where v2 controls devices or nothing can.
    pub fn devices_v1_cgroup(&self, id: &str) -> Option<PathBuf> {
        self.devices_v1_parent().map(|p| p.join(id))
    }

    /// Where containers' v1 devices cgroups go: `<devices>/<parent>`.
    pub fn devices_v1_parent(&self) -> Option<PathBuf> {
        match (&self.hierarchy, &self.devices_v1) {
            (None, Some(v1)) => Some(v1.root.join(&self.parent)),
            _ => None,
        }
    }

    /// Whether containers' devices can be confined here: a v2 hierarchy or v1's devices
    /// controller.
    pub fn controls_devices(&self) -> bool {
        self.hierarchy.is_some() || self.devices_v1.is_some()
    }

    /// The top of crius's own pod cgroups.
    pub fn own_parent(&self) -> String {
        if self.systemd {
            expand_slice(&format!("{}.slice", self.parent)).unwrap_or_default()
        } else {
            self.parent.clone()
        }
    }
}

/// systemd's slice naming: `a-b-c.slice` lives at `a.slice/a-b.slice/a-b-c.slice`.
pub fn expand_slice(name: &str) -> Result<String, LimitError> {
    let base = name
        .strip_suffix(".slice")
        .ok_or_else(|| LimitError::NotASlice(name.to_string()))?;
    if base == "-" {
        return Ok(String::new());
    }
    // systemd's unit name characters (and no dots but the suffix's, so no `..` either).
    let unit_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, ':' | '-' | '_' | '\\');
    if base.is_empty()
        || base.starts_with('-')
        || base.ends_with('-')
        || base.contains("--")
        || !base.chars().all(unit_char)
    {
        return Err(LimitError::SliceName(name.to_string()));
    }
    let mut path = Vec::new();
    let mut prefix = String::new();
    for part in base.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Ok(path.join("/"))
}

/// A limit file's content as read, as it is written back: its first line (`cpu.max` reads
/// `max 100000`, which writes as is).
fn old_value(read: &str) -> &str {
    read.lines().next().unwrap_or("").trim()
}

/// A pod's cgroup limits: the sum of its containers' (`resources`) plus the sandbox overhead,
/// field by field, as kubelet sizes a pod cgroup.
pub fn pod_limits(resources: &Resources, overhead: &Resources) -> Resources {
    // Saturating: a client's i64::MAX overhead is no limit, not a wrap to a negative one.
    let add = |a: i64, b: i64| if a > 0 { a.saturating_add(b.max(0)) } else { 0 };
    Resources {
        cpu_period: resources.cpu_period.max(overhead.cpu_period),
        cpu_quota: add(resources.cpu_quota, overhead.cpu_quota),
        cpu_shares: add(resources.cpu_shares, overhead.cpu_shares),
        memory_limit: add(resources.memory_limit, overhead.memory_limit),
        memory_swap_limit: 0,
        cpuset_cpus: resources.cpuset_cpus.clone(),
        cpuset_mems: resources.cpuset_mems.clone(),
        hugepage_limits: resources.hugepage_limits.clone(),
        pids_limit: resources.pids_limit,
        unified: resources.unified.clone(),
    }
}

/// The controller a cgroup file belongs to (`memory.max` → `memory`).
pub fn controller_of(file: &str) -> &str {
    file.split('.').next().unwrap_or(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_shares_from_weight() {
        // kubelet's inverse, which floors: 1024 shares are weight 39, read back as 998.
        assert_eq!(cpu_shares(cpu_weight(1024)), 998);
        assert_eq!(cpu_shares(1), 2);
        assert_eq!(cpu_shares(10_000), 262_144);
    }

    #[test]
    fn cpu_weight_matches_kubelet() {
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(1024), 39);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_weight(1), 1);
    }

    #[test]
    fn resources_to_files() {
        let r = Resources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit: 64 << 20,
            cpuset_cpus: "0".into(),
            pids_limit: 100,
            hugepage_limits: vec![("2MB".into(), 0)],
            unified: [
                ("memory.swap.max".to_string(), "max".to_string()),
                ("memory.high".to_string(), "50M".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        let f = files(&r).unwrap();
        let get = |k: &str| f.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
        assert_eq!(get("cpu.weight").as_deref(), Some("20"));
        assert_eq!(get("cpu.max").as_deref(), Some("50000 100000"));
        assert_eq!(get("memory.max").as_deref(), Some("67108864"));
        assert_eq!(
            get("memory.swap.max").as_deref(),
            Some("max"),
            "unified wins"
        );
        assert_eq!(get("pids.max").as_deref(), Some("100"));
        assert_eq!(get("hugetlb.2MB.max").as_deref(), Some("0"));
        assert_eq!(
            f.last().map(|(k, _)| k.as_str()),
            Some("memory.swap.max"),
            "unified is written last"
        );
    }

    #[test]
    fn swap_rules() {
        let mem = |m: i64, s: i64| {
            files(&Resources {
                memory_limit: m,
                memory_swap_limit: s,
                ..Default::default()
            })
        };
        let swap = |v: Vec<(String, String)>| {
            v.into_iter()
                .find(|(k, _)| k == "memory.swap.max")
                .map(|(_, v)| v)
        };
        assert_eq!(
            swap(mem(100, 0).unwrap()).as_deref(),
            Some("0"),
            "a memory limit alone means no swap"
        );
        assert_eq!(swap(mem(100, 300).unwrap()).as_deref(), Some("200"));
        assert_eq!(swap(mem(100, -1).unwrap()).as_deref(), Some("max"));
        assert!(mem(100, 50).is_err());
        assert!(mem(0, 50).is_err());
    }

    #[test]
    fn bad_unified_keys() {
        for k in ["../x", "cgroup.procs", "", ".hidden"] {
            let r = Resources {
                unified: [(k.to_string(), "1".to_string())].into(),
                ..Default::default()
            };
            assert!(files(&r).is_err(), "{k}");
        }
        assert!(
            files(&Resources {
                hugepage_limits: vec![("2M/x".into(), 1)],
                ..Default::default()
            })
            .is_err()
        );
    }

    #[test]
    fn slices_and_pod_paths() {
        assert_eq!(
            expand_slice("kubepods-burstable-pod12.slice").unwrap(),
            "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12.slice"
        );
        assert_eq!(expand_slice("-.slice").unwrap(), "");
        assert!(expand_slice("a--b.slice").is_err());
        assert!(expand_slice("a b.slice").is_err());
        assert!(expand_slice("a/../b.slice").is_err());
        assert!(expand_slice("x.scope").is_err());
        let mut p = Policy {
            hierarchy: None,
            devices_v1: None,
            systemd: false,
            parent: "crius".into(),
            allow_unenforced: false,
        };
        assert_eq!(
            p.pod_path("", "abc").unwrap(),
            ("crius/abc".to_string(), true)
        );
        assert_eq!(
            p.pod_path("/kubepods/burstable/pod1", "abc").unwrap(),
            ("kubepods/burstable/pod1".to_string(), false)
        );
        assert!(p.pod_path("/kubepods/../../x", "abc").is_err());
        p.systemd = true;
        assert_eq!(
            p.pod_path("kubepods-pod1.slice", "abc").unwrap().0,
            "kubepods.slice/kubepods-pod1.slice"
        );
        assert_eq!(
            p.pod_path("", "abc").unwrap().0,
            "crius.slice/crius-abc.slice"
        );
        assert_eq!(p.leaf("abc"), "crius-abc.scope");
        assert!(p.pod_path("/kubepods/burstable/pod1", "abc").is_err());
        // kubelet 1.32 names the slice by its whole path.
        assert_eq!(
            p.pod_path(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice",
                "abc"
            )
            .unwrap(),
            (
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1.slice".into(),
                false
            )
        );
        assert!(p.pod_path("/kubepods.slice/burstable/pod1", "abc").is_err());
        assert_eq!(p.own_parent(), "crius.slice");
    }

    #[test]
    fn a_refused_limit_puts_back_those_written_before_it() {
        let d = tempfile::tempdir().unwrap();
        let cg = Cgroup {
            root: d.path().to_path_buf(),
            path: d.path().to_path_buf(),
        };
        std::fs::write(cg.file("cpu.max"), "max 100000\n").unwrap();
        std::fs::write(cg.file("memory.max"), "max\n").unwrap();
        // A file that cannot be written, as the kernel refuses a CPU the node lacks.
        std::fs::create_dir(cg.file("cpuset.cpus")).unwrap();
        let files = [
            ("cpu.max", "20000 100000"),
            ("memory.max", "1073741824"),
            ("cpuset.cpus", "9999"),
        ]
        .map(|(f, v)| (f.to_string(), v.to_string()));
        let (file, value, _) = cg.set_all(&files).unwrap_err();
        assert_eq!((file.as_str(), value.as_str()), ("cpuset.cpus", "9999"));
        assert_eq!(cg.read("cpu.max").unwrap(), "max 100000");
        assert_eq!(cg.read("memory.max").unwrap(), "max");
        cg.set_all(&files[..2]).unwrap();
        assert_eq!(cg.read("cpu.max").unwrap(), "20000 100000");
    }

    #[test]
    fn pod_limits_add_overhead() {
        let r = Resources {
            memory_limit: 100,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            cpu_shares: 512,
            ..Default::default()
        };
        let o = Resources {
            memory_limit: 10,
            cpu_quota: 5_000,
            cpu_shares: 10,
            ..Default::default()
        };
        let l = pod_limits(&r, &o);
        assert_eq!(
            (l.memory_limit, l.cpu_quota, l.cpu_shares, l.cpu_period),
            (110, 55_000, 522, 100_000)
        );
        assert_eq!(
            pod_limits(&Resources::default(), &o).memory_limit,
            0,
            "no limit stays no limit"
        );
        let huge = Resources {
            memory_limit: i64::MAX,
            ..Default::default()
        };
        assert_eq!(
            pod_limits(&r, &huge).memory_limit,
            i64::MAX,
            "saturates, not wraps"
        );
    }

    #[test]
    fn paths_stay_in_the_hierarchy() {
        let h = Hierarchy {
            root: "/sys/fs/cgroup".into(),
            controllers: vec![],
        };
        assert_eq!(
            h.cgroup("/kubepods/pod1").unwrap().path,
            PathBuf::from("/sys/fs/cgroup/kubepods/pod1")
        );
        assert!(h.cgroup("/kubepods/../../etc").is_err());
    }
}
