//! ListContainers and ContainerStatus: what records show of containers, in crius's own terms
//! (`cri` makes CRI's messages of them), with filters.

use super::{ContainerService, ContainerState, Error, HashMap, Record, config, runtime, sandbox};
use config::{ContainerMetadata, ImageSpec, Mount, Resources};

/// A container as ListContainers shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSummary {
    pub id: String,
    pub pod_sandbox_id: String,
    pub metadata: Option<ContainerMetadata>,
    pub image: Option<ImageSpec>,
    pub image_ref: String,
    pub state: ContainerState,
    pub created_at: i64,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub image_id: String,
}

/// Who a container's process runs as.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUser {
    pub uid: u32,
    pub gid: u32,
    pub supplemental_groups: Vec<u32>,
}

/// A container as ContainerStatus shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerStatus {
    pub id: String,
    pub metadata: Option<ContainerMetadata>,
    pub state: ContainerState,
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub image: Option<ImageSpec>,
    pub image_ref: String,
    pub reason: String,
    pub message: String,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub mounts: Vec<Mount>,
    pub log_path: String,
    pub resources: Option<Resources>,
    pub image_id: String,
    pub user: ContainerUser,
    /// The signal StopContainer sends first (its name, as `stop_signal` gives it).
    pub stop_signal: String,
}

/// Which containers a listing shows.
#[derive(Debug, Clone, Default)]
pub struct ContainerFilter {
    /// A prefix of the container's ID.
    pub id: String,
    /// A prefix of its pod's ID.
    pub pod_sandbox_id: String,
    pub state: Option<ContainerState>,
    pub label_selector: HashMap<String, String>,
}

/// The resources in effect: the ones asked for, with what the container's cgroup holds where
/// it has one (kubelet compares them with what it asked for after an in-place resize). A value
/// the cgroup holds as the request maps to reports the request itself (CPU shares to weight
/// rounds).
fn applied_resources(r: &Record) -> Option<Resources> {
    let asked = r.config.resources().cloned();
    let Some(cg) = r.cgroup.as_ref().filter(|c| c.exists()) else {
        return asked;
    };
    let mut out = asked.unwrap_or_default();
    if let Ok(max) = cg.read("memory.max") {
        out.memory_limit_in_bytes = max.trim().parse().unwrap_or(0);
    }
    if let Ok(cpu) = cg.read("cpu.max") {
        let mut parts = cpu.split_whitespace();
        let (quota, period) = (parts.next(), parts.next().and_then(|p| p.parse().ok()));
        if let Some(p) = period {
            out.cpu_period = p;
        }
        out.cpu_quota = quota.and_then(|q| q.parse().ok()).unwrap_or(0);
    }
    if let Some(weight) = cg.number("cpu.weight")
        && runtime::cgroup::cpu_weight(out.cpu_shares) != weight
    {
        out.cpu_shares = runtime::cgroup::cpu_shares(weight);
    }
    for (file, field) in [
        ("cpuset.cpus", &mut out.cpuset_cpus),
        ("cpuset.mems", &mut out.cpuset_mems),
    ] {
        if let Ok(v) = cg.read(file) {
            *field = v.trim().to_string();
        }
    }
    Some(out)
}

impl ContainerService {
    /// IDs of a sandbox's containers.
    pub async fn in_sandbox(&self, sandbox_id: &str) -> Vec<String> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let r = e.lock().await;
            if r.sandbox_id == sandbox_id && r.state != ContainerState::Removed {
                out.push(r.id.clone());
            }
        }
        out
    }

    /// A record as ContainerStatus shows it.
    pub(super) fn status_of(r: &Record) -> ContainerStatus {
        let (uid, gid, supplemental_groups) = r.user.clone();
        ContainerStatus {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: r.state,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            exit_code: r.exit_code,
            image: shown_image(r.config.image.as_ref()),
            image_ref: r.image_ref.clone(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            mounts: r
                .config
                .mounts
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let mut m = m.clone();
                    // An image volume reports the digest of the image it mounts.
                    if let (Some(spec), Some(v)) = (
                        m.image.as_mut(),
                        r.image_volumes.iter().find(|v| v.mount == i),
                    ) {
                        spec.image_ref = v.image.to_string();
                    }
                    m
                })
                .collect(),
            log_path: r
                .log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            resources: applied_resources(r),
            image_id: r.image_id.clone(),
            user: ContainerUser {
                uid,
                gid,
                supplemental_groups,
            },
            stop_signal: r.effective_stop_signal(),
        }
    }

    pub(super) fn summary(r: &Record) -> ContainerSummary {
        ContainerSummary {
            id: r.id.clone(),
            pod_sandbox_id: r.sandbox_id.clone(),
            metadata: r.config.metadata.clone(),
            image: shown_image(r.config.image.as_ref()),
            image_ref: r.image_ref.clone(),
            state: r.state,
            created_at: r.created_at,
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            image_id: r.image_id.clone(),
        }
    }

    pub async fn list(&self, filter: Option<&ContainerFilter>) -> Vec<ContainerSummary> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let mut r = e.lock().await;
            if r.state == ContainerState::Removed {
                continue;
            }
            self.sync_exit(&mut r);
            if let Some(f) = filter {
                if !f.id.is_empty() && !r.id.starts_with(&f.id) {
                    continue;
                }
                if !f.pod_sandbox_id.is_empty() && !r.sandbox_id.starts_with(&f.pod_sandbox_id) {
                    continue;
                }
                if f.state.is_some_and(|s| s != r.state) {
                    continue;
                }
                if !sandbox::labels_match(&r.config.labels, &f.label_selector) {
                    continue;
                }
            }
            out.push(Self::summary(&r));
        }
        out.sort_by_key(|c| c.created_at);
        out
    }

    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<(ContainerStatus, HashMap<String, String>), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        Self::present(&r)?;
        self.sync_exit(&mut r);
        let status = Self::status_of(&r);
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
                "writableLayerProject": r.project,
                "cgroup": r.cgroup.as_ref().map(|c| c.path.clone()),
                "runtimeSpec": spec,
            });
            info.insert("info".to_string(), v.to_string());
        }
        Ok((status, info))
    }
}

/// The image a container's status and listing show: the name the user gave (kubelet sends
/// the image's ID as `image`, and the pod's own reference as `user_specified_image`), as
/// CRI-O shows it; kubelet copies it into the pod's status, where a spec updated from one tag
/// to another must show the new one. Without a name given, the image as created.
fn shown_image(spec: Option<&ImageSpec>) -> Option<ImageSpec> {
    spec.map(|s| {
        let mut s = s.clone();
        if !s.user_specified_image.is_empty() {
            s.image = s.user_specified_image.clone();
        }
        s
    })
}
