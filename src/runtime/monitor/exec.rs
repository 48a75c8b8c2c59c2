//! Commands run in a running container (ExecSync and streamed exec): the request on the
//! monitor's socket with the command's stdio descriptors, a fork that joins the container
//! exactly as its init did, optionally a terminal made inside the container's own devpts, and
//! the report once the command ends.

use super::{
    AttachRequest, CloneFlags, ControlMessageOwned, Duration, ExecReport, ExecRequest, ForkResult,
    InitError, Instant, IoSliceMut, Monitor, MsgFlags, OFlag, OwnedFd, Pid, StepError, UnixStream,
    cloexec_pipe, init, io, recvmsg, setns, step, sys, waitpid,
};
use std::io::Read;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;

/// How long a command may take from its fork to its exec.
const START_WAIT: Duration = Duration::from_secs(10);

/// What the command's child reported before its exec (nothing once it has exec'd: its end of
/// the pipe closes), waited for at most `START_WAIT`. The child is in the container's PID
/// namespace before it execs, so the container's root can stop it there (SIGSTOP to its PID);
/// the monitor, which serves the container's output and other commands, must not wait on it
/// for good. A child that has not exec'd by then is killed.
fn start_report(err_r: OwnedFd, child: Pid, wait: Duration) -> Result<Vec<u8>, StepError> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = Instant::now() + wait;
    let mut f = std::fs::File::from(err_r);
    let (mut msg, mut buf) = (Vec::new(), [0u8; 4096]);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            let _ = waitpid(child, None);
            return Err(StepError::new(
                "exec",
                format!("the command did not start within {} s", wait.as_secs_f32()),
            ));
        }
        let ms = left.as_millis().min(u128::from(u16::MAX)) as u16;
        let mut fds = [PollFd::new(f.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) | Err(nix::Error::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(step("exec report")(e)),
        }
        match f.read(&mut buf) {
            Ok(0) => return Ok(msg),
            Ok(n) => msg.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(step("exec report")(e)),
        }
    }
}

/// What a command's stdio is made of.
pub(super) enum ExecStdio<'a> {
    Pipes {
        stdin: Option<OwnedFd>,
        stdout: OwnedFd,
        stderr: OwnedFd,
    },
    /// A terminal made in the child, its master handed back on this connection.
    Tty(&'a UnixStream),
}

/// An ExecSync command in flight.
pub(super) struct Exec {
    pub(super) pid: Pid,
    pub(super) conn: UnixStream,
    pub(super) deadline: Option<Instant>,
    pub(super) timed_out: bool,
    /// Its client hung up and it was killed; its exit is reported to no one.
    pub(super) abandoned: bool,
}

impl Exec {
    /// Tells the client the command ended with `code`.
    pub(super) fn report_exit(&mut self, code: i32) {
        send_report(
            &mut self.conn,
            &ExecReport {
                exit_code: code,
                timed_out: self.timed_out,
                error: None,
                bad_command: false,
            },
        );
    }
}

impl Monitor {
    /// Takes every waiting connection: a command to run, or an attachment to the container's
    /// stdio (see `attach`).
    pub(super) fn accept_execs(&mut self, container_gone: bool) {
        while let Ok((mut conn, _)) = self.listener.accept() {
            let (body, fds) = match read_request(&conn) {
                Ok(r) => r,
                Err(e) => {
                    send_report(&mut conn, &exec_error(e.to_string()));
                    continue;
                }
            };
            if let Ok(req) = serde_json::from_slice::<AttachRequest>(&body) {
                self.attach(conn, req.attach, container_gone);
                continue;
            }
            if container_gone {
                send_report(
                    &mut conn,
                    &exec_error("the container is not running".into()),
                );
                continue;
            }
            match self.start_exec(&conn, &body, fds) {
                Ok((pid, deadline)) => self.execs.push(Exec {
                    pid,
                    conn,
                    deadline,
                    timed_out: false,
                    abandoned: false,
                }),
                Err(e) => {
                    let mut report = exec_error(e.to_string());
                    report.bad_command = e.step == crate::runtime::init::BAD_COMMAND;
                    send_report(&mut conn, &report);
                }
            }
        }
    }

    /// Forks the command of an exec request with its descriptors.
    pub(super) fn start_exec(
        &self,
        conn: &UnixStream,
        body: &[u8],
        fds: Vec<OwnedFd>,
    ) -> Result<(Pid, Option<Instant>), StepError> {
        let req: ExecRequest = serde_json::from_slice(body).map_err(step("bad request"))?;
        let stdio = if req.tty {
            if !fds.is_empty() {
                return Err(StepError::new(
                    "exec request",
                    "a terminal brings no descriptors",
                ));
            }
            ExecStdio::Tty(conn)
        } else {
            let want = if req.stdin { 3 } else { 2 };
            if fds.len() != want {
                return Err(StepError::new(
                    "exec request",
                    format!("{want} descriptors are needed"),
                ));
            }
            let mut fds = fds.into_iter();
            match (fds.next(), fds.next(), fds.next()) {
                (Some(stdout), Some(stderr), stdin) => ExecStdio::Pipes {
                    stdin,
                    stdout,
                    stderr,
                },
                _ => {
                    return Err(StepError::new(
                        "exec request",
                        "stdout and stderr are missing",
                    ));
                }
            }
        };
        let (err_r, err_w) = cloexec_pipe()?;
        let forked = sys::fork().map_err(|e| match e.raw_os_error() {
            // The kernel's answer for a PID namespace whose PID 1 is gone.
            Some(libc::ENOMEM) => StepError::new("fork", "the container's PID 1 has ended"),
            _ => step("fork")(e),
        });
        match forked? {
            ForkResult::Child => {
                drop(err_r);
                let e = match self.exec_child(&req, stdio, err_w.as_raw_fd()) {
                    Ok(never) => match never {},
                    Err(e) => e,
                };
                let _ = std::fs::File::from(err_w).write_all(e.to_string().as_bytes());
                sys::exit_now(127)
            }
            ForkResult::Parent { child } => {
                drop(err_w);
                let msg = start_report(err_r, child, START_WAIT)?;
                if !msg.is_empty() {
                    let _ = waitpid(child, None);
                    return Err(StepError::parse(&String::from_utf8_lossy(&msg)));
                }
                let deadline = (req.timeout_ms > 0)
                    .then(|| Instant::now() + Duration::from_millis(req.timeout_ms));
                Ok((child, deadline))
            }
        }
    }

    /// The exec'd command's side of the fork: only its own descriptors kept, the container's
    /// cgroup, its `oom_score_adj` (while still the host's root), the container's namespaces
    /// (its PID namespace is already ours), stdio, the LSM labels through the monitor's procfs
    /// handle, then with only stdio and `errors` left open the working directory, checked to be
    /// inside the root, the rest of the process settings, and exec. The monitor is not
    /// dumpable, nor is this process until it execs.
    pub(super) fn exec_child(
        &self,
        req: &ExecRequest,
        stdio: ExecStdio<'_>,
        errors: std::os::fd::RawFd,
    ) -> Result<std::convert::Infallible, InitError> {
        let (init, cgroup, process, seccomp, userns) = (
            &self.init_fd,
            self.cgroup.as_deref(),
            &self.process,
            self.seccomp.as_ref(),
            self.userns,
        );
        let fail = |step: &str| {
            let step = step.to_string();
            move |e: io::Error| InitError {
                step,
                detail: e.to_string(),
            }
        };
        crate::runtime::process::die_with_monitor(self.own_fd.as_fd())
            .map_err(fail("dying with the monitor"))?;
        // Nothing else of the monitor's (its log, its listener, other commands' connections)
        // may reach the container.
        let mut keep = vec![errors, init.as_raw_fd(), self.proc.raw()];
        match &stdio {
            ExecStdio::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                keep.extend(stdin.iter().map(|f| f.as_raw_fd()));
                keep.extend([stdout.as_raw_fd(), stderr.as_raw_fd()]);
            }
            ExecStdio::Tty(conn) => keep.push(conn.as_raw_fd()),
        }
        sys::close_all_except(&keep).map_err(fail("closing the monitor's descriptors"))?;
        sys::reset_signals().map_err(fail("reset signals"))?;
        let proc = self.proc.borrow();
        // The command counts against the container's limits, like the container's own processes.
        if let Some(cg) = cgroup {
            std::fs::write(cg.join("cgroup.procs"), "0")
                .map_err(fail("joining the container's cgroup"))?;
        }
        // Or the command could open any device node it makes.
        if let Some(dev) = &self.devices_cgroup {
            init::join_cgroup(dev)?;
        }
        if let Some(adj) = process.oom_score_adj() {
            init::set_oom_score_adj(proc, adj)?;
        }
        let mut flags = CloneFlags::CLONE_NEWNS
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWIPC
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWCGROUP;
        if userns {
            flags |= CloneFlags::CLONE_NEWUSER;
        }
        setns(init.as_fd(), flags)
            .map_err(|e| fail("joining the container's namespaces")(e.into()))?;
        match stdio {
            ExecStdio::Pipes {
                stdin,
                stdout,
                stderr,
            } => {
                match stdin {
                    Some(s) => sys::dup_to(&s, 0, false).map_err(fail("stdin"))?,
                    None => {
                        // An empty pipe: no file of the container's or the host's.
                        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
                            .map_err(|e| fail("stdin")(e.into()))?;
                        drop(w);
                        sys::dup_to(&r, 0, false).map_err(fail("stdin"))?;
                    }
                }
                sys::dup_to(&stdout, 1, false).map_err(fail("stdout"))?;
                sys::dup_to(&stderr, 2, false).map_err(fail("stderr"))?;
            }
            ExecStdio::Tty(conn) => {
                // The container's own devpts: we are in its mount namespace.
                let slave = init::container_terminal(conn)?;
                nix::unistd::setsid().map_err(|e| fail("setsid")(e.into()))?;
                sys::set_controlling_tty(&slave).map_err(fail("controlling terminal"))?;
                for fd in 0..3 {
                    sys::dup_to(&slave, fd, false).map_err(fail("terminal stdio"))?;
                }
            }
        }
        let mut p = process.clone();
        p.set_args(Some(req.args.clone()));
        p.set_terminal(Some(req.tty));
        init::label_exec(proc, &p)?;
        // From here the command holds stdio and the error pipe, nothing else.
        sys::close_all_except(&[errors]).map_err(fail("closing descriptors"))?;
        init::enter_working_dir(process.cwd())?;
        init::apply_process(&p, seccomp)?;
        init::exec(&p, &self.raw_env)
    }
}

/// The largest request read: an exec's arguments and environment fit the kernel's own limit
/// for them (a quarter of an 8 MiB stack) well below it.
const MAX_REQUEST: usize = 4 << 20;

/// Reads one request from a new connection, with the descriptors that came with it: a line of
/// JSON, which a stream socket may hand over in pieces (a read stops after the piece that
/// carried descriptors).
fn read_request(conn: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), StepError> {
    conn.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(step("reading the request"))?;
    let mut data = vec![0u8; 64 << 10];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 3]);
    let mut iov = [IoSliceMut::new(&mut data)];
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .map_err(step("reading the request"))?;
    let mut fds: Vec<OwnedFd> = Vec::new();
    for c in msg.cmsgs().map_err(step("the request's descriptors"))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            fds.extend(raw.into_iter().map(sys::own_received_fd));
        }
    }
    let n = msg.bytes;
    data.truncate(n);
    let mut chunk = vec![0u8; 64 << 10];
    let mut rest = conn;
    while n > 0 && !data.ends_with(b"\n") {
        if data.len() > MAX_REQUEST {
            return Err(StepError::new(
                "reading the request",
                format!("it passes {MAX_REQUEST} bytes"),
            ));
        }
        match rest.read(&mut chunk) {
            Ok(0) => break,
            Ok(k) => data.extend_from_slice(&chunk[..k]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(step("reading the request")(e)),
        }
    }
    Ok((data, fds))
}

pub(super) fn exec_error(message: String) -> ExecReport {
    ExecReport {
        exit_code: -1,
        timed_out: false,
        error: Some(message),
        bad_command: false,
    }
}

pub(super) fn send_report(conn: &mut UnixStream, r: &ExecReport) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let _ = conn.write_all(&line);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_stopped_before_its_exec_is_not_waited_on() {
        // A child that never closes the pipe nor writes: stopped before its exec, say.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let (r, w) = cloexec_pipe().unwrap();
        let pid = Pid::from_raw(child.id() as i32);
        let t = Instant::now();
        let e = start_report(r, pid, Duration::from_millis(200)).unwrap_err();
        assert!(e.to_string().contains("did not start"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(5));
        // Killed, and reaped there (so no longer ours to wait for).
        assert!(child.try_wait().is_err());
        drop(w);
        // One that exec'd: its end closed, nothing said.
        let (r, w) = cloexec_pipe().unwrap();
        drop(w);
        assert!(
            start_report(r, pid, Duration::from_secs(1))
                .unwrap()
                .is_empty()
        );
    }
}
