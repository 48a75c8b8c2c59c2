//! The cadvisor-style metrics of ListPodSandboxMetrics and ListMetricDescriptors, in crius's own
//! terms (`cri` makes CRI's messages of them): CPU, memory, swap and processes from each pod's
//! and running container's cgroup, network bytes from the pod's network namespace.

use super::ContainerService;
use super::config::ContainerState;
use super::stats::{NetworkUsage, network};
use crate::records::now_nanos;
use crate::runtime::cgroup::Cgroup;

/// Whether a metric only grows or may go either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

/// One sample of a metric, with its label values (in its descriptor's order).
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub name: String,
    pub timestamp: i64,
    pub kind: MetricKind,
    pub label_values: Vec<String>,
    pub value: u64,
}

/// A metric's name, help and label keys.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricDescriptor {
    pub name: String,
    pub help: String,
    pub label_keys: Vec<String>,
}

/// A pod's metrics and its running containers'.
#[derive(Debug, Clone, PartialEq)]
pub struct PodMetrics {
    pub pod_sandbox_id: String,
    pub metrics: Vec<Metric>,
    /// Each container's ID with its metrics.
    pub container_metrics: Vec<(String, Vec<Metric>)>,
}

/// The metrics ListPodSandboxMetrics reports, with cadvisor's names and help.
pub const METRICS: [(&str, &str, MetricKind); 9] = [
    (
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed in seconds.",
        MetricKind::Counter,
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
        MetricKind::Gauge,
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set in bytes.",
        MetricKind::Gauge,
    ),
    (
        "container_memory_rss",
        "Size of RSS in bytes.",
        MetricKind::Gauge,
    ),
    (
        "container_memory_swap",
        "Container swap usage in bytes.",
        MetricKind::Gauge,
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit for the container.",
        MetricKind::Gauge,
    ),
    (
        "container_processes",
        "Number of processes running inside the container.",
        MetricKind::Gauge,
    ),
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
        MetricKind::Counter,
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
        MetricKind::Counter,
    ),
];

pub fn descriptors() -> Vec<MetricDescriptor> {
    METRICS
        .iter()
        .map(|(name, help, _)| MetricDescriptor {
            name: (*name).into(),
            help: (*help).into(),
            label_keys: if name.starts_with("container_network") {
                vec!["interface".into()]
            } else {
                Vec::new()
            },
        })
        .collect()
}

fn metric(name: &str, labels: Vec<String>, value: u64) -> Metric {
    let kind = METRICS
        .iter()
        .find(|m| m.0 == name)
        .map(|m| m.2)
        .unwrap_or(MetricKind::Gauge);
    Metric {
        name: name.into(),
        timestamp: now_nanos(),
        kind,
        label_values: labels,
        value,
    }
}

/// Metrics of one cgroup (a container's or a pod's).
pub fn cgroup_metrics(cg: &Cgroup) -> Vec<Metric> {
    let stat = cg.keyed("memory.stat");
    let usage = cg.number("memory.current").unwrap_or(0);
    let mut out = vec![
        metric(
            "container_cpu_usage_seconds_total",
            vec![],
            cg.keyed("cpu.stat").get("usage_usec").copied().unwrap_or(0) / 1_000_000,
        ),
        metric("container_memory_usage_bytes", vec![], usage),
        metric(
            "container_memory_working_set_bytes",
            vec![],
            usage.saturating_sub(stat.get("inactive_file").copied().unwrap_or(0)),
        ),
        metric(
            "container_memory_rss",
            vec![],
            stat.get("anon").copied().unwrap_or(0),
        ),
        metric(
            "container_memory_swap",
            vec![],
            cg.number("memory.swap.current").unwrap_or(0),
        ),
        metric(
            "container_processes",
            vec![],
            cg.number("pids.current").unwrap_or(0),
        ),
    ];
    if let Some(limit) = cg.number("memory.max") {
        out.push(metric("container_spec_memory_limit_bytes", vec![], limit));
    }
    out
}

pub fn network_metrics(net: &NetworkUsage) -> Vec<Metric> {
    let mut out = Vec::new();
    for i in &net.interfaces {
        let val = |x: &Option<u64>| x.unwrap_or(0);
        out.push(metric(
            "container_network_receive_bytes_total",
            vec![i.name.clone()],
            val(&i.rx_bytes),
        ));
        out.push(metric(
            "container_network_transmit_bytes_total",
            vec![i.name.clone()],
            val(&i.tx_bytes),
        ));
    }
    out
}

impl ContainerService {
    /// cadvisor-style metrics of every ready pod and its running containers.
    pub async fn pod_metrics(&self) -> Vec<PodMetrics> {
        let mut out = Vec::new();
        for p in self.inner.sandboxes.list(None).await {
            if p.state != crate::sandbox::PodState::Ready {
                continue;
            }
            let Ok(sb) = self.inner.sandboxes.get(&p.id).await else {
                continue;
            };
            let mut metrics = sb.cgroup.as_ref().map(cgroup_metrics).unwrap_or_default();
            if let Some(net) = sb.pause.filter(|p| p.alive()).and_then(|p| network(p.pid)) {
                metrics.extend(network_metrics(&net));
            }
            let mut container_metrics = Vec::new();
            for cid in self.in_sandbox(&sb.id).await {
                let Ok(entry) = self.entry(&cid) else {
                    continue;
                };
                let r = entry.lock().await;
                if r.state == ContainerState::Running
                    && let Some(cg) = &r.cgroup
                {
                    container_metrics.push((r.id.clone(), cgroup_metrics(cg)));
                }
            }
            out.push(PodMetrics {
                pod_sandbox_id: sb.id.clone(),
                metrics,
                container_metrics,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_has_a_descriptor() {
        assert_eq!(descriptors().len(), METRICS.len());
    }
}
