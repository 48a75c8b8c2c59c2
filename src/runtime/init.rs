//! The container's init, between fork and exec, in the child of `crius monitor`: join the pod's
//! namespaces, take a private mount namespace, mount the spec's filesystems inside the rootfs
//! (resolved in-root, see `mounts`), create `/dev`, `pivot_root`, mask paths, then set up the
//! process (stdio, rlimits, oom_score_adj, user, capabilities, no_new_privs) and exec. Any failure
//! is written to the error pipe, which exec closes on success.

use std::convert::Infallible;
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::{Mode, SFlag, makedev, mknodat};
use nix::unistd::{Gid, Uid, UnlinkatFlags, symlinkat, unlinkat};
use oci_spec::runtime::{LinuxDeviceType, PosixRlimitType, Process, Spec};

use super::mounts::{self, Options};
use super::seccomp::Compiled;
use crate::sys;

/// A failed step, as the monitor reports it.
pub use super::step::StepError as InitError;
use super::step::step as fail;

/// The child's stdio, already created by the monitor.
pub struct Stdio {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
    /// The terminal to make controlling (the pty slave), when the container has a tty.
    pub tty: bool,
}

/// What the init sets up.
pub struct Plan<'a> {
    pub spec: &'a Spec,
    pub join: &'a [super::JoinNamespace],
    pub cgroup: Option<&'a Path>,
    pub seccomp: Option<&'a Compiled>,
    /// The pod's user namespace (its handle): joined first; bind mounts are idmapped into it.
    pub userns: Option<&'a Path>,
    /// With a user namespace and a PID namespace of the container's own, which must belong to
    /// the user namespace: the init makes it, forks once more, sends the new process's pid here
    /// and exits; the new process is the container.
    pub pid_report: Option<OwnedFd>,
    /// With a systemd scope: a byte here means the monitor has seen the init placed in it; end
    /// of file means it was not.
    pub placement: Option<OwnedFd>,
}

/// Runs the container init in the forked child; never returns.
pub fn run(plan: Plan, stdio: Stdio, errors: OwnedFd) -> ! {
    let e = match setup(plan, stdio) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    let mut f = std::fs::File::from(errors);
    let _ = f.write_all(e.to_string().as_bytes());
    sys::exit_now(127)
}

fn ns_flag(kind: &str) -> Option<CloneFlags> {
    Some(match kind {
        "net" => CloneFlags::CLONE_NEWNET,
        "ipc" => CloneFlags::CLONE_NEWIPC,
        "uts" => CloneFlags::CLONE_NEWUTS,
        "pid" => CloneFlags::CLONE_NEWPID,
        "mnt" => CloneFlags::CLONE_NEWNS,
        "cgroup" => CloneFlags::CLONE_NEWCGROUP,
        "user" => CloneFlags::CLONE_NEWUSER,
        _ => return None,
    })
}

/// Joins a namespace by its handle path.
pub fn join_namespace(kind: &str, path: &Path) -> Result<(), InitError> {
    let flag = ns_flag(kind).ok_or_else(|| InitError {
        step: "join namespace".into(),
        detail: format!("unknown namespace kind {kind:?}"),
    })?;
    let fd = std::fs::File::open(path)
        .map_err(fail(format!("open {kind} namespace {}", path.display())))?;
    setns(fd.as_fd(), flag).map_err(fail(format!("join {kind} namespace {}", path.display())))
}

/// Bind mounts as idmapped mounts of the user namespace, made on the host's side (only there
/// may they be made) for the init to attach inside; one slot per spec mount.
fn idmapped_binds(spec: &Spec, userns: &Path) -> Result<Vec<Option<OwnedFd>>, InitError> {
    let mut out = Vec::new();
    for m in spec.mounts().as_deref().unwrap_or_default() {
        let opts = Options::parse(m.options().as_deref().unwrap_or_default());
        let kind = m.typ().as_deref().unwrap_or("bind");
        if !(opts.flags.contains(MsFlags::MS_BIND) || kind == "bind") {
            out.push(None);
            continue;
        }
        let source = m.source().clone().unwrap_or_default();
        let mut attrs = 0;
        for (flag, attr) in [
            (MsFlags::MS_RDONLY, mounts::ATTR_RDONLY),
            (MsFlags::MS_NOSUID, mounts::ATTR_NOSUID),
            (MsFlags::MS_NODEV, mounts::ATTR_NODEV),
            (MsFlags::MS_NOEXEC, mounts::ATTR_NOEXEC),
        ] {
            if opts.flags.contains(flag) {
                attrs |= attr;
            }
        }
        let recursive = opts.flags.contains(MsFlags::MS_REC);
        let tree = mounts::idmapped(&source, userns, recursive, attrs, opts.recursive_ro).map_err(
            fail(format!(
                "mount {} on {}",
                source.display(),
                m.destination().display()
            )),
        )?;
        out.push(Some(tree));
    }
    Ok(out)
}

/// Joins the pod's user namespace as its root (the IDs the container's files are made with
/// until the process takes its own); with `pid_report`, also a new PID namespace of that user
/// namespace, entered by forking: the parent reports the child's pid and exits.
fn enter_userns(userns: &Path, pid_report: Option<OwnedFd>) -> Result<(), InitError> {
    join_namespace("user", userns)?;
    let root = Gid::from_raw(0);
    nix::unistd::setresgid(root, root, root).map_err(fail("setgid 0 in the user namespace"))?;
    let root = Uid::from_raw(0);
    nix::unistd::setresuid(root, root, root).map_err(fail("setuid 0 in the user namespace"))?;
    let Some(report) = pid_report else {
        return Ok(());
    };
    unshare(CloneFlags::CLONE_NEWPID).map_err(fail("new pid namespace"))?;
    match sys::fork().map_err(fail("fork into the pid namespace"))? {
        nix::unistd::ForkResult::Child => {
            drop(report);
            Ok(())
        }
        nix::unistd::ForkResult::Parent { child } => {
            let mut f = std::fs::File::from(report);
            let code = match f.write_all(&child.as_raw().to_ne_bytes()) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            sys::exit_now(code)
        }
    }
}

fn setup(plan: Plan, stdio: Stdio) -> Result<Infallible, InitError> {
    let Plan {
        spec,
        join,
        cgroup,
        seccomp,
        userns,
        pid_report,
        placement,
    } = plan;
    // The monitor blocked signals for its own loop and Rust ignores SIGPIPE: the container
    // starts with no signal blocked or ignored.
    sys::reset_signals().map_err(fail("reset signals"))?;
    if let Some(p) = placement {
        let mut b = [0u8; 1];
        std::fs::File::from(p).read_exact(&mut b).map_err(fail(
            "waiting to be placed in the container's systemd scope",
        ))?;
    }
    // Into the container's cgroup before anything else, so every later step is accounted.
    if let Some(cg) = cgroup {
        std::fs::write(cg.join("cgroup.procs"), "0")
            .map_err(fail(format!("joining cgroup {}", cg.display())))?;
    }
    let mut idmapped = match userns {
        Some(ns) => idmapped_binds(spec, ns)?,
        None => Vec::new(),
    };
    if let Some(ns) = userns {
        enter_userns(ns, pid_report)?;
    }
    for ns in join.iter().filter(|n| n.kind != "pid" && n.kind != "user") {
        join_namespace(&ns.kind, &ns.path)?;
    }
    // A cgroup namespace rooted at the container's cgroup, so its /sys/fs/cgroup shows only itself.
    let mut flags = CloneFlags::CLONE_NEWNS;
    if cgroup.is_some() {
        flags |= CloneFlags::CLONE_NEWCGROUP;
    }
    unshare(flags).map_err(fail("new mount and cgroup namespaces"))?;

    let linux = spec.linux().as_ref();
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| InitError {
            step: "rootfs".into(),
            detail: "the spec has no root".into(),
        })?;
    // Nothing mounted under the rootfs may reach the host: the rootfs is made private in this
    // namespace. The rest of the tree keeps the host's propagation, so a bind of a shared host
    // directory joins its peer group and each bind then gets exactly the propagation asked for
    // (rprivate, rslave, or rshared for kubelet's Bidirectional).
    mount(
        None::<&str>,
        &root,
        None::<&str>,
        MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail(format!("make rootfs {} private", root.display())))?;
    // pivot_root refuses a shared parent of the new root or of the current root.
    for m in [
        mounts::mount_point_of(&root).unwrap_or_else(|| PathBuf::from("/")),
        PathBuf::from("/"),
    ] {
        mount(
            None::<&str>,
            &m,
            None::<&str>,
            MsFlags::MS_PRIVATE,
            None::<&str>,
        )
        .map_err(fail(format!("make {} private", m.display())))?;
    }
    // A mount of our own on the rootfs: in a user namespace the one copied from the host is
    // locked, and pivot_root refuses a locked new root.
    mount(
        Some(&root),
        &root,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail(format!("bind rootfs {}", root.display())))?;
    let rootfd: OwnedFd = nix::fcntl::open(
        &root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail(format!("open rootfs {}", root.display())))?;

    let mut has_dev = false;
    for (i, m) in spec
        .mounts()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let dest = m.destination().display().to_string();
        let opts = Options::parse(m.options().as_deref().unwrap_or_default());
        let kind = m.typ().as_deref().unwrap_or("bind");
        let step = format!("mount {kind} on {dest}");
        if let Some(tree) = idmapped.get_mut(i).and_then(Option::take) {
            let source = m.source().clone().unwrap_or_default();
            let meta = std::fs::metadata(&source)
                .map_err(fail(format!("{step}: source {}", source.display())))?;
            let target = mounts::target(&rootfd, &dest, meta.is_dir()).map_err(fail(&step))?;
            mounts::attach_at(&tree, &target, opts.propagation).map_err(fail(&step))?;
        } else if opts.flags.contains(MsFlags::MS_BIND) || kind == "bind" {
            let source = m.source().clone().unwrap_or_default();
            let meta = std::fs::metadata(&source)
                .map_err(fail(format!("{step}: source {}", source.display())))?;
            let target = mounts::target(&rootfd, &dest, meta.is_dir()).map_err(fail(&step))?;
            mounts::bind(&source, &target, &opts).map_err(fail(&step))?;
        } else {
            let target = mounts::target(&rootfd, &dest, true).map_err(fail(&step))?;
            let source = m
                .source()
                .as_ref()
                .map(|s| s.display().to_string())
                .unwrap_or_else(|| kind.to_string());
            mounts::mount_fs(kind, &source, &target, &opts).map_err(fail(&step))?;
            if dest == "/dev" {
                has_dev = true;
            }
        }
    }
    if has_dev {
        populate_dev(spec, &rootfd, userns.is_some())?;
    }
    let process = spec.process().as_ref().ok_or_else(|| InitError {
        step: "process".into(),
        detail: "the spec has no process".into(),
    })?;
    let cwd = process.cwd().display().to_string();
    mounts::target(&rootfd, &cwd, true).map_err(fail(format!("working directory {cwd}")))?;

    pivot(&rootfd)?;

    if let Some(l) = linux {
        for p in l.masked_paths().as_deref().unwrap_or_default() {
            mask(p)?;
        }
        for p in l.readonly_paths().as_deref().unwrap_or_default() {
            read_only(p)?;
        }
        if let Some(sysctls) = l.sysctl() {
            for (k, v) in sysctls {
                write_sysctl(k, v)?;
            }
        }
    }
    if spec
        .root()
        .as_ref()
        .and_then(|r| r.readonly())
        .unwrap_or(false)
    {
        mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(fail("read-only rootfs"))?;
    }

    nix::unistd::setsid().map_err(fail("setsid"))?;
    if stdio.tty {
        sys::set_controlling_tty(&stdio.stdout).map_err(fail("controlling terminal"))?;
    }
    install_stdio(stdio)?;
    std::env::set_current_dir(&cwd).map_err(fail(format!("chdir {cwd}")))?;
    apply_process(process, seccomp)?;
    exec(process)
}

/// Moves stdio to 0, 1, 2. Every other descriptor the monitor holds is close-on-exec (it closed
/// what it inherited at start), so exec leaves the container exactly these three.
fn install_stdio(stdio: Stdio) -> Result<(), InitError> {
    sys::dup_to(&stdio.stdin, 0, false).map_err(fail("stdin"))?;
    sys::dup_to(&stdio.stdout, 1, false).map_err(fail("stdout"))?;
    sys::dup_to(&stdio.stderr, 2, false).map_err(fail("stderr"))?;
    Ok(())
}

/// A device node on the host with this type and number, for binding into a user namespace's
/// /dev, where nodes cannot be made.
fn host_node(kind: SFlag, rdev: u64) -> Option<PathBuf> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    fn walk(dir: &Path, kind: SFlag, rdev: u64, depth: u32) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let p = e.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            let ft = m.file_type();
            if ft.is_dir() && depth < 4 && !p.ends_with("pts") && !p.ends_with("shm") {
                if let Some(found) = walk(&p, kind, rdev, depth + 1) {
                    return Some(found);
                }
            } else if m.rdev() == rdev
                && ((kind == SFlag::S_IFCHR && ft.is_char_device())
                    || (kind == SFlag::S_IFBLK && ft.is_block_device()))
            {
                return Some(p);
            }
        }
        None
    }
    walk(Path::new("/dev"), kind, rdev, 0)
}

fn populate_dev(spec: &Spec, rootfd: &OwnedFd, userns: bool) -> Result<(), InitError> {
    let dev = mounts::target(rootfd, "/dev", true).map_err(fail("open /dev"))?;
    let devdir = openat2(
        dev.as_fd(),
        ".",
        OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
    )
    .map_err(fail("open /dev"))?;
    // The devices every container gets (runc's defaults).
    let defaults: [(&str, u64, u64); 6] = [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("random", 1, 8),
        ("urandom", 1, 9),
        ("tty", 5, 0),
    ];
    for (name, major, minor) in defaults {
        make_node(
            &devdir,
            name,
            SFlag::S_IFCHR,
            0o666,
            makedev(major, minor),
            (0, 0),
            userns,
        )?;
    }
    let links = [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
        ("core", "/proc/kcore"),
    ];
    for (name, target) in links {
        match symlinkat(target, devdir.as_fd(), name) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(fail(format!("/dev/{name}"))(e)),
        }
    }
    let Some(devices) = spec.linux().as_ref().and_then(|l| l.devices().clone()) else {
        return Ok(());
    };
    for d in devices {
        let path = d.path().display().to_string();
        let Some(rel) = path.strip_prefix("/dev/") else {
            return Err(InitError {
                step: format!("device {path}"),
                detail: "devices must be under /dev".into(),
            });
        };
        let kind = match d.typ() {
            LinuxDeviceType::B => SFlag::S_IFBLK,
            LinuxDeviceType::P => SFlag::S_IFIFO,
            _ => SFlag::S_IFCHR,
        };
        // Nested device paths (/dev/dri/card0) get their directories.
        let (dir, name) = match rel.rsplit_once('/') {
            Some((d, n)) => (
                {
                    let t = mounts::target(rootfd, &format!("/dev/{d}"), true)
                        .map_err(fail(format!("device {path}")))?;
                    openat2(
                        t.as_fd(),
                        ".",
                        OpenHow::new()
                            .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
                    )
                    .map_err(fail(format!("device {path}")))?
                },
                n.to_string(),
            ),
            None => (
                openat2(
                    devdir.as_fd(),
                    ".",
                    OpenHow::new().flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC),
                )
                .map_err(fail(format!("device {path}")))?,
                rel.to_string(),
            ),
        };
        make_node(
            &dir,
            &name,
            kind,
            d.file_mode().unwrap_or(0o666),
            makedev(d.major() as u64, d.minor() as u64),
            (d.uid().unwrap_or(0), d.gid().unwrap_or(0)),
            userns,
        )?;
    }
    Ok(())
}

/// Makes a device node in the container's /dev; in a user namespace, where the kernel refuses
/// mknod, binds the host's node of the same number onto an empty file instead.
fn make_node(
    dir: &OwnedFd,
    name: &str,
    kind: SFlag,
    mode: u32,
    dev: u64,
    (uid, gid): (u32, u32),
    userns: bool,
) -> Result<(), InitError> {
    let step = format!("/dev/{name}");
    match unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(fail(&step)(e)),
    }
    if userns {
        let host = host_node(kind, dev).ok_or_else(|| InitError {
            step: step.clone(),
            detail: "no device node with this number on the host to bind".into(),
        })?;
        let file: OwnedFd = nix::fcntl::openat(
            dir.as_fd(),
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(fail(&step))?;
        return mount(
            Some(&host),
            &mounts::fd_path(&file),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(fail(format!("{step}: bind {}", host.display())));
    }
    mknodat(dir.as_fd(), name, kind, Mode::from_bits_truncate(mode), dev).map_err(fail(&step))?;
    // mknod applied the umask; set the mode and owner exactly.
    nix::sys::stat::fchmodat(
        dir.as_fd(),
        name,
        Mode::from_bits_truncate(mode),
        nix::sys::stat::FchmodatFlags::FollowSymlink,
    )
    .map_err(fail(&step))?;
    nix::unistd::fchownat(
        dir.as_fd(),
        name,
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(fail(&step))
}

fn pivot(rootfd: &OwnedFd) -> Result<(), InitError> {
    let oldroot: OwnedFd = nix::fcntl::open(
        "/",
        OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(fail("open old root"))?;
    nix::unistd::fchdir(rootfd.as_fd()).map_err(fail("chdir rootfs"))?;
    nix::unistd::pivot_root(".", ".").map_err(fail("pivot_root"))?;
    // The old root now sits on top of the new one. Step into it, make it a slave so its detach
    // cannot propagate to the host, and detach it; the new root's own mounts keep their
    // propagation (a Bidirectional mount stays shared with the host).
    nix::unistd::fchdir(oldroot.as_fd()).map_err(fail("chdir old root"))?;
    mount(
        None::<&str>,
        ".",
        None::<&str>,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail("old root propagation"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(fail("detach old root"))?;
    std::env::set_current_dir("/").map_err(fail("chdir /"))
}

fn mask(path: &str) -> Result<(), InitError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(fail(format!("mask {path}"))(e)),
    };
    if meta.is_dir() {
        mount(
            Some("tmpfs"),
            path,
            Some("tmpfs"),
            MsFlags::MS_RDONLY,
            None::<&str>,
        )
    } else {
        mount(
            Some("/dev/null"),
            path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
    }
    .map_err(fail(format!("mask {path}")))
}

fn read_only(path: &str) -> Result<(), InitError> {
    match mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    ) {
        Ok(()) => {}
        Err(Errno::ENOENT) => return Ok(()),
        Err(e) => return Err(fail(format!("read-only {path}"))(e)),
    }
    mount(
        None::<&str>,
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(fail(format!("read-only {path}")))
}

/// Writes a sysctl (`net.ipv4.ip_forward` or `net/ipv4/ip_forward`) for the caller's namespaces.
pub fn write_sysctl(key: &str, value: &str) -> Result<(), InitError> {
    if key.contains("..") || key.starts_with('/') {
        return Err(InitError {
            step: format!("sysctl {key}"),
            detail: "invalid name".into(),
        });
    }
    let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
    std::fs::write(&path, value).map_err(fail(format!("sysctl {key}={value}")))
}

fn resource(t: PosixRlimitType) -> nix::sys::resource::Resource {
    use nix::sys::resource::Resource as R;
    match t {
        PosixRlimitType::RlimitCpu => R::RLIMIT_CPU,
        PosixRlimitType::RlimitFsize => R::RLIMIT_FSIZE,
        PosixRlimitType::RlimitData => R::RLIMIT_DATA,
        PosixRlimitType::RlimitStack => R::RLIMIT_STACK,
        PosixRlimitType::RlimitCore => R::RLIMIT_CORE,
        PosixRlimitType::RlimitRss => R::RLIMIT_RSS,
        PosixRlimitType::RlimitNproc => R::RLIMIT_NPROC,
        PosixRlimitType::RlimitNofile => R::RLIMIT_NOFILE,
        PosixRlimitType::RlimitMemlock => R::RLIMIT_MEMLOCK,
        PosixRlimitType::RlimitAs => R::RLIMIT_AS,
        PosixRlimitType::RlimitLocks => R::RLIMIT_LOCKS,
        PosixRlimitType::RlimitSigpending => R::RLIMIT_SIGPENDING,
        PosixRlimitType::RlimitMsgqueue => R::RLIMIT_MSGQUEUE,
        PosixRlimitType::RlimitNice => R::RLIMIT_NICE,
        PosixRlimitType::RlimitRtprio => R::RLIMIT_RTPRIO,
        PosixRlimitType::RlimitRttime => R::RLIMIT_RTTIME,
    }
}

/// Sets `oom_score_adj`, clamped to what this process may set: without CAP_SYS_RESOURCE a value
/// below the current one is refused by the kernel, and a pod must not fail for it.
pub fn set_oom_score_adj(want: i32) -> Result<(), InitError> {
    let path = "/proc/self/oom_score_adj";
    let current: i32 = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let may_lower = caps::has_cap(
        None,
        caps::CapSet::Effective,
        caps::Capability::CAP_SYS_RESOURCE,
    )
    .unwrap_or(false);
    let value = if want < current && !may_lower {
        current
    } else {
        want
    };
    match std::fs::write(path, value.to_string()) {
        // Capabilities of a user namespace do not count for this: keep the current value.
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && value < current => Ok(()),
        r => r.map_err(fail(format!("oom_score_adj {value}"))),
    }
}

fn cap_set(set: Option<&oci_spec::runtime::Capabilities>) -> Result<caps::CapsHashSet, InitError> {
    let mut out = caps::CapsHashSet::new();
    for c in set.into_iter().flatten() {
        let name = format!("CAP_{c}");
        let cap: caps::Capability = name.parse().map_err(|_| InitError {
            step: "capabilities".into(),
            detail: format!("unknown capability {name}"),
        })?;
        out.insert(cap);
    }
    Ok(out)
}

/// The process half shared by container init and exec: rlimits, oom_score_adj, AppArmor,
/// groups, user, capabilities, no_new_privs, seccomp.
pub fn apply_process(p: &Process, seccomp: Option<&Compiled>) -> Result<(), InitError> {
    for r in p.rlimits().as_deref().unwrap_or_default() {
        nix::sys::resource::setrlimit(resource(r.typ()), r.soft(), r.hard())
            .map_err(fail(format!("rlimit {:?}", r.typ())))?;
    }
    if let Some(adj) = p.oom_score_adj() {
        set_oom_score_adj(adj)?;
    }
    if let Some(mask) = p.user().umask() {
        nix::sys::stat::umask(Mode::from_bits_truncate(mask));
    }
    if let Some(profile) = p.apparmor_profile() {
        apparmor_on_exec(profile)?;
    }
    if let Some(label) = p.selinux_label() {
        super::selinux::set_exec_label(Some(label))
            .map_err(fail(format!("SELinux label {label}")))?;
    }
    let nnp = p.no_new_privileges().unwrap_or(false);
    // Without no_new_privs only a privileged caller may install a filter, so it goes on now, and
    // the calls still to come (setgroups, setuid, capset, execve) must pass it, as with runc.
    if !nnp && let Some(f) = seccomp {
        super::seccomp::install(&f.program, f.flags).map_err(fail("seccomp"))?;
    }
    let caps_spec = p.capabilities().as_ref();
    let bounding = cap_set(caps_spec.and_then(|c| c.bounding().as_ref()))?;
    let effective = cap_set(caps_spec.and_then(|c| c.effective().as_ref()))?;
    let permitted = cap_set(caps_spec.and_then(|c| c.permitted().as_ref()))?;
    let inheritable = cap_set(caps_spec.and_then(|c| c.inheritable().as_ref()))?;
    let ambient = cap_set(caps_spec.and_then(|c| c.ambient().as_ref()))?;
    // The bounding set shrinks while we still hold CAP_SETPCAP.
    for cap in caps::all() {
        if !bounding.contains(&cap)
            && caps::has_cap(None, caps::CapSet::Bounding, cap).unwrap_or(false)
        {
            caps::drop(None, caps::CapSet::Bounding, cap)
                .map_err(fail(format!("drop {cap} from bounding set")))?;
        }
    }
    let user = p.user();
    let groups: Vec<Gid> = user
        .additional_gids()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|g| Gid::from_raw(*g))
        .collect();
    nix::unistd::setgroups(&groups).map_err(fail("setgroups"))?;
    let gid = Gid::from_raw(user.gid());
    nix::unistd::setresgid(gid, gid, gid).map_err(fail(format!("setgid {gid}")))?;
    nix::sys::prctl::set_keepcaps(true).map_err(fail("keep capabilities"))?;
    let uid = Uid::from_raw(user.uid());
    nix::unistd::setresuid(uid, uid, uid).map_err(fail(format!("setuid {uid}")))?;
    nix::sys::prctl::set_keepcaps(false).map_err(fail("keep capabilities"))?;
    // capset writes all three sets at once and effective must stay within permitted: inheritable
    // while CAP_SETPCAP is still effective, then effective, then permitted.
    caps::set(None, caps::CapSet::Inheritable, &inheritable)
        .map_err(fail("inheritable capabilities"))?;
    caps::set(None, caps::CapSet::Effective, &effective).map_err(fail("effective capabilities"))?;
    caps::set(None, caps::CapSet::Permitted, &permitted).map_err(fail("permitted capabilities"))?;
    caps::clear(None, caps::CapSet::Ambient).map_err(fail("ambient capabilities"))?;
    for cap in ambient {
        caps::raise(None, caps::CapSet::Ambient, cap).map_err(fail(format!("ambient {cap}")))?;
    }
    if nnp {
        nix::sys::prctl::set_no_new_privs().map_err(fail("no_new_privs"))?;
        if let Some(f) = seccomp {
            super::seccomp::install(&f.program, f.flags).map_err(fail("seccomp"))?;
        }
    }
    Ok(())
}

/// Asks AppArmor to confine the next exec with `profile`.
fn apparmor_on_exec(profile: &str) -> Result<(), InitError> {
    let cmd = format!("exec {profile}");
    let step = format!("AppArmor profile {profile}");
    match std::fs::write("/proc/thread-self/attr/apparmor/exec", &cmd) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write("/proc/thread-self/attr/exec", &cmd).map_err(fail(step))
        }
        Err(e) => Err(fail(step)(e)),
    }
}

/// Looks up `args[0]` in the process's PATH (as runc does) and execs it.
pub fn exec(p: &Process) -> Result<Infallible, InitError> {
    let args = p.args().as_deref().unwrap_or_default();
    let Some(arg0) = args.first() else {
        return Err(InitError {
            step: "exec".into(),
            detail: "no command: the container has neither command nor image entrypoint".into(),
        });
    };
    let env = p.env().as_deref().unwrap_or_default();
    let path = resolve(arg0, env).ok_or_else(|| InitError {
        step: "exec".into(),
        detail: format!("{arg0:?}: executable file not found in $PATH"),
    })?;
    let cstr = |s: &str| CString::new(s).map_err(fail("exec: NUL in argument or environment"));
    let argv: Vec<CString> = args.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let envp: Vec<CString> = env.iter().map(|e| cstr(e)).collect::<Result<_, _>>()?;
    let prog = CString::new(path.as_os_str().as_encoded_bytes()).map_err(fail("exec"))?;
    let err = nix::unistd::execve(&prog, &argv, &envp).unwrap_err();
    Err(InitError {
        step: "exec".into(),
        detail: format!("{}: {err}", path.display()),
    })
}

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn resolve(arg0: &str, env: &[String]) -> Option<PathBuf> {
    if arg0.contains('/') {
        return Some(PathBuf::from(arg0));
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or(DEFAULT_PATH);
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(arg0))
        .find(|p| {
            nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
                && std::fs::metadata(p).is_ok_and(|m| m.is_file())
        })
}

/// Whether a path component walk from the root reaches `path` without symlinks (for checks).
pub fn open_in_root(root: &Path, path: &str) -> std::io::Result<OwnedFd> {
    let rootfd: OwnedFd = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let rel: PathBuf = Path::new(path)
        .components()
        .filter(|c| matches!(c, std::path::Component::Normal(_)))
        .collect();
    Ok(openat2(
        rootfd.as_fd(),
        &rel,
        OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )?)
}
