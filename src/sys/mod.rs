//! sys: the thin layer over Linux system calls that `nix` does not cover. This is the only module
//! with `unsafe`; every block says why it is sound. Everything above it uses safe wrappers.
//! It may use `libc` and `nix`, nothing else in crius.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

fn cstring(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in name"))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets an extended attribute on an open file (`fsetxattr(2)`).
pub fn fsetxattr<F: AsFd>(fd: F, name: &[u8], value: &[u8]) -> io::Result<()> {
    let name = cstring(name)?;
    // SAFETY: `name` is a valid NUL-terminated string and `value` a valid slice for the whole
    // call; the fd is borrowed for the duration of the call.
    let ret = unsafe {
        libc::fsetxattr(
            fd.as_fd().as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    check(ret)
}

/// Reads an extended attribute of an open file (`fgetxattr(2)`); `None` when it is not set.
pub fn fgetxattr<F: AsFd>(fd: F, name: &[u8]) -> io::Result<Option<Vec<u8>>> {
    let name = cstring(name)?;
    let mut buf = vec![0u8; 256];
    // SAFETY: `name` is NUL-terminated and `buf` is a writable buffer of the length passed.
    let ret = unsafe {
        libc::fgetxattr(
            fd.as_fd().as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if ret < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENODATA) => Ok(None),
            _ => Err(err),
        };
    }
    buf.truncate(ret as usize);
    Ok(Some(buf))
}

/// Flushes every dirty page of the filesystem holding `fd` (`syncfs(2)`).
pub fn syncfs<F: AsFd>(fd: F) -> io::Result<()> {
    // SAFETY: syncfs only reads the descriptor number, which is borrowed and open.
    check(unsafe { libc::syncfs(fd.as_fd().as_raw_fd()) })
}

/// Filesystem usage of the filesystem holding `path`: (used bytes, used inodes).
pub fn fs_usage(path: &Path) -> io::Result<(u64, u64)> {
    let st = nix::sys::statvfs::statvfs(path).map_err(io::Error::from)?;
    let frsize = st.fragment_size() as u64;
    let used = (st.blocks() as u64).saturating_sub(st.blocks_free() as u64) * frsize;
    let inodes = (st.files() as u64).saturating_sub(st.files_free() as u64);
    Ok((used, inodes))
}

/// Forks the calling process.
///
/// Only the single-threaded helpers (`crius monitor`, `crius pause`, `crius nsexec`) call this,
/// before they start any thread, so the child may allocate and do anything a process may.
pub fn fork() -> io::Result<nix::unistd::ForkResult> {
    // SAFETY: callers are single-threaded processes (documented above), so no lock held by another
    // thread can be inherited in a locked state by the child.
    unsafe { nix::unistd::fork() }.map_err(io::Error::from)
}

/// Ends the process at once, without running exit handlers or flushing stdio buffers the parent
/// process may share (the right exit for a forked child that failed before exec).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit has no preconditions; it never returns.
    unsafe { libc::_exit(code) }
}

/// A pidfd for `pid` (`pidfd_open(2)`): readable once the process has exited, for any process,
/// child or not.
pub fn pidfd_open(pid: i32) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes plain integers; a non-negative result is a new descriptor we own.
    // PIDFD_NONBLOCK is not set; the descriptor is close-on-exec by definition.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Sends a signal through a pidfd, so it can never reach a recycled pid.
pub fn pidfd_send_signal<F: AsFd>(pidfd: F, signal: i32) -> io::Result<()> {
    // SAFETY: plain integers and a null siginfo, which the call allows.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_fd().as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Brings the loopback interface of the caller's network namespace up (`ip link set lo up`).
pub fn loopback_up() -> io::Result<()> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags into the ifreq we own; the socket is open.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: the union member ifru_flags is the one SIOCGIFFLAGS filled in.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own; the socket is open.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })
}

/// Makes the terminal on `fd` the caller's controlling terminal (after `setsid`).
pub fn set_controlling_tty<F: AsFd>(fd: F) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument; the descriptor is open and borrowed.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSCTTY, 0) })
}

/// Closes every descriptor from `first` up, except those the caller moved below it.
pub fn close_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; callers own everything at or above `first`
    // (they call this in a child about to exec).
    check(unsafe { libc::close_range(first, u32::MAX, 0) })
}

/// Clears FD_CLOEXEC so a descriptor survives exec (for descriptors handed to a child by number).
pub fn keep_on_exec<F: AsFd>(fd: F) -> io::Result<()> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::empty()))
        .map(drop)
        .map_err(io::Error::from)
}

/// Duplicates `fd` onto the exact number `target` (close-on-exec when asked), replacing whatever
/// `target` held. Used between fork and exec to lay out a child's descriptors.
pub fn dup_to<F: AsFd>(fd: F, target: i32, cloexec: bool) -> io::Result<()> {
    let raw = fd.as_fd().as_raw_fd();
    if raw == target {
        use nix::fcntl::{FcntlArg, FdFlag, fcntl};
        let flags = if cloexec {
            FdFlag::FD_CLOEXEC
        } else {
            FdFlag::empty()
        };
        return fcntl(fd.as_fd(), FcntlArg::F_SETFD(flags))
            .map(drop)
            .map_err(io::Error::from);
    }
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 only manipulates the descriptor table; `raw` is open (borrowed) and the caller
    // owns whatever `target` referred to.
    check(unsafe { libc::dup3(raw, target, flags) })
}

/// Unblocks every signal and restores every default disposition, as a freshly exec'd program
/// expects (Rust ignores SIGPIPE, and helpers block signals for their signalfd; both would be
/// inherited across exec).
pub fn reset_signals() -> io::Result<()> {
    use nix::sys::signal::{SigHandler, SigSet, Signal, signal};
    SigSet::empty().thread_set_mask().map_err(io::Error::from)?;
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: installing SIG_DFL runs no code of ours in signal context.
        unsafe { signal(sig, SigHandler::SigDfl) }.map_err(io::Error::from)?;
    }
    Ok(())
}

extern "C" fn ignore_signal(_: libc::c_int) {}

/// Installs a do-nothing handler for `signals` (which the caller keeps blocked and reads through
/// a signalfd). PID 1 of a PID namespace only receives signals it has a handler for; SIG_DFL
/// ones are dropped before they could be read.
pub fn catch_signals(signals: &[nix::sys::signal::Signal]) -> io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(ignore_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for sig in signals {
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        unsafe { sigaction(*sig, &action) }.map_err(io::Error::from)?;
    }
    Ok(())
}

/// Registers an owned descriptor (a pidfd) with the async reactor, to await its readiness.
pub fn async_fd(
    fd: std::os::fd::OwnedFd,
    interest: tokio::io::Interest,
) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the AsyncFd owns the OwnedFd, which keeps the descriptor open and referring to the
    // same file for exactly as long as the registration lives.
    Ok(unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, interest) }?)
}

/// Takes ownership of a descriptor received with SCM_RIGHTS.
pub fn own_received_fd(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: the kernel installed this descriptor in our table when the message was received;
    // nothing else refers to it, so exactly one owner closes it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}
