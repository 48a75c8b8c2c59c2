//! container: containers of pod sandboxes. CreateContainer resolves the image and user, mounts the
//! rootfs (overlay of the image's snapshots plus a fresh writable layer under
//! `<root>/containers/<id>`) and writes the bundle (`config.json`, the OCI spec; `monitor.json`)
//! under `<state>/containers/<id>`. StartContainer runs `crius monitor` on the bundle; the
//! monitor owns the container from then on and leaves `exit.json` when it ends, which is the one
//! source of exit truth for this daemon and any later one. Stop, remove, status, list, ExecSync
//! (through `crius nsexec`) and log reopening are here too. Uses `image`, `sandbox`, `runtime`.

pub mod spec;
pub mod stats;
pub mod user;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use nix::mount::{MntFlags, MsFlags, umount2};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt};

use crate::atomic;
use crate::content::Digest;
use crate::image::{self, ImageService};
use crate::records::{Entry, Lookup, Registry, now_nanos, random_id};
use crate::runtime::cgroup::{self, Cgroup};
use crate::runtime::devices;
use crate::runtime::{
    self, ExecReport, ExecRequest, ExitRecord, JoinNamespace, MonitorConfig, ProcessId,
    StartReport, logs,
};
use crate::sandbox::{self, NS_CONTAINER, NS_NODE, NS_POD, SandboxService, wait_for_exit};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("container {id:?} not found")]
    NotFound { id: String },
    #[error("container {id:?} is ambiguous: {count} containers start with it")]
    Ambiguous { id: String, count: usize },
    #[error("container name {name:?} is already used by container {id}")]
    NameReserved { name: String, id: String },
    #[error("image {image:?} is not present; pull it first")]
    ImageNotFound { image: String },
    #[error("container {id} is {state}, not {want}")]
    WrongState {
        id: String,
        state: &'static str,
        want: &'static str,
    },
    #[error("starting container {id}: {message}")]
    Start { id: String, message: String },
    #[error("exec in container {id}: {message}")]
    Exec { id: String, message: String },
    #[error("exec in container {id}: timed out after {seconds} s")]
    ExecTimeout { id: String, seconds: i64 },
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    Image(#[from] image::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

impl From<spec::Invalid> for Error {
    fn from(i: spec::Invalid) -> Error {
        Error::Invalid {
            field: i.field,
            reason: i.reason,
        }
    }
}

const NS_TARGET: i32 = cri::NamespaceMode::Target as i32;
const CREATED: i32 = cri::ContainerState::ContainerCreated as i32;
const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

fn state_name(s: i32) -> &'static str {
    match s {
        CREATED => "created",
        RUNNING => "running",
        EXITED => "exited",
        _ => "unknown",
    }
}

/// Exec output beyond this is dropped (probes read 10 KiB; this protects the daemon).
const MAX_EXEC_OUTPUT: usize = 16 << 20;
/// How long output is still read after an exec'd command ended.
const EXEC_DRAIN: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub sandbox_id: String,
    pub config: cri::ContainerConfig,
    pub image_ref: String,
    pub image_id: String,
    pub top_chain: Option<Digest>,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub state: i32,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub init: Option<ProcessId>,
    pub monitor: Option<ProcessId>,
    /// The init's mount namespace inode: every process of the container shares it.
    pub mnt_ns: Option<u64>,
    pub own_pid_ns: bool,
    pub log_path: Option<PathBuf>,
    pub stop_signal: String,
    pub user: (u32, u32, Vec<u32>),
    /// The container's cgroup; none without cgroup v2.
    #[serde(default)]
    pub cgroup: Option<Cgroup>,
}

impl Record {
    fn name_key(&self) -> String {
        let m = self.config.metadata.clone().unwrap_or_default();
        format!("{}/{}/{}", self.sandbox_id, m.name, m.attempt)
    }
}

struct Inner {
    state: PathBuf,
    layers: PathBuf,
    images: ImageService,
    sandboxes: SandboxService,
    records: Registry<Record>,
    samples: stats::Samples,
    /// Where the root (persistent) state lives, for the default AppArmor profile.
    root: PathBuf,
    filters: sandbox::security::Filters,
}

/// The confinement a container gets beyond its spec: a compiled seccomp filter and an AppArmor
/// profile.
struct Confinement {
    seccomp: Option<Arc<sandbox::security::Filter>>,
    apparmor: Option<String>,
    selinux: Option<sandbox::security::SelinuxLabels>,
}

#[derive(Clone)]
pub struct ContainerService {
    inner: Arc<Inner>,
}

/// Files of one container.
struct Bundle {
    dir: PathBuf,
    layer: PathBuf,
}

impl Bundle {
    fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }
    fn record(&self) -> PathBuf {
        self.dir.join("state.json")
    }
    fn exit(&self) -> PathBuf {
        self.dir.join("exit.json")
    }
}

fn lookup_err(id: &str, l: Lookup) -> Error {
    match l {
        Lookup::Empty => invalid("container_id", "is required"),
        Lookup::NotFound => Error::NotFound { id: id.to_string() },
        Lookup::Ambiguous(count) => Error::Ambiguous {
            id: id.to_string(),
            count,
        },
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
    name.parse::<nix::sys::signal::Signal>()
        .ok()
        .map(|s| s as i32)
}

/// A container of a pod with its own user namespace: the container may only restate the pod's
/// namespace, and cannot be privileged or share mounts back to the host.
fn check_userns(config: &cri::ContainerConfig, sandbox: &sandbox::Record) -> Result<(), Error> {
    const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";
    let sc = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    if let Some(u) = sc
        .and_then(|s| s.namespace_options.as_ref())
        .and_then(|n| n.userns_options.as_ref())
    {
        let same = match (&sandbox.userns, u.mode) {
            (None, NS_NODE) => u.uids.is_empty() && u.gids.is_empty(),
            (Some(p), NS_POD) => {
                let one = |m: &[cri::IdMapping], want: &runtime::IdMapping| {
                    m.is_empty()
                        || (m.len() == 1
                            && m[0].container_id == want.container_id
                            && m[0].host_id == want.host_id
                            && m[0].length == want.size)
                };
                one(&u.uids, &p.uids) && one(&u.gids, &p.gids)
            }
            _ => false,
        };
        if !same {
            return Err(invalid(
                FIELD,
                "a container's user namespace must be its pod's (same mode and maps)",
            ));
        }
    }
    if sandbox.userns.is_none() {
        return Ok(());
    }
    if sc.is_some_and(|s| s.privileged) {
        return Err(invalid(
            "config.linux.security_context.privileged",
            "a container in a user namespace cannot be privileged",
        ));
    }
    for (i, m) in config.mounts.iter().enumerate() {
        if m.propagation == cri::MountPropagation::PropagationBidirectional as i32 {
            return Err(invalid(
                format!("config.mounts[{i}].propagation"),
                "Bidirectional propagation cannot cross a user namespace",
            ));
        }
    }
    Ok(())
}

/// Whether pods here can have user namespaces: the kernel must idmap the mounts of overlayfs
/// layers and tmpfs (6.3 and later).
pub fn user_namespaces() -> bool {
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 3)
}

/// Whether containers here can have recursively read-only mounts.
pub fn recursive_read_only_mounts() -> bool {
    crate::runtime::mounts::recursive_read_only_supported()
}

impl ContainerService {
    pub fn open(
        root: &Path,
        state: &Path,
        images: ImageService,
        sandboxes: SandboxService,
    ) -> Result<ContainerService, Error> {
        let svc = ContainerService {
            inner: Arc::new(Inner {
                state: state.join("containers"),
                layers: root.join("containers"),
                images,
                sandboxes,
                records: Registry::default(),
                samples: stats::Samples::default(),
                root: root.to_path_buf(),
                filters: sandbox::security::Filters::default(),
            }),
        };
        for d in [&svc.inner.state, &svc.inner.layers] {
            std::fs::create_dir_all(d).map_err(io_err(d))?;
        }
        svc.recover()?;
        for c in svc.inner.sandboxes.image_chains() {
            svc.inner.images.hold(&c);
        }
        Ok(svc)
    }

    /// Removes cgroups crius made that no pod or container owns any longer (a state directory
    /// lost, a crash between making a cgroup and recording it), killing whatever runs in them:
    /// every pod cgroup under crius's own parent, and unknown container cgroups (named by a
    /// container ID) below any pod's. Kubelet's own cgroups are kubelet's.
    pub async fn remove_orphan_cgroups(&self) {
        let policy = self.inner.sandboxes.cgroups().clone();
        let Some(h) = &policy.hierarchy else {
            return;
        };
        // Never the root: everything there is someone else's.
        let own = policy.own_parent();
        if own.is_empty() {
            return;
        }
        let Ok(parent) = h.cgroup(&own) else {
            return;
        };
        let mut pods = std::collections::HashSet::new();
        let mut inner = std::collections::HashSet::new();
        for r in self.inner.sandboxes.records().await {
            if let Some(c) = &r.cgroup {
                pods.insert(c.path.clone());
            }
            if let Some(c) = &r.pause_cgroup {
                inner.insert(c.path.clone());
            }
        }
        let containers = self.inner.records.all();
        for c in containers {
            if let Some(cg) = &c.lock().await.cgroup {
                inner.insert(cg.path.clone());
            }
        }
        let subdirs = |p: &Path| -> Vec<PathBuf> {
            std::fs::read_dir(p)
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path())
                        .collect()
                })
                .unwrap_or_default()
        };
        let systemd = self.inner.sandboxes.systemd();
        let remove = |path: PathBuf, what: &'static str| async move {
            tracing::info!(cgroup = %path.display(), "removing an orphaned {what} cgroup");
            if let Some(sd) = systemd
                && let Some((unit, _)) = crate::systemd::unit_and_slice(&path)
                && let Err(e) = sd.stop(&unit).await
            {
                tracing::warn!(unit, error = %e, "stopping an orphaned systemd unit");
            }
            let cg = Cgroup {
                root: h.root.clone(),
                path: path.clone(),
            };
            if let Err(e) = cg.remove() {
                tracing::warn!(cgroup = %path.display(), error = %e, "removing an orphaned cgroup");
            }
        };
        for dir in subdirs(&parent.path) {
            if !pods.contains(&dir) {
                remove(dir, "pod").await;
            }
        }
        // A container's (or pause process's) leaf: its ID, or `crius-<ID>.scope` under systemd.
        let is_leaf = |p: &Path| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                let id = match n
                    .strip_prefix("crius-")
                    .and_then(|n| n.strip_suffix(".scope"))
                {
                    Some(id) if policy.systemd => id,
                    _ => n,
                };
                id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
            })
        };
        for pod in &pods {
            for dir in subdirs(pod) {
                if is_leaf(&dir) && !inner.contains(&dir) {
                    remove(dir, "container").await;
                }
            }
        }
    }

    fn bundle(&self, id: &str) -> Bundle {
        Bundle {
            dir: self.inner.state.join(id),
            layer: self.inner.layers.join(id),
        }
    }

    /// Reads back every container; exits that happened while no daemon ran are picked up from
    /// their exit records. Writable layers without a record (after a reboot) are removed.
    fn recover(&self) -> Result<(), Error> {
        let dir = &self.inner.state;
        let mut known = std::collections::HashSet::new();
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let id = entry.file_name().to_string_lossy().into_owned();
            let b = self.bundle(&id);
            let record = atomic::read_json::<Record>(&b.record()).ok().flatten();
            let Some(mut r) = record else {
                tracing::info!(id, "removing an incomplete container");
                remove_files(&b);
                continue;
            };
            if r.state == RUNNING {
                self.sync_exit(&mut r);
                if r.state == RUNNING {
                    let watched = r
                        .monitor
                        .filter(|m| m.alive())
                        .or(r.init.filter(|i| i.alive()));
                    match watched {
                        Some(p) => self.watch(r.id.clone(), p),
                        None => {
                            r.state = EXITED;
                            r.exit_code = 255;
                            r.finished_at = now_nanos();
                            r.reason = "Unknown".into();
                            r.message =
                                "the container's monitor ended without an exit record".into();
                            let _ = umount2(&b.rootfs(), MntFlags::MNT_DETACH);
                            let _ = atomic::write_json(&b.record(), &r);
                        }
                    }
                }
            }
            if let Some(c) = &r.top_chain {
                self.inner.images.hold(c);
            }
            known.insert(r.id.clone());
            let _ = self.inner.records.reserve(&r.name_key(), &r.id);
            self.inner.records.insert(r.id.clone(), r);
        }
        let layers = &self.inner.layers;
        for entry in std::fs::read_dir(layers).map_err(io_err(layers))? {
            let entry = entry.map_err(io_err(layers))?;
            let id = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&id) {
                tracing::info!(id, "removing the writable layer of a forgotten container");
                if let Err(e) = runtime::mounts::remove_tree(&entry.path()) {
                    tracing::warn!(id, error = %e, "removing the writable layer");
                }
            }
        }
        Ok(())
    }

    pub fn resolve(&self, id: &str) -> Result<String, Error> {
        self.inner
            .records
            .resolve(id)
            .map_err(|l| lookup_err(id, l))
    }

    fn entry(&self, id: &str) -> Result<Entry<Record>, Error> {
        self.inner.records.get(id).map_err(|l| lookup_err(id, l))
    }

    /// Applies `exit.json` to a running container's record (and unmounts its rootfs).
    fn sync_exit(&self, r: &mut Record) {
        if r.state != RUNNING {
            return;
        }
        let b = self.bundle(&r.id);
        let Ok(Some(exit)) = atomic::read_json::<ExitRecord>(&b.exit()) else {
            return;
        };
        r.state = EXITED;
        r.exit_code = exit.exit_code;
        r.finished_at = exit.finished_at;
        r.reason = if exit.oom_killed {
            "OOMKilled".into()
        } else if exit.exit_code == 0 {
            "Completed".into()
        } else {
            "Error".into()
        };
        if let Err(e) = umount2(&b.rootfs(), MntFlags::MNT_DETACH)
            && e != nix::errno::Errno::EINVAL
            && e != nix::errno::Errno::ENOENT
        {
            tracing::warn!(id = r.id, error = %e, "unmounting rootfs");
        }
        if let Err(e) = atomic::write_json(&b.record(), &*r) {
            tracing::warn!(id = r.id, error = %e, "saving container record");
        }
    }

    /// Records the exit as soon as the monitor (or, without one, the init) ends.
    fn watch(&self, id: String, process: ProcessId) {
        let me = self.clone();
        tokio::spawn(async move {
            while !wait_for_exit(process, Duration::from_secs(3600)).await {}
            if let Ok(entry) = me.entry(&id) {
                let mut r = entry.lock().await;
                me.sync_exit(&mut r);
                if r.state == RUNNING && r.monitor == Some(process) {
                    // A monitor that died without a record: the container's end is unknown.
                    r.state = EXITED;
                    r.exit_code = 255;
                    r.finished_at = now_nanos();
                    r.reason = "Unknown".into();
                    r.message = "the container's monitor ended without an exit record".into();
                    let b = me.bundle(&r.id);
                    let _ = umount2(&b.rootfs(), MntFlags::MNT_DETACH);
                    let _ = atomic::write_json(&b.record(), &*r);
                }
            }
        });
    }

    pub async fn create(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        _sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String, Error> {
        let meta = config
            .metadata
            .as_ref()
            .ok_or_else(|| invalid("config.metadata", "is required"))?;
        if meta.name.is_empty() {
            return Err(invalid("config.metadata.name", "is required"));
        }
        let sandbox = self.inner.sandboxes.get(sandbox_id).await?;
        if !sandbox.ready {
            return Err(sandbox::Error::NotReady {
                id: sandbox.id.clone(),
            }
            .into());
        }
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if image_name.is_empty() {
            return Err(invalid("config.image.image", "is required"));
        }
        let image = self
            .inner
            .images
            .lookup(&image_name)?
            .ok_or_else(|| Error::ImageNotFound {
                image: image_name.clone(),
            })?;
        let log_path = if config.log_path.is_empty() || sandbox.config.log_directory.is_empty() {
            None
        } else {
            let dir = Path::new(&sandbox.config.log_directory);
            if !dir.is_absolute() {
                return Err(invalid(
                    "sandbox_config.log_directory",
                    format!("{:?} must be absolute", sandbox.config.log_directory),
                ));
            }
            logs::check_relative(Path::new(&config.log_path))
                .map_err(|e| invalid("config.log_path", format!("{:?} {e}", config.log_path)))?;
            Some(dir.join(&config.log_path))
        };
        spec::cri_mounts(&config)?;
        let sc = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref());
        let ns = sc
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let target_pid = if ns.pid == cri::NamespaceMode::Target as i32 {
            Some(self.target_pid_ns(&ns.target_id, &sandbox.id).await?)
        } else {
            None
        };
        let confinement = self.confinement(sc, sandbox.selinux.as_ref())?;
        check_userns(&config, &sandbox)?;

        let id = random_id().map_err(io_err(Path::new("getrandom")))?;
        let key = format!("{}/{}/{}", sandbox.id, meta.name, meta.attempt);
        if let Err(existing) = self.inner.records.reserve(&key, &id) {
            return Err(Error::NameReserved {
                name: format!(
                    "{} (attempt {}) in pod {}",
                    meta.name, meta.attempt, sandbox.id
                ),
                id: existing,
            });
        }
        let b = self.bundle(&id);
        let hold = image.top_chain().cloned();
        if let Some(c) = &hold {
            self.inner.images.hold(c);
        }
        let result = self
            .prepare(
                &id,
                &b,
                &config,
                &sandbox,
                &image,
                log_path,
                &confinement,
                target_pid,
            )
            .await;
        match result {
            Ok(record) => {
                self.inner.records.insert(id.clone(), record);
                Ok(id)
            }
            Err(e) => {
                remove_files(&b);
                if let Some(pod) = &sandbox.cgroup {
                    let cg = Cgroup {
                        root: pod.root.clone(),
                        path: pod.path.join(self.inner.sandboxes.cgroups().leaf(&id)),
                    };
                    if cg.path.exists()
                        && let Err(e) = cg.remove()
                    {
                        tracing::warn!(cgroup = %cg.path.display(), error = %e, "removing cgroup");
                    }
                }
                if let Some(c) = &hold {
                    self.inner.images.release(c);
                }
                self.inner.records.release(&key);
                Err(e)
            }
        }
    }

    /// The PID namespace of a running container of the same pod, for TARGET mode.
    async fn target_pid_ns(&self, target: &str, pod: &str) -> Result<PathBuf, Error> {
        const FIELD: &str = "config.linux.security_context.namespace_options.target_id";
        if target.is_empty() {
            return Err(invalid(
                FIELD,
                "TARGET mode needs the target container's ID",
            ));
        }
        let entry = self
            .entry(target)
            .map_err(|e| invalid(FIELD, e.to_string()))?;
        let r = entry.lock().await;
        if r.sandbox_id != pod {
            return Err(invalid(
                FIELD,
                format!("container {} is in another pod sandbox", r.id),
            ));
        }
        match r.init {
            Some(p) if r.state == RUNNING && p.alive() => {
                Ok(PathBuf::from(format!("/proc/{}/ns/pid", p.pid)))
            }
            _ => Err(invalid(FIELD, format!("container {} is not running", r.id))),
        }
    }

    /// The seccomp filter and AppArmor profile of a container, checked before anything is made.
    // The deprecated profile fields are still what older kubelets send.
    #[allow(deprecated)]
    fn confinement(
        &self,
        sc: Option<&cri::LinuxContainerSecurityContext>,
        pod_selinux: Option<&sandbox::security::SelinuxLabels>,
    ) -> Result<Confinement, Error> {
        const FIELD: &str = "config.linux.security_context";
        let privileged = sc.is_some_and(|s| s.privileged);
        let (caps, _) = spec::capabilities(sc)?;
        let mut bounding: Vec<String> = caps.iter().map(|c| c.to_string()).collect();
        bounding.sort();
        let choice = sandbox::security::seccomp_choice(
            sc.and_then(|s| s.seccomp.as_ref()),
            sc.map(|s| s.seccomp_profile_path.as_str()).unwrap_or(""),
            FIELD,
        )?;
        // A privileged container runs without a filter, whatever it asked for (as containerd).
        let seccomp = if privileged {
            None
        } else {
            let field = match &choice {
                sandbox::security::SeccompChoice::Localhost(_)
                    if sc.is_some_and(|s| s.seccomp.is_some()) =>
                {
                    format!("{FIELD}.seccomp.localhost_ref")
                }
                _ => format!("{FIELD}.seccomp"),
            };
            self.inner.filters.resolve(&choice, &bounding, &field)?
        };
        let apparmor = sandbox::security::apparmor_profile(
            sc.and_then(|s| s.apparmor.as_ref()),
            sc.map(|s| s.apparmor_profile.as_str()).unwrap_or(""),
            privileged,
            &self.inner.root,
            FIELD,
        )?;
        // A privileged container runs with the runtime's own label, as with containerd.
        let selinux = if privileged {
            None
        } else {
            sandbox::security::selinux_labels(
                sc.and_then(|s| s.selinux_options.as_ref()),
                pod_selinux,
                false,
                &|_| false,
                FIELD,
            )?
        };
        Ok(Confinement {
            seccomp,
            apparmor,
            selinux,
        })
    }

    #[allow(clippy::too_many_arguments)]
    async fn prepare(
        &self,
        id: &str,
        b: &Bundle,
        config: &cri::ContainerConfig,
        sandbox: &sandbox::Record,
        image: &image::Image,
        log_path: Option<PathBuf>,
        confinement: &Confinement,
        target_pid: Option<PathBuf>,
    ) -> Result<Record, Error> {
        for d in [
            b.dir.clone(),
            b.rootfs(),
            b.layer.join("upper"),
            b.layer.join("work"),
        ] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        let mut lowers = match image.top_chain() {
            Some(c) => self.inner.images.lowerdirs(c)?,
            None => Vec::new(),
        };
        if lowers.is_empty() {
            let empty = b.layer.join("empty");
            std::fs::create_dir_all(&empty).map_err(io_err(&empty))?;
            lowers.push(empty);
        }
        if let Some(u) = &sandbox.userns {
            // The layers seen through the pod's user namespace: files of host root are the
            // container's root's. The writable layer is the container root's own.
            let ns = self.inner.sandboxes.paths(&sandbox.id).ns("user");
            let mut mapped = Vec::new();
            for (i, l) in lowers.iter().enumerate() {
                let dir = b.layer.join("idmap").join(i.to_string());
                std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
                let tree =
                    runtime::mounts::idmapped(l, &ns, false, runtime::mounts::ATTR_RDONLY, false)
                        .map_err(io_err(l))?;
                runtime::mounts::attach(&tree, &dir).map_err(io_err(&dir))?;
                mapped.push(dir);
            }
            lowers = mapped;
            let upper = b.layer.join("upper");
            std::os::unix::fs::chown(&upper, Some(u.uids.host_id), Some(u.gids.host_id))
                .map_err(io_err(&upper))?;
        }
        let rootfs = b.rootfs();
        let privileged = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .is_some_and(|s| s.privileged);
        // A device node in an image layer must not open a host device: the container's devices
        // live on its own /dev.
        let flags = if privileged {
            MsFlags::empty()
        } else {
            MsFlags::MS_NODEV
        };
        let mount_label = confinement.selinux.as_ref().map(|l| l.mount.as_str());
        runtime::mounts::overlay(&rootfs, &lowers, &b.layer, flags, mount_label)
            .map_err(io_err(&rootfs))?;

        let sc = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref());
        let user = user::resolve(&rootfs, sc, &image.config.config.user)
            .map_err(|r| invalid("config.linux.security_context", r))?;
        if let Some(u) = &sandbox.userns {
            let gids = std::iter::once(&user.gid).chain(&user.additional_gids);
            let unmapped = (u.uids.host(user.uid).is_none())
                .then(|| format!("user ID {}", user.uid))
                .or_else(|| {
                    gids.into_iter()
                        .find(|g| u.gids.host(**g).is_none())
                        .map(|g| format!("group ID {g}"))
                });
            if let Some(what) = unmapped {
                return Err(invalid(
                    "config.linux.security_context",
                    format!(
                        "{what} is not mapped in the pod's user namespace (IDs 0 to {})",
                        u.uids.size.min(u.gids.size) - 1
                    ),
                ));
            }
        }
        let cgroup = self.container_cgroup(id, sandbox, config)?;
        let sandbox_paths = self.inner.sandboxes.paths(&sandbox.id);
        let mut oci = spec::build(&spec::Context {
            config,
            sandbox,
            sandbox_paths: &sandbox_paths,
            image,
            rootfs: &rootfs,
            user: &user,
            cgroup: cgroup.is_some(),
        })?;
        let scoped = self.scoped(cgroup.as_ref());
        if let Some(cg) = &cgroup
            && !scoped
        {
            attach_devices(cg, &oci)?;
        }
        let ns = sc
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let mut join = Vec::new();
        for (kind, mode_known) in [
            ("net", sandbox.network),
            ("ipc", sandbox.ipc),
            ("uts", sandbox.network),
        ] {
            if mode_known != NS_NODE && sandbox.namespaces.iter().any(|n| n == kind) {
                join.push(JoinNamespace {
                    kind: kind.into(),
                    path: sandbox_paths.ns(kind),
                });
            }
        }
        let pid_mode = if let Some(path) = target_pid {
            // Another container's PID namespace (an ephemeral container's target).
            join.push(JoinNamespace {
                kind: "pid".into(),
                path,
            });
            NS_TARGET
        } else if ns.pid == NS_NODE || sandbox.pid == NS_NODE {
            NS_NODE
        } else if ns.pid == NS_POD || sandbox.pid == NS_POD {
            NS_POD
        } else {
            NS_CONTAINER
        };
        if pid_mode == NS_POD {
            if !sandbox.namespaces.iter().any(|n| n == "pid") {
                return Err(invalid(
                    "config.linux.security_context.namespace_options.pid",
                    "POD mode needs a pod sandbox that shares its PID namespace",
                ));
            }
            join.push(JoinNamespace {
                kind: "pid".into(),
                path: sandbox_paths.ns("pid"),
            });
        }
        let (log_dir, log_rel) = match &log_path {
            Some(_) => (
                Some(PathBuf::from(&sandbox.config.log_directory)),
                Some(PathBuf::from(&config.log_path)),
            ),
            None => (None, None),
        };
        let mut monitor = MonitorConfig {
            id: id.to_string(),
            log_dir,
            log_path: log_rel,
            stdin: config.stdin,
            stdin_once: config.stdin_once,
            tty: config.tty,
            join,
            new_pid_ns: pid_mode == NS_CONTAINER,
            exit_file: b.exit(),
            cgroup: cgroup.as_ref().map(|c| c.path.clone()),
            placed: scoped,
            seccomp: None,
            userns: sandbox.userns.as_ref().map(|_| sandbox_paths.ns("user")),
        };
        if let Some(f) = &confinement.seccomp {
            let path = b.dir.join("seccomp.bpf");
            atomic::write(&path, &f.program, 0o600).map_err(io_err(&path))?;
            monitor.seccomp = Some(runtime::SeccompFilter {
                program: path,
                flags: f.flags,
            });
            if let Some(l) = oci.linux_mut() {
                l.set_seccomp(Some(f.profile.clone()));
            }
        }
        if let (Some(name), Some(p)) = (&confinement.apparmor, oci.process_mut()) {
            p.set_apparmor_profile(Some(name.clone()));
        }
        if let Some(l) = &confinement.selinux {
            label_spec(&mut oci, l);
            for (i, m) in config.mounts.iter().enumerate() {
                if !m.selinux_relabel {
                    continue;
                }
                let field = format!("config.mounts[{i}].selinux_relabel");
                if !sandbox::security::relabel_allowed(&m.host_path) {
                    return Err(invalid(
                        &field,
                        format!("relabelling {} would break the node", m.host_path),
                    ));
                }
                runtime::selinux::relabel(Path::new(&m.host_path), &l.mount)
                    .map_err(|e| invalid(&field, e.to_string()))?;
            }
        }
        let cfg_path = b.dir.join("config.json");
        atomic::write_json(&cfg_path, &oci).map_err(io_err(&cfg_path))?;
        let mon_path = b.dir.join("monitor.json");
        atomic::write_json(&mon_path, &monitor).map_err(io_err(&mon_path))?;
        let record = Record {
            id: id.to_string(),
            sandbox_id: sandbox.id.clone(),
            config: config.clone(),
            image_ref: image
                .record
                .repo_digests
                .first()
                .cloned()
                .unwrap_or_else(|| image.record.id.to_string()),
            image_id: image.record.id.to_string(),
            top_chain: image.top_chain().cloned(),
            created_at: now_nanos(),
            started_at: 0,
            finished_at: 0,
            state: CREATED,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            init: None,
            monitor: None,
            mnt_ns: None,
            own_pid_ns: pid_mode == NS_CONTAINER,
            log_path,
            stop_signal: image.config.config.stop_signal.clone(),
            user: (user.uid, user.gid, user.additional_gids.clone()),
            cgroup,
        };
        atomic::write_json(&b.record(), &record).map_err(io_err(&b.record()))?;
        Ok(record)
    }

    /// The container's cgroup below its pod's, created with the container's limits written.
    /// Under systemd it is a scope made when the container starts (see `place`): here it is
    /// only named.
    fn container_cgroup(
        &self,
        id: &str,
        sandbox: &sandbox::Record,
        config: &cri::ContainerConfig,
    ) -> Result<Option<Cgroup>, Error> {
        // Refuses limits that cannot be enforced, with or without a cgroup.
        let files = self.limit_files(config)?;
        let Some(pod) = &sandbox.cgroup else {
            return Ok(None);
        };
        let policy = self.inner.sandboxes.cgroups();
        // A pod made before crius registered units with systemd has a plain directory, not a
        // slice: its containers get plain directories too.
        let scoped = self.inner.sandboxes.systemd().is_some()
            && pod.path.extension().is_some_and(|e| e == "slice");
        let cg = Cgroup {
            root: pod.root.clone(),
            path: pod.path.join(if scoped {
                policy.leaf(id)
            } else {
                id.to_string()
            }),
        };
        if scoped {
            return Ok(Some(cg));
        }
        cg.create(&cgroup::CONTROLLERS)
            .map_err(|source| sandbox::Error::Cgroup {
                path: cg.path.clone(),
                source,
            })?;
        if let Err(e) = write_limits(&cg, &files) {
            let _ = cg.remove();
            return Err(e);
        }
        Ok(Some(cg))
    }

    /// Whether the container's cgroup is a systemd scope made when it starts.
    fn scoped(&self, cg: Option<&Cgroup>) -> bool {
        self.inner.sandboxes.systemd().is_some()
            && cg.is_some_and(|cg| {
                cg.path.extension().is_some_and(|e| e == "scope")
                    && crate::systemd::unit_and_slice(&cg.path).is_some()
            })
    }

    /// The cgroup files of a container's limits; an error when it asks for limits this node
    /// cannot enforce.
    fn limit_files(&self, config: &cri::ContainerConfig) -> Result<Vec<(String, String)>, Error> {
        let default = cri::LinuxContainerResources::default();
        let res = sandbox::resources(
            config
                .linux
                .as_ref()
                .and_then(|l| l.resources.as_ref())
                .unwrap_or(&default),
        );
        let policy = self.inner.sandboxes.cgroups();
        if policy.hierarchy.is_none() {
            if res.limits_anything() && !policy.allow_unenforced {
                return Err(sandbox::Error::Unenforceable {
                    what: "config.linux.resources".into(),
                }
                .into());
            }
            return Ok(Vec::new());
        }
        cgroup::files(&res).map_err(|r| invalid("config.linux.resources", r))
    }

    /// Under systemd: makes the started container's scope around its forked init (`pid`), then
    /// writes its limits and device rules into it.
    async fn place(
        &self,
        r: &Record,
        cg: &Cgroup,
        pid: i32,
        stdin: Option<&mut tokio::process::ChildStdin>,
    ) -> Result<(), Error> {
        let Some(sd) = self.inner.sandboxes.systemd() else {
            return Ok(());
        };
        let files = self.limit_files(&r.config)?;
        let placement = sandbox::Placement::of(sd, cg)?;
        let result = async {
            placement
                .start(pid, &files)
                .await
                .map_err(sandbox::Error::from)?;
            // systemd enables only the controllers it knows (not hugetlb): enable the rest on
            // the way down, as runc does after starting a scope.
            cg.create(&cgroup::CONTROLLERS)
                .map_err(|source| sandbox::Error::Cgroup {
                    path: cg.path.clone(),
                    source,
                })?;
            write_limits(cg, &files)?;
            let dir = self.bundle(&r.id).dir;
            let spec: oci_spec::runtime::Spec = serde_json::from_slice(
                &std::fs::read(dir.join("config.json")).map_err(io_err(&dir))?,
            )
            .map_err(|e| invalid("config.json", e.to_string()))?;
            attach_devices(cg, &spec)
        }
        .await;
        sandbox::Placement::answer(stdin, &result).await;
        result
    }

    pub async fn start(&self, id: &str) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        if r.state != CREATED {
            return Err(Error::WrongState {
                id: r.id.clone(),
                state: state_name(r.state),
                want: "created",
            });
        }
        let b = self.bundle(&r.id);
        let stderr = std::fs::File::create(b.dir.join("monitor.log")).map_err(io_err(&b.dir))?;
        // Under systemd the monitor reports the forked init and waits for it to be placed.
        let placed = r.cgroup.clone().filter(|cg| self.scoped(Some(cg)));
        let mut child = tokio::process::Command::new(runtime::SELF_EXE)
            .arg0("crius")
            .arg("monitor")
            .arg(&b.dir)
            .stdin(if placed.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| Error::Start {
                id: r.id.clone(),
                message: format!("spawning the monitor: {e}"),
            })?;
        let monitor = child.id().and_then(|pid| ProcessId::of(pid as i32).ok());
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
                    stdin = None;
                    continue;
                }
                break;
            }
        }
        drop(stdin);
        // tokio reaps the monitor when it ends; its exit is watched through a pidfd.
        drop(child);
        let report: Result<StartReport, String> = serde_json::from_str(line.trim()).map_err(|_| {
            let log = std::fs::read_to_string(b.dir.join("monitor.log")).unwrap_or_default();
            format!("the monitor gave no start report ({})", log.trim())
        });
        let report = match (report, placement_error) {
            (Ok(StartReport::Failed { .. }) | Err(_), Some(e)) => Err(e),
            (r, _) => r,
        };
        match report {
            Ok(StartReport::Started {
                pid,
                start_time,
                started_at,
            }) => {
                let init = ProcessId { pid, start_time };
                r.state = RUNNING;
                r.init = Some(init);
                r.monitor = monitor;
                r.started_at = started_at;
                r.mnt_ns = init.namespace("mnt").ok();
                atomic::write_json(&b.record(), &*r).map_err(io_err(&b.record()))?;
                self.watch(r.id.clone(), monitor.unwrap_or(init));
                Ok(())
            }
            Ok(StartReport::Forked { .. }) => Err(Error::Start {
                id: r.id.clone(),
                message: "the monitor reported a forked init it was not asked to".into(),
            }),
            Ok(StartReport::Failed { message }) | Err(message) => {
                r.state = EXITED;
                r.exit_code = 128;
                r.reason = "StartError".into();
                r.message = message.clone();
                r.started_at = now_nanos();
                r.finished_at = r.started_at;
                let _ = umount2(&b.rootfs(), MntFlags::MNT_DETACH);
                let _ = atomic::write_json(&b.record(), &*r);
                Err(Error::Start {
                    id: r.id.clone(),
                    message,
                })
            }
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
            if r.state != RUNNING {
                return Ok(());
            }
            let Some(init) = r.init else { return Ok(()) };
            (
                init,
                r.monitor,
                parse_signal(&r.stop_signal).unwrap_or(libc::SIGTERM),
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
        let r = entry.lock().await;
        let b = self.bundle(&r.id);
        remove_files(&b);
        if let Some(cg) = &r.cgroup {
            if let Some(sd) = self.inner.sandboxes.systemd()
                && let Some((unit, _)) = crate::systemd::unit_and_slice(&cg.path)
                && let Err(e) = sd.stop(&unit).await
            {
                tracing::warn!(unit, error = %e, "stopping a container's systemd scope");
            }
            if let Err(e) = cg.remove() {
                tracing::warn!(cgroup = %cg.path.display(), error = %e, "removing container cgroup");
            }
        }
        if let Some(c) = &r.top_chain {
            self.inner.images.release(c);
        }
        self.inner
            .samples
            .forget(r.cgroup.as_ref(), &b.layer.join("upper"));
        self.inner.records.remove(&r.id);
        self.inner.records.release(&r.name_key());
        Ok(())
    }

    /// Changes a container's limits in place. A memory limit below what the container uses now
    /// is refused (the kernel would OOM-kill it); the container keeps running either way.
    pub async fn update_resources(
        &self,
        id: &str,
        res: cri::LinuxContainerResources,
    ) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        let want = sandbox::resources(&res);
        let policy = self.inner.sandboxes.cgroups();
        match &r.cgroup {
            None if want.limits_anything() && !policy.allow_unenforced => {
                return Err(sandbox::Error::Unenforceable {
                    what: "linux".into(),
                }
                .into());
            }
            None => {}
            // Not started yet under systemd: the scope takes the saved limits when it is made.
            Some(cg) if self.scoped(Some(cg)) && !cg.exists() => {
                cgroup::files(&want).map_err(|reason| invalid("linux", reason))?;
            }
            Some(cg) => {
                let files = cgroup::files(&want).map_err(|reason| invalid("linux", reason))?;
                if let Some((_, limit)) = files.iter().find(|(f, _)| f == "memory.max")
                    && let (Ok(limit), Some(used)) =
                        (limit.parse::<u64>(), cg.number("memory.current"))
                    && limit < used
                {
                    return Err(invalid(
                        "linux.memory_limit_in_bytes",
                        format!(
                            "{limit} is below the container's current memory use ({used} bytes)"
                        ),
                    ));
                }
                // systemd keeps the limits as unit properties, or a reload would undo them.
                if let Some(sd) = self.inner.sandboxes.systemd()
                    && let Some((unit, _)) = crate::systemd::unit_and_slice(&cg.path)
                {
                    sd.set_limits(&unit, &files)
                        .await
                        .map_err(sandbox::Error::from)?;
                }
                for (file, value) in files {
                    cg.set(&file, &value)
                        .map_err(|e| invalid("linux", format!("{file} = {value}: {e}")))?;
                }
            }
        }
        if let Some(linux) = r.config.linux.as_mut() {
            linux.resources = Some(res);
        } else {
            r.config.linux = Some(cri::LinuxContainerConfig {
                resources: Some(res),
                ..Default::default()
            });
        }
        let path = self.bundle(&r.id).record();
        atomic::write_json(&path, &*r).map_err(io_err(&path))
    }

    fn stats_of(&self, r: &Record) -> cri::ContainerStats {
        let s = &self.inner.samples;
        let upper = self.bundle(&r.id).layer.join("upper");
        let (bytes, inodes) = s.layer(&upper);
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: r.id.clone(),
                metadata: r.config.metadata.clone(),
                labels: r.config.labels.clone(),
                annotations: r.config.annotations.clone(),
            }),
            cpu: r.cgroup.as_ref().map(|cg| s.cpu(cg)),
            memory: r.cgroup.as_ref().map(stats::memory),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: now_nanos(),
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: self.inner.layers.display().to_string(),
                }),
                used_bytes: Some(cri::UInt64Value { value: bytes }),
                inodes_used: Some(cri::UInt64Value { value: inodes }),
            }),
            swap: r.cgroup.as_ref().map(stats::swap),
        }
    }

    pub async fn stats(&self, id: &str) -> Result<cri::ContainerStats, Error> {
        let entry = self.entry(id)?;
        let r = entry.lock().await;
        Ok(self.stats_of(&r))
    }

    /// Stats of running containers matching the filter (kubelet asks for running ones only).
    pub async fn list_stats(
        &self,
        filter: Option<&cri::ContainerStatsFilter>,
    ) -> Vec<cri::ContainerStats> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let mut r = e.lock().await;
            self.sync_exit(&mut r);
            if r.state != RUNNING {
                continue;
            }
            if let Some(f) = filter
                && ((!f.id.is_empty() && !r.id.starts_with(&f.id))
                    || (!f.pod_sandbox_id.is_empty()
                        && !r.sandbox_id.starts_with(&f.pod_sandbox_id))
                    || !sandbox::labels_match(&r.config.labels, &f.label_selector))
            {
                continue;
            }
            out.push(self.stats_of(&r));
        }
        out
    }

    pub async fn pod_stats(&self, id: &str) -> Result<cri::PodSandboxStats, Error> {
        let sb = self.inner.sandboxes.get(id).await?;
        let mut containers = Vec::new();
        for cid in self.in_sandbox(&sb.id).await {
            if let Ok(entry) = self.entry(&cid) {
                let mut r = entry.lock().await;
                self.sync_exit(&mut r);
                if r.state == RUNNING {
                    containers.push(self.stats_of(&r));
                }
            }
        }
        let s = &self.inner.samples;
        let cg = sb.cgroup.as_ref();
        Ok(cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: sb.id.clone(),
                metadata: sb.config.metadata.clone(),
                labels: sb.config.labels.clone(),
                annotations: sb.config.annotations.clone(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: cg.map(|c| s.cpu(c)),
                memory: cg.map(stats::memory),
                network: sb
                    .pause
                    .filter(|p| p.alive())
                    .and_then(|p| stats::network(p.pid)),
                process: cg.map(stats::processes),
                containers,
            }),
            windows: None,
        })
    }

    pub async fn list_pod_stats(
        &self,
        filter: Option<&cri::PodSandboxStatsFilter>,
    ) -> Vec<cri::PodSandboxStats> {
        let mut out = Vec::new();
        for p in self.inner.sandboxes.list(None).await {
            if p.state != cri::PodSandboxState::SandboxReady as i32 {
                continue;
            }
            if let Some(f) = filter
                && ((!f.id.is_empty() && !p.id.starts_with(&f.id))
                    || !sandbox::labels_match(&p.labels, &f.label_selector))
            {
                continue;
            }
            if let Ok(s) = self.pod_stats(&p.id).await {
                out.push(s);
            }
        }
        out
    }

    /// cadvisor-style metrics of every ready pod and its running containers.
    pub async fn pod_metrics(&self) -> Vec<cri::PodSandboxMetrics> {
        let mut out = Vec::new();
        for p in self.inner.sandboxes.list(None).await {
            if p.state != cri::PodSandboxState::SandboxReady as i32 {
                continue;
            }
            let Ok(sb) = self.inner.sandboxes.get(&p.id).await else {
                continue;
            };
            let mut metrics = sb
                .cgroup
                .as_ref()
                .map(stats::cgroup_metrics)
                .unwrap_or_default();
            if let Some(net) = sb
                .pause
                .filter(|p| p.alive())
                .and_then(|p| stats::network(p.pid))
            {
                metrics.extend(stats::network_metrics(&net));
            }
            let mut container_metrics = Vec::new();
            for cid in self.in_sandbox(&sb.id).await {
                let Ok(entry) = self.entry(&cid) else {
                    continue;
                };
                let r = entry.lock().await;
                if r.state == RUNNING
                    && let Some(cg) = &r.cgroup
                {
                    container_metrics.push(cri::ContainerMetrics {
                        container_id: r.id.clone(),
                        metrics: stats::cgroup_metrics(cg),
                    });
                }
            }
            out.push(cri::PodSandboxMetrics {
                pod_sandbox_id: sb.id.clone(),
                metrics,
                container_metrics,
            });
        }
        out
    }

    /// IDs of a sandbox's containers.
    pub async fn in_sandbox(&self, sandbox_id: &str) -> Vec<String> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let r = e.lock().await;
            if r.sandbox_id == sandbox_id {
                out.push(r.id.clone());
            }
        }
        out
    }

    fn to_cri(r: &Record) -> cri::Container {
        cri::Container {
            id: r.id.clone(),
            pod_sandbox_id: r.sandbox_id.clone(),
            metadata: r.config.metadata.clone(),
            image: r.config.image.clone(),
            image_ref: r.image_ref.clone(),
            state: r.state,
            created_at: r.created_at,
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            image_id: r.image_id.clone(),
        }
    }

    pub async fn list(&self, filter: Option<&cri::ContainerFilter>) -> Vec<cri::Container> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let mut r = e.lock().await;
            self.sync_exit(&mut r);
            if let Some(f) = filter {
                if !f.id.is_empty() && !r.id.starts_with(&f.id) {
                    continue;
                }
                if !f.pod_sandbox_id.is_empty() && !r.sandbox_id.starts_with(&f.pod_sandbox_id) {
                    continue;
                }
                if let Some(s) = &f.state
                    && s.state != r.state
                {
                    continue;
                }
                if !sandbox::labels_match(&r.config.labels, &f.label_selector) {
                    continue;
                }
            }
            out.push(Self::to_cri(&r));
        }
        out.sort_by_key(|c| c.created_at);
        out
    }

    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<(cri::ContainerStatus, HashMap<String, String>), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        self.sync_exit(&mut r);
        let (uid, gid, groups) = r.user.clone();
        let status = cri::ContainerStatus {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: r.state,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            exit_code: r.exit_code,
            image: r.config.image.clone(),
            image_ref: r.image_ref.clone(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            mounts: r.config.mounts.clone(),
            log_path: r
                .log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            resources: r
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|res| cri::ContainerResources {
                    linux: Some(res),
                    ..Default::default()
                }),
            image_id: r.image_id.clone(),
            user: Some(cri::ContainerUser {
                linux: Some(cri::LinuxContainerUser {
                    uid: uid.into(),
                    gid: gid.into(),
                    supplemental_groups: groups.iter().map(|g| i64::from(*g)).collect(),
                }),
            }),
        };
        let mut info = HashMap::new();
        if verbose {
            let b = self.bundle(&r.id);
            let spec: serde_json::Value = std::fs::read(b.dir.join("config.json"))
                .ok()
                .and_then(|d| serde_json::from_slice(&d).ok())
                .unwrap_or(serde_json::Value::Null);
            let v = serde_json::json!({
                "sandboxID": r.sandbox_id,
                "pid": r.init.map(|p| p.pid),
                "monitorPid": r.monitor.map(|p| p.pid),
                "bundle": b.dir,
                "rootfs": b.rootfs(),
                "writableLayer": b.layer,
                "cgroup": r.cgroup.as_ref().map(|c| c.path.clone()),
                "runtimeSpec": spec,
            });
            info.insert("info".to_string(), v.to_string());
        }
        Ok((status, info))
    }

    /// Runs a command in a running container and collects its output.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), Error> {
        if cmd.is_empty() {
            return Err(invalid("cmd", "is required"));
        }
        let entry = self.entry(id)?;
        let cid = {
            let mut r = entry.lock().await;
            self.sync_exit(&mut r);
            match (r.state, r.init) {
                (RUNNING, Some(_)) => r.id.clone(),
                (s, _) => {
                    return Err(Error::WrongState {
                        id: r.id.clone(),
                        state: state_name(s),
                        want: "running",
                    });
                }
            }
        };
        let sock = self.bundle(&cid).dir.join(runtime::MONITOR_SOCKET);
        let exec_err = |message: String| Error::Exec {
            id: cid.clone(),
            message,
        };
        let req = ExecRequest {
            args: cmd,
            timeout_ms: if timeout > 0 {
                timeout as u64 * 1000
            } else {
                0
            },
        };
        let body = serde_json::to_vec(&req).map_err(|e| exec_err(e.to_string()))?;
        // The command writes straight into these pipes; the monitor only starts and reaps it.
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
                .map_err(|e| exec_err(format!("pipe: {e}")))
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let conn = {
            let dir = sock.parent().unwrap_or(Path::new("/"));
            let (_dir, short) =
                runtime::short_socket_path(dir, runtime::MONITOR_SOCKET).map_err(io_err(dir))?;
            std::os::unix::net::UnixStream::connect(&short)
                .map_err(|e| exec_err(format!("the container's monitor does not answer ({e})")))?
        };
        {
            use std::os::fd::AsRawFd;
            let fds = [out_w.as_raw_fd(), err_w.as_raw_fd()];
            let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
            let iov = [std::io::IoSlice::new(&body)];
            nix::sys::socket::sendmsg::<()>(
                conn.as_raw_fd(),
                &iov,
                &cmsg,
                nix::sys::socket::MsgFlags::empty(),
                None,
            )
            .map_err(|e| exec_err(format!("sending the command to the monitor: {e}")))?;
        }
        drop((out_w, err_w));
        conn.set_nonblocking(true).map_err(io_err(&sock))?;
        let mut conn = tokio::net::UnixStream::from_std(conn).map_err(io_err(&sock))?;
        let mut out =
            tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).map_err(io_err(&sock))?;
        let mut err =
            tokio::net::unix::pipe::Receiver::from_owned_fd(err_r).map_err(io_err(&sock))?;
        let collect = async {
            let (mut o, mut e, mut report) = (Vec::new(), Vec::new(), Vec::new());
            let (mut bo, mut be, mut br) =
                (vec![0u8; 64 << 10], vec![0u8; 64 << 10], vec![0u8; 4096]);
            let (mut o_done, mut e_done) = (false, false);
            // Once the command has ended, what it wrote is already in the pipes; a background
            // child may hold them open forever, so reading stops shortly after.
            let mut ended: Option<tokio::time::Instant> = None;
            loop {
                if o_done && e_done && ended.is_some() {
                    break;
                }
                let drain = async {
                    match ended {
                        Some(t) => tokio::time::sleep_until(t + EXEC_DRAIN).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = out.read(&mut bo), if !o_done => match r {
                        Ok(0) | Err(_) => o_done = true,
                        Ok(n) => push_capped(&mut o, &bo[..n]),
                    },
                    r = err.read(&mut be), if !e_done => match r {
                        Ok(0) | Err(_) => e_done = true,
                        Ok(n) => push_capped(&mut e, &be[..n]),
                    },
                    r = conn.read(&mut br), if ended.is_none() => match r {
                        Ok(0) | Err(_) => ended = Some(tokio::time::Instant::now()),
                        Ok(n) => {
                            report.extend_from_slice(&br[..n]);
                            if report.ends_with(b"\n") {
                                ended = Some(tokio::time::Instant::now());
                            }
                        }
                    },
                    () = drain => break,
                }
            }
            (o, e, report)
        };
        // The monitor enforces the timeout; this guard only catches a monitor that hangs.
        let guard = if timeout > 0 {
            Duration::from_secs(timeout as u64 + 10)
        } else {
            Duration::from_secs(u64::MAX / 4)
        };
        let (o, e, report) =
            tokio::time::timeout(guard, collect)
                .await
                .map_err(|_| Error::ExecTimeout {
                    id: cid.clone(),
                    seconds: timeout,
                })?;
        let report: ExecReport = serde_json::from_slice(&report)
            .map_err(|_| exec_err("the container's monitor ended without an answer".into()))?;
        if let Some(message) = report.error {
            return Err(exec_err(message));
        }
        if report.timed_out {
            return Err(Error::ExecTimeout {
                id: cid,
                seconds: timeout,
            });
        }
        Ok((o, e, report.exit_code))
    }

    /// Has the monitor open the log path again (kubelet rotated the file).
    pub async fn reopen_log(&self, id: &str) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let (monitor, path) = {
            let mut r = entry.lock().await;
            self.sync_exit(&mut r);
            if r.state != RUNNING {
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

/// Appends output, keeping at most MAX_EXEC_OUTPUT bytes (the rest is read and dropped so the
/// writer never blocks).
fn push_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_EXEC_OUTPUT.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

/// SIGKILL to every process of the container: its cgroup's when it has one; else the init alone
/// with its own PID namespace, or every process sharing its mount namespace.
fn kill_all(init: ProcessId, own_pid_ns: bool, mnt_ns: Option<u64>, cgroup: Option<&Cgroup>) {
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

fn remove_files(b: &Bundle) {
    // The rootfs and any idmapped layers are unmounted first; a tree that keeps a mount is left.
    for d in [&b.layer, &b.dir] {
        if let Err(e) = runtime::mounts::remove_tree(d) {
            tracing::warn!(dir = %d.display(), error = %e, "removing container files");
        }
    }
}

/// Writes a container's limit files into its cgroup.
fn write_limits(cg: &Cgroup, files: &[(String, String)]) -> Result<(), Error> {
    for (file, value) in files {
        cg.set(file, value)
            .map_err(|e| invalid("config.linux.resources", format!("{file} = {value}: {e}")))?;
    }
    Ok(())
}

/// Attaches the spec's device rules to the container's cgroup (nothing when every device is
/// allowed).
fn attach_devices(cg: &Cgroup, oci: &oci_spec::runtime::Spec) -> Result<(), Error> {
    let rules: Vec<devices::Rule> = oci
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.devices().as_ref())
        .map(|d| d.iter().filter_map(devices::Rule::from_oci).collect())
        .unwrap_or_default();
    let all = rules
        .iter()
        .any(|r| r.kind.is_none() && r.major.is_none() && r.minor.is_none());
    if !all {
        devices::attach(&cg.path, &rules).map_err(|source| sandbox::Error::Cgroup {
            path: cg.path.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Puts SELinux labels in a container's spec: the process's (set on its exec by the init), the
/// files' (the rootfs is mounted with it) and a `context=` on its tmpfs mounts.
fn label_spec(oci: &mut oci_spec::runtime::Spec, l: &sandbox::security::SelinuxLabels) {
    if let Some(p) = oci.process_mut() {
        p.set_selinux_label(Some(l.process.clone()));
    }
    if let Some(linux) = oci.linux_mut() {
        linux.set_mount_label(Some(l.mount.clone()));
    }
    if let Some(mounts) = oci.mounts_mut() {
        for m in mounts.iter_mut() {
            if m.typ().as_deref() == Some("tmpfs") {
                let mut opts = m.options().clone().unwrap_or_default();
                opts.push(format!("context=\"{}\"", l.mount));
                m.set_options(Some(opts));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals() {
        assert_eq!(parse_signal("SIGTERM"), Some(15));
        assert_eq!(parse_signal("quit"), Some(3));
        assert_eq!(parse_signal("9"), Some(9));
        assert_eq!(parse_signal("SIGRTMIN+3"), Some(libc::SIGRTMIN() + 3));
        assert_eq!(parse_signal(""), None);
        assert_eq!(parse_signal("SIGNOPE"), None);
        assert_eq!(parse_signal("99"), None);
    }
}
