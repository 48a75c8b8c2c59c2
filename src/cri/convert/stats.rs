//! Container and pod statistics, and metrics.

use crate::cri::v1 as cri;

use super::cri_pod_metadata;
use crate::container::metrics::{Metric, MetricDescriptor, MetricKind, PodMetrics};
use crate::container::stats::{
    ContainerStats, CpuUsage, InterfaceUsage, IoUsage, MemoryUsage, NetworkUsage, PodStats,
    ProcessUsage, Psi, PsiData, StatsFilter, SwapUsage,
};

fn psi_data(d: &PsiData) -> cri::PsiData {
    cri::PsiData {
        total: d.total,
        avg10: d.avg10,
        avg60: d.avg60,
        avg300: d.avg300,
    }
}

fn psi(p: &Psi) -> cri::PsiStats {
    cri::PsiStats {
        full: Some(psi_data(&p.full)),
        some: Some(psi_data(&p.some)),
    }
}

fn io(i: &IoUsage) -> cri::IoUsage {
    cri::IoUsage {
        timestamp: i.timestamp,
        psi: i.psi.as_ref().map(psi),
    }
}

fn v(x: Option<u64>) -> Option<cri::UInt64Value> {
    x.map(|value| cri::UInt64Value { value })
}

fn cpu(c: &CpuUsage) -> cri::CpuUsage {
    cri::CpuUsage {
        timestamp: c.timestamp,
        usage_core_nano_seconds: v(c.usage_core_nano_seconds),
        usage_nano_cores: v(c.usage_nano_cores),
        psi: c.psi.as_ref().map(psi),
    }
}

fn memory(m: &MemoryUsage) -> cri::MemoryUsage {
    cri::MemoryUsage {
        timestamp: m.timestamp,
        working_set_bytes: v(m.working_set_bytes),
        available_bytes: v(m.available_bytes),
        usage_bytes: v(m.usage_bytes),
        rss_bytes: v(m.rss_bytes),
        page_faults: v(m.page_faults),
        major_page_faults: v(m.major_page_faults),
        psi: m.psi.as_ref().map(psi),
    }
}

fn swap(s: &SwapUsage) -> cri::SwapUsage {
    cri::SwapUsage {
        timestamp: s.timestamp,
        swap_available_bytes: v(s.swap_available_bytes),
        swap_usage_bytes: v(s.swap_usage_bytes),
    }
}

fn process(p: &ProcessUsage) -> cri::ProcessUsage {
    cri::ProcessUsage {
        timestamp: p.timestamp,
        process_count: v(p.process_count),
    }
}

fn interface(i: &InterfaceUsage) -> cri::NetworkInterfaceUsage {
    cri::NetworkInterfaceUsage {
        name: i.name.clone(),
        rx_bytes: v(i.rx_bytes),
        rx_errors: v(i.rx_errors),
        tx_bytes: v(i.tx_bytes),
        tx_errors: v(i.tx_errors),
    }
}

fn network(n: &NetworkUsage) -> cri::NetworkUsage {
    cri::NetworkUsage {
        timestamp: n.timestamp,
        default_interface: n.default_interface.as_ref().map(interface),
        interfaces: n.interfaces.iter().map(interface).collect(),
    }
}

pub fn cri_container_stats(s: &ContainerStats) -> cri::ContainerStats {
    let l = &s.writable_layer;
    cri::ContainerStats {
        attributes: Some(cri::ContainerAttributes {
            id: s.id.clone(),
            metadata: s.metadata.as_ref().map(|m| cri::ContainerMetadata {
                name: m.name.clone(),
                attempt: m.attempt,
            }),
            labels: s.labels.clone(),
            annotations: s.annotations.clone(),
        }),
        cpu: s.cpu.as_ref().map(cpu),
        memory: s.memory.as_ref().map(memory),
        writable_layer: Some(cri::FilesystemUsage {
            timestamp: l.timestamp,
            fs_id: Some(cri::FilesystemIdentifier {
                mountpoint: l.mountpoint.clone(),
            }),
            used_bytes: Some(cri::UInt64Value {
                value: l.used_bytes,
            }),
            inodes_used: Some(cri::UInt64Value {
                value: l.inodes_used,
            }),
        }),
        swap: s.swap.as_ref().map(swap),
        io: s.io.as_ref().map(io),
    }
}

pub fn cri_pod_stats(s: &PodStats) -> cri::PodSandboxStats {
    cri::PodSandboxStats {
        attributes: Some(cri::PodSandboxAttributes {
            id: s.id.clone(),
            metadata: s.metadata.as_ref().map(cri_pod_metadata),
            labels: s.labels.clone(),
            annotations: s.annotations.clone(),
        }),
        linux: Some(cri::LinuxPodSandboxStats {
            cpu: s.cpu.as_ref().map(cpu),
            memory: s.memory.as_ref().map(memory),
            network: s.network.as_ref().map(network),
            process: s.process.as_ref().map(process),
            io: s.io.as_ref().map(io),
            containers: s.containers.iter().map(cri_container_stats).collect(),
        }),
        windows: None,
    }
}

pub fn container_stats_filter(f: cri::ContainerStatsFilter) -> StatsFilter {
    StatsFilter {
        id: f.id,
        pod_sandbox_id: f.pod_sandbox_id,
        label_selector: f.label_selector,
    }
}

pub fn pod_stats_filter(f: cri::PodSandboxStatsFilter) -> StatsFilter {
    StatsFilter {
        id: f.id,
        pod_sandbox_id: String::new(),
        label_selector: f.label_selector,
    }
}

fn metric(m: &Metric) -> cri::Metric {
    cri::Metric {
        name: m.name.clone(),
        timestamp: m.timestamp,
        metric_type: match m.kind {
            MetricKind::Counter => cri::MetricType::Counter as i32,
            MetricKind::Gauge => cri::MetricType::Gauge as i32,
        },
        label_values: m.label_values.clone(),
        value: Some(cri::UInt64Value { value: m.value }),
    }
}

pub fn cri_descriptor(d: &MetricDescriptor) -> cri::MetricDescriptor {
    cri::MetricDescriptor {
        name: d.name.clone(),
        help: d.help.clone(),
        label_keys: d.label_keys.clone(),
    }
}

pub fn cri_pod_metrics(p: &PodMetrics) -> cri::PodSandboxMetrics {
    cri::PodSandboxMetrics {
        pod_sandbox_id: p.pod_sandbox_id.clone(),
        metrics: p.metrics.iter().map(metric).collect(),
        container_metrics: p
            .container_metrics
            .iter()
            .map(|(id, ms)| cri::ContainerMetrics {
                container_id: id.clone(),
                metrics: ms.iter().map(metric).collect(),
            })
            .collect(),
    }
}
