//! How a bench run ends, however it ends. A signal (Ctrl-C, SIGTERM, a closed terminal) stops
//! the run at its next await, so its guards clean up as after an error; a second signal leaves
//! at once. Then whatever the run started and is still alive goes: the bench is a child
//! subreaper, so every process it started, down to the shims, conmons, monitors and pause
//! processes that outlive their daemons, stays its descendant (and those that exit meanwhile
//! are reaped as they go). The network namespaces and cgroups the runtimes made during the run
//! go with them; nothing of anyone else's.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

const NETNS: &str = "/run/netns";
/// The names of the network namespaces the run makes: containerd's, and the bench's own for
/// the plugin chain alone (crius and CRI-O keep theirs under the bench's directory).
const OWN_NETNS: [&str; 2] = ["cni-", "crbench-"];
const CGROUPS: &str = "/sys/fs/cgroup";
/// The cgroups the runtimes put pods under: containerd's default, crius's default and the
/// parent the bench gives CRI-O; at the top of a hierarchy (v2) or of a controller's (v1).
const OWN_CGROUPS: [&str; 3] = ["k8s.io", "crius", super::crio::CGROUP_PARENT];
/// How long the run's processes get to end after SIGTERM before SIGKILL.
const GRACE: Duration = Duration::from_secs(5);
/// The processes that come to the bench when their parent exits (a shim or conmon daemonizes;
/// a monitor or pause process outlives its daemon), by comm: none is a name the bench runs
/// itself, so reaping them never takes an exit status the bench waits for.
const ADOPTED: [&str; 4] = ["containerd-shim", "conmon", "crius-monitor", "pause"];

/// What was on the machine before the run, and the reaper of adopted processes.
pub struct Before {
    netns: BTreeSet<String>,
    cgroups: BTreeSet<PathBuf>,
    reaping: Arc<AtomicBool>,
}

/// Makes the bench its descendants' reaper, notes what was there before the run, and reaps
/// adopted processes as they exit.
pub fn start() -> Result<Before> {
    nix::sys::prctl::set_child_subreaper(true).context("becoming a child subreaper")?;
    let reaping = Arc::new(AtomicBool::new(true));
    let on = reaping.clone();
    std::thread::spawn(move || {
        while on.load(Ordering::Relaxed) {
            reap_adopted();
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    Ok(Before {
        netns: netns(),
        cgroups: cgroups(),
        reaping,
    })
}

/// The exit code of a process ended by `signal`, as a shell gives it.
fn exit_code(name: &str) -> i32 {
    128 + match name {
        "SIGHUP" => 1,
        "SIGTERM" => 15,
        _ => 2,
    }
}

/// The signals that stop a run: SIGINT, SIGTERM and SIGHUP.
pub struct Signals(Vec<(tokio::signal::unix::Signal, &'static str)>);

impl Signals {
    pub fn watch() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        let kinds = [
            (SignalKind::interrupt(), "SIGINT"),
            (SignalKind::terminate(), "SIGTERM"),
            (SignalKind::hangup(), "SIGHUP"),
        ];
        let mut streams = Vec::new();
        for (kind, name) in kinds {
            match signal(kind) {
                Ok(s) => streams.push((s, name)),
                Err(e) => eprintln!("bench: cannot watch {name}: {e}"),
            }
        }
        Signals(streams)
    }

    /// The first of them to come, named.
    pub async fn first(&mut self) -> &'static str {
        if self.0.is_empty() {
            return std::future::pending().await;
        }
        let waits = self.0.iter_mut().map(|(s, name)| {
            let name = *name;
            Box::pin(async move {
                s.recv().await;
                name
            })
        });
        futures_util::future::select_all(waits).await.0
    }

    /// From now on a signal ends the bench at once (tokio's handlers stay installed, so it
    /// would otherwise be ignored), saying `why`.
    pub fn exit_on_next(mut self, why: &'static str) {
        tokio::spawn(async move {
            let name = self.first().await;
            eprintln!("bench: {name}: {why}");
            std::process::exit(exit_code(name));
        });
    }
}

/// Ends what the run left: its processes (SIGTERM, then SIGKILL after `GRACE`), then the network
/// namespaces and the empty cgroups the runtimes made. Says what it removed; a run that ended
/// well should leave nothing. Call it only once no `Child` of the bench is left to wait for: it
/// reaps every exited child.
pub fn sweep(before: &Before) {
    before.reaping.store(false, Ordering::Relaxed);
    let stopped = end_descendants();
    let mut namespaces = 0;
    let own = |n: &&String| OWN_NETNS.iter().any(|p| n.starts_with(p));
    for name in netns().difference(&before.netns).filter(own) {
        let path = Path::new(NETNS).join(name);
        let _ = nix::mount::umount2(&path, nix::mount::MntFlags::MNT_DETACH);
        if std::fs::remove_file(&path).is_ok() {
            namespaces += 1;
        }
    }
    let mut new: Vec<PathBuf> = cgroups().difference(&before.cgroups).cloned().collect();
    // The deepest first: a cgroup goes only once it has no children.
    new.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    let removed: Vec<&PathBuf> = new
        .iter()
        .filter(|p| std::fs::remove_dir(p).is_ok())
        .collect();
    if stopped + namespaces + removed.len() > 0 {
        let some: Vec<String> = removed
            .iter()
            .take(3)
            .map(|p| p.display().to_string())
            .collect();
        eprintln!(
            "bench: cleaned up what the run left: {stopped} processes, {namespaces} network \
             namespaces, {} cgroups ({}{})",
            removed.len(),
            some.join(", "),
            if removed.len() > 3 { ", ..." } else { "" }
        );
    }
    let kept = new.iter().filter(|p| p.is_dir()).count();
    if kept > 0 {
        eprintln!("bench: {kept} cgroups made during the run are still in use, kept");
    }
}

/// Stops every descendant: SIGTERM, a grace period, SIGKILL; reaps the orphans that came to
/// the bench. Returns how many there were.
fn end_descendants() -> usize {
    let first = descendants();
    if first.is_empty() {
        reap();
        return 0;
    }
    for &pid in &first {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    let start = Instant::now();
    loop {
        reap();
        let left = descendants();
        if left.is_empty() {
            break;
        }
        if start.elapsed() > GRACE {
            for pid in left {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
            reap();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    first.len()
}

/// Reaps the adopted processes that have exited, each by its pid.
fn reap_adopted() {
    let me = std::process::id() as i32;
    for (pid, ppid, state, comm) in super::peers::tasks() {
        if state == "Z" && ppid == me && ADOPTED.contains(&comm.as_str()) {
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Collects every exited child, orphans included, so none stays a zombie.
fn reap() {
    while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if status == nix::sys::wait::WaitStatus::StillAlive {
            break;
        }
    }
}

/// This process's live descendants, by walking parent links in /proc.
fn descendants() -> Vec<i32> {
    let procs = super::peers::processes();
    let mut tree = vec![std::process::id() as i32];
    let mut out = Vec::new();
    while let Some(parent) = tree.pop() {
        for p in procs.iter().filter(|p| p.1 == parent) {
            out.push(p.0);
            tree.push(p.0);
        }
    }
    out
}

fn netns() -> BTreeSet<String> {
    std::fs::read_dir(NETNS)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The copies of cgroup `name` (a path from a hierarchy's root) that exist: v2's, and one under
/// each v1 controller.
pub fn cgroup_copies(name: &str) -> Vec<PathBuf> {
    let base = Path::new(CGROUPS);
    let name = name.trim_start_matches('/');
    let mut out = vec![base.join(name)];
    if let Ok(rd) = std::fs::read_dir(base) {
        out.extend(rd.flatten().map(|e| e.path().join(name)));
    }
    out.retain(|p| p.is_dir());
    out
}

/// The cgroups the runtimes put pods under (`OWN_CGROUPS`, in every hierarchy) and every one
/// below them.
fn cgroups() -> BTreeSet<PathBuf> {
    fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let p = e.path();
                walk(&p, out);
                out.insert(p);
            }
        }
    }
    let mut out = BTreeSet::new();
    for dir in OWN_CGROUPS.into_iter().flat_map(cgroup_copies) {
        walk(&dir, &mut out);
        out.insert(dir);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_childs_children_are_descendants() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = Instant::now();
        let found = loop {
            let found = descendants();
            if found.iter().filter(|&&p| p != pid).count() >= 2
                || start.elapsed() > Duration::from_secs(5)
            {
                break found;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        // The child's own subtree only: other tests run children of this process too.
        let sleeps: Vec<i32> = super::super::peers::processes()
            .iter()
            .filter(|p| p.1 == pid)
            .map(|p| p.0)
            .collect();
        for &p in sleeps.iter().chain([&pid]) {
            let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
        }
        let _ = child.wait();
        assert!(found.contains(&pid), "{found:?} lacks the child {pid}");
        assert!(sleeps.len() == 2, "{sleeps:?}: the two sleeps are missing");
        assert!(
            sleeps.iter().all(|s| found.contains(s)),
            "{found:?} lacks {sleeps:?}"
        );
    }
}
