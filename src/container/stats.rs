//! Container and pod statistics for kubelet (ContainerStats, PodSandboxStats and their lists)
//! and the cadvisor-style metrics of ListPodSandboxMetrics: CPU, memory and swap from the cgroups,
//! the writable layer's bytes and inodes from its directory, network bytes from the pod's network
//! namespace, processes from `pids.current`. CPU rates need two samples, so the last one of each
//! cgroup is remembered; a layer's size is read from its project quota where the file system
//! keeps them, else walked at most every few seconds.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config::{ContainerMetadata, ContainerState};
use super::{ContainerService, Error, Record};
use crate::records::now_nanos;
use crate::runtime::cgroup::Cgroup;
use crate::sandbox;

/// How long a measured writable-layer size is reused.
const LAYER_TTL: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct Samples {
    cpu: Mutex<HashMap<std::path::PathBuf, (i64, u64)>>,
    layers: Mutex<HashMap<std::path::PathBuf, (Instant, u64, u64)>>,
}

fn v(value: u64) -> Option<u64> {
    Some(value)
}

/// Pressure stall figures of one resource for some or all of a cgroup's tasks: the total time
/// they waited (nanoseconds) and the share of time (%) over 10, 60 and 300 s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PsiData {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// A resource's pressure (`cpu.pressure`, `memory.pressure`, `io.pressure`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Psi {
    pub full: PsiData,
    pub some: PsiData,
}

/// A pressure file's two lines, `some avg10=.. avg60=.. avg300=.. total=..` and `full ...`
/// (`total` in microseconds); none when the kernel keeps no pressure figures (no such file,
/// or `psi=0` reading it fails).
pub fn psi(text: &str) -> Option<Psi> {
    let mut out = Psi::default();
    let mut seen = 0;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let which = match words.next() {
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            _ => continue,
        };
        for w in words {
            let Some((k, v)) = w.split_once('=') else {
                continue;
            };
            match k {
                "avg10" => which.avg10 = v.parse().ok()?,
                "avg60" => which.avg60 = v.parse().ok()?,
                "avg300" => which.avg300 = v.parse().ok()?,
                "total" => which.total = v.parse::<u64>().ok()?.saturating_mul(1000),
                _ => {}
            }
        }
        seen += 1;
    }
    (seen > 0).then_some(out)
}

/// A cgroup's pressure of one resource (`cpu`, `memory`, `io`).
pub fn pressure(cg: &Cgroup, resource: &str) -> Option<Psi> {
    psi(&std::fs::read_to_string(cg.path.join(format!("{resource}.pressure"))).ok()?)
}

/// CPU use of a cgroup (or a container's processes) at a moment: total time and the rate
/// since the previous sample, with the cgroup's CPU pressure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CpuUsage {
    pub timestamp: i64,
    pub usage_core_nano_seconds: Option<u64>,
    pub usage_nano_cores: Option<u64>,
    pub psi: Option<Psi>,
}

/// I/O of a cgroup: its pressure.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IoUsage {
    pub timestamp: i64,
    pub psi: Option<Psi>,
}

pub fn io(cg: &Cgroup) -> IoUsage {
    IoUsage {
        timestamp: now_nanos(),
        psi: pressure(cg, "io"),
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemoryUsage {
    pub timestamp: i64,
    pub working_set_bytes: Option<u64>,
    pub available_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
    pub rss_bytes: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    pub psi: Option<Psi>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SwapUsage {
    pub timestamp: i64,
    pub swap_available_bytes: Option<u64>,
    pub swap_usage_bytes: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessUsage {
    pub timestamp: i64,
    pub process_count: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct InterfaceUsage {
    pub name: String,
    pub rx_bytes: Option<u64>,
    pub rx_packets: Option<u64>,
    pub rx_errors: Option<u64>,
    pub rx_dropped: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub tx_packets: Option<u64>,
    pub tx_errors: Option<u64>,
    pub tx_dropped: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetworkUsage {
    pub timestamp: i64,
    pub default_interface: Option<InterfaceUsage>,
    pub interfaces: Vec<InterfaceUsage>,
}

/// Bytes and inodes a filesystem holds for a container (its writable layer).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilesystemUsage {
    pub timestamp: i64,
    pub mountpoint: String,
    pub used_bytes: u64,
    pub inodes_used: u64,
}

/// A container's statistics.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerStats {
    pub id: String,
    pub metadata: Option<ContainerMetadata>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    pub writable_layer: FilesystemUsage,
    pub swap: Option<SwapUsage>,
    pub io: Option<IoUsage>,
}

/// A pod's statistics, with its running containers'.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodStats {
    pub id: String,
    pub metadata: Option<crate::sandbox::config::PodMetadata>,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub cpu: Option<CpuUsage>,
    pub memory: Option<MemoryUsage>,
    pub network: Option<NetworkUsage>,
    pub process: Option<ProcessUsage>,
    pub io: Option<IoUsage>,
    pub containers: Vec<ContainerStats>,
}

/// Which containers (or pods, without `pod_sandbox_id`) a stats listing shows.
#[derive(Debug, Clone, Default)]
pub struct StatsFilter {
    pub id: String,
    pub pod_sandbox_id: String,
    pub label_selector: HashMap<String, String>,
}

impl Samples {
    /// CPU usage of a cgroup, with the rate since the previous sample.
    pub fn cpu(&self, cg: &Cgroup) -> CpuUsage {
        let usage_ns = cg.keyed("cpu.stat").get("usage_usec").copied().unwrap_or(0) * 1000;
        CpuUsage {
            psi: pressure(cg, "cpu"),
            ..self.cpu_usage(&cg.path, usage_ns)
        }
    }

    /// CPU usage of whatever `key` names (a cgroup, a container without one), with the rate
    /// since the previous sample of the same key.
    fn cpu_usage(&self, key: &Path, usage_ns: u64) -> CpuUsage {
        let now = now_nanos();
        let mut last = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        let rate = match last.insert(key.to_path_buf(), (now, usage_ns)) {
            Some((t, u)) if now > t && usage_ns >= u => {
                ((usage_ns - u) as u128 * 1_000_000_000 / (now - t) as u128) as u64
            }
            _ => 0,
        };
        CpuUsage {
            timestamp: now,
            usage_core_nano_seconds: v(usage_ns),
            usage_nano_cores: v(rate),
            psi: None,
        }
    }

    /// Bytes and inodes of a directory tree (the writable layer), cached briefly.
    pub fn layer(&self, dir: &Path) -> (u64, u64) {
        if let Some((at, b, i)) = self
            .layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(dir)
            && at.elapsed() < LAYER_TTL
        {
            return (*b, *i);
        }
        // Walked without the cache's lock: one container's large layer must not hold up
        // every other container's stats.
        let (b, i) = crate::snapshot::usage::walk(dir);
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(dir.to_path_buf(), (Instant::now(), b, i));
        (b, i)
    }

    /// Drops the samples of a removed container: its CPU keys (cgroup or bundle directory)
    /// and its writable layer.
    pub fn forget(&self, cpu_keys: &[&Path], dir: &Path) {
        let mut cpu = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        for k in cpu_keys {
            cpu.remove(*k);
        }
        drop(cpu);
        self.layers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(dir);
    }
}

/// Memory usage of a cgroup: working set = usage - inactive file cache, as kubelet counts it.
pub fn memory(cg: &Cgroup) -> MemoryUsage {
    let stat = cg.keyed("memory.stat");
    let usage = cg.number("memory.current").unwrap_or(0);
    let inactive = stat.get("inactive_file").copied().unwrap_or(0);
    let working = usage.saturating_sub(inactive);
    let available = cg
        .number("memory.max")
        .map(|limit| limit.saturating_sub(working));
    MemoryUsage {
        timestamp: now_nanos(),
        working_set_bytes: v(working),
        available_bytes: available.and_then(v),
        usage_bytes: v(usage),
        rss_bytes: v(stat.get("anon").copied().unwrap_or(0)),
        page_faults: v(stat.get("pgfault").copied().unwrap_or(0)),
        major_page_faults: v(stat.get("pgmajfault").copied().unwrap_or(0)),
        psi: pressure(cg, "memory"),
    }
}

/// Clock ticks per second of /proc's times (the kernel's USER_HZ: 100 on every architecture
/// crius builds for).
const USER_HZ: u64 = 100;

/// What a container without a cgroup (a host without cgroup v2) uses, summed over the processes
/// sharing its mount namespace (its init, their children, exec'd commands): CPU time in
/// nanoseconds (with the reaped children each counted by its parent), resident and anonymous
/// resident bytes. Shared pages count once per process, so memory is an upper bound.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessTotals {
    pub cpu_ns: u64,
    pub rss: u64,
    pub anon: u64,
}

pub fn process_totals(mnt_ns: u64) -> ProcessTotals {
    let mut t = ProcessTotals::default();
    for pid in crate::runtime::process::pids_in_namespace("mnt", mnt_ns) {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            t.cpu_ns += stat_cpu_ticks(&stat) * (1_000_000_000 / USER_HZ);
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            t.rss += status_kib(&status, "VmRSS") * 1024;
            t.anon += status_kib(&status, "RssAnon") * 1024;
        }
    }
    t
}

/// utime + stime + cutime + cstime of a `/proc/PID/stat` line (fields 14-17; the command name
/// in field 2 may hold spaces and parentheses, so fields are counted after its last `)`).
fn stat_cpu_ticks(stat: &str) -> u64 {
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0;
    };
    // rest starts at field 3 (state): fields 14..=17 are its 12th to 15th.
    rest.split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

/// A `Name:   123 kB` line of `/proc/PID/status`, in KiB.
fn status_kib(status: &str, name: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Memory usage of a container without a cgroup, from its processes.
fn process_memory(t: &ProcessTotals) -> MemoryUsage {
    MemoryUsage {
        timestamp: now_nanos(),
        working_set_bytes: v(t.rss),
        available_bytes: None,
        usage_bytes: v(t.rss),
        rss_bytes: v(t.anon),
        page_faults: None,
        major_page_faults: None,
        psi: None,
    }
}

pub fn swap(cg: &Cgroup) -> SwapUsage {
    let used = cg.number("memory.swap.current").unwrap_or(0);
    SwapUsage {
        timestamp: now_nanos(),
        swap_available_bytes: cg
            .number("memory.swap.max")
            .map(|m| m.saturating_sub(used))
            .and_then(v),
        swap_usage_bytes: v(used),
    }
}

pub fn processes(cg: &Cgroup) -> ProcessUsage {
    ProcessUsage {
        timestamp: now_nanos(),
        process_count: v(cg
            .number("pids.current")
            .unwrap_or_else(|| cg.pids().len() as u64)),
    }
}

/// Interface counters of the network namespace `pid` lives in (`/proc/<pid>/net/dev`).
pub fn network(pid: i32) -> Option<NetworkUsage> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    let mut ifaces = Vec::new();
    for line in text.lines().skip(2) {
        let (name, rest) = line.split_once(':')?;
        let f: Vec<u64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if f.len() < 16 {
            continue;
        }
        ifaces.push(InterfaceUsage {
            name: name.trim().to_string(),
            rx_bytes: v(f[0]),
            rx_packets: v(f[1]),
            rx_errors: v(f[2]),
            rx_dropped: v(f[3]),
            tx_bytes: v(f[8]),
            tx_packets: v(f[9]),
            tx_errors: v(f[10]),
            tx_dropped: v(f[11]),
        });
    }
    // The pod's own interface if it has one; a loopback-only pod reports lo.
    let default = ifaces
        .iter()
        .find(|i| i.name == "eth0")
        .or_else(|| ifaces.iter().find(|i| i.name != "lo"))
        .or(ifaces.first())
        .cloned();
    Some(NetworkUsage {
        timestamp: now_nanos(),
        default_interface: default,
        interfaces: ifaces,
    })
}

impl ContainerService {
    pub(super) fn stats_of(&self, r: &Record) -> ContainerStats {
        let s = &self.inner.samples;
        let layer = self.bundle(&r.id).layer;
        // A layer with a project is read from its quota at once; others are walked (cached).
        let (bytes, inodes) = match r.project {
            Some(_) => self.inner.layer_usage.measure(&layer, r.project),
            None => s.layer(&layer.join("upper")),
        };
        // Without a cgroup (no cgroup v2 here) a running container's processes are counted;
        // kubelet and critest expect CPU and memory for every running container.
        let (cpu, memory) = match (&r.cgroup, r.mnt_ns) {
            (Some(cg), _) => (Some(s.cpu(cg)), Some(memory(cg))),
            (None, Some(ns)) if r.state == ContainerState::Running => {
                let t = process_totals(ns);
                let dir = self.bundle(&r.id).dir;
                (Some(s.cpu_usage(&dir, t.cpu_ns)), Some(process_memory(&t)))
            }
            (None, _) => (None, None),
        };
        ContainerStats {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            cpu,
            memory,
            writable_layer: FilesystemUsage {
                timestamp: now_nanos(),
                mountpoint: self.inner.layers.display().to_string(),
                used_bytes: bytes,
                inodes_used: inodes,
            },
            swap: r.cgroup.as_ref().map(swap),
            io: r.cgroup.as_ref().map(io),
        }
    }

    pub async fn stats(&self, id: &str) -> Result<ContainerStats, Error> {
        let entry = self.entry(id)?;
        let r = entry.lock().await;
        Self::present(&r)?;
        Ok(self.stats_of(&r))
    }

    /// Stats of running containers matching the filter (kubelet asks for running ones only).
    pub async fn list_stats(&self, filter: Option<&StatsFilter>) -> Vec<ContainerStats> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let mut r = e.lock().await;
            self.sync_exit(&mut r);
            if r.state != ContainerState::Running {
                continue;
            }
            if let Some(f) = filter
                && ((!f.id.is_empty() && !r.id.starts_with(&f.id))
                    || (!f.pod_sandbox_id.is_empty()
                        && !r.sandbox_id.starts_with(&f.pod_sandbox_id))
                    || !sandbox::labels_match(&r.config.labels, &f.label_selector))
            {
                continue;
            }
            out.push(self.stats_of(&r));
        }
        out
    }

    pub async fn pod_stats(&self, id: &str) -> Result<PodStats, Error> {
        let sb = self.inner.sandboxes.get(id).await?;
        let mut containers = Vec::new();
        for cid in self.in_sandbox(&sb.id).await {
            if let Ok(entry) = self.entry(&cid) {
                let mut r = entry.lock().await;
                self.sync_exit(&mut r);
                if r.state == ContainerState::Running {
                    containers.push(self.stats_of(&r));
                }
            }
        }
        let s = &self.inner.samples;
        let cg = sb.cgroup.as_ref();
        Ok(PodStats {
            id: sb.id.clone(),
            metadata: sb.config.metadata.clone(),
            labels: sb.config.labels.clone(),
            annotations: sb.config.annotations.clone(),
            cpu: cg.map(|c| s.cpu(c)),
            memory: cg.map(memory),
            network: sb.pause.filter(|p| p.alive()).and_then(|p| network(p.pid)),
            process: cg.map(processes),
            io: cg.map(io),
            containers,
        })
    }

    pub async fn list_pod_stats(&self, filter: Option<&StatsFilter>) -> Vec<PodStats> {
        let mut out = Vec::new();
        for p in self.inner.sandboxes.list(None).await {
            if p.state != crate::sandbox::PodState::Ready {
                continue;
            }
            if let Some(f) = filter
                && ((!f.id.is_empty() && !p.id.starts_with(&f.id))
                    || !sandbox::labels_match(&p.labels, &f.label_selector))
            {
                continue;
            }
            if let Ok(s) = self.pod_stats(&p.id).await {
                out.push(s);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_times_and_memory() {
        // A command name with spaces and parentheses does not shift the fields.
        let stat = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 2 1 20 0 1 0 5 0 0";
        assert_eq!(stat_cpu_ticks(stat), 7 + 3 + 2 + 1);
        assert_eq!(stat_cpu_ticks("garbage"), 0);
        let status = "Name:\tx\nVmRSS:\t  1234 kB\nRssAnon:\t  1000 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), 1234);
        assert_eq!(status_kib(status, "RssAnon"), 1000);
        assert_eq!(status_kib(status, "VmSwap"), 0);
        // This test's own mount namespace holds at least this process.
        let me = crate::runtime::ProcessId::of(std::process::id() as i32).unwrap();
        let t = process_totals(me.namespace("mnt").unwrap());
        assert!(t.rss > 0 && t.anon > 0 && t.anon <= t.rss, "{t:?}");
    }

    #[test]
    fn network_of_this_process() {
        let n = network(std::process::id() as i32).unwrap();
        assert!(n.interfaces.iter().any(|i| i.name == "lo"));
        assert!(n.default_interface.is_some());
    }

    #[test]
    fn pressure_files() {
        let text = "some avg10=1.50 avg60=0.25 avg300=0.00 total=1234\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        let p = psi(text).unwrap();
        assert_eq!(p.some.total, 1_234_000);
        assert_eq!(p.some.avg10, 1.5);
        assert_eq!(p.full.total, 7000);
        assert!(psi("").is_none());
        assert!(psi("some avg10=x\n").is_none());
    }

    #[test]
    fn walking_a_layer() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("a")).unwrap();
        std::fs::write(d.path().join("a/f"), vec![1u8; 10_000]).unwrap();
        let s = Samples::default();
        let (bytes, inodes) = s.layer(d.path());
        assert_eq!(inodes, 2);
        assert!(bytes >= 10_000);
    }
}
