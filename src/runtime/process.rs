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

/// The answer of a process that is gone: its /proc entry missing, or ESRCH.
fn no_such_process(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ESRCH)
}

/// The kernel's flag for a process that has begun to exit (`PF_EXITING`).
const PF_EXITING: u64 = 0x4;

/// State letter, flags and start time of a process, from `/proc/<pid>/stat`.
fn stat(pid: i32) -> io::Result<(char, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces and parentheses: fields resume after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first().and_then(|s| s.chars().next()).unwrap_or('?');
    let flags = fields.get(6).and_then(|s| s.parse().ok()).unwrap_or(0);
    let start = fields
        .get(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    Ok((state, flags, start))
}

impl ProcessId {
    /// The identity of a running process.
    pub fn of(pid: i32) -> io::Result<ProcessId> {
        let (_, _, start_time) = stat(pid)?;
        Ok(ProcessId { pid, start_time })
    }

    /// Whether this very process still runs (a zombie does not).
    pub fn alive(&self) -> bool {
        matches!(stat(self.pid), Ok((state, _, start)) if start == self.start_time && state != 'Z')
    }

    /// Whether this process has begun to exit (it lets go of its namespaces before it is a
    /// zombie) or has ended.
    pub fn exiting(&self) -> bool {
        match stat(self.pid) {
            Ok((state, flags, start)) => {
                start != self.start_time || state == 'Z' || flags & PF_EXITING != 0
            }
            Err(e) => no_such_process(&e),
        }
    }

    /// Whether this process has certainly ended: its /proc entry is gone, belongs to another
    /// process, or shows a zombie. A /proc that cannot be read (out of descriptors) says
    /// nothing, unlike `alive`'s false.
    pub fn ended(&self) -> bool {
        match stat(self.pid) {
            Ok((state, _, start)) => start != self.start_time || state == 'Z',
            Err(e) => no_such_process(&e),
        }
    }

    /// A pidfd for this process, checked to be the same process after opening.
    pub fn pidfd(&self) -> io::Result<OwnedFd> {
        let fd = sys::pidfd_open(self.pid)?;
        let gone = || io::Error::from_raw_os_error(libc::ESRCH);
        match stat(self.pid) {
            Ok((_, _, start)) if start == self.start_time => Ok(fd),
            Ok(_) => Err(gone()),
            Err(e) if no_such_process(&e) => Err(gone()),
            // Out of descriptors, say: unknown, not gone.
            Err(e) => Err(e),
        }
    }

    /// Sends `signal` if the process is still this one; a gone process is not an error.
    pub fn signal(&self, signal: i32) -> io::Result<()> {
        match self.pidfd() {
            Ok(fd) => match sys::pidfd_send_signal(&fd, signal) {
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
                r => r,
            },
            Err(e) if no_such_process(&e) => Ok(()),
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

/// In a child the monitor just forked: the kernel kills it if the monitor ends before the
/// child execs (`outlive_monitor` lifts that). `monitor` is a pidfd of the monitor, opened
/// before the fork: readable means it is already gone, and the child ends now. A half-made
/// container or exec'd command never lingers after its monitor, whatever step it waits in.
pub fn die_with_monitor(monitor: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
    let mut fds = [PollFd::new(monitor, PollFlags::POLLIN)];
    if poll(&mut fds, PollTimeout::ZERO)? > 0 {
        sys::exit_now(137);
    }
    Ok(())
}

/// Just before the process settings (and so before any seccomp filter): a started container
/// or command outlives its monitor as it always has; the daemon finds it through its record.
pub fn outlive_monitor() -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(None)?;
    Ok(())
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
        assert!(!me.exiting());
        assert!(
            stranger.exiting(),
            "another process under that pid: this one ended"
        );
        assert!(stranger.pidfd().is_err());
        assert!(ProcessId::of(i32::MAX).is_err());
    }

    /// Runs one of the helpers below in a fresh copy of this test binary (one test thread, so
    /// the fork there happens in a process doing nothing else); returns the forked child's pid.
    fn helper_child(mode: &str) -> i32 {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "runtime::process::tests::forking_helper",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env("CRIUS_TEST_FORK", mode)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let pid = text
            .lines()
            .find_map(|l| l.split_once("child ").map(|(_, p)| p))
            .unwrap_or_else(|| panic!("no child pid from the helper: {text}"));
        pid.trim().parse().unwrap()
    }

    /// Whether `pid` ends (or is a zombie) within 10 s.
    fn ends(pid: i32) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            match stat(pid) {
                Err(_) => return true,
                Ok(('Z', _, _)) => return true,
                Ok(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        false
    }

    /// Not a test on its own (it returns at once): the body `helper_child` runs. The child
    /// watches this process as a monitor's child watches its monitor, then waits forever;
    /// this process ends, with (`armed`) or without (`late`) the child's watch in place first.
    /// `sys::fork` wants a single-threaded caller: here the only other thread is libtest's
    /// main thread, waiting on a channel, so the child inherits no lock held elsewhere. The
    /// signal is tied to this (forking) thread, which ends right after the test body, as a
    /// monitor's only thread ends with the monitor.
    #[test]
    fn forking_helper() {
        let Ok(mode) = std::env::var("CRIUS_TEST_FORK") else {
            return;
        };
        let me = sys::pidfd_open(std::process::id() as i32).unwrap();
        let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
        match sys::fork().unwrap() {
            nix::unistd::ForkResult::Child => {
                drop(ready_r);
                // The test reads the helper's output to its end: not through us.
                if let Ok(null) = std::fs::File::open("/dev/null") {
                    let _ = sys::dup_to(&null, 1, false);
                    let _ = sys::dup_to(&null, 2, false);
                }
                if mode == "late" {
                    // Waits for this process to end first: the watch must see it already gone.
                    let mut fds = [nix::poll::PollFd::new(
                        std::os::fd::AsFd::as_fd(&me),
                        nix::poll::PollFlags::POLLIN,
                    )];
                    let _ = nix::poll::poll(&mut fds, nix::poll::PollTimeout::NONE);
                }
                let _ = die_with_monitor(std::os::fd::AsFd::as_fd(&me));
                let _ = nix::unistd::write(&ready_w, b"1");
                loop {
                    nix::unistd::pause();
                }
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(ready_w);
                if mode == "armed" {
                    let mut b = [0u8; 1];
                    let _ = nix::unistd::read(&ready_r, &mut b);
                }
                println!("child {child}");
            }
        }
    }

    #[test]
    fn a_child_ends_with_its_monitor_until_it_execs() {
        for mode in ["armed", "late"] {
            let child = helper_child(mode);
            if !ends(child) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child),
                    nix::sys::signal::Signal::SIGKILL,
                );
                panic!("{mode}: child {child} outlived its parent");
            }
        }
    }
}
