//! CreateContainer: the container's image, user and confinement (seccomp, AppArmor, SELinux)
//! resolved, its rootfs mounted (the image's snapshots under a fresh writable layer) and its
//! bundle written (`config.json`, `monitor.json`, the record).

use super::{
    Bundle, Cgroup, Confinement, ContainerConfig, ContainerService, ContainerState, Error,
    ImageVolume, JoinNamespace, MonitorConfig, MsFlags, NamespaceMode, Path, PathBuf, Record,
    atomic, attach_devices, checkpoint, config, discard_files, events, image, invalid, io, io_err,
    logs, notice, now_nanos, random_id, runtime, sandbox, spec, user,
};

impl ContainerService {
    pub async fn create(
        &self,
        sandbox_id: &str,
        config: ContainerConfig,
        _sandbox_config: Option<crate::sandbox::config::PodConfig>,
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
        // A checkpoint archive: the container is made of the image it was made of.
        let archive = checkpoint::is_archive(&image_name).then(|| PathBuf::from(&image_name));
        let image = match &archive {
            None => self.inner.images.lookup(&image_name)?,
            Some(a) => {
                if config.tty {
                    return Err(invalid(
                        "config.tty",
                        "a container with a terminal cannot be restored",
                    ));
                }
                let dump = self.archive_config(a)?;
                let mut found = None;
                for name in [
                    &dump.rootfs_image_ref,
                    &dump.rootfs_image_name,
                    &dump.rootfs_image,
                ] {
                    if !name.is_empty()
                        && let Some(i) = self.inner.images.lookup(name)?
                    {
                        found = Some(i);
                        break;
                    }
                }
                if found.is_none() {
                    return Err(Error::ImageNotFound {
                        image: format!("{} (of checkpoint {})", dump.rootfs_image, a.display()),
                    });
                }
                found
            }
        }
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
        spec::cri_mounts(&config, &[])?;
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
        let mut volumes = Vec::new();
        let result = match self.mount_image_volumes(&id, &b, &config, &sandbox) {
            Err(e) => Err(e),
            Ok(v) => {
                volumes = v;
                self.prepare(
                    &id,
                    &b,
                    &config,
                    &sandbox,
                    &image,
                    log_path,
                    &confinement,
                    target_pid,
                    archive.as_deref(),
                    &volumes,
                )
                .await
            }
        };
        match result {
            Ok(record) => {
                let created = notice(&record, events::EventKind::Created, record.created_at);
                self.inner.records.insert(id.clone(), record);
                self.inner.events.emit(created);
                Ok(id)
            }
            Err(e) => {
                discard_files(b).await;
                if let Some(pod) = &sandbox.cgroup {
                    let cg = Cgroup {
                        root: pod.root.clone(),
                        path: pod.path.join(self.inner.sandboxes.cgroups().leaf(&id)),
                    };
                    if cg.path.exists()
                        && let Err(e) = sandbox::remove_cgroup(&cg).await
                    {
                        tracing::warn!(cgroup = %cg.path.display(), error = %e, "removing cgroup");
                    }
                }
                if let Some(c) = &hold {
                    self.inner.images.release(c);
                }
                self.release_image_volumes(&id, &volumes);
                self.inner.records.release(&key);
                Err(e)
            }
        }
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

    /// The seccomp filter and AppArmor profile of a container, checked before anything is made.
    // The deprecated profile fields are still what older kubelets send.
    #[allow(deprecated)]
    pub(super) fn confinement(
        &self,
        sc: Option<&config::ContainerSecurity>,
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
    pub(super) async fn prepare(
        &self,
        id: &str,
        b: &Bundle,
        config: &ContainerConfig,
        sandbox: &sandbox::Record,
        image: &image::Image,
        log_path: Option<PathBuf>,
        confinement: &Confinement,
        target_pid: Option<PathBuf>,
        archive: Option<&Path>,
        volumes: &[ImageVolume],
    ) -> Result<Record, Error> {
        if archive.is_some() && sandbox.userns.is_some() {
            return Err(invalid(
                "config.image.image",
                "a checkpoint cannot be restored in a pod with a user namespace",
            ));
        }
        std::fs::create_dir_all(&b.layer).map_err(io_err(&b.layer))?;
        // Before anything is written in it: all below is charged to its project.
        let project = self
            .inner
            .layer_usage
            .assign(&b.layer, id)
            .map_err(io_err(&b.layer))?;
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
        if let Some(a) = archive {
            self.unpack_archive(a, b)?;
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
        runtime::mounts::overlay(&rootfs, &lowers, &b.layer, flags, mount_label).map_err(|e| {
            // Too many layers for this kernel: the image's fault, said with the limit.
            if e.kind() == io::ErrorKind::InvalidInput {
                invalid("image", e.to_string())
            } else {
                io_err(&rootfs)(e)
            }
        })?;
        crate::fault::point("rootfs.mount.after");

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
            image_volumes: volumes,
        })?;
        super::cdi::inject(self.inner.cdi.as_ref(), config, &mut oci)?;
        // CDI may add groups: exec'd processes get them too.
        let mut user = user;
        if let Some(g) = oci
            .process()
            .as_ref()
            .and_then(|p| p.user().additional_gids().as_ref())
        {
            user.additional_gids.clone_from(g);
        }
        check_working_dir(&rootfs, &oci)?;
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
            if mode_known != NamespaceMode::Node && sandbox.namespaces.iter().any(|n| n == kind) {
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
            new_pid_ns: pid_mode == NamespaceMode::Container,
            exit_file: b.exit(),
            cgroup: cgroup.as_ref().map(|c| c.path.clone()),
            placed: scoped,
            seccomp: None,
            userns: sandbox.userns.as_ref().map(|_| sandbox_paths.ns("user")),
            restore: None,
        };
        if let Some(a) = archive {
            if !monitor.new_pid_ns {
                return Err(invalid(
                    "config.linux.security_context.namespace_options.pid",
                    "a restored container needs its own PID namespace",
                ));
            }
            monitor.restore = Some(self.restore_config(a, b, &oci, &monitor)?);
        }
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
            state: ContainerState::Created,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            init: None,
            monitor: None,
            mnt_ns: None,
            own_pid_ns: pid_mode == NamespaceMode::Container,
            log_path,
            stop_signal: image.config.config.stop_signal.clone(),
            user: (user.uid, user.gid, user.additional_gids.clone()),
            cgroup,
            project,
            image_volumes: volumes.to_vec(),
        };
        atomic::write_json(&b.record(), &record).map_err(io_err(&b.record()))?;
        Ok(record)
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

/// Puts SELinux labels in a container's spec: the process's (set on its exec by the init), the
/// files' (the rootfs is mounted with it) and a `context=` on its tmpfs mounts.
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

pub(super) fn label_spec(oci: &mut oci_spec::runtime::Spec, l: &sandbox::security::SelinuxLabels) {
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
