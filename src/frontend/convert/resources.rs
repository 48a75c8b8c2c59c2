//! Resources: a container's requests and limits read as kubelet does, the pod's QoS class, and
//! from them the CRI resources of a container (shares, quota, memory, hugepages,
//! `oom_score_adj`, swap) and of the pod's cgroup.

use std::collections::BTreeMap;

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

use super::{Node, PodContext, SwapBehavior, all_containers};
use crate::frontend::quantity;

fn millis(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> u64 {
    q.and_then(|q| quantity::parse(&q.0).ok())
        .map(|q| q.milli())
        .unwrap_or(0)
}

fn bytes(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> u64 {
    q.and_then(|q| quantity::parse(&q.0).ok())
        .map(|q| q.value())
        .unwrap_or(0)
}

/// A container's (request, limit) of a resource, the request defaulting to the limit.
pub(super) fn req_lim(r: Option<&ResourceRequirements>, name: &str, cpu: bool) -> (u64, u64) {
    let get =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            let q = m.and_then(|m| m.get(name));
            if cpu { millis(q) } else { bytes(q) }
        };
    let lim = get(r.and_then(|r| r.limits.as_ref()));
    let mut req = get(r.and_then(|r| r.requests.as_ref()));
    let has_req = r
        .and_then(|r| r.requests.as_ref())
        .is_some_and(|m| m.contains_key(name));
    if !has_req && lim > 0 {
        req = lim;
    }
    (req, lim)
}

/// The pod's QoS class: Guaranteed when every container has equal CPU and memory requests and
/// limits, BestEffort when none has any, else Burstable.
pub fn qos(spec: &PodSpec) -> &'static str {
    let mut any = false;
    let mut guaranteed = true;
    for c in all_containers(spec) {
        let r = c.resources.as_ref();
        let has = |m: Option<&BTreeMap<String, _>>| {
            m.is_some_and(|m| m.keys().any(|k| k == "cpu" || k == "memory"))
        };
        if has(r.and_then(|r| r.requests.as_ref())) || has(r.and_then(|r| r.limits.as_ref())) {
            any = true;
        }
        for res in ["cpu", "memory"] {
            let (req, lim) = req_lim(r, res, res == "cpu");
            if lim == 0 || req != lim {
                guaranteed = false;
            }
        }
    }
    if !any {
        "BestEffort"
    } else if guaranteed {
        "Guaranteed"
    } else {
        "Burstable"
    }
}

/// kubelet's oom_score_adj for a container of a pod of this class.
pub fn oom_score_adj(qos: &str, memory_request: u64, node_memory: u64) -> i64 {
    match qos {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            if node_memory == 0 {
                return 999;
            }
            let adj = 1000 - (1000 * memory_request as i128 / node_memory as i128) as i64;
            adj.clamp(2, 999)
        }
    }
}

/// cpu.shares from millicores (kubelet's MilliCPUToShares).
fn shares(milli: u64) -> i64 {
    if milli == 0 {
        return 2;
    }
    ((milli * 1024) / 1000).max(2) as i64
}

const CPU_PERIOD: i64 = 100_000;

fn quota(milli: u64) -> i64 {
    ((milli as i64 * CPU_PERIOD) / 1000).max(1000)
}

/// A container's CRI resources.
pub fn container_resources(ctx: &PodContext, c: &Container) -> cri::LinuxContainerResources {
    let r = c.resources.as_ref();
    let (cpu_req, cpu_lim) = req_lim(r, "cpu", true);
    let (mem_req, mem_lim) = req_lim(r, "memory", false);
    let class = qos(ctx.spec);
    let mut out = cri::LinuxContainerResources {
        cpu_shares: shares(cpu_req),
        cpu_period: if cpu_lim > 0 { CPU_PERIOD } else { 0 },
        cpu_quota: if cpu_lim > 0 { quota(cpu_lim) } else { 0 },
        memory_limit_in_bytes: mem_lim as i64,
        oom_score_adj: oom_score_adj(class, mem_req, ctx.node.memory),
        ..Default::default()
    };
    for (name, q) in r.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
        if let Some(size) = name.strip_prefix("hugepages-") {
            out.hugepage_limits.push(cri::HugepageLimit {
                page_size: size.replace("Mi", "MB").replace("Gi", "GB"),
                limit: quantity::parse(&q.0).map(|q| q.value()).unwrap_or(0),
            });
        }
    }
    if ctx.node.cgroup_v2 {
        out.unified.insert(
            "memory.swap.max".into(),
            swap_limit(ctx.node, class, mem_req, mem_lim).to_string(),
        );
    }
    out
}

/// The swap a container may use: none under NoSwap; under LimitedSwap, for Burstable pods'
/// containers whose memory request differs from the limit, its share of the node's swap in the
/// proportion of its request to the node's memory.
pub fn swap_limit(node: &Node, qos: &str, mem_req: u64, mem_lim: u64) -> u64 {
    if node.swap_behavior == SwapBehavior::NoSwap || qos != "Burstable" {
        return 0;
    }
    if mem_req == 0 || mem_req == mem_lim || node.memory == 0 || mem_req > node.memory {
        return 0;
    }
    ((mem_req as f64 / node.memory as f64) * node.swap as f64) as u64
}

/// The pod's overall resources for its cgroup: the larger of the biggest init container and the
/// sum of the others, for limits only when every container has one.
pub fn pod_resources(spec: &PodSpec) -> cri::LinuxContainerResources {
    let mut out = cri::LinuxContainerResources::default();
    let (mut cpu_sum, mut mem_sum, mut cpu_lim_sum, mut mem_lim_sum) = (0u64, 0u64, 0u64, 0u64);
    let (mut all_cpu, mut all_mem) = (true, true);
    let (mut cpu_init, mut mem_init, mut cpu_lim_init, mut mem_lim_init) = (0u64, 0u64, 0u64, 0u64);
    for c in all_containers(spec) {
        let r = c.resources.as_ref();
        let (cr, cl) = req_lim(r, "cpu", true);
        let (mr, ml) = req_lim(r, "memory", false);
        all_cpu &= cl > 0;
        all_mem &= ml > 0;
        let regular_init = spec
            .init_containers
            .iter()
            .flatten()
            .any(|i| i.name == c.name && i.restart_policy.as_deref() != Some("Always"));
        if regular_init {
            cpu_init = cpu_init.max(cr);
            mem_init = mem_init.max(mr);
            cpu_lim_init = cpu_lim_init.max(cl);
            mem_lim_init = mem_lim_init.max(ml);
        } else {
            cpu_sum += cr;
            mem_sum += mr;
            cpu_lim_sum += cl;
            mem_lim_sum += ml;
        }
    }
    out.cpu_shares = shares(cpu_sum.max(cpu_init));
    if all_cpu {
        out.cpu_period = CPU_PERIOD;
        out.cpu_quota = quota(cpu_lim_sum.max(cpu_lim_init));
    }
    if all_mem {
        out.memory_limit_in_bytes = mem_lim_sum.max(mem_lim_init) as i64;
    }
    let _ = mem_sum;
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::convert::testing::{node, pod};

    #[test]
    fn qos_classes_and_oom() {
        let g = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec:\n  containers:\n  - {name: a, image: b, resources: {limits: {cpu: 1, memory: 1Gi}}}\n",
        );
        assert_eq!(qos(g.spec.as_ref().unwrap()), "Guaranteed");
        let b = pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec:\n  containers:\n  - {name: a, image: b}\n",
        );
        assert_eq!(qos(b.spec.as_ref().unwrap()), "BestEffort");
        assert_eq!(oom_score_adj("Guaranteed", 0, 1), -997);
        assert_eq!(oom_score_adj("BestEffort", 0, 1), 1000);
        assert_eq!(oom_score_adj("Burstable", 10 << 30, 8 << 30), 2);
        assert_eq!(oom_score_adj("Burstable", 0, 8 << 30), 999);
        let mut n = node();
        assert_eq!(swap_limit(&n, "Guaranteed", 1 << 30, 1 << 30), 0);
        assert_eq!(swap_limit(&n, "Burstable", 1 << 30, 1 << 30), 0);
        n.swap_behavior = SwapBehavior::NoSwap;
        assert_eq!(swap_limit(&n, "Burstable", 1 << 30, 2 << 30), 0);
    }
}
