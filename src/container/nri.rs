//! A container as NRI plugins see it (`nri::api::Container`, from its configuration and OCI
//! spec), and the adjustments they ask for applied to the spec being made: annotations,
//! environment, arguments, mounts, device nodes with their device cgroup rules, hooks,
//! rlimits, the OOM score, CDI devices and resources. Device nodes, mounts and hooks go
//! through the CDI edits code, so both kinds of injection behave alike.

use oci_spec::runtime::{PosixRlimitBuilder, PosixRlimitType, Spec};

use super::config::ContainerConfig;
use super::{ContainerState, Error, Record, invalid};
use crate::cdi::edits::env_key;
use crate::cdi::spec::{ContainerEdits, DeviceNode, Hook, Mount};
use crate::nri::api;
use crate::sandbox::config::Resources;

fn nri_state(s: ContainerState) -> api::ContainerState {
    match s {
        ContainerState::Created => api::ContainerState::ContainerCreated,
        ContainerState::Running => api::ContainerState::ContainerRunning,
        ContainerState::Exited | ContainerState::Removed => api::ContainerState::ContainerStopped,
        ContainerState::Unknown => api::ContainerState::ContainerUnknown,
    }
}

/// A container about to be made (state unknown) as plugins see it.
pub(super) fn message(
    id: &str,
    sandbox_id: &str,
    config: &ContainerConfig,
    oci: Option<&Spec>,
) -> api::Container {
    let process = oci.and_then(|s| s.process().as_ref());
    let mounts = oci
        .and_then(|s| s.mounts().as_ref())
        .map(|ms| {
            ms.iter()
                .map(|m| api::Mount {
                    destination: m.destination().display().to_string(),
                    r#type: m.typ().clone().unwrap_or_default(),
                    source: m
                        .source()
                        .as_ref()
                        .map(|s| s.display().to_string())
                        .unwrap_or_default(),
                    options: m.options().clone().unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default();
    let rlimits = process
        .and_then(|p| p.rlimits().as_ref())
        .map(|rs| {
            rs.iter()
                .map(|r| api::PosixRlimit {
                    r#type: r.typ().to_string(),
                    hard: r.hard(),
                    soft: r.soft(),
                })
                .collect()
        })
        .unwrap_or_default();
    let user = process.map(|p| api::User {
        uid: p.user().uid(),
        gid: p.user().gid(),
        additional_gids: p.user().additional_gids().clone().unwrap_or_default(),
    });
    api::Container {
        id: id.to_string(),
        pod_sandbox_id: sandbox_id.to_string(),
        name: config.name().to_string(),
        state: api::ContainerState::ContainerUnknown as i32,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        args: process.and_then(|p| p.args().clone()).unwrap_or_default(),
        env: process.and_then(|p| p.env().clone()).unwrap_or_default(),
        mounts,
        linux: Some(api::LinuxContainer {
            resources: config.resources().map(crate::sandbox::nri_resources),
            oom_score_adj: process
                .and_then(|p| p.oom_score_adj())
                .map(|v| api::OptionalInt { value: v as i64 }),
            ..Default::default()
        }),
        rlimits,
        cdi_devices: config
            .cdi_devices
            .iter()
            .map(|d| api::CdiDevice {
                name: d.name.clone(),
            })
            .collect(),
        user,
        ..Default::default()
    }
}

impl Record {
    /// The container as plugins see it now; `oci` is its spec when it was read.
    pub(super) fn nri(&self, oci: Option<&Spec>) -> api::Container {
        let mut c = message(&self.id, &self.sandbox_id, &self.config, oci);
        c.state = nri_state(self.state) as i32;
        c.created_at = self.created_at;
        c.started_at = self.started_at;
        c.finished_at = self.finished_at;
        c.exit_code = self.exit_code;
        c.status_reason = self.reason.clone();
        c.status_message = self.message.clone();
        c.pid = self.init.map_or(0, |p| p.pid as u32);
        c
    }
}

/// Names from NRI with a leading `-`: the entry is to be removed.
fn removal(key: &str) -> Option<&str> {
    key.strip_prefix('-')
}

/// Applies the merged adjustment to the spec being made, and to the resources its cgroup is
/// written from. `registry` resolves the CDI devices plugins add.
pub(super) fn apply(
    a: &api::ContainerAdjustment,
    oci: &mut Spec,
    resources: &mut Resources,
    registry: Option<&crate::cdi::Registry>,
) -> Result<(), Error> {
    const FIELD: &str = "NRI adjustment";
    let annotations = oci.annotations_mut().get_or_insert_with(Default::default);
    for (k, v) in &a.annotations {
        match removal(k) {
            Some(k) => annotations.remove(k),
            None => annotations.insert(k.clone(), v.clone()),
        };
    }
    let mut edits = ContainerEdits::default();
    if let Some(p) = oci.process_mut() {
        let env = p.env_mut().get_or_insert_with(Vec::new);
        for e in &a.env {
            if let Some(k) = removal(&e.key) {
                env.retain(|v| env_key(v) != k);
            } else {
                edits.env.push(format!("{}={}", e.key, e.value));
            }
        }
        let args: Vec<String> = a
            .args
            .iter()
            .skip_while(|s| s.is_empty())
            .cloned()
            .collect();
        if !a.args.is_empty() {
            p.set_args(Some(args));
        }
        let mut rlimits = p.rlimits().clone().unwrap_or_default();
        for r in &a.rlimits {
            let typ: PosixRlimitType = r
                .r#type
                .parse()
                .map_err(|_| invalid(FIELD, format!("unknown rlimit {:?}", r.r#type)))?;
            rlimits.retain(|o| o.typ() != typ);
            rlimits.push(
                PosixRlimitBuilder::default()
                    .typ(typ)
                    .hard(r.hard)
                    .soft(r.soft)
                    .build()
                    .map_err(|e| invalid(FIELD, e.to_string()))?,
            );
        }
        if !a.rlimits.is_empty() {
            p.set_rlimits(Some(rlimits));
        }
    }
    for m in &a.mounts {
        match removal(&m.destination) {
            Some(d) => {
                if let Some(ms) = oci.mounts_mut() {
                    ms.retain(|o| o.destination().as_os_str() != d);
                }
            }
            None => edits.mounts.push(Mount {
                host_path: m.source.clone(),
                container_path: m.destination.clone(),
                options: m.options.clone(),
                kind: m.r#type.clone(),
            }),
        }
    }
    if let Some(h) = &a.hooks {
        for (name, list) in [
            ("prestart", &h.prestart),
            ("createRuntime", &h.create_runtime),
            ("createContainer", &h.create_container),
            ("startContainer", &h.start_container),
            ("poststart", &h.poststart),
            ("poststop", &h.poststop),
        ] {
            edits.hooks.extend(list.iter().map(|k| Hook {
                hook_name: name.to_string(),
                path: k.path.clone(),
                args: k.args.clone(),
                env: k.env.clone(),
                timeout: k.timeout.as_ref().map(|t| t.value),
            }));
        }
    }
    if let Some(l) = &a.linux {
        apply_linux(l, oci, resources, &mut edits)?;
    }
    crate::cdi::edits::apply(oci, &edits).map_err(|e| invalid(FIELD, e.to_string()))?;
    if !a.cdi_devices.is_empty() {
        let names: Vec<String> = a.cdi_devices.iter().map(|d| d.name.clone()).collect();
        let Some(registry) = registry else {
            return Err(invalid(
                FIELD,
                "CDI is turned off on this node ([cdi] enable = false)",
            ));
        };
        registry
            .inject(oci, &names)
            .map_err(|e| invalid(FIELD, e.to_string()))?;
    }
    Ok(())
}

fn apply_linux(
    l: &api::LinuxContainerAdjustment,
    oci: &mut Spec,
    resources: &mut Resources,
    edits: &mut ContainerEdits,
) -> Result<(), Error> {
    for d in &l.devices {
        match removal(&d.path) {
            Some(path) => {
                if let Some(devs) = oci
                    .linux_mut()
                    .as_mut()
                    .and_then(|l| l.devices_mut().as_mut())
                {
                    devs.retain(|o| o.path().as_os_str() != path);
                }
            }
            None => edits.device_nodes.push(DeviceNode {
                path: d.path.clone(),
                host_path: String::new(),
                kind: d.r#type.clone(),
                major: d.major,
                minor: d.minor,
                file_mode: d.file_mode.as_ref().map(|m| m.value),
                permissions: String::new(),
                uid: d.uid.as_ref().map(|u| u.value),
                gid: d.gid.as_ref().map(|g| g.value),
            }),
        }
    }
    if let Some(o) = &l.oom_score_adj {
        let v = super::spec::oom_score_adj(o.value, "NRI adjustment oom_score_adj")?;
        if let Some(p) = oci.process_mut() {
            p.set_oom_score_adj(Some(v));
        }
        resources.oom_score_adj = i64::from(v);
    }
    if let Some(r) = &l.resources {
        crate::sandbox::adjust_resources(resources, r);
    }
    Ok(())
}

impl super::ContainerService {
    /// NRI when a plugin is listening (messages are built only then).
    fn nri_active(&self) -> Option<&crate::nri::Nri> {
        self.inner.nri.as_ref().filter(|n| n.active())
    }

    /// The pod as plugins see it; one gone meanwhile is named by its ID only.
    async fn nri_pod(&self, sandbox_id: &str) -> api::PodSandbox {
        match self.inner.sandboxes.get(sandbox_id).await {
            Ok(s) => s.nri(Vec::new()),
            Err(_) => api::PodSandbox {
                id: sandbox_id.to_string(),
                ..Default::default()
            },
        }
    }

    /// The container as plugins see it, its spec read from its bundle.
    fn nri_container(&self, r: &Record) -> api::Container {
        let spec: Option<Spec> =
            crate::atomic::read_json(&self.bundle(&r.id).dir.join("config.json"))
                .ok()
                .flatten();
        r.nri(spec.as_ref())
    }

    /// CreateContainer for a container whose spec is built but not written: the plugins'
    /// adjustment is applied to it; the resources its cgroup gets come back when they changed.
    pub(super) async fn nri_adjust(
        &self,
        id: &str,
        sandbox: &crate::sandbox::Record,
        config: &ContainerConfig,
        oci: &mut Spec,
    ) -> Result<Option<Resources>, Error> {
        let Some(nri) = self.nri_active() else {
            return Ok(None);
        };
        let pod = sandbox.nri(Vec::new());
        let container = message(id, &sandbox.id, config, Some(oci));
        let adjusted = nri.create_container(&pod, &container).await?;
        let before = config.resources().cloned().unwrap_or_default();
        let mut resources = before.clone();
        apply(
            &adjusted.adjust,
            oci,
            &mut resources,
            self.inner.cdi.as_ref(),
        )?;
        let failed = nri.apply(adjusted.updates, adjusted.evictions).await;
        if let Some(f) = failed.iter().find(|f| !f.ignore_failure) {
            return Err(invalid(
                "NRI adjustment",
                format!("updating container {} failed", f.container_id),
            ));
        }
        Ok((resources != before).then_some(resources))
    }

    /// The container is listed.
    pub(super) async fn nri_created(&self, r: &Record) {
        let Some(nri) = &self.inner.nri else { return };
        nri.created(&r.id);
        if nri.active() {
            let pod = self.nri_pod(&r.sandbox_id).await;
            nri.post_create(&pod, &self.nri_container(r)).await;
        }
    }

    /// StartContainer, before the monitor is spawned: a plugin's error fails the start.
    pub(super) async fn nri_start(&self, r: &Record) -> Result<(), Error> {
        let Some(nri) = self.nri_active() else {
            return Ok(());
        };
        let pod = self.nri_pod(&r.sandbox_id).await;
        Ok(nri.start_container(&pod, &self.nri_container(r)).await?)
    }

    pub(super) async fn nri_started(&self, r: &Record) {
        if let Some(nri) = self.nri_active() {
            let pod = self.nri_pod(&r.sandbox_id).await;
            nri.post_start(&pod, &self.nri_container(r)).await;
        }
    }

    /// StopContainer once the container has exited, however it ended (told once).
    pub(super) async fn nri_stopped(&self, r: &Record) {
        let Some(nri) = &self.inner.nri else { return };
        if r.state != ContainerState::Exited || !nri.stop_untold(&r.id) {
            return;
        }
        if nri.active() {
            let pod = self.nri_pod(&r.sandbox_id).await;
            nri.stop_container(&pod, &self.nri_container(r)).await;
        } else {
            nri.stopped_quietly(&r.id);
        }
    }

    /// RemoveContainer, with the record about to go (its bundle still there).
    pub(super) async fn nri_removed(&self, r: &Record) {
        let Some(nri) = &self.inner.nri else { return };
        if !nri.knows(&r.id) {
            return;
        }
        if nri.active() {
            let pod = self.nri_pod(&r.sandbox_id).await;
            nri.remove_container(&pod, &self.nri_container(r)).await;
        } else {
            nri.forget(&r.id);
        }
    }
}

impl super::ContainerService {
    /// Every container as plugins see it (a synchronizing plugin's list).
    pub async fn nri_inventory(&self) -> Vec<api::Container> {
        let mut out = Vec::new();
        for entry in self.inner.records.all() {
            let r = entry.lock().await;
            if r.state != ContainerState::Removed {
                out.push(self.nri_container(&r));
            }
        }
        out
    }

    /// A plugin's update of a container's resources, laid over what it has.
    pub async fn nri_update(&self, u: &api::ContainerUpdate) -> Result<(), Error> {
        let mut res = {
            let entry = self.entry(&u.container_id)?;
            let r = entry.lock().await;
            r.config.resources().cloned().unwrap_or_default()
        };
        if let Some(r) = u.linux.as_ref().and_then(|l| l.resources.as_ref()) {
            crate::sandbox::adjust_resources(&mut res, r);
        }
        self.update_resources(&u.container_id, res).await
    }
}
