//! Reading a directory tree that a running container may be changing (its writable layer) from
//! the host's side: by descriptor, entry by entry, never following a link, never opening a
//! device or waiting on a FIFO, never leaving the tree's filesystem. A name swapped for a link
//! to a host file between two steps changes nothing: each entry is opened once with
//! `O_PATH | O_NOFOLLOW`, everything about it is read from that handle, and a regular file's
//! content is read through the same handle reopened (`/proc/thread-self/fd/N`), never by name.

use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;

/// An open directory of the tree.
pub struct Dir {
    fd: OwnedFd,
    dev: u64,
}

/// One entry of a directory, open as `O_PATH` and not followed.
pub struct Entry {
    fd: OwnedFd,
    pub meta: Metadata,
}

fn open_dir_at<F: AsFd>(at: F, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    Ok(openat(
        at,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

impl Dir {
    /// The top of a tree (itself not a link).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let fd = open_dir_at(nix::fcntl::AT_FDCWD, path.as_os_str())?;
        let dev = File::from(fd.try_clone()?).metadata()?.dev();
        Ok(Dir { fd, dev })
    }

    /// The names in the directory, sorted, without `.` and `..`.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        let dup = self.fd.try_clone()?;
        let mut dir = nix::dir::Dir::from_fd(dup)?;
        let mut out = Vec::new();
        for e in dir.iter() {
            let e = e?;
            let name = e.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(
                    <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(name)
                        .to_os_string(),
                );
            }
        }
        out.sort();
        Ok(out)
    }

    /// The entry `name`; none when it is gone or on another filesystem (a mount).
    pub fn entry(&self, name: &std::ffi::OsStr) -> io::Result<Option<Entry>> {
        let fd = match openat(
            self.fd.as_fd(),
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let meta = File::from(fd.try_clone()?).metadata()?;
        if meta.dev() != self.dev {
            return Ok(None);
        }
        Ok(Some(Entry { fd, meta }))
    }

    /// The descriptor, for calls on the directory itself (its extended attributes).
    pub fn file(&self) -> io::Result<File> {
        Ok(File::from(self.fd.try_clone()?))
    }
}

impl Entry {
    /// The directory this entry is, opened from its own handle.
    pub fn open_dir(&self) -> io::Result<Dir> {
        let fd = open_dir_at(self.fd.as_fd(), std::ffi::OsStr::new("."))?;
        Ok(Dir {
            fd,
            dev: self.meta.dev(),
        })
    }

    /// The content of the regular file this entry is: its handle reopened for reading.
    pub fn open_file(&self) -> io::Result<File> {
        if !self.meta.file_type().is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let fd: OwnedFd = nix::fcntl::open(
            format!("/proc/thread-self/fd/{}", self.fd.as_raw_fd()).as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// Where the symlink this entry is points.
    pub fn link_target(&self) -> io::Result<PathBuf> {
        Ok(PathBuf::from(nix::fcntl::readlinkat(self.fd.as_fd(), "")?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_read_without_following_links() {
        let d = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"host").unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::write(d.path().join("sub/f"), b"data").unwrap();
        std::os::unix::fs::symlink(outside.path(), d.path().join("dirlink")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), d.path().join("filelink"))
            .unwrap();
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let top = Dir::open(d.path()).unwrap();
        assert_eq!(
            top.names().unwrap(),
            ["dirlink", "fifo", "filelink", "sub"].map(OsString::from)
        );
        let link = top.entry("dirlink".as_ref()).unwrap().unwrap();
        assert!(link.meta.file_type().is_symlink());
        assert!(link.open_dir().is_err(), "a link is not walked");
        assert_eq!(link.link_target().unwrap(), outside.path());
        let flink = top.entry("filelink".as_ref()).unwrap().unwrap();
        assert!(flink.open_file().is_err(), "a link is not read");
        let fifo = top.entry("fifo".as_ref()).unwrap().unwrap();
        assert!(fifo.open_file().is_err(), "a FIFO is not opened");
        let sub = top
            .entry("sub".as_ref())
            .unwrap()
            .unwrap()
            .open_dir()
            .unwrap();
        let f = sub.entry("f".as_ref()).unwrap().unwrap();
        let mut data = Vec::new();
        io::Read::read_to_end(&mut f.open_file().unwrap(), &mut data).unwrap();
        assert_eq!(data, b"data");
        assert!(top.entry("gone".as_ref()).unwrap().is_none());
    }
}
