//! `crius pause CONFIG`: the process that holds a pod's namespaces. It creates them itself
//! (network with loopback up, IPC, UTS with the pod's hostname, and PID when the pod shares one,
//! in which case it forks and the child is the pod's PID 1), applies the pod's sysctls inside
//! them, reports `Ready` with the holder's pid on stdout, then sleeps: reaping zombies when it is
//! PID 1 and exiting on SIGTERM or SIGINT. Between the report and the sleep (or exec) it waits
//! for the daemon's word that the pod's record is written, and ends without it (`await_kept`).
//! No image, no registry. When the operator configured a pause image, the holder instead moves
//! into the image's root filesystem (its own mount namespace, pivot_root), becomes the image's
//! user without capabilities, and execs its command.

use std::io::Write;

use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use super::step::{StepError, step};
use super::{PauseConfig, PauseImage, PauseReport, ProcessId};
use crate::sys;

pub fn main(config: &str) -> i32 {
    let _ = nix::sys::prctl::set_name(c"pause");
    if config == HOLD || config == HOLD_READY {
        let signals = match signal_fd() {
            Ok(s) => s,
            Err(e) => return fail(e),
        };
        if config == HOLD_READY {
            match ProcessId::of(std::process::id() as i32) {
                Ok(id) => ready(id),
                Err(e) => return fail(StepError::new("own identity", e)),
            }
            if !super::await_kept() {
                return 1;
            }
        }
        sleep_until_stopped(&signals)
    }
    let cfg: PauseConfig = match serde_json::from_str(config) {
        Ok(c) => c,
        Err(e) => return fail(StepError::new("pause config", e)),
    };
    if let Err(e) = sys::close_from(3) {
        return fail(StepError::new("close descriptors", e));
    }
    let _ = nix::unistd::setsid();
    let signals = match signal_fd() {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    match setup(&cfg) {
        Ok(()) => {}
        Err(Setup::Step(e)) => return fail(e),
        Err(Setup::Refused { sysctl, message }) => {
            report(&PauseReport::Refused { sysctl, message });
            return 1;
        }
    }
    if cfg.new_pid {
        if let Err(e) = unshare(CloneFlags::CLONE_NEWPID) {
            return fail(StepError::new("new pid namespace", e));
        }
        // The child says on this pipe why it could not become the image's process; end of file
        // (its end closed by exec) means it did.
        let (failed_r, failed_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
            Ok(p) => p,
            Err(e) => return fail(StepError::new("pipe", e)),
        };
        match sys::fork() {
            Err(e) => fail(StepError::new("fork", e)),
            Ok(ForkResult::Child) => {
                drop(failed_r);
                // The daemon's word is for the holder (our parent) to read.
                if let Ok(null) = std::fs::File::open("/dev/null") {
                    let _ = sys::dup_to(&null, 0, false);
                }
                let label = cfg.selinux_label.as_deref();
                match &cfg.image {
                    // The pod's PID 1: its own loop, reaping orphans of every container.
                    None if label.is_none() => {
                        drop(failed_w);
                        sleep_until_stopped(&signals)
                    }
                    None => {
                        let e = hold_labelled(label, HOLD);
                        let _ = std::fs::File::from(failed_w).write_all(e.to_string().as_bytes());
                        sys::exit_now(127)
                    }
                    Some(image) => {
                        // The label first: the image's root has no /proc to set it from.
                        let e = match label_next_exec(label).and_then(|()| enter_image(image)) {
                            Ok(command) => command.exec(),
                            Err(e) => e,
                        };
                        let _ = std::fs::File::from(failed_w).write_all(e.to_string().as_bytes());
                        sys::exit_now(127)
                    }
                }
            }
            Ok(ForkResult::Parent { child }) => {
                drop(failed_w);
                let mut why = String::new();
                let _ = std::io::Read::read_to_string(&mut std::fs::File::from(failed_r), &mut why);
                if !why.is_empty() {
                    let _ = waitpid(child, None);
                    return fail(why);
                }
                let Ok(id) = ProcessId::of(child.as_raw()) else {
                    return fail("pid 1 of the pod vanished");
                };
                ready(id);
                if !super::await_kept() {
                    // No record owns the pod: its PID 1 (and so its namespace) goes with us.
                    let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    return 1;
                }
                // Stay the parent of the pod's PID 1: forward stop signals, leave when it does.
                holder_loop(&signals, child)
            }
        }
    } else {
        // Everything that can fail happens before the report; only exec itself comes after.
        // Our identity is read first: the image's root has no /proc.
        let id = match ProcessId::of(std::process::id() as i32) {
            Ok(id) => id,
            Err(e) => return fail(StepError::new("own identity", e)),
        };
        let label = cfg.selinux_label.as_deref();
        if cfg.image.is_none() && label.is_some() {
            // The re-executed holder reports itself ready: a refused exec fails the pod.
            return fail(hold_labelled(label, HOLD_READY));
        }
        let command = match cfg
            .image
            .as_ref()
            .map(|i| label_next_exec(label).and_then(|()| enter_image(i)))
            .transpose()
        {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        ready(id);
        if !super::await_kept() {
            return 1;
        }
        match command {
            Some(c) => {
                let e = c.exec();
                eprintln!("pause: {e}");
                127
            }
            None => sleep_until_stopped(&signals),
        }
    }
}

/// The pause image's command, ready to exec from inside its root.
struct ImageCommand {
    path: std::ffi::CString,
    args: Vec<std::ffi::CString>,
    env: Vec<std::ffi::CString>,
    /// Opened before leaving the host's root: the image's process gets it as stdout, which
    /// would otherwise be the daemon's pipe.
    null: std::fs::File,
}

impl ImageCommand {
    /// Replaces this process with the image's; returns why it could not.
    fn exec(self) -> StepError {
        if let Err(e) = sys::reset_signals() {
            return StepError::new("pause image: resetting signals", e);
        }
        if let Err(e) = sys::dup_to(&self.null, 1, false) {
            return StepError::new("pause image: stdout", e);
        }
        match nix::unistd::execve(&self.path, &self.args, &self.env) {
            Err(e) => StepError::new(format!("pause image: exec {:?}", self.path), e),
            Ok(never) => match never {},
        }
    }
}

/// Moves into the pause image's root filesystem in a mount namespace of our own, takes on the
/// image's user with no capabilities left, and finds its command.
fn enter_image(image: &PauseImage) -> Result<ImageCommand, StepError> {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    use std::ffi::CString;
    let cstring = |s: &str| {
        CString::new(s).map_err(|_| StepError::new("pause image", format!("NUL byte in {s:?}")))
    };
    let first = image
        .args
        .first()
        .ok_or_else(|| StepError::new("pause image", "the image has no entrypoint or command"))?;
    let null = std::fs::File::open("/dev/null").map_err(step("/dev/null"))?;
    unshare(CloneFlags::CLONE_NEWNS).map_err(step("new mount namespace"))?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(step("making mounts private"))?;
    // A bind of the root onto itself is a mount of this namespace's own: in a pod's user
    // namespace the copied ones are locked to their parents, and pivot_root refuses those.
    mount(
        Some(&image.rootfs),
        &image.rootfs,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(step("binding the pause image root"))?;
    nix::unistd::chdir(&image.rootfs)
        .map_err(step(format!("pause image root {}", image.rootfs.display())))?;
    nix::unistd::pivot_root(".", ".").map_err(step("pivot_root"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(step("detaching the old root"))?;
    let cwd = if image.cwd.is_empty() {
        "/"
    } else {
        &image.cwd
    };
    nix::unistd::chdir(cwd).map_err(step(format!("pause image working directory {cwd}")))?;
    // The command as the image names it: a path, or a name looked up on the image's PATH.
    let path = if first.contains('/') {
        first.clone()
    } else {
        let search = image
            .env
            .iter()
            .find_map(|e| e.strip_prefix("PATH="))
            .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        search
            .split(':')
            .map(|d| format!("{d}/{first}"))
            .find(|p| std::path::Path::new(p).is_file())
            .ok_or_else(|| {
                StepError::new(
                    format!("pause image: {first}"),
                    format!("not found on PATH {search}"),
                )
            })?
    };
    if !std::path::Path::new(&path).is_file() {
        return Err(StepError::new(
            format!("pause image: {path}"),
            "no such file",
        ));
    }
    // No capabilities: holding namespaces and reaping needs none.
    let gid = nix::unistd::Gid::from_raw(image.gid);
    let uid = nix::unistd::Uid::from_raw(image.uid);
    nix::unistd::setgroups(&[]).map_err(step("setgroups"))?;
    nix::unistd::setresgid(gid, gid, gid).map_err(step(format!("setgid {}", image.gid)))?;
    for cap in caps::all() {
        caps::drop(None, caps::CapSet::Bounding, cap)
            .map_err(step(format!("dropping {cap} from the bounding set")))?;
    }
    nix::unistd::setresuid(uid, uid, uid).map_err(step(format!("setuid {}", image.uid)))?;
    for set in [
        caps::CapSet::Ambient,
        caps::CapSet::Inheritable,
        caps::CapSet::Effective,
        caps::CapSet::Permitted,
    ] {
        caps::clear(None, set).map_err(step("clearing capabilities"))?;
    }
    nix::sys::prctl::set_no_new_privs().map_err(step("no_new_privs"))?;
    Ok(ImageCommand {
        path: cstring(&path)?,
        args: image
            .args
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<_, _>>()?,
        env: image
            .env
            .iter()
            .map(|a| cstring(a))
            .collect::<Result<_, _>>()?,
        null,
    })
}

fn signal_fd() -> Result<SignalFd, StepError> {
    let mut mask = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
        Signal::SIGHUP,
    ] {
        mask.add(s);
    }
    mask.thread_block().map_err(step("block signals"))?;
    sys::catch_signals(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGCHLD,
        Signal::SIGHUP,
    ])
    .map_err(step("signal handlers"))?;
    SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).map_err(step("signalfd"))
}

/// Why the pod's namespaces could not be made: a step that failed, or a sysctl value the
/// kernel refused (told apart, since that one is the caller's to fix).
enum Setup {
    Step(StepError),
    Refused { sysctl: String, message: String },
}

impl From<StepError> for Setup {
    fn from(e: StepError) -> Setup {
        Setup::Step(e)
    }
}

fn setup(cfg: &PauseConfig) -> Result<(), Setup> {
    let proc = super::procfs::ProcFs::open().map_err(step("/proc"))?;
    if cfg.placed {
        super::await_placement().map_err(|e| StepError::new("placement", e))?;
    }
    if let Some(cg) = &cfg.cgroup {
        std::fs::write(cg.join("cgroup.procs"), "0")
            .map_err(step(format!("joining cgroup {}", cg.display())))?;
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
        unshare(flags).map_err(step("new namespaces"))?;
    }
    if cfg.new_uts
        && let Some(h) = &cfg.hostname
    {
        nix::unistd::sethostname(h).map_err(step(format!("hostname {h:?}")))?;
    }
    if cfg.new_net {
        sys::loopback_up().map_err(step("loopback up"))?;
    }
    for (k, v) in &cfg.sysctls {
        let path = super::init::sysctl_path(k)?;
        match proc.borrow().write(&path, v.as_bytes()) {
            Ok(()) => {}
            // The kernel's word on a value it cannot take (a number out of range, a pair in
            // the wrong order).
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ERANGE)) => {
                return Err(Setup::Refused {
                    sysctl: k.clone(),
                    message: format!("the kernel refused {v:?}: {e}"),
                });
            }
            Err(e) => return Err(StepError::new(format!("sysctl {k}={v}"), e).into()),
        }
    }
    Ok(())
}

/// Moves into a new user namespace whose maps a forked helper writes from outside (a process
/// may not map anything but itself into its own namespace), then becomes the namespace's root:
/// from here on the pause process is no longer root on the host.
fn enter_user_namespace(cfg: &PauseConfig) -> Result<(), StepError> {
    use std::io::Read;
    let pipe = || nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(step("pipe"));
    let (go_r, go_w) = pipe()?;
    let (done_r, done_w) = pipe()?;
    let me = std::process::id();
    match sys::fork().map_err(step("fork"))? {
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
                    result = format!("{path}: {e}");
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
            entered.map_err(step("new user namespace"))?;
            if !msg.is_empty() {
                return Err(StepError::new("user namespace maps", msg));
            }
        }
    }
    let root_gid = nix::unistd::Gid::from_raw(0);
    let root_uid = nix::unistd::Uid::from_raw(0);
    nix::unistd::setgroups(&[]).map_err(step("setgroups in the user namespace"))?;
    nix::unistd::setresgid(root_gid, root_gid, root_gid)
        .map_err(step("setgid 0 in the user namespace"))?;
    nix::unistd::setresuid(root_uid, root_uid, root_uid)
        .map_err(step("setuid 0 in the user namespace"))
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

fn fail(e: impl std::fmt::Display) -> i32 {
    report(&PauseReport::Failed {
        message: e.to_string(),
    });
    1
}

/// `crius pause hold`: only the sleep, for a pod process that execs into its SELinux label;
/// `hold-ready` reports the pod ready first (when no parent of its does).
const HOLD: &str = "hold";
const HOLD_READY: &str = "hold-ready";

/// Labels this process's next exec for SELinux.
fn label_next_exec(label: Option<&str>) -> Result<(), StepError> {
    match label {
        Some(l) => {
            let proc = super::procfs::ProcFs::open().map_err(step("/proc"))?;
            super::selinux::set_exec_label(proc.borrow(), Some(l))
                .map_err(step(format!("SELinux label {l}")))
        }
        None => Ok(()),
    }
}

/// Re-executes this program as `crius pause <how>` under the pod's SELinux label (the setup
/// before needed the runtime's own); returns why it could not.
fn hold_labelled(label: Option<&str>, how: &str) -> StepError {
    if let Err(e) = label_next_exec(label) {
        return e;
    }
    let how = match std::ffi::CString::new(how) {
        Ok(h) => h,
        Err(e) => return StepError::new("pause mode", e),
    };
    let args = [c"crius", c"pause", how.as_c_str()];
    let env: [&std::ffi::CStr; 0] = [];
    match nix::unistd::execve(c"/proc/self/exe", &args, &env) {
        Err(e) => StepError::new("re-executing the pause process", e),
        Ok(never) => match never {},
    }
}

fn sleep_until_stopped(signals: &SignalFd) -> ! {
    // One of these per pod, asleep for its lifetime: keep only what the loop touches.
    let _ = sys::shed_startup_pages();
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
    let _ = sys::shed_startup_pages();
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
