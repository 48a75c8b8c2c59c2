//! Container logs in the CRI format kubelet reads:
//! `<RFC3339Nano timestamp> <stdout|stderr> <P|F> <content>\n`, lines longer than 16 KiB split
//! into partial (`P`) pieces. The file is opened beneath the pod's log directory without
//! following symlinks, and reopened on request after kubelet rotates it.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::time::SystemTime;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

/// containerd's limit for one log line; longer lines become partial pieces.
pub const MAX_LINE: usize = 16 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Why a CRI log path cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LogPathError {
    #[error("is empty")]
    Empty,
    #[error("must be relative to the log directory")]
    Absolute,
    #[error("must not contain \"..\"")]
    Parent,
}

/// Checks a CRI log path: relative, no `..`, not empty.
pub fn check_relative(path: &Path) -> Result<(), LogPathError> {
    if path.as_os_str().is_empty() {
        return Err(LogPathError::Empty);
    }
    for c in path.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(LogPathError::Absolute),
            Component::ParentDir => return Err(LogPathError::Parent),
        }
    }
    Ok(())
}

pub struct LogWriter {
    dir: PathBuf,
    rel: PathBuf,
    file: Option<File>,
    pending: [Vec<u8>; 2],
    /// The lines of one `write` or `finish`, written with one call: a line per call made a
    /// container's flood of short lines cost its monitor a system call each.
    out: Vec<u8>,
    /// Their timestamp: the lines of one read arrived together.
    ts: String,
}

/// Opens the log file: a regular file, not on procfs or sysfs, whatever the directory's path
/// went through (a `/dev` node or `/proc/sys/kernel/core_pattern` would take the container's
/// output as writes of the host's). Non-blocking, so a FIFO there fails instead of hanging.
fn open_log(dir: &Path, rel: &Path) -> io::Result<File> {
    let dirfd: OwnedFd = nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let how = OpenHow::new()
        .flags(
            OFlag::O_WRONLY
                | OFlag::O_APPEND
                | OFlag::O_CREAT
                | OFlag::O_CLOEXEC
                | OFlag::O_NOFOLLOW
                | OFlag::O_NONBLOCK,
        )
        .mode(Mode::from_bits_truncate(0o640))
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let file = File::from(openat2(dirfd, rel, how)?);
    let refuse = |what: &str| {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is {what}, not a log file", dir.join(rel).display()),
        )
    };
    if !file.metadata()?.file_type().is_file() {
        return Err(refuse("not a regular file"));
    }
    let fs = nix::sys::statfs::fstatfs(&file)?.filesystem_type();
    if fs == nix::sys::statfs::PROC_SUPER_MAGIC || fs == nix::sys::statfs::SYSFS_MAGIC {
        return Err(refuse("on procfs or sysfs"));
    }
    Ok(file)
}

impl LogWriter {
    pub fn open(dir: &Path, rel: &Path) -> io::Result<LogWriter> {
        check_relative(rel)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("log path {e}")))?;
        let file = open_log(dir, rel)?;
        Ok(LogWriter {
            dir: dir.to_path_buf(),
            rel: rel.to_path_buf(),
            file: Some(file),
            pending: [Vec::new(), Vec::new()],
            out: Vec::new(),
            ts: String::new(),
        })
    }

    /// Opens the log path again (kubelet renamed the old file away).
    pub fn reopen(&mut self) -> io::Result<()> {
        self.file = Some(open_log(&self.dir, &self.rel)?);
        Ok(())
    }

    fn slot(stream: Stream) -> usize {
        match stream {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }

    /// Adds output; whole lines are written at once, the rest waits for its newline.
    pub fn write(&mut self, stream: Stream, data: &[u8]) -> io::Result<()> {
        self.stamp();
        self.split_lines(stream, data);
        self.flush_out()
    }

    /// The lines of `data` into `out`; the rest waits in `pending` for its newline.
    fn split_lines(&mut self, stream: Stream, mut data: &[u8]) {
        let slot = Self::slot(stream);
        while !data.is_empty() {
            match data.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    let mut line = std::mem::take(&mut self.pending[slot]);
                    line.extend_from_slice(&data[..i]);
                    self.emit_split(stream, &line, true);
                    data = &data[i + 1..];
                }
                None => {
                    self.pending[slot].extend_from_slice(data);
                    if self.pending[slot].len() >= MAX_LINE {
                        let buf = std::mem::take(&mut self.pending[slot]);
                        let cut = buf.len() - buf.len() % MAX_LINE;
                        self.emit_split(stream, &buf[..cut], false);
                        self.pending[slot] = buf[cut..].to_vec();
                    }
                    break;
                }
            }
        }
    }

    /// Writes what is left of a stream that ended, as a partial line: it had no newline, and
    /// readers (kubelet's, whose termination message from the log is the output exactly) add
    /// one to full lines only. containerd and CRI-O's conmon do the same.
    pub fn finish(&mut self, stream: Stream) -> io::Result<()> {
        let slot = Self::slot(stream);
        let rest = std::mem::take(&mut self.pending[slot]);
        if !rest.is_empty() {
            self.stamp();
            self.emit_split(stream, &rest, false);
        }
        self.flush_out()
    }

    /// Adds `content` as lines of at most MAX_LINE bytes; all but a complete line's last piece
    /// are partial.
    fn emit_split(&mut self, stream: Stream, content: &[u8], complete: bool) {
        let mut chunks = content.chunks(MAX_LINE).peekable();
        if chunks.peek().is_none() {
            return self.emit(stream, b"", complete);
        }
        while let Some(chunk) = chunks.next() {
            let last = chunks.peek().is_none();
            self.emit(stream, chunk, complete && last);
        }
    }

    /// The time the lines added next arrived.
    fn stamp(&mut self) {
        self.ts = humantime::format_rfc3339_nanos(SystemTime::now()).to_string();
    }

    /// Adds one line; no allocation of its own (a flood adds tens of thousands per read).
    fn emit(&mut self, stream: Stream, content: &[u8], full: bool) {
        let tag: &[u8] = if full { b" F " } else { b" P " };
        self.out.extend_from_slice(self.ts.as_bytes());
        self.out.push(b' ');
        self.out.extend_from_slice(stream.name().as_bytes());
        self.out.extend_from_slice(tag);
        self.out.extend_from_slice(content);
        self.out.push(b'\n');
    }

    /// Writes the lines gathered, with one call; without a file (its reopen failed) they go.
    fn flush_out(&mut self) -> io::Result<()> {
        let written = match self.file.as_mut() {
            Some(f) if !self.out.is_empty() => f.write_all(&self.out),
            _ => Ok(()),
        };
        // The buffer is kept for the next lines, empty, unless a flood of short lines grew it.
        self.out.clear();
        self.out.shrink_to(256 << 10);
        written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(path: &Path) -> Vec<(String, String, String)> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let mut p = l.splitn(4, ' ');
                let ts = p.next().unwrap();
                assert!(humantime::parse_rfc3339(ts).is_ok(), "timestamp {ts}");
                (
                    p.next().unwrap().into(),
                    p.next().unwrap().into(),
                    p.next().unwrap_or("").into(),
                )
            })
            .collect()
    }

    #[test]
    fn only_a_regular_file_off_procfs_and_sysfs_is_a_log() {
        // A device node, a procfs file, a FIFO (no reader: refused, not waited on).
        assert!(LogWriter::open(Path::new("/dev"), Path::new("null")).is_err());
        assert!(LogWriter::open(Path::new("/proc/self"), Path::new("comm")).is_err());
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("fifo.log"),
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(LogWriter::open(dir.path(), Path::new("fifo.log")).is_err());
        assert!(LogWriter::open(dir.path(), Path::new("0.log")).is_ok());
    }

    #[test]
    fn cri_format_full_partial_and_streams() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LogWriter::open(dir.path(), Path::new("0.log")).unwrap();
        w.write(Stream::Stdout, b"hello\nwor").unwrap();
        w.write(Stream::Stderr, b"oops\n").unwrap();
        w.write(Stream::Stdout, b"ld\n\n").unwrap();
        let long = vec![b'x'; MAX_LINE + 10];
        w.write(Stream::Stdout, &long).unwrap();
        w.write(Stream::Stdout, b"\ntail").unwrap();
        w.finish(Stream::Stdout).unwrap();
        let got = lines(&dir.path().join("0.log"));
        let want: Vec<(&str, &str, String)> = vec![
            ("stdout", "F", "hello".into()),
            ("stderr", "F", "oops".into()),
            ("stdout", "F", "world".into()),
            ("stdout", "F", "".into()),
            ("stdout", "P", "x".repeat(MAX_LINE)),
            ("stdout", "F", "x".repeat(10)),
            ("stdout", "P", "tail".into()),
        ];
        let got: Vec<(&str, &str, String)> = got
            .iter()
            .map(|(a, b, c)| (a.as_str(), b.as_str(), c.clone()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn paths_are_confined() {
        let dir = tempfile::tempdir().unwrap();
        assert!(LogWriter::open(dir.path(), Path::new("../x.log")).is_err());
        assert!(LogWriter::open(dir.path(), Path::new("/etc/x.log")).is_err());
        std::os::unix::fs::symlink("/tmp", dir.path().join("link")).unwrap();
        assert!(LogWriter::open(dir.path(), Path::new("link/x.log")).is_err());
        std::os::unix::fs::symlink("/tmp/target.log", dir.path().join("s.log")).unwrap();
        assert!(LogWriter::open(dir.path(), Path::new("s.log")).is_err());
    }

    #[test]
    fn reopen_after_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = LogWriter::open(dir.path(), Path::new("0.log")).unwrap();
        w.write(Stream::Stdout, b"one\n").unwrap();
        std::fs::rename(dir.path().join("0.log"), dir.path().join("0.log.1")).unwrap();
        w.reopen().unwrap();
        w.write(Stream::Stdout, b"two\n").unwrap();
        assert_eq!(lines(&dir.path().join("0.log.1"))[0].2, "one");
        assert_eq!(lines(&dir.path().join("0.log"))[0].2, "two");
    }
}
