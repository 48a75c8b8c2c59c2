//! The cadvisor-shaped metrics of ListMetricDescriptors and ListPodSandboxMetrics (what kubelet
//! serves at `/metrics/cadvisor` with the CRI stats provider), in crius's own terms (`cri` makes
//! CRI's messages of them). Every metric carries the pod, its namespace, the container, its ID
//! and its image as labels (network metrics the interface too, disk ones the device); values
//! come from each pod's and running container's cgroup (CPU, memory, swap, I/O, pressure,
//! processes), the writable layer's filesystem, the pod's network namespace and the
//! container's processes in /proc. This file holds the metrics' types and catalogue;
//! `metric_samples` takes the samples and gathers them by pod and container.

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

/// The labels every metric has, in this order.
const BASE: [&str; 5] = ["pod", "namespace", "container", "id", "image"];

use MetricKind::{Counter, Gauge};

/// Each metric: name, help, kind, and the label keys it has beyond `BASE`.
pub const METRICS: &[(&str, &str, MetricKind, &[&str])] = &[
    (
        "container_cpu_usage_seconds_total",
        "CPU time used, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_cpu_user_seconds_total",
        "CPU time used in user mode, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_cpu_system_seconds_total",
        "CPU time used in the kernel, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_cpu_cfs_periods_total",
        "CFS enforcement periods that have passed.",
        Counter,
        &[],
    ),
    (
        "container_cpu_cfs_throttled_periods_total",
        "CFS periods in which the container was throttled.",
        Counter,
        &[],
    ),
    (
        "container_cpu_cfs_throttled_seconds_total",
        "Time the container was throttled, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_memory_cache",
        "Page cache memory, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_rss",
        "Anonymous memory, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_kernel_usage",
        "Kernel memory, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_mapped_file",
        "Memory of mapped files, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_swap",
        "Swap in use, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_failcnt",
        "Times the memory limit was reached.",
        Counter,
        &[],
    ),
    (
        "container_memory_usage_bytes",
        "Memory in use, in bytes, whatever its kind.",
        Gauge,
        &[],
    ),
    (
        "container_memory_max_usage_bytes",
        "Most memory ever in use, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_working_set_bytes",
        "Memory in use less inactive file cache, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_memory_failures_total",
        "Page faults, by type and scope.",
        Counter,
        &["failure_type", "scope"],
    ),
    (
        "container_oom_events_total",
        "Processes the OOM killer ended.",
        Counter,
        &[],
    ),
    (
        "container_network_receive_bytes_total",
        "Bytes received.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_receive_packets_total",
        "Packets received.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_receive_packets_dropped_total",
        "Received packets dropped.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_receive_errors_total",
        "Errors while receiving.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_transmit_bytes_total",
        "Bytes sent.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_transmit_packets_total",
        "Packets sent.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_transmit_packets_dropped_total",
        "Packets dropped while sending.",
        Counter,
        &["interface"],
    ),
    (
        "container_network_transmit_errors_total",
        "Errors while sending.",
        Counter,
        &["interface"],
    ),
    (
        "container_fs_usage_bytes",
        "Bytes the writable layer holds.",
        Gauge,
        &["device"],
    ),
    (
        "container_fs_limit_bytes",
        "Bytes the writable layer's filesystem can hold.",
        Gauge,
        &["device"],
    ),
    (
        "container_fs_inodes_total",
        "Inodes of the writable layer's filesystem.",
        Gauge,
        &["device"],
    ),
    (
        "container_fs_inodes_free",
        "Free inodes of the writable layer's filesystem.",
        Gauge,
        &["device"],
    ),
    (
        "container_fs_reads_bytes_total",
        "Bytes read, by device.",
        Counter,
        &["device"],
    ),
    (
        "container_fs_reads_total",
        "Reads completed, by device.",
        Counter,
        &["device"],
    ),
    (
        "container_fs_writes_bytes_total",
        "Bytes written, by device.",
        Counter,
        &["device"],
    ),
    (
        "container_fs_writes_total",
        "Writes completed, by device.",
        Counter,
        &["device"],
    ),
    (
        "container_blkio_device_usage_total",
        "Bytes moved, by device and direction.",
        Counter,
        &["device", "major", "minor", "operation"],
    ),
    ("container_processes", "Processes running.", Gauge, &[]),
    ("container_threads", "Threads running.", Gauge, &[]),
    (
        "container_threads_max",
        "Most threads allowed (0: no limit).",
        Gauge,
        &[],
    ),
    (
        "container_file_descriptors",
        "Open file descriptors.",
        Gauge,
        &[],
    ),
    ("container_sockets", "Open sockets.", Gauge, &[]),
    (
        "container_last_seen",
        "When the container was last seen, in seconds since the epoch.",
        Gauge,
        &[],
    ),
    (
        "container_start_time_seconds",
        "When the container started, in seconds since the epoch.",
        Gauge,
        &[],
    ),
    (
        "container_spec_cpu_period",
        "CFS period asked for, in microseconds.",
        Gauge,
        &[],
    ),
    (
        "container_spec_cpu_quota",
        "CFS quota asked for, in microseconds.",
        Gauge,
        &[],
    ),
    (
        "container_spec_cpu_shares",
        "CPU shares asked for.",
        Gauge,
        &[],
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_spec_memory_reservation_limit_bytes",
        "Memory kept from reclaim (memory.low), in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_spec_memory_swap_limit_bytes",
        "Swap limit, in bytes.",
        Gauge,
        &[],
    ),
    (
        "container_pressure_cpu_waiting_seconds_total",
        "Time some tasks waited for CPU, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_pressure_cpu_stalled_seconds_total",
        "Time all tasks waited for CPU, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_pressure_memory_waiting_seconds_total",
        "Time some tasks waited for memory, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_pressure_memory_stalled_seconds_total",
        "Time all tasks waited for memory, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_pressure_io_waiting_seconds_total",
        "Time some tasks waited for I/O, in seconds.",
        Counter,
        &[],
    ),
    (
        "container_pressure_io_stalled_seconds_total",
        "Time all tasks waited for I/O, in seconds.",
        Counter,
        &[],
    ),
];

/// The descriptor of every metric, as ListMetricDescriptors answers.
pub fn descriptors() -> Vec<MetricDescriptor> {
    METRICS
        .iter()
        .map(|(name, help, _, extra)| MetricDescriptor {
            name: (*name).into(),
            help: (*help).into(),
            label_keys: BASE
                .iter()
                .chain(extra.iter())
                .map(|k| k.to_string())
                .collect(),
        })
        .collect()
}
