//! The mounts of a container's OCI spec: the CRI bind mounts, validated (paths, propagation,
//! recursive read-only) and ordered parents first, the default ones (`/proc`, a minimal `/dev`,
//! `/dev/pts`, `/dev/mqueue`, `/sys`, the cgroup's), `/dev/shm` of the pod and the pod's
//! hosts/resolv.conf/hostname files, each unless a CRI mount takes its place. It also holds
//! `Invalid`, the bad request field of any part of the spec (`spec` builds on this file, not the
//! other way round), and the container path checks devices share. Uses `volumes` (image
//! volumes), `runtime::mounts` (what the kernel allows) and the pod's `sandbox` record and paths.

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{Mount, MountBuilder};

use super::config::{self, ContainerConfig, Propagation};
use crate::sandbox::{self, NamespaceMode};

/// A bad field of the request.
#[derive(Debug)]
pub struct Invalid {
    pub field: String,
    pub reason: String,
}

/// A bad `field`, for `reason`.
pub(super) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// `/a/b/../c` is fine as long as it stays absolute; relative paths are not.
pub(super) fn check_abs(path: &str, field: &str) -> Result<(), Invalid> {
    if path.is_empty() {
        return Err(invalid(field, "is required"));
    }
    if !Path::new(path).is_absolute() {
        return Err(invalid(field, format!("{path:?} must be an absolute path")));
    }
    if path.contains('\0') {
        return Err(invalid(field, "contains a NUL byte"));
    }
    Ok(())
}

/// A container path with `..` resolved lexically, refusing one that climbs above `/`.
pub(super) fn clean_container_path(path: &str, field: &str) -> Result<String, Invalid> {
    check_abs(path, field)?;
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(s) => parts.push(s.to_str().unwrap_or("")),
            Component::ParentDir if parts.pop().is_none() => {
                return Err(invalid(
                    field,
                    format!("{path:?} escapes the container's root"),
                ));
            }
            _ => {}
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

/// A mount of the spec.
fn mount(dest: &str, kind: &str, source: &str, options: &[&str]) -> Result<Mount, Invalid> {
    MountBuilder::default()
        .destination(PathBuf::from(dest))
        .typ(kind)
        .source(PathBuf::from(source))
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(|e| invalid("mounts", e.to_string()))
}

/// The mount option of a CRI propagation.
fn propagation(p: Propagation) -> &'static str {
    match p {
        Propagation::HostToContainer => "rslave",
        Propagation::Bidirectional => "rshared",
        Propagation::Private => "rprivate",
    }
}

/// Validates the CRI mounts and turns them into OCI bind mounts, parents before children; an
/// image volume binds its mounted image (from `volumes`; before they are mounted, this only
/// validates).
pub fn cri_mounts(
    config: &ContainerConfig,
    volumes: &[super::ImageVolume],
) -> Result<Vec<Mount>, Invalid> {
    let mut seen = HashSet::new();
    let mut out: Vec<(usize, Mount)> = Vec::new();
    for (i, m) in config.mounts.iter().enumerate() {
        let field = format!("mounts[{i}]");
        let dest = clean_container_path(&m.container_path, &format!("{field}.container_path"))?;
        if dest == "/" {
            return Err(invalid(
                format!("{field}.container_path"),
                "a volume cannot replace the container's root",
            ));
        }
        // A volume there would take the runtime's writes to /proc (CVE-2025-52881).
        if !crate::runtime::mounts::proc_destination_allowed(&dest) {
            return Err(invalid(
                format!("{field}.container_path"),
                format!(
                    "{dest:?} is in /proc, where only the files lxcfs emulates may be mounted ({})",
                    crate::runtime::mounts::PROC_MOUNTABLE.join(", ")
                ),
            ));
        }
        let image_volume =
            super::volumes::check(m, &format!("config.{field}")).map_err(|e| match e {
                super::Error::Invalid { field, reason } => invalid(field, reason),
                other => invalid(format!("config.{field}"), other.to_string()),
            })?;
        let source = if image_volume {
            volumes
                .iter()
                .find(|v| v.mount == i)
                .map(|v| v.source.display().to_string())
                .unwrap_or_default()
        } else {
            check_abs(&m.host_path, &format!("{field}.host_path"))?;
            m.host_path.clone()
        };
        if !seen.insert(dest.clone()) {
            return Err(invalid(
                format!("{field}.container_path"),
                format!("{dest:?} is mounted twice"),
            ));
        }
        if m.recursive_read_only {
            if !m.readonly {
                return Err(invalid(
                    format!("{field}.recursive_read_only"),
                    "needs readonly",
                ));
            }
            if m.propagation != config::Propagation::Private {
                return Err(invalid(
                    format!("{field}.recursive_read_only"),
                    "needs private propagation",
                ));
            }
            if !crate::runtime::mounts::recursive_read_only_supported() {
                return Err(invalid(
                    format!("{field}.recursive_read_only"),
                    "this kernel has no mount_setattr (5.12 or later is needed)",
                ));
            }
        }
        let recursive = m.mount_options.iter().any(|o| o.starts_with('r'));
        if recursive && !crate::runtime::mounts::recursive_read_only_supported() {
            return Err(invalid(
                format!("{field}.mount_options"),
                "recursive options need mount_setattr, which this kernel lacks (5.12 or later)",
            ));
        }
        let mut opts = vec!["rbind", propagation(m.propagation)];
        opts.push(if m.recursive_read_only {
            "rro"
        } else if m.readonly {
            "ro"
        } else {
            "rw"
        });
        // Applied to the container's own copy of the tree, never to the host's mount.
        opts.extend(m.mount_options.iter().map(String::as_str));
        let depth = Path::new(&dest).components().count();
        out.push((depth, mount(&dest, "bind", &source, &opts)?));
    }
    out.sort_by_key(|(d, _)| *d);
    Ok(out.into_iter().map(|(_, m)| m).collect())
}

/// Every mount of the container's spec, and whether one of the CRI mounts is shared (then the
/// rootfs propagation must be too).
pub(super) fn spec_mounts(
    config: &ContainerConfig,
    volumes: &[super::ImageVolume],
    pod: &sandbox::Record,
    paths: &sandbox::Paths,
    cgroup: bool,
) -> Result<(Vec<Mount>, bool), Invalid> {
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    let host_ipc = pod.ipc == NamespaceMode::Node;
    let shm = if host_ipc {
        PathBuf::from("/dev/shm")
    } else {
        paths.shm()
    };
    let ro = sc.is_some_and(|s| s.readonly_rootfs);
    let file_opts: &[&str] = if ro {
        &["rbind", "rprivate", "ro"]
    } else {
        &["rbind", "rprivate", "rw"]
    };
    let mut user_mounts = cri_mounts(config, volumes)?;
    if !privileged {
        // No device node in a volume may open a host device, whatever the node's cgroup can
        // enforce; devices are passed as devices, or from /dev.
        for m in &mut user_mounts {
            let from_dev = m.source().as_ref().is_some_and(|s| s.starts_with("/dev"));
            if !from_dev && let Some(o) = m.options_mut() {
                o.push("nodev".into());
            }
        }
    }
    let given = |p: &str| user_mounts.iter().any(|m| m.destination() == Path::new(p));
    // A user namespace that does not own the network namespace (the host's) may not mount a
    // sysfs: the host's is bound instead, read-only all through (the kernel refuses a bind of
    // its top alone there, as it would uncover what the mounts below it hide).
    let host_sysfs = pod.userns.is_some() && pod.host_network();
    let mut mounts = kernel_mounts(privileged, cgroup, host_sysfs)?;
    if !given("/dev/shm") {
        mounts.push(mount(
            "/dev/shm",
            "bind",
            &shm.display().to_string(),
            &["rbind", "rprivate", "nosuid", "nodev", "noexec"],
        )?);
    }
    for (dest, file) in [
        ("/etc/hostname", paths.hostname()),
        ("/etc/resolv.conf", paths.resolv()),
        ("/etc/hosts", paths.hosts()),
    ] {
        if !given(dest) {
            mounts.push(mount(dest, "bind", &file.display().to_string(), file_opts)?);
        }
    }
    let shared = user_mounts.iter().any(|m| {
        m.options()
            .as_ref()
            .is_some_and(|o| o.iter().any(|x| x == "rshared"))
    });
    mounts.extend(user_mounts);
    Ok((mounts, shared))
}

/// The kernel's file systems every container has: `/proc`, a minimal `/dev`, `/dev/pts`,
/// `/dev/mqueue`, `/sys` (writable when privileged; the host's, read-only, where `host_sysfs`),
/// and its `cgroup` at /sys/fs/cgroup (on an empty tmpfs hiding the host's hierarchies, with
/// the host's /sys).
fn kernel_mounts(privileged: bool, cgroup: bool, host_sysfs: bool) -> Result<Vec<Mount>, Invalid> {
    let sys_opts: &[&str] = if privileged {
        &["nosuid", "noexec", "nodev", "rw"]
    } else {
        &["nosuid", "noexec", "nodev", "ro"]
    };
    let mut mounts = vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        mount(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        if host_sysfs {
            mount(
                "/sys",
                "bind",
                "/sys",
                &["rbind", "rprivate", "nosuid", "noexec", "nodev", "rro"],
            )?
        } else {
            mount("/sys", "sysfs", "sysfs", sys_opts)?
        },
    ];
    if host_sysfs {
        // Not the host's cgroup hierarchies, which came with its /sys; and the container's own
        // cgroup2 goes on this tmpfs, as the kernel refuses it on the host's cgroup2 mount
        // (the same superblock at the same place: EBUSY).
        mounts.push(mount(
            "/sys/fs/cgroup",
            "tmpfs",
            "tmpfs",
            &["nosuid", "noexec", "nodev", "ro", "size=4k"],
        )?);
    }
    if cgroup {
        let ro = if privileged { "rw" } else { "ro" };
        mounts.push(mount(
            "/sys/fs/cgroup",
            "cgroup2",
            "cgroup2",
            &["nosuid", "noexec", "nodev", "relatime", ro],
        )?);
    }
    Ok(mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_validation() {
        let m = |c: &str, h: &str| config::Mount {
            container_path: c.into(),
            host_path: h.into(),
            ..Default::default()
        };
        let mut c = ContainerConfig {
            mounts: vec![m("relative", "/tmp")],
            ..Default::default()
        };
        assert!(cri_mounts(&c, &[]).unwrap_err().reason.contains("absolute"));
        c.mounts = vec![m("/data", "tmp")];
        assert!(cri_mounts(&c, &[]).unwrap_err().field.contains("host_path"));
        c.mounts = vec![m("/../../etc", "/tmp")];
        assert!(cri_mounts(&c, &[]).unwrap_err().reason.contains("escapes"));
        c.mounts = vec![m("/a/b", "/tmp"), m("/a", "/tmp"), m("/a/./b/", "/x")];
        assert!(cri_mounts(&c, &[]).unwrap_err().reason.contains("twice"));
        c.mounts = vec![m("/a/b", "/tmp"), m("/a", "/tmp")];
        let ms = cri_mounts(&c, &[]).unwrap();
        assert_eq!(ms[0].destination(), Path::new("/a"), "parents first");
        let mut rro = m("/r", "/tmp");
        rro.recursive_read_only = true;
        c.mounts = vec![rro];
        assert!(cri_mounts(&c, &[]).unwrap_err().reason.contains("readonly"));
    }
}
