//! A pod as NRI plugins see it (`nri::api::PodSandbox`), and resources in NRI's terms.

use std::collections::HashMap;

use super::Record;
use super::config::Resources;
use crate::nri::api;

impl Record {
    /// The pod as NRI plugins are told of it; `ips` from its network attachment.
    pub fn nri(&self, ips: Vec<String>) -> api::PodSandbox {
        let meta = self.config.metadata.clone().unwrap_or_default();
        let linux = self.config.linux.as_ref();
        let namespaces = self
            .pause
            .map(|p| {
                self.namespaces
                    .iter()
                    .map(|kind| api::LinuxNamespace {
                        r#type: nri_namespace(kind).to_string(),
                        path: format!("/proc/{}/ns/{kind}", p.pid),
                    })
                    .collect()
            })
            .unwrap_or_default();
        api::PodSandbox {
            id: self.id.clone(),
            name: meta.name,
            uid: meta.uid,
            namespace: meta.namespace,
            labels: self.config.labels.clone(),
            annotations: self.config.annotations.clone(),
            runtime_handler: self.runtime_handler.clone(),
            linux: Some(api::LinuxPodSandbox {
                pod_overhead: linux.and_then(|l| l.overhead.as_ref()).map(nri_resources),
                pod_resources: linux.and_then(|l| l.resources.as_ref()).map(nri_resources),
                cgroup_parent: linux.map(|l| l.cgroup_parent.clone()).unwrap_or_default(),
                cgroups_path: self
                    .cgroup
                    .as_ref()
                    .map(|c| c.path.display().to_string())
                    .unwrap_or_default(),
                namespaces,
                resources: None,
            }),
            pid: self.pause.map_or(0, |p| p.pid as u32),
            ips,
        }
    }
}

/// A namespace kind as the OCI spec (and NRI) names it.
fn nri_namespace(kind: &str) -> &str {
    match kind {
        "net" => "network",
        "mnt" => "mount",
        other => other,
    }
}

/// CRI-shaped resources in NRI's terms.
pub fn nri_resources(r: &Resources) -> api::LinuxResources {
    let i64v = |v: i64| (v != 0).then_some(api::OptionalInt64 { value: v });
    let u64v = |v: i64| (v > 0).then_some(api::OptionalUInt64 { value: v as u64 });
    api::LinuxResources {
        memory: Some(api::LinuxMemory {
            limit: i64v(r.memory_limit_in_bytes),
            swap: i64v(r.memory_swap_limit_in_bytes),
            ..Default::default()
        }),
        cpu: Some(api::LinuxCpu {
            shares: u64v(r.cpu_shares),
            quota: i64v(r.cpu_quota),
            period: u64v(r.cpu_period),
            cpus: r.cpuset_cpus.clone(),
            mems: r.cpuset_mems.clone(),
            ..Default::default()
        }),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| api::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        ..Default::default()
    }
}

/// NRI's resource adjustment laid over CRI-shaped resources (what the cgroup files are
/// written from).
pub fn adjust_resources(r: &mut Resources, a: &api::LinuxResources) {
    if let Some(m) = &a.memory {
        if let Some(l) = &m.limit {
            r.memory_limit_in_bytes = l.value;
        }
        if let Some(s) = &m.swap {
            r.memory_swap_limit_in_bytes = s.value;
        }
    }
    if let Some(c) = &a.cpu {
        if let Some(s) = &c.shares {
            r.cpu_shares = s.value as i64;
        }
        if let Some(q) = &c.quota {
            r.cpu_quota = q.value;
        }
        if let Some(p) = &c.period {
            r.cpu_period = p.value as i64;
        }
        if !c.cpus.is_empty() {
            r.cpuset_cpus = c.cpus.clone();
        }
        if !c.mems.is_empty() {
            r.cpuset_mems = c.mems.clone();
        }
    }
    let unified: HashMap<String, String> = a.unified.clone();
    r.unified.extend(unified);
    if let Some(p) = &a.pids {
        r.unified
            .insert("pids.max".to_string(), p.limit.to_string());
    }
}
