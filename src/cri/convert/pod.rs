//! Pod sandbox configs, statuses and filters.

use crate::cri::v1 as cri;
use tonic::Status;

use super::{each, num};
use crate::pod::PodReport;
use crate::sandbox::config::{
    Dns, HugepageLimit, IdMapping, NamespaceOptions, PodConfig, PodLinux, PodMetadata, PodSecurity,
    PortMapping, Resources, SecurityProfile, SelinuxOptions, UserNamespace,
};
use crate::sandbox::{PodFilter, PodState, PodStatus, PodSummary};

pub fn pod_metadata(m: cri::PodSandboxMetadata) -> PodMetadata {
    PodMetadata {
        name: m.name,
        uid: m.uid,
        namespace: m.namespace,
        attempt: m.attempt,
    }
}

pub fn cri_pod_metadata(m: &PodMetadata) -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: m.name.clone(),
        uid: m.uid.clone(),
        namespace: m.namespace.clone(),
        attempt: m.attempt,
    }
}

pub fn id_mapping(m: cri::IdMapping) -> IdMapping {
    IdMapping {
        host_id: m.host_id,
        container_id: m.container_id,
        length: m.length,
    }
}

pub fn cri_id_mapping(m: &IdMapping) -> cri::IdMapping {
    cri::IdMapping {
        host_id: m.host_id,
        container_id: m.container_id,
        length: m.length,
    }
}

pub fn namespace_options(n: cri::NamespaceOption, field: &str) -> Result<NamespaceOptions, Status> {
    Ok(NamespaceOptions {
        network: num(n.network, &format!("{field}.network"))?,
        pid: num(n.pid, &format!("{field}.pid"))?,
        ipc: num(n.ipc, &format!("{field}.ipc"))?,
        target_id: n.target_id,
        userns_options: n
            .userns_options
            .map(|u| -> Result<UserNamespace, Status> {
                Ok(UserNamespace {
                    mode: num(u.mode, &format!("{field}.userns_options.mode"))?,
                    uids: u.uids.into_iter().map(id_mapping).collect(),
                    gids: u.gids.into_iter().map(id_mapping).collect(),
                })
            })
            .transpose()?,
    })
}

pub fn cri_namespace_options(n: &NamespaceOptions) -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: n.network.into(),
        pid: n.pid.into(),
        ipc: n.ipc.into(),
        target_id: n.target_id.clone(),
        userns_options: n.userns_options.as_ref().map(|u| cri::UserNamespace {
            mode: u.mode.into(),
            uids: u.uids.iter().map(cri_id_mapping).collect(),
            gids: u.gids.iter().map(cri_id_mapping).collect(),
        }),
    }
}

pub fn selinux_options(o: cri::SeLinuxOption) -> SelinuxOptions {
    SelinuxOptions {
        user: o.user,
        role: o.role,
        kind: o.r#type,
        level: o.level,
    }
}

pub fn security_profile(p: cri::SecurityProfile, field: &str) -> Result<SecurityProfile, Status> {
    Ok(SecurityProfile {
        profile_type: num(p.profile_type, &format!("{field}.profile_type"))?,
        localhost_ref: p.localhost_ref,
    })
}

pub fn resources(r: cri::LinuxContainerResources) -> Resources {
    Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus,
        cpuset_mems: r.cpuset_mems,
        hugepage_limits: r
            .hugepage_limits
            .into_iter()
            .map(|h| HugepageLimit {
                page_size: h.page_size,
                limit: h.limit,
            })
            .collect(),
        unified: r.unified,
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
    }
}

pub fn cri_resources(r: &Resources) -> cri::LinuxContainerResources {
    cri::LinuxContainerResources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit_in_bytes: r.memory_limit_in_bytes,
        oom_score_adj: r.oom_score_adj,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| cri::HugepageLimit {
                page_size: h.page_size.clone(),
                limit: h.limit,
            })
            .collect(),
        unified: r.unified.clone(),
        memory_swap_limit_in_bytes: r.memory_swap_limit_in_bytes,
    }
}

/// A pod sandbox's config from RunPodSandbox (or CreateContainer's `sandbox_config`), under
/// `field`.
#[allow(deprecated)] // seccomp_profile_path is what older kubelets send
pub fn pod_config(c: cri::PodSandboxConfig, field: &str) -> Result<PodConfig, Status> {
    let config = pod_config_unchecked(c, field)?;
    super::super::validate::pod(&config, field)?;
    Ok(config)
}

#[allow(deprecated)] // seccomp_profile_path is what older kubelets send
fn pod_config_unchecked(c: cri::PodSandboxConfig, field: &str) -> Result<PodConfig, Status> {
    let linux = match c.linux {
        None => None,
        Some(l) => {
            let f = format!("{field}.linux.security_context");
            let security_context = match l.security_context {
                None => None,
                Some(s) => Some(PodSecurity {
                    namespace_options: s
                        .namespace_options
                        .map(|n| namespace_options(n, &format!("{f}.namespace_options")))
                        .transpose()?,
                    selinux_options: s.selinux_options.map(selinux_options),
                    run_as_user: s.run_as_user.map(|v| v.value),
                    run_as_group: s.run_as_group.map(|v| v.value),
                    readonly_rootfs: s.readonly_rootfs,
                    supplemental_groups: s.supplemental_groups,
                    supplemental_groups_policy: num(
                        s.supplemental_groups_policy,
                        &format!("{f}.supplemental_groups_policy"),
                    )?,
                    privileged: s.privileged,
                    seccomp: s
                        .seccomp
                        .map(|p| security_profile(p, &format!("{f}.seccomp")))
                        .transpose()?,
                    apparmor: s
                        .apparmor
                        .map(|p| security_profile(p, &format!("{f}.apparmor")))
                        .transpose()?,
                    seccomp_profile_path: s.seccomp_profile_path,
                }),
            };
            Some(PodLinux {
                cgroup_parent: l.cgroup_parent,
                security_context,
                sysctls: l.sysctls,
                overhead: l.overhead.map(resources),
                resources: l.resources.map(resources),
            })
        }
    };
    Ok(PodConfig {
        metadata: c.metadata.map(pod_metadata),
        hostname: c.hostname,
        log_directory: c.log_directory,
        dns_config: c.dns_config.map(|d| Dns {
            servers: d.servers,
            searches: d.searches,
            options: d.options,
        }),
        port_mappings: each(
            c.port_mappings,
            &format!("{field}.port_mappings"),
            |p, f| {
                Ok(PortMapping {
                    protocol: num(p.protocol, &format!("{f}.protocol"))?,
                    container_port: p.container_port,
                    host_port: p.host_port,
                    host_ip: p.host_ip,
                })
            },
        )?,
        labels: c.labels,
        annotations: c.annotations,
        linux,
    })
}

fn cri_state(s: PodState) -> i32 {
    let state = match s {
        PodState::Ready => cri::PodSandboxState::SandboxReady,
        PodState::NotReady => cri::PodSandboxState::SandboxNotready,
    };
    state as i32
}

pub fn cri_pod(p: &PodSummary) -> cri::PodSandbox {
    cri::PodSandbox {
        id: p.id.clone(),
        metadata: p.metadata.as_ref().map(cri_pod_metadata),
        state: cri_state(p.state),
        created_at: p.created_at,
        labels: p.labels.clone(),
        annotations: p.annotations.clone(),
        runtime_handler: p.runtime_handler.clone(),
    }
}

pub fn cri_pod_status(s: &PodStatus) -> cri::PodSandboxStatus {
    let mut ips = s.ips.iter();
    let network = match ips.next() {
        Some(ip) => cri::PodSandboxNetworkStatus {
            ip: ip.clone(),
            additional_ips: ips.map(|ip| cri::PodIp { ip: ip.clone() }).collect(),
        },
        None => cri::PodSandboxNetworkStatus::default(),
    };
    let p = &s.pod;
    cri::PodSandboxStatus {
        id: p.id.clone(),
        metadata: p.metadata.as_ref().map(cri_pod_metadata),
        state: cri_state(p.state),
        created_at: p.created_at,
        network: Some(network),
        linux: Some(cri::LinuxPodSandboxStatus {
            namespaces: Some(cri::Namespace {
                options: Some(cri_namespace_options(&s.namespaces)),
            }),
        }),
        labels: p.labels.clone(),
        annotations: p.annotations.clone(),
        runtime_handler: p.runtime_handler.clone(),
    }
}

pub fn cri_pod_report(r: PodReport) -> cri::PodSandboxStatusResponse {
    cri::PodSandboxStatusResponse {
        status: Some(cri_pod_status(&r.status)),
        info: r.info,
        containers_statuses: r
            .containers
            .iter()
            .map(super::cri_container_status)
            .collect(),
        timestamp: r.timestamp,
    }
}

/// A ListPodSandbox filter; none when it asks for a state that does not exist (nothing
/// matches it).
pub fn pod_filter(f: cri::PodSandboxFilter) -> Option<PodFilter> {
    let state = match f.state {
        None => None,
        Some(s) => Some(match cri::PodSandboxState::try_from(s.state).ok()? {
            cri::PodSandboxState::SandboxReady => PodState::Ready,
            cri::PodSandboxState::SandboxNotready => PodState::NotReady,
        }),
    };
    Some(PodFilter {
        id: f.id,
        state,
        label_selector: f.label_selector,
    })
}
