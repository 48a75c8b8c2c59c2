//! sandbox: pod sandboxes. A sandbox is a `crius pause` process holding the pod's namespaces
//! (network with loopback up, IPC, UTS, and PID when shared), bind-mounted handles to those
//! namespaces under `<state>/sandboxes/<id>/ns` so they outlive any process, the pod's
//! `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname` and a per-pod `/dev/shm` tmpfs (`files`),
//! and a record (`state.json`, written atomically) that a restarted daemon reads back (this
//! file). Run, stop and remove are in `lifecycle`, the pause process in `pause`, pod cgroups in
//! `cgroups`, user namespaces in `userns`, status and lists in `listing`, security profiles in
//! `security`. It uses `runtime` (the pause helper, cgroups, process identities), `systemd`,
//! `records` and `atomic`; its inputs and outputs are its own types (`config`), which `cri` converts.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde::{Deserialize, Serialize};

mod cgroups;
pub mod config;
mod dial;
mod files;
mod lifecycle;
mod listing;
mod nri;
mod pause;
pub mod security;
mod userns;

pub use cgroups::{Placement, remove_cgroup, resources};
use files::{default_hosts, remove_files, resolv_conf, sysctls, write_file};
pub use listing::{PodFilter, PodState, PodStatus, PodSummary};
pub use nri::{adjust_resources, nri_resources};
pub(crate) use pause::Keeper;
pub use pause::SandboxImage;
use pause::{mount_pause_image, spawn_pause};
pub use userns::UserNs;
use userns::userns_request;

use crate::atomic;
use crate::content::Digest;
use crate::records::{Entry, Lookup, Registry, now_nanos, random_id};
use crate::runtime::cgroup::{self, Cgroup, Policy, Resources};
use crate::runtime::{self, IdMapping, PauseConfig, PauseImage, PauseReport, ProcessId};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("pod sandbox {id:?} not found")]
    NotFound { id: String },
    #[error("pod sandbox {id:?} is ambiguous: {count} sandboxes start with it")]
    Ambiguous { id: String, count: usize },
    #[error("pod sandbox name {name:?} is already used by sandbox {id}")]
    NameReserved { name: String, id: String },
    #[error("runtime handler {handler:?} is not configured (configured: {known})")]
    UnknownHandler { handler: String, known: String },
    #[error("pod sandbox {id} is not ready")]
    NotReady { id: String },
    #[error("starting the pause process: {message}")]
    Pause { message: String },
    #[error(
        "{what}: cgroup v2 is not available on this node, so the limit cannot be enforced (set cgroup.allow_unenforced to run without limits)"
    )]
    Unenforceable { what: String },
    #[error(
        "user namespaces: {dir} (mode {mode:o}) cannot be searched by the pod's users; the runtime's state directory and every directory above it need search permission for others (o+x)"
    )]
    StateUnreachable { dir: PathBuf, mode: u32 },
    #[error("cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Systemd(#[from] crate::systemd::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("connecting to port {port} in the pod: {source}")]
    Dial { port: u16, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(field: &str, reason: impl std::fmt::Display) -> Error {
    Error::Invalid {
        field: field.to_string(),
        reason: reason.to_string(),
    }
}

pub use config::NamespaceMode;
use config::PodConfig;

/// What is kept per sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub config: PodConfig,
    pub runtime_handler: String,
    pub created_at: i64,
    pub ready: bool,
    /// The process holding the namespaces.
    pub pause: Option<ProcessId>,
    pub network: NamespaceMode,
    pub pid: NamespaceMode,
    pub ipc: NamespaceMode,
    /// Namespace kinds with a handle under `ns/` (the ones this pod created).
    pub namespaces: Vec<String>,
    /// The pod's cgroup (its containers' cgroups go below it); none without cgroup v2.
    #[serde(default)]
    pub cgroup: Option<Cgroup>,
    /// Whether crius made the pod cgroup (and removes it), rather than kubelet.
    #[serde(default)]
    pub owns_cgroup: bool,
    /// The pause process's own leaf cgroup below the pod's.
    #[serde(default)]
    pub pause_cgroup: Option<Cgroup>,
    /// The pod's user namespace maps, when it has its own.
    #[serde(default)]
    pub userns: Option<UserNs>,
    /// The configured pause image's top snapshot, when the pod runs one.
    #[serde(default)]
    pub image_chain: Option<Digest>,
    /// The pod's SELinux labels (its pause process's, and its containers' unless they ask for
    /// their own).
    #[serde(default)]
    pub selinux: Option<security::SelinuxLabels>,
    /// The pod gets a CNI network once it runs (`pod` attaches it): a pod recorded with this
    /// but no attachment was cut short before its network was begun.
    #[serde(default)]
    pub cni: bool,
}

/// Where crius's own 65536-ID blocks for pods come from when kubelet did not pick the maps:
/// systemd's range for container UIDs (524288 up to 1879048191), so they meet no user of the
/// host's.
const USERNS_FIRST: u32 = 524_288;
const USERNS_LAST: u32 = 1_879_048_191;
pub const USERNS_SIZE: u32 = 65_536;

impl Record {
    pub fn name_key(&self) -> String {
        name_key(self.config.metadata.as_ref())
    }

    /// Whether the pod's network namespace is the host's.
    pub fn host_network(&self) -> bool {
        self.network == NamespaceMode::Node
    }
}

fn name_key(m: Option<&config::PodMetadata>) -> String {
    match m {
        Some(m) => format!("{}_{}_{}_{}", m.name, m.namespace, m.uid, m.attempt),
        None => String::new(),
    }
}

/// Paths of one sandbox's files.
#[derive(Debug, Clone)]
pub struct Paths {
    pub dir: PathBuf,
}

impl Paths {
    pub fn ns(&self, kind: &str) -> PathBuf {
        self.dir.join("ns").join(kind)
    }
    pub fn hosts(&self) -> PathBuf {
        self.dir.join("hosts")
    }
    pub fn resolv(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }
    pub fn hostname(&self) -> PathBuf {
        self.dir.join("hostname")
    }
    pub fn shm(&self) -> PathBuf {
        self.dir.join("shm")
    }
    fn state(&self) -> PathBuf {
        self.dir.join("state.json")
    }
}

struct Inner {
    dir: PathBuf,
    handlers: Vec<String>,
    cgroups: Policy,
    /// Label every pod that is not privileged (`runtime.selinux` on a node running SELinux).
    selinux: bool,
    /// The SELinux levels pods hold, so that a random one is never handed out twice.
    levels: std::sync::Mutex<HashMap<String, usize>>,
    /// systemd's unit manager, with the systemd cgroup driver.
    systemd: Option<Arc<crate::systemd::Manager>>,
    records: Registry<Record>,
    /// User namespace maps in use, by pod.
    userns: std::sync::Mutex<HashMap<String, UserNs>>,
}

#[derive(Clone)]
pub struct SandboxService {
    inner: Arc<Inner>,
}

fn lookup_err(id: &str, l: Lookup) -> Error {
    match l {
        Lookup::Empty => invalid("pod_sandbox_id", "is required"),
        Lookup::NotFound => Error::NotFound { id: id.to_string() },
        Lookup::Ambiguous(count) => Error::Ambiguous {
            id: id.to_string(),
            count,
        },
    }
}

/// Waits until `pid` has exited, at most `timeout`; true if it did.
pub async fn wait_for_exit(pid: ProcessId, timeout: Duration) -> bool {
    let fd = match pid.pidfd() {
        Ok(fd) => Some(fd),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return true,
        // Out of descriptors, say: not a sign the process ended.
        Err(_) => None,
    };
    let Some(afd) = fd.and_then(|fd| crate::sys::async_fd(fd, tokio::io::Interest::READABLE).ok())
    else {
        // Fall back to polling the identity.
        // A client's timeout near i64::MAX seconds: no deadline, not an overflow.
        let deadline = tokio::time::Instant::now().checked_add(timeout);
        while !pid.ended() {
            if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        return true;
    };
    matches!(
        tokio::time::timeout(timeout, afd.readable()).await,
        Ok(Ok(_))
    )
}

impl SandboxService {
    /// Opens the sandbox store and reads back every record; pods whose pause process is gone are
    /// not ready.
    pub fn open(
        state: &Path,
        handlers: Vec<String>,
        cgroups: Policy,
        selinux: bool,
    ) -> Result<SandboxService, Error> {
        let dir = state.join("sandboxes");
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let svc = SandboxService {
            inner: Arc::new(Inner {
                dir,
                handlers,
                selinux: selinux && crate::runtime::selinux::enabled(),
                levels: std::sync::Mutex::new(Default::default()),
                systemd: (cgroups.systemd && cgroups.hierarchy.is_some())
                    .then(|| Arc::new(crate::systemd::Manager::new())),
                cgroups,
                records: Registry::default(),
                userns: std::sync::Mutex::new(HashMap::new()),
            }),
        };
        svc.recover()?;
        Ok(svc)
    }

    fn recover(&self) -> Result<(), Error> {
        let dir = &self.inner.dir;
        for entry in std::fs::read_dir(dir).map_err(io_err(dir))? {
            let entry = entry.map_err(io_err(dir))?;
            let paths = Paths { dir: entry.path() };
            atomic::sweep(&paths.dir);
            match atomic::read_json::<Record>(&paths.state()) {
                Ok(Some(mut r)) => {
                    if r.ready && !r.pause.is_some_and(|p| p.alive()) {
                        r.ready = false;
                        let _ = atomic::write_json(&paths.state(), &r);
                    }
                    // A stop the daemon did not live to finish: its pause process goes now.
                    if let Some(p) = r.pause.filter(|p| !r.ready && p.alive()) {
                        tracing::info!(sandbox = r.id, "finishing the stop of a pod");
                        let _ = p.signal(libc::SIGKILL);
                    }
                    let _ = self.inner.records.reserve(&r.name_key(), &r.id);
                    if let Some(u) = &r.userns {
                        self.inner
                            .userns
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(r.id.clone(), u.clone());
                    }
                    self.hold_level(r.selinux.as_ref());
                    self.inner.records.insert(r.id.clone(), r);
                }
                Ok(None) | Err(_) => {
                    // A sandbox that never finished starting: take down what it left.
                    tracing::info!(dir = %paths.dir.display(), "removing an incomplete pod sandbox");
                    remove_files(&paths);
                }
            }
        }
        Ok(())
    }

    pub fn paths(&self, id: &str) -> Paths {
        Paths {
            dir: self.inner.dir.join(id),
        }
    }

    pub fn handlers(&self) -> &[String] {
        &self.inner.handlers
    }

    /// The pause-image snapshots of the sandboxes read back at start (nothing else holds their
    /// locks yet), for the image store to keep.
    pub fn image_chains(&self) -> Vec<Digest> {
        self.inner
            .records
            .all()
            .iter()
            .filter_map(|e| e.try_lock().ok().and_then(|r| r.image_chain.clone()))
            .collect()
    }

    /// Every sandbox record.
    pub async fn records(&self) -> Vec<Record> {
        let entries = self.inner.records.all();
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            out.push(e.lock().await.clone());
        }
        out
    }

    /// How this node enforces limits.
    pub fn cgroups(&self) -> &Policy {
        &self.inner.cgroups
    }

    /// systemd's unit manager when the systemd cgroup driver is in use.
    pub fn systemd(&self) -> Option<&Arc<crate::systemd::Manager>> {
        self.inner.systemd.as_ref()
    }

    /// Full ID from an ID or a unique prefix of one.
    pub fn resolve(&self, id: &str) -> Result<String, Error> {
        self.inner
            .records
            .resolve(id)
            .map_err(|l| lookup_err(id, l))
    }

    fn entry(&self, id: &str) -> Result<Entry<Record>, Error> {
        self.inner.records.get(id).map_err(|l| lookup_err(id, l))
    }

    /// A copy of a sandbox's record.
    pub async fn get(&self, id: &str) -> Result<Record, Error> {
        Ok(self.entry(id)?.lock().await.clone())
    }
}

/// Every selector pair must be among the labels.
pub fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sysctls: &[(&str, &str)]) -> PodConfig {
        PodConfig {
            linux: Some(config::PodLinux {
                sysctls: sysctls
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn sysctl_validation() {
        assert!(
            sysctls(
                &config(&[("net.ipv4.ip_forward", "1"), ("kernel.shmmax", "1")]),
                NamespaceMode::Pod,
                NamespaceMode::Pod
            )
            .is_ok()
        );
        assert!(
            sysctls(
                &config(&[("net/ipv4/ping_group_range", "0 1")]),
                NamespaceMode::Pod,
                NamespaceMode::Pod
            )
            .is_ok()
        );
        let e = sysctls(
            &config(&[("vm.swappiness", "1")]),
            NamespaceMode::Pod,
            NamespaceMode::Pod,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("vm.swappiness") && e.contains("namespaced"),
            "{e}"
        );
        assert!(
            sysctls(
                &config(&[("net.ipv4.ip_forward", "1")]),
                NamespaceMode::Node,
                NamespaceMode::Pod
            )
            .is_err()
        );
        assert!(
            sysctls(
                &config(&[("kernel.msgmax", "1")]),
                NamespaceMode::Pod,
                NamespaceMode::Node
            )
            .is_err()
        );
        assert!(
            sysctls(
                &config(&[("net..x", "1")]),
                NamespaceMode::Pod,
                NamespaceMode::Pod
            )
            .is_err()
        );
    }

    #[test]
    fn resolv_and_labels() {
        let dns = config::Dns {
            servers: vec!["10.0.0.10".into()],
            searches: vec!["ns.svc.cluster.local".into(), "cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            String::from_utf8(resolv_conf(&dns)).unwrap(),
            "search ns.svc.cluster.local cluster.local\nnameserver 10.0.0.10\noptions ndots:5\n"
        );
        let labels: HashMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "fe".to_string()),
        ]
        .into();
        assert!(labels_match(
            &labels,
            &[("app".to_string(), "web".to_string())].into()
        ));
        assert!(!labels_match(
            &labels,
            &[("app".to_string(), "db".to_string())].into()
        ));
        assert!(labels_match(&labels, &HashMap::new()));
    }
}
