//! Whether the container's init was ended by the OOM killer: its cgroup's `oom_kill` count in
//! memory.events, watched from before the init runs. Under the systemd driver the scope's cgroup
//! goes as soon as it empties, and the kernel drops a pending (rate-limited) notification with
//! it, so the count can be gone before the monitor has read it (runc, conmon and containerd lose
//! the reason this way). The pod's cgroup outlives its containers and counts its subtree's OOM
//! kills (memory.events is hierarchical): a kill there that no sibling cgroup still present and
//! no process of the pod cgroup itself accounts for was in a removed cgroup, taken to be this
//! one. Plain files only; used by the monitor alone.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

pub(super) struct OomWatch {
    cgroup: PathBuf,
    inotify: Option<Inotify>,
    /// The most OOM kills the container's memory.events showed.
    seen: u64,
    /// The pod cgroup's counts when the watch began.
    pod: Option<PodCounts>,
}

impl OomWatch {
    pub(super) fn new(cgroup: &Path) -> OomWatch {
        OomWatch {
            cgroup: cgroup.to_path_buf(),
            inotify: Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok(),
            seen: 0,
            pod: None,
        }
    }

    /// Starts watching: called once the cgroup exists (for a systemd scope, once the init is
    /// placed) and before the init runs anything of the container's.
    pub(super) fn begin(&mut self) {
        if let Some(w) = &self.inotify {
            let _ = w.add_watch(&self.cgroup.join("memory.events"), AddWatchFlags::IN_MODIFY);
        }
        self.pod = self
            .cgroup
            .parent()
            .and_then(|p| PodCounts::read(p, &self.cgroup));
    }

    /// What to poll for changes of memory.events.
    pub(super) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.inotify.as_ref().map(|w| w.as_fd())
    }

    /// Drains the watch and keeps the highest count seen.
    pub(super) fn note(&mut self) {
        if let Some(w) = &self.inotify {
            while matches!(w.read_events(), Ok(e) if !e.is_empty()) {}
        }
        if let Some(n) = oom_kills(&self.cgroup.join("memory.events")) {
            self.seen = self.seen.max(n);
        }
    }

    /// Whether an init that ended by `signal` was OOM killed: a SIGKILL while its cgroup counted
    /// an OOM kill, or, its cgroup gone, one in the pod that nothing else accounts for.
    pub(super) fn killed(&mut self, signal: Option<i32>) -> bool {
        if signal != Some(libc::SIGKILL) {
            return false;
        }
        self.note();
        if self.seen > 0 {
            return true;
        }
        if self.cgroup.exists() {
            return false;
        }
        match (&self.pod, self.cgroup.parent()) {
            (Some(before), Some(pod)) => PodCounts::read(pod, &self.cgroup)
                .is_some_and(|now| now.unexplained_since(before) > 0),
            _ => false,
        }
    }
}

/// OOM kill counts of a pod cgroup: its subtree's, its own processes', each child cgroup's but
/// the container's.
#[derive(Debug)]
struct PodCounts {
    total: u64,
    local: u64,
    children: HashMap<OsString, u64>,
}

impl PodCounts {
    fn read(pod: &Path, own: &Path) -> Option<PodCounts> {
        let total = oom_kills(&pod.join("memory.events"))?;
        // memory.events.local is newer than memory.events (Linux 5.2): none, none counted.
        let local = oom_kills(&pod.join("memory.events.local")).unwrap_or(0);
        let mut children = HashMap::new();
        for entry in std::fs::read_dir(pod).ok()?.flatten() {
            let path = entry.path();
            if path == own || !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if let Some(n) = oom_kills(&path.join("memory.events")) {
                children.insert(entry.file_name(), n);
            }
        }
        Some(PodCounts {
            total,
            local,
            children,
        })
    }

    /// Kills counted in the subtree since `before` that neither the pod's own processes nor a
    /// child cgroup still present account for.
    fn unexplained_since(&self, before: &PodCounts) -> u64 {
        let mut n = self.total.saturating_sub(before.total);
        n = n.saturating_sub(self.local.saturating_sub(before.local));
        for (name, count) in &self.children {
            let base = before.children.get(name).copied().unwrap_or(0);
            n = n.saturating_sub(count.saturating_sub(base));
        }
        n
    }
}

/// The `oom_kill` count of a memory.events file; None when it cannot be read.
fn oom_kills(file: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    Some(
        text.lines()
            .find_map(|l| {
                l.strip_prefix("oom_kill ")
                    .and_then(|n| n.trim().parse().ok())
            })
            .unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(dir: &Path, name: &str, kills: u64) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join(name),
            format!("low 0\nhigh 0\nmax 7\noom 1\noom_kill {kills}\noom_group_kill 0\n"),
        )
        .unwrap();
    }

    /// A pod cgroup laid out as plain files: the container's, a sibling's, the pod's own.
    fn pod(root: &Path, total: u64, local: u64, own: Option<u64>, sibling: u64) -> PathBuf {
        events(root, "memory.events", total);
        events(root, "memory.events.local", local);
        events(&root.join("sibling.scope"), "memory.events", sibling);
        let own_dir = root.join("own.scope");
        match own {
            Some(n) => events(&own_dir, "memory.events", n),
            None => {
                let _ = std::fs::remove_dir_all(&own_dir);
            }
        }
        own_dir
    }

    #[test]
    fn the_container_count_decides_while_it_can_be_read() {
        let t = tempfile::tempdir().unwrap();
        let own = pod(t.path(), 0, 0, Some(0), 0);
        let mut w = OomWatch::new(&own);
        w.begin();
        pod(t.path(), 1, 0, Some(1), 0);
        assert!(
            !w.killed(Some(libc::SIGTERM)),
            "only a SIGKILL is the OOM killer's"
        );
        assert!(w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn a_kill_the_pod_counted_is_the_removed_cgroups() {
        let t = tempfile::tempdir().unwrap();
        let own = pod(t.path(), 2, 0, Some(0), 2);
        let mut w = OomWatch::new(&own);
        w.begin();
        // The container's cgroup went (systemd stopped its scope) before it was read again.
        pod(t.path(), 3, 0, None, 2);
        assert!(w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn kills_a_sibling_or_the_pod_itself_took_are_not_the_containers() {
        let t = tempfile::tempdir().unwrap();
        let own = pod(t.path(), 2, 0, Some(0), 2);
        let mut w = OomWatch::new(&own);
        w.begin();
        pod(t.path(), 3, 0, None, 3);
        assert!(!w.killed(Some(libc::SIGKILL)), "the sibling's kill");
        pod(t.path(), 4, 1, None, 3);
        assert!(
            !w.killed(Some(libc::SIGKILL)),
            "a kill in the pod cgroup itself"
        );
        // A sibling that appeared after the watch began counts from zero.
        events(&t.path().join("late.scope"), "memory.events", 1);
        pod(t.path(), 5, 1, None, 3);
        assert!(!w.killed(Some(libc::SIGKILL)), "the late sibling's kill");
        pod(t.path(), 6, 1, None, 3);
        assert!(w.killed(Some(libc::SIGKILL)), "one left over");
    }

    #[test]
    fn nothing_is_claimed_without_the_pods_counts() {
        let t = tempfile::tempdir().unwrap();
        let own = t.path().join("pod").join("own.scope");
        events(&own, "memory.events", 0);
        let mut w = OomWatch::new(&own);
        w.begin();
        std::fs::remove_dir_all(&own).unwrap();
        events(&t.path().join("pod"), "memory.events", 1);
        assert!(!w.killed(Some(libc::SIGKILL)), "no baseline was taken");
    }
}
