//! sandbox: pod sandboxes. A sandbox is a `crius pause` process holding the pod's namespaces
//! (network with loopback up, IPC, UTS, and PID when shared), bind-mounted handles to those
//! namespaces under `<state>/sandboxes/<id>/ns` so they outlive any process, the pod's
//! `/etc/hosts`, `/etc/resolv.conf`, `/etc/hostname` and a per-pod `/dev/shm` tmpfs, and a record
//! (`state.json`, written atomically) that a restarted daemon reads back. It uses `runtime` (the
//! pause helper, process identities) and `atomic`; CRI messages are its inputs and outputs.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_cri::v1 as cri;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncBufReadExt;

pub mod security;

use crate::atomic;
use crate::content::Digest;
use crate::records::{Entry, Lookup, Registry, now_nanos, random_id};
use crate::runtime::cgroup::{self, Cgroup, Policy, Resources};
use crate::runtime::{self, IdMapping, PauseConfig, PauseImage, PauseReport, ProcessId};

/// A configured pause image, resolved and unpacked by the caller: its layers and its command.
#[derive(Debug, Clone)]
pub struct SandboxImage {
    /// The image's top snapshot, held while a pod runs on it.
    pub chain: Option<Digest>,
    /// Overlay lower directories, topmost first.
    pub lowerdirs: Vec<PathBuf>,
    /// Entrypoint followed by command.
    pub args: Vec<String>,
    pub env: Vec<String>,
    /// The image config's `User`: numeric `uid[:gid]`, or empty for root.
    pub user: String,
    pub cwd: String,
}

impl SandboxImage {
    fn ids(&self) -> Result<(u32, u32), Error> {
        let bad = || Error::Pause {
            message: format!(
                "the pause image's user {:?} is not numeric (uid or uid:gid)",
                self.user
            ),
        };
        if self.user.is_empty() {
            return Ok((0, 0));
        }
        let (u, g) = self.user.split_once(':').unwrap_or((&self.user, ""));
        let uid: u32 = u.parse().map_err(|_| bad())?;
        let gid: u32 = if g.is_empty() {
            uid
        } else {
            g.parse().map_err(|_| bad())?
        };
        Ok((uid, gid))
    }
}

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
    #[error("cgroup {path}: {source}")]
    Cgroup { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Systemd(#[from] crate::systemd::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::Invalid {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Namespace modes as CRI numbers them.
pub const NS_POD: i32 = cri::NamespaceMode::Pod as i32;
pub const NS_CONTAINER: i32 = cri::NamespaceMode::Container as i32;
pub const NS_NODE: i32 = cri::NamespaceMode::Node as i32;

/// What is kept per sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub config: cri::PodSandboxConfig,
    pub runtime_handler: String,
    pub created_at: i64,
    pub ready: bool,
    /// The process holding the namespaces.
    pub pause: Option<ProcessId>,
    pub network: i32,
    pub pid: i32,
    pub ipc: i32,
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
}

/// A pod's user namespace: one range each for user and group IDs, container ID 0 first.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UserNs {
    pub uids: IdMapping,
    pub gids: IdMapping,
}

impl UserNs {
    /// The host IDs this pod's maps cover, as ranges.
    fn host_ranges(&self) -> [(u64, u64); 2] {
        [self.uids, self.gids].map(|m| (m.host_id as u64, m.host_id as u64 + m.size as u64))
    }
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
        self.network == NS_NODE
    }
}

fn name_key(m: Option<&cri::PodSandboxMetadata>) -> String {
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
    let Ok(fd) = pid.pidfd() else {
        return true; // already gone
    };
    let Ok(afd) = crate::sys::async_fd(fd, tokio::io::Interest::READABLE) else {
        // Fall back to polling the identity.
        let deadline = tokio::time::Instant::now() + timeout;
        while pid.alive() {
            if tokio::time::Instant::now() >= deadline {
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
            match atomic::read_json::<Record>(&paths.state()) {
                Ok(Some(mut r)) => {
                    if r.ready && !r.pause.is_some_and(|p| p.alive()) {
                        r.ready = false;
                        let _ = atomic::write_json(&paths.state(), &r);
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

    /// Reserves a pod's user namespace maps: kubelet's if given (refused if they overlap another
    /// pod's), else the first free 65536-ID block of crius's range.
    fn reserve_userns(&self, id: &str, asked: Option<UserNs>) -> Result<UserNs, Error> {
        const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";
        let mut taken = self.inner.userns.lock().unwrap_or_else(|p| p.into_inner());
        let overlaps = |u: &UserNs| {
            taken.iter().find_map(|(other, t)| {
                u.host_ranges().iter().find_map(|(a0, a1)| {
                    t.host_ranges()
                        .iter()
                        .any(|(b0, b1)| a0 < b1 && b0 < a1)
                        .then(|| other.clone())
                })
            })
        };
        let u = match asked {
            Some(u) => {
                if let Some(other) = overlaps(&u) {
                    return Err(invalid(
                        FIELD,
                        format!("the host IDs overlap those of pod sandbox {other}"),
                    ));
                }
                u
            }
            None => {
                let mut start = USERNS_FIRST;
                loop {
                    let m = IdMapping {
                        container_id: 0,
                        host_id: start,
                        size: USERNS_SIZE,
                    };
                    let u = UserNs { uids: m, gids: m };
                    if overlaps(&u).is_none() {
                        break u;
                    }
                    start = match start.checked_add(USERNS_SIZE) {
                        Some(s) if s <= USERNS_LAST - USERNS_SIZE + 1 => s,
                        _ => {
                            return Err(invalid(FIELD, "no free range of host IDs is left"));
                        }
                    };
                }
            }
        };
        taken.insert(id.to_string(), u.clone());
        Ok(u)
    }

    fn release_userns(&self, id: &str) {
        self.inner
            .userns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
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

    fn hold_level(&self, l: Option<&security::SelinuxLabels>) {
        if let Some(l) = l {
            *self
                .inner
                .levels
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(l.level().to_string())
                .or_default() += 1;
        }
    }

    fn release_level(&self, l: Option<&security::SelinuxLabels>) {
        let Some(l) = l else {
            return;
        };
        let mut levels = self.inner.levels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = levels.get_mut(l.level()) {
            *n -= 1;
            if *n == 0 {
                levels.remove(l.level());
            }
        }
    }

    /// Takes down a pod's cgroups: the pause leaf and, when crius made it, the pod's own
    /// (stopping their units under systemd, which kills anything left in them).
    async fn discard_cgroups(&self, pod: Option<&Cgroup>, owned: bool, pause: Option<&Cgroup>) {
        let mut all: Vec<&Cgroup> = pause.into_iter().collect();
        if owned {
            all.extend(pod);
        }
        for c in all {
            if let Some(sd) = &self.inner.systemd
                && let Some((unit, _)) = crate::systemd::unit_and_slice(&c.path)
                && let Err(e) = sd.stop(&unit).await
            {
                tracing::warn!(unit, error = %e, "stopping a pod's systemd unit");
            }
            if let Err(e) = c.remove() {
                tracing::warn!(cgroup = %c.path.display(), error = %e, "removing pod cgroup");
            }
        }
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

    /// Creates the pod's namespaces and files and starts its pause process.
    /// The pod's security profiles: the pause process runs no code of the pod's, but a profile
    /// the node cannot provide fails the pod here, clearly, before anything is made.
    // The deprecated profile fields are still what older kubelets send.
    #[allow(deprecated)]
    /// Returns the pod's SELinux labels, when it asks for some.
    fn check_profiles(
        &self,
        config: &cri::PodSandboxConfig,
    ) -> Result<Option<security::SelinuxLabels>, Error> {
        const FIELD: &str = "config.linux.security_context";
        let default_sc = cri::LinuxSandboxSecurityContext::default();
        let sc = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .unwrap_or(&default_sc);
        let choice =
            security::seccomp_choice(sc.seccomp.as_ref(), &sc.seccomp_profile_path, FIELD)?;
        if let security::SeccompChoice::Localhost(path) = &choice {
            crate::runtime::seccomp::load(path, &[])
                .map_err(|e| invalid(&format!("{FIELD}.seccomp"), e.to_string()))?;
        }
        security::apparmor_profile(
            sc.apparmor.as_ref(),
            "",
            sc.privileged,
            &self.inner.dir,
            FIELD,
        )?;
        // A privileged pod keeps the runtime's label, as with containerd.
        if sc.privileged {
            security::selinux_labels(sc.selinux_options.as_ref(), None, false, &|_| false, FIELD)?;
            return Ok(None);
        }
        // Each pod's random categories its own: none another pod holds.
        let mut levels = self.inner.levels.lock().unwrap_or_else(|p| p.into_inner());
        let labels = security::selinux_labels(
            sc.selinux_options.as_ref(),
            None,
            self.inner.selinux,
            &|l| levels.contains_key(l),
            FIELD,
        );
        if let Ok(Some(l)) = &labels {
            *levels.entry(l.level().to_string()).or_default() += 1;
        }
        drop(levels);
        let asked = sc
            .selinux_options
            .as_ref()
            .is_some_and(|o| *o != cri::SeLinuxOption::default());
        match (asked, labels) {
            // The node's default failing (a policy without the container types) names the
            // setting, not a field the pod never set.
            (false, Err(e)) => Err(invalid(
                "runtime.selinux",
                format!("labelling pods by default: {e}"),
            )),
            (_, r) => r,
        }
    }

    pub async fn run(
        &self,
        config: cri::PodSandboxConfig,
        handler: &str,
        image: Option<SandboxImage>,
    ) -> Result<String, Error> {
        let meta = config
            .metadata
            .as_ref()
            .ok_or_else(|| invalid("config.metadata", "is required"))?;
        for (field, v) in [
            ("config.metadata.name", &meta.name),
            ("config.metadata.namespace", &meta.namespace),
            ("config.metadata.uid", &meta.uid),
        ] {
            if v.is_empty() {
                return Err(invalid(field, "is required"));
            }
        }
        // sethostname takes at most HOST_NAME_MAX (64) bytes.
        if config.hostname.len() > 64 || config.hostname.contains('\0') {
            return Err(invalid(
                "config.hostname",
                format!(
                    "{:?} is not a valid hostname (at most 64 bytes)",
                    config.hostname
                ),
            ));
        }
        if !handler.is_empty() && !self.inner.handlers.iter().any(|h| h == handler) {
            let mut known: Vec<String> = self
                .inner
                .handlers
                .iter()
                .map(|h| format!("{h:?}"))
                .collect();
            known.insert(0, "\"\" (default)".into());
            return Err(Error::UnknownHandler {
                handler: handler.to_string(),
                known: known.join(", "),
            });
        }
        let ns = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let userns = userns_request(ns.userns_options.as_ref())?;
        if userns.is_some() {
            for (mode, what) in [(ns.network, "network"), (ns.pid, "pid"), (ns.ipc, "ipc")] {
                if mode == NS_NODE {
                    return Err(invalid(
                        &format!("config.linux.security_context.namespace_options.{what}"),
                        "the host's namespace cannot be shared by a pod with its own user namespace",
                    ));
                }
            }
            if config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .is_some_and(|s| s.privileged)
            {
                return Err(invalid(
                    "config.linux.security_context.privileged",
                    "a privileged pod cannot have its own user namespace",
                ));
            }
        }
        if ns.pid == cri::NamespaceMode::Target as i32
            || ns.network == cri::NamespaceMode::Target as i32
            || ns.ipc == cri::NamespaceMode::Target as i32
        {
            return Err(invalid(
                "config.linux.security_context.namespace_options",
                "TARGET mode is only for containers",
            ));
        }
        let (network, pid, ipc) = (ns.network, ns.pid, ns.ipc);
        let sysctls = sysctls(&config, network, ipc)?;
        let selinux = self.check_profiles(&config)?;
        // The level is held from here; released again on every failure below.
        let held = selinux.clone();
        let fail = |e: Error| {
            self.release_level(held.as_ref());
            Err(e)
        };

        let key = name_key(Some(meta));
        let id = match random_id() {
            Ok(id) => id,
            Err(e) => return fail(io_err(Path::new("getrandom"))(e)),
        };
        if let Err(existing) = self.inner.records.reserve(&key, &id) {
            return fail(Error::NameReserved {
                name: key,
                id: existing,
            });
        }
        let userns = match userns {
            None => None,
            Some(asked) => match self.reserve_userns(&id, asked) {
                Ok(u) => Some(u),
                Err(e) => {
                    self.inner.records.release(&key);
                    return fail(e);
                }
            },
        };
        let paths = self.paths(&id);
        let cgroup_parent = config
            .linux
            .as_ref()
            .map(|l| l.cgroup_parent.clone())
            .unwrap_or_default();
        let result = self
            .create(
                &id, &paths, config, handler, network, pid, ipc, sysctls, userns, image, selinux,
            )
            .await;
        match result {
            Ok(record) => {
                self.inner.records.insert(id.clone(), record);
                Ok(id)
            }
            Err(e) => {
                remove_files(&paths);
                // Whatever cgroups (and units) were made before the failure.
                let policy = &self.inner.cgroups;
                if let (Some(h), Ok((rel, owned))) =
                    (&policy.hierarchy, policy.pod_path(&cgroup_parent, &id))
                    && let (Ok(pod), Ok(pause)) = (
                        h.cgroup(&rel),
                        h.cgroup(&format!("{rel}/{}", policy.leaf(&id))),
                    )
                {
                    // An own slice may be a unit without a directory yet: stop it all the same.
                    let pod =
                        (owned && (pod.exists() || self.inner.systemd.is_some())).then_some(pod);
                    self.discard_cgroups(pod.as_ref(), owned, Some(&pause))
                        .await;
                }
                self.release_userns(&id);
                self.inner.records.release(&key);
                fail(e)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        id: &str,
        paths: &Paths,
        config: cri::PodSandboxConfig,
        handler: &str,
        network: i32,
        pid: i32,
        ipc: i32,
        sysctls: Vec<(String, String)>,
        userns: Option<UserNs>,
        image: Option<SandboxImage>,
        selinux: Option<security::SelinuxLabels>,
    ) -> Result<Record, Error> {
        std::fs::create_dir_all(paths.dir.join("ns")).map_err(io_err(&paths.dir))?;
        let host_net = network == NS_NODE;
        // Without a hostname the pod takes the node's, as containerd does (kubelet always sends
        // one; metadata names may be longer than a hostname can be).
        let hostname = if host_net || config.hostname.is_empty() {
            nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_default()
        } else {
            config.hostname.clone()
        };
        write_file(&paths.hostname(), format!("{hostname}\n").as_bytes())?;
        let hosts = if host_net {
            std::fs::read("/etc/hosts").unwrap_or_default()
        } else {
            default_hosts().into_bytes()
        };
        write_file(&paths.hosts(), &hosts)?;
        let resolv = match &config.dns_config {
            Some(dns) if !host_net => resolv_conf(dns),
            _ => std::fs::read("/etc/resolv.conf").unwrap_or_default(),
        };
        write_file(&paths.resolv(), &resolv)?;
        // The pod's files are its containers' to read (and its shm to write), as containerd
        // labels them.
        if let Some(l) = &selinux {
            for f in [paths.hostname(), paths.hosts(), paths.resolv()] {
                runtime::selinux::relabel(&f, &l.mount).map_err(io_err(&f))?;
            }
        }
        if ipc != NS_NODE {
            let shm = paths.shm();
            std::fs::create_dir_all(&shm).map_err(io_err(&shm))?;
            let mut opts = "mode=1777,size=65536k".to_string();
            if let Some(l) = &selinux {
                opts.push_str(&format!(",context=\"{}\"", l.mount));
            }
            mount(
                Some("shm"),
                &shm,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some(opts.as_str()),
            )
            .map_err(|e| io_err(&shm)(e.into()))?;
        }

        let pause_image = match &image {
            None => None,
            Some(img) => Some(mount_pause_image(
                paths,
                img,
                selinux.as_ref().map(|l| l.mount.as_str()),
            )?),
        };
        let (pod_cgroup, owns_cgroup, pause_cgroup) = self.pod_cgroups(id, &config).await?;
        let placement = match (&self.inner.systemd, &pause_cgroup) {
            (Some(sd), Some(cg)) => Some(Placement::of(sd, cg)?),
            _ => None,
        };
        let pause_cfg = PauseConfig {
            image: pause_image,
            cgroup: pause_cgroup.as_ref().map(|c| c.path.clone()),
            placed: placement.is_some(),
            selinux_label: selinux.as_ref().map(|l| l.process.clone()),
            new_net: !host_net,
            new_ipc: ipc != NS_NODE,
            // A pod on the host network keeps the host's name too, as containerd does.
            new_uts: !host_net,
            new_pid: pid == NS_POD,
            hostname: (!host_net).then(|| hostname.clone()),
            sysctls,
            uid_map: userns.iter().map(|u| u.uids).collect(),
            gid_map: userns.iter().map(|u| u.gids).collect(),
        };
        let pause = spawn_pause(&pause_cfg, placement).await?;
        let mut namespaces = Vec::new();
        for (kind, created) in [
            ("user", userns.is_some()),
            ("net", pause_cfg.new_net),
            ("ipc", pause_cfg.new_ipc),
            ("uts", pause_cfg.new_uts),
            ("pid", pause_cfg.new_pid),
        ] {
            if !created {
                continue;
            }
            let target = paths.ns(kind);
            std::fs::File::create(&target).map_err(io_err(&target))?;
            let source = format!("/proc/{}/ns/{kind}", pause.pid);
            if let Err(e) = mount(
                Some(source.as_str()),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            ) {
                let _ = pause.signal(libc::SIGKILL);
                return Err(io_err(&target)(e.into()));
            }
            namespaces.push(kind.to_string());
        }
        let record = Record {
            id: id.to_string(),
            config,
            runtime_handler: handler.to_string(),
            created_at: now_nanos(),
            ready: true,
            pause: Some(pause),
            network,
            pid,
            ipc,
            namespaces,
            cgroup: pod_cgroup,
            owns_cgroup,
            pause_cgroup,
            userns,
            image_chain: image.and_then(|i| i.chain),
            selinux,
        };
        if let Err(e) = atomic::write_json(&paths.state(), &record) {
            let _ = pause.signal(libc::SIGKILL);
            return Err(io_err(&paths.state())(e));
        }
        Ok(record)
    }

    /// Creates the pod's cgroup (kubelet's parent or crius's own) with the pod-level limits, and
    /// the pause process's leaf below it. Without cgroup v2, limits are refused unless the
    /// operator allowed running unenforced.
    async fn pod_cgroups(
        &self,
        id: &str,
        config: &cri::PodSandboxConfig,
    ) -> Result<(Option<Cgroup>, bool, Option<Cgroup>), Error> {
        let linux = config.linux.clone().unwrap_or_default();
        let res = resources(linux.resources.as_ref().unwrap_or(&Default::default()));
        let overhead = resources(linux.overhead.as_ref().unwrap_or(&Default::default()));
        let limits = cgroup::pod_limits(&res, &overhead);
        let policy = &self.inner.cgroups;
        let Some(h) = &policy.hierarchy else {
            if limits.limits_anything() && !policy.allow_unenforced {
                return Err(Error::Unenforceable {
                    what: "config.linux.resources".into(),
                });
            }
            return Ok((None, false, None));
        };
        let (rel, owned) = policy
            .pod_path(&linux.cgroup_parent, id)
            .map_err(|r| invalid("config.linux.cgroup_parent", r))?;
        let pod = h
            .cgroup(&rel)
            .map_err(|e| invalid("config.linux.cgroup_parent", e.to_string()))?;
        let files = cgroup::files(&limits).map_err(|r| invalid("config.linux.resources", r))?;
        let pause = h
            .cgroup(&format!("{rel}/{}", policy.leaf(id)))
            .map_err(|e| invalid("config.linux.cgroup_parent", e.to_string()))?;
        let cg_err = |c: &Cgroup| {
            let path = c.path.clone();
            move |source: io::Error| Error::Cgroup { path, source }
        };
        match &self.inner.systemd {
            // The pause scope is made around the process (see `spawn_pause`); a pod slice of
            // crius's own is a unit too. A slice kubelet names is kubelet's to make.
            Some(sd) => {
                if owned && let Some((unit, _)) = crate::systemd::unit_and_slice(&pod.path) {
                    sd.start_slice(&unit, &pod.path, &files).await?;
                    pod.create(&cgroup::CONTROLLERS).map_err(cg_err(&pod))?;
                }
            }
            None => {
                pod.create(&cgroup::CONTROLLERS).map_err(cg_err(&pod))?;
                pause.create(&cgroup::CONTROLLERS).map_err(cg_err(&pause))?;
            }
        }
        if owned || self.inner.systemd.is_none() {
            for (file, value) in files {
                pod.set(&file, &value).map_err(cg_err(&pod))?;
            }
        }
        Ok((Some(pod), owned, Some(pause)))
    }

    /// Stops the pause process (its containers must be stopped first). Idempotent.
    pub async fn stop(&self, id: &str) -> Result<(), Error> {
        let entry = match self.entry(id) {
            Ok(e) => e,
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut r = entry.lock().await;
        if let Some(p) = r.pause {
            let _ = p.signal(libc::SIGTERM);
            if !wait_for_exit(p, Duration::from_secs(2)).await {
                let _ = p.signal(libc::SIGKILL);
                wait_for_exit(p, Duration::from_secs(5)).await;
            }
        }
        if r.ready {
            r.ready = false;
            let path = self.paths(&r.id).state();
            atomic::write_json(&path, &*r).map_err(io_err(&path))?;
        }
        Ok(())
    }

    /// Removes everything the sandbox left: namespace handles, the shm mount, files, the record.
    /// Idempotent.
    pub async fn remove(&self, id: &str) -> Result<(), Error> {
        let entry = match self.entry(id) {
            Ok(e) => e,
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.stop(id).await?;
        let r = entry.lock().await;
        remove_files(&self.paths(&r.id));
        self.discard_cgroups(r.cgroup.as_ref(), r.owns_cgroup, r.pause_cgroup.as_ref())
            .await;
        self.release_userns(&r.id);
        self.release_level(r.selinux.as_ref());
        self.inner.records.remove(&r.id);
        self.inner.records.release(&r.name_key());
        Ok(())
    }

    /// Whether the sandbox is ready right now (its pause process lives).
    fn ready(r: &Record) -> bool {
        r.ready && r.pause.is_some_and(|p| p.alive())
    }

    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<(cri::PodSandboxStatus, HashMap<String, String>), Error> {
        let r = self.get(id).await?;
        let ready = Self::ready(&r);
        let status = cri::PodSandboxStatus {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: if ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            } as i32,
            created_at: r.created_at,
            network: Some(cri::PodSandboxNetworkStatus::default()),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: Some(cri::NamespaceOption {
                        network: r.network,
                        pid: r.pid,
                        ipc: r.ipc,
                        userns_options: Some(match &r.userns {
                            None => cri::UserNamespace {
                                mode: NS_NODE,
                                ..Default::default()
                            },
                            Some(u) => {
                                let m = |x: &IdMapping| cri::IdMapping {
                                    host_id: x.host_id,
                                    container_id: x.container_id,
                                    length: x.size,
                                };
                                cri::UserNamespace {
                                    mode: NS_POD,
                                    uids: vec![m(&u.uids)],
                                    gids: vec![m(&u.gids)],
                                }
                            }
                        }),
                        ..Default::default()
                    }),
                }),
            }),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            runtime_handler: r.runtime_handler.clone(),
        };
        let mut info = HashMap::new();
        if verbose {
            let paths = self.paths(&r.id);
            let v = serde_json::json!({
                "pid": r.pause.map(|p| p.pid),
                "netNamespacePath": r.namespaces.iter().any(|n| n == "net").then(|| paths.ns("net")),
                "namespaces": r.namespaces.iter().map(|k| (k.clone(), paths.ns(k))).collect::<BTreeMap<_, _>>(),
                "runtimeHandler": r.runtime_handler,
                "cgroup": r.cgroup.as_ref().map(|c| c.path.clone()),
                "network": "loopback only",
                "config": r.config,
            });
            info.insert("info".to_string(), v.to_string());
        }
        Ok((status, info))
    }

    pub async fn list(&self, filter: Option<&cri::PodSandboxFilter>) -> Vec<cri::PodSandbox> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let r = e.lock().await;
            let state = if Self::ready(&r) {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            } as i32;
            if let Some(f) = filter {
                if !f.id.is_empty() && !r.id.starts_with(&f.id) {
                    continue;
                }
                if let Some(s) = &f.state
                    && s.state != state
                {
                    continue;
                }
                if !labels_match(&r.config.labels, &f.label_selector) {
                    continue;
                }
            }
            out.push(cri::PodSandbox {
                id: r.id.clone(),
                metadata: r.config.metadata.clone(),
                state,
                created_at: r.created_at,
                labels: r.config.labels.clone(),
                annotations: r.config.annotations.clone(),
                runtime_handler: r.runtime_handler.clone(),
            });
        }
        out.sort_by_key(|s| s.created_at);
        out
    }
}

/// Every selector pair must be among the labels.
pub fn labels_match(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn write_file(path: &Path, data: &[u8]) -> Result<(), Error> {
    atomic::write(path, data, 0o644).map_err(io_err(path))
}

fn default_hosts() -> String {
    "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n".to_string()
}

fn resolv_conf(dns: &cri::DnsConfig) -> Vec<u8> {
    let mut s = String::new();
    if !dns.searches.is_empty() {
        s.push_str(&format!("search {}\n", dns.searches.join(" ")));
    }
    for ns in &dns.servers {
        s.push_str(&format!("nameserver {ns}\n"));
    }
    if !dns.options.is_empty() {
        s.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    s.into_bytes()
}

/// Validates the pod's sysctls: only namespaced ones, and only for namespaces the pod owns.
fn sysctls(
    config: &cri::PodSandboxConfig,
    network: i32,
    ipc: i32,
) -> Result<Vec<(String, String)>, Error> {
    let Some(linux) = &config.linux else {
        return Ok(Vec::new());
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for (key, value) in &linux.sysctls {
        let field = format!("config.linux.sysctls[{key:?}]");
        let k = key.replace('/', ".");
        if k.is_empty() || k.split('.').any(|c| c.is_empty() || c == "..") || value.contains('\n') {
            return Err(invalid(&field, "is not a valid sysctl"));
        }
        let ipc_key = k.starts_with("kernel.shm")
            || k.starts_with("kernel.msg")
            || k == "kernel.sem"
            || k.starts_with("fs.mqueue.");
        if k.starts_with("net.") {
            if network == NS_NODE {
                return Err(invalid(
                    &field,
                    "a pod on the host network cannot set network sysctls",
                ));
            }
        } else if ipc_key {
            if ipc == NS_NODE {
                return Err(invalid(
                    &field,
                    "a pod in the host IPC namespace cannot set IPC sysctls",
                ));
            }
        } else {
            return Err(invalid(
                &field,
                "is not a namespaced sysctl (only net.*, kernel.shm*, kernel.msg*, kernel.sem and fs.mqueue.* are)",
            ));
        }
        out.push((k, value.clone()));
    }
    out.sort();
    Ok(out)
}

/// Where systemd is to put a process: its scope, the slice the scope goes in, and the cgroup
/// path the process must show once there.
pub struct Placement {
    pub manager: Arc<crate::systemd::Manager>,
    pub unit: String,
    pub slice: String,
    pub cgroup: String,
}

impl Placement {
    pub fn of(manager: &Arc<crate::systemd::Manager>, cg: &Cgroup) -> Result<Placement, Error> {
        let bad = || Error::Invalid {
            field: "cgroup".into(),
            reason: format!("{} is not a systemd unit's cgroup", cg.path.display()),
        };
        let (unit, slice) = crate::systemd::unit_and_slice(&cg.path).ok_or_else(bad)?;
        let rel = cg.path.strip_prefix(&cg.root).map_err(|_| bad())?;
        Ok(Placement {
            manager: manager.clone(),
            unit,
            slice,
            cgroup: rel.to_string_lossy().into_owned(),
        })
    }

    /// Starts the scope around `pid` with `limits`; returns once the process is in it.
    pub async fn start(
        &self,
        pid: i32,
        limits: &[(String, String)],
    ) -> Result<(), crate::systemd::Error> {
        self.manager
            .start_scope(&self.unit, &self.slice, pid, &self.cgroup, limits)
            .await
    }

    /// Tells the process waiting to be placed (on its stdin, `to`) whether it is: `go`, or why
    /// not (see `runtime::await_placement`).
    pub async fn answer<E: std::fmt::Display>(
        to: Option<&mut tokio::process::ChildStdin>,
        result: &Result<(), E>,
    ) {
        if let Some(to) = to {
            let word = match result {
                Ok(()) => "go\n".to_string(),
                Err(e) => format!("{e}\n"),
            };
            let _ = tokio::io::AsyncWriteExt::write_all(to, word.as_bytes()).await;
        }
    }
}

async fn spawn_pause(cfg: &PauseConfig, placement: Option<Placement>) -> Result<ProcessId, Error> {
    let json = serde_json::to_string(cfg).map_err(|e| Error::Pause {
        message: e.to_string(),
    })?;
    let spawned = tokio::process::Command::new(runtime::SELF_EXE)
        .arg0("crius")
        .arg("pause")
        .arg(json)
        .stdin(if placement.is_some() {
            std::process::Stdio::piped()
        } else {
            std::process::Stdio::null()
        })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let mut child = spawned.map_err(|e| Error::Pause {
        message: format!("spawn: {e}"),
    })?;
    let stdout = child.stdout.take().ok_or_else(|| Error::Pause {
        message: "no stdout".into(),
    })?;
    if let Some(p) = placement {
        let mut stdin = child.stdin.take();
        let pid = child.id().unwrap_or(0) as i32;
        let placed = p.start(pid, &[]).await;
        Placement::answer(stdin.as_mut(), &placed).await;
        drop(stdin);
        if let Err(e) = placed {
            let _ = child.start_kill();
            return Err(e.into());
        }
    }
    let mut line = String::new();
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::BufReader::new(stdout).read_line(&mut line),
    )
    .await;
    // The child is left to tokio, which reaps it when it exits.
    drop(child);
    match read {
        Err(_) => {
            return Err(Error::Pause {
                message: "no answer within 30 s".into(),
            });
        }
        Ok(Err(e)) => {
            return Err(Error::Pause {
                message: e.to_string(),
            });
        }
        Ok(Ok(_)) => {}
    }
    match serde_json::from_str::<PauseReport>(line.trim()) {
        Ok(PauseReport::Ready { pid, start_time }) => Ok(ProcessId { pid, start_time }),
        Ok(PauseReport::Failed { message }) => Err(Error::Pause { message }),
        Err(_) => Err(Error::Pause {
            message: format!("unexpected answer {:?}", line.trim()),
        }),
    }
}

/// Mounts the pause image's root filesystem (its layers under a writable layer of the pod's own)
/// at `rootfs` in the sandbox directory.
fn mount_pause_image(
    paths: &Paths,
    image: &SandboxImage,
    label: Option<&str>,
) -> Result<PauseImage, Error> {
    let (uid, gid) = image.ids()?;
    let rootfs = paths.dir.join("rootfs");
    runtime::mounts::overlay(
        &rootfs,
        &image.lowerdirs,
        &paths.dir.join("layer"),
        MsFlags::MS_NODEV | MsFlags::MS_NOSUID,
        label,
    )
    .map_err(io_err(&rootfs))?;
    Ok(PauseImage {
        rootfs,
        args: image.args.clone(),
        env: image.env.clone(),
        uid,
        gid,
        cwd: image.cwd.clone(),
    })
}

/// CRI resources as plain numbers.
pub fn resources(r: &cri::LinuxContainerResources) -> Resources {
    Resources {
        cpu_period: r.cpu_period,
        cpu_quota: r.cpu_quota,
        cpu_shares: r.cpu_shares,
        memory_limit: r.memory_limit_in_bytes,
        memory_swap_limit: r.memory_swap_limit_in_bytes,
        cpuset_cpus: r.cpuset_cpus.clone(),
        cpuset_mems: r.cpuset_mems.clone(),
        hugepage_limits: r
            .hugepage_limits
            .iter()
            .map(|h| (h.page_size.clone(), h.limit))
            .collect(),
        pids_limit: 0,
        unified: r.unified.clone().into_iter().collect(),
    }
}

/// The user namespace a pod asks for: none (NODE, or nothing), or its maps; in POD mode
/// without maps crius picks them. As kubelet expects: one range each, starting at container ID
/// 0; CONTAINER and TARGET modes are not for user namespaces.
fn userns_request(u: Option<&cri::UserNamespace>) -> Result<Option<Option<UserNs>>, Error> {
    const FIELD: &str = "config.linux.security_context.namespace_options.userns_options";
    let Some(u) = u else {
        return Ok(None);
    };
    match u.mode {
        NS_NODE => {
            if !u.uids.is_empty() || !u.gids.is_empty() {
                return Err(invalid(
                    FIELD,
                    "NODE mode uses the host's user namespace: no uids or gids may be given",
                ));
            }
            return Ok(None);
        }
        NS_POD => {}
        m => {
            return Err(invalid(
                &format!("{FIELD}.mode"),
                format!(
                    "{} mode is not supported for user namespaces (POD or NODE)",
                    cri::NamespaceMode::try_from(m)
                        .map(|m| m.as_str_name())
                        .unwrap_or("unknown")
                ),
            ));
        }
    }
    if u.uids.is_empty() && u.gids.is_empty() {
        return Ok(Some(None));
    }
    let one = |maps: &[cri::IdMapping], what: &str| -> Result<IdMapping, Error> {
        let f = format!("{FIELD}.{what}");
        let [m] = maps else {
            return Err(invalid(
                &f,
                format!("exactly one mapping is supported, got {}", maps.len()),
            ));
        };
        if m.container_id != 0 {
            return Err(invalid(
                &f,
                format!(
                    "the mapping must start at container ID 0 (got {}): ID 0 would not be mapped",
                    m.container_id
                ),
            ));
        }
        if m.length == 0 || m.host_id as u64 + m.length as u64 > u32::MAX as u64 {
            return Err(invalid(
                &f,
                format!("host IDs {} + {} are out of range", m.host_id, m.length),
            ));
        }
        if m.host_id == 0 {
            return Err(invalid(&f, "host ID 0 (the host's root) may not be mapped"));
        }
        Ok(IdMapping {
            container_id: 0,
            host_id: m.host_id,
            size: m.length,
        })
    };
    Ok(Some(Some(UserNs {
        uids: one(&u.uids, "uids")?,
        gids: one(&u.gids, "gids")?,
    })))
}

/// Unmounts and deletes a sandbox directory; tolerant of anything already gone.
fn remove_files(paths: &Paths) {
    for kind in ["user", "net", "ipc", "uts", "pid"] {
        let p = paths.ns(kind);
        if p.exists() {
            let _ = umount2(&p, MntFlags::MNT_DETACH);
        }
    }
    let shm = paths.shm();
    if shm.exists() {
        let _ = umount2(&shm, MntFlags::MNT_DETACH);
    }
    // The pause image's rootfs, if any, is detached with whatever else is mounted below.
    if let Err(e) = runtime::mounts::remove_tree(&paths.dir) {
        tracing::warn!(dir = %paths.dir.display(), error = %e, "removing sandbox directory");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(sysctls: &[(&str, &str)]) -> cri::PodSandboxConfig {
        cri::PodSandboxConfig {
            linux: Some(cri::LinuxPodSandboxConfig {
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
                NS_POD,
                NS_POD
            )
            .is_ok()
        );
        assert!(
            sysctls(
                &config(&[("net/ipv4/ping_group_range", "0 1")]),
                NS_POD,
                NS_POD
            )
            .is_ok()
        );
        let e = sysctls(&config(&[("vm.swappiness", "1")]), NS_POD, NS_POD)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vm.swappiness") && e.contains("namespaced"),
            "{e}"
        );
        assert!(sysctls(&config(&[("net.ipv4.ip_forward", "1")]), NS_NODE, NS_POD).is_err());
        assert!(sysctls(&config(&[("kernel.msgmax", "1")]), NS_POD, NS_NODE).is_err());
        assert!(sysctls(&config(&[("net..x", "1")]), NS_POD, NS_POD).is_err());
    }

    #[test]
    fn resolv_and_labels() {
        let dns = cri::DnsConfig {
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
