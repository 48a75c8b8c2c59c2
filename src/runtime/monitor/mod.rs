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

use std::io::{self, IoSliceMut, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, setns};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use oci_spec::runtime::Process;

mod attach;
mod exec;
mod oom;
mod restore;
mod start;

use attach::{Attacher, StdinState};
use exec::Exec;
use oom::OomWatch;
pub use restore::criu_errors;
use start::start;

use super::attach::AttachRequest;
use super::hooks::MonitorHooks;
use super::init::{self, InitError};
use super::logs::{LogWriter, Stream};
use super::procfs::ProcFs;
use super::seccomp::Compiled;
use super::step::{StepError, step};
use super::{ExecReport, ExecRequest, ExitRecord, StartReport, exit_code, now_nanos};
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
    /// The container's v1 devices cgroup, which exec'd commands join too.
    devices_cgroup: Option<std::path::PathBuf>,
    /// The environment's values that are not UTF-8, for exec'd commands too.
    raw_env: Vec<crate::runtime::RawEnv>,
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

/// Where the monitor's loop stands between two polls.
struct Progress {
    /// The init's exit code and signal, once reaped.
    status: Option<(i32, Option<i32>)>,
    /// When the init was reaped: its output may trail it for `DRAIN`.
    exited_at: Option<Instant>,
    /// When the memory touched by start-up or by exec'd commands is to be given back: at
    /// once before the first wait, then after 5 quiet seconds following a command.
    shed_at: Option<Instant>,
}

/// How one poll of the loop ended.
enum Polled {
    Ready(Ready),
    /// A signal interrupted it: poll again.
    Interrupted,
    /// The loop is over: the poll failed, or nothing came after the init's exit.
    Done,
}

/// What one poll found ready.
struct Ready {
    signals: bool,
    listener: bool,
    /// One per output, in `Monitor::outputs`' order.
    outputs: Vec<bool>,
    oom: bool,
    /// The container's stdin takes more (see `Monitor::attach_poll_fds`).
    stdin: bool,
    /// The events of each polled attacher, in `Monitor::attachers`' order.
    attachers: Vec<PollFlags>,
    /// Commands whose client hung up (their indexes in `Monitor::execs`).
    hung_up: Vec<usize>,
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

    /// The monitor's loop, until the init is reaped and its output drained (or a poll fails):
    /// copies output, serves attachers and commands, handles signals. Then records the exit;
    /// returns the process exit code.
    fn run(mut self) -> i32 {
        let mut buf = vec![0u8; 64 << 10];
        let mut progress = Progress {
            status: None,
            exited_at: None,
            shed_at: Some(Instant::now()),
        };
        loop {
            if let Some(t) = progress.exited_at
                && (self.outputs.is_empty() || t.elapsed() >= DRAIN)
            {
                break;
            }
            let (timeout, exec_deadline) = self.next_wait(&mut progress);
            let quiet_ends = progress.exited_at.is_some() && exec_deadline.is_none();
            let ready = match self.wait_ready(timeout, quiet_ends) {
                Polled::Ready(ready) => ready,
                Polled::Interrupted => continue,
                Polled::Done => break,
            };
            self.serve(ready, &mut progress, &mut buf);
        }
        self.finish(progress.status)
    }

    /// How long the next poll may wait: until the nearest command deadline (also returned),
    /// the OOM watch settling, or the time to give memory back (given back here once due);
    /// only briefly after the init's exit.
    fn next_wait(&self, progress: &mut Progress) -> (PollTimeout, Option<Instant>) {
        let now = Instant::now();
        let exec_deadline = self
            .execs
            .iter()
            .filter(|e| !e.timed_out)
            .filter_map(|e| e.deadline)
            .min();
        let mut wait_ms: Option<u64> =
            exec_deadline.map(|d| d.saturating_duration_since(now).as_millis() as u64 + 1);
        if progress.exited_at.is_some() {
            // After the exit, only wait briefly for trailing output.
            wait_ms = Some(wait_ms.map_or(100, |w| w.min(100)));
        }
        if let Some(at) = progress.shed_at
            && self.execs.is_empty()
            && progress.exited_at.is_none()
        {
            let left = at.saturating_duration_since(now);
            if left.is_zero() {
                // Starting the init or a command touches far more than watching needs; one
                // of these runs per container, so keep only what the loop touches.
                let _ = sys::shed_startup_pages();
                progress.shed_at = None;
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
        (timeout, exec_deadline)
    }

    /// Polls everything the loop watches (signals, the socket, the container's output, the OOM
    /// watch, commands' clients, stdin and attachers) and says what is ready. `quiet_ends`: a
    /// poll that times out ends the loop (the init has exited and no command has a deadline).
    fn wait_ready(&self, timeout: PollTimeout, quiet_ends: bool) -> Polled {
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
            Err(Errno::EINTR) => return Polled::Interrupted,
            Err(e) => {
                eprintln!("monitor: poll: {e}");
                return Polled::Done;
            }
        };
        if n == 0 && quiet_ends {
            return Polled::Done; // quiet after exit: done
        }
        let revents = |i: usize| fds[i].revents().unwrap_or(PollFlags::empty());
        let hung_up: Vec<usize> = watched
            .iter()
            .enumerate()
            .filter(|(k, _)| {
                revents(execs_start + k).intersects(PollFlags::POLLHUP | PollFlags::POLLERR)
            })
            .map(|(_, &i)| i)
            .collect();
        Polled::Ready(Ready {
            signals: !revents(0).is_empty(),
            listener: !revents(1).is_empty(),
            outputs: (2..outputs_end).map(|i| !revents(i).is_empty()).collect(),
            oom: oom_at.is_some_and(|i| !revents(i).is_empty()),
            stdin: polls_stdin && !revents(attach_start).is_empty(),
            attachers: (attachers_start..fds.len()).map(revents).collect(),
            hung_up,
        })
    }

    /// Acts on what a poll found, in this order: kills commands whose client hung up, notes
    /// OOM kills, enforces command deadlines, copies output (first, so nothing written before
    /// the exit is lost), serves attachers, accepts commands, handles signals.
    fn serve(&mut self, ready: Ready, progress: &mut Progress, buf: &mut [u8]) {
        for i in ready.hung_up {
            let e = &mut self.execs[i];
            e.abandoned = true;
            let _ = nix::sys::signal::kill(e.pid, Signal::SIGKILL);
        }
        if let Some(o) = self.oom.as_mut()
            && (ready.oom || o.settles_at().is_some_and(|t| t <= Instant::now()))
        {
            o.note();
        }
        self.enforce_deadlines();
        self.copy_output(&ready.outputs, buf);
        if ready.stdin || !ready.attachers.is_empty() {
            self.serve_attachers(&ready.attachers, ready.stdin);
        }
        if ready.listener {
            self.accept_execs(progress.exited_at.is_some());
            progress.shed_at = Some(Instant::now() + Duration::from_secs(5));
        }
        if ready.signals {
            self.handle_signals(progress);
        }
    }

    /// Copies what each ready output holds into the log and to attachers, up to
    /// `READS_PER_ROUND` reads each: a container that writes without end would otherwise keep
    /// the monitor here, its signals (a log reopen) and exec connections never served. The rest
    /// waits for the next poll, which finds it at once. An output at its end (or failing) is
    /// closed and its log stream finished.
    fn copy_output(&mut self, ready: &[bool], buf: &mut [u8]) {
        const READS_PER_ROUND: usize = 4;
        let mut closed = Vec::new();
        for (i, is_ready) in ready.iter().enumerate() {
            if !is_ready {
                continue;
            }
            let (fd, stream) = (&self.outputs[i].0, self.outputs[i].1);
            for _ in 0..READS_PER_ROUND {
                match nix::unistd::read(fd, buf) {
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
    }

    /// Handles the pending signals: SIGCHLD reaps (the init's exit starts the drain), SIGUSR1
    /// reopens the log, and a request to stop is passed on to the init.
    fn handle_signals(&mut self, progress: &mut Progress) {
        while let Ok(Some(info)) = self.signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => {
                    if let Some(s) = self.reap()
                        && progress.status.is_none()
                    {
                        progress.status = Some(s);
                        progress.exited_at = Some(Instant::now());
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

    /// After the loop: finishes the log, ends the commands still running, and writes the exit
    /// record (reaping the init first if the loop did not); attachers then hear the end and
    /// the poststop hooks run. Returns the process exit code.
    fn finish(mut self, status: Option<(i32, Option<i32>)>) -> i32 {
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
