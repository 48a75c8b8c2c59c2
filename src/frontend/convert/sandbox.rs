//! The pod's sandbox config: metadata and labels, hostname, DNS, port mappings, namespaces,
//! the pod's security context (SELinux, users, groups, seccomp, AppArmor), sysctls and the pod's
//! resources.

use std::collections::HashMap;

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::PodSpec;

use super::{
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, PodContext, all_containers, pod_resources,
    profile,
};

/// Namespace modes of the pod.
pub fn namespace_options(spec: &PodSpec) -> cri::NamespaceOption {
    let mode = |on: Option<bool>, otherwise: cri::NamespaceMode| {
        if on == Some(true) {
            cri::NamespaceMode::Node as i32
        } else {
            otherwise as i32
        }
    };
    cri::NamespaceOption {
        network: mode(spec.host_network, cri::NamespaceMode::Pod),
        pid: if spec.host_pid == Some(true) {
            cri::NamespaceMode::Node as i32
        } else if spec.share_process_namespace == Some(true) {
            cri::NamespaceMode::Pod as i32
        } else {
            cri::NamespaceMode::Container as i32
        },
        ipc: mode(spec.host_ipc, cri::NamespaceMode::Pod),
        target_id: String::new(),
        userns_options: Some(cri::UserNamespace {
            mode: if spec.host_users == Some(false) {
                cri::NamespaceMode::Pod as i32
            } else {
                cri::NamespaceMode::Node as i32
            },
            ..Default::default()
        }),
    }
}

fn labels(ctx: &PodContext) -> HashMap<String, String> {
    let mut l: HashMap<String, String> = ctx
        .pod
        .metadata
        .labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    l.insert(LABEL_POD_NAME.into(), ctx.name.into());
    l.insert(LABEL_POD_NAMESPACE.into(), ctx.namespace.into());
    l.insert(LABEL_POD_UID.into(), ctx.uid.into());
    l
}

/// A dnsConfig's options as resolv.conf writes them: `name:value`, or `name`.
fn dns_options(d: &k8s_openapi::api::core::v1::PodDNSConfig) -> Vec<String> {
    d.options
        .iter()
        .flatten()
        .map(|o| match &o.value {
            Some(v) => format!("{}:{v}", o.name.clone().unwrap_or_default()),
            None => o.name.clone().unwrap_or_default(),
        })
        .collect()
}

/// The sandbox of the pod's `attempt`th incarnation.
pub fn sandbox_config(ctx: &PodContext, attempt: u32) -> cri::PodSandboxConfig {
    let spec = ctx.spec;
    let psc = spec.security_context.as_ref();
    let dns = match spec.dns_policy.as_deref() {
        Some("None") => spec.dns_config.as_ref().map(|d| cri::DnsConfig {
            servers: d.nameservers.clone().unwrap_or_default(),
            searches: d.searches.clone().unwrap_or_default(),
            options: dns_options(d),
        }),
        // No cluster DNS here: the node's resolv.conf, with any dnsConfig added.
        _ => spec.dns_config.as_ref().map(|d| {
            let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            let mut servers: Vec<String> = host
                .lines()
                .filter_map(|l| l.strip_prefix("nameserver"))
                .map(|s| s.trim().to_string())
                .collect();
            servers.extend(d.nameservers.clone().unwrap_or_default());
            let mut searches: Vec<String> = host
                .lines()
                .filter_map(|l| l.strip_prefix("search"))
                .flat_map(|s| s.split_whitespace().map(String::from).collect::<Vec<_>>())
                .collect();
            searches.extend(d.searches.clone().unwrap_or_default());
            cri::DnsConfig {
                servers,
                searches,
                options: dns_options(d),
            }
        }),
    };
    let privileged = all_containers(spec).any(|c| {
        c.security_context
            .as_ref()
            .and_then(|s| s.privileged)
            .unwrap_or(false)
    });
    let seccomp = psc.and_then(|s| s.seccomp_profile.as_ref()).and_then(|p| {
        profile(
            &p.type_,
            p.localhost_profile.as_deref(),
            Some(&ctx.node.seccomp_root),
        )
    });
    let apparmor = psc
        .and_then(|s| s.app_armor_profile.as_ref())
        .and_then(|p| profile(&p.type_, p.localhost_profile.as_deref(), None));
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: ctx.name.into(),
            uid: ctx.uid.into(),
            namespace: ctx.namespace.into(),
            attempt,
        }),
        hostname: if spec.host_network == Some(true) {
            String::new()
        } else {
            spec.hostname
                .clone()
                .unwrap_or_else(|| ctx.name.to_string())
        },
        log_directory: ctx.log_dir.display().to_string(),
        dns_config: dns,
        port_mappings: all_containers(spec)
            .flat_map(|c| c.ports.iter().flatten())
            .filter(|p| p.host_port.is_some_and(|h| h > 0))
            .map(|p| cri::PortMapping {
                protocol: match p.protocol.as_deref() {
                    Some("UDP") => cri::Protocol::Udp as i32,
                    Some("SCTP") => cri::Protocol::Sctp as i32,
                    _ => cri::Protocol::Tcp as i32,
                },
                container_port: p.container_port,
                host_port: p.host_port.unwrap_or(0),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
            .collect(),
        labels: labels(ctx),
        annotations: ctx
            .pod
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                selinux_options: psc.and_then(|s| s.se_linux_options.as_ref()).map(|o| {
                    cri::SeLinuxOption {
                        user: o.user.clone().unwrap_or_default(),
                        role: o.role.clone().unwrap_or_default(),
                        r#type: o.type_.clone().unwrap_or_default(),
                        level: o.level.clone().unwrap_or_default(),
                    }
                }),
                run_as_user: psc
                    .and_then(|s| s.run_as_user)
                    .map(|v| cri::Int64Value { value: v }),
                run_as_group: psc
                    .and_then(|s| s.run_as_group)
                    .map(|v| cri::Int64Value { value: v }),
                readonly_rootfs: false,
                supplemental_groups: psc
                    .and_then(|s| s.supplemental_groups.clone())
                    .unwrap_or_default(),
                privileged,
                seccomp,
                apparmor,
                ..Default::default()
            }),
            sysctls: psc
                .and_then(|s| s.sysctls.as_ref())
                .into_iter()
                .flatten()
                .map(|s| (s.name.clone(), s.value.clone()))
                .collect(),
            overhead: None,
            resources: Some(pod_resources(spec)),
        }),
        windows: None,
    }
}
