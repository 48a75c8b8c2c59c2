//! CRI-O as a bench peer: the release `hack/install-upstream.sh` builds (role `crio`, with its
//! `pinns`), on Debian's runc, as the containerd peers are, and Debian's conmon as its monitor.
//! Everything it would read from /etc (its config, registries.conf, the signature policy,
//! storage.conf) is written under the peer's directory and named on its command line; its
//! state is on the bench's tmpfs. Its pods keep PID namespace mode CONTAINER, so CRI-O makes no
//! infra container: it would give one an oom_score_adj of -998, which this machine refuses.
//! What it still leaves on the host goes once it has stopped (`Cleanup`): its pods' parent
//! cgroup (`CGROUP_PARENT`), c/image's blob-info cache under /var/lib/containers, and any
//! container or conmon a failed run left.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::peers::{self, Kind, Peer};

/// The cgroup CRI-O's pods are put under (it would use /crio, and leave it).
pub const CGROUP_PARENT: &str = "/crius-bench-crio";
const RUNC: &str = "/usr/sbin/runc";
const CONMON: &str = "/usr/bin/conmon";
/// Where c/image keeps its blob-info cache when run as root: CRI-O has no setting to move it.
const VAR_LIB: &str = "/var/lib/containers";
const CACHE_DIR: &str = "/var/lib/containers/cache";
const CACHE: &str = "blob-info-cache-v1.sqlite";

/// CRI-O on its own socket; none when it is not installed.
pub fn start(dir: &Path, run: &Path, registry: &str, pause: &str) -> Result<Option<Peer>> {
    let Some(daemon) = crate::upstream::find(Kind::Crio.role(), "crio")? else {
        return Ok(None);
    };
    for tool in [RUNC, CONMON] {
        if !Path::new(tool).exists() {
            bail!("crio needs {tool}: run hack/install-bench-deps.sh");
        }
    }
    let state = run.join(Kind::Crio.name());
    for d in [
        state.clone(),
        dir.join("crio.conf.d"),
        dir.join("registries.conf.d"),
        // big_files_temporary_dir: CRI-O does not make it.
        dir.join("tmp"),
    ] {
        std::fs::create_dir_all(d)?;
    }
    let socket = dir.join("crio.sock");
    let (cni_conf, cni_bin) = peers::cni_dirs(dir)?;
    let cfg = dir.join("crio.conf");
    std::fs::write(
        &cfg,
        config(dir, &state, &socket, &daemon, pause, &cni_conf, &cni_bin),
    )?;
    std::fs::write(
        dir.join("registries.conf"),
        format!(
            "unqualified-search-registries = []\n[[registry]]\nlocation = \"{registry}\"\ninsecure = true\n"
        ),
    )?;
    std::fs::write(
        dir.join("policy.json"),
        r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
    )?;
    // Named here so that c/storage neither reads /etc/containers/storage.conf nor picks a
    // driver (or a default root) of its own.
    std::fs::write(
        dir.join("storage.conf"),
        format!(
            "[storage]\ndriver = \"overlay\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            dir.join("root").display(),
            state.join("storage").display(),
        ),
    )?;
    // Made before the daemon starts, so a start that fails is cleaned after as well.
    let cleanup = Cleanup::before_start(&state);
    let mut cmd = Command::new(&daemon);
    cmd.env("CONTAINERS_STORAGE_CONF", dir.join("storage.conf"))
        .arg("--config")
        .arg(&cfg)
        .arg("--config-dir")
        .arg(dir.join("crio.conf.d"))
        .arg("--registries-conf")
        .arg(dir.join("registries.conf"))
        .arg("--registries-conf-dir")
        .arg(dir.join("registries.conf.d"))
        .args(["--log-level", "warn"]);
    let mut peer = peers::spawn(
        Kind::Crio,
        &mut cmd,
        &dir.join("crio.log"),
        socket,
        cni_conf,
    )
    .with_context(|| format!("starting {}", daemon.display()))?;
    peer.crio = Some(cleanup);
    Ok(Some(peer))
}

/// crio.conf: every path under the peer's directory or its state, runc with conmon as the only
/// runtime, NRI on (as containerd 2 ships it: the nri-logger rows connect a plugin to it).
fn config(
    dir: &Path,
    state: &Path,
    socket: &Path,
    daemon: &Path,
    pause: &str,
    cni_conf: &Path,
    cni_bin: &Path,
) -> String {
    let d = dir.display();
    let s = state.display();
    format!(
        r#"[crio]
root = "{d}/root"
runroot = "{s}/storage"
storage_driver = "overlay"
log_dir = "{d}/logs"
version_file = "{s}/version"
version_file_persist = "{d}/lib/version"
clean_shutdown_file = "{d}/lib/clean.shutdown"

[crio.api]
listen = "{socket}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
decryption_keys_path = "{d}/keys"
irqbalance_config_file = "{d}/irqbalance"
irqbalance_config_restore_file = "disable"
cdi_spec_dirs = ["{d}/cdi"]
hooks_dir = ["{d}/hooks.d"]
container_exits_dir = "{exits}"
container_attach_socket_dir = "{s}"
namespaces_dir = "{s}/ns"
pinns_path = "{pinns}"
enable_criu_support = false

[crio.runtime.runtimes.runc]
runtime_path = "{RUNC}"
runtime_type = "oci"
runtime_root = "{runc_root}"
monitor_path = "{CONMON}"
monitor_cgroup = "pod"
monitor_env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]

# The built-in crun handler, dropped by a path that does not exist: Debian 12's crun cannot run
# CRI-O 1.36's specs, and probing it would leave /run/crun.
[crio.runtime.runtimes.crun]
runtime_path = "{d}/no-crun"

[crio.image]
namespaced_auth_dir = "{d}/auth"
pause_image = "{pause}"
pause_command = ""
signature_policy = "{d}/policy.json"
signature_policy_dir = "{d}/policies"
big_files_temporary_dir = "{d}/tmp"

[crio.network]
network_dir = "{cni_conf}"
plugin_dirs = ["{cni_bin}"]

[crio.metrics]
enable_metrics = false

[crio.nri]
enable_nri = true
nri_listen = "{d}/nri/nri.sock"
nri_plugin_dir = "{d}/nri/plugins"
nri_plugin_config_dir = "{d}/nri/conf.d"
"#,
        socket = socket.display(),
        exits = exits(state).display(),
        pinns = daemon.with_file_name("pinns").display(),
        runc_root = runc_root(state).display(),
        cni_conf = cni_conf.display(),
        cni_bin = cni_bin.display(),
    )
}

/// Where conmon writes exit codes: every conmon of this daemon names it.
fn exits(state: &Path) -> PathBuf {
    state.join("exits")
}

fn runc_root(state: &Path) -> PathBuf {
    state.join("runc")
}

/// A cgroup and the ones below it, the deepest first (a cgroup is removed with rmdir, and only
/// when it has neither processes nor children).
fn remove_cgroup(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The cache and sqlite's side files; it is opened for each pull, so none is open between them.
fn remove_blob_info_cache() {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let _ = std::fs::remove_file(Path::new(CACHE_DIR).join(format!("{CACHE}{suffix}")));
    }
}

/// What CRI-O leaves on the host, removed when this is dropped (after the daemon has stopped).
pub struct Cleanup {
    exits: PathBuf,
    runc_root: PathBuf,
    /// /var/lib/containers, or its cache directory, was not there before the bench.
    made_var_lib: bool,
    made_cache_dir: bool,
}

impl Cleanup {
    fn before_start(state: &Path) -> Cleanup {
        let cleanup = Cleanup {
            exits: exits(state),
            runc_root: runc_root(state),
            made_var_lib: !Path::new(VAR_LIB).exists(),
            made_cache_dir: !Path::new(CACHE_DIR).exists(),
        };
        // Cold pulls find nothing a run before this one learnt about the same layers.
        remove_blob_info_cache();
        // CRI-O reads the parent's memory limit at each RunPodSandbox and warns when the cgroup
        // is not there yet; the default parent (the root) always is.
        let memory = Path::new("/sys/fs/cgroup/memory");
        let base = if memory.is_dir() {
            memory
        } else {
            Path::new("/sys/fs/cgroup")
        };
        let _ = std::fs::create_dir(base.join(CGROUP_PARENT.trim_start_matches('/')));
        cleanup
    }

    /// This daemon's conmons: they are reparented to init, so they are found by their exit
    /// directory, not as the daemon's children.
    pub fn monitors(&self, procs: &[(i32, i32, String, String)]) -> Vec<i32> {
        let mark = format!("--exit-dir {}", self.exits.display());
        procs
            .iter()
            .filter(|p| p.2 == "conmon" && p.3.contains(&mark))
            .map(|p| p.0)
            .collect()
    }

    /// Containers a failed run left (none after a clean one: its pods were removed), then the
    /// conmons that watched them.
    fn end_containers(&self) {
        let runc = || {
            let mut c = Command::new(RUNC);
            c.arg("--root").arg(&self.runc_root);
            c
        };
        if self.runc_root.is_dir() {
            let ids = runc()
                .args(["list", "-q"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for id in ids.split_whitespace() {
                let _ = runc().args(["delete", "--force", id]).status();
            }
        }
        let start = Instant::now();
        loop {
            let left = self.monitors(&peers::processes());
            if left.is_empty() {
                return;
            }
            if start.elapsed() > Duration::from_secs(5) {
                for pid in left {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.end_containers();
        for dir in super::sweep::cgroup_copies(CGROUP_PARENT) {
            remove_cgroup(&dir);
        }
        remove_blob_info_cache();
        if self.made_var_lib {
            let _ = std::fs::remove_dir_all(VAR_LIB);
        } else if self.made_cache_dir {
            let _ = std::fs::remove_dir(CACHE_DIR);
        }
    }
}
