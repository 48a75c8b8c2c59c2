//! Samples of the cadvisor-shaped metrics (see `metrics`), each with its pod's or container's
//! base labels: what a cgroup tells, family by family (CPU, memory, I/O, processes, pressure,
//! limits), a pod's network interfaces, a container's writable layer and times; gathered for
//! every ready pod and its running containers (ListPodSandboxMetrics). Reads the cgroup's files,
//! and /proc for the processes' descriptors; uses `metrics` (the types and catalogue), `stats`
//! (pressure, network, layer usage) and the container records.

use std::collections::BTreeMap;

use super::config::ContainerState;
use super::metrics::{METRICS, Metric, MetricKind, PodMetrics};
use super::stats::{NetworkUsage, network, psi};
use super::{ContainerService, Record};
use crate::records::now_nanos;
use crate::runtime::cgroup::Cgroup;
use crate::sandbox;

/// Samples for one pod or container: its base label values, and a time.
struct Samples {
    base: Vec<String>,
    at: i64,
    /// The samples taken so far, in the order taken.
    out: Vec<Metric>,
}

impl Samples {
    /// No samples yet, for the base label values `base`, taken now.
    fn new(base: Vec<String>) -> Samples {
        Samples {
            base,
            at: now_nanos(),
            out: Vec::new(),
        }
    }

    /// One sample of metric `name`, with its labels beyond the base ones.
    fn add(&mut self, name: &str, extra: &[&str], value: u64) {
        let kind = METRICS
            .iter()
            .find(|m| m.0 == name)
            .map_or(MetricKind::Gauge, |m| m.2);
        let mut labels = self.base.clone();
        labels.extend(extra.iter().map(|s| s.to_string()));
        self.out.push(Metric {
            name: name.into(),
            timestamp: self.at,
            kind,
            label_values: labels,
            value,
        });
    }

    /// Everything a cgroup tells, family by family.
    fn cgroup(&mut self, cg: &Cgroup) {
        self.cpu(cg);
        self.memory(cg);
        self.io(cg);
        self.processes(cg);
        self.pressure(cg);
        self.limits(cg);
    }

    /// CPU time used (`cpu.stat`), and CFS periods and throttling.
    fn cpu(&mut self, cg: &Cgroup) {
        let cpu = cg.keyed("cpu.stat");
        let c = |k: &str| cpu.get(k).copied().unwrap_or(0);
        self.add(
            "container_cpu_usage_seconds_total",
            &[],
            c("usage_usec") / 1_000_000,
        );
        self.add(
            "container_cpu_user_seconds_total",
            &[],
            c("user_usec") / 1_000_000,
        );
        self.add(
            "container_cpu_system_seconds_total",
            &[],
            c("system_usec") / 1_000_000,
        );
        self.add("container_cpu_cfs_periods_total", &[], c("nr_periods"));
        self.add(
            "container_cpu_cfs_throttled_periods_total",
            &[],
            c("nr_throttled"),
        );
        self.add(
            "container_cpu_cfs_throttled_seconds_total",
            &[],
            c("throttled_usec") / 1_000_000,
        );
    }

    /// Memory use (`memory.stat`, `memory.current`, swap, peak, working set), its failures
    /// (limit hits, page faults) and OOM kills.
    fn memory(&mut self, cg: &Cgroup) {
        let stat = cg.keyed("memory.stat");
        let m = |k: &str| stat.get(k).copied().unwrap_or(0);
        let usage = cg.number("memory.current").unwrap_or(0);
        self.add("container_memory_cache", &[], m("file"));
        self.add("container_memory_rss", &[], m("anon"));
        self.add("container_memory_kernel_usage", &[], m("kernel"));
        self.add("container_memory_mapped_file", &[], m("file_mapped"));
        self.add(
            "container_memory_swap",
            &[],
            cg.number("memory.swap.current").unwrap_or(0),
        );
        let events = cg.keyed("memory.events");
        self.add(
            "container_memory_failcnt",
            &[],
            events.get("max").copied().unwrap_or(0),
        );
        self.add("container_memory_usage_bytes", &[], usage);
        self.add(
            "container_memory_max_usage_bytes",
            &[],
            cg.number("memory.peak").unwrap_or(usage),
        );
        self.add(
            "container_memory_working_set_bytes",
            &[],
            usage.saturating_sub(m("inactive_file")),
        );
        for scope in ["container", "hierarchy"] {
            self.add(
                "container_memory_failures_total",
                &["pgfault", scope],
                m("pgfault"),
            );
            self.add(
                "container_memory_failures_total",
                &["pgmajfault", scope],
                m("pgmajfault"),
            );
        }
        self.add(
            "container_oom_events_total",
            &[],
            events.get("oom_kill").copied().unwrap_or(0),
        );
    }

    /// Reads and writes by device (`io.stat`), in bytes and operations.
    fn io(&mut self, cg: &Cgroup) {
        for (device, io) in io_stat(cg) {
            let v = |k: &str| io.get(k).copied().unwrap_or(0);
            self.add("container_fs_reads_bytes_total", &[&device], v("rbytes"));
            self.add("container_fs_reads_total", &[&device], v("rios"));
            self.add("container_fs_writes_bytes_total", &[&device], v("wbytes"));
            self.add("container_fs_writes_total", &[&device], v("wios"));
            let (major, minor) = device.split_once(':').unwrap_or((&device, ""));
            for (op, k) in [("Read", "rbytes"), ("Write", "wbytes")] {
                self.add(
                    "container_blkio_device_usage_total",
                    &[&device, major, minor, op],
                    v(k),
                );
            }
        }
    }

    /// Processes and threads (and the most there may be), and their open descriptors and
    /// sockets.
    fn processes(&mut self, cg: &Cgroup) {
        let pids = cg.pids();
        self.add(
            "container_processes",
            &[],
            cg.number("pids.current").unwrap_or(pids.len() as u64),
        );
        let threads = cg
            .read("cgroup.threads")
            .map(|t| t.lines().count() as u64)
            .unwrap_or(0);
        self.add("container_threads", &[], threads);
        self.add(
            "container_threads_max",
            &[],
            cg.number("pids.max").unwrap_or(0),
        );
        let (fds, sockets) = descriptors_of(&pids);
        self.add("container_file_descriptors", &[], fds);
        self.add("container_sockets", &[], sockets);
    }

    /// Time waited for CPU, memory and I/O (pressure stall information), where the kernel
    /// keeps it.
    fn pressure(&mut self, cg: &Cgroup) {
        for (resource, waiting, stalled) in [
            (
                "cpu",
                "container_pressure_cpu_waiting_seconds_total",
                "container_pressure_cpu_stalled_seconds_total",
            ),
            (
                "memory",
                "container_pressure_memory_waiting_seconds_total",
                "container_pressure_memory_stalled_seconds_total",
            ),
            (
                "io",
                "container_pressure_io_waiting_seconds_total",
                "container_pressure_io_stalled_seconds_total",
            ),
        ] {
            let text = std::fs::read_to_string(cg.path.join(format!("{resource}.pressure")));
            if let Some(p) = text.ok().as_deref().and_then(psi) {
                self.add(waiting, &[], p.some.total / 1_000_000_000);
                self.add(stalled, &[], p.full.total / 1_000_000_000);
            }
        }
    }

    /// The limits set on the cgroup: CPU quota, period and shares, memory limit, reservation
    /// and swap limit.
    fn limits(&mut self, cg: &Cgroup) {
        let spec = |file: &str| cg.number(file).unwrap_or(0);
        if let Ok(cpu_max) = cg.read("cpu.max") {
            let mut parts = cpu_max.split_whitespace();
            let quota = parts.next().and_then(|q| q.parse().ok()).unwrap_or(0);
            let period = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
            self.add("container_spec_cpu_period", &[], period);
            self.add("container_spec_cpu_quota", &[], quota);
        }
        if let Some(w) = cg.number("cpu.weight") {
            self.add(
                "container_spec_cpu_shares",
                &[],
                crate::runtime::cgroup::cpu_shares(w) as u64,
            );
        }
        self.add("container_spec_memory_limit_bytes", &[], spec("memory.max"));
        self.add(
            "container_spec_memory_reservation_limit_bytes",
            &[],
            spec("memory.low"),
        );
        self.add(
            "container_spec_memory_swap_limit_bytes",
            &[],
            spec("memory.swap.max"),
        );
    }

    /// Traffic, errors and drops of each interface of a pod's network namespace.
    fn network(&mut self, net: &NetworkUsage) {
        for i in &net.interfaces {
            let name = [i.name.as_str()];
            let v = |x: Option<u64>| x.unwrap_or(0);
            self.add(
                "container_network_receive_bytes_total",
                &name,
                v(i.rx_bytes),
            );
            self.add(
                "container_network_receive_errors_total",
                &name,
                v(i.rx_errors),
            );
            self.add(
                "container_network_transmit_bytes_total",
                &name,
                v(i.tx_bytes),
            );
            self.add(
                "container_network_transmit_errors_total",
                &name,
                v(i.tx_errors),
            );
            self.add(
                "container_network_receive_packets_total",
                &name,
                v(i.rx_packets),
            );
            self.add(
                "container_network_receive_packets_dropped_total",
                &name,
                v(i.rx_dropped),
            );
            self.add(
                "container_network_transmit_packets_total",
                &name,
                v(i.tx_packets),
            );
            self.add(
                "container_network_transmit_packets_dropped_total",
                &name,
                v(i.tx_dropped),
            );
        }
    }
}

/// `io.stat` by device (`major:minor`): each line's `key=value` counters.
fn io_stat(cg: &Cgroup) -> Vec<(String, BTreeMap<String, u64>)> {
    let Ok(text) = cg.read("io.stat") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let device = words.next()?.to_string();
            let values = words
                .filter_map(|w| {
                    let (k, v) = w.split_once('=')?;
                    Some((k.to_string(), v.parse().ok()?))
                })
                .collect();
            Some((device, values))
        })
        .collect()
}

/// Open descriptors, and how many of them are sockets, of the processes `pids`.
fn descriptors_of(pids: &[i32]) -> (u64, u64) {
    let (mut fds, mut sockets) = (0, 0);
    for pid in pids {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        for e in dir.flatten() {
            fds += 1;
            if std::fs::read_link(e.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// Seconds since the epoch of a time in nanoseconds.
fn seconds(nanos: i64) -> u64 {
    (nanos.max(0) / 1_000_000_000) as u64
}

impl ContainerService {
    /// Metrics of one running container: its cgroup's, its writable layer's and its times.
    fn container_metrics(&self, pod: &sandbox::Record, r: &Record) -> Vec<Metric> {
        let meta = pod.config.metadata.clone().unwrap_or_default();
        let image = r
            .config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let mut s = Samples::new(vec![
            meta.name,
            meta.namespace,
            r.config.name().to_string(),
            r.id.clone(),
            image,
        ]);
        if let Some(cg) = &r.cgroup {
            s.cgroup(cg);
        }
        let layer = self.bundle(&r.id).layer;
        let (bytes, _) = match r.project {
            Some(_) => self.inner.layer_usage.measure(&layer, r.project),
            None => self.inner.samples.layer(&layer.join("upper")),
        };
        // The writable layers' filesystem, as io.stat names devices.
        let device = std::fs::metadata(&self.inner.layers)
            .map(|m| {
                use std::os::unix::fs::MetadataExt;
                let dev = m.dev();
                format!(
                    "{}:{}",
                    nix::sys::stat::major(dev),
                    nix::sys::stat::minor(dev)
                )
            })
            .unwrap_or_default();
        let d = [device.as_str()];
        s.add("container_fs_usage_bytes", &d, bytes);
        if let Ok(st) = nix::sys::statvfs::statvfs(&self.inner.layers) {
            let frsize = st.fragment_size();
            s.add("container_fs_limit_bytes", &d, st.blocks() * frsize);
            s.add("container_fs_inodes_total", &d, st.files());
            s.add("container_fs_inodes_free", &d, st.files_free());
        }
        s.add("container_last_seen", &[], seconds(now_nanos()));
        s.add("container_start_time_seconds", &[], seconds(r.started_at));
        s.out
    }

    /// cadvisor-shaped metrics of every ready pod (its cgroup's and network's) and its running
    /// containers.
    pub async fn pod_metrics(&self) -> Vec<PodMetrics> {
        let mut out = Vec::new();
        for p in self.inner.sandboxes.list(None).await {
            if p.state != sandbox::PodState::Ready {
                continue;
            }
            let Ok(sb) = self.inner.sandboxes.get(&p.id).await else {
                continue;
            };
            let meta = sb.config.metadata.clone().unwrap_or_default();
            let mut s = Samples::new(vec![
                meta.name,
                meta.namespace,
                String::new(),
                sb.id.clone(),
                String::new(),
            ]);
            if let Some(cg) = &sb.cgroup {
                s.cgroup(cg);
            }
            if let Some(net) = sb.pause.filter(|p| p.alive()).and_then(|p| network(p.pid)) {
                s.network(&net);
            }
            let mut container_metrics = Vec::new();
            for cid in self.in_sandbox(&sb.id).await {
                let Ok(entry) = self.entry(&cid) else {
                    continue;
                };
                let r = entry.lock().await;
                if r.state == ContainerState::Running {
                    container_metrics.push((r.id.clone(), self.container_metrics(&sb, &r)));
                }
            }
            out.push(PodMetrics {
                pod_sandbox_id: sb.id.clone(),
                metrics: s.out,
                container_metrics,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::metrics::descriptors;

    #[test]
    fn every_sample_has_its_descriptors_labels() {
        let descs = descriptors();
        assert_eq!(descs.len(), METRICS.len());
        assert!(
            descs
                .iter()
                .all(|d| !d.label_keys.is_empty() && !d.help.is_empty())
        );
        let mut s = Samples::new(vec![
            "p".into(),
            "ns".into(),
            "c".into(),
            "id".into(),
            "i".into(),
        ]);
        let n = network(std::process::id() as i32).unwrap();
        s.network(&n);
        s.add(
            "container_memory_failures_total",
            &["pgfault", "container"],
            1,
        );
        for m in &s.out {
            let d = descs.iter().find(|d| d.name == m.name).unwrap();
            assert_eq!(d.label_keys.len(), m.label_values.len(), "{}", m.name);
        }
        assert_eq!(
            s.out
                .iter()
                .filter(|m| m.name.starts_with("container_network"))
                .count(),
            n.interfaces.len() * 8
        );
    }
}
