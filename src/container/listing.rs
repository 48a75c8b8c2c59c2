//! ListContainers and ContainerStatus: records as CRI shows them, with filters.

use super::*;

impl ContainerService {
    /// IDs of a sandbox's containers.
    pub async fn in_sandbox(&self, sandbox_id: &str) -> Vec<String> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let r = e.lock().await;
            if r.sandbox_id == sandbox_id && r.state != REMOVED {
                out.push(r.id.clone());
            }
        }
        out
    }

    /// A record as ContainerStatus shows it.
    pub(super) fn cri_status(r: &Record) -> cri::ContainerStatus {
        let (uid, gid, groups) = r.user.clone();
        cri::ContainerStatus {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: r.state,
            created_at: r.created_at,
            started_at: r.started_at,
            finished_at: r.finished_at,
            exit_code: r.exit_code,
            image: r.config.image.clone(),
            image_ref: r.image_ref.clone(),
            reason: r.reason.clone(),
            message: r.message.clone(),
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            mounts: r.config.mounts.clone(),
            log_path: r
                .log_path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            resources: r
                .config
                .linux
                .as_ref()
                .and_then(|l| l.resources.clone())
                .map(|res| cri::ContainerResources {
                    linux: Some(res),
                    ..Default::default()
                }),
            image_id: r.image_id.clone(),
            user: Some(cri::ContainerUser {
                linux: Some(cri::LinuxContainerUser {
                    uid: uid.into(),
                    gid: gid.into(),
                    supplemental_groups: groups.iter().map(|g| i64::from(*g)).collect(),
                }),
            }),
        }
    }

    pub(super) fn to_cri(r: &Record) -> cri::Container {
        cri::Container {
            id: r.id.clone(),
            pod_sandbox_id: r.sandbox_id.clone(),
            metadata: r.config.metadata.clone(),
            image: r.config.image.clone(),
            image_ref: r.image_ref.clone(),
            state: r.state,
            created_at: r.created_at,
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            image_id: r.image_id.clone(),
        }
    }

    pub async fn list(&self, filter: Option<&cri::ContainerFilter>) -> Vec<cri::Container> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let mut r = e.lock().await;
            if r.state == REMOVED {
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
                if let Some(s) = &f.state
                    && s.state != r.state
                {
                    continue;
                }
                if !sandbox::labels_match(&r.config.labels, &f.label_selector) {
                    continue;
                }
            }
            out.push(Self::to_cri(&r));
        }
        out.sort_by_key(|c| c.created_at);
        out
    }

    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<(cri::ContainerStatus, HashMap<String, String>), Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        Self::present(&r)?;
        self.sync_exit(&mut r);
        let status = Self::cri_status(&r);
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
