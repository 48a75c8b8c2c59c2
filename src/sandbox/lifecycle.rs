//! RunPodSandbox (checks, names, namespaces, files, cgroups, the pause process), StopPodSandbox
//! and RemovePodSandbox, with the SELinux levels pods hold.

use super::{
    Duration, Error, MsFlags, NamespaceMode, Path, Paths, PauseConfig, Placement, PodConfig,
    Record, SandboxImage, SandboxService, UserNs, atomic, config, default_hosts, invalid, io_err,
    mount, mount_pause_image, name_key, now_nanos, random_id, remove_files, resolv_conf, runtime,
    security, spawn_pause, sysctls, userns_request, wait_for_exit, write_file,
};

impl SandboxService {
    /// The pod's security profiles: the pause process runs no code of the pod's, but a profile
    /// the node cannot provide fails the pod here, clearly, before anything is made. Returns the
    /// pod's SELinux labels, when it asks for some.
    // The deprecated profile fields are still what older kubelets send.
    #[allow(deprecated)]
    fn check_profiles(&self, config: &PodConfig) -> Result<Option<security::SelinuxLabels>, Error> {
        const FIELD: &str = "config.linux.security_context";
        let default_sc = config::PodSecurity::default();
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
            // The state root, not the sandboxes' directory (where start-up would take the
            // profile's directory for a pod that never finished starting).
            self.inner.dir.parent().unwrap_or(&self.inner.dir),
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
            .is_some_and(|o| *o != config::SelinuxOptions::default());
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

    /// Creates the pod's namespaces and files and starts its pause process; `cni` records that
    /// a CNI network is attached next.
    pub async fn run(
        &self,
        config: PodConfig,
        handler: &str,
        image: Option<SandboxImage>,
        cni: bool,
    ) -> Result<String, Error> {
        let meta = self.check_request(&config, handler)?;
        let (ns, userns) = check_namespaces(&config)?;
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
        if let Err(taken) = self.inner.records.reserve(&key, &id) {
            return fail(Error::NameReserved {
                name: key,
                id: taken.holder,
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
                cni,
            )
            .await;
        match result {
            Ok(record) => {
                self.inner.records.insert(id.clone(), record);
                Ok(id)
            }
            Err(e) => {
                self.undo_run(&id, &key, &paths, &cgroup_parent).await;
                fail(e)
            }
        }
    }

    /// The checks of a RunPodSandbox request that need no namespace: its metadata (returned),
    /// its hostname, its runtime handler.
    fn check_request<'a>(
        &self,
        config: &'a PodConfig,
        handler: &str,
    ) -> Result<&'a config::PodMetadata, Error> {
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
        Ok(meta)
    }

    /// Undoes a pod `create` failed to make, once its name and user namespace are reserved: its
    /// files, whatever cgroups (and units) were made, its user namespace's IDs, then its name.
    /// Its SELinux level is the caller's to release.
    async fn undo_run(&self, id: &str, key: &str, paths: &Paths, cgroup_parent: &str) {
        let doomed = paths.clone();
        let _ = tokio::task::spawn_blocking(move || remove_files(&doomed)).await;
        // Whatever cgroups (and units) were made before the failure.
        let policy = &self.inner.cgroups;
        if let (Some(h), Ok((rel, owned))) = (&policy.hierarchy, policy.pod_path(cgroup_parent, id))
            && let (Ok(pod), Ok(pause)) = (
                h.cgroup(&rel),
                h.cgroup(&format!("{rel}/{}", policy.leaf(id))),
            )
        {
            // An own slice may be a unit without a directory yet: stop it all the same.
            let pod = (owned && (pod.exists() || self.inner.systemd.is_some())).then_some(pod);
            self.discard_cgroups(pod.as_ref(), owned, Some(&pause))
                .await;
        }
        self.release_userns(id);
        self.inner.records.release(key);
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn create(
        &self,
        id: &str,
        paths: &Paths,
        config: PodConfig,
        handler: &str,
        network: NamespaceMode,
        pid: NamespaceMode,
        ipc: NamespaceMode,
        sysctls: Vec<(String, String)>,
        userns: Option<UserNs>,
        image: Option<SandboxImage>,
        selinux: Option<security::SelinuxLabels>,
        cni: bool,
    ) -> Result<Record, Error> {
        std::fs::create_dir_all(paths.dir.join("ns")).map_err(io_err(&paths.dir))?;
        let host_net = network == NamespaceMode::Node;
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
        if ipc != NamespaceMode::Node {
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
            new_ipc: ipc != NamespaceMode::Node,
            // A pod on the host network keeps the host's name too, as containerd does.
            new_uts: !host_net,
            new_pid: pid == NamespaceMode::Pod,
            hostname: (!host_net).then(|| hostname.clone()),
            sysctls,
            uid_map: userns.iter().map(|u| u.uids).collect(),
            gid_map: userns.iter().map(|u| u.gids).collect(),
        };
        let (pause, keeper) = spawn_pause(&pause_cfg, placement).await?;
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
            cni,
        };
        if let Err(e) = atomic::write_json(&paths.state(), &record) {
            let _ = pause.signal(libc::SIGKILL);
            return Err(io_err(&paths.state())(e));
        }
        keeper.keep().await;
        Ok(record)
    }

    /// Marks the pod not ready (it is being stopped). Idempotent.
    pub async fn retire(&self, id: &str) -> Result<(), Error> {
        let entry = match self.entry(id) {
            Ok(e) => e,
            Err(Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut r = entry.lock().await;
        self.mark_not_ready(&mut r)
    }

    fn mark_not_ready(&self, r: &mut Record) -> Result<(), Error> {
        if r.ready {
            r.ready = false;
            let path = self.paths(&r.id).state();
            atomic::write_json(&path, &*r).map_err(io_err(&path))?;
        }
        Ok(())
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
        self.mark_not_ready(&mut r)
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
        let paths = self.paths(&r.id);
        let _ = tokio::task::spawn_blocking(move || remove_files(&paths)).await;
        self.discard_cgroups(r.cgroup.as_ref(), r.owns_cgroup, r.pause_cgroup.as_ref())
            .await;
        self.release_userns(&r.id);
        self.release_level(r.selinux.as_ref());
        self.inner.records.remove(&r.id);
        self.inner.records.release(&r.name_key());
        Ok(())
    }

    pub(super) fn hold_level(&self, l: Option<&security::SelinuxLabels>) {
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

    pub(super) fn release_level(&self, l: Option<&security::SelinuxLabels>) {
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
}

/// The namespaces a pod asks for (returned, with its user namespace request): one with its own
/// user namespace cannot share the node's or be privileged, and TARGET mode is only for
/// containers.
fn check_namespaces(
    config: &PodConfig,
) -> Result<(config::NamespaceOptions, Option<Option<UserNs>>), Error> {
    let ns = config
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone())
        .unwrap_or_default();
    let userns = userns_request(ns.userns_options.as_ref())?;
    if userns.is_some() {
        // The host's network is allowed (KEP-5607): its processes stay unprivileged there.
        for (mode, what) in [(ns.pid, "pid"), (ns.ipc, "ipc")] {
            if mode == NamespaceMode::Node {
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
    if ns.pid == NamespaceMode::Target
        || ns.network == NamespaceMode::Target
        || ns.ipc == NamespaceMode::Target
    {
        return Err(invalid(
            "config.linux.security_context.namespace_options",
            "TARGET mode is only for containers",
        ));
    }
    Ok((ns, userns))
}
