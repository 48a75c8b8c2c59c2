//! The process half shared by a container's init and exec: the terminal made in the container's
//! devpts, stdio ownership, rlimits, oom_score_adj, AppArmor, groups, user, capabilities,
//! no_new_privs, seccomp, and the exec itself. Runs in the child, after `setup`.

use std::convert::Infallible;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag};
use nix::unistd::{Gid, Uid};
use oci_spec::runtime::{PosixRlimitType, Process};

use super::InitError;
use crate::runtime::RawEnv;
use crate::runtime::procfs::ProcRef;
use crate::runtime::seccomp::Compiled;
use crate::runtime::step::step as fail;
use crate::sys;

/// `DEVPTS_SUPER_MAGIC`.
const DEVPTS_MAGIC: i64 = 0x1cd1;

/// Makes a terminal in the container's own devpts (we are in its mount namespace, after
/// pivot_root) and hands its master over `to` as `PTY_MESSAGE` with the descriptor; returns the
/// slave. The master is opened as `/dev/pts/ptmx` without following any link, and must be the
/// multiplexer of a devpts (5:2): whatever the container made of `/dev/ptmx` or its `/dev`, the
/// terminal is a terminal of its own devpts or there is none (CVE-2025-52565's class). Every
/// other descriptor is gone or close-on-exec, so exec leaves the container only what is put on
/// 0, 1 and 2.
pub fn container_terminal(to: &impl AsFd) -> Result<OwnedFd, InitError> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let step = "opening the container's /dev/pts/ptmx";
    let master = openat2(
        nix::fcntl::AT_FDCWD,
        "/dev/pts/ptmx",
        OpenHow::new()
            .flags(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS),
    )
    .map_err(fail(step))?;
    let fs = nix::sys::statfs::fstatfs(&master).map_err(fail(step))?;
    let st = nix::sys::stat::fstat(master.as_fd()).map_err(fail(step))?;
    if fs.filesystem_type().0 as i64 != DEVPTS_MAGIC || st.st_rdev != nix::sys::stat::makedev(5, 2)
    {
        return Err(InitError {
            step: step.into(),
            detail:
                "it is not the multiplexer of a devpts: the container has no terminal of its own"
                    .into(),
        });
    }
    sys::unlock_pty(&master).map_err(fail("unlocking the terminal"))?;
    let slave = sys::pty_peer(&master).map_err(fail("opening the terminal"))?;
    let fds = [master.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(crate::runtime::PTY_MESSAGE)];
    nix::sys::socket::sendmsg::<()>(
        to.as_fd().as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .map_err(fail("handing over the terminal"))?;
    Ok(slave)
}

/// Gives stdio (pipes, the terminal) to the process's user, as runc does, so a process that is
/// not root can reopen its own `/dev/stdout` or `/proc/self/fd/1`. /dev/null stays as it is;
/// what cannot be changed (in a user namespace, a pipe made outside it) is left.
fn own_stdio(uid: u32, gid: u32) {
    let null = nix::sys::stat::stat("/dev/null").ok().map(|s| s.st_rdev);
    let (i, o, e) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    for fd in [i.as_fd(), o.as_fd(), e.as_fd()] {
        let Ok(st) = nix::sys::stat::fstat(fd) else {
            continue;
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFCHR && Some(st.st_rdev) == null {
            continue;
        }
        let _ = nix::unistd::fchown(
            fd,
            Some(nix::unistd::Uid::from_raw(uid)),
            Some(nix::unistd::Gid::from_raw(gid)),
        );
    }
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

/// Sets `oom_score_adj` through the runtime's own procfs handle, clamped to what this process
/// may set: without CAP_SYS_RESOURCE a value below the current one is refused by the kernel,
/// and a pod must not fail for it. Called before the process joins a user namespace (whose
/// root may not write the file of a process that is not dumpable).
pub fn set_oom_score_adj(proc: ProcRef<'_>, want: i32) -> Result<(), InitError> {
    let file = "self/oom_score_adj";
    let current: i32 = proc
        .read(file)
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
    match proc.write(file, value.to_string().as_bytes()) {
        Err(e) if e.raw_os_error() == Some(libc::EPERM) && value < current => Ok(()),
        r => r.map_err(fail(format!("oom_score_adj {value}"))),
    }
}

/// Labels the next exec for the LSMs the process asks for (AppArmor profile, SELinux label),
/// through the runtime's own procfs handle, so nothing the container put at `/proc` receives
/// the label instead of the kernel.
pub fn label_exec(proc: ProcRef<'_>, p: &Process) -> Result<(), InitError> {
    if let Some(profile) = p.apparmor_profile() {
        apparmor_on_exec(proc, profile)?;
    }
    if let Some(label) = p.selinux_label() {
        crate::runtime::selinux::set_exec_label(proc, Some(label))
            .map_err(fail(format!("SELinux label {label}")))?;
    }
    Ok(())
}

/// Enters the process's working directory, once every descriptor but stdio is closed, and
/// refuses one that lies outside the root (CVE-2024-21626: a directory reached through a
/// descriptor the runtime held, or a link to one).
pub fn enter_working_dir(cwd: &Path) -> Result<(), InitError> {
    let step = format!("working directory {}", cwd.display());
    std::env::set_current_dir(cwd).map_err(fail(&step))?;
    let seen = sys::getcwd_raw().map_err(fail(&step))?;
    if !seen.starts_with(b"/") {
        return Err(InitError {
            step,
            detail: "it is outside the container's root".into(),
        });
    }
    Ok(())
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

/// The last of the process half shared by container init and exec, once in the working
/// directory (`set_oom_score_adj` and `label_exec` came before): rlimits, umask, groups, user,
/// capabilities, no_new_privs, seccomp.
pub fn apply_process(p: &Process, seccomp: Option<&Compiled>) -> Result<(), InitError> {
    crate::runtime::process::outlive_monitor().map_err(fail("parent death signal"))?;
    own_stdio(p.user().uid(), p.user().gid());
    for r in p.rlimits().as_deref().unwrap_or_default() {
        nix::sys::resource::setrlimit(resource(r.typ()), r.soft(), r.hard())
            .map_err(fail(format!("rlimit {:?}", r.typ())))?;
    }
    if let Some(mask) = p.user().umask() {
        nix::sys::stat::umask(Mode::from_bits_truncate(mask));
    }
    let nnp = p.no_new_privileges().unwrap_or(false);
    // Without no_new_privs only a privileged caller may install a filter, so it goes on now, and
    // the calls still to come (setgroups, setuid, capset, execve) must pass it, as with runc.
    if !nnp && let Some(f) = seccomp {
        crate::runtime::seccomp::install(&f.program, f.flags).map_err(fail("seccomp"))?;
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
            crate::runtime::seccomp::install(&f.program, f.flags).map_err(fail("seccomp"))?;
        }
    }
    Ok(())
}

/// Asks AppArmor to confine the next exec with `profile`.
fn apparmor_on_exec(proc: ProcRef<'_>, profile: &str) -> Result<(), InitError> {
    let cmd = format!("exec {profile}");
    let step = format!("AppArmor profile {profile}");
    match proc.write("thread-self/attr/apparmor/exec", cmd.as_bytes()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => proc
            .write("thread-self/attr/exec", cmd.as_bytes())
            .map_err(fail(step)),
        Err(e) => Err(fail(step)(e)),
    }
}

/// The step of a command that names no program it can run (missing, not executable, a
/// directory), which the caller can tell apart: it is the caller's to fix.
pub const BAD_COMMAND: &str = "command";

/// The variable `entry` (`KEY=VALUE`) with its value's bytes from `raw`, when its value is
/// still the lossy form of them; `None` for a variable to pass as it is.
fn raw_entry(entry: &str, raw: &[RawEnv]) -> Option<Vec<u8>> {
    let (key, value) = entry.split_once('=')?;
    let r = raw.iter().rev().find(|r| r.key == key)?;
    (String::from_utf8_lossy(&r.value) == value).then(|| [key.as_bytes(), b"=", &r.value].concat())
}

/// Looks up `args[0]` in the process's PATH (as runc does) and execs it, with the values of
/// `raw` in its environment.
pub fn exec(p: &Process, raw: &[RawEnv]) -> Result<Infallible, InitError> {
    let args = p.args().as_deref().unwrap_or_default();
    let Some(arg0) = args.first() else {
        return Err(InitError {
            step: "exec".into(),
            detail: "no command: the container has neither command nor image entrypoint".into(),
        });
    };
    let env = p.env().as_deref().unwrap_or_default();
    let path = resolve(arg0, env).ok_or_else(|| InitError {
        step: BAD_COMMAND.into(),
        detail: format!("{arg0:?}: executable file not found in $PATH"),
    })?;
    let cstr = |s: &str| CString::new(s).map_err(fail("exec: NUL in argument or environment"));
    let argv: Vec<CString> = args.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let envp: Vec<CString> = env
        .iter()
        .map(|e| match raw_entry(e, raw) {
            Some(bytes) => CString::new(bytes).map_err(fail("exec: NUL in environment")),
            None => cstr(e),
        })
        .collect::<Result<_, _>>()?;
    let prog = CString::new(path.as_os_str().as_encoded_bytes()).map_err(fail("exec"))?;
    let err = nix::unistd::execve(&prog, &argv, &envp).unwrap_err();
    use nix::errno::Errno;
    let step = match err {
        Errno::ENOENT
        | Errno::EACCES
        | Errno::ENOEXEC
        | Errno::ENOTDIR
        | Errno::EISDIR
        | Errno::ELOOP
        | Errno::ENAMETOOLONG => BAD_COMMAND,
        _ => "exec",
    };
    Err(InitError {
        step: step.into(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_values_replace_their_lossy_form_only() {
        let raw = vec![RawEnv {
            key: "V".into(),
            value: b"a\xff\xfe".to_vec(),
        }];
        let lossy = format!("V={}", String::from_utf8_lossy(b"a\xff\xfe"));
        assert_eq!(raw_entry(&lossy, &raw), Some(b"V=a\xff\xfe".to_vec()));
        // A value changed since (an NRI plugin's) is passed as it is now.
        assert_eq!(raw_entry("V=other", &raw), None);
        assert_eq!(raw_entry("W=x", &raw), None);
        assert_eq!(raw_entry("no-equals", &raw), None);
    }
}
