//! PodSandboxStatus and ListPodSandbox: records as CRI shows them, with filters.

use super::*;

impl SandboxService {
    /// Whether the sandbox is ready right now (its pause process lives).
    pub(super) fn ready(r: &Record) -> bool {
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
