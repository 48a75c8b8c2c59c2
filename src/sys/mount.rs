//! Mount calls of the new mount API `nix` lacks: detached trees (`open_tree`), their
//! attributes (`mount_setattr`), new filesystem instances (`fsopen`, `fsconfig`, `fsmount`) and
//! attaching them (`move_mount`), all by descriptor, so a path a container can change is never
//! walked again once it is open.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use super::{c_path, check_long};
/// Mount attributes for [`mount_setattr`] (linux/mount.h).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const AT_RECURSIVE: libc::c_int = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached copy of the mount at `path` (`open_tree(OPEN_TREE_CLONE)`), with the mounts below
/// it when `recursive`; close-on-exec.
pub fn open_tree_clone(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let cpath = c_path(path)?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: `cpath` outlives the call; a non-negative result is a new descriptor we own.
    let fd = check_long(unsafe {
        libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, cpath.as_ptr(), flags)
    })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sets mount attributes on the mount `mount` refers to (and the mounts below it when
/// `recursive`); with `userns` the mount becomes an idmapped mount, which only a detached mount
/// that was never attached may become.
pub fn mount_setattr<F: AsFd>(
    mount: F,
    set: u64,
    userns: Option<std::os::fd::BorrowedFd<'_>>,
    recursive: bool,
) -> io::Result<()> {
    let mut attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    if let Some(ns) = userns {
        attr.attr_set |= MOUNT_ATTR_IDMAP;
        attr.userns_fd = ns.as_raw_fd() as u64;
    }
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: an empty C string and `attr` outlive the call; the size is the struct's own.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}

/// Attaches the detached mount `mount` on the file or directory `target` is open on
/// (`move_mount(2)`).
pub fn move_mount<F: AsFd, T: AsFd>(mount: F, target: T) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: the empty C strings outlive the call; the descriptors are borrowed for its length.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            target.as_fd().as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
    .map(drop)
}

/// Whether the kernel has `mount_setattr(2)` (5.12 and later).
pub fn has_mount_setattr() -> bool {
    // SAFETY: invalid arguments on purpose: only ENOSYS versus any other error matters, and a
    // null path with a bad descriptor cannot touch anything.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1,
            std::ptr::null::<libc::c_char>(),
            0,
            std::ptr::null::<u8>(),
            0,
        )
    };
    !(ret < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS))
}

const OPEN_TREE_CLONE: libc::c_uint = 1;

/// A detached copy of the mount at an open handle (`open_tree(OPEN_TREE_CLONE | AT_EMPTY_PATH)`),
/// with the mounts below it when `recursive`; the handle's mount must be in the caller's mount
/// namespace.
pub fn open_tree_at<F: AsFd>(at: F, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: the empty C string outlives the call and the descriptor is borrowed for it; a
    // non-negative result is a new descriptor we own.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            at.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A new, detached instance of the filesystem `fstype` (`fsopen`, `fsconfig` with each
/// `key=value`, `fsmount` with the `MOUNT_ATTR_*` in `attrs`), for [`move_mount`].
pub fn new_mount(fstype: &str, options: &[(&str, &str)], attrs: u64) -> io::Result<OwnedFd> {
    const FSOPEN_CLOEXEC: libc::c_uint = 1;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
    const FSMOUNT_CLOEXEC: libc::c_uint = 1;
    let cstr = |s: &str| {
        CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in option"))
    };
    let name = cstr(fstype)?;
    // SAFETY: `name` outlives the call; a non-negative result is a new descriptor we own.
    let ctx =
        check_long(unsafe { libc::syscall(libc::SYS_fsopen, name.as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    let ctx = unsafe { OwnedFd::from_raw_fd(ctx as i32) };
    for (key, value) in options {
        let (k, v) = (cstr(key)?, cstr(value)?);
        // SAFETY: `k` and `v` outlive the call; the context descriptor is ours.
        check_long(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                ctx.as_raw_fd(),
                FSCONFIG_SET_STRING,
                k.as_ptr(),
                v.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: no pointers; the context descriptor is ours.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    // SAFETY: no pointers; a non-negative result is a new descriptor we own.
    let fd = check_long(unsafe {
        libc::syscall(libc::SYS_fsmount, ctx.as_raw_fd(), FSMOUNT_CLOEXEC, attrs)
    })?;
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Sets the propagation (`MS_SHARED`, `MS_SLAVE`, `MS_PRIVATE` or `MS_UNBINDABLE`) of the mount
/// `mount` refers to, and of the mounts below it when `recursive`; a detached tree takes it
/// before it is attached.
pub fn mount_set_propagation<F: AsFd>(
    mount: F,
    propagation: u64,
    recursive: bool,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: 0,
        attr_clr: 0,
        propagation,
        userns_fd: 0,
    };
    let mut flags = libc::AT_EMPTY_PATH;
    if recursive {
        flags |= AT_RECURSIVE;
    }
    // SAFETY: an empty C string and `attr` outlive the call; the size is the struct's own.
    check_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            mount.as_fd().as_raw_fd(),
            c"".as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
    .map(drop)
}
