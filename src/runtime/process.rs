//! Process identities that survive pid reuse: a pid plus its start time (field 22 of
//! `/proc/<pid>/stat`, clock ticks since boot). A recorded identity matches a live process only
//! if both agree, so a daemon restarted long after a process died never signals a stranger.

use std::io;
use std::os::fd::OwnedFd;

use serde::{Deserialize, Serialize};

use crate::sys;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: i32,
    pub start_time: u64,
}

/// State letter and start time of a process, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
    let start = fields
        .get(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    Ok((state, start))
}

impl ProcessId {
    /// The identity of a running process.
    pub fn of(pid: i32) -> io::Result<ProcessId> {
        let (_, start_time) = stat(pid)?;
        Ok(ProcessId { pid, start_time })
    }

    /// Whether this very process still runs (a zombie does not).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Ok((state, start)) if start == self.start_time && state != 'Z')
    }

    /// A pidfd for this process, checked to be the same process after opening.
    pub fn pidfd(&self) -> io::Result<OwnedFd> {
        let fd = sys::pidfd_open(self.pid)?;
        match stat(self.pid) {
            Ok((_, start)) if start == self.start_time => Ok(fd),
            _ => Err(io::Error::from_raw_os_error(libc::ESRCH)),
        }
    }

    /// Sends `signal` if the process is still this one; a gone process is not an error.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        match self.pidfd() {
            Ok(fd) => match sys::pidfd_send_signal(&fd, signal) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
                r => r,
            },
            Err(e)
                if e.raw_os_error() == Some(libc::ESRCH) || e.kind() == io::ErrorKind::NotFound =>
            {
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The inode of one of its namespaces (`mnt`, `pid`, ...), to find the processes sharing it.
    pub fn namespace(&self, kind: &str) -> io::Result<u64> {
        use std::os::unix::fs::MetadataExt;
        Ok(std::fs::metadata(format!("/proc/{}/ns/{kind}", self.pid))?.ino())
    }
}

/// Every live pid whose `kind` namespace is the inode `ns` (the processes of one container).
pub fn pids_in_namespace(kind: &str, ns: u64) -> Vec<i32> {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
        .filter(|pid| {
            std::fs::metadata(format!("/proc/{pid}/ns/{kind}")).is_ok_and(|m| m.ino() == ns)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity() {
        let me = ProcessId::of(std::process::id() as i32).unwrap();
        assert!(me.alive());
        let stranger = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!stranger.alive());
        assert!(stranger.pidfd().is_err());
        assert!(ProcessId::of(i32::MAX).is_err());
    }
}
