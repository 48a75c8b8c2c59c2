//! The pod's network: attaching and detaching it through `network`, its attachment record in
//! the sandbox's directory (`network.json`), its IPs in PodSandboxStatus, and, at start-up,
//! undoing what a daemon killed mid-ADD left, then the network's GC with the attachments kept.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{Error, PodService};
use crate::network::{self, ConfError, Readiness};
use crate::sandbox::{PodStatus, config::PodConfig};

impl PodService {
    pub(super) fn record(&self, id: &str) -> PathBuf {
        self.sandboxes.paths(id).dir.join("network.json")
    }

    fn network_err(id: &str) -> impl FnOnce(network::Error) -> Error + '_ {
        move |source| Error::Network {
            id: id.to_string(),
            source,
        }
    }

    /// Whether pods get a CNI network: yes with a network list, no without one (they keep
    /// crius's loopback, and NetworkReady says why); a broken list is an error.
    pub(super) fn network_wanted(&self) -> Result<bool, Error> {
        match self.network.current() {
            Ok(_) => Ok(true),
            Err(ConfError::None { .. }) => Ok(false),
            Err(e) => Err(Error::Network {
                id: String::new(),
                source: e.into(),
            }),
        }
    }

    pub(super) async fn attach(&self, id: &str, config: &PodConfig) -> Result<(), Error> {
        let netns = self.sandboxes.paths(id).ns("net");
        let cidr = self
            .pod_cidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let pod = network::Pod {
            sandbox_id: id,
            config,
            netns: &netns,
            pod_cidr: &cidr,
        };
        let att = self
            .network
            .attach(&pod, &self.record(id))
            .await
            .map_err(Self::network_err(id))?;
        tracing::info!(sandbox = id, ips = ?att.ips(), "pod network attached");
        Ok(())
    }

    /// DEL with what ADD used; an error leaves the record for the next try.
    pub(super) async fn detach(&self, id: &str) -> Result<(), Error> {
        self.network
            .detach(id, &self.record(id))
            .await
            .map_err(Self::network_err(id))
    }

    /// CHECK of an attached pod's network: `ok`, or what the plugins found wrong; None when
    /// the pod has no attachment.
    pub(super) async fn network_check(&self, id: &str) -> Option<String> {
        match self.network.check(&self.record(id)).await {
            Ok(network::Checked::Passed) => Some("ok".to_string()),
            Ok(network::Checked::Skipped(why)) => Some(format!("not checked: {why}")),
            Ok(network::Checked::NoAttachment) => None,
            Err(e) => Some(e.to_string()),
        }
    }

    /// The pod's IPs into its status, and, verbose, the attachment itself.
    pub(super) fn network_status(
        &self,
        status: &mut PodStatus,
        info: &mut HashMap<String, String>,
        verbose: bool,
    ) {
        let Ok(Some(att)) = network::read(&self.record(&status.pod.id)) else {
            if verbose {
                // Host network, or no network list when the pod ran: its namespace has only lo.
                let none = serde_json::json!({ "attachment": null, "interfaces": ["lo"] });
                info.insert("network".to_string(), none.to_string());
            }
            return;
        };
        status.ips = att.ips();
        if verbose && let Ok(text) = serde_json::to_string(&att) {
            info.insert("network".to_string(), text);
        }
    }

    /// NetworkReady, as Status reports it.
    pub async fn network_readiness(&self) -> Readiness {
        self.network.readiness().await
    }

    /// kubelet's pod CIDR, for the `ipRanges` capability of pods made from now on.
    pub fn set_pod_cidr(&self, cidr: &str) {
        *self.pod_cidr.lock().unwrap_or_else(|p| p.into_inner()) = cidr.to_string();
    }

    pub fn pod_cidr(&self) -> String {
        self.pod_cidr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// At start-up: an attachment without a result (the daemon died during ADD) is undone, and
    /// a pod left without its network is stopped, so kubelet makes a new one; no IP is leaked
    /// and none is handed to two pods.
    pub async fn recover(&self) {
        for r in self.sandboxes.records().await {
            let record = self.record(&r.id);
            let att = match network::read(&record) {
                Ok(att) => att,
                // Unreadable is not absent: leave the pod as it is, and say so.
                Err(e) => {
                    tracing::warn!(sandbox = r.id, error = %e, "reading a pod's network attachment");
                    continue;
                }
            };
            let complete = att.as_ref().is_some_and(|a| a.result.is_some());
            if att.is_some() && (!r.ready || !complete) {
                // The killed daemon's plugins for this pod may still run: not alongside a DEL.
                network::plugin::settle_orphans(&r.id, Duration::from_secs(30)).await;
            }
            if att.is_some() && !r.ready {
                // Stopped, or stopping when the daemon died: the network goes as stop would.
                tracing::info!(
                    sandbox = r.id,
                    "detaching the network of a pod that is not ready"
                );
                if let Err(e) = self.detach(&r.id).await {
                    tracing::warn!(sandbox = r.id, error = %e, "detaching a stopped pod's network");
                }
                continue;
            }
            if att.is_some() && !complete {
                tracing::info!(sandbox = r.id, "undoing a network ADD a killed daemon left");
                if let Err(e) = self.detach(&r.id).await {
                    tracing::warn!(sandbox = r.id, error = %e, "undoing a half-made network");
                }
            }
            // Pods made while no network was configured keep their loopback: only one whose
            // ADD was cut short, or never begun (killed between its start and the ADD), lost
            // its network.
            let never_begun = r.cni && att.is_none();
            if r.ready && !r.host_network() && ((att.is_some() && !complete) || never_begun) {
                tracing::info!(sandbox = r.id, "stopping a pod left without its network");
                if let Err(e) = self.sandboxes.stop(&r.id).await {
                    tracing::warn!(sandbox = r.id, error = %e, "stopping a pod without network");
                }
            }
        }
        self.network_gc().await;
    }

    /// GC of the node's network (CNI 1.1 lists), keeping every attachment a record still
    /// holds on that network: what the plugins hold for others (a reboot emptied the records'
    /// directory, or a record was lost) goes.
    async fn network_gc(&self) {
        let Ok(list) = self.network.current() else {
            return;
        };
        let mut live = Vec::new();
        for r in self.sandboxes.records().await {
            match network::read(&self.record(&r.id)) {
                Ok(Some(att)) => {
                    if att.list.get("name").and_then(|n| n.as_str()) == Some(list.name.as_str()) {
                        live.push(network::Live {
                            container_id: att.container_id,
                            ifname: att.ifname,
                        });
                    }
                }
                Ok(None) => {}
                // An attachment that cannot be read may still be live: no GC this time.
                Err(e) => {
                    tracing::warn!(sandbox = r.id, error = %e, "no network GC: an attachment is unreadable");
                    return;
                }
            }
        }
        match self.network.gc(&live).await {
            Ok(true) => tracing::info!(network = list.name, kept = live.len(), "network GC"),
            Ok(false) => {}
            Err(e) => tracing::warn!(network = list.name, error = %e, "network GC"),
        }
    }
}
