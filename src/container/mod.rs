//! container: containers of pod sandboxes. CreateContainer (`create`) resolves the image and user,
//! mounts the rootfs (overlay of the image's snapshots plus a fresh writable layer under
//! `<root>/containers/<id>`) and writes the bundle (`config.json`, the OCI spec of `spec` and
//! `mounts`, confined by `confinement`; `monitor.json`) under `<state>/containers/<id>`.
//! StartContainer (`lifecycle`) runs `crius monitor` on the bundle; the monitor owns the container
//! from then on and leaves `exit.json` when it ends, which is the one source of exit truth for this
//! daemon and any later one. Here too: stop and remove (`lifecycle`), cgroups and resource updates
//! (`cgroups`), ExecSync (`exec`), status and lists (`listing`), stats (`stats`) and metrics
//! (`metrics`, `metric_samples`), checkpoints with criu and restores from them (`checkpoint`;
//! their hostile archives gated, unpacked and read by `restore`), a pod's checkpoint of several
//! containers at once (`pod_checkpoint`) and their restore into a new pod (`pod_restore`; the process a config must match,
//! `process_match`),
//! lifecycle events (`events`),
//! step times of create and start (`steps`), streams (`attach`, `stream`); this file holds the records and their recovery. Its inputs and outputs are its own
//! types (`config` and the status, stats and metrics types), which `cri` converts. Uses `image`,
//! `sandbox` (and its `config`), `snapshot` (layer diffs, usage, the safe unpacker), `runtime`,
//! `systemd`, `records`, `atomic`, `content`, `mounttable`, `fault` and `sys`.

mod attach;
mod cdi;
mod cgroups;
mod checkpoint;
pub mod config;
mod confinement;
mod create;
pub mod events;
mod exec;
mod grants;
mod lifecycle;
mod listing;
mod metric_samples;
pub mod metrics;
mod mounts;
mod nri;
mod pod_checkpoint;
mod pod_restore;
mod process_match;
mod restore;
pub mod seal;
pub mod spec;
pub mod stats;
mod steps;
pub mod stream;
pub mod user;
mod volumes;

use cgroups::attach_devices;
pub use create::{recursive_read_only_mounts, user_namespaces};
use lifecycle::{discard_files, remove_files};
pub use lifecycle::{parse_signal, signal_name};
pub use listing::{ContainerFilter, ContainerStatus, ContainerSummary, ContainerUser};
pub use pod_restore::{PodCheckpoint, PreparedRestore};
pub use volumes::ImageVolume;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags, umount2};
use serde::{Deserialize, Serialize};

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
use crate::sandbox::{self, NamespaceMode, SandboxService, wait_for_exit};
use config::{ContainerConfig, ContainerState};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An NRI plugin refused or failed the call it hooks.
    #[error(transparent)]
    Nri(#[from] crate::nri::Error),
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
    #[error("attaching to container {id}: {message}")]
    Attach { id: String, message: String },
    #[error("exec in container {id}: timed out after {seconds} s")]
    ExecTimeout { id: String, seconds: i64 },
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    Image(#[from] image::Error),
    #[error("container {id} cannot be checkpointed: {reason}")]
    CheckpointRefused { id: String, reason: String },
    #[error("checkpointing container {id}: {message}")]
    Checkpoint { id: String, message: String },
    /// A CRI call's deadline (CheckpointPod's, RestorePod's) passed while it worked.
    #[error("{what}: the call's deadline passed")]
    DeadlinePassed { what: String },
    /// RestorePod refused before its checkpoint is read (restore off, no criu).
    #[error("checkpoint_path: {} cannot be restored: {reason}", path.display())]
    PodRestoreRefused { path: PathBuf, reason: String },
    /// A pod checkpoint directory refused before anything of it was used.
    #[error("checkpoint_path: {} is not a usable pod checkpoint: {reason}", path.display())]
    BadPodCheckpoint { path: PathBuf, reason: String },
    /// Restore through CreateContainer asked for while the config key `key` is off.
    #[error(
        "config.image.image: {} is a checkpoint archive, and restoring from one is off (set {key} = true in the daemon's config)",
        archive.display()
    )]
    RestoreOff { archive: PathBuf, key: &'static str },
    #[error(
        "config.image.image: checkpoint {} cannot be restored: criu is not installed (no criu in PATH)",
        archive.display()
    )]
    NoCriu { archive: PathBuf },
    /// A checkpoint archive refused before anything of it was used.
    #[error("config.image.image: {} is not a usable checkpoint archive: {reason}", archive.display())]
    BadArchive { archive: PathBuf, reason: String },
    #[error("container {id} is not removed: its process {pid} still runs after SIGKILL")]
    Unkillable { id: String, pid: i32 },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "container {id} cannot start unconfined: this node has neither cgroup v2 nor cgroup v1's devices controller, so nothing would stop it opening host devices (mount the devices controller, or boot with cgroup v2); only privileged containers run here"
    )]
    NoDeviceControl { id: String },
    #[error("{path}: making the container's devices cgroup: {source}")]
    DevicesCgroup { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(field: impl Into<String>, reason: impl std::fmt::Display) -> Error {
    Error::Invalid {
        field: field.into(),
        reason: reason.to_string(),
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

fn state_name(s: ContainerState) -> &'static str {
    s.name()
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub sandbox_id: String,
    pub config: ContainerConfig,
    pub image_ref: String,
    pub image_id: String,
    pub top_chain: Option<Digest>,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub state: ContainerState,
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
    /// The writable layer's project ID, where its file system keeps project quotas.
    #[serde(default)]
    pub project: Option<u32>,
    /// The images mounted as image volumes.
    #[serde(default)]
    pub image_volumes: Vec<ImageVolume>,
}

/// An event about `r`.
fn notice(r: &Record, kind: events::EventKind, at: i64) -> events::Notice {
    events::Notice {
        container_id: r.id.clone(),
        sandbox_id: r.sandbox_id.clone(),
        kind,
        at,
        status: (kind != events::EventKind::Deleted)
            .then(|| Box::new(ContainerService::status_of(r))),
    }
}

impl Record {
    /// The signal StopContainer sends first: the container's own stop signal, else its
    /// image's, else SIGTERM.
    fn stop_signal_number(&self) -> i32 {
        lifecycle::parse_signal(&self.config.stop_signal)
            .or_else(|| lifecycle::parse_signal(&self.stop_signal))
            .unwrap_or(libc::SIGTERM)
    }

    /// The same, by name, as ContainerStatus reports it.
    fn effective_stop_signal(&self) -> String {
        lifecycle::signal_name(self.stop_signal_number())
    }

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
    events: events::Events,
    samples: stats::Samples,
    layer_usage: crate::snapshot::usage::LayerUsage,
    /// Where the root (persistent) state lives, for the default AppArmor profile.
    root: PathBuf,
    filters: sandbox::security::Filters,
    /// CDI spec files; `None` when CDI is turned off.
    cdi: Option<crate::cdi::Registry>,
    /// NRI plugins; `None` when NRI is turned off.
    nri: Option<crate::nri::Nri>,
    /// Containers being checkpointed: one dump at a time each (they share a work directory,
    /// and a second would thaw the first's frozen cgroup).
    checkpointing: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Where checkpoint archives are unpacked for a restore; `None` when restore through
    /// CreateContainer is off (`checkpoint.restore_from_archive`).
    restore_dir: Option<PathBuf>,
    /// The key checkpoint archives are sealed with, loaded (or made) on first use.
    seal_key: std::sync::Mutex<Option<Arc<seal::SealKey>>>,
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
#[derive(Clone)]
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

impl ContainerService {
    /// The node's checkpoint key (`<root>/checkpoint.key`), made the first time a dump or a
    /// restore needs it.
    fn seal_key(&self) -> Result<Arc<seal::SealKey>, Error> {
        let mut held = self
            .inner
            .seal_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(k) = held.as_ref() {
            return Ok(k.clone());
        }
        let k = Arc::new(seal::SealKey::load_or_make(
            &self.inner.root.join(seal::KEY_FILE),
        )?);
        *held = Some(k.clone());
        Ok(k)
    }
}

impl ContainerService {
    pub fn open(
        root: &Path,
        state: &Path,
        images: ImageService,
        sandboxes: SandboxService,
        cdi: Option<crate::cdi::Registry>,
        nri: Option<crate::nri::Nri>,
        restore_from_archive: bool,
    ) -> Result<ContainerService, Error> {
        let layers = root.join("containers");
        // What a daemon that ended mid-restore left unpacked.
        let restore_dir = state.join("restore");
        if let Err(e) = std::fs::remove_dir_all(&restore_dir)
            && e.kind() != io::ErrorKind::NotFound
        {
            return Err(io_err(&restore_dir)(e));
        }
        std::fs::create_dir_all(&layers).map_err(io_err(&layers))?;
        let svc = ContainerService {
            inner: Arc::new(Inner {
                state: state.join("containers"),
                layer_usage: crate::snapshot::usage::LayerUsage::open(&layers),
                layers,
                images,
                sandboxes,
                records: Registry::default(),
                events: events::Events::new(events::SUBSCRIBER_BUFFER),
                samples: stats::Samples::default(),
                root: root.to_path_buf(),
                filters: sandbox::security::Filters::default(),
                cdi,
                nri,
                checkpointing: Default::default(),
                restore_dir: restore_from_archive.then_some(restore_dir),
                seal_key: Default::default(),
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
            atomic::sweep(&b.dir);
            let record = atomic::read_json::<Record>(&b.record()).ok().flatten();
            let Some(mut r) = record else {
                tracing::info!(id, "removing an incomplete container");
                remove_files(&b);
                continue;
            };
            if r.state == ContainerState::Running {
                self.sync_exit(&mut r);
                if r.state == ContainerState::Running {
                    let watched = r
                        .monitor
                        .filter(|m| m.alive())
                        .or(r.init.filter(|i| i.alive()));
                    match watched {
                        Some(p) => self.watch(r.id.clone(), p),
                        None => {
                            r.state = ContainerState::Exited;
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
                // Ended while no daemon ran: told to whoever subscribes first.
                if r.state == ContainerState::Exited {
                    self.inner.events.recovered(notice(
                        &r,
                        events::EventKind::Stopped,
                        r.finished_at,
                    ));
                }
            }
            if let Some(c) = &r.top_chain {
                self.inner.images.hold(c);
            }
            self.hold_image_volumes(&r.id, &r.image_volumes);
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
                if let Err(e) = crate::mounttable::remove_tree(&entry.path()) {
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

    /// NotFound for a record removed while the caller waited for its lock.
    fn present(r: &Record) -> Result<(), Error> {
        if r.state == ContainerState::Removed {
            Err(Error::NotFound { id: r.id.clone() })
        } else {
            Ok(())
        }
    }

    /// Applies `exit.json` to a running container's record (and unmounts its rootfs).
    fn sync_exit(&self, r: &mut Record) {
        if r.state != ContainerState::Running {
            return;
        }
        let told = &self.inner.events;
        let b = self.bundle(&r.id);
        let Ok(Some(exit)) = atomic::read_json::<ExitRecord>(&b.exit()) else {
            return;
        };
        r.state = ContainerState::Exited;
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
        told.emit(notice(r, events::EventKind::Stopped, r.finished_at));
    }

    /// Subscribes to container events (GetContainerEvents).
    pub fn subscribe(&self) -> events::Subscription {
        self.inner.events.subscribe()
    }

    /// Records the exit as soon as the monitor (or, without one, the init) ends.
    fn watch(&self, id: String, process: ProcessId) {
        let me = self.clone();
        // Opened before returning: a container reported started is already watched.
        let exit = process
            .pidfd()
            .ok()
            .and_then(|fd| crate::sys::async_fd(fd, tokio::io::Interest::READABLE).ok());
        tokio::spawn(async move {
            match exit {
                Some(fd) => {
                    let _ = fd.readable().await;
                }
                None => while !wait_for_exit(process, Duration::from_secs(3600)).await {},
            }
            if let Ok(entry) = me.entry(&id) {
                let mut r = entry.lock().await;
                me.sync_exit(&mut r);
                me.nri_stopped(&r).await;
                if r.state == ContainerState::Running && r.monitor == Some(process) {
                    // A monitor that died without a record: the container's end is unknown.
                    r.state = ContainerState::Exited;
                    r.exit_code = 255;
                    r.finished_at = now_nanos();
                    r.reason = "Unknown".into();
                    r.message = "the container's monitor ended without an exit record".into();
                    let b = me.bundle(&r.id);
                    let _ = umount2(&b.rootfs(), MntFlags::MNT_DETACH);
                    let _ = atomic::write_json(&b.record(), &*r);
                    me.inner
                        .events
                        .emit(notice(&r, events::EventKind::Stopped, r.finished_at));
                    me.nri_stopped(&r).await;
                }
            }
        });
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
