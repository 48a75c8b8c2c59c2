//! PodSandboxStatus and ListPodSandbox: what records show of pods, in crius's own terms (`cri`
//! makes CRI's messages of them), with filters.

use super::{
    BTreeMap, Error, HashMap, IdMapping, NamespaceMode, Record, SandboxService, config,
    labels_match,
};
use config::{NamespaceOptions, PodMetadata, UserNamespace};

/// Whether a pod is ready: its pause process holds its namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodState {
    Ready,
    NotReady,
}

/// A pod as ListPodSandbox shows it.
#[derive(Debug, Clone)]
pub struct PodSummary {
    pub id: String,
    pub metadata: Option<PodMetadata>,
    pub state: PodState,
    pub created_at: i64,
    pub labels: HashMap<String, String>,
    pub annotations: HashMap<String, String>,
    pub runtime_handler: String,
}

/// A pod as PodSandboxStatus shows it; its network addresses are `pod`'s to add.
#[derive(Debug, Clone)]
pub struct PodStatus {
    pub pod: PodSummary,
    pub namespaces: NamespaceOptions,
    /// The pod's IP and its other addresses, once its network is attached.
    pub ips: Vec<String>,
}

/// Which pods a listing shows.
#[derive(Debug, Clone, Default)]
pub struct PodFilter {
    /// A prefix of the pod's ID.
    pub id: String,
    pub state: Option<PodState>,
    pub label_selector: HashMap<String, String>,
}

impl SandboxService {
    /// Whether the sandbox is ready right now (its pause process lives).
    pub(super) fn ready(r: &Record) -> bool {
        r.ready && r.pause.is_some_and(|p| p.alive())
    }

    fn summary(r: &Record) -> PodSummary {
        PodSummary {
            id: r.id.clone(),
            metadata: r.config.metadata.clone(),
            state: if Self::ready(r) {
                PodState::Ready
            } else {
                PodState::NotReady
            },
            created_at: r.created_at,
            labels: r.config.labels.clone(),
            annotations: r.config.annotations.clone(),
            runtime_handler: r.runtime_handler.clone(),
        }
    }

    /// The pod's status, and, verbose, its details as JSON under `info`.
    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<(PodStatus, HashMap<String, String>), Error> {
        let r = self.get(id).await?;
        let m = |x: &IdMapping| config::IdMapping {
            host_id: x.host_id,
            container_id: x.container_id,
            length: x.size,
        };
        let userns = match &r.userns {
            None => UserNamespace {
                mode: NamespaceMode::Node,
                ..Default::default()
            },
            Some(u) => UserNamespace {
                mode: NamespaceMode::Pod,
                uids: vec![m(&u.uids)],
                gids: vec![m(&u.gids)],
            },
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
        let status = PodStatus {
            pod: Self::summary(&r),
            namespaces: NamespaceOptions {
                network: r.network,
                pid: r.pid,
                ipc: r.ipc,
                userns_options: Some(userns),
                ..Default::default()
            },
            ips: Vec::new(),
        };
        Ok((status, info))
    }

    pub async fn list(&self, filter: Option<&PodFilter>) -> Vec<PodSummary> {
        let entries = self.inner.records.all();
        let mut out = Vec::new();
        for e in entries {
            let r = e.lock().await;
            let pod = Self::summary(&r);
            if let Some(f) = filter {
                if !f.id.is_empty() && !r.id.starts_with(&f.id) {
                    continue;
                }
                if f.state.is_some_and(|s| s != pod.state) {
                    continue;
                }
                if !labels_match(&r.config.labels, &f.label_selector) {
                    continue;
                }
            }
            out.push(pod);
        }
        out.sort_by_key(|s| s.created_at);
        out
    }
}
