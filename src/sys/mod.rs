//! sys: the thin layer over Linux system calls that `nix` does not cover. This is the only module
//! with `unsafe`; every block says why it is sound. Everything above it uses safe wrappers.
//! It may use `libc` and `nix`, nothing else in crius. Its users are the layer above it
//! (`runtime`, `content`, `snapshot`); the daemon's async modules use only the two calls that
//! belong to no owner below them: `async_fd` (registering a descriptor with tokio's reactor,
//! which tokio makes unsafe) and `trim_heap` (the whole process's allocator); the streamed
//! exec's terminal master, which lives in the daemon, is resized and received here too.

#![allow(unsafe_code)]

mod fd;
mod mount;

pub use fd::*;
pub use mount::*;

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

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
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

/// Sets an extended attribute on what a path leads to (`setxattr(2)`).
pub fn setxattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let name = cstring(name)?;
    let path = cstring(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `path` and `name` are valid NUL-terminated strings and `value` a valid slice for
    // the whole call.
    let ret = unsafe {
        libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    check(ret)
}

/// Sets an extended attribute on a path, not following a final symlink (`lsetxattr(2)`).
pub fn lsetxattr(path: &Path, name: &[u8], value: &[u8]) -> io::Result<()> {
    let name = cstring(name)?;
    let path = cstring(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: `path` and `name` are valid NUL-terminated strings and `value` a valid slice for
    // the whole call.
    let ret = unsafe {
        libc::lsetxattr(
            path.as_ptr(),
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
    let fd = fd.as_fd().as_raw_fd();
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: `name` is NUL-terminated and `buf` is a writable buffer of the length passed.
        let ret = unsafe { libc::fgetxattr(fd, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if ret >= 0 {
            buf.truncate(ret as usize);
            return Ok(Some(buf));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ENODATA) => return Ok(None),
            // Larger than the buffer: ask for the size, then read again (it may grow between).
            Some(libc::ERANGE) if buf.len() < XATTR_SIZE_MAX => {
                // SAFETY: a zero-length buffer only asks for the value's size.
                let size = unsafe { libc::fgetxattr(fd, name.as_ptr(), std::ptr::null_mut(), 0) };
                if size < 0 {
                    return Err(io::Error::last_os_error());
                }
                buf.resize((size as usize).clamp(buf.len() + 1, XATTR_SIZE_MAX), 0);
            }
            _ => return Err(err),
        }
    }
}

/// The kernel's limit on one extended attribute's value.
const XATTR_SIZE_MAX: usize = 65536;

/// The names of an open file's extended attributes (`flistxattr(2)`).
pub fn flistxattr<F: AsFd>(fd: F) -> io::Result<Vec<Vec<u8>>> {
    let fd = fd.as_fd().as_raw_fd();
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: `buf` is a writable buffer of the length passed.
        let ret = unsafe { libc::flistxattr(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if ret >= 0 {
            buf.truncate(ret as usize);
            return Ok(buf
                .split(|b| *b == 0)
                .filter(|n| !n.is_empty())
                .map(<[u8]>::to_vec)
                .collect());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::ERANGE) if buf.len() < XATTR_SIZE_MAX => {
                buf.resize(buf.len() * 4, 0);
            }
            _ => return Err(err),
        }
    }
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

/// Installs a seccomp filter program on the calling thread (`seccomp(SECCOMP_SET_MODE_FILTER)`).
pub fn seccomp_filter(program: &[libc::sock_filter], flags: u32) -> io::Result<()> {
    let len = u16::try_from(program.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "seccomp program too long"))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    const SECCOMP_SET_MODE_FILTER: libc::c_ulong = 1;
    // SAFETY: `prog` points at `len` instructions that live for the whole call; the kernel copies
    // the program and never writes through the pointer.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_SET_MODE_FILTER,
            flags as libc::c_ulong,
            &prog as *const libc::sock_fprog,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Loads a cgroup device program (`BPF_PROG_TYPE_CGROUP_DEVICE`) given as raw 8-byte eBPF
/// instructions; a verifier refusal comes back with the verifier's log.
pub fn bpf_load_device_program(insns: &[u64]) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    #[repr(C)]
    struct ProgLoad {
        prog_type: u32,
        insn_cnt: u32,
        insns: u64,
        license: u64,
        log_level: u32,
        log_size: u32,
        log_buf: u64,
        kern_version: u32,
        prog_flags: u32,
        prog_name: [u8; 16],
        prog_ifindex: u32,
        expected_attach_type: u32,
    }
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
    let license = c"Apache-2.0";
    let mut name = [0u8; 16];
    name[..12].copy_from_slice(b"crius_device");
    let insn_cnt = u32::try_from(insns.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "program too long"))?;
    // Without the verifier's log first (writing it costs time); with it only to explain a
    // refusal. The verifier gives up with EAGAIN when a signal is pending for the loading
    // thread (a child's SIGCHLD, say): tried again, as libbpf does.
    let load = |log: Option<&mut Vec<u8>>| -> io::Result<i32> {
        let (log_level, log_size, log_buf) = match log {
            Some(l) => (1, l.len() as u32, l.as_mut_ptr() as u64),
            None => (0, 0, 0),
        };
        let attr = ProgLoad {
            prog_type: BPF_PROG_TYPE_CGROUP_DEVICE,
            insn_cnt,
            insns: insns.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level,
            log_size,
            log_buf,
            kern_version: 0,
            prog_flags: 0,
            prog_name: name,
            prog_ifindex: 0,
            expected_attach_type: 0,
        };
        let mut tries = 0;
        loop {
            // SAFETY: every pointer in `attr` (instructions, license, log buffer) is valid for
            // the length given and outlives the call; the kernel writes only into the log.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    BPF_PROG_LOAD,
                    &attr as *const ProgLoad,
                    std::mem::size_of::<ProgLoad>(),
                )
            };
            if fd >= 0 {
                return Ok(fd as i32);
            }
            let err = io::Error::last_os_error();
            tries += 1;
            if err.raw_os_error() != Some(libc::EAGAIN) || tries >= 5 {
                return Err(err);
            }
        }
    };
    let fd = match load(None) {
        Ok(fd) => fd,
        Err(first) => {
            let mut log = vec![0u8; 16 << 10];
            match load(Some(&mut log)) {
                Ok(fd) => fd,
                Err(err) => {
                    let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                    let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
                    return Err(if text.is_empty() {
                        first
                    } else {
                        io::Error::new(err.kind(), format!("{err}: {text}"))
                    });
                }
            }
        }
    };
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Attaches a device program to a cgroup (`BPF_CGROUP_DEVICE`, alongside any the ancestors
/// have).
pub fn bpf_attach_device_program<C: AsFd, P: AsFd>(cgroup: C, prog: P) -> io::Result<()> {
    #[repr(C)]
    struct ProgAttach {
        target_fd: u32,
        attach_bpf_fd: u32,
        attach_type: u32,
        attach_flags: u32,
        replace_bpf_fd: u32,
    }
    const BPF_PROG_ATTACH: libc::c_long = 8;
    const BPF_CGROUP_DEVICE: u32 = 6;
    const BPF_F_ALLOW_MULTI: u32 = 2;
    let attr = ProgAttach {
        target_fd: cgroup.as_fd().as_raw_fd() as u32,
        attach_bpf_fd: prog.as_fd().as_raw_fd() as u32,
        attach_type: BPF_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    // SAFETY: `attr` holds plain integers and outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_ATTACH,
            &attr as *const ProgAttach,
            std::mem::size_of::<ProgAttach>(),
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

/// Opens the terminal peer of a pty master (`TIOCGPTPEER`): the slave side, found through the
/// master rather than by a path another mount namespace might resolve differently.
pub fn pty_peer<F: AsFd>(master: F) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes open flags as an integer and returns a new descriptor, which we
    // own from here on.
    let fd = unsafe { libc::ioctl(master.as_fd().as_raw_fd(), libc::TIOCGPTPEER, flags) };
    check(fd)?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// Unlocks a pty master's peer for opening (`TIOCSPTLCK` 0, what `unlockpt` does).
pub fn unlock_pty<F: AsFd>(master: F) -> io::Result<()> {
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer, which outlives the call.
    check(unsafe {
        libc::ioctl(
            master.as_fd().as_raw_fd(),
            libc::TIOCSPTLCK,
            &unlock as *const libc::c_int,
        )
    })
}

/// Sets a terminal's size (`TIOCSWINSZ` on its master).
pub fn set_window_size<F: AsFd>(fd: F, width: u16, height: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the pointer, which points at a live local.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSWINSZ, &ws) })
}

/// A terminal's size: width, height (`TIOCGWINSZ`).
pub fn window_size<F: AsFd>(fd: F) -> io::Result<(u16, u16)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes a winsize through the pointer, which points at a live local.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCGWINSZ, &mut ws) })?;
    Ok((ws.ws_col, ws.ws_row))
}

/// Makes the terminal on `fd` the caller's controlling terminal (after `setsid`).
pub fn set_controlling_tty<F: AsFd>(fd: F) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument; the descriptor is open and borrowed.
    check(unsafe { libc::ioctl(fd.as_fd().as_raw_fd(), libc::TIOCSCTTY, 0) })
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

/// Gives back the memory a long-lived helper touched only while starting: freed heap pages go
/// back to the kernel, and the pages it mapped from its own executable and libraries (code and
/// read-only data, which are never written) are unmapped from this process, to be faulted in
/// again only if they are needed. Returns the bytes of mappings dropped. Call it just before
/// blocking: every page touched after it counts again (code faults in whole page-cache folios).
///
/// Only mappings that are backed by a file, not writable and hold no private (copied-on-write)
/// page are touched: dropping their pages loses nothing, since they are re-read from the page
/// cache. Call it while single-threaded.
pub fn shed_startup_pages() -> io::Result<u64> {
    trim_heap();
    // Collected on the stack, so that nothing is freed (and no allocator code faulted back in)
    // once the pages are gone.
    let mut ranges = [(0usize, 0usize); 16];
    let mut count = 0;
    {
        let smaps = std::fs::read_to_string("/proc/self/smaps")?;
        let mut current: Option<(usize, usize, bool)> = None;
        let mut keep = |m: Option<(usize, usize, bool)>| {
            if let Some((start, end, true)) = m
                && count < ranges.len()
            {
                ranges[count] = (start, end);
                count += 1;
            }
        };
        for line in smaps.lines() {
            let mut fields = line.split_whitespace();
            let first = fields.next().unwrap_or("");
            if let Some((start, end)) = first.split_once('-')
                && let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                )
            {
                keep(current.take());
                let perms = fields.next().unwrap_or("");
                let path = fields.nth(3).unwrap_or("");
                let eligible = path.starts_with('/')
                    && perms.len() == 4
                    && !perms.contains('w')
                    && perms.ends_with('p');
                current = Some((start, end, eligible));
            } else if let Some(kb) = line.strip_prefix("Anonymous:")
                && kb.trim().trim_end_matches("kB").trim() != "0"
                && let Some(m) = current.as_mut()
            {
                m.2 = false;
            }
        }
        keep(current.take());
    }
    let mut dropped = 0u64;
    for &(start, end) in &ranges[..count] {
        let len = end - start;
        // SAFETY: [start, end) is a whole mapping of this process, read from smaps just now:
        // file-backed, private, not writable and with no anonymous page, so every page in it is
        // an unmodified page-cache page. MADV_DONTNEED only unmaps them (a later access faults
        // the same contents back in). Nothing can write them meanwhile: the mapping is
        // read-only and we are single-threaded.
        check(unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) })?;
        dropped += len as u64;
    }
    Ok(dropped)
}

/// Returns free heap memory to the kernel (glibc keeps it otherwise).
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free memory; nothing in use is touched.
    unsafe { libc::malloc_trim(0) };
}

/// `struct fsxattr` (linux/fs.h): what FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR exchange.
#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

/// _IOR('X', 31, struct fsxattr) and _IOW('X', 32, struct fsxattr).
const FS_IOC_FSGETXATTR: libc::c_ulong = 0x801c_581f;
const FS_IOC_FSSETXATTR: libc::c_ulong = 0x401c_5820;
/// New files and directories below take the directory's project ID.
const FS_XFLAG_PROJINHERIT: u32 = 0x200;

/// Gives the directory `dir` project ID `id`, inherited by everything created below it (the
/// file system counts a project's blocks and inodes when mounted with project quotas).
pub fn set_project<F: AsFd>(dir: F, id: u32) -> io::Result<()> {
    let fd = dir.as_fd().as_raw_fd();
    let mut attr = FsXattr::default();
    // SAFETY: FS_IOC_FSGETXATTR writes one struct fsxattr, which `attr` is (repr(C), the
    // kernel's layout and size, 28 bytes); fd is a valid open descriptor borrowed for the call.
    check(unsafe { libc::ioctl(fd, FS_IOC_FSGETXATTR, &mut attr as *mut FsXattr) })?;
    attr.projid = id;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: as above; FS_IOC_FSSETXATTR only reads the struct.
    check(unsafe { libc::ioctl(fd, FS_IOC_FSSETXATTR, &attr as *const FsXattr) })
}

/// `struct if_dqblk` (linux/quota.h).
#[repr(C)]
#[derive(Default)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

const Q_GETQUOTA: u32 = 0x80_0007;
const PRJQUOTA: u32 = 2;

/// Bytes and inodes charged to project `id` on the file system holding `on` (quotactl_fd,
/// Linux 5.14+); an error when the file system keeps no project quotas.
pub fn project_usage<F: AsFd>(on: F, id: u32) -> io::Result<(u64, u64)> {
    let mut q = IfDqblk::default();
    let cmd = (Q_GETQUOTA << 8) | PRJQUOTA;
    // SAFETY: quotactl_fd with Q_GETQUOTA writes one struct if_dqblk, which `q` is (repr(C),
    // the kernel's layout); the descriptor is valid for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_quotactl_fd,
            on.as_fd().as_raw_fd(),
            cmd,
            id,
            &mut q as *mut IfDqblk,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((q.curspace, q.curinodes))
}

/// The working directory as the kernel reports it (`getcwd(2)` itself, not libc's wrapper, which
/// hides the answer for a directory outside the caller's root): a path starting with `/`, or
/// `(unreachable)...` when the directory cannot be reached from the root.
pub fn getcwd_raw() -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: the kernel writes at most `buf.len()` bytes into `buf`, which outlives the call.
    let n = check_long(unsafe {
        libc::syscall(
            libc::SYS_getcwd,
            buf.as_mut_ptr() as *mut libc::c_char,
            buf.len(),
        )
    })?;
    // The length includes the terminating NUL.
    buf.truncate((n as usize).saturating_sub(1));
    Ok(buf)
}
