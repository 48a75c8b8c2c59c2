//! Containers' cgroups: where each goes below its pod's, the limit files (or systemd unit
//! properties) it gets, the systemd placement of its init, in-place updates, and the start-up
//! sweep of cgroups no record owns.

use super::{
    Cgroup, ContainerConfig, ContainerService, Error, Path, PathBuf, Record, atomic, cgroup,
    config, devices, invalid, io_err, sandbox,
};

impl ContainerService {
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
            if let Err(e) = sandbox::remove_cgroup(&cg).await {
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

    /// The container's cgroup below its pod's, created with the container's limits written.
    /// Under systemd it is a scope made when the container starts (see `place`): here it is
    /// only named.
    pub(super) fn container_cgroup(
        &self,
        id: &str,
        sandbox: &sandbox::Record,
        config: &ContainerConfig,
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
            // Just made, so empty: removing it never waits for processes to leave.
            let _ = cg.remove();
            return Err(e);
        }
        Ok(Some(cg))
    }

    /// Writes the limits an NRI plugin changed into a cgroup made moments ago.
    pub(super) fn rewrite_limits(&self, cg: &Cgroup, res: &config::Resources) -> Result<(), Error> {
        let config = ContainerConfig {
            linux: Some(super::config::ContainerLinux {
                resources: Some(res.clone()),
                security_context: None,
            }),
            ..Default::default()
        };
        write_limits(cg, &self.limit_files(&config)?)
    }

    /// Whether the container's cgroup is a systemd scope made when it starts.
    pub(super) fn scoped(&self, cg: Option<&Cgroup>) -> bool {
        self.inner.sandboxes.systemd().is_some()
            && cg.is_some_and(|cg| {
                cg.path.extension().is_some_and(|e| e == "scope")
                    && crate::systemd::unit_and_slice(&cg.path).is_some()
            })
    }

    /// The cgroup files of a container's limits; an error when it asks for limits this node
    /// cannot enforce.
    pub(super) fn limit_files(
        &self,
        config: &ContainerConfig,
    ) -> Result<Vec<(String, String)>, Error> {
        let default = config::Resources::default();
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
    pub(super) async fn place(
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

    /// Changes a container's limits in place. A memory limit below what the container uses now
    /// is refused (the kernel would OOM-kill it); the container keeps running either way.
    pub async fn update_resources(&self, id: &str, res: config::Resources) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        Self::present(&r)?;
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
                // All or none, so a refused update leaves the limits the record has.
                cg.set_all(&files).map_err(|(file, value, e)| {
                    invalid("linux", format!("{file} = {value}: {e}"))
                })?;
                // systemd keeps the limits as unit properties, or a reload would undo them;
                // after the files, which the kernel checks.
                if let Some(sd) = self.inner.sandboxes.systemd()
                    && let Some((unit, _)) = crate::systemd::unit_and_slice(&cg.path)
                {
                    sd.set_limits(&unit, &files)
                        .await
                        .map_err(sandbox::Error::from)?;
                }
            }
        }
        if let Some(linux) = r.config.linux.as_mut() {
            linux.resources = Some(res);
        } else {
            r.config.linux = Some(config::ContainerLinux {
                resources: Some(res),
                ..Default::default()
            });
        }
        let path = self.bundle(&r.id).record();
        atomic::write_json(&path, &*r).map_err(io_err(&path))
    }
}

/// The spec's device rules; none when every device is allowed (a privileged container).
fn device_rules(oci: &oci_spec::runtime::Spec) -> Option<Vec<devices::Rule>> {
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
    (!all).then_some(rules)
}

impl ContainerService {
    /// On a node without cgroup v2, the container's v1 devices cgroup, made allowing only the
    /// spec's devices; none where v2 confines them (`v2`) or every device is allowed. A
    /// container that needs confining where nothing can confine it is refused.
    pub(super) fn devices_v1_cgroup(
        &self,
        id: &str,
        oci: &oci_spec::runtime::Spec,
        v2: bool,
    ) -> Result<Option<PathBuf>, Error> {
        let Some(rules) = device_rules(oci) else {
            return Ok(None);
        };
        if v2 {
            return Ok(None);
        }
        let policy = self.inner.sandboxes.cgroups();
        let (Some(dir), Some(v1)) = (policy.devices_v1_cgroup(id), &policy.devices_v1) else {
            return Err(Error::NoDeviceControl { id: id.to_string() });
        };
        v1.create(&dir, &rules)
            .map_err(|source| Error::DevicesCgroup {
                path: dir.clone(),
                source,
            })?;
        Ok(Some(dir))
    }

    /// Removes the container's v1 devices cgroup, if it has one.
    pub(super) async fn remove_devices_v1_cgroup(&self, id: &str) {
        let Some(dir) = self.inner.sandboxes.cgroups().devices_v1_cgroup(id) else {
            return;
        };
        let d = dir.clone();
        let removed = tokio::task::spawn_blocking(move || devices::remove_v1(&d)).await;
        if let Ok(Err(e)) = removed {
            tracing::warn!(cgroup = %dir.display(), error = %e, "removing a devices cgroup");
        }
    }

    /// Removes v1 devices cgroups below crius's parent that no container owns (a crash between
    /// making one and recording its container), killing what runs in them.
    pub async fn remove_orphan_devices_cgroups(&self) {
        let Some(parent) = self.inner.sandboxes.cgroups().devices_v1_parent() else {
            return;
        };
        let Ok(dir) = std::fs::read_dir(&parent) else {
            return;
        };
        let mut known = std::collections::HashSet::new();
        for c in self.inner.records.all() {
            known.insert(c.lock().await.id.clone());
        }
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_id = name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit());
            if is_id && e.path().is_dir() && !known.contains(&name) {
                tracing::info!(cgroup = %e.path().display(), "removing an orphaned devices cgroup");
                self.remove_devices_v1_cgroup(&name).await;
            }
        }
    }
}

/// Writes a container's limit files into its cgroup.
pub(super) fn write_limits(cg: &Cgroup, files: &[(String, String)]) -> Result<(), Error> {
    cg.set_all(files).map_err(|(file, value, e)| {
        invalid("config.linux.resources", format!("{file} = {value}: {e}"))
    })
}

/// Attaches the spec's device rules to the container's cgroup (nothing when every device is
/// allowed).
pub(super) fn attach_devices(cg: &Cgroup, oci: &oci_spec::runtime::Spec) -> Result<(), Error> {
    if let Some(rules) = device_rules(oci) {
        devices::attach(&cg.path, &rules).map_err(|source| sandbox::Error::Cgroup {
            path: cg.path.clone(),
            source,
        })?;
    }
    Ok(())
}
