//! Pods told to NRI plugins: RunPodSandbox before the pod is listed (a plugin's error fails
//! it), StopPodSandbox once its containers stopped, RemovePodSandbox when it goes. And the
//! inventory NRI synchronizes plugins from and applies their updates and evictions through.

use std::sync::Arc;

use super::{Error, PodService};
use crate::nri::{self, api};

impl PodService {
    /// The pod as plugins see it, with its IPs.
    async fn nri_pod(&self, id: &str) -> Option<api::PodSandbox> {
        let record = self.sandboxes.get(id).await.ok()?;
        let ips = crate::network::read(&self.record(id))
            .ok()
            .flatten()
            .map(|a| a.ips())
            .unwrap_or_default();
        Some(record.nri(ips))
    }

    /// RunPodSandbox: the pod stays unlisted until the plugins answered.
    pub(super) async fn nri_run(&self, id: &str) -> Result<(), Error> {
        let Some(nri) = &self.nri else { return Ok(()) };
        if !nri.active() {
            nri.created(id);
            return Ok(());
        }
        let Some(pod) = self.nri_pod(id).await else {
            return Ok(());
        };
        Ok(nri.run_pod(&pod).await?)
    }

    /// StopPodSandbox, once; a plugin's error is logged (the pod stops regardless).
    pub(super) async fn nri_stop(&self, id: &str) {
        let Some(nri) = &self.nri else { return };
        if !nri.stop_untold(id) {
            return;
        }
        if !nri.active() {
            nri.stopped_quietly(id);
            return;
        }
        if let Some(pod) = self.nri_pod(id).await
            && let Err(e) = nri.stop_pod(&pod).await
        {
            tracing::warn!(sandbox = id, error = %e, "NRI StopPodSandbox");
        }
    }

    /// RemovePodSandbox, while the pod's record is still there.
    pub(super) async fn nri_remove(&self, id: &str) {
        let Some(nri) = &self.nri else { return };
        if !nri.knows(id) {
            return;
        }
        match self.nri_pod(id).await {
            Some(pod) if nri.active() => nri.remove_pod(&pod).await,
            _ => nri.forget(id),
        }
    }

    /// Starts NRI: plugins are taken on from now (the pods and containers recovered are
    /// what they are synchronized with).
    pub async fn serve_nri(&self) {
        if let Some(nri) = &self.nri {
            nri.serve(Arc::new(Inventory { pods: self.clone() })).await;
        }
    }
}

impl PodService {
    /// At the daemon's exit: plugins closed, the socket removed.
    pub fn shutdown_nri(&self) {
        if let Some(nri) = &self.nri {
            nri.shutdown();
        }
    }
}

/// The runtime as NRI sees it.
struct Inventory {
    pods: PodService,
}

impl nri::Inventory for Inventory {
    fn snapshot(&self) -> nri::Answer<(Vec<api::PodSandbox>, Vec<api::Container>)> {
        let me = self.pods.clone();
        Box::pin(async move {
            let mut pods = Vec::new();
            for p in me.sandboxes.list(None).await {
                if let Some(pod) = me.nri_pod(&p.id).await {
                    pods.push(pod);
                }
            }
            (pods, me.containers.nri_inventory().await)
        })
    }

    fn apply(
        &self,
        updates: Vec<api::ContainerUpdate>,
        evictions: Vec<api::ContainerEviction>,
    ) -> nri::Answer<Vec<api::ContainerUpdate>> {
        let me = self.pods.clone();
        Box::pin(async move {
            let mut failed = Vec::new();
            for u in updates {
                if let Err(e) = me.containers.nri_update(&u).await {
                    tracing::warn!(container = u.container_id, error = %e, "NRI update");
                    failed.push(u);
                }
            }
            for e in evictions {
                tracing::info!(
                    container = e.container_id,
                    reason = e.reason,
                    "NRI eviction"
                );
                if let Err(err) = me.containers.stop(&e.container_id, 0).await {
                    tracing::warn!(container = e.container_id, error = %err, "NRI eviction");
                }
            }
            failed
        })
    }
}
