//! `crius nsexec CONFIG`: runs one command in a running container for ExecSync (the path exec
//! probes take every few seconds, so it is short). It joins every namespace of the container's
//! init through the init's pidfd in one `setns` (no pid reuse race), forks so the child lands in
//! the container's PID namespace, applies the container's process settings (user, capabilities,
//! environment, working directory) and execs. The child's stdout and stderr are the pipes the
//! daemon gave this helper; fd 0 is a socket on which the helper reports the exit code, whether
//! the timeout struck, or why the command could not start.

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sched::{CloneFlags, setns};
use nix::sys::wait::waitpid;
use nix::unistd::ForkResult;
use oci_spec::runtime::Spec;

use super::{ExecConfig, ExecReport, exit_code, init};
use crate::sys;

pub fn main(config: &str) -> i32 {
    // The status socket arrives as stdin; keep it and give the command /dev/null instead.
    let _ = nix::sys::prctl::set_name(c"crius-nsexec");
    // Close-on-exec, so the command (and anything it leaves running) never holds it.
    let status: OwnedFd = match nix::unistd::dup(std::io::stdin().as_fd()) {
        Ok(fd) => fd,
        Err(_) => return 125,
    };
    let cloexec = nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC);
    if nix::fcntl::fcntl(&status, cloexec).is_err() {
        return 125;
    }
    let mut status = std::fs::File::from(status);
    let report = run(config);
    let mut line = serde_json::to_vec(&report).unwrap_or_default();
    line.push(b'\n');
    let _ = status.write_all(&line);
    0
}

fn err(message: String) -> ExecReport {
    ExecReport {
        exit_code: -1,
        timed_out: false,
        error: Some(message),
    }
}

fn run(config: &str) -> ExecReport {
    let cfg: ExecConfig = match serde_json::from_str(config) {
        Ok(c) => c,
        Err(e) => return err(format!("exec config: {e}")),
    };
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = sys::dup_to(&null, 0, false);
    }
    let spec: Spec = match std::fs::read(cfg.bundle.join("config.json"))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => return err(format!("container spec: {e}")),
    };
    let Some(mut process) = spec.process().clone() else {
        return err("container spec has no process".into());
    };
    process.set_args(Some(cfg.args.clone()));
    process.set_terminal(Some(false));

    let init_fd = match cfg.init.pidfd() {
        Ok(fd) => fd,
        Err(_) => return err("the container is not running".into()),
    };
    let flags = CloneFlags::CLONE_NEWNS
        | CloneFlags::CLONE_NEWPID
        | CloneFlags::CLONE_NEWNET
        | CloneFlags::CLONE_NEWIPC
        | CloneFlags::CLONE_NEWUTS
        | CloneFlags::CLONE_NEWCGROUP;
    if let Err(e) = setns(init_fd.as_fd(), flags) {
        return err(format!("joining the container's namespaces: {e}"));
    }
    let (err_r, err_w) = match nix::unistd::pipe2(OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return err(format!("pipe: {e}")),
    };
    let child = match sys::fork() {
        Err(e) => return err(format!("fork: {e}")),
        Ok(ForkResult::Child) => {
            drop(err_r);
            let e = match child_setup(&process) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            let _ = std::fs::File::from(err_w).write_all(e.to_string().as_bytes());
            sys::exit_now(127);
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(err_w);
    let mut msg = Vec::new();
    let _ = std::fs::File::from(err_r).read_to_end(&mut msg);
    if !msg.is_empty() {
        let _ = waitpid(child, None);
        return err(String::from_utf8_lossy(&msg).into_owned());
    }
    let mut timed_out = false;
    if cfg.timeout_ms > 0
        && let Ok(pidfd) = sys::pidfd_open(child.as_raw())
    {
        {
            let mut left = cfg.timeout_ms;
            loop {
                let chunk = left.min(u16::MAX as u64) as u16;
                let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
                match poll(&mut fds, PollTimeout::from(chunk)) {
                    Ok(0) => {
                        left -= chunk as u64;
                        if left == 0 {
                            timed_out = true;
                            let _ = sys::pidfd_send_signal(&pidfd, libc::SIGKILL);
                            break;
                        }
                    }
                    Ok(_) => break,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => break,
                }
            }
        }
    }
    let code = waitpid(child, None)
        .ok()
        .and_then(exit_code)
        .map(|(c, _)| c)
        .unwrap_or(-1);
    ExecReport {
        exit_code: code,
        timed_out,
        error: None,
    }
}

fn child_setup(
    process: &oci_spec::runtime::Process,
) -> Result<std::convert::Infallible, init::InitError> {
    sys::reset_signals().map_err(|e| init::InitError {
        step: "reset signals".into(),
        detail: e.to_string(),
    })?;
    let cwd = process.cwd();
    std::env::set_current_dir(cwd).map_err(|e| init::InitError {
        step: format!("chdir {}", cwd.display()),
        detail: e.to_string(),
    })?;
    init::apply_process(process)?;
    init::exec(process)
}
