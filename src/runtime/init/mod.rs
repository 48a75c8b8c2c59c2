//! The container's init, between fork and exec, in the child of `crius monitor`: close every
//! descriptor it was not given, join the pod's namespaces, take a private mount namespace, mount
//! the spec's filesystems inside the rootfs (resolved in-root, see `mounts`; none may land in
//! `/proc` but lxcfs's files), create `/dev`, `pivot_root`, mask paths and make paths read-only
//! by descriptor (`paths`), then set up the process (stdio, oom_score_adj and LSM labels
//! through the runtime's own procfs handle, then with only stdio left open the working
//! directory, checked to be inside the root, rlimits, user, capabilities, no_new_privs) and
//! exec. The monitor made it non-dumpable, so no process of the container can open its
//! descriptors or executable through `/proc` before the exec. Any failure is written to the
//! error pipe, which exec closes on success.

use std::convert::Infallible;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid};
use oci_spec::runtime::{Mount, Spec};

mod dev;
mod paths;
mod process;

pub use process::{
    BAD_COMMAND, apply_process, container_terminal, enter_working_dir, exec, label_exec,
    set_oom_score_adj,
};

use super::hooks;
use super::mounts::{self, Options};
use super::procfs::ProcRef;
use super::seccomp::Compiled;
use crate::sys;

/// A failed step, as the monitor reports it.
pub use super::step::StepError as InitError;
use super::step::step as fail;

/// The child's stdio: pipes (or /dev/null) the monitor made, or, for a container with a
/// terminal, a socket on which the init hands the monitor the master of a terminal it makes in
/// the container's own devpts (as runc's console socket), so `tty` names it inside.
pub enum Stdio {
    Pipes {
        stdin: OwnedFd,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    Console(OwnedFd),
}

impl Stdio {
    fn raw_fds(&self) -> Vec<RawFd> {
        match self {
            Stdio::Pipes {
                stdin,
                stdout,
                stderr,
            } => vec![stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
            Stdio::Console(c) => vec![c.as_raw_fd()],
        }
    }
}

/// What the init sets up.
pub struct Plan<'a> {
    pub spec: &'a Spec,
    pub join: &'a [super::JoinNamespace],
    pub cgroup: Option<&'a Path>,
    /// The v1 devices cgroup, on a node without v2.
    pub devices_cgroup: Option<&'a Path>,
    pub seccomp: Option<&'a Compiled>,
    /// The environment's values that are not UTF-8 (see `RawEnv`).
    pub raw_env: &'a [super::RawEnv],
    /// The pod's user namespace (its handle): joined first; bind mounts are idmapped into it.
    pub userns: Option<&'a Path>,
    /// With a user namespace and a PID namespace of the container's own, which must belong to
    /// the user namespace: the init makes it, forks once more, sends the new process's pid here
    /// and exits; the new process is the container.
    pub pid_report: Option<OwnedFd>,
    /// With a systemd scope: a byte here means the monitor has seen the init placed in it; end
    /// of file means it was not.
    pub placement: Option<OwnedFd>,
    /// A pidfd of the monitor that forked us: until the exec we end with it.
    pub monitor: BorrowedFd<'a>,
    /// The monitor's handle on procfs, for every write there (see `procfs`).
    pub proc: ProcRef<'a>,
    /// The container's id and bundle, for the state its hooks read.
    pub id: &'a str,
    pub bundle: &'a Path,
    /// With `prestart` or `createRuntime` hooks: a byte written to the first says the mounts
    /// are made; a byte read from the second says the monitor ran them (see `hooks`).
    pub hook_pause: Option<(OwnedFd, OwnedFd)>,
}

/// Runs the container init in the forked child; never returns.
pub fn run(plan: Plan, stdio: Stdio, errors: OwnedFd) -> ! {
    let e = match setup(plan, stdio, errors.as_raw_fd()) {
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

/// Whether `path` is on a sysfs.
fn is_sysfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::SYSFS_MAGIC)
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
        // sysfs cannot be idmapped: the host's /sys (a pod on the host network) is bound
        // plainly from inside the user namespace, where it stays read-only.
        if is_sysfs(&source) {
            out.push(None);
            continue;
        }
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
        let what = format!(
            "mount {} on {}",
            source.display(),
            m.destination().display()
        );
        let tree = mounts::idmapped(&source, userns, recursive, attrs, opts.recursive_ro)
            .map_err(fail(what.clone()))?;
        mounts::set_recursive(&tree, &opts).map_err(fail(what))?;
        out.push(Some(tree));
    }
    Ok(out)
}

/// Joins the pod's user namespace as its root (the IDs the container's files are made with
/// until the process takes its own); with `pid_report`, also a new PID namespace of that user
/// namespace, entered by forking: the parent reports the child's pid and exits. Dies with
/// `monitor` throughout, as the rest of the setup does.
fn enter_userns(
    userns: &Path,
    pid_report: Option<OwnedFd>,
    monitor: BorrowedFd<'_>,
) -> Result<(), InitError> {
    let die_with_monitor = || {
        crate::runtime::process::die_with_monitor(monitor).map_err(fail("dying with the monitor"))
    };
    join_namespace("user", userns)?;
    let root = Gid::from_raw(0);
    nix::unistd::setresgid(root, root, root).map_err(fail("setgid 0 in the user namespace"))?;
    let root = Uid::from_raw(0);
    nix::unistd::setresuid(root, root, root).map_err(fail("setuid 0 in the user namespace"))?;
    // The new IDs lifted the parent-death signal.
    die_with_monitor()?;
    let Some(report) = pid_report else {
        return Ok(());
    };
    unshare(CloneFlags::CLONE_NEWPID).map_err(fail("new pid namespace"))?;
    // For the child to see us go: only then is the monitor (a subreaper) its parent, and only a
    // signal armed after that is tied to the monitor rather than to us.
    let me = sys::pidfd_open(std::process::id() as i32).map_err(fail("pidfd of the init"))?;
    match sys::fork().map_err(fail("fork into the pid namespace"))? {
        nix::unistd::ForkResult::Child => {
            drop(report);
            let mut fds = [nix::poll::PollFd::new(
                me.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE)
                .map_err(fail("waiting for the parent to report"))?;
            die_with_monitor()
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

/// The init's steps in order, from the fork to the exec (see the module's comment).
fn setup(plan: Plan, stdio: Stdio, errors: RawFd) -> Result<Infallible, InitError> {
    release_monitor(&plan, &stdio, errors)?;
    let Plan {
        spec,
        join,
        cgroup,
        devices_cgroup,
        seccomp,
        raw_env,
        userns,
        pid_report,
        placement,
        monitor,
        proc,
        id,
        bundle,
        hook_pause,
    } = plan;
    enter_cgroup(placement, cgroup)?;
    // Before the container can open anything, and before the pod's namespaces hide the host's
    // cgroup mounts.
    if let Some(dev) = devices_cgroup {
        join_cgroup(dev)?;
    }
    let process = spec.process().as_ref().ok_or_else(|| InitError {
        step: "process".into(),
        detail: "the spec has no process".into(),
    })?;
    // While still the host's root: a user namespace's root may not write it.
    if let Some(adj) = process.oom_score_adj() {
        set_oom_score_adj(proc, adj)?;
    }
    let mut idmapped = match userns {
        Some(ns) => idmapped_binds(spec, ns)?,
        None => Vec::new(),
    };
    if let Some(ns) = userns {
        enter_userns(ns, pid_report, monitor)?;
    }
    // On v1 too, so a container that may mount (CAP_SYS_ADMIN) finds its own devices cgroup
    // at the root of any hierarchy it mounts, never the host's root to move itself into.
    enter_namespaces(join, cgroup.is_some() || devices_cgroup.is_some())?;

    let linux = spec.linux().as_ref();
    let (rootfd, real_root) = open_rootfs(spec, proc)?;
    dev::refuse_linked_dev(&rootfd)?;
    let has_dev = mount_spec(
        spec,
        &mut idmapped,
        &MountRoot {
            fd: &rootfd,
            real: &real_root,
            proc,
        },
    )?;
    drop(idmapped);
    if has_dev {
        dev::populate_dev(spec, &rootfd, userns.is_some())?;
    }
    let cwd = process.cwd().display().to_string();
    mounts::target(&rootfd, &cwd, true).map_err(fail(format!("working directory {cwd}")))?;
    // The host's /dev/null, checked, one detached copy per path to mask: taken while the host's
    // tree is still ours to take it from, never from the container's /dev (CVE-2025-31133).
    let masked = linux
        .and_then(|l| l.masked_paths().clone())
        .unwrap_or_default();
    let nulls = paths::null_mounts(masked.len())?;

    let subject = HookSubject { spec, id, bundle };
    await_monitor_hooks(hook_pause)?;
    run_create_container_hooks(&subject)?;

    pivot(&rootfd)?;
    drop(rootfd);

    paths::mask(&masked, nulls)?;
    guard_tree(spec, proc)?;

    take_stdio(stdio)?;
    label_exec(proc, process)?;
    // From here the init holds stdio and the error pipe, nothing else.
    sys::close_all_except(&[errors]).map_err(fail("closing descriptors"))?;
    enter_working_dir(Path::new(&cwd))?;
    apply_process(process, seccomp)?;
    // The path is the container's to resolve, so the hook runs with the container process's
    // own user, capabilities, seccomp filter and LSM label, as runc runs it: an image cannot
    // put a program there that runs with more.
    hooks::run(
        spec,
        hooks::Kind::StartContainer,
        &subject.state("created", std::process::id() as i32),
    )?;
    exec(process, raw_env)
}

/// Nothing of the monitor's may reach the container (CVE-2024-21626, CVE-2016-9962): closes
/// every descriptor but what the init was given (all of it gone or close-on-exec by the exec),
/// dies with the monitor from here on, and resets the signals: the monitor blocked some for its
/// own loop and Rust ignores SIGPIPE, while the container starts with none blocked or ignored.
fn release_monitor(plan: &Plan, stdio: &Stdio, errors: RawFd) -> Result<(), InitError> {
    let mut keep = stdio.raw_fds();
    keep.extend([errors, plan.monitor.as_raw_fd(), plan.proc.raw()]);
    keep.extend(
        plan.pid_report
            .iter()
            .chain(plan.placement.iter())
            .chain(plan.hook_pause.iter().flat_map(|(a, b)| [a, b]))
            .map(AsRawFd::as_raw_fd),
    );
    sys::close_all_except(&keep).map_err(fail("closing the monitor's descriptors"))?;
    crate::runtime::process::die_with_monitor(plan.monitor)
        .map_err(fail("dying with the monitor"))?;
    sys::reset_signals().map_err(fail("reset signals"))
}

/// Waits, with a systemd scope, until the monitor has seen the init placed in it; then joins
/// the container's cgroup, before anything else, so every later step is accounted.
fn enter_cgroup(placement: Option<OwnedFd>, cgroup: Option<&Path>) -> Result<(), InitError> {
    if let Some(p) = placement {
        let mut b = [0u8; 1];
        std::fs::File::from(p).read_exact(&mut b).map_err(fail(
            "waiting to be placed in the container's systemd scope",
        ))?;
    }
    if let Some(cg) = cgroup {
        join_cgroup(cg)?;
    }
    Ok(())
}

/// Moves this process into the cgroup directory `cg`, of either version.
pub fn join_cgroup(cg: &Path) -> Result<(), InitError> {
    std::fs::write(cg.join("cgroup.procs"), "0")
        .map_err(fail(format!("joining cgroup {}", cg.display())))
}

/// Joins the pod's namespaces (but its PID namespace, which the monitor joined, and its user
/// namespace, joined before) and takes a new mount namespace, with a cgroup namespace rooted at
/// the container's cgroup (`own_cgroup`) so its /sys/fs/cgroup shows only itself.
fn enter_namespaces(join: &[super::JoinNamespace], own_cgroup: bool) -> Result<(), InitError> {
    for ns in join.iter().filter(|n| n.kind != "pid" && n.kind != "user") {
        join_namespace(&ns.kind, &ns.path)?;
    }
    let mut flags = CloneFlags::CLONE_NEWNS;
    if own_cgroup {
        flags |= CloneFlags::CLONE_NEWCGROUP;
    }
    unshare(flags).map_err(fail("new mount and cgroup namespaces"))
}

/// Readies the spec's rootfs for its mounts and pivot_root, and opens it. Returns it with its
/// path as the kernel names it, to tell where a mount really lands.
fn open_rootfs(spec: &Spec, proc: ProcRef<'_>) -> Result<(OwnedFd, PathBuf), InitError> {
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
    let real_root = proc
        .fd_target(rootfd.as_raw_fd())
        .map_err(fail(format!("open rootfs {}", root.display())))?;
    Ok((rootfd, real_root))
}

/// Where the spec's mounts go: the open rootfs, and its path as the kernel names it.
struct MountRoot<'a> {
    fd: &'a OwnedFd,
    real: &'a Path,
    proc: ProcRef<'a>,
}

/// Makes the spec's mounts inside the rootfs, in order; `idmapped` holds, per mount, the
/// idmapped tree made for it on the host's side, taken as it is attached. Returns whether a
/// filesystem was mounted on /dev.
fn mount_spec(
    spec: &Spec,
    idmapped: &mut [Option<OwnedFd>],
    root: &MountRoot,
) -> Result<bool, InitError> {
    let mut has_dev = false;
    for (i, m) in spec
        .mounts()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        if mount_one(m, idmapped.get_mut(i), root)? {
            has_dev = true;
        }
    }
    Ok(has_dev)
}

/// Makes one spec mount, its target resolved inside the rootfs and refused in /proc (but
/// procfs on /proc itself): an idmapped tree attached, a bind, or a filesystem. Returns
/// whether it was a filesystem on /dev.
fn mount_one(
    m: &Mount,
    idmapped: Option<&mut Option<OwnedFd>>,
    root: &MountRoot,
) -> Result<bool, InitError> {
    let MountRoot {
        fd: rootfd,
        real: real_root,
        proc,
    } = *root;
    let dest = m.destination().display().to_string();
    let opts = Options::parse(m.options().as_deref().unwrap_or_default());
    let kind = m.typ().as_deref().unwrap_or("bind");
    let step = format!("mount {kind} on {dest}");
    if let Some(tree) = idmapped.and_then(Option::take) {
        let source = m.source().clone().unwrap_or_default();
        let meta = std::fs::metadata(&source)
            .map_err(fail(format!("{step}: source {}", source.display())))?;
        let target = mounts::target(rootfd, &dest, meta.is_dir()).map_err(fail(&step))?;
        paths::refuse_into_proc(proc, real_root, &target, &step)?;
        mounts::attach_at(&tree, &target, opts.propagation).map_err(fail(&step))?;
    } else if opts.flags.contains(MsFlags::MS_BIND) || kind == "bind" {
        let source = m.source().clone().unwrap_or_default();
        let meta = std::fs::metadata(&source)
            .map_err(fail(format!("{step}: source {}", source.display())))?;
        let target = mounts::target(rootfd, &dest, meta.is_dir()).map_err(fail(&step))?;
        paths::refuse_into_proc(proc, real_root, &target, &step)?;
        mounts::bind(&source, &target, &opts).map_err(fail(&step))?;
    } else {
        let target = mounts::target(rootfd, &dest, true).map_err(fail(&step))?;
        if !(kind == "proc" && dest == "/proc") {
            paths::refuse_into_proc(proc, real_root, &target, &step)?;
        }
        let source = m
            .source()
            .as_ref()
            .map(|s| s.display().to_string())
            .unwrap_or_else(|| kind.to_string());
        mounts::mount_fs(kind, &source, &target, &opts).map_err(fail(&step))?;
        return Ok(dest == "/dev");
    }
    Ok(false)
}

/// The container as its hooks are told about it.
struct HookSubject<'a> {
    spec: &'a Spec,
    id: &'a str,
    bundle: &'a Path,
}

impl<'a> HookSubject<'a> {
    /// The state a hook reads on its stdin.
    fn state(&self, status: &'a str, pid: i32) -> hooks::State<'a> {
        hooks::State {
            oci_version: hooks::OCI_VERSION,
            id: self.id,
            status,
            pid,
            bundle: self.bundle,
            annotations: self.spec.annotations().as_ref(),
        }
    }
}

/// With hooks the monitor runs before pivot_root (`Plan::hook_pause`): tells it the mounts are
/// made and waits until it has run them.
fn await_monitor_hooks(hook_pause: Option<(OwnedFd, OwnedFd)>) -> Result<(), InitError> {
    if let Some((tell, go)) = hook_pause {
        std::fs::File::from(tell)
            .write_all(&[1])
            .map_err(fail("asking the monitor to run its hooks"))?;
        let mut b = [0u8; 1];
        std::fs::File::from(go)
            .read_exact(&mut b)
            .map_err(fail("waiting for the monitor's hooks"))?;
    }
    Ok(())
}

/// Runs the spec's createContainer hooks, before pivot_root.
fn run_create_container_hooks(subject: &HookSubject) -> Result<(), InitError> {
    if !hooks::of(subject.spec, hooks::Kind::CreateContainer).is_empty() {
        // The hook sees the host's /proc, so the pid it is told is the host's.
        let pid = std::fs::read_link("/proc/self")
            .ok()
            .and_then(|p| p.to_str()?.parse().ok())
            .unwrap_or(0);
        hooks::run(
            subject.spec,
            hooks::Kind::CreateContainer,
            &subject.state("creating", pid),
        )?;
    }
    Ok(())
}

/// After pivot_root and masking: makes the spec's read-only paths read-only, writes its sysctls
/// and makes the root read-only if the spec asks.
fn guard_tree(spec: &Spec, proc: ProcRef<'_>) -> Result<(), InitError> {
    if let Some(l) = spec.linux().as_ref() {
        for p in l.readonly_paths().as_deref().unwrap_or_default() {
            paths::read_only(p)?;
        }
        if let Some(sysctls) = l.sysctl() {
            for (k, v) in sysctls {
                write_sysctl(proc, k, v)?;
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
    Ok(())
}

/// Starts a new session and gives the container its stdio: the monitor's pipes, or a terminal
/// made in the container's devpts, its controlling terminal (the master goes to the monitor).
fn take_stdio(stdio: Stdio) -> Result<(), InitError> {
    nix::unistd::setsid().map_err(fail("setsid"))?;
    match stdio {
        Stdio::Pipes {
            stdin,
            stdout,
            stderr,
        } => {
            sys::dup_to(&stdin, 0, false).map_err(fail("stdin"))?;
            sys::dup_to(&stdout, 1, false).map_err(fail("stdout"))?;
            sys::dup_to(&stderr, 2, false).map_err(fail("stderr"))?;
        }
        Stdio::Console(console) => {
            let slave = container_terminal(&console)?;
            drop(console);
            sys::set_controlling_tty(&slave).map_err(fail("controlling terminal"))?;
            for fd in 0..3 {
                sys::dup_to(&slave, fd, false).map_err(fail("terminal stdio"))?;
            }
        }
    }
    Ok(())
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

/// Writes a sysctl (`net.ipv4.ip_forward` or `net/ipv4/ip_forward`) for the caller's namespaces,
/// through the runtime's procfs handle.
pub fn write_sysctl(proc: ProcRef<'_>, key: &str, value: &str) -> Result<(), InitError> {
    proc.write(&sysctl_path(key)?, value.as_bytes())
        .map_err(fail(format!("sysctl {key}={value}")))
}

/// Where a sysctl lives under /proc: `sys/` and its name with dots as slashes.
pub fn sysctl_path(key: &str) -> Result<String, InitError> {
    if key.contains("..") || key.starts_with('/') {
        return Err(InitError {
            step: format!("sysctl {key}"),
            detail: "invalid name".into(),
        });
    }
    Ok(format!("sys/{}", key.replace('.', "/")))
}

/// Opens `path` for reading with the rootfs as `/` (its links resolved inside it), without
/// waiting: a FIFO there opens at once, and the caller checks what it got.
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
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )?)
}
