//! Container edits applied to a container's OCI runtime spec, as the CDI library applies them:
//! environment (a name given again replaces its value), device nodes (type and numbers read
//! off the host node when the spec leaves them out, each with its device cgroup rule), mounts
//! (a container path given again replaces its mount; all sorted parents first), hooks, and
//! additional groups (0 ignored). `intelRdt` and `netDevices` are refused by name where this
//! node cannot give them.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, HookBuilder, Hooks, LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup,
    LinuxDeviceCgroupBuilder, LinuxDeviceType, Mount, MountBuilder, Spec,
};

use super::spec::{ContainerEdits, DeviceNode};

/// Why an edit cannot be applied: the reason, for the caller to name device and file with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EditError(pub String);

fn err(reason: impl Into<String>) -> EditError {
    EditError(reason.into())
}

/// A device node completed from the host: type and numbers from its host node where the spec
/// has no full description; the mode always from the host node when it has one.
fn complete(n: &DeviceNode) -> Result<(LinuxDeviceType, i64, i64, Option<u32>), EditError> {
    let host = if n.host_path.is_empty() {
        &n.path
    } else {
        &n.host_path
    };
    let given = match n.kind.as_str() {
        "b" => Some(LinuxDeviceType::B),
        "c" | "u" => Some(LinuxDeviceType::C),
        "p" => Some(LinuxDeviceType::P),
        _ => None,
    };
    let minimal = given.is_some_and(|k| k == LinuxDeviceType::P || n.major != 0);
    let mode = n.file_mode.map(|m| m & 0o7777);
    let meta = match std::fs::symlink_metadata(host) {
        Ok(m) => m,
        Err(_) if minimal => {
            return Ok((given.unwrap_or(LinuxDeviceType::C), n.major, n.minor, mode));
        }
        Err(e) => return Err(err(format!("host device {host}: {e}"))),
    };
    let ft = meta.file_type();
    let found = if ft.is_block_device() {
        LinuxDeviceType::B
    } else if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_fifo() {
        LinuxDeviceType::P
    } else if minimal {
        return Ok((given.unwrap_or(LinuxDeviceType::C), n.major, n.minor, mode));
    } else {
        return Err(err(format!("host device {host} is not a device node")));
    };
    let mode = mode.or(Some(meta.mode() & 0o7777));
    if let Some(k) = given.filter(|_| minimal) {
        return Ok((k, n.major, n.minor, mode));
    }
    if given.is_some_and(|k| k != found) {
        return Err(err(format!(
            "host device {host} is of type {}, the spec says {}",
            found.as_str(),
            n.kind
        )));
    }
    let rdev = meta.rdev();
    Ok((
        found,
        i64::from(nix::sys::stat::major(rdev) as u32),
        i64::from(nix::sys::stat::minor(rdev) as u32),
        mode,
    ))
}

/// The name of a `NAME=value` variable.
pub fn env_key(e: &str) -> &str {
    e.split_once('=').map_or(e, |(k, _)| k)
}

fn hook(h: &super::spec::Hook) -> Result<Hook, EditError> {
    let mut b = HookBuilder::default().path(PathBuf::from(&h.path));
    if !h.args.is_empty() {
        b = b.args(h.args.clone());
    }
    if !h.env.is_empty() {
        b = b.env(h.env.clone());
    }
    if let Some(t) = h.timeout {
        b = b.timeout(t);
    }
    b.build().map_err(|e| err(e.to_string()))
}

fn push_hook(hooks: &mut Hooks, name: &str, h: Hook) -> Result<(), EditError> {
    let list = match name {
        #[allow(deprecated)]
        "prestart" => hooks.prestart_mut(),
        "createRuntime" => hooks.create_runtime_mut(),
        "createContainer" => hooks.create_container_mut(),
        "startContainer" => hooks.start_container_mut(),
        "poststart" => hooks.poststart_mut(),
        "poststop" => hooks.poststop_mut(),
        other => return Err(err(format!("unknown hook {other:?}"))),
    };
    list.get_or_insert_with(Vec::new).push(h);
    Ok(())
}

fn depth(m: &Mount) -> usize {
    let d = m.destination().to_string_lossy();
    d.trim_end_matches('/').matches('/').count()
}

/// Applies one set of edits to the spec.
pub fn apply(spec: &mut Spec, e: &ContainerEdits) -> Result<(), EditError> {
    if !e.net_devices.is_empty() {
        // Moving a host interface into the pod needs netlink work crius does not do yet; a
        // container silently without its interface would be worse than a refusal.
        return Err(err(format!(
            "netDevices ({}) are not supported by this runtime",
            e.net_devices
                .iter()
                .map(|n| n.host_interface_name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    if let Some(r) = &e.intel_rdt {
        let why = if Path::new("/sys/fs/resctrl/schemata").exists() {
            "resource control classes are not supported by this runtime"
        } else {
            "this node has no resctrl file system (/sys/fs/resctrl)"
        };
        return Err(err(format!("intelRdt (closID {:?}): {why}", r.clos_id)));
    }
    let (uid, gid) = spec
        .process()
        .as_ref()
        .map(|p| (p.user().uid(), p.user().gid()))
        .unwrap_or((0, 0));
    if !e.env.is_empty()
        && let Some(p) = spec.process_mut()
    {
        let env = p.env_mut().get_or_insert_with(Vec::new);
        for v in &e.env {
            match env.iter_mut().find(|x| env_key(x) == env_key(v)) {
                Some(x) => *x = v.clone(),
                None => env.push(v.clone()),
            }
        }
    }
    let mut nodes: Vec<LinuxDevice> = Vec::new();
    let mut rules: Vec<LinuxDeviceCgroup> = Vec::new();
    for n in &e.device_nodes {
        if !n.path.starts_with("/dev/") {
            return Err(err(format!(
                "device node {}: this runtime makes device nodes under /dev only",
                n.path
            )));
        }
        let (kind, major, minor, mode) = complete(n)?;
        let mut b = LinuxDeviceBuilder::default()
            .path(PathBuf::from(&n.path))
            .typ(kind)
            .major(major)
            .minor(minor);
        if let Some(m) = mode {
            b = b.file_mode(m);
        }
        // As the CDI library: a node without an owner belongs to the container's user.
        if let Some(u) = n.uid.or((uid > 0).then_some(uid)) {
            b = b.uid(u);
        }
        if let Some(g) = n.gid.or((gid > 0).then_some(gid)) {
            b = b.gid(g);
        }
        nodes.push(b.build().map_err(|e| err(e.to_string()))?);
        if matches!(kind, LinuxDeviceType::B | LinuxDeviceType::C) {
            let access = match n.permissions.as_str() {
                "" => "rwm",
                "none" => "",
                p => p,
            };
            rules.push(
                LinuxDeviceCgroupBuilder::default()
                    .allow(true)
                    .typ(kind)
                    .major(major)
                    .minor(minor)
                    .access(access)
                    .build()
                    .map_err(|e| err(e.to_string()))?,
            );
        }
    }
    if !nodes.is_empty() {
        let linux = spec.linux_mut().get_or_insert_with(Default::default);
        let devs = linux.devices_mut().get_or_insert_with(Vec::new);
        for d in nodes {
            devs.retain(|x| x.path() != d.path());
            devs.push(d);
        }
        let res = linux.resources_mut().get_or_insert_with(Default::default);
        res.devices_mut().get_or_insert_with(Vec::new).extend(rules);
    }
    if !e.mounts.is_empty() {
        let mounts = spec.mounts_mut().get_or_insert_with(Vec::new);
        for m in &e.mounts {
            let dest = PathBuf::from(&m.container_path);
            mounts.retain(|x| x.destination() != &dest);
            let mut b = MountBuilder::default()
                .destination(dest)
                .source(PathBuf::from(&m.host_path))
                .options(m.options.clone());
            if !m.kind.is_empty() {
                b = b.typ(m.kind.clone());
            }
            mounts.push(b.build().map_err(|e| err(e.to_string()))?);
        }
        // Parents before children; stable, so crius's own order stays among equals.
        mounts.sort_by_key(depth);
    }
    if !e.hooks.is_empty() {
        let hooks = spec.hooks_mut().get_or_insert_with(Default::default);
        for h in &e.hooks {
            push_hook(hooks, &h.hook_name, hook(h)?)?;
        }
    }
    let gids: Vec<u32> = e
        .additional_gids
        .iter()
        .copied()
        .filter(|g| *g != 0)
        .collect();
    if !gids.is_empty()
        && let Some(p) = spec.process_mut()
    {
        let user = p.user_mut();
        let list = user.additional_gids_mut().get_or_insert_with(Vec::new);
        for g in gids {
            if !list.contains(&g) {
                list.push(g);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdi::spec::{self as cdi, Mount as CdiMount};
    use oci_spec::runtime::{ProcessBuilder, SpecBuilder, UserBuilder};

    fn spec() -> Spec {
        let process = ProcessBuilder::default()
            .env(vec!["PATH=/bin".to_string(), "A=old".to_string()])
            .user(
                UserBuilder::default()
                    .uid(1000u32)
                    .gid(1000u32)
                    .build()
                    .unwrap(),
            )
            .build()
            .unwrap();
        let mounts = vec![
            MountBuilder::default()
                .destination("/proc")
                .typ("proc")
                .build()
                .unwrap(),
            MountBuilder::default()
                .destination("/dev/pts")
                .typ("devpts")
                .build()
                .unwrap(),
        ];
        SpecBuilder::default()
            .process(process)
            .mounts(mounts)
            .build()
            .unwrap()
    }

    #[test]
    fn edits_land_where_the_cdi_library_puts_them() {
        let mut s = spec();
        let e = ContainerEdits {
            env: vec!["A=new".into(), "B=1".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/fake0".into(),
                host_path: "/dev/null".into(),
                ..Default::default()
            }],
            mounts: vec![
                CdiMount {
                    host_path: "/usr/lib/x".into(),
                    container_path: "/usr/lib/x".into(),
                    options: vec!["ro".into(), "bind".into()],
                    kind: String::new(),
                },
                CdiMount {
                    host_path: "/opt".into(),
                    container_path: "/opt".into(),
                    ..Default::default()
                },
            ],
            hooks: vec![cdi::Hook {
                hook_name: "createContainer".into(),
                path: "/bin/true".into(),
                ..Default::default()
            }],
            additional_gids: vec![0, 44, 44],
            ..Default::default()
        };
        apply(&mut s, &e).unwrap();
        let p = s.process().as_ref().unwrap();
        assert_eq!(p.env().as_ref().unwrap(), &["PATH=/bin", "A=new", "B=1"]);
        assert_eq!(p.user().additional_gids().as_ref().unwrap(), &[44]);
        let l = s.linux().as_ref().unwrap();
        let d = &l.devices().as_ref().unwrap()[0];
        assert_eq!(
            (d.typ(), d.major(), d.minor(), d.uid(), d.gid()),
            (LinuxDeviceType::C, 1, 3, Some(1000), Some(1000)),
            "numbers from the host's /dev/null, owner the container's user"
        );
        let r = &l.resources().as_ref().unwrap().devices().as_ref().unwrap()[0];
        assert_eq!((r.major(), r.minor()), (Some(1), Some(3)));
        assert_eq!(r.access().as_deref(), Some("rwm"));
        let dests: Vec<String> = s
            .mounts()
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.destination().display().to_string())
            .collect();
        assert_eq!(dests, ["/proc", "/opt", "/dev/pts", "/usr/lib/x"]);
        let h = s
            .hooks()
            .as_ref()
            .unwrap()
            .create_container()
            .as_ref()
            .unwrap();
        assert_eq!(h[0].path(), Path::new("/bin/true"));
    }

    #[test]
    fn nodes_the_host_cannot_describe_are_refused() {
        let mut s = spec();
        let node = |path: &str, host: &str, kind: &str| ContainerEdits {
            device_nodes: vec![DeviceNode {
                path: path.into(),
                host_path: host.into(),
                kind: kind.into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let e = apply(&mut s, &node("/dev/x", "/nonexistent/x", "")).unwrap_err();
        assert!(e.0.contains("/nonexistent/x"), "{e}");
        let e = apply(&mut s, &node("/dev/x", "/etc/hostname", "")).unwrap_err();
        assert!(e.0.contains("not a device node"), "{e}");
        let e = apply(&mut s, &node("/dev/x", "/dev/null", "b")).unwrap_err();
        assert!(e.0.contains("type"), "{e}");
        let e = apply(&mut s, &node("/opt/x", "/dev/null", "")).unwrap_err();
        assert!(e.0.contains("under /dev"), "{e}");
        // Fully described nodes need no host node.
        let mut full = node("/dev/y", "/nonexistent/y", "c");
        full.device_nodes[0].major = 240;
        full.device_nodes[0].permissions = "r".into();
        apply(&mut s, &full).unwrap();
        let net = ContainerEdits {
            net_devices: vec![cdi::NetDevice {
                host_interface_name: "eth9".into(),
                name: "net0".into(),
            }],
            ..Default::default()
        };
        assert!(apply(&mut s, &net).unwrap_err().0.contains("eth9"));
    }
}
