//! `crius monitor BUNDLE`: one small, single-threaded process per running container. It reads
//! the bundle (`config.json`, the OCI spec, and `monitor.json`), forks the container init (see
//! `init`) into the right PID namespace, reports `Started` or `Failed` as one JSON line on stdout,
//! and then lives on its own (own session, no tie to the daemon): it copies the container's
//! output into the CRI log, reopens the log on SIGUSR1, reaps the init and writes the exit record
//! atomically. The daemon may die and come back meanwhile; the record is what it reads.

use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use oci_spec::runtime::Spec;

use super::init::{self, Stdio};
use super::logs::{LogWriter, Stream};
use super::{ExitRecord, MonitorConfig, ProcessId, StartReport, exit_code, now_nanos};
use crate::{atomic, sys};

/// How long output may trail the init's exit (descendants in a shared PID namespace may hold the
/// pipes open forever).
const DRAIN: Duration = Duration::from_secs(2);

/// The monitor's main; returns the process exit code.
pub fn main(bundle: &Path) -> i32 {
    let _ = nix::sys::prctl::set_name(c"crius-monitor");
    match start(bundle) {
        Err(message) => {
            report(&StartReport::Failed { message });
            1
        }
        Ok((monitor, started)) => {
            report(&started);
            // Nothing more goes to the daemon: it may be gone by the time we are done.
            if let Ok(null) = std::fs::File::open("/dev/null") {
                let _ = sys::dup_to(&null, 1, false);
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
    log: Option<LogWriter>,
    outputs: Vec<(OwnedFd, Stream)>,
    signals: SignalFd,
    exit_file: std::path::PathBuf,
    /// The write end of the container's stdin, held so its stdin stays open.
    _stdin: Option<OwnedFd>,
}

fn cloexec_pipe() -> Result<(OwnedFd, OwnedFd), String> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"))
}

fn set_nonblocking(fd: &OwnedFd) -> Result<(), String> {
    let flags = fcntl(fd.as_fd(), FcntlArg::F_GETFL).map_err(|e| format!("fcntl: {e}"))?;
    let flags = OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK;
    fcntl(fd.as_fd(), FcntlArg::F_SETFL(flags))
        .map(drop)
        .map_err(|e| format!("fcntl: {e}"))
}

fn start(bundle: &Path) -> Result<(Monitor, StartReport), String> {
    // Only what we open ourselves (close-on-exec) may reach the container.
    sys::close_from(3).map_err(|e| format!("close inherited descriptors: {e}"))?;
    let _ = nix::unistd::setsid();
    let read = |name: &str| {
        std::fs::read(bundle.join(name))
            .map_err(|e| format!("{}: {e}", bundle.join(name).display()))
    };
    let cfg: MonitorConfig =
        serde_json::from_slice(&read("monitor.json")?).map_err(|e| format!("monitor.json: {e}"))?;
    let spec: Spec =
        serde_json::from_slice(&read("config.json")?).map_err(|e| format!("config.json: {e}"))?;

    let log = match (&cfg.log_dir, &cfg.log_path) {
        (Some(dir), Some(rel)) => Some(
            LogWriter::open(dir, rel)
                .map_err(|e| format!("log file {}: {e}", dir.join(rel).display()))?,
        ),
        _ => None,
    };

    let (child_stdio, outputs, stdin_keep) = if cfg.tty {
        let pty = nix::pty::openpty(None, None).map_err(|e| format!("openpty: {e}"))?;
        for fd in [&pty.master, &pty.slave] {
            fcntl(
                fd.as_fd(),
                FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(|e| format!("pty: {e}"))?;
        }
        let dup = |fd: &OwnedFd| fd.try_clone().map_err(|e| format!("pty: {e}"));
        let stdio = Stdio {
            stdin: dup(&pty.slave)?,
            stdout: dup(&pty.slave)?,
            stderr: pty.slave,
            tty: true,
        };
        (stdio, vec![(pty.master, Stream::Stdout)], None)
    } else {
        let (out_r, out_w) = cloexec_pipe()?;
        let (err_r, err_w) = cloexec_pipe()?;
        let (stdin, keep) = if cfg.stdin {
            let (r, w) = cloexec_pipe()?;
            (r, Some(w))
        } else {
            let null = std::fs::File::open("/dev/null").map_err(|e| format!("/dev/null: {e}"))?;
            (OwnedFd::from(null), None)
        };
        let stdio = Stdio {
            stdin,
            stdout: out_w,
            stderr: err_w,
            tty: false,
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
    let (err_r, err_w) = cloexec_pipe()?;

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
    mask.thread_block()
        .map_err(|e| format!("block signals: {e}"))?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("signalfd: {e}"))?;

    // The PID namespace applies to the next child: the pod's, or a new one for this container.
    if let Some(ns) = cfg.join.iter().find(|n| n.kind == "pid") {
        let f = std::fs::File::open(&ns.path)
            .map_err(|e| format!("pid namespace {}: {e}", ns.path.display()))?;
        setns(f.as_fd(), CloneFlags::CLONE_NEWPID)
            .map_err(|e| format!("join pid namespace: {e}"))?;
    } else if cfg.new_pid_ns {
        unshare(CloneFlags::CLONE_NEWPID).map_err(|e| format!("new pid namespace: {e}"))?;
    }

    match sys::fork().map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(err_r);
            init::run(&spec, &cfg.join, child_stdio, err_w)
        }
        ForkResult::Parent { child } => {
            drop(err_w);
            drop(child_stdio);
            let mut msg = Vec::new();
            let _ = io::Read::read_to_end(&mut std::fs::File::from(err_r), &mut msg);
            if !msg.is_empty() {
                let _ = waitpid(child, None);
                return Err(String::from_utf8_lossy(&msg).into_owned());
            }
            let started_at = now_nanos();
            let id = ProcessId::of(child.as_raw())
                .map_err(|e| format!("container init {child}: {e}"))?;
            let monitor = Monitor {
                child,
                log,
                outputs,
                signals,
                exit_file: cfg.exit_file.clone(),
                _stdin: stdin_keep,
            };
            Ok((
                monitor,
                StartReport::Started {
                    pid: id.pid,
                    start_time: id.start_time,
                    started_at,
                },
            ))
        }
    }
}

impl Monitor {
    fn run(mut self) -> i32 {
        let mut status: Option<(i32, Option<i32>)> = None;
        let mut exited_at: Option<Instant> = None;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            if let Some(t) = exited_at
                && (self.outputs.is_empty() || t.elapsed() >= DRAIN)
            {
                break;
            }
            let timeout = match exited_at {
                // After the exit, only wait briefly for trailing output.
                Some(_) => PollTimeout::from(100u16),
                None => PollTimeout::NONE,
            };
            let (sig_ready, ready) = {
                let mut fds = Vec::with_capacity(1 + self.outputs.len());
                fds.push(PollFd::new(self.signals.as_fd(), PollFlags::POLLIN));
                for (fd, _) in &self.outputs {
                    fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLIN));
                }
                match poll(&mut fds, timeout) {
                    Ok(0) if exited_at.is_some() => break, // quiet after exit: done
                    Ok(_) => {}
                    Err(Errno::EINTR) => continue,
                    Err(e) => {
                        eprintln!("monitor: poll: {e}");
                        break;
                    }
                }
                let revents = |i: usize| fds[i].revents().unwrap_or(PollFlags::empty());
                let sig = !revents(0).is_empty();
                let ready: Vec<bool> = (1..fds.len()).map(|i| !revents(i).is_empty()).collect();
                (sig, ready)
            };
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
            if sig_ready {
                while let Ok(Some(info)) = self.signals.read_signal() {
                    match Signal::try_from(info.ssi_signo as i32) {
                        Ok(Signal::SIGCHLD) => {
                            if let Some(s) = self.reap()
                                && status.is_none()
                            {
                                status = Some(s);
                                exited_at = Some(Instant::now());
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
        let (code, signal) = match status {
            Some(s) => s,
            // The init was not reaped (a poll failure): wait for it now.
            None => waitpid(self.child, None)
                .ok()
                .and_then(exit_code)
                .unwrap_or((255, None)),
        };
        let record = ExitRecord {
            exit_code: code,
            signal,
            finished_at: now_nanos(),
            oom_killed: false,
        };
        if let Err(e) = atomic::write_json(&self.exit_file, &record) {
            eprintln!("monitor: writing {}: {e}", self.exit_file.display());
            return 1;
        }
        0
    }

    /// Reaps every exited child; returns the init's status if it was among them.
    fn reap(&self) -> Option<(i32, Option<i32>)> {
        let mut found = None;
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(s) => {
                    if s.pid() == Some(self.child) {
                        found = exit_code(s);
                    }
                }
            }
        }
        found
    }
}
