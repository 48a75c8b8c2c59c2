//! A container brought back from a CRIU checkpoint instead of started: the monitor runs
//! `criu restore` detached, with the new pod's namespaces, the new container's mounts and its
//! own pipes in place of the checkpointed ones, in the container's cgroup; the restored init is
//! then the monitor's child (it is the subreaper criu's exit hands the tree to).

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

use super::super::step::{StepError, step};
use super::super::{MonitorConfig, RestoreConfig};
use crate::sys;

/// The first descriptor handed to criu: the network namespace, then stdin, stdout, stderr.
const FIRST_FD: i32 = 3;
/// Where they wait before being placed: above anything the monitor holds.
const HIGH_FD: i32 = 200;

/// The container side of the new container's stdio.
pub(super) struct Ends {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Runs `criu restore` and returns the restored init, now a child of this process.
/// `placement` is the daemon's word that criu's process was put in its systemd scope (it is
/// reported as forked first, like an init); `placed` runs once it is there, before criu goes on.
pub(super) fn run(
    cfg: &MonitorConfig,
    r: &RestoreConfig,
    rootfs: &Path,
    ends: Ends,
    placement: Option<(OwnedFd, OwnedFd)>,
    placed: impl FnOnce(),
) -> Result<Pid, StepError> {
    nix::sys::prctl::set_child_subreaper(true).map_err(step("child subreaper"))?;
    let net = match &r.net {
        Some((_, path)) => Some(
            std::fs::File::open(path)
                .map(OwnedFd::from)
                .map_err(step(format!("network namespace {}", path.display())))?,
        ),
        None => None,
    };
    let mut args: Vec<String> = vec![
        "criu".into(),
        "restore".into(),
        "--images-dir".into(),
        r.images.display().to_string(),
        "--root".into(),
        rootfs.display().to_string(),
        "--restore-detached".into(),
        "--pidfile".into(),
        r.pid_file.display().to_string(),
        // The monitor puts criu, and so the restored tree, in the container's cgroup.
        "--manage-cgroups=ignore".into(),
        "--log-file".into(),
        r.log.display().to_string(),
        "-v4".into(),
    ];
    for (key, source) in &r.mounts {
        args.push("--external".into());
        args.push(format!("mnt[{key}]:{}", source.display()));
    }
    if let Some((key, _)) = &r.net {
        args.push("--inherit-fd".into());
        args.push(format!("fd[{FIRST_FD}]:{key}"));
    }
    for (i, name) in r.stdio.iter().enumerate().take(3) {
        if name.starts_with("pipe:") {
            args.push("--inherit-fd".into());
            args.push(format!("fd[{}]:{name}", FIRST_FD + 1 + i as i32));
        }
    }
    for ns in cfg
        .join
        .iter()
        .filter(|n| n.kind == "ipc" || n.kind == "uts")
    {
        args.push("--join-ns".into());
        args.push(format!("{}:{}", ns.kind, ns.path.display()));
    }
    let argv: Vec<CString> = args
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(step("criu arguments"))?;
    let _ = std::fs::remove_file(&r.pid_file);
    let (placed_r, placed_w) = match placement {
        Some((r, w)) => (Some(r), Some(w)),
        None => (None, None),
    };
    match sys::fork().map_err(step("fork"))? {
        ForkResult::Child => {
            drop(placed_w);
            let why = exec_criu(cfg, &argv, net, ends, placed_r);
            let _ = writeln!(std::io::stderr(), "criu restore: {why}");
            std::process::exit(127)
        }
        ForkResult::Parent { child } => {
            drop(placed_r);
            drop(ends);
            if let Some(w) = placed_w {
                super::report(&super::super::StartReport::Forked {
                    pid: child.as_raw(),
                });
                if let Err(e) = super::super::await_placement() {
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    return Err(e);
                }
                placed();
                let _ = std::fs::File::from(w).write_all(&[1]);
            }
            let status = waitpid(child, None).map_err(step("waiting for criu"))?;
            if !matches!(status, WaitStatus::Exited(_, 0)) {
                return Err(StepError::new(
                    "criu restore",
                    format!("{status:?}: {}", criu_errors(&r.log)),
                ));
            }
            let mut text = String::new();
            std::fs::File::open(&r.pid_file)
                .and_then(|mut f| f.read_to_string(&mut text))
                .map_err(step(r.pid_file.display().to_string()))?;
            let pid: i32 = text.trim().parse().map_err(|_| {
                StepError::new(r.pid_file.display().to_string(), "not a process ID")
            })?;
            Ok(Pid::from_raw(pid))
        }
    }
}

/// In the forked child: waits to be placed (or joins the cgroup), puts the descriptors where
/// the arguments say and execs criu. Returns only on failure.
fn exec_criu(
    cfg: &MonitorConfig,
    argv: &[CString],
    net: Option<OwnedFd>,
    ends: Ends,
    placed: Option<OwnedFd>,
) -> String {
    if let Some(p) = placed {
        let mut b = [0u8; 1];
        if std::fs::File::from(p).read_exact(&mut b).is_err() {
            return "not placed in the container's scope".into();
        }
    } else if let Some(cg) = &cfg.cgroup
        && let Err(e) = std::fs::write(cg.join("cgroup.procs"), "0")
    {
        return format!("joining cgroup {}: {e}", cg.display());
    }
    if let Some(dev) = &cfg.devices_cgroup
        && let Err(e) = std::fs::write(dev.join("cgroup.procs"), "0")
    {
        return format!("joining devices cgroup {}: {e}", dev.display());
    }
    let mut fds = Vec::new();
    if let Some(n) = &net {
        fds.push((n.as_fd(), FIRST_FD));
    }
    fds.push((ends.stdin.as_fd(), FIRST_FD + 1));
    fds.push((ends.stdout.as_fd(), FIRST_FD + 2));
    fds.push((ends.stderr.as_fd(), FIRST_FD + 3));
    if let Err(e) = sys::place_fds(&fds, HIGH_FD) {
        return format!("placing descriptors: {e}");
    }
    match nix::unistd::execvp(&argv[0], argv) {
        Err(e) => format!("exec criu: {e}"),
        Ok(never) => match never {},
    }
}

/// The error lines of criu's log, for the report.
pub fn criu_errors(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error")).collect();
    if errors.is_empty() {
        format!("no error in {}", log.display())
    } else {
        errors.join("; ")
    }
}
