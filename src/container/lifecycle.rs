//! Starting a container (its monitor), stopping it (stop signal, grace period, then every
//! process of it), removing it, and reopening its log after kubelet rotated it.

use super::steps::Steps;
use super::{
    Bundle, Cgroup, ContainerService, ContainerState, Duration, Error, MntFlags, ProcessId,
    StartReport, atomic, events, io, io_err, notice, now_nanos, runtime, sandbox, state_name,
    umount2, wait_for_exit,
};
use tokio::io::AsyncBufReadExt;

impl ContainerService {
    pub async fn start(&self, id: &str) -> Result<(), Error> {
        let mut steps = Steps::new();
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        Self::present(&r)?;
        if r.state != ContainerState::Created {
            return Err(Error::WrongState {
                id: r.id.clone(),
                state: state_name(r.state),
                want: "created",
            });
        }
        // A pod stopped or being removed has no namespaces left to start in.
        self.pod_ready(&r.sandbox_id).await?;
        steps.mark("checks");
        self.nri_start(&r).await?;
        steps.mark("nri");
        let b = self.bundle(&r.id);
        let stderr = std::fs::File::create(b.dir.join("monitor.log")).map_err(io_err(&b.dir))?;
        // Under systemd the monitor reports the forked init and waits for it to be placed.
        let placed = r.cgroup.clone().filter(|cg| self.scoped(Some(cg)));
        let mut child = tokio::process::Command::new(runtime::exe::helper())
            .arg0("crius")
            .arg("monitor")
            .arg(&b.dir)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| Error::Start {
                id: r.id.clone(),
                message: format!("spawning the monitor: {e}"),
            })?;
        let monitor = child.id().and_then(|pid| ProcessId::of(pid as i32).ok());
        steps.mark("monitor spawn");
        let stdout = child.stdout.take();
        let mut stdin = child.stdin.take();
        let mut line = String::new();
        let mut placement_error = None;
        if let Some(out) = stdout {
            let mut out = tokio::io::BufReader::new(out);
            loop {
                line.clear();
                let read =
                    tokio::time::timeout(Duration::from_secs(60), out.read_line(&mut line)).await;
                if read.is_err() {
                    let _ = child.start_kill();
                }
                if let (Some(cg), Ok(StartReport::Forked { pid })) =
                    (&placed, serde_json::from_str(line.trim()))
                {
                    if let Err(e) = self.place(&r, cg, pid, stdin.as_mut()).await {
                        placement_error = Some(e.to_string());
                    }
                    continue;
                }
                break;
            }
        }
        steps.mark("monitor exec, report");
        // Told once the record says running; a monitor that is never told ends the container.
        let keeper = crate::sandbox::Keeper(stdin);
        // tokio reaps the monitor when it ends; its exit is watched through a pidfd.
        drop(child);
        // A failed placement is the cause, whatever the monitor said after it.
        let report = match (serde_json::from_str(line.trim()), placement_error) {
            (Ok(StartReport::Failed { .. }) | Err(_), Some(message)) => {
                StartReport::Failed { message }
            }
            (Ok(report), _) => report,
            (Err(_), None) => {
                let log = std::fs::read_to_string(b.dir.join("monitor.log")).unwrap_or_default();
                StartReport::Failed {
                    message: format!("the monitor gave no start report ({})", log.trim()),
                }
            }
        };
        match report {
            StartReport::Started {
                pid,
                start_time,
                started_at,
                setup_us,
                init_us,
            } => {
                steps.split(
                    "monitor exec, report",
                    &[("monitor setup", setup_us), ("init until exec", init_us)],
                );
                crate::fault::point("monitor.spawn.after");
                let init = ProcessId { pid, start_time };
                r.state = ContainerState::Running;
                r.init = Some(init);
                r.monitor = monitor;
                r.started_at = started_at;
                r.mnt_ns = init.namespace("mnt").ok();
                atomic::write_json(&b.record(), &*r).map_err(io_err(&b.record()))?;
                steps.mark("record");
                // Told before the answer: a monitor never told ends its container, so a
                // daemon killed after answering must not leave one untold. (The woken monitor
                // competes for the CPU here: 0.3-0.4 ms of a start on this 2-core machine.)
                keeper.keep().await;
                steps.mark("monitor told");
                self.watch(r.id.clone(), monitor.unwrap_or(init));
                steps.mark("exit watch");
                self.inner
                    .events
                    .emit(notice(&r, events::EventKind::Started, started_at));
                steps.mark("event");
                self.nri_started(&r).await;
                steps.mark("nri started");
                steps.log("container started", &r.id);
                Ok(())
            }
            StartReport::Forked { .. } => Err(Error::Start {
                id: r.id.clone(),
                message: "the monitor reported a forked init it was not asked to".into(),
            }),
            StartReport::Failed { message } => {
                r.state = ContainerState::Exited;
                r.exit_code = 128;
                r.reason = "StartError".into();
                r.message = message.clone();
                r.started_at = now_nanos();
                r.finished_at = r.started_at;
                let _ = umount2(&b.rootfs(), MntFlags::MNT_DETACH);
                let _ = atomic::write_json(&b.record(), &*r);
                self.inner
                    .events
                    .emit(notice(&r, events::EventKind::Stopped, r.finished_at));
                self.nri_stopped(&r).await;
                // The pod stopped under the start: that, not the failed join, is the answer.
                self.pod_ready(&r.sandbox_id).await?;
                Err(Error::Start {
                    id: r.id.clone(),
                    message,
                })
            }
        }
    }

    /// Refuses work in a pod that is not ready (FailedPrecondition, as for CreateContainer).
    async fn pod_ready(&self, sandbox_id: &str) -> Result<(), Error> {
        let sandbox = self.inner.sandboxes.get(sandbox_id).await?;
        if sandbox.ready {
            Ok(())
        } else {
            Err(sandbox::Error::NotReady { id: sandbox.id }.into())
        }
    }

    /// Sends the stop signal, waits `timeout` seconds, then kills the whole container.
    pub async fn stop(&self, id: &str, timeout: i64) -> Result<(), Error> {
        let entry = match self.entry(id) {
            Ok(e) => e,
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let (init, monitor, signal, own_pid_ns, mnt_ns, cgroup) = {
            let mut r = entry.lock().await;
            self.sync_exit(&mut r);
            if r.state != ContainerState::Running {
                return Ok(());
            }
            let Some(init) = r.init else { return Ok(()) };
            (
                init,
                r.monitor,
                r.stop_signal_number(),
                r.own_pid_ns,
                r.mnt_ns,
                r.cgroup.clone(),
            )
        };
        let ended = monitor.filter(|m| m.alive()).unwrap_or(init);
        if timeout > 0 {
            let _ = init.signal(signal);
            wait_for_exit(ended, Duration::from_secs(timeout as u64)).await;
        }
        if ended.alive() {
            kill_all(init, own_pid_ns, mnt_ns, cgroup.as_ref());
            wait_for_exit(ended, Duration::from_secs(10)).await;
        }
        let mut r = entry.lock().await;
        self.sync_exit(&mut r);
        self.nri_stopped(&r).await;
        Ok(())
    }

    /// Removes a container, killing it first if it runs. Idempotent.
    pub async fn remove(&self, id: &str) -> Result<(), Error> {
        let entry = match self.entry(id) {
            Ok(e) => e,
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.stop(id, 0).await?;
        // Nothing of a container outlives its record: its process may live on under a record
        // that says otherwise (its monitor died), and the monitor may still be finishing. They
        // are ended without the lock, so listings and statuses go on meanwhile; a start that
        // came in between made new ones, which go too.
        let mut r = loop {
            let (full_id, init, monitor, own_pid_ns, mnt_ns, cgroup) = {
                let r = entry.lock().await;
                if r.state == ContainerState::Removed {
                    return Ok(());
                }
                let cgroup = r.cgroup.clone();
                (
                    r.id.clone(),
                    r.init,
                    r.monitor,
                    r.own_pid_ns,
                    r.mnt_ns,
                    cgroup,
                )
            };
            if let Some(init) = init.filter(|i| i.alive()) {
                kill_all(init, own_pid_ns, mnt_ns, cgroup.as_ref());
            }
            if let Some(m) = monitor.filter(|m| m.alive()) {
                let _ = m.signal(libc::SIGKILL);
            }
            for p in [init, monitor].into_iter().flatten() {
                if !wait_for_exit(p, Duration::from_secs(10)).await {
                    return Err(Error::Unkillable {
                        id: full_id,
                        pid: p.pid,
                    });
                }
            }
            let r = entry.lock().await;
            if r.state == ContainerState::Removed {
                return Ok(());
            }
            if (r.init, r.monitor) == (init, monitor) {
                break r;
            }
        };
        // Plugins are told while the bundle still says what the container was.
        self.nri_removed(&r).await;
        let b = self.bundle(&r.id);
        discard_files(b.clone()).await;
        if let Some(cg) = &r.cgroup {
            if let Some(sd) = self.inner.sandboxes.systemd()
                && let Some((unit, _)) = crate::systemd::unit_and_slice(&cg.path)
                && let Err(e) = sd.stop(&unit).await
            {
                tracing::warn!(unit, error = %e, "stopping a container's systemd scope");
            }
            if let Err(e) = sandbox::remove_cgroup(cg).await {
                tracing::warn!(cgroup = %cg.path.display(), error = %e, "removing container cgroup");
            }
        }
        self.remove_devices_v1_cgroup(&r.id).await;
        if let Some(c) = &r.top_chain {
            self.inner.images.release(c);
        }
        self.release_image_volumes(&r.id, &r.image_volumes);
        let mut cpu_keys = vec![b.dir.as_path()];
        cpu_keys.extend(r.cgroup.as_ref().map(|c| c.path.as_path()));
        self.inner.samples.forget(&cpu_keys, &b.layer.join("upper"));
        self.inner.records.remove(&r.id);
        self.inner.records.release(&r.name_key());
        // Whoever waited for the lock meanwhile finds it gone.
        r.state = ContainerState::Removed;
        self.inner
            .events
            .emit(notice(&r, events::EventKind::Deleted, now_nanos()));
        Ok(())
    }

    /// Has the monitor open the log path again (kubelet rotated the file).
    pub async fn reopen_log(&self, id: &str) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let (monitor, path) = {
            let mut r = entry.lock().await;
            self.sync_exit(&mut r);
            if r.state != ContainerState::Running {
                return Err(Error::WrongState {
                    id: r.id.clone(),
                    state: state_name(r.state),
                    want: "running",
                });
            }
            (r.monitor, r.log_path.clone())
        };
        let (Some(monitor), Some(path)) = (monitor, path) else {
            return Ok(());
        };
        monitor.signal(libc::SIGUSR1).map_err(io_err(&path))?;
        for _ in 0..200 {
            if path.exists() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Err(io_err(&path)(io::Error::other(
            "the log file was not reopened within 2 s",
        )))
    }
}

/// `SIGTERM`, `TERM`, `15`, `SIGRTMIN+3`.
pub fn parse_signal(s: &str) -> Option<i32> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = s.to_ascii_uppercase();
    let name = if name.starts_with("SIG") {
        name
    } else {
        format!("SIG{name}")
    };
    if let Some(rest) = name.strip_prefix("SIGRTMIN") {
        let off: i32 = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('+')?.parse().ok()?
        };
        let n = libc::SIGRTMIN() + off;
        return (n <= libc::SIGRTMAX()).then_some(n);
    }
    if let Some(rest) = name.strip_prefix("SIGRTMAX") {
        let off: i32 = if rest.is_empty() {
            0
        } else {
            rest.strip_prefix('-')?.parse().ok()?
        };
        let n = libc::SIGRTMAX() - off;
        return (n >= libc::SIGRTMIN()).then_some(n);
    }
    // Other names for the same signals.
    let name = match name.as_str() {
        "SIGCLD" => "SIGCHLD",
        "SIGPOLL" => "SIGIO",
        "SIGIOT" => "SIGABRT",
        n => n,
    };
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

/// The name of signal `n` as `parse_signal` reads it back (`SIGTERM`, `SIGRTMIN+3`,
/// `SIGRTMAX-1`).
pub fn signal_name(n: i32) -> String {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if (min..=max).contains(&n) {
        return match (n - min, max - n) {
            (0, _) => "SIGRTMIN".into(),
            (_, 0) => "SIGRTMAX".into(),
            (up, _) if up <= 15 => format!("SIGRTMIN+{up}"),
            (_, down) => format!("SIGRTMAX-{down}"),
        };
    }
    nix::sys::signal::Signal::try_from(n)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| n.to_string())
}

/// SIGKILL to every process of the container: its cgroup's when it has one; else the init alone
/// with its own PID namespace, or every process sharing its mount namespace.
pub(super) fn kill_all(
    init: ProcessId,
    own_pid_ns: bool,
    mnt_ns: Option<u64>,
    cgroup: Option<&Cgroup>,
) {
    let _ = init.signal(libc::SIGKILL);
    if let Some(cg) = cgroup
        && cg.kill().is_ok()
    {
        return;
    }
    if own_pid_ns {
        return;
    }
    if let Some(ns) = mnt_ns {
        for pid in runtime::process::pids_in_namespace("mnt", ns) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// `remove_files` off the async threads (a writable layer may hold many files).
pub(super) async fn discard_files(b: Bundle) {
    let _ = tokio::task::spawn_blocking(move || remove_files(&b)).await;
}

pub(super) fn remove_files(b: &Bundle) {
    // The rootfs, image volumes and any idmapped layers are unmounted first; a tree that keeps
    // a mount is left.
    if let Err(e) = crate::mounttable::remove_trees(&[&b.layer, &b.dir]) {
        tracing::warn!(dir = %b.dir.display(), error = %e, "removing container files");
    }
}
