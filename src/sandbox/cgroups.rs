//! Pod cgroups: the pod's own (or kubelet's) and its pause process's leaf below it, their
//! removal, the systemd placement of a helper's first process (used by containers too), and
//! CRI resources as cgroup limits.

use super::{
    Arc, Cgroup, Error, PodConfig, Resources, SandboxService, atomic, cgroup, config, invalid, io,
    io_err,
};

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

impl SandboxService {
    /// Takes down a pod's cgroups: the pause leaf and, when crius made it, the pod's own
    /// (stopping their units under systemd, which kills anything left in them).
    pub(super) async fn discard_cgroups(
        &self,
        pod: Option<&Cgroup>,
        owned: bool,
        pause: Option<&Cgroup>,
    ) {
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
            if let Err(e) = remove_cgroup(c).await {
                tracing::warn!(cgroup = %c.path.display(), error = %e, "removing pod cgroup");
            }
        }
    }

    /// UpdatePodSandboxResources: the pod's new pod-level resources (kubelet has resized its pod
    /// cgroup by now, or crius's own is resized here, as at creation), applied to the pod
    /// cgroup in place and kept in its record. A memory limit below what the pod uses now is
    /// refused; nothing of the pod restarts either way.
    pub async fn update_resources(
        &self,
        id: &str,
        overhead: Option<config::Resources>,
        resources: Option<config::Resources>,
    ) -> Result<(), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        let linux = r.config.linux.get_or_insert_with(Default::default);
        let overhead = overhead.or_else(|| linux.overhead.clone());
        let res = resources.or_else(|| linux.resources.clone());
        let limits = cgroup::pod_limits(
            &self::resources(res.as_ref().unwrap_or(&Default::default())),
            &self::resources(overhead.as_ref().unwrap_or(&Default::default())),
        );
        let files = cgroup::files(&limits).map_err(|reason| invalid("resources", reason))?;
        match &r.cgroup {
            None if limits.limits_anything() && !self.inner.cgroups.allow_unenforced => {
                return Err(Error::Unenforceable {
                    what: "resources".into(),
                });
            }
            None => {}
            Some(pod) => {
                if let Some((_, limit)) = files.iter().find(|(f, _)| f == "memory.max")
                    && let (Ok(limit), Some(used)) =
                        (limit.parse::<u64>(), pod.number("memory.current"))
                    && limit < used
                {
                    return Err(invalid(
                        "resources.memory_limit_in_bytes",
                        format!("{limit} is below the pod's current memory use ({used} bytes)"),
                    ));
                }
                // All or none, so a refused update leaves the limits the record has.
                if r.owns_cgroup || self.inner.systemd.is_none() {
                    pod.set_all(&files).map_err(|(file, value, e)| {
                        invalid("resources", format!("{file} = {value}: {e}"))
                    })?;
                }
                // systemd keeps a slice's limits as unit properties, or a reload undoes them
                // (after the files, which the kernel checks); a slice kubelet made is kubelet's
                // to resize.
                if let Some(sd) = &self.inner.systemd
                    && r.owns_cgroup
                    && let Some((unit, _)) = crate::systemd::unit_and_slice(&pod.path)
                {
                    sd.set_limits(&unit, &files).await?;
                }
            }
        }
        let linux = r.config.linux.get_or_insert_with(Default::default);
        linux.overhead = overhead;
        linux.resources = res;
        let path = self.paths(&r.id).state();
        atomic::write_json(&path, &*r).map_err(io_err(&path))
    }

    /// Creates the pod's cgroup (kubelet's parent or crius's own) with the pod-level limits, and
    /// the pause process's leaf below it. Without cgroup v2, limits are refused unless the
    /// operator allowed running unenforced.
    pub(super) async fn pod_cgroups(
        &self,
        id: &str,
        config: &PodConfig,
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
            pod.set_all(&files).map_err(|(_, _, e)| cg_err(&pod)(e))?;
        }
        Ok((Some(pod), owned, Some(pause)))
    }
}

/// CRI resources as plain numbers.
pub fn resources(r: &config::Resources) -> Resources {
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

/// Removes a cgroup off the async threads: a busy one (zombies not yet reaped) is killed and
/// retried for up to ten seconds.
pub async fn remove_cgroup(cg: &Cgroup) -> io::Result<()> {
    let cg = cg.clone();
    tokio::task::spawn_blocking(move || cg.remove())
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}
