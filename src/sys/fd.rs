//! Descriptor-table calls for a child between fork and exec: closing all but a few, and laying
//! descriptors out at fixed numbers.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use super::check;

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

/// Puts each descriptor at its target number (inherited across exec), for a program about to be
/// exec'd with descriptors at fixed numbers. Each goes far above the targets first, so placing
/// one never closes another still to be placed.
pub fn place_fds(fds: &[(BorrowedFd<'_>, i32)], scratch: i32) -> io::Result<()> {
    for (i, (fd, _)) in fds.iter().enumerate() {
        dup_to(fd, scratch + i as i32, true)?;
    }
    for (i, (_, target)) in fds.iter().enumerate() {
        // SAFETY: as in `dup_to`: the scratch descriptor was just made open above, and the
        // caller gives up whatever `target` referred to.
        check(unsafe { libc::dup3(scratch + i as i32, *target, 0) })?;
    }
    Ok(())
}

/// Closes every descriptor from 3 up except those in `keep`: between fork and exec, before the
/// child does anything in a container's context, so nothing of its parent's can be reached
/// through `/proc/self/fd` (a working directory on one, say). The caller must hold no owned
/// descriptor outside `keep` that it will close later: its number may be reused by then.
pub fn close_all_except(keep: &[RawFd]) -> io::Result<()> {
    let mut kept: Vec<u32> = keep
        .iter()
        .filter(|&&f| f >= 3)
        .map(|&f| f as u32)
        .collect();
    kept.sort_unstable();
    kept.dedup();
    let mut from = 3u32;
    for k in kept {
        if k > from {
            // SAFETY: close_range only closes descriptors; the caller owns everything between
            // the kept ones (see the contract above).
            check(unsafe { libc::close_range(from, k - 1, 0) })?;
        }
        from = k + 1;
    }
    // SAFETY: as above, for everything past the last kept descriptor.
    check(unsafe { libc::close_range(from, u32::MAX, 0) })
}

/// Has the program `cmd` runs find `fd` at descriptor number `target` (NRI's launched plugins
/// find their socket at 3). The caller keeps `fd` open until the spawn has returned.
pub fn inherit_at(cmd: &mut tokio::process::Command, fd: BorrowedFd<'_>, target: RawFd) {
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the child between fork and exec and calls only dup3 and
    // fcntl (through `dup_to`), which are async-signal-safe and allocate nothing; `raw` is open
    // in the parent, so in the child, until the spawn returns (the caller's contract).
    unsafe {
        cmd.pre_exec(move || dup_to(BorrowedFd::borrow_raw(raw), target, false));
    }
}
