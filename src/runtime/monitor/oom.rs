//! Whether the container's init was ended by the OOM killer: its cgroup's `oom_kill` count in
//! memory.events, watched from before the init runs. Under the systemd driver the scope's cgroup
//! goes as soon as it empties, and the kernel drops a pending notification with it (it sends one
//! per file at most every 10 ms, holding back the rest), so the count can be gone before the
//! monitor has read it (runc issue 5071 and conmon issue 426 describe the reason lost so). So a
//! change is taken as read only once the count has been read again after the kernel's holding
//! time; when a scope's cgroup went before that, the pod's cgroup tells: it outlives its
//! containers and counts its subtree's OOM kills (memory.events is hierarchical), and a kill
//! there that no sibling cgroup still present and no process of the pod cgroup itself accounts
//! for was this container's. Plain files only; used by the monitor alone.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};

/// Longer than the kernel holds back a cgroup file's notification (10 ms), with room for a slow
/// machine's work queue.
const SETTLE: Duration = Duration::from_millis(100);

pub(super) struct OomWatch {
    cgroup: PathBuf,
    inotify: Option<Inotify>,
    /// The most OOM kills the container's memory.events showed.
    seen: u64,
    /// When the count must be read again to be sure no held-back change is missed: set by each
    /// notification, cleared by a read at or after it.
    unsettled: Option<Instant>,
    /// Whether systemd removes the cgroup when it empties (a scope), so the pod may have to tell.
    scope: bool,
    /// The pod cgroup's counts when the watch began (a scope's only).
    pod: Option<PodCounts>,
}

impl OomWatch {
    pub(super) fn new(cgroup: &Path, scope: bool) -> OomWatch {
        OomWatch {
            cgroup: cgroup.to_path_buf(),
            inotify: Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).ok(),
            seen: 0,
            unsettled: None,
            scope,
            pod: None,
        }
    }

    /// Starts watching: called once the cgroup exists (for a systemd scope, once the init is
    /// placed) and before the init runs anything of the container's.
    pub(super) fn begin(&mut self) {
        if let Some(w) = &self.inotify {
            let _ = w.add_watch(&self.cgroup.join("memory.events"), AddWatchFlags::IN_MODIFY);
        }
        // A cgroup the daemon removes outlives the monitor's last read: no witness needed, and
        // none read on every container start.
        if self.scope {
            self.pod = self
                .cgroup
                .parent()
                .and_then(|p| PodCounts::read(p, &self.cgroup, true));
        }
    }

    /// What to poll for changes of memory.events.
    pub(super) fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.inotify.as_ref().map(|w| w.as_fd())
    }

    /// When `note` should be called again though nothing was notified.
    pub(super) fn settles_at(&self) -> Option<Instant> {
        self.unsettled
    }

    /// Drains the watch and keeps the highest count seen.
    pub(super) fn note(&mut self) {
        if let Some(w) = &self.inotify {
            let mut notified = false;
            while let Ok(events) = w.read_events() {
                if events.is_empty() {
                    break;
                }
                // The watch's end (IN_IGNORED, the cgroup removed) is no change of the count.
                notified |= events
                    .iter()
                    .any(|e| e.mask.contains(AddWatchFlags::IN_MODIFY));
            }
            if notified {
                self.unsettled = Some(Instant::now() + SETTLE);
            }
        }
        // Taken before the read: the read must come after the holding time, not only end after it.
        let now = Instant::now();
        if let Some(n) = oom_kills(&self.cgroup.join("memory.events")) {
            self.seen = self.seen.max(n);
            if self.unsettled.is_some_and(|t| t <= now) {
                self.unsettled = None;
            }
        }
    }

    /// Whether an init that ended by `signal` was OOM killed: a SIGKILL while its cgroup counted
    /// an OOM kill, or, its cgroup gone with a change unread, one in the pod that nothing else
    /// accounts for.
    pub(super) fn killed(&mut self, signal: Option<i32>) -> bool {
        if signal != Some(libc::SIGKILL) {
            return false;
        }
        self.note();
        if self.seen > 0 {
            return true;
        }
        // A SIGKILL from elsewhere (StopContainer's last step) leaves nothing unread: a kill in
        // a sibling removed since is not taken for this container's.
        if self.unsettled.is_none() || self.cgroup.exists() {
            return false;
        }
        match (&self.pod, self.cgroup.parent()) {
            (Some(before), Some(pod)) => PodCounts::read(pod, &self.cgroup, false)
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
    /// The counts now. A kill while they are read must not look unexplained: the baseline
    /// reads the parts before the whole, later reads the whole before the parts.
    fn read(pod: &Path, own: &Path, baseline: bool) -> Option<PodCounts> {
        let total = || oom_kills(&pod.join("memory.events"));
        let early = if baseline { None } else { Some(total()?) };
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
        let total = match early {
            Some(n) => n,
            None => total()?,
        };
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
    let events = crate::runtime::cgroup::read_keyed(file).ok()?;
    Some(events.get("oom_kill").copied().unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(dir: &Path, name: &str, max: u64, kills: u64) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(
            dir.join(name),
            format!("low 0\nhigh 0\nmax {max}\noom {kills}\noom_kill {kills}\noom_group_kill 0\n"),
        )
        .unwrap();
    }

    /// A pod cgroup laid out as plain files: the pod's counts and a sibling's (None: removed).
    fn pod(root: &Path, total: u64, local: u64, sibling: Option<u64>) {
        events(root, "memory.events", 0, total);
        events(root, "memory.events.local", 0, local);
        let dir = root.join("sibling.scope");
        match sibling {
            Some(n) => events(&dir, "memory.events", 0, n),
            None => std::fs::remove_dir_all(&dir).unwrap(),
        }
    }

    /// The container's cgroup, watched, in a pod with one sibling and no kills yet.
    fn watched(root: &Path) -> (PathBuf, OomWatch) {
        pod(root, 0, 0, Some(0));
        let own = root.join("own.scope");
        events(&own, "memory.events", 0, 0);
        let mut w = OomWatch::new(&own, true);
        w.begin();
        (own, w)
    }

    /// The container ran into its limit (memory.events changed, notified) and its cgroup went
    /// before the count was read again.
    fn pressed_then_removed(own: &Path) {
        events(own, "memory.events", 3, 0);
        std::fs::remove_dir_all(own).unwrap();
    }

    #[test]
    fn the_container_count_decides_while_it_can_be_read() {
        let t = tempfile::tempdir().unwrap();
        let (own, mut w) = watched(t.path());
        events(&own, "memory.events", 3, 1);
        assert!(
            !w.killed(Some(libc::SIGTERM)),
            "only a SIGKILL is the OOM killer's"
        );
        assert!(w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn a_kill_the_pod_counted_is_the_removed_cgroups() {
        let t = tempfile::tempdir().unwrap();
        let (own, mut w) = watched(t.path());
        pressed_then_removed(&own);
        pod(t.path(), 1, 0, Some(0));
        assert!(w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn kills_a_sibling_or_the_pod_itself_took_are_not_the_containers() {
        let t = tempfile::tempdir().unwrap();
        let (own, mut w) = watched(t.path());
        pressed_then_removed(&own);
        pod(t.path(), 1, 0, Some(1));
        assert!(!w.killed(Some(libc::SIGKILL)), "the sibling's kill");
        pod(t.path(), 2, 1, Some(1));
        assert!(
            !w.killed(Some(libc::SIGKILL)),
            "a kill in the pod cgroup itself"
        );
        // A sibling that appeared after the watch began counts from zero.
        events(&t.path().join("late.scope"), "memory.events", 0, 1);
        pod(t.path(), 3, 1, Some(1));
        assert!(!w.killed(Some(libc::SIGKILL)), "the late sibling's kill");
        pod(t.path(), 4, 1, Some(1));
        assert!(w.killed(Some(libc::SIGKILL)), "one left over");
    }

    #[test]
    fn a_kill_from_elsewhere_with_nothing_unread_is_not_taken_for_one() {
        let t = tempfile::tempdir().unwrap();
        let (own, mut w) = watched(t.path());
        // A sibling was OOM killed and removed (its scope gone), then the container was ended
        // by a SIGKILL of the daemon's after its cgroup went; its count never changed.
        pod(t.path(), 1, 0, None);
        std::fs::remove_dir_all(&own).unwrap();
        assert!(!w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn a_change_read_again_after_the_kernels_holding_time_is_settled() {
        let t = tempfile::tempdir().unwrap();
        let (own, mut w) = watched(t.path());
        events(&own, "memory.events", 3, 0);
        w.note();
        assert!(w.settles_at().is_some(), "read too soon to be sure");
        std::thread::sleep(SETTLE + Duration::from_millis(10));
        w.note();
        assert_eq!(w.settles_at(), None);
        pod(t.path(), 1, 0, None);
        std::fs::remove_dir_all(&own).unwrap();
        assert!(!w.killed(Some(libc::SIGKILL)), "nothing was left unread");
    }

    #[test]
    fn a_cgroup_the_daemon_removes_takes_no_witness() {
        let t = tempfile::tempdir().unwrap();
        pod(t.path(), 0, 0, Some(0));
        let own = t.path().join("own.scope");
        events(&own, "memory.events", 0, 0);
        let mut w = OomWatch::new(&own, false);
        w.begin();
        assert!(w.pod.is_none(), "no pod counts read at start");
        pressed_then_removed(&own);
        pod(t.path(), 1, 0, Some(0));
        assert!(!w.killed(Some(libc::SIGKILL)));
    }

    #[test]
    fn nothing_is_claimed_without_the_pods_counts() {
        let t = tempfile::tempdir().unwrap();
        let own = t.path().join("pod").join("own.scope");
        events(&own, "memory.events", 0, 0);
        let mut w = OomWatch::new(&own, true);
        w.begin();
        pressed_then_removed(&own);
        events(&t.path().join("pod"), "memory.events", 0, 1);
        assert!(!w.killed(Some(libc::SIGKILL)), "no baseline was taken");
    }
}
