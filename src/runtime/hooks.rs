//! OCI hooks (a container's `hooks`, which CDI specs add): each runs as the runtime
//! specification says, with the container's state as JSON on its stdin, its own arguments and
//! environment (nothing of ours), and its timeout. Where each kind runs: `prestart` and
//! `createRuntime` by the monitor once the init has made the container's mounts, before
//! `pivot_root` (the init waits on the `Pause` handshake); `createContainer` by the init at the
//! same point, in the container's namespaces but with the host's filesystem; `startContainer`
//! by the init after `pivot_root`, just before the container's process; `poststart` and
//! `poststop` by the monitor after the start and after the exit, where a failure is only
//! written to the monitor's log (the specification's "warning"). A hook the monitor runs starts
//! in the host's PID namespace, not in the container's, which the monitor's later children
//! enter (`HostPids`).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{CloneFlags, setns};
use oci_spec::runtime::{Hook, Hooks, Spec};
use serde::Serialize;

use super::step::StepError;

/// The state a hook reads on its stdin (the runtime specification's state).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State<'a> {
    pub oci_version: &'a str,
    pub id: &'a str,
    pub status: &'a str,
    pub pid: i32,
    pub bundle: &'a Path,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<&'a std::collections::HashMap<String, String>>,
}

/// The hooks of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Prestart,
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Prestart => "prestart",
            Kind::CreateRuntime => "createRuntime",
            Kind::CreateContainer => "createContainer",
            Kind::StartContainer => "startContainer",
            Kind::Poststart => "poststart",
            Kind::Poststop => "poststop",
        }
    }
}

/// The spec's hooks of a kind, in order.
pub fn of(spec: &Spec, kind: Kind) -> &[Hook] {
    let Some(h): Option<&Hooks> = spec.hooks().as_ref() else {
        return &[];
    };
    #[allow(deprecated)]
    let list = match kind {
        Kind::Prestart => h.prestart(),
        Kind::CreateRuntime => h.create_runtime(),
        Kind::CreateContainer => h.create_container(),
        Kind::StartContainer => h.start_container(),
        Kind::Poststart => h.poststart(),
        Kind::Poststop => h.poststop(),
    };
    list.as_deref().unwrap_or_default()
}

/// Whether the monitor must stop the init before `pivot_root` for hooks of its own.
pub fn monitor_runs_before_pivot(spec: &Spec) -> bool {
    !of(spec, Kind::Prestart).is_empty() || !of(spec, Kind::CreateRuntime).is_empty()
}

/// The most a hook may write to stderr that its failure report keeps.
const STDERR_KEPT: usize = 2048;

/// Runs the hooks of a kind in order; the first failure ends them.
pub fn run(spec: &Spec, kind: Kind, state: &State) -> Result<(), StepError> {
    for (i, h) in of(spec, kind).iter().enumerate() {
        // The step's detail crosses from the init to the monitor as text.
        run_one(h, state).map_err(|e| StepError {
            step: format!("{} hook {i} ({})", kind.name(), h.path().display()),
            detail: e.to_string(),
        })?;
    }
    Ok(())
}

/// Why one hook failed.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("{0}")]
    State(#[from] serde_json::Error),
    #[error("{0}")]
    Stderr(std::io::Error),
    #[error("cannot run it: {0}")]
    Spawn(std::io::Error),
    #[error("{0}")]
    Wait(std::io::Error),
    #[error("timed out after {secs} s")]
    TimedOut { secs: i64 },
    #[error("it failed ({status}){}", said_suffix(.said))]
    Failed {
        status: std::process::ExitStatus,
        /// What it wrote to stderr (the first `STDERR_KEPT` bytes), trimmed.
        said: String,
    },
}

/// `: what it said`, or nothing when it said nothing.
fn said_suffix(said: &str) -> String {
    if said.is_empty() {
        String::new()
    } else {
        format!(": {said}")
    }
}

fn run_one(h: &Hook, state: &State) -> Result<(), HookError> {
    let input = serde_json::to_vec(state)?;
    let args = h.args().as_deref().unwrap_or_default();
    let mut cmd = Command::new(h.path());
    if let Some((first, rest)) = args.split_first() {
        cmd.arg0(first).args(rest);
    }
    cmd.env_clear();
    for kv in h.env().as_deref().unwrap_or_default() {
        if let Some((k, v)) = kv.split_once('=') {
            cmd.env(k, v);
        }
    }
    let (err_r, err_w) = std::io::pipe().map_err(HookError::Stderr)?;
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::from(OwnedFd::from(err_w)));
    let mut child = cmd.spawn().map_err(HookError::Spawn)?;
    drop(cmd);
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that does not read its state must not fail for it.
        let _ = stdin.write_all(&input);
    }
    let deadline = h
        .timeout()
        .and_then(|t| u64::try_from(t).ok())
        .and_then(|t| Instant::now().checked_add(Duration::from_secs(t)));
    let mut err_r = err_r;
    set_nonblocking(&err_r);
    let mut stderr = Vec::new();
    let status = loop {
        drain(&mut err_r, &mut stderr);
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => return Err(HookError::Wait(e)),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HookError::TimedOut {
                secs: h.timeout().unwrap_or_default(),
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    drain(&mut err_r, &mut stderr);
    if status.success() {
        return Ok(());
    }
    Err(HookError::Failed {
        status,
        said: String::from_utf8_lossy(&stderr).trim().to_string(),
    })
}

fn set_nonblocking(r: &std::io::PipeReader) {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    if let Ok(bits) = fcntl(r.as_fd(), FcntlArg::F_GETFL) {
        let flags = OFlag::from_bits_truncate(bits) | OFlag::O_NONBLOCK;
        let _ = fcntl(r.as_fd(), FcntlArg::F_SETFL(flags));
    }
}

/// Reads what is there, keeping the first `STDERR_KEPT` bytes.
fn drain(r: &mut std::io::PipeReader, kept: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        let room = STDERR_KEPT.saturating_sub(kept.len());
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
}

/// The monitor's later children start in the container's PID namespace (see the monitor);
/// while this lives, they start in the monitor's own, the host's, where hooks belong.
struct HostPids {
    back: Option<std::fs::File>,
}

impl HostPids {
    fn enter(host: &std::fs::File) -> Result<HostPids, StepError> {
        // Gone once the container's last process has ended: nothing to go back to then.
        let back = std::fs::File::open("/proc/self/ns/pid_for_children").ok();
        setns(host.as_fd(), CloneFlags::CLONE_NEWPID)
            .map_err(|e| StepError::new("host pid namespace for hooks", e))?;
        Ok(HostPids { back })
    }
}

impl Drop for HostPids {
    fn drop(&mut self) {
        if let Some(f) = self.back.take() {
            let _ = setns(f.as_fd(), CloneFlags::CLONE_NEWPID);
        }
    }
}

/// The hooks the monitor runs, with what their state needs; `None` from `new` when the spec
/// has none of them.
pub struct MonitorHooks {
    spec: Spec,
    host_pids: std::fs::File,
    id: String,
    bundle: std::path::PathBuf,
}

impl MonitorHooks {
    pub fn new(spec: &Spec, id: &str, bundle: &Path) -> Result<Option<MonitorHooks>, StepError> {
        let kinds = [
            Kind::Prestart,
            Kind::CreateRuntime,
            Kind::Poststart,
            Kind::Poststop,
        ];
        if kinds.iter().all(|k| of(spec, *k).is_empty()) {
            return Ok(None);
        }
        let host_pids = std::fs::File::open("/proc/self/ns/pid")
            .map_err(|e| StepError::new("host pid namespace for hooks", e))?;
        Ok(Some(MonitorHooks {
            spec: spec.clone(),
            host_pids,
            id: id.to_string(),
            bundle: bundle.to_path_buf(),
        }))
    }

    fn run(&self, kind: Kind, status: &str, pid: i32) -> Result<(), StepError> {
        if of(&self.spec, kind).is_empty() {
            return Ok(());
        }
        let _host = HostPids::enter(&self.host_pids)?;
        let state = State {
            oci_version: OCI_VERSION,
            id: &self.id,
            status,
            pid,
            bundle: &self.bundle,
            annotations: self.spec.annotations().as_ref(),
        };
        run(&self.spec, kind, &state)
    }

    /// `prestart` then `createRuntime`, while the init waits before `pivot_root`.
    pub fn before_pivot(&self, pid: i32) -> Result<(), StepError> {
        self.run(Kind::Prestart, "creating", pid)?;
        self.run(Kind::CreateRuntime, "creating", pid)
    }

    /// `poststart`: a failure is written to the monitor's log, the container keeps running.
    pub fn poststart(&self, pid: i32) {
        if let Err(e) = self.run(Kind::Poststart, "running", pid) {
            eprintln!("monitor: warning: {e}");
        }
    }

    /// `poststop`, once the container has ended: a failure is only logged.
    pub fn poststop(&self) {
        if let Err(e) = self.run(Kind::Poststop, "stopped", 0) {
            eprintln!("monitor: warning: {e}");
        }
    }
}

/// The runtime specification version of the state hooks read.
pub const OCI_VERSION: &str = "1.0.2";

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{HookBuilder, HooksBuilder, SpecBuilder};

    fn spec(hooks: Vec<Hook>) -> Spec {
        SpecBuilder::default()
            .hooks(HooksBuilder::default().poststop(hooks).build().unwrap())
            .build()
            .unwrap()
    }

    fn sh(script: &str, timeout: Option<i64>) -> Hook {
        let mut b = HookBuilder::default()
            .path("/bin/sh")
            .args(vec!["sh".to_string(), "-c".to_string(), script.to_string()])
            .env(vec!["HOOK_ENV=yes".to_string()]);
        if let Some(t) = timeout {
            b = b.timeout(t);
        }
        b.build().unwrap()
    }

    #[test]
    fn hooks_get_state_env_and_timeouts() {
        let dir = std::env::temp_dir().join(format!("crius-hooks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let state = State {
            oci_version: "1.0.2",
            id: "c1",
            status: "stopped",
            pid: 0,
            bundle: &dir,
            annotations: None,
        };
        let out = dir.join("out");
        let s = spec(vec![sh(
            &format!(
                "cat > {0}; echo \" $HOOK_ENV ${{HOME-unset}}\" >> {0}",
                out.display()
            ),
            None,
        )]);
        run(&s, Kind::Poststop, &state).unwrap();
        let got = std::fs::read_to_string(&out).unwrap();
        assert!(got.starts_with(r#"{"ociVersion":"1.0.2","id":"c1","status":"stopped""#));
        assert!(
            got.trim_end().ends_with("yes unset"),
            "only its own env: {got}"
        );
        assert!(run(&spec(vec![]), Kind::Poststart, &state).is_ok());

        let e = run(
            &spec(vec![sh("echo broken >&2; exit 3", None)]),
            Kind::Poststop,
            &state,
        )
        .unwrap_err();
        assert!(e.step.starts_with("poststop hook 0"), "{e}");
        assert!(e.detail.contains("broken") && e.detail.contains('3'), "{e}");
        let t = Instant::now();
        let e = run(&spec(vec![sh("sleep 30", Some(1))]), Kind::Poststop, &state).unwrap_err();
        assert!(e.detail.contains("timed out"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let loud = sh("head -c 1000000 /dev/zero >&2; exit 1", Some(20));
        let e = run(&spec(vec![loud]), Kind::Poststop, &state).unwrap_err();
        assert!(
            e.detail.len() < STDERR_KEPT + 100,
            "a full pipe does not hang it"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
