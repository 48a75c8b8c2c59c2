//! runtime: the synchronous process side of crius: no tokio, no threads. It holds the helpers the
//! daemon re-executes (`crius pause`, `crius monitor`, which also runs exec'd commands and
//! serves attachments to the container's stdio, whose protocol is `attach`), the
//! container init that runs between fork and exec (namespaces, mounts, pivot_root, credentials,
//! capabilities, seccomp, LSM labels), cgroup v2 and its device controller, the CRI log writer,
//! and process identities that survive pid reuse. It reads OCI runtime specs (`oci-spec`) and
//! small JSON records; it uses `sys` for the few raw system calls, `atomic` for the exit record
//! and `records` for timestamps.

pub mod attach;
pub mod cgroup;
pub mod devices;
pub mod exe;
pub mod hooks;
pub mod init;
pub mod logs;
pub mod monitor;
pub mod mounts;
pub mod pause;
pub mod process;
pub mod procfs;
pub mod seccomp;
pub mod selinux;
pub mod step;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use process::ProcessId;

/// This very executable, even if the file was replaced since (helpers run from `exe::helper`).
pub const SELF_EXE: &str = "/proc/self/exe";

/// A namespace to join, by kind (`net`, `ipc`, `uts`, `pid`) and handle path.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct JoinNamespace {
    pub kind: String,
    pub path: PathBuf,
}

/// The monitor's socket in a bundle.
pub const MONITOR_SOCKET: &str = "monitor.sock";

/// An environment variable whose value is not UTF-8, which config.json (JSON text) cannot
/// hold: the spec has its lossy form, which these bytes replace when the process is exec'd (if
/// nothing, an NRI plugin say, changed the variable since).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RawEnv {
    pub key: String,
    pub value: Vec<u8>,
}

/// What `crius monitor` needs beyond the OCI spec (`<bundle>/config.json`); in
/// `<bundle>/monitor.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MonitorConfig {
    pub id: String,
    /// The pod's log directory and the container's log path relative to it; no log when absent.
    pub log_dir: Option<PathBuf>,
    pub log_path: Option<PathBuf>,
    pub stdin: bool,
    pub stdin_once: bool,
    pub tty: bool,
    /// Namespaces of the pod (or the host) the container joins.
    pub join: Vec<JoinNamespace>,
    /// Whether the container gets its own PID namespace.
    pub new_pid_ns: bool,
    /// Where the exit record is written.
    pub exit_file: PathBuf,
    /// The container's cgroup (absolute), joined before anything else; none without cgroup v2.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// The container's cgroup v1 devices cgroup (absolute) on a node without v2, joined with
    /// it by the init, exec'd commands and a restore.
    #[serde(default)]
    pub devices_cgroup: Option<PathBuf>,
    /// The cgroup is a systemd scope the daemon makes around the init: the monitor reports
    /// `Forked` and the init waits for the daemon's word (see `await_placement`).
    #[serde(default)]
    pub placed: bool,
    /// The compiled seccomp filter of the container and its exec'd commands.
    #[serde(default)]
    pub seccomp: Option<SeccompFilter>,
    /// The pod's user namespace (its handle): joined first, with every bind mount idmapped
    /// into it.
    #[serde(default)]
    pub userns: Option<PathBuf>,
    /// Restore the container from a CRIU checkpoint instead of starting its process.
    #[serde(default)]
    pub restore: Option<RestoreConfig>,
    /// The environment's values that are not UTF-8, for the container's process and the
    /// commands exec'd in it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw_env: Vec<RawEnv>,
}

/// What `criu restore` needs to bring a checkpointed container back in a new pod.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreConfig {
    /// The CRIU images of the checkpoint.
    pub images: PathBuf,
    /// CRIU's log and the pid file it leaves (the restored init's pid).
    pub log: PathBuf,
    pub pid_file: PathBuf,
    /// The checkpoint's external mounts by key, each with its source for the new container.
    pub mounts: Vec<(String, PathBuf)>,
    /// The checkpoint's external network namespace (its key) and the new pod's.
    pub net: Option<(String, PathBuf)>,
    /// The checkpointed process's stdin, stdout and stderr as CRIU names them (`pipe:[INODE]`):
    /// the new container's pipes are handed in their place.
    pub stdio: Vec<String>,
}

/// One range of a user namespace's ID map: `size` IDs from `container_id` inside are `host_id`
/// and up outside.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IdMapping {
    pub container_id: u32,
    pub host_id: u32,
    pub size: u32,
}

impl IdMapping {
    /// The host ID of a container ID, if mapped.
    pub fn host(&self, id: u32) -> Option<u32> {
        (id >= self.container_id && id - self.container_id < self.size)
            .then(|| self.host_id + (id - self.container_id))
    }

    /// As `/proc/PID/uid_map` takes it.
    pub fn line(&self) -> String {
        format!("{} {} {}\n", self.container_id, self.host_id, self.size)
    }
}

/// A compiled seccomp program (a `sock_filter` array in native byte order) and its flags.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeccompFilter {
    pub program: PathBuf,
    pub flags: u32,
}

/// The first line `crius monitor` writes to its stdout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartReport {
    /// Only with `placed`: the init is forked and waits to be put in its scope.
    Forked {
        pid: i32,
    },
    Started {
        pid: i32,
        start_time: u64,
        started_at: i64,
        /// How long the monitor took to set up before forking the init, and the init until
        /// it exec'd, in µs: the daemon's step profile of a start (older monitors omit them).
        #[serde(default)]
        setup_us: u64,
        #[serde(default)]
        init_us: u64,
    },
    Failed {
        message: String,
    },
}

/// How a container ended, written atomically by its monitor.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExitRecord {
    /// The exit status as kubelet reports it: the code, or 128 + the signal.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub finished_at: i64,
    pub oom_killed: bool,
}

/// What `crius pause` is asked to set up.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PauseConfig {
    pub new_net: bool,
    pub new_ipc: bool,
    pub new_uts: bool,
    pub new_pid: bool,
    pub hostname: Option<String>,
    /// Sysctls applied inside the new namespaces, `key` with dots or slashes.
    pub sysctls: Vec<(String, String)>,
    /// The cgroup (absolute path) the pause process moves itself into first.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    /// The cgroup is a systemd scope the daemon makes around this process: wait for its word
    /// first (see `await_placement`).
    #[serde(default)]
    pub placed: bool,
    /// The pod's SELinux label: taken on by the pod's process when it execs, once the setup
    /// (done under the runtime's own label) is over.
    #[serde(default)]
    pub selinux_label: Option<String>,
    /// A new user namespace with these maps, made before every other namespace so that it owns
    /// them; the pause process becomes its root.
    #[serde(default)]
    pub uid_map: Vec<IdMapping>,
    #[serde(default)]
    pub gid_map: Vec<IdMapping>,
    /// A configured pause image: once the namespaces are made, the pod's holder moves into its
    /// root filesystem and execs its command instead of sleeping itself.
    #[serde(default)]
    pub image: Option<PauseImage>,
}

/// The root filesystem and command of a configured pause image.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PauseImage {
    /// The image's mounted root filesystem.
    pub rootfs: PathBuf,
    /// Entrypoint followed by command, as the image config gives them.
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub uid: u32,
    pub gid: u32,
    pub cwd: String,
}

/// The line `crius pause` writes when its namespaces are ready.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PauseReport {
    Ready {
        pid: i32,
        start_time: u64,
    },
    Failed {
        message: String,
    },
    /// The kernel refused a sysctl's value (`net.core.somaxconn=-1`): the caller's error.
    Refused {
        sysctl: String,
        message: String,
    },
}

/// A command to run inside a running container (ExecSync), sent to its monitor's socket
/// (`<bundle>/monitor.sock`) together with the command's stdout and stderr as SCM_RIGHTS.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecRequest {
    pub args: Vec<String>,
    /// Kill the command after this long (0: no limit).
    pub timeout_ms: u64,
    /// A stdin pipe comes with the request (after stdout and stderr); else /dev/null.
    #[serde(default)]
    pub stdin: bool,
    /// The command gets a terminal made inside the container (its own devpts): no descriptors
    /// come with the request, and the terminal's master goes back on the connection first, as
    /// `PTY_MESSAGE` with the descriptor.
    #[serde(default)]
    pub tty: bool,
}

/// What the exec'd command sends ahead of the report when it made a terminal: these bytes,
/// carrying the terminal's master (SCM_RIGHTS).
pub const PTY_MESSAGE: &[u8; 4] = b"pty\n";

/// The monitor's answer on the same connection once the command has ended.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ExecReport {
    pub exit_code: i32,
    pub timed_out: bool,
    pub error: Option<String>,
    /// The command names no program the container can run (the caller's to fix).
    #[serde(default)]
    pub bad_command: bool,
}

pub use crate::records::now_nanos;

/// The exit status kubelet expects: the code, or 128 + signal number.
pub fn exit_code(status: nix::sys::wait::WaitStatus) -> Option<(i32, Option<i32>)> {
    use nix::sys::wait::WaitStatus;
    match status {
        WaitStatus::Exited(_, code) => Some((code, None)),
        WaitStatus::Signaled(_, sig, _) => Some((128 + sig as i32, Some(sig as i32))),
        _ => None,
    }
}

/// A path to `name` inside `dir` short enough for a unix socket address (108 bytes), however
/// long `dir` is: `/proc/self/fd/N/name` through a handle on the directory, which the caller
/// keeps open while it binds or connects.
pub fn short_socket_path(
    dir: &std::path::Path,
    name: &str,
) -> std::io::Result<(std::os::fd::OwnedFd, PathBuf)> {
    use std::os::fd::AsRawFd;
    let fd: std::os::fd::OwnedFd = nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let path = PathBuf::from(format!("/proc/self/fd/{}/{name}", fd.as_raw_fd()));
    Ok((fd, path))
}

/// What the daemon writes on a helper's stdin once its record of the pod or container the
/// helper started is durable.
pub const KEPT: &[u8] = b"kept\n";

/// Waits, after the start report, for the daemon's word that a record now owns what this helper
/// started (`KEPT`). End of file instead means the daemon died before writing that record: no
/// one would ever stop this pod or container, so the helper must end it. Stdin is /dev/null
/// after.
pub fn await_kept() -> bool {
    use std::io::BufRead;
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = crate::sys::dup_to(&null, 0, false);
    }
    read.is_ok() && line.as_bytes() == KEPT
}

/// Waits for the daemon's word that systemd has put a process in its scope: a line `go` on
/// stdin (anything else, or the daemon going away, means it could not). The daemon's word that
/// it recorded the helper (`await_kept`) comes on stdin after it.
pub fn await_placement() -> Result<(), step::StepError> {
    use std::io::BufRead;
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    match (read, line.trim()) {
        (Ok(_), "go") => Ok(()),
        (Err(e), _) => Err(step::StepError::new(
            "waiting to be placed in the cgroup",
            e,
        )),
        (Ok(_), "") => Err(step::StepError::new(
            "placing the process in its cgroup",
            "the daemon went away first",
        )),
        (Ok(_), why) => Err(step::StepError::new("not placed in the cgroup", why)),
    }
}
