//! CreateContainer: the container's image, user and confinement (seccomp, AppArmor, SELinux,
//! resolved and applied by `confinement`) resolved, its rootfs mounted (the image's snapshots
//! under a fresh writable layer) and its bundle written (`config.json`, `monitor.json`, the
//! record); what a failed creation made is undone.

use super::confinement::apply_confinement;
use super::steps::Steps;
use super::{
    Bundle, Cgroup, Confinement, ContainerConfig, ContainerService, ContainerState, Digest, Error,
    ImageVolume, JoinNamespace, MonitorConfig, MsFlags, NamespaceMode, Path, PathBuf, Record,
    atomic, attach_devices, checkpoint, config, discard_files, events, grants, image, invalid, io,
    io_err, logs, mounts, notice, now_nanos, process_match, random_id, restore, runtime, sandbox,
    spec, user,
};

/// A container being created, as `create` checked and reserved it: what `prepare` makes its
/// writable layer, rootfs, spec and bundle from.
struct NewContainer<'a> {
    id: &'a str,
    bundle: &'a Bundle,
    config: &'a ContainerConfig,
    sandbox: &'a sandbox::Record,
    image: &'a image::Image,
    /// Where its log goes on the node (the pod's log directory joined with its own path).
    log_path: Option<&'a Path>,
    confinement: &'a Confinement,
    /// Another container's PID namespace, joined in TARGET mode.
    target_pid: Option<&'a Path>,
    /// The checkpoint archive it is restored from, unpacked.
    archive: Option<&'a restore::Unpacked>,
    /// Whether its config must describe the checkpointed process (RestorePod's), not replace
    /// it (restore through CreateContainer, whose command is not used).
    same_process: bool,
    /// Its image volumes, mounted.
    volumes: &'a [ImageVolume],
    steps: &'a mut Steps,
}

/// What a RestorePod container is made from: the image its checkpoint was made of (checked to
/// be its config's) and its archive, unpacked.
pub(super) struct Restoring {
    pub image: std::sync::Arc<image::Image>,
    pub unpacked: restore::Unpacked,
}

impl ContainerService {
    pub async fn create(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        _sandbox_config: Option<crate::sandbox::config::PodConfig>,
    ) -> Result<String, Error> {
        self.create_from(sandbox_id, config, None).await
    }

    /// CreateContainer, or RestorePod's creation of a container from `restoring`.
    pub(super) async fn create_from(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        restoring: Option<Restoring>,
    ) -> Result<String, Error> {
        let mut steps = Steps::new();
        let meta = config
            .metadata
            .as_ref()
            .ok_or_else(|| invalid("config.metadata", "is required"))?;
        if meta.name.is_empty() {
            return Err(invalid("config.metadata.name", "is required"));
        }
        // Held until the container is listed: a plugin synchronizing meanwhile sees it.
        let _nri = match &self.inner.nri {
            Some(n) => Some(n.hold_sync().await),
            None => None,
        };
        let sandbox = self.inner.sandboxes.get(sandbox_id).await?;
        if !sandbox.ready {
            return Err(sandbox::Error::NotReady {
                id: sandbox.id.clone(),
            }
            .into());
        }
        let same_process = restoring.is_some();
        let (image, archive) = match restoring {
            Some(r) => (r.image, Some(r.unpacked)),
            None => self.container_image(&config).await?,
        };
        let log_path = log_path(&config, &sandbox)?;
        mounts::cri_mounts(&config, &[])?;
        let sc = config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref());
        let ns = sc
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let target_pid = if ns.pid == NamespaceMode::Target {
            Some(self.target_pid_ns(&ns.target_id, &sandbox.id).await?)
        } else {
            None
        };
        let confinement = self.confinement(sc, sandbox.selinux.as_ref())?;
        check_userns(&config, &sandbox)?;

        let id = random_id().map_err(io_err(Path::new("getrandom")))?;
        let key = format!("{}/{}/{}", sandbox.id, meta.name, meta.attempt);
        if let Err(taken) = self.inner.records.reserve(&key, &id) {
            return Err(Error::NameReserved {
                name: format!(
                    "{} (attempt {}) in pod {}",
                    meta.name, meta.attempt, sandbox.id
                ),
                id: taken.holder,
            });
        }
        steps.mark("checks");
        let b = self.bundle(&id);
        let hold = image.top_chain().cloned();
        if let Some(c) = &hold {
            self.inner.images.hold(c);
        }
        let mut volumes = Vec::new();
        let result = match self.mount_image_volumes(&id, &b, &config, &sandbox) {
            Err(e) => Err(e),
            Ok(v) => {
                volumes = v;
                steps.mark("image volumes");
                self.prepare(NewContainer {
                    id: &id,
                    bundle: &b,
                    config: &config,
                    sandbox: &sandbox,
                    image: &image,
                    log_path: log_path.as_deref(),
                    confinement: &confinement,
                    target_pid: target_pid.as_deref(),
                    archive: archive.as_ref(),
                    same_process,
                    volumes: &volumes,
                    steps: &mut steps,
                })
                .await
            }
        };
        match result {
            Ok(record) => {
                let created = notice(&record, events::EventKind::Created, record.created_at);
                let told = record.clone();
                self.inner.records.insert(id.clone(), record);
                self.inner.events.emit(created);
                steps.mark("listed");
                self.nri_created(&told).await;
                steps.mark("nri created");
                steps.log("container created", &id);
                Ok(id)
            }
            Err(e) => {
                self.undo_create(&id, &key, b, &sandbox, hold.as_ref(), &volumes)
                    .await;
                Err(e)
            }
        }
    }

    /// The image a new container is made of, and the checkpoint archive it is restored from
    /// when its config names one (the container is then made of the image it was made of).
    async fn container_image(
        &self,
        config: &ContainerConfig,
    ) -> Result<(std::sync::Arc<image::Image>, Option<restore::Unpacked>), Error> {
        let image_name = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        if image_name.is_empty() {
            return Err(invalid("config.image.image", "is required"));
        }
        if checkpoint::is_archive(&image_name) {
            let (image, unpacked) = self
                .checkpoint_image(Path::new(&image_name), config.tty)
                .await?;
            return Ok((image, Some(unpacked)));
        }
        let Some(image) = self.inner.images.lookup(&image_name)? else {
            // An image taken out because its layers did not match says so, not "not found".
            return Err(match self.inner.images.refusal(&image_name) {
                Some(why) => why.into(),
                None => Error::ImageNotFound { image: image_name },
            });
        };
        Ok((image, None))
    }

    /// Undoes a container `prepare` (or the mounting of its image volumes) failed to make: its
    /// bundle and layer, its cgroup, its image's hold, its image volumes, and last its name.
    async fn undo_create(
        &self,
        id: &str,
        key: &str,
        b: Bundle,
        sandbox: &sandbox::Record,
        hold: Option<&Digest>,
        volumes: &[ImageVolume],
    ) {
        discard_files(b).await;
        if let Some(pod) = &sandbox.cgroup {
            let cg = Cgroup {
                root: pod.root.clone(),
                path: pod.path.join(self.inner.sandboxes.cgroups().leaf(id)),
            };
            if cg.path.exists()
                && let Err(e) = sandbox::remove_cgroup(&cg).await
            {
                tracing::warn!(cgroup = %cg.path.display(), error = %e, "removing cgroup");
            }
        }
        self.remove_devices_v1_cgroup(id).await;
        if let Some(c) = hold {
            self.inner.images.release(c);
        }
        self.release_image_volumes(id, volumes);
        self.inner.records.release(key);
    }

    /// The PID namespace of a running container of the same pod, for TARGET mode.
    pub(super) async fn target_pid_ns(&self, target: &str, pod: &str) -> Result<PathBuf, Error> {
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
            Some(p) if r.state == ContainerState::Running && p.alive() => {
                Ok(PathBuf::from(format!("/proc/{}/ns/pid", p.pid)))
            }
            _ => Err(invalid(FIELD, format!("container {} is not running", r.id))),
        }
    }

    /// Makes the container `new` describes: its writable layer and rootfs, its spec and monitor
    /// configuration, and its record, all written to its bundle. What it leaves on failure is
    /// `undo_create`'s to remove.
    async fn prepare(&self, new: NewContainer<'_>) -> Result<Record, Error> {
        let b = new.bundle;
        if new.archive.is_some() && new.sandbox.userns.is_some() {
            return Err(invalid(
                "config.image.image",
                "a checkpoint cannot be restored in a pod with a user namespace",
            ));
        }
        let project = self.layer_dirs(&new)?;
        new.steps.mark("writable layer");
        let mut lowers = self.lower_dirs(&new)?;
        if let Some(u) = &new.sandbox.userns {
            lowers = self.userns_layers(&new, u, &lowers)?;
        }
        if let Some(a) = new.archive {
            self.unpack_archive(a, b).await?;
        }
        let rootfs = b.rootfs();
        mount_rootfs(&new, &rootfs, &lowers)?;
        crate::fault::point("rootfs.mount.after");
        new.steps.mark("rootfs mount");

        let mut user = resolve_user(&new, &rootfs)?;
        new.steps.mark("user");
        let cgroup = self.container_cgroup(new.id, new.sandbox, new.config)?;
        new.steps.mark("cgroup");
        let sandbox_paths = self.inner.sandboxes.paths(&new.sandbox.id);
        let mut oci =
            self.container_spec(&new, &rootfs, &sandbox_paths, &mut user, cgroup.is_some())?;
        new.steps.mark("spec");
        let adjusted = self
            .nri_adjust(new.id, new.sandbox, new.config, &mut oci)
            .await?;
        new.steps.mark("nri");
        if let Some(a) = new.archive
            && new.same_process
        {
            process_match::check_process(a.archive(), &b.dir.join("restore"), &oci)?;
        }
        if let (Some(res), Some(cg)) = (&adjusted, &cgroup)
            && !self.scoped(Some(cg))
        {
            self.rewrite_limits(cg, res)?;
        }
        check_working_dir(&rootfs, &oci)?;
        let scoped = self.scoped(cgroup.as_ref());
        if let Some(cg) = &cgroup
            && !scoped
        {
            attach_devices(cg, &oci)?;
        }
        let devices_cgroup = self.devices_v1_cgroup(new.id, &oci, cgroup.is_some())?;
        let (join, pid_mode) = namespaces(&new, &sandbox_paths)?;
        let mut monitor = monitor_config(
            &new,
            &sandbox_paths,
            join,
            pid_mode,
            cgroup.as_ref(),
            scoped,
        );
        monitor.devices_cgroup = devices_cgroup;
        if let Some(a) = new.archive {
            if !monitor.new_pid_ns {
                return Err(invalid(
                    "config.linux.security_context.namespace_options.pid",
                    "a restored container needs its own PID namespace",
                ));
            }
            monitor.restore = Some(self.restore_config(a.archive(), b, &oci, &monitor)?);
        }
        apply_confinement(new.confinement, b, new.config, &mut oci, &mut monitor)?;
        if let Some(a) = new.archive {
            let old = grants::dumped_spec(a.archive(), &b.dir.join("restore"))?;
            grants::check(&old, &oci)?;
        }
        new.steps.mark("devices and confinement");
        let cfg_path = b.dir.join("config.json");
        atomic::write_json(&cfg_path, &oci).map_err(io_err(&cfg_path))?;
        new.steps.mark("config.json");
        let mon_path = b.dir.join("monitor.json");
        atomic::write_json(&mon_path, &monitor).map_err(io_err(&mon_path))?;
        new.steps.mark("monitor.json");
        let mut record = new_record(
            &new,
            &user,
            cgroup,
            project,
            pid_mode == NamespaceMode::Container,
        );
        if let Some(res) = adjusted {
            // The record's limits are what the cgroup got (a systemd scope is written from it).
            record.config.linux.get_or_insert_default().resources = Some(res);
        }
        atomic::write_json(&b.record(), &record).map_err(io_err(&b.record()))?;
        new.steps.mark("record");
        Ok(record)
    }

    /// Makes the container's writable layer, charged to a project of its own from the start,
    /// and its bundle's directories; returns the layer's project ID.
    fn layer_dirs(&self, new: &NewContainer<'_>) -> Result<Option<u32>, Error> {
        let b = new.bundle;
        std::fs::create_dir_all(&b.layer).map_err(io_err(&b.layer))?;
        // Before anything is written in it: all below is charged to its project.
        let project = self
            .inner
            .layer_usage
            .assign(&b.layer, new.id)
            .map_err(io_err(&b.layer))?;
        for d in [
            b.dir.clone(),
            b.rootfs(),
            b.layer.join("upper"),
            b.layer.join("work"),
        ] {
            std::fs::create_dir_all(&d).map_err(io_err(&d))?;
        }
        Ok(project)
    }

    /// The image's snapshots the rootfs stacks, top first; an empty directory of the layer's
    /// for an image without layers.
    fn lower_dirs(&self, new: &NewContainer<'_>) -> Result<Vec<PathBuf>, Error> {
        let mut lowers = match new.image.top_chain() {
            Some(_) => self.inner.images.lowerdirs(new.image)?,
            None => Vec::new(),
        };
        if lowers.is_empty() {
            let empty = new.bundle.layer.join("empty");
            std::fs::create_dir_all(&empty).map_err(io_err(&empty))?;
            lowers.push(empty);
        }
        Ok(lowers)
    }

    /// The layers seen through the pod's user namespace `u` (idmapped mounts in the layer's
    /// `idmap` directory): files of host root are the container's root's. The writable layer
    /// is given to the container's root.
    fn userns_layers(
        &self,
        new: &NewContainer<'_>,
        u: &sandbox::UserNs,
        lowers: &[PathBuf],
    ) -> Result<Vec<PathBuf>, Error> {
        let b = new.bundle;
        let ns = self.inner.sandboxes.paths(&new.sandbox.id).ns("user");
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
        let upper = b.layer.join("upper");
        std::os::unix::fs::chown(&upper, Some(u.uids.host_id), Some(u.gids.host_id))
            .map_err(io_err(&upper))?;
        Ok(mapped)
    }

    /// The container's OCI spec with its CDI devices injected; the groups CDI adds go to
    /// `user` too, for the processes exec'd in it.
    fn container_spec(
        &self,
        new: &NewContainer<'_>,
        rootfs: &Path,
        sandbox_paths: &sandbox::Paths,
        user: &mut user::User,
        cgroup: bool,
    ) -> Result<oci_spec::runtime::Spec, Error> {
        let mut oci = spec::build(&spec::Context {
            config: new.config,
            sandbox: new.sandbox,
            sandbox_paths,
            image: new.image,
            rootfs,
            user,
            cgroup,
            image_volumes: new.volumes,
        })?;
        super::cdi::inject(self.inner.cdi.as_ref(), new.config, &mut oci)?;
        // CDI may add groups: exec'd processes get them too.
        if let Some(g) = oci
            .process()
            .as_ref()
            .and_then(|p| p.user().additional_gids().as_ref())
        {
            user.additional_gids.clone_from(g);
        }
        Ok(oci)
    }
}

/// The container's log file on the node: its relative `log_path` below the pod's absolute log
/// directory; none when either is unset.
fn log_path(config: &ContainerConfig, sandbox: &sandbox::Record) -> Result<Option<PathBuf>, Error> {
    if config.log_path.is_empty() || sandbox.config.log_directory.is_empty() {
        return Ok(None);
    }
    let dir = Path::new(&sandbox.config.log_directory);
    if !dir.is_absolute() {
        return Err(invalid(
            "sandbox_config.log_directory",
            format!("{:?} must be absolute", sandbox.config.log_directory),
        ));
    }
    logs::check_relative(Path::new(&config.log_path))
        .map_err(|e| invalid("config.log_path", format!("{:?} {e}", config.log_path)))?;
    Ok(Some(dir.join(&config.log_path)))
}

/// Mounts the container's rootfs: the overlay of `lowers` under its writable layer, `nodev`
/// unless the container is privileged.
fn mount_rootfs(new: &NewContainer<'_>, rootfs: &Path, lowers: &[PathBuf]) -> Result<(), Error> {
    let privileged = new
        .config
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
    let mount_label = new.confinement.selinux.as_ref().map(|l| l.mount.as_str());
    runtime::mounts::overlay(rootfs, lowers, &new.bundle.layer, flags, mount_label).map_err(|e| {
        // Too many layers for this kernel: the image's fault, said with the limit.
        if e.kind() == io::ErrorKind::InvalidInput {
            invalid("image", e.to_string())
        } else {
            io_err(rootfs)(e)
        }
    })
}

/// The container's user, from its security context or its image (read in the mounted
/// `rootfs`); in a pod with its own user namespace, every one of its IDs must be mapped there.
fn resolve_user(new: &NewContainer<'_>, rootfs: &Path) -> Result<user::User, Error> {
    let sc = new
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref());
    let user = user::resolve(rootfs, sc, &new.image.config.config.user)
        .map_err(|r| invalid("config.linux.security_context", r))?;
    if let Some(u) = &new.sandbox.userns {
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
    Ok(user)
}

/// The pod's namespaces the container joins (network, IPC and UTS unless the node's; PID in
/// TARGET and POD mode), and the mode of its PID namespace.
fn namespaces(
    new: &NewContainer<'_>,
    sandbox_paths: &sandbox::Paths,
) -> Result<(Vec<JoinNamespace>, NamespaceMode), Error> {
    let sandbox = new.sandbox;
    let ns = new
        .config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .unwrap_or_default();
    let mut join = Vec::new();
    for (kind, mode_known) in [
        ("net", sandbox.network),
        ("ipc", sandbox.ipc),
        ("uts", sandbox.network),
    ] {
        if mode_known != NamespaceMode::Node && sandbox.namespaces.iter().any(|n| n == kind) {
            join.push(JoinNamespace {
                kind: kind.into(),
                path: sandbox_paths.ns(kind),
            });
        }
    }
    let pid_mode = if let Some(path) = new.target_pid {
        // Another container's PID namespace (an ephemeral container's target).
        join.push(JoinNamespace {
            kind: "pid".into(),
            path: path.to_path_buf(),
        });
        NamespaceMode::Target
    } else if ns.pid == NamespaceMode::Node || sandbox.pid == NamespaceMode::Node {
        NamespaceMode::Node
    } else if ns.pid == NamespaceMode::Pod || sandbox.pid == NamespaceMode::Pod {
        NamespaceMode::Pod
    } else {
        NamespaceMode::Container
    };
    if pid_mode == NamespaceMode::Pod {
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
    Ok((join, pid_mode))
}

/// What the container's monitor is told (`monitor.json`), before any confinement or restore.
fn monitor_config(
    new: &NewContainer<'_>,
    sandbox_paths: &sandbox::Paths,
    join: Vec<JoinNamespace>,
    pid_mode: NamespaceMode,
    cgroup: Option<&Cgroup>,
    scoped: bool,
) -> MonitorConfig {
    let (config, sandbox) = (new.config, new.sandbox);
    let (log_dir, log_rel) = match new.log_path {
        Some(_) => (
            Some(PathBuf::from(&sandbox.config.log_directory)),
            Some(PathBuf::from(&config.log_path)),
        ),
        None => (None, None),
    };
    MonitorConfig {
        id: new.id.to_string(),
        log_dir,
        log_path: log_rel,
        stdin: config.stdin,
        stdin_once: config.stdin_once,
        tty: config.tty,
        join,
        new_pid_ns: pid_mode == NamespaceMode::Container,
        exit_file: new.bundle.exit(),
        cgroup: cgroup.map(|c| c.path.clone()),
        devices_cgroup: None,
        placed: scoped,
        seccomp: None,
        userns: sandbox.userns.as_ref().map(|_| sandbox_paths.ns("user")),
        restore: None,
        raw_env: spec::raw_environment(config),
    }
}

/// The record of the new container, created now.
fn new_record(
    new: &NewContainer<'_>,
    user: &user::User,
    cgroup: Option<Cgroup>,
    project: Option<u32>,
    own_pid_ns: bool,
) -> Record {
    let image = new.image;
    Record {
        id: new.id.to_string(),
        sandbox_id: new.sandbox.id.clone(),
        config: new.config.clone(),
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
        state: ContainerState::Created,
        exit_code: 0,
        reason: String::new(),
        message: String::new(),
        init: None,
        monitor: None,
        mnt_ns: None,
        own_pid_ns,
        log_path: new.log_path.map(Path::to_path_buf),
        stop_signal: image.config.config.stop_signal.clone(),
        user: (user.uid, user.gid, user.additional_gids.clone()),
        cgroup,
        project,
        image_volumes: new.volumes.to_vec(),
    }
}

/// A container of a pod with its own user namespace: the container may only restate the pod's
/// namespace, and cannot be privileged or share mounts back to the host.
pub(super) fn check_userns(
    config: &ContainerConfig,
    sandbox: &sandbox::Record,
) -> Result<(), Error> {
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
            (None, NamespaceMode::Node) => u.uids.is_empty() && u.gids.is_empty(),
            (Some(p), NamespaceMode::Pod) => {
                let one = |m: &[config::IdMapping], want: &runtime::IdMapping| {
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
        if m.propagation == config::Propagation::Bidirectional {
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

/// A working directory the image holds as something other than a directory (`/etc/passwd`) is
/// the caller's error, named before anything starts; a missing one is made at start, and one
/// under a mount is the mount's to provide.
fn check_working_dir(rootfs: &Path, oci: &oci_spec::runtime::Spec) -> Result<(), Error> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let Some(cwd) = oci.process().as_ref().map(|p| p.cwd().clone()) else {
        return Ok(());
    };
    let mounted = oci
        .mounts()
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|m| m.destination() != Path::new("/") && cwd.starts_with(m.destination()));
    let rel = cwd.strip_prefix("/").unwrap_or(&cwd);
    if mounted || rel.as_os_str().is_empty() {
        return Ok(());
    }
    let root = std::fs::File::open(rootfs).map_err(io_err(rootfs))?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let not_dir = match openat2(&root, rel, how) {
        Ok(fd) => !std::fs::File::from(fd)
            .metadata()
            .map_err(io_err(&cwd))?
            .is_dir(),
        // A file on the way (`/etc/passwd/x`).
        Err(nix::errno::Errno::ENOTDIR) => true,
        // Missing, or for the container's own start to say.
        Err(_) => false,
    };
    if not_dir {
        return Err(invalid(
            "config.working_dir",
            format!("{} is not a directory in the image", cwd.display()),
        ));
    }
    Ok(())
}
