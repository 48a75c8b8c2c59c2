//! Starting the container, the monitor's first job: read the bundle, make the container's stdio
//! and the pipes the init reports on, bind the monitor's socket, block the signals its loop
//! reads, enter the PID namespace every later child lands in, then fork the init (or have criu
//! restore it, see `restore`) and wait until it has exec'd or failed. It hands back the
//! `Monitor` that watches the container from then on. It may use the monitor's shared pieces
//! (`Monitor`, `report`, `cloexec_pipe`), `restore`, `oom` and the runtime's `init`, `hooks`,
//! `logs`, `procfs` and `seccomp`; nothing here runs once the loop has begun.

use std::io::{IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid};
use oci_spec::runtime::{Process, Spec};

use super::attach::StdinState;
use super::oom::OomWatch;
use super::restore;
use super::{Monitor, cloexec_pipe, report};
use crate::runtime::hooks::{self, MonitorHooks};
use crate::runtime::init::{self, Stdio};
use crate::runtime::logs::{LogWriter, Stream};
use crate::runtime::procfs::ProcFs;
use crate::runtime::seccomp::{self, Compiled};
use crate::runtime::step::{StepError, step};
use crate::runtime::{
    MONITOR_SOCKET, MonitorConfig, ProcessId, RestoreConfig, StartReport, now_nanos,
};
use crate::sys;

/// Starts the container as the bundle says and returns its monitor with the report for the
/// daemon.
pub(super) fn start(bundle: &Path) -> Result<(Monitor, StartReport), StepError> {
    let began = std::time::Instant::now();
    // Only what we open ourselves (close-on-exec) may reach the container.
    sys::close_from(3).map_err(step("close inherited descriptors"))?;
    // Not dumpable, nor is what we fork until it execs: no process of a container can open
    // our descriptors, memory or executable through /proc (CVE-2016-9962).
    nix::sys::prctl::set_dumpable(false).map_err(step("not dumpable"))?;
    let proc = ProcFs::open().map_err(step("/proc"))?;
    let _ = nix::unistd::setsid();
    let Bundle {
        cfg,
        spec,
        hooks,
        process,
        seccomp,
    } = read_bundle(bundle)?;
    let log = open_log(&cfg)?;
    let ContainerStdio {
        init: child_stdio,
        console,
        mut outputs,
        stdin: mut stdin_keep,
    } = container_stdio(&cfg)?;
    let (err_r, err_w) = cloexec_pipe()?;
    // Our own pidfd, for the children we fork to die with us until they exec.
    let own_fd =
        sys::pidfd_open(std::process::id() as i32).map_err(step("pidfd of the monitor"))?;
    let (listener, sock_path) = bind_socket(bundle)?;
    let signals = block_signals()?;

    // In a user namespace a new PID namespace must belong to it, so the init makes it and forks
    // the container into it (see `init::Plan::pid_report`); we reap that grandchild as
    // subreaper and join its namespace.
    let userns_pid = cfg.userns.is_some() && cfg.new_pid_ns;
    let restoring = cfg.restore.is_some();
    enter_pid_namespace(&cfg, userns_pid, restoring)?;
    let (pid_r, pid_w) = pipe_if(userns_pid)?;
    // The init waits before pivot_root while we run prestart and createRuntime hooks.
    let (pause_child, pause_ours) = hook_pause_pipes(&spec)?;
    let (placed_r, placed_w) = pipe_if(cfg.placed)?;
    let pipes = InitPipes {
        err_r,
        err_w,
        pid_r,
        pid_w,
        pause_child,
        pause_ours,
        placed_r,
        placed_w,
    };
    let mut oom = watch_oom(&cfg);
    let launch = Launch {
        bundle,
        cfg: &cfg,
        spec: &spec,
        seccomp: &seccomp,
        hooks: &hooks,
        own_fd: &own_fd,
        proc: &proc,
        sock_path: &sock_path,
    };
    let forking = std::time::Instant::now();
    let child = launch_init(&launch, child_stdio, pipes, &mut oom)?;
    let execd = std::time::Instant::now();

    let unowned = Unowned {
        child,
        sock_path: &sock_path,
    };
    let terminal = take_terminal(console, cfg.stdin, &mut outputs, &mut stdin_keep, unowned)?;
    if userns_pid || restoring {
        unowned.join_pid_namespace()?;
    }
    let started_at = now_nanos();
    let (id, init_fd) = unowned.identify()?;
    let monitor = Monitor {
        child,
        init_fd,
        own_fd,
        proc,
        log,
        outputs,
        signals,
        listener,
        execs: Vec::new(),
        process,
        seccomp,
        userns: cfg.userns.is_some(),
        cgroup: cfg.cgroup.clone(),
        devices_cgroup: cfg.devices_cgroup.clone(),
        raw_env: cfg.raw_env.clone(),
        oom,
        exit_file: cfg.exit_file.clone(),
        stdin: StdinState {
            fd: stdin_keep,
            pending: Vec::new(),
            // As containerd: a terminal's stdin is never closed for an attacher.
            once: cfg.stdin_once && !cfg.tty,
            closing: false,
        },
        terminal,
        attachers: Vec::new(),
        hooks,
    };
    if let Some(h) = &monitor.hooks {
        h.poststart(child.as_raw());
    }
    Ok((
        monitor,
        StartReport::Started {
            pid: id.pid,
            start_time: id.start_time,
            started_at,
            setup_us: micros(forking - began),
            init_us: micros(execd - forking),
        },
    ))
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// What the bundle says: the monitor's own config, the container's spec, and what the monitor
/// takes from the spec.
struct Bundle {
    cfg: MonitorConfig,
    spec: Spec,
    hooks: Option<MonitorHooks>,
    process: Process,
    seccomp: Option<Compiled>,
}

/// Reads `monitor.json` and `config.json`, the spec's hooks that are the monitor's to run, its
/// process, and the seccomp program the daemon compiled for it.
fn read_bundle(bundle: &Path) -> Result<Bundle, StepError> {
    let read = |name: &str| {
        std::fs::read(bundle.join(name)).map_err(step(bundle.join(name).display().to_string()))
    };
    let cfg: MonitorConfig =
        serde_json::from_slice(&read("monitor.json")?).map_err(step("monitor.json"))?;
    let spec: Spec = serde_json::from_slice(&read("config.json")?).map_err(step("config.json"))?;
    let hooks = MonitorHooks::new(&spec, &cfg.id, bundle)?;
    let process = spec
        .process()
        .clone()
        .ok_or_else(|| StepError::new("config.json", "no process"))?;
    let seccomp = load_seccomp(&cfg)?;
    Ok(Bundle {
        cfg,
        spec,
        hooks,
        process,
        seccomp,
    })
}

/// The container's seccomp filter, from the program file the daemon wrote (none without one).
fn load_seccomp(cfg: &MonitorConfig) -> Result<Option<Compiled>, StepError> {
    let Some(f) = &cfg.seccomp else {
        return Ok(None);
    };
    let bytes = std::fs::read(&f.program)
        .map_err(step(format!("seccomp program {}", f.program.display())))?;
    let program = seccomp::bpf::from_bytes(&bytes).ok_or_else(|| {
        StepError::new(
            format!("seccomp program {}", f.program.display()),
            "malformed",
        )
    })?;
    Ok(Some(Compiled {
        program,
        flags: f.flags,
    }))
}

/// The container's CRI log, when it has one.
fn open_log(cfg: &MonitorConfig) -> Result<Option<LogWriter>, StepError> {
    Ok(match (&cfg.log_dir, &cfg.log_path) {
        (Some(dir), Some(rel)) => Some(
            LogWriter::open(dir, rel)
                .map_err(step(format!("log file {}", dir.join(rel).display())))?,
        ),
        _ => None,
    })
}

/// The container's stdio as the monitor makes it before the fork.
struct ContainerStdio {
    /// The init's side.
    init: Stdio,
    /// With a terminal: our end of the socket the init sends the terminal's master on.
    console: Option<UnixStream>,
    /// Our ends of the container's stdout and stderr pipes (non-blocking).
    outputs: Vec<(OwnedFd, Stream)>,
    /// Our end of the container's stdin pipe, when it has stdin (non-blocking).
    stdin: Option<OwnedFd>,
}

/// Makes the container's stdio: with a terminal, a socket the init sends the terminal's master
/// on (it makes the terminal in the container's devpts); otherwise pipes.
fn container_stdio(cfg: &MonitorConfig) -> Result<ContainerStdio, StepError> {
    let mut console: Option<UnixStream> = None;
    let (init, outputs, stdin) = if cfg.tty {
        let (ours, theirs) = UnixStream::pair().map_err(step("console socket"))?;
        console = Some(ours);
        (Stdio::Console(OwnedFd::from(theirs)), Vec::new(), None)
    } else {
        let (out_r, out_w) = cloexec_pipe()?;
        let (err_r, err_w) = cloexec_pipe()?;
        let (stdin, keep) = if cfg.stdin {
            let (r, w) = cloexec_pipe()?;
            (r, Some(w))
        } else {
            // At its end from the start, like /dev/null, but a pipe CRIU can checkpoint: the
            // host's /dev/null is a file outside the container's mounts.
            let (r, _) = cloexec_pipe()?;
            (r, None)
        };
        let stdio = Stdio::Pipes {
            stdin,
            stdout: out_w,
            stderr: err_w,
        };
        (
            stdio,
            vec![(out_r, Stream::Stdout), (err_r, Stream::Stderr)],
            keep,
        )
    };
    for (fd, _) in &outputs {
        set_nonblocking(fd)?;
    }
    if let Some(fd) = &stdin {
        set_nonblocking(fd)?;
    }
    Ok(ContainerStdio {
        init,
        console,
        outputs,
        stdin,
    })
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), StepError> {
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(step("fcntl"))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags))
        .map(drop)
        .map_err(step("fcntl"))
}

/// Binds the monitor's socket in the bundle, for the owner only and non-blocking; returns it
/// with its path.
fn bind_socket(bundle: &Path) -> Result<(UnixListener, PathBuf), StepError> {
    let sock_path = bundle.join(MONITOR_SOCKET);
    let _ = std::fs::remove_file(&sock_path);
    let (dir, short) = crate::runtime::short_socket_path(bundle, MONITOR_SOCKET)
        .map_err(step(bundle.display().to_string()))?;
    let listener = UnixListener::bind(&short).map_err(step(sock_path.display().to_string()))?;
    drop(dir);
    std::fs::set_permissions(
        &sock_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .map_err(step(sock_path.display().to_string()))?;
    listener
        .set_nonblocking(true)
        .map_err(step(sock_path.display().to_string()))?;
    Ok((listener, sock_path))
}

/// Blocks the signals the monitor's loop handles and returns the descriptor it reads them from.
fn block_signals() -> Result<SignalFd, StepError> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGUSR1,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    mask.thread_block().map_err(step("block signals"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(step("signalfd"))
}

/// Enters the PID namespace that applies to every later child: the pod's, or a new one for this
/// container (whose PID 1 is the first child). Exec'd commands land there too. With a user
/// namespace (`userns_pid`) the init makes the new one, so we only become a subreaper; a
/// restored container's is joined once criu made it.
fn enter_pid_namespace(
    cfg: &MonitorConfig,
    userns_pid: bool,
    restoring: bool,
) -> Result<(), StepError> {
    if let Some(ns) = cfg.join.iter().find(|n| n.kind == "pid") {
        let f = std::fs::File::open(&ns.path)
            .map_err(step(format!("pid namespace {}", ns.path.display())))?;
        setns(f.as_fd(), CloneFlags::CLONE_NEWPID).map_err(step("join pid namespace"))?;
    } else if userns_pid {
        nix::sys::prctl::set_child_subreaper(true).map_err(step("child subreaper"))?;
    } else if cfg.new_pid_ns && !restoring {
        unshare(CloneFlags::CLONE_NEWPID).map_err(step("new pid namespace"))?;
    }
    Ok(())
}

/// A close-on-exec pipe (read end, write end) when `wanted`, else neither end.
fn pipe_if(wanted: bool) -> Result<(Option<OwnedFd>, Option<OwnedFd>), StepError> {
    if wanted {
        let (r, w) = cloexec_pipe()?;
        Ok((Some(r), Some(w)))
    } else {
        Ok((None, None))
    }
}

/// Two pipe ends, one of each pipe of a pause before pivot_root.
type PauseEnds = Option<(OwnedFd, OwnedFd)>;

/// With hooks the monitor runs before pivot_root (see `init::Plan::hook_pause`): the init's
/// ends (it writes "tell", reads "go") and ours (the other two).
fn hook_pause_pipes(spec: &Spec) -> Result<(PauseEnds, PauseEnds), StepError> {
    if hooks::monitor_runs_before_pivot(spec) {
        let (tell_r, tell_w) = cloexec_pipe()?;
        let (go_r, go_w) = cloexec_pipe()?;
        Ok((Some((tell_w, go_r)), Some((tell_r, go_w))))
    } else {
        Ok((None, None))
    }
}

/// OOM kills are watched from before the container runs: one right after its exec would
/// otherwise go unseen once systemd has taken the emptied scope away. A systemd scope exists
/// only once the init is placed in it, so that watch begins later.
fn watch_oom(cfg: &MonitorConfig) -> Option<OomWatch> {
    let mut oom = cfg
        .cgroup
        .as_deref()
        .map(|cg| OomWatch::new(cg, cfg.placed));
    if !cfg.placed {
        oom.iter_mut().for_each(OomWatch::begin);
    }
    oom
}

/// Both ends of the pipes between the monitor and the init, until the fork gives each side its
/// own.
struct InitPipes {
    /// The init's error report (see `init::run`); exec closes it on success.
    err_r: OwnedFd,
    err_w: OwnedFd,
    /// With a user namespace's new PID namespace: the container's pid, as the init reports it.
    pid_r: Option<OwnedFd>,
    pid_w: Option<OwnedFd>,
    /// The pause before pivot_root for the monitor's hooks (see `hook_pause_pipes`).
    pause_child: PauseEnds,
    pause_ours: PauseEnds,
    /// With a systemd scope: our word that the daemon placed the init in it.
    placed_r: Option<OwnedFd>,
    placed_w: Option<OwnedFd>,
}

/// What starting the init reads: the bundle, and the monitor's handles the init is given.
struct Launch<'a> {
    bundle: &'a Path,
    cfg: &'a MonitorConfig,
    spec: &'a Spec,
    seccomp: &'a Option<Compiled>,
    hooks: &'a Option<MonitorHooks>,
    own_fd: &'a OwnedFd,
    proc: &'a ProcFs,
    /// The monitor's socket, removed again when the start fails.
    sock_path: &'a Path,
}

/// Starts the container's process: restored by criu from a checkpoint, or forked as a new
/// init. Returns it once it runs the container (or, restored, is back).
fn launch_init(
    l: &Launch,
    stdio: Stdio,
    pipes: InitPipes,
    oom: &mut Option<OomWatch>,
) -> Result<Pid, StepError> {
    if let Some(r) = &l.cfg.restore {
        restore_init(l, r, stdio, pipes, oom)
    } else {
        match sys::fork().map_err(step("fork"))? {
            ForkResult::Child => become_init(l, stdio, pipes),
            ForkResult::Parent { child: forked } => await_init(l, forked, stdio, pipes, oom),
        }
    }
}

/// Has criu restore the container with the new container's pipes (a terminal cannot be
/// restored); none of the init's pipes are used.
fn restore_init(
    l: &Launch,
    r: &RestoreConfig,
    stdio: Stdio,
    pipes: InitPipes,
    oom: &mut Option<OomWatch>,
) -> Result<Pid, StepError> {
    let init::Stdio::Pipes {
        stdin,
        stdout,
        stderr,
    } = stdio
    else {
        return Err(StepError::new(
            "restore",
            "a container with a terminal cannot be restored",
        ));
    };
    let rootfs = l
        .spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| StepError::new("config.json", "no root"))?;
    let InitPipes {
        err_r,
        err_w,
        pid_r,
        pid_w,
        pause_child,
        pause_ours,
        placed_r,
        placed_w,
    } = pipes;
    drop((err_r, err_w, pid_r, pid_w, pause_child, pause_ours));
    let placement = placed_r.zip(placed_w);
    restore::run(
        l.cfg,
        r,
        &rootfs,
        restore::Ends {
            stdin,
            stdout,
            stderr,
        },
        placement,
        || oom.iter_mut().for_each(OomWatch::begin),
    )
}

/// In the forked child: closes the monitor's ends of the pipes and runs the container's init,
/// which never returns.
fn become_init(l: &Launch, stdio: Stdio, pipes: InitPipes) -> ! {
    let InitPipes {
        err_r,
        err_w,
        pid_r,
        pid_w,
        pause_child,
        pause_ours,
        placed_r,
        placed_w,
    } = pipes;
    drop(err_r);
    drop(pid_r);
    drop(placed_w);
    drop(pause_ours);
    init::run(
        init::Plan {
            spec: l.spec,
            join: &l.cfg.join,
            cgroup: l.cfg.cgroup.as_deref(),
            devices_cgroup: l.cfg.devices_cgroup.as_deref(),
            seccomp: l.seccomp.as_ref(),
            raw_env: &l.cfg.raw_env,
            userns: l.cfg.userns.as_deref(),
            pid_report: pid_w,
            placement: placed_r,
            monitor: l.own_fd.as_fd(),
            proc: l.proc.borrow(),
            id: &l.cfg.id,
            bundle: l.bundle,
            hook_pause: pause_child,
        },
        stdio,
        err_w,
    )
}

/// In the monitor after the fork: closes the init's ends, has the daemon place the init, learns
/// the container's pid, runs the hooks due before pivot_root, and reads the init's errors until
/// its exec closes the pipe. Returns the container's process.
fn await_init(
    l: &Launch,
    forked: Pid,
    stdio: Stdio,
    pipes: InitPipes,
    oom: &mut Option<OomWatch>,
) -> Result<Pid, StepError> {
    let InitPipes {
        err_r,
        err_w,
        pid_r,
        pid_w,
        pause_child,
        pause_ours,
        placed_r,
        placed_w,
    } = pipes;
    drop(err_w);
    drop(pid_w);
    drop(placed_r);
    drop(pause_child);
    drop(stdio);
    await_placement(l, forked, placed_w, oom)?;
    let child = match pid_r {
        None => Some(forked),
        Some(r) => {
            let mut b = [0u8; 4];
            let got = std::fs::File::from(r).read_exact(&mut b);
            let _ = waitpid(forked, None);
            got.ok().map(|_| Pid::from_raw(i32::from_ne_bytes(b)))
        }
    };
    run_hooks_before_pivot(l, pause_ours, child)?;
    let mut msg = Vec::new();
    let _ = std::fs::File::from(err_r).read_to_end(&mut msg);
    if !msg.is_empty() || child.is_none() {
        if let Some(c) = child {
            let _ = waitpid(c, None);
        }
        let _ = std::fs::remove_file(l.sock_path);
        let msg = String::from_utf8_lossy(&msg).into_owned();
        return Err(if msg.is_empty() {
            StepError::new("container init", "it ended before starting the container")
        } else {
            StepError::parse(&msg)
        });
    }
    let Some(child) = child else {
        return Err(StepError::new("container init", "no container process"));
    };
    Ok(child)
}

/// With a systemd scope (`placed`): reports the forked process, which the daemon puts in its
/// scope before it says go; then begins the OOM watch and tells the init it is placed.
fn await_placement(
    l: &Launch,
    forked: Pid,
    placed: Option<OwnedFd>,
    oom: &mut Option<OomWatch>,
) -> Result<(), StepError> {
    if let Some(w) = placed {
        report(&StartReport::Forked {
            pid: forked.as_raw(),
        });
        if let Err(e) = crate::runtime::await_placement() {
            let _ = nix::sys::signal::kill(forked, Signal::SIGKILL);
            let _ = waitpid(forked, None);
            let _ = std::fs::remove_file(l.sock_path);
            return Err(e);
        }
        oom.iter_mut().for_each(OomWatch::begin);
        let _ = std::fs::File::from(w).write_all(&[1]);
    }
    Ok(())
}

/// With the pause before pivot_root: once the init says its mounts are made, runs the
/// monitor's prestart and createRuntime hooks and lets it go on. End of file instead of the
/// byte means the init failed; its error follows on the error pipe.
fn run_hooks_before_pivot(
    l: &Launch,
    pause: PauseEnds,
    child: Option<Pid>,
) -> Result<(), StepError> {
    if let (Some((tell, go)), Some(c), Some(h)) = (pause, child, l.hooks) {
        let mut b = [0u8; 1];
        if std::fs::File::from(tell).read_exact(&mut b).is_ok() {
            if let Err(e) = h.before_pivot(c.as_raw()) {
                let _ = nix::sys::signal::kill(c, Signal::SIGKILL);
                let _ = waitpid(c, None);
                let _ = std::fs::remove_file(l.sock_path);
                return Err(e);
            }
            let _ = std::fs::File::from(go).write_all(&[1]);
        }
    }
    Ok(())
}

/// The container's process once started, until the monitor owns it: a failure then must not
/// leave the container running without its monitor.
#[derive(Clone, Copy)]
struct Unowned<'a> {
    child: Pid,
    sock_path: &'a Path,
}

impl Unowned<'_> {
    /// Kills and reaps the container's process and removes the monitor's socket; returns `e`,
    /// the failure to report.
    fn abandon(self, e: StepError) -> StepError {
        let _ = nix::sys::signal::kill(self.child, Signal::SIGKILL);
        let _ = waitpid(self.child, None);
        let _ = std::fs::remove_file(self.sock_path);
        e
    }

    /// Joins the container's PID namespace, which the init (in a user namespace) or criu made,
    /// for exec'd commands to land in.
    fn join_pid_namespace(self) -> Result<(), StepError> {
        let ns = format!("/proc/{}/ns/pid", self.child);
        let f = std::fs::File::open(&ns).map_err(|e| self.abandon(StepError::new(&ns, e)))?;
        setns(f.as_fd(), CloneFlags::CLONE_NEWPID)
            .map_err(|e| self.abandon(StepError::new("join the container's pid namespace", e)))
    }

    /// The container's process as the daemon records it, and a pidfd of it.
    fn identify(self) -> Result<(ProcessId, OwnedFd), StepError> {
        let child = self.child;
        let id = ProcessId::of(child.as_raw())
            .map_err(|e| self.abandon(StepError::new(format!("container init {child}"), e)))?;
        let init_fd = sys::pidfd_open(child.as_raw())
            .map_err(|e| self.abandon(StepError::new(format!("container init {child}"), e)))?;
        Ok((id, init_fd))
    }
}

/// With a terminal: takes the master the init sent on `console`, reads the container's output
/// from it (pushed to `outputs`), writes its stdin into a second handle when it has stdin, and
/// returns a third, for attachers' terminal sizes.
fn take_terminal(
    console: Option<UnixStream>,
    has_stdin: bool,
    outputs: &mut Vec<(OwnedFd, Stream)>,
    stdin: &mut Option<OwnedFd>,
    init: Unowned,
) -> Result<Option<OwnedFd>, StepError> {
    let Some(c) = console else {
        return Ok(None);
    };
    let master = receive_terminal(&c)
        .and_then(|m| set_nonblocking(&m).map(|()| m))
        .map_err(|e| init.abandon(e))?;
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| init.abandon(StepError::new("terminal", e)))
    };
    if has_stdin {
        *stdin = Some(dup(&master)?);
    }
    let terminal = dup(&master)?;
    outputs.push((master, Stream::Stdout));
    Ok(Some(terminal))
}

/// The master of the terminal the init made (see `init::container_terminal`), already sent:
/// the init has exec'd (or failed, which the caller has seen) by now.
fn receive_terminal(console: &UnixStream) -> Result<OwnedFd, StepError> {
    let mut data = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let mut iov = [IoSliceMut::new(&mut data)];
    let msg = recvmsg::<()>(
        console.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(step("the container's terminal"))?;
    let mut fd = None;
    for c in msg.cmsgs().map_err(step("the container's terminal"))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for r in raw {
                fd.get_or_insert(sys::own_received_fd(r));
            }
        }
    }
    fd.ok_or_else(|| StepError::new("the container's terminal", "the init sent none"))
}
