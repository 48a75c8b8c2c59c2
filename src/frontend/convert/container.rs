//! A container's config for one run: command and args expanded, environment, mounts (volumes
//! with subPath, the hosts file, the termination message file), labels, resources and security
//! context with kubelet's masked and read-only paths.

use std::collections::HashMap;
use std::path::Path;

use crate::cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, PodSpec};

use super::{
    ConfigError, LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
    PodContext, container_resources, environment, expand, namespace_options, profile,
};

/// kubelet's default masked and read-only paths.
pub const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The mounts of a container: its volumes (with subPath), and the termination message file.
pub fn mounts(
    ctx: &PodContext,
    c: &Container,
    env: &HashMap<String, String>,
    termination_log: Option<&Path>,
) -> Result<Vec<cri::Mount>, ConfigError> {
    let mut out = Vec::new();
    let selinux = Path::new("/sys/fs/selinux/enforce").exists();
    for m in c.volume_mounts.iter().flatten() {
        let base = ctx
            .volumes
            .get(&m.name)
            .ok_or_else(|| ConfigError(format!("volume {:?} is not ready", m.name)))?;
        let sub = match (&m.sub_path, &m.sub_path_expr) {
            (Some(s), _) if !s.is_empty() => Some(s.clone()),
            (_, Some(x)) if !x.is_empty() => Some(expand(x, env)),
            _ => None,
        };
        let host = match sub {
            Some(s) => {
                if s.starts_with('/') || s.split('/').any(|p| p == "..") {
                    return Err(ConfigError(format!(
                        "subPath {s:?} must stay inside the volume"
                    )));
                }
                let p = base.join(&s);
                // As kubelet does: a missing subPath becomes a directory.
                if !p.exists() {
                    std::fs::create_dir_all(&p)
                        .map_err(|e| ConfigError(format!("subPath {}: {e}", p.display())))?;
                }
                // It must not lead out of the volume through a symlink.
                let real = p
                    .canonicalize()
                    .map_err(|e| ConfigError(format!("subPath {}: {e}", p.display())))?;
                let base_real = base.canonicalize().unwrap_or_else(|_| base.clone());
                if !real.starts_with(&base_real) {
                    return Err(ConfigError(format!(
                        "subPath {s:?} leads out of the volume"
                    )));
                }
                real
            }
            None => base.clone(),
        };
        let propagation = match m.mount_propagation.as_deref() {
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
            _ => cri::MountPropagation::PropagationPrivate,
        };
        let readonly = m.read_only.unwrap_or(false) || volume_read_only(ctx.spec, &m.name);
        out.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host.display().to_string(),
            readonly,
            recursive_read_only: readonly && m.recursive_read_only.as_deref() == Some("Enabled"),
            propagation: propagation as i32,
            // As kubelet: volumes it makes itself take the pod's SELinux label on a node running
            // SELinux; a hostPath keeps its own.
            selinux_relabel: selinux && !volume_is_host_path(ctx.spec, &m.name),
            ..Default::default()
        });
    }
    if let Some(h) = ctx.hosts_file
        && !out.iter().any(|m| m.container_path == "/etc/hosts")
    {
        out.push(cri::Mount {
            container_path: "/etc/hosts".into(),
            host_path: h.display().to_string(),
            selinux_relabel: selinux,
            ..Default::default()
        });
    }
    if let Some(t) = termination_log {
        out.push(cri::Mount {
            container_path: c
                .termination_message_path
                .clone()
                .unwrap_or_else(|| "/dev/termination-log".into()),
            host_path: t.display().to_string(),
            selinux_relabel: selinux,
            ..Default::default()
        });
    }
    Ok(out)
}

/// Secret, ConfigMap, downward API and projected volumes are read-only to containers.
fn volume_is_host_path(spec: &PodSpec, name: &str) -> bool {
    spec.volumes
        .iter()
        .flatten()
        .any(|v| v.name == name && v.host_path.is_some())
}

fn volume_read_only(spec: &PodSpec, name: &str) -> bool {
    spec.volumes.iter().flatten().any(|v| {
        v.name == name
            && (v.secret.is_some()
                || v.config_map.is_some()
                || v.downward_api.is_some()
                || v.projected.is_some())
    })
}

/// The container's CRI config for its `attempt`th run.
pub fn container_config(
    ctx: &PodContext,
    c: &Container,
    attempt: u32,
    image: &str,
    termination_log: Option<&Path>,
) -> Result<cri::ContainerConfig, ConfigError> {
    let env = environment(ctx, c)?;
    let env_map: HashMap<String, String> = env.iter().cloned().collect();
    let psc = ctx.spec.security_context.as_ref();
    let sc = c.security_context.as_ref();
    let privileged = sc.and_then(|s| s.privileged).unwrap_or(false);
    let unmasked = sc.and_then(|s| s.proc_mount.as_deref()) == Some("Unmasked");
    let (masked, readonly) = if privileged || unmasked {
        (Vec::new(), Vec::new())
    } else {
        (
            MASKED_PATHS.iter().map(|s| s.to_string()).collect(),
            READONLY_PATHS.iter().map(|s| s.to_string()).collect(),
        )
    };
    let seccomp = sc
        .and_then(|s| s.seccomp_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.seccomp_profile.as_ref()))
        .and_then(|p| {
            profile(
                &p.type_,
                p.localhost_profile.as_deref(),
                Some(&ctx.node.seccomp_root),
            )
        });
    let apparmor = sc
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| psc.and_then(|s| s.app_armor_profile.as_ref()))
        .and_then(|p| profile(&p.type_, p.localhost_profile.as_deref(), None));
    let mut groups: Vec<i64> = psc
        .and_then(|s| s.supplemental_groups.clone())
        .unwrap_or_default();
    if let Some(fs) = psc.and_then(|s| s.fs_group)
        && !groups.contains(&fs)
    {
        groups.push(fs);
    }
    let log_path = format!("{}/{attempt}.log", c.name);
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt,
        }),
        image: Some(crate::cri::client::image_spec(image)),
        command: c
            .command
            .iter()
            .flatten()
            .map(|s| expand(s, &env_map))
            .collect(),
        args: c
            .args
            .iter()
            .flatten()
            .map(|s| expand(s, &env_map))
            .collect(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        envs: env
            .iter()
            .map(|(k, v)| cri::KeyValue {
                key: k.clone(),
                value: v.clone().into_bytes(),
            })
            .collect(),
        mounts: mounts(ctx, c, &env_map, termination_log)?,
        labels: [
            (LABEL_CONTAINER_NAME.to_string(), c.name.clone()),
            (LABEL_POD_NAME.to_string(), ctx.name.to_string()),
            (LABEL_POD_NAMESPACE.to_string(), ctx.namespace.to_string()),
            (LABEL_POD_UID.to_string(), ctx.uid.to_string()),
        ]
        .into(),
        annotations: [(
            "io.kubernetes.container.restartCount".to_string(),
            attempt.to_string(),
        )]
        .into(),
        log_path,
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        tty: c.tty.unwrap_or(false),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(container_resources(ctx, c)),
            security_context: Some(cri::LinuxContainerSecurityContext {
                capabilities: sc
                    .and_then(|s| s.capabilities.as_ref())
                    .map(|cap| cri::Capability {
                        add_capabilities: cap.add.clone().unwrap_or_default(),
                        drop_capabilities: cap.drop.clone().unwrap_or_default(),
                        add_ambient_capabilities: Vec::new(),
                    }),
                privileged,
                namespace_options: Some(namespace_options(ctx.spec)),
                selinux_options: sc
                    .and_then(|s| s.se_linux_options.as_ref())
                    .or_else(|| psc.and_then(|s| s.se_linux_options.as_ref()))
                    .map(|o| cri::SeLinuxOption {
                        user: o.user.clone().unwrap_or_default(),
                        role: o.role.clone().unwrap_or_default(),
                        r#type: o.type_.clone().unwrap_or_default(),
                        level: o.level.clone().unwrap_or_default(),
                    }),
                run_as_user: sc
                    .and_then(|s| s.run_as_user)
                    .or_else(|| psc.and_then(|s| s.run_as_user))
                    .map(|v| cri::Int64Value { value: v }),
                run_as_group: sc
                    .and_then(|s| s.run_as_group)
                    .or_else(|| psc.and_then(|s| s.run_as_group))
                    .map(|v| cri::Int64Value { value: v }),
                readonly_rootfs: sc
                    .and_then(|s| s.read_only_root_filesystem)
                    .unwrap_or(false),
                supplemental_groups: groups,
                no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
                masked_paths: masked,
                readonly_paths: readonly,
                seccomp,
                apparmor,
                supplemental_groups_policy: match psc
                    .and_then(|s| s.supplemental_groups_policy.as_deref())
                {
                    Some("Strict") => cri::SupplementalGroupsPolicy::Strict as i32,
                    _ => cri::SupplementalGroupsPolicy::Merge as i32,
                },
                ..Default::default()
            }),
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::convert::testing::{node, pod};
    use crate::frontend::convert::{Store, qos};

    const BURSTABLE: &str = "apiVersion: v1
kind: Pod
metadata: {name: p, labels: {app: x}}
spec:
  containers:
  - name: a
    image: busybox
    command: [sh, -c, 'echo $(GREETING) $$(NOT) $(MISSING)']
    env:
    - {name: NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: GREETING, value: 'hi $(NAME)'}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}}
    - {name: MEM, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    resources:
      requests: {cpu: 250m, memory: 1Gi}
      limits: {cpu: 500m, memory: 2Gi}
";

    #[test]
    fn env_expansion_and_resources() {
        let p = pod(BURSTABLE);
        let spec = p.spec.as_ref().unwrap();
        let n = node();
        let store = Store::default();
        let vols = HashMap::new();
        let ctx = PodContext {
            pod: &p,
            spec,
            namespace: "default",
            name: "p",
            uid: "u1",
            store: &store,
            node: &n,
            log_dir: Path::new("/var/log/pods/x"),
            volumes: &vols,
            hosts_file: None,
            pod_ips: &[],
        };
        let dual = ["10.88.0.5".to_string(), "fd00::5".to_string()];
        let dual_ctx = PodContext {
            pod_ips: &dual,
            ..ctx
        };
        assert_eq!(
            super::super::env::field(&dual_ctx, "status.podIP").as_deref(),
            Some("10.88.0.5")
        );
        assert_eq!(
            super::super::env::field(&dual_ctx, "status.podIPs").as_deref(),
            Some("10.88.0.5,fd00::5")
        );
        assert_eq!(qos(spec), "Burstable");
        let cfg = container_config(&ctx, &spec.containers[0], 3, "busybox:1", None).unwrap();
        assert_eq!(cfg.command[2], "echo hi p $(NOT) $(MISSING)");
        let env: HashMap<_, _> = cfg
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), String::from_utf8(kv.value.clone()).unwrap()))
            .collect();
        assert_eq!(env["APP"], "x");
        assert_eq!(env["MEM"], "2048");
        let r = cfg.linux.as_ref().unwrap().resources.as_ref().unwrap();
        assert_eq!(r.cpu_shares, 256);
        assert_eq!((r.cpu_quota, r.cpu_period), (50_000, 100_000));
        assert_eq!(r.memory_limit_in_bytes, 2 << 30);
        assert_eq!(r.oom_score_adj, 1000 - 1000 / 8);
        // LimitedSwap: the request's share of the node's swap.
        assert_eq!(r.unified["memory.swap.max"], (256u64 << 20).to_string());
        assert_eq!(cfg.log_path, "a/3.log");
        let sc = cfg.linux.unwrap().security_context.unwrap();
        assert_eq!(sc.masked_paths.len(), MASKED_PATHS.len());
        assert!(!sc.no_new_privs);
    }
}
