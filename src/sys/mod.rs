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
