//! The runtime's own handle on procfs, for every write it makes there on a container's behalf
//! (`oom_score_adj`, the LSM label of the next exec, sysctls) and the reads that go with them.
//! It is the host's `/proc`, opened by the monitor before anything of a container's exists and
//! checked to be the root of a procfs; each file is opened beneath it without leaving the mount
//! and without magic links, and checked to be on procfs again. So a container that mounts or
//! links something over its own `/proc` (CVE-2025-52881, CVE-2019-16884, CVE-2023-28642)
//! receives none of these writes: they reach the kernel, in the caller's own namespaces
//! (`/proc/sys/net` is the caller's network namespace's, `thread-self` the caller itself).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

/// `PROC_SUPER_MAGIC`.
const PROC_MAGIC: i64 = 0x9fa0;
/// The inode of a procfs root (only the root has it).
const PROC_ROOT_INO: u64 = 1;

fn not_procfs(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{what} is not on procfs"),
    )
}

/// Whether `fd` is on a procfs.
pub fn on_procfs<F: AsFd>(fd: F) -> io::Result<bool> {
    let st = nix::sys::statfs::fstatfs(fd)?;
    Ok(st.filesystem_type().0 as i64 == PROC_MAGIC)
}

/// A checked handle on a procfs root; see the module.
pub struct ProcFs(OwnedFd);

impl ProcFs {
    /// The host's `/proc`, checked to be a procfs root.
    pub fn open() -> io::Result<ProcFs> {
        let fd: OwnedFd = nix::fcntl::open(
            "/proc",
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let st = nix::sys::stat::fstat(fd.as_fd())?;
        if !on_procfs(&fd)? || st.st_ino != PROC_ROOT_INO {
            return Err(not_procfs("/proc"));
        }
        Ok(ProcFs(fd))
    }

    /// A handle of the same root, for a child that is given one.
    pub fn borrow(&self) -> ProcRef<'_> {
        ProcRef(self.0.as_fd())
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// A borrowed [`ProcFs`]: what a forked child works with.
#[derive(Clone, Copy)]
pub struct ProcRef<'a>(BorrowedFd<'a>);

impl ProcRef<'_> {
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Opens `rel` (`thread-self/attr/exec`, `sys/net/ipv4/ip_forward`) beneath the root:
    /// ordinary symlinks of procfs itself (`self`, `thread-self`) are followed, nothing that
    /// leaves the mount or jumps through a magic link is; the file must be on procfs.
    fn open(&self, rel: &str, flags: OFlag) -> io::Result<std::fs::File> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
            .resolve(
                ResolveFlag::RESOLVE_BENEATH
                    | ResolveFlag::RESOLVE_NO_MAGICLINKS
                    | ResolveFlag::RESOLVE_NO_XDEV,
            );
        let fd = openat2(self.0, rel, how)?;
        if !on_procfs(&fd)? {
            return Err(not_procfs(rel));
        }
        Ok(std::fs::File::from(fd))
    }

    /// Writes `value` to a procfs file in one write, as the kernel expects of them.
    pub fn write(&self, rel: &str, value: &[u8]) -> io::Result<()> {
        self.open(rel, OFlag::O_WRONLY)?.write_all(value)
    }

    pub fn read(&self, rel: &str) -> io::Result<String> {
        let mut s = String::new();
        self.open(rel, OFlag::O_RDONLY)?.read_to_string(&mut s)?;
        Ok(s)
    }

    /// Where the descriptor `fd` of the calling process leads (`readlink /proc/self/fd/N`).
    pub fn fd_target(&self, fd: RawFd) -> io::Result<std::path::PathBuf> {
        let link = nix::fcntl::readlinkat(self.0, format!("thread-self/fd/{fd}").as_str())?;
        Ok(std::path::PathBuf::from(link))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_reads_stay_on_procfs() {
        let proc = ProcFs::open().unwrap();
        let p = proc.borrow();
        let own = p.read("self/oom_score_adj").unwrap();
        assert!(own.trim().parse::<i32>().is_ok(), "{own}");
        assert!(p.read("self/status").unwrap().contains("Pid:"));
        // A magic link (the root of the process) and a climb out are refused.
        assert!(p.read("self/root/etc/hostname").is_err());
        assert!(p.read("../etc/hostname").is_err());
        let f = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(
            p.fd_target(f.as_raw_fd()).unwrap(),
            std::path::Path::new("/dev/null")
        );
    }
}
