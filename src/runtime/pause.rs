//! `crius pause CONFIG`: the process that holds a pod's namespaces. It creates them itself
//! (network with loopback up, IPC, UTS with the pod's hostname, and PID when the pod shares one,
//! in which case it forks and the child is the pod's PID 1), applies the pod's sysctls inside
//! them, reports `Ready` with the holder's pid on stdout, then sleeps: reaping zombies when it is
//! PID 1 and exiting on SIGTERM or SIGINT. No image, no registry.

use std::io::Write;

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use super::{PauseConfig, PauseReport, ProcessId};
use crate::sys;

pub fn main(config: &str) -> i32 {
    let _ = nix::sys::prctl::set_name(c"pause");
    let cfg: PauseConfig = match serde_json::from_str(config) {
        Ok(c) => c,
        Err(e) => return fail(format!("pause config: {e}")),
    };
    if let Err(e) = sys::close_from(3) {
        return fail(format!("close descriptors: {e}"));
    }
    let _ = nix::unistd::setsid();
    let signals = match signal_fd() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    if let Err(e) = setup(&cfg) {
        return fail(e);
    }
    if cfg.new_pid {
        if let Err(e) = unshare(CloneFlags::CLONE_NEWPID) {
            return fail(format!("new pid namespace: {e}"));
        }
        match sys::fork() {
            Err(e) => fail(format!("fork: {e}")),
            Ok(ForkResult::Child) => {
                // The pod's PID 1: its own loop, reaping orphans of every container.
                sleep_until_stopped(&signals)
            }
            Ok(ForkResult::Parent { child }) => {
                let Ok(id) = ProcessId::of(child.as_raw()) else {
                    return fail("pid 1 of the pod vanished".into());
                };
                ready(id);
                // Stay the parent of the pod's PID 1: forward stop signals, leave when it does.
                holder_loop(&signals, child)
            }
        }
    } else {
        match ProcessId::of(std::process::id() as i32) {
            Ok(id) => ready(id),
            Err(e) => return fail(format!("own identity: {e}")),
        }
        sleep_until_stopped(&signals)
    }
}

fn signal_fd() -> Result<SignalFd, String> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    mask.thread_block()
        .map_err(|e| format!("block signals: {e}"))?;
    sys::catch_signals(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
        Signal::SIGHUP,
    ])
    .map_err(|e| format!("signal handlers: {e}"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).map_err(|e| format!("signalfd: {e}"))
}

fn setup(cfg: &PauseConfig) -> Result<(), String> {
    if let Some(cg) = &cfg.cgroup {
        std::fs::write(cg.join("cgroup.procs"), "0")
            .map_err(|e| format!("joining cgroup {}: {e}", cg.display()))?;
    }
    if !cfg.uid_map.is_empty() {
        enter_user_namespace(cfg)?;
    }
    let mut flags = CloneFlags::empty();
    if cfg.new_net {
        flags |= CloneFlags::CLONE_NEWNET;
    }
    if cfg.new_ipc {
        flags |= CloneFlags::CLONE_NEWIPC;
    }
    if cfg.new_uts {
        flags |= CloneFlags::CLONE_NEWUTS;
    }
    if !flags.is_empty() {
        unshare(flags).map_err(|e| format!("new namespaces: {e}"))?;
    }
    if cfg.new_uts
        && let Some(h) = &cfg.hostname
    {
        nix::unistd::sethostname(h).map_err(|e| format!("hostname {h:?}: {e}"))?;
    }
    if cfg.new_net {
        sys::loopback_up().map_err(|e| format!("loopback up: {e}"))?;
    }
    for (k, v) in &cfg.sysctls {
        super::init::write_sysctl(k, v).map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Moves into a new user namespace whose maps a forked helper writes from outside (a process
/// may not map anything but itself into its own namespace), then becomes the namespace's root:
/// from here on the pause process is no longer root on the host.
fn enter_user_namespace(cfg: &PauseConfig) -> Result<(), String> {
    use std::io::Read;
    let pipe =
        || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("pipe: {e}"));
    let (go_r, go_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let me = std::process::id();
    match sys::fork().map_err(|e| format!("fork: {e}"))? {
        ForkResult::Child => {
            drop(go_w);
            drop(done_r);
            let mut b = [0u8; 1];
            let mut go = std::fs::File::from(go_r);
            if !matches!(go.read(&mut b), Ok(1)) {
                sys::exit_now(1);
            }
            let lines = |m: &[super::IdMapping]| m.iter().map(|x| x.line()).collect::<String>();
            let mut result = String::new();
            for (file, map) in [("uid_map", &cfg.uid_map), ("gid_map", &cfg.gid_map)] {
                let path = format!("/proc/{me}/{file}");
                if let Err(e) = std::fs::write(&path, lines(map)) {
                    result = format!("writing {path}: {e}");
                    break;
                }
            }
            let _ = std::fs::File::from(done_w).write_all(result.as_bytes());
            sys::exit_now(0)
        }
        ForkResult::Parent { child } => {
            drop(go_r);
            drop(done_w);
            let entered = unshare(CloneFlags::CLONE_NEWUSER);
            if entered.is_ok() {
                let _ = std::fs::File::from(go_w).write_all(&[1]);
            } else {
                drop(go_w);
            }
            let mut msg = String::new();
            let _ = std::fs::File::from(done_r).read_to_string(&mut msg);
            let _ = waitpid(child, None);
            entered.map_err(|e| format!("new user namespace: {e}"))?;
            if !msg.is_empty() {
                return Err(msg);
            }
        }
    }
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(|e| format!("setgroups in the user namespace: {e}"))?;
    nix::unistd::setresgid(root_gid, root_gid, root_gid)
        .map_err(|e| format!("setgid 0 in the user namespace: {e}"))?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid)
        .map_err(|e| format!("setuid 0 in the user namespace: {e}"))
}

fn report(r: &PauseReport) {
    let mut line = serde_json::to_vec(r).unwrap_or_default();
    line.push(b'\n');
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&line);
    let _ = out.flush();
}

fn ready(id: ProcessId) {
    report(&PauseReport::Ready {
        pid: id.pid,
        start_time: id.start_time,
    });
    // The daemon reads one line; nothing else goes its way.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = sys::dup_to(&null, 1, false);
    }
}

fn fail(message: String) -> i32 {
    report(&PauseReport::Failed { message });
    1
}

fn sleep_until_stopped(signals: &SignalFd) -> ! {
    loop {
        if let Ok(Some(info)) = signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGTERM | Signal::SIGINT) => sys::exit_now(0),
                Ok(Signal::SIGCHLD) => reap_all(),
                _ => {}
            }
        }
    }
}

fn reap_all() {
    while let Ok(s) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

fn holder_loop(signals: &SignalFd, child: Pid) -> i32 {
    loop {
        let Ok(Some(info)) = signals.read_signal() else {
            continue;
        };
        match Signal::try_from(info.ssi_signo as i32) {
            Ok(Signal::SIGCHLD) => match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                Ok(_) | Err(_) => return 0,
            },
            Ok(sig @ (Signal::SIGTERM | Signal::SIGINT)) => {
                let _ = nix::sys::signal::kill(child, sig);
            }
            _ => {}
        }
    }
}
