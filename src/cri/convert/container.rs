//! Container configs, statuses, filters and events.

use crate::cri::v1 as cri;
use tonic::Status;

use super::{
    cri_pod_status, cri_resources, each, id_mapping, namespace_options, num, resources,
    security_profile, selinux_options,
};
use crate::container::config::{
    Capabilities, CdiDevice, ContainerConfig, ContainerLinux, ContainerMetadata, ContainerSecurity,
    ContainerState, Device, ImageSpec, KeyValue, Mount,
};
use crate::container::events::EventKind;
use crate::container::{ContainerFilter, ContainerStatus, ContainerSummary};
use crate::pod::ContainerEvent;

pub fn image_spec(i: cri::ImageSpec) -> ImageSpec {
    ImageSpec {
        image: i.image,
        annotations: i.annotations,
        user_specified_image: i.user_specified_image,
        runtime_handler: i.runtime_handler,
        image_ref: i.image_ref,
    }
}

pub fn cri_image_spec(i: &ImageSpec) -> cri::ImageSpec {
    cri::ImageSpec {
        image: i.image.clone(),
        annotations: i.annotations.clone(),
        user_specified_image: i.user_specified_image.clone(),
        runtime_handler: i.runtime_handler.clone(),
        image_ref: i.image_ref.clone(),
    }
}

/// A CRI stop signal as crius names signals (`SIGRTMIN+3`, `SIGRTMAX-1`, one name for
/// synonyms); empty for the runtime's default.
fn signal(n: i32, field: &str) -> Result<String, Status> {
    let s = cri::Signal::try_from(n)
        .map_err(|_| Status::invalid_argument(format!("{field}: unknown signal {n}")))?;
    if s == cri::Signal::RuntimeDefault {
        return Ok(String::new());
    }
    // CRI's enum names are `SIGNAL_SIGTERM` since v0.37 (`SIGTERM` before; the numbers stand).
    let name = s.as_str_name();
    let name = name.strip_prefix("SIGNAL_").unwrap_or(name);
    Ok(if let Some(k) = name.strip_prefix("SIGRTMINPLUS") {
        format!("SIGRTMIN+{k}")
    } else if let Some(k) = name.strip_prefix("SIGRTMAXMINUS") {
        format!("SIGRTMAX-{k}")
    } else {
        name.to_string()
    })
}

/// A signal's name as CRI's enum has it (the runtime's default for a name it lacks).
fn cri_signal(name: &str) -> i32 {
    let cri_name = if let Some(k) = name.strip_prefix("SIGRTMIN+") {
        format!("SIGNAL_SIGRTMINPLUS{k}")
    } else if let Some(k) = name.strip_prefix("SIGRTMAX-") {
        format!("SIGNAL_SIGRTMAXMINUS{k}")
    } else {
        format!("SIGNAL_{name}")
    };
    cri::Signal::from_str_name(&cri_name).map_or(0, |s| s as i32)
}

fn cri_metadata(m: &ContainerMetadata) -> cri::ContainerMetadata {
    cri::ContainerMetadata {
        name: m.name.clone(),
        attempt: m.attempt,
    }
}

/// The bind-mount options a mount may ask for (KEP-5855): the ones that take rights away, each
/// also in its recursive form (the whole tree of an rbind, not only its top). Loosening ones
/// (`exec`, `suid`) would be no-ops on a new bind and `ro` has its own field.
const MOUNT_OPTIONS: [&str; 6] = ["nosuid", "nodev", "noexec", "rnosuid", "rnodev", "rnoexec"];

fn mount(m: cri::Mount, field: &str) -> Result<Mount, Status> {
    for (j, o) in m.mount_options.iter().enumerate() {
        if !MOUNT_OPTIONS.contains(&o.as_str()) {
            return Err(Status::invalid_argument(format!(
                "{field}.mount_options[{j}]: {} is not a bind-mount option crius applies ({})",
                crate::cri::validate::quoted(o),
                MOUNT_OPTIONS.join(", ")
            )));
        }
    }
    let mut mount_options = m.mount_options;
    mount_options.dedup();
    Ok(Mount {
        container_path: m.container_path,
        host_path: m.host_path,
        readonly: m.readonly,
        selinux_relabel: m.selinux_relabel,
        propagation: num(m.propagation, &format!("{field}.propagation"))?,
        uid_mappings: m.uid_mappings.into_iter().map(id_mapping).collect(),
        gid_mappings: m.gid_mappings.into_iter().map(id_mapping).collect(),
        recursive_read_only: m.recursive_read_only,
        image: m.image.map(image_spec),
        image_sub_path: m.image_sub_path,
        mount_options,
    })
}

fn cri_mount(m: &Mount) -> cri::Mount {
    cri::Mount {
        container_path: m.container_path.clone(),
        host_path: m.host_path.clone(),
        readonly: m.readonly,
        selinux_relabel: m.selinux_relabel,
        propagation: m.propagation.into(),
        uid_mappings: m.uid_mappings.iter().map(super::cri_id_mapping).collect(),
        gid_mappings: m.gid_mappings.iter().map(super::cri_id_mapping).collect(),
        recursive_read_only: m.recursive_read_only,
        image: m.image.as_ref().map(cri_image_spec),
        mount_options: m.mount_options.clone(),
        image_sub_path: m.image_sub_path.clone(),
    }
}

#[allow(deprecated)] // apparmor_profile and seccomp_profile_path are what older kubelets send
fn security(s: cri::LinuxContainerSecurityContext, f: &str) -> Result<ContainerSecurity, Status> {
    Ok(ContainerSecurity {
        capabilities: s.capabilities.map(|c| Capabilities {
            add_capabilities: c.add_capabilities,
            drop_capabilities: c.drop_capabilities,
            add_ambient_capabilities: c.add_ambient_capabilities,
        }),
        privileged: s.privileged,
        namespace_options: s
            .namespace_options
            .map(|n| namespace_options(n, &format!("{f}.namespace_options")))
            .transpose()?,
        selinux_options: s.selinux_options.map(selinux_options),
        run_as_user: s.run_as_user.map(|v| v.value),
        run_as_group: s.run_as_group.map(|v| v.value),
        run_as_username: s.run_as_username,
        readonly_rootfs: s.readonly_rootfs,
        supplemental_groups: s.supplemental_groups,
        supplemental_groups_policy: num(
            s.supplemental_groups_policy,
            &format!("{f}.supplemental_groups_policy"),
        )?,
        no_new_privs: s.no_new_privs,
        masked_paths: s.masked_paths,
        readonly_paths: s.readonly_paths,
        seccomp: s
            .seccomp
            .map(|p| security_profile(p, &format!("{f}.seccomp")))
            .transpose()?,
        apparmor: s
            .apparmor
            .map(|p| security_profile(p, &format!("{f}.apparmor")))
            .transpose()?,
        apparmor_profile: s.apparmor_profile,
        seccomp_profile_path: s.seccomp_profile_path,
    })
}

/// A container's config from CreateContainer.
pub fn container_config(c: cri::ContainerConfig) -> Result<ContainerConfig, Status> {
    let config = convert(c)?;
    super::super::validate::container(&config)?;
    Ok(config)
}

fn convert(c: cri::ContainerConfig) -> Result<ContainerConfig, Status> {
    let linux = match c.linux {
        None => None,
        Some(l) => Some(ContainerLinux {
            resources: l.resources.map(resources),
            security_context: l
                .security_context
                .map(|s| security(s, "config.linux.security_context"))
                .transpose()?,
        }),
    };
    Ok(ContainerConfig {
        metadata: c.metadata.map(|m| ContainerMetadata {
            name: m.name,
            attempt: m.attempt,
        }),
        image: c.image.map(image_spec),
        command: c.command,
        args: c.args,
        working_dir: c.working_dir,
        envs: each(c.envs, "config.envs", |kv, _| {
            // A value that is not UTF-8 reaches the process unchanged (see `RawEnv`).
            Ok(match String::from_utf8(kv.value) {
                Ok(value) => KeyValue {
                    key: kv.key,
                    value,
                    raw: None,
                },
                Err(e) => KeyValue {
                    key: kv.key,
                    value: String::from_utf8_lossy(e.as_bytes()).into_owned(),
                    raw: Some(e.into_bytes()),
                },
            })
        })?,
        mounts: each(c.mounts, "config.mounts", mount)?,
        devices: c
            .devices
            .into_iter()
            .map(|d| Device {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        labels: c.labels,
        annotations: c.annotations,
        log_path: c.log_path,
        stdin: c.stdin,
        stdin_once: c.stdin_once,
        tty: c.tty,
        linux,
        cdi_devices: c
            .cdi_devices
            .into_iter()
            .map(|d| CdiDevice { name: d.name })
            .collect(),
        stop_signal: signal(c.stop_signal, "config.stop_signal")?,
    })
}

fn cri_state(s: ContainerState) -> i32 {
    let state = match s {
        ContainerState::Created => cri::ContainerState::ContainerCreated,
        ContainerState::Running => cri::ContainerState::ContainerRunning,
        ContainerState::Exited => cri::ContainerState::ContainerExited,
        ContainerState::Unknown | ContainerState::Removed => cri::ContainerState::ContainerUnknown,
    };
    state as i32
}

pub fn cri_container(c: &ContainerSummary) -> cri::Container {
    cri::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.pod_sandbox_id.clone(),
        metadata: c.metadata.as_ref().map(cri_metadata),
        image: c.image.as_ref().map(cri_image_spec),
        image_ref: c.image_ref.clone(),
        state: cri_state(c.state),
        created_at: c.created_at,
        labels: c.labels.clone(),
        annotations: c.annotations.clone(),
        image_id: c.image_id.clone(),
    }
}

pub fn cri_container_status(s: &ContainerStatus) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: s.id.clone(),
        metadata: s.metadata.as_ref().map(cri_metadata),
        state: cri_state(s.state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        image: s.image.as_ref().map(cri_image_spec),
        image_ref: s.image_ref.clone(),
        reason: s.reason.clone(),
        message: s.message.clone(),
        labels: s.labels.clone(),
        annotations: s.annotations.clone(),
        mounts: s.mounts.iter().map(cri_mount).collect(),
        log_path: s.log_path.clone(),
        resources: s.resources.as_ref().map(|r| cri::ContainerResources {
            linux: Some(cri_resources(r)),
            ..Default::default()
        }),
        image_id: s.image_id.clone(),
        user: Some(cri::ContainerUser {
            linux: Some(cri::LinuxContainerUser {
                uid: s.user.uid.into(),
                gid: s.user.gid.into(),
                supplemental_groups: s
                    .user
                    .supplemental_groups
                    .iter()
                    .map(|g| i64::from(*g))
                    .collect(),
            }),
        }),
        stop_signal: cri_signal(&s.stop_signal),
    }
}

/// A ListContainers filter; none when it asks for a state that does not exist (nothing
/// matches it).
pub fn container_filter(f: cri::ContainerFilter) -> Option<ContainerFilter> {
    let state = match f.state {
        None => None,
        Some(s) => Some(match ContainerState::try_from(s.state).ok()? {
            ContainerState::Removed => return None,
            st => st,
        }),
    };
    Some(ContainerFilter {
        id: f.id,
        pod_sandbox_id: f.pod_sandbox_id,
        state,
        label_selector: f.label_selector,
    })
}

pub fn cri_event(e: ContainerEvent) -> cri::ContainerEventResponse {
    let kind = match e.kind {
        EventKind::Created => cri::ContainerEventType::ContainerCreatedEvent,
        EventKind::Started => cri::ContainerEventType::ContainerStartedEvent,
        EventKind::Stopped => cri::ContainerEventType::ContainerStoppedEvent,
        EventKind::Deleted => cri::ContainerEventType::ContainerDeletedEvent,
    };
    cri::ContainerEventResponse {
        container_id: e.container_id,
        container_event_type: kind as i32,
        created_at: e.created_at,
        pod_sandbox_status: e.pod.as_ref().map(cri_pod_status),
        containers_statuses: e.containers.iter().map(cri_container_status).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRI's signal numbers become crius's names and back, whatever CRI's enum calls them.
    #[test]
    fn signals_by_name_both_ways() {
        for (number, name) in [
            (cri::Signal::Sigterm, "SIGTERM"),
            (cri::Signal::Sigrtminplus3, "SIGRTMIN+3"),
            (cri::Signal::Sigrtmaxminus1, "SIGRTMAX-1"),
        ] {
            assert_eq!(signal(number as i32, "f").unwrap(), name);
            assert_eq!(cri_signal(name), number as i32);
        }
        assert_eq!(signal(0, "f").unwrap(), "");
        assert_eq!(cri_signal("SIGNOPE"), 0);
    }

    /// The options that take rights away are kept (and shown back); anything else is refused,
    /// naming the mount, the option's place and the option.
    #[test]
    fn mount_options_kept_or_refused() {
        let m = |opts: &[&str]| cri::Mount {
            container_path: "/data".into(),
            host_path: "/srv".into(),
            mount_options: opts.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        };
        let kept = mount(m(&["noexec", "rnosuid", "nodev"]), "config.mounts[0]").unwrap();
        assert_eq!(kept.mount_options, ["noexec", "rnosuid", "nodev"]);
        assert_eq!(cri_mount(&kept).mount_options, kept.mount_options);
        for bad in ["exec", "ro", "bind", "size=1g", "noexec,nosuid"] {
            let err = mount(m(&["nosuid", bad]), "config.mounts[2]").unwrap_err();
            assert_eq!(err.code(), tonic::Code::InvalidArgument);
            assert!(
                err.message()
                    .starts_with("config.mounts[2].mount_options[1]: "),
                "{err:?}"
            );
            assert!(err.message().contains(bad), "{err:?}");
        }
    }
}
