//! `crius monitor BUNDLE`: one small, single-threaded process per running container. It reads
//! the bundle (`config.json`, the OCI spec, and `monitor.json`), forks the container init (see
//! `init`) into the right PID namespace, reports `Started` or `Failed` as one JSON line on stdout,
//! and then lives on its own (own session, no tie to the daemon): it copies the container's
//! output into the CRI log and to attachers (CRI Attach), reopens the log on SIGUSR1, runs
//! ExecSync and streamed commands asked for on its socket, feeds attachers' input to the
//! container's stdin, reaps the init and writes the exit record atomically, with whether the OOM
//! killer ended it (see `oom`). The daemon may die and come back meanwhile; the record is what it
//! reads.
//!
//! Exec is here because it is the cheap place for it: the monitor's children already land in the
//! container's PID namespace, it holds the parsed spec, and forking a small single-threaded
//! process costs far less than starting a new one. The daemon passes the command's stdout and
//! stderr with the request (SCM_RIGHTS), so output never goes through the monitor.

use std::io::{self, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use oci_spec::runtime::{Process, Spec};

mod attach;
mod exec;
mod oom;
mod restore;

use attach::{Attacher, StdinState};
use exec::Exec;
use oom::OomWatch;
pub use restore::criu_errors;

use super::attach::AttachRequest;
use super::hooks::{self, MonitorHooks};
use super::init::{self, InitError, Stdio};
use super::logs::{LogWriter, Stream};
use super::procfs::ProcFs;
use super::seccomp::{self, Compiled};
use super::step::{StepError, step};
use super::{
    ExecReport, ExecRequest, ExitRecord, MONITOR_SOCKET, MonitorConfig, ProcessId, StartReport,
    exit_code, now_nanos,
};
use crate::{atomic, sys};

/// How long output may trail the init's exit (descendants in a shared PID namespace may hold the
/// pipes open forever).
const DRAIN: Duration = Duration::from_secs(2);

/// The monitor's main; returns the process exit code.
pub fn main(bundle: &Path) -> i32 {
    let _ = nix::sys::prctl::set_name(c"crius-monitor");
    match start(bundle) {
        Err(e) => {
            report(&StartReport::Failed {
                message: e.to_string(),
            });
            1
        }
        Ok((monitor, started)) => {
            report(&started);
            // Nothing more goes to the daemon: it may be gone by the time we are done.
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = sys::dup_to(&null, 1, false);
            }
            if !super::await_kept() {
                monitor.abandon();
                return 1;
            }
            monitor.run()
        }
    }
}

fn report(r: &StartReport) {
    let mut line =
        serde_json::to_vec(r).unwrap_or_else(|_| b"{\"failed\":{\"message\":\"report\"}}".to_vec());
    line.push(b'\n');
    let mut out = io::stdout().lock();
    let _ = out.write_all(&line);
    let _ = out.flush();
}

struct Monitor {
    child: Pid,
    /// The init's pidfd (close-on-exec), for exec'd commands to join its namespaces: the
    /// init's pid means nothing inside its own PID namespace, where those commands start.
    init_fd: OwnedFd,
    /// A pidfd of this monitor (see `process::die_with_monitor`).
    own_fd: OwnedFd,
    /// The host's procfs, for exec'd commands' writes there (see `procfs`).
    proc: ProcFs,
    log: Option<LogWriter>,
    outputs: Vec<(OwnedFd, Stream)>,
    signals: SignalFd,
    listener: UnixListener,
    execs: Vec<Exec>,
    process: Process,
    /// The container's seccomp filter, installed in exec'd commands too.
    seccomp: Option<Compiled>,
    /// Whether the container is in a user namespace of its pod, which exec'd commands join.
    userns: bool,
    /// The container's cgroup, which exec'd commands join.
    cgroup: Option<std::path::PathBuf>,
    /// OOM kills in that cgroup, watched from before the init ran.
    oom: Option<OomWatch>,
    exit_file: std::path::PathBuf,
    /// The container's stdin (held so it stays open until `stdin_once` closes it).
    stdin: StdinState,
    /// The terminal's master (a second handle), for attachers' terminal sizes.
    terminal: Option<OwnedFd>,
    attachers: Vec<Attacher>,
    /// The spec's hooks that are the monitor's to run.
    hooks: Option<MonitorHooks>,
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), StepError> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(step("pipe"))
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), StepError> {
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(step("fcntl"))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags))
        .map(drop)
        .map_err(step("fcntl"))
}

fn start(bundle: &Path) -> Result<(Monitor, StartReport), StepError> {
    // Only what we open ourselves (close-on-exec) may reach the container.
    sys::close_from(3).map_err(step("close inherited descriptors"))?;
    // Not dumpable, nor is what we fork until it execs: no process of a container can open
    // our descriptors, memory or executable through /proc (CVE-2016-9962).
    nix::sys::prctl::set_dumpable(false).map_err(step("not dumpable"))?;
    let proc = ProcFs::open().map_err(step("/proc"))?;
    let _ = nix::unistd::setsid();
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
    let seccomp = match &cfg.seccomp {
        None => None,
        Some(f) => {
            let bytes = std::fs::read(&f.program)
                .map_err(step(format!("seccomp program {}", f.program.display())))?;
            let program = seccomp::bpf::from_bytes(&bytes).ok_or_else(|| {
                StepError::new(
                    format!("seccomp program {}", f.program.display()),
                    "malformed",
                )
            })?;
            Some(Compiled {
                program,
                flags: f.flags,
            })
        }
    };

    let log = match (&cfg.log_dir, &cfg.log_path) {
        (Some(dir), Some(rel)) => Some(
            LogWriter::open(dir, rel)
                .map_err(step(format!("log file {}", dir.join(rel).display())))?,
        ),
        _ => None,
    };

    // With a terminal, the init makes it in the container's devpts and sends its master here.
    let mut console: Option<UnixStream> = None;
    let (child_stdio, mut outputs, stdin_keep) = if cfg.tty {
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
    if let Some(fd) = &stdin_keep {
        set_nonblocking(fd)?;
    }
    let (err_r, err_w) = cloexec_pipe()?;
    // Our own pidfd, for the children we fork to die with us until they exec.
    let own_fd =
        sys::pidfd_open(std::process::id() as i32).map_err(step("pidfd of the monitor"))?;

    let sock_path = bundle.join(MONITOR_SOCKET);
    let _ = std::fs::remove_file(&sock_path);
    let (dir, short) = super::short_socket_path(bundle, MONITOR_SOCKET)
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
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(step("signalfd"))?;

    // The PID namespace applies to every later child: the pod's, or a new one for this container
    // (whose PID 1 is the first child). Exec'd commands land there too. In a user namespace the
    // new one must belong to it, so the init makes it and forks the container into it (see
    // `init::Plan::pid_report`); we reap that grandchild as subreaper and join its namespace.
    let userns_pid = cfg.userns.is_some() && cfg.new_pid_ns;
    let restoring = cfg.restore.is_some();
    if let Some(ns) = cfg.join.iter().find(|n| n.kind == "pid") {
        let f = std::fs::File::open(&ns.path)
            .map_err(step(format!("pid namespace {}", ns.path.display())))?;
        setns(f.as_fd(), CloneFlags::CLONE_NEWPID).map_err(step("join pid namespace"))?;
    } else if userns_pid {
        nix::sys::prctl::set_child_subreaper(true).map_err(step("child subreaper"))?;
    } else if cfg.new_pid_ns && !restoring {
        unshare(CloneFlags::CLONE_NEWPID).map_err(step("new pid namespace"))?;
    }
    let (pid_r, pid_w) = if userns_pid {
        let (r, w) = cloexec_pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };
    // The init waits before pivot_root while we run prestart and createRuntime hooks.
    let (pause_child, pause_ours) = if hooks::monitor_runs_before_pivot(&spec) {
        let (tell_r, tell_w) = cloexec_pipe()?;
        let (go_r, go_w) = cloexec_pipe()?;
        (Some((tell_w, go_r)), Some((tell_r, go_w)))
    } else {
        (None, None)
    };
    let (placed_r, placed_w) = if cfg.placed {
        let (r, w) = cloexec_pipe()?;
        (Some(r), Some(w))
    } else {
        (None, None)
    };

    // OOM kills are watched from before the container runs: one right after its exec would
    // otherwise go unseen once systemd has taken the emptied scope away.
    let mut oom = cfg
        .cgroup
        .as_deref()
        .map(|cg| OomWatch::new(cg, cfg.placed));
    // A systemd scope exists only once the init is placed in it.
    if !cfg.placed {
        oom.iter_mut().for_each(OomWatch::begin);
    }
    let child = if let Some(r) = &cfg.restore {
        let init::Stdio::Pipes {
            stdin,
            stdout,
            stderr,
        } = child_stdio
        else {
            return Err(StepError::new(
                "restore",
                "a container with a terminal cannot be restored",
            ));
        };
        let rootfs = spec
            .root()
            .as_ref()
            .map(|r| r.path().clone())
            .ok_or_else(|| StepError::new("config.json", "no root"))?;
        drop((err_r, err_w, pid_r, pid_w, pause_child, pause_ours));
        let placement = placed_r.zip(placed_w);
        restore::run(
            &cfg,
            r,
            &rootfs,
            restore::Ends {
                stdin,
                stdout,
                stderr,
            },
            placement,
            || oom.iter_mut().for_each(OomWatch::begin),
        )?
    } else {
        match sys::fork().map_err(step("fork"))? {
            ForkResult::Child => {
                drop(err_r);
                drop(pid_r);
                drop(placed_w);
                drop(pause_ours);
                init::run(
                    init::Plan {
                        spec: &spec,
                        join: &cfg.join,
                        cgroup: cfg.cgroup.as_deref(),
                        seccomp: seccomp.as_ref(),
                        userns: cfg.userns.as_deref(),
                        pid_report: pid_w,
                        placement: placed_r,
                        monitor: own_fd.as_fd(),
                        proc: proc.borrow(),
                        id: &cfg.id,
                        bundle,
                        hook_pause: pause_child,
                    },
                    child_stdio,
                    err_w,
                )
            }
            ForkResult::Parent { child: forked } => {
                drop(err_w);
                drop(pid_w);
                drop(placed_r);
                drop(pause_child);
                drop(child_stdio);
                // The daemon puts the forked process in its systemd scope, then says go.
                if let Some(w) = placed_w {
                    report(&StartReport::Forked {
                        pid: forked.as_raw(),
                    });
                    if let Err(e) = super::await_placement() {
                        let _ = nix::sys::signal::kill(forked, Signal::SIGKILL);
                        let _ = waitpid(forked, None);
                        let _ = std::fs::remove_file(&sock_path);
                        return Err(e);
                    }
                    oom.iter_mut().for_each(OomWatch::begin);
                    let _ = std::fs::File::from(w).write_all(&[1]);
                }
                let child = match pid_r {
                    None => Some(forked),
                    Some(r) => {
                        let mut b = [0u8; 4];
                        let got = std::fs::File::from(r).read_exact(&mut b);
                        let _ = waitpid(forked, None);
                        got.ok().map(|_| Pid::from_raw(i32::from_ne_bytes(b)))
                    }
                };
                if let (Some((tell, go)), Some(c), Some(h)) = (pause_ours, child, &hooks) {
                    // End of file instead of the byte: the init failed, its error follows.
                    let mut b = [0u8; 1];
                    if std::fs::File::from(tell).read_exact(&mut b).is_ok() {
                        if let Err(e) = h.before_pivot(c.as_raw()) {
                            let _ = nix::sys::signal::kill(c, Signal::SIGKILL);
                            let _ = waitpid(c, None);
                            let _ = std::fs::remove_file(&sock_path);
                            return Err(e);
                        }
                        let _ = std::fs::File::from(go).write_all(&[1]);
                    }
                }
                let mut msg = Vec::new();
                let _ = std::fs::File::from(err_r).read_to_end(&mut msg);
                if !msg.is_empty() || child.is_none() {
                    if let Some(c) = child {
                        let _ = waitpid(c, None);
                    }
                    let _ = std::fs::remove_file(&sock_path);
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
                child
            }
        }
    };
    // From here a failure must not leave the container running without its monitor.
    let abandon = |e: StepError| {
        let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        let _ = std::fs::remove_file(&sock_path);
        e
    };
    // The container's terminal: its output is read here, attachers type into it.
    let (mut stdin_keep, mut terminal) = (stdin_keep, None);
    if let Some(c) = console {
        let master = receive_terminal(&c)
            .and_then(|m| set_nonblocking(&m).map(|()| m))
            .map_err(abandon)?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| abandon(StepError::new("terminal", e)))
        };
        if cfg.stdin {
            stdin_keep = Some(dup(&master)?);
        }
        terminal = Some(dup(&master)?);
        outputs.push((master, Stream::Stdout));
    }
    if userns_pid || restoring {
        let ns = format!("/proc/{child}/ns/pid");
        let f = std::fs::File::open(&ns).map_err(|e| abandon(StepError::new(&ns, e)))?;
        setns(f.as_fd(), CloneFlags::CLONE_NEWPID)
            .map_err(|e| abandon(StepError::new("join the container's pid namespace", e)))?;
    }
    let started_at = now_nanos();
    let id = ProcessId::of(child.as_raw())
        .map_err(|e| abandon(StepError::new(format!("container init {child}"), e)))?;
    let init_fd = sys::pidfd_open(child.as_raw())
        .map_err(|e| abandon(StepError::new(format!("container init {child}"), e)))?;
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
        },
    ))
}

impl Monitor {
    /// Ends the container at once and records nothing: the daemon died before it recorded
    /// the start, so its record still says created and nothing else would ever stop it.
    fn abandon(self) {
        if let Some(cg) = &self.cgroup {
            let _ = std::fs::write(cg.join("cgroup.kill"), "1");
        }
        let _ = nix::sys::signal::kill(self.child, Signal::SIGKILL);
        let _ = waitpid(self.child, None);
    }

    fn run(mut self) -> i32 {
        let mut status: Option<(i32, Option<i32>)> = None;
        let mut exited_at: Option<Instant> = None;
        let mut buf = vec![0u8; 64 << 10];
        // When the memory touched by start-up or by exec'd commands is to be given back: at
        // once before the first wait, then after 5 quiet seconds following a command.
        let mut shed_at: Option<Instant> = Some(Instant::now());
        loop {
            if let Some(t) = exited_at
                && (self.outputs.is_empty() || t.elapsed() >= DRAIN)
            {
                break;
            }
            let now = Instant::now();
            let exec_deadline = self
                .execs
                .iter()
                .filter(|e| !e.timed_out)
                .filter_map(|e| e.deadline)
                .min();
            let mut wait_ms: Option<u64> =
                exec_deadline.map(|d| d.saturating_duration_since(now).as_millis() as u64 + 1);
            if exited_at.is_some() {
                // After the exit, only wait briefly for trailing output.
                wait_ms = Some(wait_ms.map_or(100, |w| w.min(100)));
            }
            if let Some(at) = shed_at
                && self.execs.is_empty()
                && exited_at.is_none()
            {
                let left = at.saturating_duration_since(now);
                if left.is_zero() {
                    // Starting the init or a command touches far more than watching needs; one
                    // of these runs per container, so keep only what the loop touches.
                    let _ = sys::shed_startup_pages();
                    shed_at = None;
                } else {
                    let ms = left.as_millis() as u64 + 1;
                    wait_ms = Some(wait_ms.map_or(ms, |w| w.min(ms)));
                }
            }
            if let Some(at) = self.oom.as_ref().and_then(OomWatch::settles_at) {
                let ms = at.saturating_duration_since(now).as_millis() as u64 + 1;
                wait_ms = Some(wait_ms.map_or(ms, |w| w.min(ms)));
            }
            let timeout = match wait_ms {
                Some(ms) => PollTimeout::from(ms.min(u16::MAX as u64) as u16),
                None => PollTimeout::NONE,
            };
            let (sig_ready, listen_ready, ready, oom_ready, stdin_ready, attach_ready, hung_up) = {
                let mut fds = Vec::with_capacity(4 + self.outputs.len() + self.attachers.len());
                fds.push(PollFd::new(self.signals.as_fd(), PollFlags::POLLIN));
                fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
                for (fd, _) in &self.outputs {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                }
                let outputs_end = fds.len();
                if let Some(fd) = self.oom.as_ref().and_then(OomWatch::fd) {
                    fds.push(PollFd::new(fd, PollFlags::POLLIN));
                }
                let oom_at = (fds.len() > outputs_end).then_some(outputs_end);
                // A command's client hanging up (a cancelled ExecSync, a closed stream) ends
                // the command, as containerd does: watched until it is killed.
                let execs_start = fds.len();
                let watched: Vec<usize> = (0..self.execs.len())
                    .filter(|&i| !self.execs[i].abandoned)
                    .collect();
                for &i in &watched {
                    // Hang-ups are reported whatever is asked; the client never half-closes.
                    fds.push(PollFd::new(self.execs[i].conn.as_fd(), PollFlags::empty()));
                }
                let attach_start = fds.len();
                let polls_stdin = self.attach_poll_fds(&mut fds);
                let attachers_start = attach_start + usize::from(polls_stdin);
                let n = match poll(&mut fds, timeout) {
                    Ok(n) => n,
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        eprintln!("monitor: poll: {e}");
                        break;
                    }
                };
                if n == 0 && exited_at.is_some() && exec_deadline.is_none() {
                    break; // quiet after exit: done
                }
                let revents = |i: usize| fds[i].revents().unwrap_or(PollFlags::empty());
                let ready: Vec<bool> = (2..outputs_end).map(|i| !revents(i).is_empty()).collect();
                let oom_ready = oom_at.is_some_and(|i| !revents(i).is_empty());
                let hung_up: Vec<usize> = watched
                    .iter()
                    .enumerate()
                    .filter(|(k, _)| {
                        revents(execs_start + k).intersects(PollFlags::POLLHUP | PollFlags::POLLERR)
                    })
                    .map(|(_, &i)| i)
                    .collect();
                let stdin_ready = polls_stdin && !revents(attach_start).is_empty();
                let attach_ready: Vec<PollFlags> =
                    (attachers_start..fds.len()).map(revents).collect();
                (
                    !revents(0).is_empty(),
                    !revents(1).is_empty(),
                    ready,
                    oom_ready,
                    stdin_ready,
                    attach_ready,
                    hung_up,
                )
            };
            for i in hung_up {
                let e = &mut self.execs[i];
                e.abandoned = true;
                let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
            }
            if let Some(o) = self.oom.as_mut()
                && (oom_ready || o.settles_at().is_some_and(|t| t <= Instant::now()))
            {
                o.note();
            }
            self.enforce_deadlines();
            // Output first, so nothing written before the exit is lost.
            let mut closed = Vec::new();
            for (i, is_ready) in ready.iter().enumerate() {
                if !is_ready {
                    continue;
                }
                let (fd, stream) = (&self.outputs[i].0, self.outputs[i].1);
                loop {
                    match nix::unistd::read(fd, &mut buf) {
                        Ok(0) | Err(Errno::EIO) => {
                            closed.push(i);
                            break;
                        }
                        Ok(n) => {
                            if let Some(log) = self.log.as_mut()
                                && let Err(e) = log.write(stream, &buf[..n])
                            {
                                eprintln!("monitor: writing log: {e}");
                            }
                            Monitor::fan_out(&mut self.attachers, stream, &buf[..n]);
                        }
                        Err(Errno::EAGAIN) => break,
                        Err(Errno::EINTR) => continue,
                        Err(e) => {
                            eprintln!("monitor: reading output: {e}");
                            closed.push(i);
                            break;
                        }
                    }
                }
            }
            for i in closed.into_iter().rev() {
                let (_, stream) = self.outputs.remove(i);
                if let Some(log) = self.log.as_mut() {
                    let _ = log.finish(stream);
                }
            }
            if stdin_ready || !attach_ready.is_empty() {
                self.serve_attachers(&attach_ready, stdin_ready);
            }
            if listen_ready {
                self.accept_execs(exited_at.is_some());
                shed_at = Some(Instant::now() + Duration::from_secs(5));
            }
            if sig_ready {
                while let Ok(Some(info)) = self.signals.read_signal() {
                    match Signal::try_from(info.ssi_signo as i32) {
                        Ok(Signal::SIGCHLD) => {
                            if let Some(s) = self.reap()
                                && status.is_none()
                            {
                                status = Some(s);
                                exited_at = Some(Instant::now());
                                // Read at once: an emptied systemd scope is soon removed.
                                self.oom.iter_mut().for_each(OomWatch::note);
                            }
                        }
                        Ok(Signal::SIGUSR1) => {
                            if let Some(log) = self.log.as_mut()
                                && let Err(e) = log.reopen()
                            {
                                eprintln!("monitor: reopening log: {e}");
                            }
                        }
                        Ok(sig) => {
                            // Asked to stop: pass it on and keep recording.
                            let _ = nix::sys::signal::kill(self.child, sig);
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        for (_, stream) in std::mem::take(&mut self.outputs) {
            if let Some(log) = self.log.as_mut() {
                let _ = log.finish(stream);
            }
        }
        // Commands still running in a shared PID namespace end with the container.
        for e in &self.execs {
            let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
        }
        for mut e in std::mem::take(&mut self.execs) {
            let code = waitpid(e.pid, None)
                .ok()
                .and_then(exit_code)
                .map(|(c, _)| c)
                .unwrap_or(-1);
            e.report_exit(code);
        }
        let (code, signal) = match status {
            Some(s) => s,
            // The init was not reaped (a poll failure): wait for it now.
            None => waitpid(self.child, None)
                .ok()
                .and_then(exit_code)
                .unwrap_or((255, None)),
        };
        let oom_killed = self.oom.as_mut().is_some_and(|o| o.killed(signal));
        let record = ExitRecord {
            exit_code: code,
            signal,
            finished_at: now_nanos(),
            oom_killed,
        };
        let written = atomic::write_json(&self.exit_file, &record);
        // Attachers hear the end once the record is there to be read.
        self.close_attachers();
        if let Err(e) = written {
            eprintln!("monitor: writing {}: {e}", self.exit_file.display());
            return 1;
        }
        // At the exit rather than at removal: the monitor is what outlives a daemon restart.
        if let Some(h) = &self.hooks {
            h.poststop();
        }
        0
    }

    /// Reaps every exited child: reports ended execs, returns the init's status if it ended.
    fn reap(&mut self) -> Option<(i32, Option<i32>)> {
        let mut found = None;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(s) => {
                    if s.pid() == Some(self.child) {
                        found = exit_code(s);
                    } else if let Some(i) = self.execs.iter().position(|e| Some(e.pid) == s.pid()) {
                        let mut e = self.execs.swap_remove(i);
                        e.report_exit(exit_code(s).map(|(c, _)| c).unwrap_or(-1));
                    }
                }
            }
        }
        found
    }

    fn enforce_deadlines(&mut self) {
        let now = Instant::now();
        for e in self.execs.iter_mut() {
            if !e.timed_out && e.deadline.is_some_and(|d| d <= now) {
                e.timed_out = true;
                let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
            }
        }
    }
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
