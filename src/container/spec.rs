//! The OCI runtime spec of a container, built from its CRI config, its pod and its image the way
//! kubelet and containerd agree on: command/args against the image's entrypoint/cmd, environment
//! merged over the image's, devices, and containerd's default capability set. Its mounts (the
//! default ones, the pod's files, CRI bind mounts) are `mounts`'s to make, as is `Invalid`, the
//! error of every part (re-exported here).

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capabilities, Capability, Linux, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxDevice,
    LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
    LinuxResourcesBuilder, Process, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use super::config::{self, ContainerConfig};
pub use super::mounts::Invalid;
use super::mounts::{check_abs, clean_container_path, invalid, spec_mounts};
use super::user::User;
use crate::image::Image;
use crate::sandbox;

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

/// What a container's spec is built from.
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

/// The container's variables whose values are not UTF-8: each key's last value, where that one
/// is not (an image's variables are JSON text, so always UTF-8).
pub fn raw_environment(config: &ContainerConfig) -> Vec<crate::runtime::RawEnv> {
    let mut last: std::collections::BTreeMap<&str, Option<&[u8]>> = Default::default();
    for kv in &config.envs {
        last.insert(&kv.key, kv.raw.as_deref());
    }
    last.into_iter()
        .filter_map(|(key, raw)| {
            raw.map(|value| crate::runtime::RawEnv {
                key: key.to_string(),
                value: value.to_vec(),
            })
        })
        .collect()
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
/// devices, its pseudo-terminals, tun/tap, and the devices it was given: runc's defaults. Not
/// the host's console (5:1): a container's `/dev/console` is its own terminal, a pts node.
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
        (5, 2),
        (10, 200),
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

/// Whether the pod sandbox itself is privileged (a privileged container needs it to be).
fn pod_privileged(pod: &sandbox::Record) -> bool {
    pod.config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|s| s.privileged)
}

/// The container's OCI spec: its process, mounts, devices and other Linux settings, root, and
/// the pod's hostname.
pub fn build(ctx: &Context) -> Result<Spec, Invalid> {
    let sc = ctx
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let privileged = sc.is_some_and(|s| s.privileged);
    if privileged && !pod_privileged(ctx.sandbox) {
        return Err(invalid(
            "linux.security_context.privileged",
            "a privileged container needs a privileged pod sandbox",
        ));
    }
    let process = process(ctx, sc)?;
    let (mounts, shared) = spec_mounts(
        ctx.config,
        ctx.image_volumes,
        ctx.sandbox,
        ctx.sandbox_paths,
        ctx.cgroup,
    )?;
    let linux = linux(ctx.config, sc, shared)?;
    let ro = sc.is_some_and(|s| s.readonly_rootfs);
    let root = RootBuilder::default()
        .path(ctx.rootfs.to_path_buf())
        .readonly(ro)
        .build()
        .map_err(|e| invalid("root", e.to_string()))?;
    let hostname = pod_hostname(&ctx.sandbox_paths.hostname());
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

/// The pod's hostname, from its `/etc/hostname`: every container of the pod may write that
/// file (it is bound in read-write), so it is read as hostile, a hostname's 64 bytes at most, and
/// only as a regular file (not a FIFO to wait on).
fn pod_hostname(path: &Path) -> String {
    use std::os::unix::fs::OpenOptionsExt as _;
    let bytes = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map(|f| super::user::read_regular(f, 64 + 1))
        .unwrap_or_default();
    let name = String::from_utf8_lossy(&bytes).trim().to_string();
    // What a container wrote there that no hostname is: none, so the pod's UTS name stays.
    if name.len() > 64 || name.contains(['\0', '\n']) {
        return String::new();
    }
    name
}

/// The working directory: the container's, else the image's (relative to the root), else `/`.
fn working_dir(config: &ContainerConfig, image: &Image) -> Result<String, Invalid> {
    if !config.working_dir.is_empty() {
        clean_container_path(&config.working_dir, "working_dir")
    } else if !image.config.config.working_dir.is_empty() {
        // An image's WorkingDir may be relative (to the root, as Docker reads it).
        let wd = &image.config.config.working_dir;
        clean_container_path(&format!("/{wd}"), "image WorkingDir")
    } else {
        Ok("/".to_string())
    }
}

/// The container's process: command line, environment, working directory, user,
/// capabilities, and its OOM score adjustment when resources are given.
fn process(ctx: &Context, sc: Option<&config::ContainerSecurity>) -> Result<Process, Invalid> {
    let config = ctx.config;
    let args = command_line(config, ctx.image);
    if args.is_empty() {
        return Err(invalid(
            "command",
            "neither the container nor its image gives a command",
        ));
    }
    let cwd = working_dir(config, ctx.image)?;
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
        let adj = oom_score_adj(r.oom_score_adj, "linux.resources.oom_score_adj")?;
        process.set_oom_score_adj(Some(adj));
    }
    Ok(process)
}

/// An OOM score adjustment in the kernel's range; a wider number must not wrap into it.
pub(super) fn oom_score_adj(value: i64, field: &str) -> Result<i32, Invalid> {
    i32::try_from(value)
        .ok()
        .filter(|v| (-1000..=1000).contains(v))
        .ok_or_else(|| invalid(field, format!("{value} is outside -1000..=1000")))
}

/// The Linux settings: the devices (all the host's too for a privileged container) and their
/// cgroup rules, the rootfs propagation (`rshared` when a mount is `shared`), the masked and
/// read-only paths; no namespaces.
fn linux(
    config: &ContainerConfig,
    sc: Option<&config::ContainerSecurity>,
    shared: bool,
) -> Result<Linux, Invalid> {
    let privileged = sc.is_some_and(|s| s.privileged);
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
    linux.build().map_err(|e| invalid("linux", e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::manifest::{ImageConfig, RunConfig};

    #[test]
    fn a_pod_hostname_is_read_as_hostile() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hostname");
        std::fs::write(&p, "web-0\n").unwrap();
        assert_eq!(super::pod_hostname(&p), "web-0");
        // A sparse file of a container's making: 65 bytes read, no hostname.
        std::fs::File::create(&p)
            .unwrap()
            .set_len(12 << 30)
            .unwrap();
        assert_eq!(super::pod_hostname(&p), "");
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(super::pod_hostname(&p), "");
        assert_eq!(super::pod_hostname(&dir.path().join("gone")), "");
    }

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
    fn raw_environment_is_each_keys_last_value_when_not_utf8() {
        let mut c = cfg(&[], &[]);
        let kv = |k: &str, raw: Option<&[u8]>| config::KeyValue {
            key: k.into(),
            value: raw.map_or("text".into(), |r| String::from_utf8_lossy(r).into_owned()),
            raw: raw.map(<[u8]>::to_vec),
        };
        c.envs = vec![
            kv("A", Some(b"\xff")),
            kv("B", Some(b"\xfe")),
            kv("B", None),
            kv("C", None),
        ];
        assert_eq!(
            raw_environment(&c),
            [crate::runtime::RawEnv {
                key: "A".into(),
                value: vec![0xff]
            }]
        );
    }

    #[test]
    fn environment_merge() {
        let img = image(&[], &["sh"], &["PATH=/bin", "A=image", "B=keep"]);
        let mut c = cfg(&[], &[]);
        c.envs = vec![
            config::KeyValue {
                key: "A".into(),
                value: "cri".into(),
                raw: None,
            },
            config::KeyValue {
                key: "C".into(),
                value: "new=x".into(),
                raw: None,
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
}
