//! The OCI runtime spec of a container, built from its CRI config, its pod and its image the way
//! kubelet and containerd agree on: command/args against the image's entrypoint/cmd, environment
//! merged over the image's, the default mounts (`/proc`, a minimal `/dev`, `/dev/pts`, `/dev/shm`
//! of the pod, `/dev/mqueue`, `/sys`), the pod's hosts/resolv.conf/hostname files, CRI bind mounts
//! with their propagation, devices, and containerd's default capability set.

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{
    Capabilities, Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxDevice,
    LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use super::config::{self, ContainerConfig, Propagation};
use super::user::User;
use crate::image::Image;
use crate::sandbox::{self, NamespaceMode};

/// A bad field of the request.
#[derive(Debug)]
pub struct Invalid {
    pub field: String,
    pub reason: String,
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Invalid {
    Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// containerd's default capabilities for CRI containers.
pub const DEFAULT_CAPS: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

pub struct Context<'a> {
    pub config: &'a ContainerConfig,
    pub sandbox: &'a sandbox::Record,
    pub sandbox_paths: &'a sandbox::Paths,
    pub image: &'a Image,
    pub rootfs: &'a Path,
    pub user: &'a User,
    /// Whether the container has its own cgroup (and cgroup namespace) to show at /sys/fs/cgroup.
    pub cgroup: bool,
    /// The container's image volumes, mounted (their sources).
    pub image_volumes: &'a [super::ImageVolume],
}

/// The command line: `command` replaces the entrypoint and `args` the cmd; with a command but no
/// args, the image's cmd is not used.
pub fn command_line(config: &ContainerConfig, image: &Image) -> Vec<String> {
    let rc = &image.config.config;
    let mut out: Vec<String>;
    if config.command.is_empty() {
        out = rc.entrypoint.clone().unwrap_or_default();
        if config.args.is_empty() {
            out.extend(rc.cmd.clone().unwrap_or_default());
        } else {
            out.extend(config.args.iter().cloned());
        }
    } else {
        out = config.command.clone();
        out.extend(config.args.iter().cloned());
    }
    out
}

/// The image's environment with the container's on top (a later key replaces an earlier one),
/// plus HOME from the user's passwd entry when nothing set it.
pub fn environment(config: &ContainerConfig, image: &Image, user: &User) -> Vec<String> {
    let mut env: Vec<(String, String)> = Vec::new();
    // Where each key is in `env`: a linear search per key was quadratic (100,000 variables
    // took seconds).
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut set = |k: &str, v: &str| match at.get(k) {
        Some(&i) => env[i].1 = v.to_string(),
        None => {
            at.insert(k.to_string(), env.len());
            env.push((k.to_string(), v.to_string()));
        }
    };
    for e in image.config.config.env.as_deref().unwrap_or_default() {
        let (k, v) = e.split_once('=').unwrap_or((e, ""));
        set(k, v);
    }
    for kv in &config.envs {
        set(&kv.key, &kv.value);
    }
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.insert(
            0,
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
        );
    }
    if !env.iter().any(|(k, _)| k == "HOME") {
        env.push(("HOME".into(), user.home.clone()));
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn cap_name(name: &str) -> String {
    let upper = name.to_ascii_uppercase();
    upper.strip_prefix("CAP_").unwrap_or(&upper).to_string()
}

fn parse_cap(name: &str, field: &str) -> Result<Capability, Invalid> {
    let n = cap_name(name);
    n.parse::<Capability>()
        .map_err(|_| invalid(field, format!("unknown capability {name:?}")))
}

/// Every capability this node grants the runtime (its bounding set): "all" for a privileged
/// container. On some nodes even root lacks one (CAP_SYS_RESOURCE in some VMs).
fn all_caps() -> Capabilities {
    let node = caps::read(None, caps::CapSet::Bounding).unwrap_or_else(|_| caps::all());
    node.into_iter()
        .filter_map(|c| {
            c.to_string()
                .strip_prefix("CAP_")
                .and_then(|n| n.parse::<Capability>().ok())
        })
        .collect()
}

/// The capability set: containerd's default, or all when privileged, then adds and drops (`ALL`
/// accepted in both, with or without the `CAP_` prefix).
pub fn capabilities(
    sc: Option<&config::ContainerSecurity>,
) -> Result<(Capabilities, Capabilities), Invalid> {
    let privileged = sc.is_some_and(|s| s.privileged);
    let mut set: Capabilities = if privileged {
        all_caps()
    } else {
        DEFAULT_CAPS.into_iter().collect()
    };
    let mut ambient = Capabilities::new();
    if let Some(c) = sc.and_then(|s| s.capabilities.as_ref()) {
        let is_all = |v: &Vec<String>| v.iter().any(|x| cap_name(x) == "ALL");
        if is_all(&c.add_capabilities) {
            set = all_caps();
        }
        if is_all(&c.drop_capabilities) {
            set.clear();
        }
        let node = all_caps();
        let available = |cap: Capability, name: &str, field: &str| {
            if node.contains(&cap) {
                Ok(cap)
            } else {
                Err(invalid(
                    field,
                    format!(
                        "{name:?} is not available on this node (not in the runtime's bounding set)"
                    ),
                ))
            }
        };
        for a in c.add_capabilities.iter().filter(|x| cap_name(x) != "ALL") {
            let field = "linux.security_context.capabilities.add_capabilities";
            set.insert(available(parse_cap(a, field)?, a, field)?);
        }
        for d in c.drop_capabilities.iter().filter(|x| cap_name(x) != "ALL") {
            set.remove(&parse_cap(
                d,
                "linux.security_context.capabilities.drop_capabilities",
            )?);
        }
        for a in &c.add_ambient_capabilities {
            let field = "linux.security_context.capabilities.add_ambient_capabilities";
            let cap = available(parse_cap(a, field)?, a, field)?;
            set.insert(cap);
            ambient.insert(cap);
        }
    }
    Ok((set, ambient))
}

/// `/a/b/../c` is fine as long as it stays absolute; relative paths are not.
fn check_abs(path: &str, field: &str) -> Result<(), Invalid> {
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
fn clean_container_path(path: &str, field: &str) -> Result<String, Invalid> {
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

fn mount(dest: &str, kind: &str, source: &str, options: &[&str]) -> Result<Mount, Invalid> {
    MountBuilder::default()
        .destination(PathBuf::from(dest))
        .typ(kind)
        .source(PathBuf::from(source))
        .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .build()
        .map_err(|e| invalid("mounts", e.to_string()))
}

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
        let mut opts = vec!["rbind", propagation(m.propagation)];
        opts.push(if m.recursive_read_only {
            "rro"
        } else if m.readonly {
            "ro"
        } else {
            "rw"
        });
        let depth = Path::new(&dest).components().count();
        out.push((depth, mount(&dest, "bind", &source, &opts)?));
    }
    out.sort_by_key(|(d, _)| *d);
    Ok(out.into_iter().map(|(_, m)| m).collect())
}

/// The CRI devices, each with its cgroup permissions (`rwm` when none are given).
fn devices(config: &ContainerConfig) -> Result<Vec<(LinuxDevice, String)>, Invalid> {
    let mut out = Vec::new();
    for (i, d) in config.devices.iter().enumerate() {
        let field = format!("devices[{i}]");
        let permissions = if d.permissions.is_empty() {
            "rwm".to_string()
        } else if d.permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
            d.permissions.clone()
        } else {
            return Err(invalid(
                format!("{field}.permissions"),
                format!("{:?}: only r, w and m are allowed", d.permissions),
            ));
        };
        check_abs(&d.host_path, &format!("{field}.host_path"))?;
        let dest = clean_container_path(&d.container_path, &format!("{field}.container_path"))?;
        let meta = std::fs::metadata(&d.host_path).map_err(|e| {
            invalid(
                format!("{field}.host_path"),
                format!("{}: {e}", d.host_path),
            )
        })?;
        let ft = meta.file_type();
        let kind = if ft.is_char_device() {
            LinuxDeviceType::C
        } else if ft.is_block_device() {
            LinuxDeviceType::B
        } else {
            return Err(invalid(
                format!("{field}.host_path"),
                format!("{} is not a device", d.host_path),
            ));
        };
        let rdev = meta.rdev();
        let dev = LinuxDeviceBuilder::default()
            .path(PathBuf::from(dest))
            .typ(kind)
            .major(nix::sys::stat::major(rdev) as i64)
            .minor(nix::sys::stat::minor(rdev) as i64)
            .file_mode(meta.mode() & 0o777)
            .uid(0u32)
            .gid(0u32)
            .build()
            .map_err(|e| invalid(&field, e.to_string()))?;
        out.push((dev, permissions));
    }
    Ok(out)
}

/// Every device node of the host, for a privileged container (the kernel's own directories of
/// pseudo-terminals, shared memory and queues are the container's own).
fn host_devices() -> Vec<LinuxDevice> {
    fn walk(dir: &Path, out: &mut Vec<LinuxDevice>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                if !matches!(
                    path.to_str(),
                    Some("/dev/pts" | "/dev/shm" | "/dev/mqueue" | "/dev/.lxc" | "/dev/.udev")
                ) {
                    walk(&path, out);
                }
                continue;
            }
            let kind = if ft.is_char_device() {
                LinuxDeviceType::C
            } else if ft.is_block_device() {
                LinuxDeviceType::B
            } else {
                continue;
            };
            let rdev = meta.rdev();
            if let Ok(d) = LinuxDeviceBuilder::default()
                .path(path)
                .typ(kind)
                .major(nix::sys::stat::major(rdev) as i64)
                .minor(nix::sys::stat::minor(rdev) as i64)
                .file_mode(meta.mode() & 0o777)
                .uid(meta.uid())
                .gid(meta.gid())
                .build()
            {
                out.push(d);
            }
        }
    }
    let mut out = Vec::new();
    walk(Path::new("/dev"), &mut out);
    // /dev/console, /dev/ptmx and the like are the container's own.
    out.retain(|d| {
        !matches!(
            d.path().to_str(),
            Some("/dev/console" | "/dev/ptmx" | "/dev/tty")
        )
    });
    out
}

/// The devices a container may open, for the cgroup device controller: all for a privileged
/// container; otherwise creating any node (useless without access), the standard character
/// devices, its pseudo-terminals, and the devices it was given.
fn device_rules(
    privileged: bool,
    given: &[(LinuxDevice, String)],
) -> Result<Vec<LinuxDeviceCgroup>, Invalid> {
    let rule = |allow: bool,
                kind: LinuxDeviceType,
                major: Option<i64>,
                minor: Option<i64>,
                access: &str| {
        let mut b = LinuxDeviceCgroupBuilder::default()
            .allow(allow)
            .typ(kind)
            .access(access);
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        b.build()
            .map_err(|e| invalid("linux.resources.devices", e.to_string()))
    };
    if privileged {
        return Ok(vec![rule(true, LinuxDeviceType::A, None, None, "rwm")?]);
    }
    let c = LinuxDeviceType::C;
    let mut out = vec![
        rule(false, LinuxDeviceType::A, None, None, "rwm")?,
        rule(true, c, None, None, "m")?,
        rule(true, LinuxDeviceType::B, None, None, "m")?,
    ];
    for (major, minor) in [
        (1, 3),
        (1, 5),
        (1, 7),
        (1, 8),
        (1, 9),
        (5, 0),
        (5, 1),
        (5, 2),
    ] {
        out.push(rule(true, c, Some(major), Some(minor), "rwm")?);
    }
    out.push(rule(true, c, Some(136), None, "rwm")?);
    for (d, access) in given {
        out.push(rule(
            true,
            d.typ(),
            Some(d.major()),
            Some(d.minor()),
            access,
        )?);
    }
    Ok(out)
}

pub fn build(ctx: &Context) -> Result<Spec, Invalid> {
    let config = ctx.config;
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    if privileged
        && !ctx
            .sandbox
            .config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .is_some_and(|s| s.privileged)
    {
        return Err(invalid(
            "linux.security_context.privileged",
            "a privileged container needs a privileged pod sandbox",
        ));
    }
    let args = command_line(config, ctx.image);
    if args.is_empty() {
        return Err(invalid(
            "command",
            "neither the container nor its image gives a command",
        ));
    }
    let cwd = if !config.working_dir.is_empty() {
        clean_container_path(&config.working_dir, "working_dir")?
    } else if !ctx.image.config.config.working_dir.is_empty() {
        // An image's WorkingDir may be relative (to the root, as Docker reads it).
        let wd = &ctx.image.config.config.working_dir;
        clean_container_path(&format!("/{wd}"), "image WorkingDir")?
    } else {
        "/".to_string()
    };
    let (caps, ambient) = capabilities(sc)?;
    let mut inheritable = Capabilities::new();
    inheritable.extend(ambient.iter().copied());
    let user = UserBuilder::default()
        .uid(ctx.user.uid)
        .gid(ctx.user.gid)
        .additional_gids(ctx.user.additional_gids.clone())
        .build()
        .map_err(|e| invalid("user", e.to_string()))?;
    let mut process = ProcessBuilder::default()
        .args(args)
        .env(environment(config, ctx.image, ctx.user))
        .cwd(PathBuf::from(cwd))
        .terminal(config.tty)
        .user(user)
        .no_new_privileges(sc.is_some_and(|s| s.no_new_privs))
        // No rlimits of our own (oci-spec's default caps open files at 1024): the container
        // inherits the runtime's, as CRI has no field for them.
        .rlimits(Vec::new())
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(caps.clone())
                .effective(caps.clone())
                .permitted(caps)
                .inheritable(inheritable)
                .ambient(ambient)
                .build()
                .map_err(|e| invalid("capabilities", e.to_string()))?,
        )
        .build()
        .map_err(|e| invalid("process", e.to_string()))?;
    if let Some(r) = config.linux.as_ref().and_then(|l| l.resources.as_ref()) {
        // The kernel's range; a wider number must not wrap into it.
        let adj = i32::try_from(r.oom_score_adj)
            .ok()
            .filter(|v| (-1000..=1000).contains(v))
            .ok_or_else(|| {
                invalid(
                    "linux.resources.oom_score_adj",
                    format!("{} is outside -1000..=1000", r.oom_score_adj),
                )
            })?;
        process.set_oom_score_adj(Some(adj));
    }

    let paths = ctx.sandbox_paths;
    let host_ipc = ctx.sandbox.ipc == NamespaceMode::Node;
    let shm = if host_ipc {
        PathBuf::from("/dev/shm")
    } else {
        paths.shm()
    };
    let sys_opts: &[&str] = if privileged {
        &["nosuid", "noexec", "nodev", "rw"]
    } else {
        &["nosuid", "noexec", "nodev", "ro"]
    };
    let ro = sc.is_some_and(|s| s.readonly_rootfs);
    let file_opts: &[&str] = if ro {
        &["rbind", "rprivate", "ro"]
    } else {
        &["rbind", "rprivate", "rw"]
    };
    let mut user_mounts = cri_mounts(config, ctx.image_volumes)?;
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
        mount("/sys", "sysfs", "sysfs", sys_opts)?,
    ];
    if ctx.cgroup {
        let ro = if privileged { "rw" } else { "ro" };
        mounts.push(mount(
            "/sys/fs/cgroup",
            "cgroup2",
            "cgroup2",
            &["nosuid", "noexec", "nodev", "relatime", ro],
        )?);
    }
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

    let given = devices(config)?;
    let mut devs: Vec<LinuxDevice> = given.iter().map(|(d, _)| d.clone()).collect();
    if privileged {
        for d in host_devices() {
            if !devs.iter().any(|x| x.path() == d.path()) {
                devs.push(d);
            }
        }
    }
    let resources = LinuxResourcesBuilder::default()
        .devices(device_rules(privileged, &given)?)
        .build()
        .map_err(|e| invalid("linux.resources", e.to_string()))?;
    let mut linux = LinuxBuilder::default()
        .rootfs_propagation(if shared { "rshared" } else { "rslave" })
        .devices(devs)
        .resources(resources);
    // Exactly the lists kubelet sent (its defaults, or none for procMount: Unmasked); none at
    // all for a privileged container. oci-spec's own defaults must not leak in.
    let (masked, readonly) = match sc {
        Some(s) if !privileged => (s.masked_paths.clone(), s.readonly_paths.clone()),
        _ => (Vec::new(), Vec::new()),
    };
    linux = linux
        .masked_paths(masked)
        .readonly_paths(readonly)
        // The namespaces are the monitor's business (monitor.json), not this spec's.
        .namespaces(Vec::new());
    let linux = linux.build().map_err(|e| invalid("linux", e.to_string()))?;
    let root = RootBuilder::default()
        .path(ctx.rootfs.to_path_buf())
        .readonly(ro)
        .build()
        .map_err(|e| invalid("root", e.to_string()))?;
    let hostname = std::fs::read_to_string(paths.hostname())
        .unwrap_or_default()
        .trim()
        .to_string();
    SpecBuilder::default()
        .version("1.0.2")
        .process(process)
        .root(root)
        .hostname(hostname)
        .mounts(mounts)
        .linux(linux)
        .build()
        .map_err(|e| invalid("spec", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::manifest::{ImageConfig, RunConfig};

    fn image(entrypoint: &[&str], cmd: &[&str], env: &[&str]) -> Image {
        let v = |s: &[&str]| Some(s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
        Image {
            record: serde_json::from_value(serde_json::json!({
                "id": crate::content::Digest::of(b"x"), "repo_tags": [], "repo_digests": [],
                "manifest": crate::content::Digest::of(b"m"), "index": null, "config_size": 1,
                "layers": [], "size": 1, "pulled_at": 0
            }))
            .unwrap(),
            config: ImageConfig {
                config: RunConfig {
                    entrypoint: v(entrypoint),
                    cmd: v(cmd),
                    env: v(env),
                    ..Default::default()
                },
                ..Default::default()
            },
        }
    }

    fn cfg(command: &[&str], args: &[&str]) -> ContainerConfig {
        ContainerConfig {
            command: command.iter().map(|s| s.to_string()).collect(),
            args: args.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn command_resolution_as_kubelet_expects() {
        let img = image(&["/entry"], &["default", "cmd"], &[]);
        assert_eq!(
            command_line(&cfg(&[], &[]), &img),
            ["/entry", "default", "cmd"]
        );
        assert_eq!(command_line(&cfg(&[], &["x"]), &img), ["/entry", "x"]);
        assert_eq!(command_line(&cfg(&["/bin/sh"], &[]), &img), ["/bin/sh"]);
        assert_eq!(
            command_line(&cfg(&["/bin/sh"], &["-c", "true"]), &img),
            ["/bin/sh", "-c", "true"]
        );
        let no_entry = image(&[], &["sh"], &[]);
        assert_eq!(command_line(&cfg(&[], &["echo"]), &no_entry), ["echo"]);
    }

    #[test]
    fn environment_merge() {
        let img = image(&[], &["sh"], &["PATH=/bin", "A=image", "B=keep"]);
        let mut c = cfg(&[], &[]);
        c.envs = vec![
            config::KeyValue {
                key: "A".into(),
                value: "cri".into(),
            },
            config::KeyValue {
                key: "C".into(),
                value: "new=x".into(),
            },
        ];
        let user = User {
            uid: 0,
            gid: 0,
            additional_gids: vec![],
            home: "/root".into(),
            name: None,
        };
        assert_eq!(
            environment(&c, &img, &user),
            ["PATH=/bin", "A=cri", "B=keep", "C=new=x", "HOME=/root"]
        );
    }

    #[test]
    fn capability_sets() {
        let (set, _) = capabilities(None).unwrap();
        assert_eq!(set.len(), 14);
        let sc = |add: &[&str], drop: &[&str]| config::ContainerSecurity {
            capabilities: Some(config::Capabilities {
                add_capabilities: add.iter().map(|s| s.to_string()).collect(),
                drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (set, _) = capabilities(Some(&sc(&["NET_ADMIN"], &["CAP_KILL"]))).unwrap();
        assert!(set.contains(&Capability::NetAdmin) && !set.contains(&Capability::Kill));
        let (set, _) = capabilities(Some(&sc(&["CHOWN"], &["ALL"]))).unwrap();
        assert_eq!(set.into_iter().collect::<Vec<_>>(), vec![Capability::Chown]);
        let (set, _) = capabilities(Some(&sc(&["ALL"], &[]))).unwrap();
        assert!(set.len() > 30);
        assert!(capabilities(Some(&sc(&["FLY"], &[]))).is_err());
    }

    #[test]
    fn mount_validation() {
        let m = |c: &str, h: &str| config::Mount {
            container_path: c.into(),
            host_path: h.into(),
            ..Default::default()
        };
        let mut c = cfg(&[], &[]);
        c.mounts = vec![m("relative", "/tmp")];
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
