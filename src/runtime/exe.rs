//! The executable the helpers (`crius monitor`, `crius pause`) run from: never the host's file
//! itself. Every process crius starts in a container runs crius until it execs, and a process
//! of the container may open that executable through `/proc/PID/exe` (CVE-2019-5736); a write
//! to the host's binary would then run on the host. So the daemon, once at start, makes a copy
//! that nothing can write, and spawns helpers from it: a read-only overlay whose only layers
//! are the binary's own directory and an empty one (no copy at all, and no upper layer a write
//! could go to; runc does the same), or, where overlay cannot be made, a sealed memfd copy
//! (write, grow and shrink sealed). Either way `/proc/PID/exe` of a helper and of anything it
//! forks leads there, and the host's file is out of reach.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nix::fcntl::{FcntlArg, OFlag, SealFlag, fcntl, openat};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::stat::Mode;

use crate::sys;

/// The sealed executable, once made.
static SEALED: OnceLock<(OwnedFd, Sealing)> = OnceLock::new();

/// How the helpers' executable is kept from being written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealing {
    /// A read-only overlay of the binary's directory: no copy.
    Overlay,
    /// A sealed in-memory copy (costs the binary's size in memory).
    Memfd,
}

/// Makes the sealed executable (once; `scratch` is a directory of the runtime's own where the
/// overlay's empty layer is made). Helpers spawned before this run from `/proc/self/exe`.
pub fn seal(scratch: &Path) -> io::Result<Sealing> {
    if let Some((_, how)) = SEALED.get() {
        return Ok(*how);
    }
    let made = match overlay(scratch) {
        Ok(fd) => (fd, Sealing::Overlay),
        Err(e) => {
            tracing::debug!("read-only overlay of the binary: {e}; sealing a memfd copy");
            (memfd()?, Sealing::Memfd)
        }
    };
    let how = made.1;
    let _ = SEALED.set(made);
    Ok(how)
}

/// How the helpers' executable is sealed, if it is.
pub fn sealing() -> Option<Sealing> {
    SEALED.get().map(|(_, how)| *how)
}

/// The path helpers are spawned with: the sealed executable through the spawner's own
/// descriptor table, else this executable.
pub fn helper() -> PathBuf {
    match SEALED.get() {
        Some((fd, _)) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        None => PathBuf::from(super::SELF_EXE),
    }
}

/// `:` and `\` escaped for an overlay `lowerdir` list.
fn escape_lower(path: &Path) -> String {
    path.display()
        .to_string()
        .replace('\\', "\\\\")
        .replace(':', "\\:")
}

/// The binary as seen through a read-only overlay of its directory.
fn overlay(scratch: &Path) -> io::Result<OwnedFd> {
    let exe = std::fs::read_link(super::SELF_EXE)?;
    let (Some(dir), Some(name)) = (exe.parent(), exe.file_name()) else {
        return Err(io::Error::other(format!("{}: no directory", exe.display())));
    };
    let own = std::fs::metadata(super::SELF_EXE)?;
    // Overlay needs two layers to run without an upper one; the second is empty.
    let empty = scratch.join("exe-empty");
    std::fs::create_dir_all(&empty)?;
    let lower = format!("{}:{}", escape_lower(dir), escape_lower(&empty));
    let mnt = sys::new_mount(
        "overlay",
        &[("lowerdir", lower.as_str())],
        sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NODEV | sys::MOUNT_ATTR_NOSUID,
    )?;
    let fd = openat(
        mnt.as_fd(),
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    // The name in the directory may have been replaced since this process started.
    let seen = nix::sys::stat::fstat(fd.as_fd())?;
    use std::os::unix::fs::MetadataExt;
    if seen.st_size as u64 != own.len() || seen.st_mtime != own.mtime() {
        return Err(io::Error::other(format!(
            "{} is no longer the running binary",
            exe.display()
        )));
    }
    Ok(fd)
}

/// A sealed in-memory copy of the binary.
fn memfd() -> io::Result<OwnedFd> {
    // MFD_EXEC (Linux 6.3) keeps it executable where memfds are made non-executable by default.
    const MFD_EXEC: u32 = 0x10;
    const F_SEAL_EXEC: i32 = 0x20;
    let base = MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING;
    let fd = memfd_create(c"crius", base | MFdFlags::from_bits_retain(MFD_EXEC))
        .or_else(|_| memfd_create(c"crius", base))?;
    let mut src = std::fs::File::open(super::SELF_EXE)?;
    let mut dst = std::fs::File::from(fd);
    io::copy(&mut src, &mut dst)?;
    let fd = OwnedFd::from(dst);
    nix::sys::stat::fchmod(fd.as_fd(), Mode::from_bits_truncate(0o555))?;
    // Its mode may not change either, where the kernel knows that seal.
    let _ = fcntl(
        fd.as_fd(),
        FcntlArg::F_ADD_SEALS(SealFlag::from_bits_retain(F_SEAL_EXEC)),
    );
    fcntl(
        fd.as_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SEAL
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE,
        ),
    )?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_copy_runs_and_cannot_be_written() {
        let fd = memfd().unwrap();
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        assert!(
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|mut f| io::Write::write_all(&mut f, b"x"))
                .is_err(),
            "written"
        );
        // It is this test binary: it runs (and lists its tests).
        let out = std::process::Command::new(&path)
            .arg("--list")
            .output()
            .unwrap();
        assert!(out.status.success());
        assert!(String::from_utf8_lossy(&out.stdout).contains("a_sealed_copy_runs"));
    }

    #[test]
    fn lower_dirs_are_escaped() {
        assert_eq!(escape_lower(Path::new("/a:b\\c")), "/a\\:b\\\\c");
    }
}
