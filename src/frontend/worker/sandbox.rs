//! The pod's place to run: its volumes (prepared once, Secrets and ConfigMaps written through
//! after), the hosts file of its hostAliases, and its sandbox, made (again, when it dies) with the
//! agent's label, with the network namespace and IP probes and hooks reach it at.

use std::path::PathBuf;

use crate::cri::v1 as cri;

use super::{Worker, pod_context};
use crate::frontend::AGENT_LABEL;
use crate::frontend::convert::{self, PodContext};
use crate::frontend::probe::Target;
use crate::frontend::status::now;
use crate::frontend::volumes;

impl Worker {
    pub(super) fn ensure_volumes(&mut self) -> bool {
        let spec = self.spec();
        let (store, ip) = self.ctx_parts();
        let ctx = pod_context(&self.pod, &spec, &self.rec, &store, &self.sh.node, &ip);
        let pod_dir = self.pod_dir();
        if self.volumes.is_none() {
            match volumes::prepare(&ctx, &pod_dir) {
                Ok(v) => self.volumes = Some(v),
                Err(e) => {
                    self.rec.event("Warning", "FailedMount", "", e.to_string());
                    self.rec.reason = "ContainerCreating".into();
                    self.wake = Some(now() + 2);
                    return false;
                }
            }
            self.last_refresh = now();
        } else if now() - self.last_refresh >= 1 {
            // Secrets and ConfigMaps edited since are written through to their volumes.
            self.last_refresh = now();
            for v in volumes::refresh(&ctx, &pod_dir) {
                tracing::info!(pod = %self.rec.key(), volume = %v, "volume updated");
            }
        }
        true
    }

    /// The hosts file of the pod when it has hostAliases.
    pub(super) fn hosts_file(&self) -> Option<PathBuf> {
        let spec = self.pod.spec.as_ref()?;
        let aliases = spec.host_aliases.as_ref()?;
        let path = self.pod_dir().join("etc-hosts");
        if !path.exists() {
            let mut text =
                String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
            let hostname = spec
                .hostname
                .clone()
                .unwrap_or_else(|| self.rec.name.clone());
            text.push_str(&format!("127.0.1.1\t{hostname}\n"));
            text.push_str("\n# Entries added by HostAliases.\n");
            for a in aliases {
                text.push_str(&format!(
                    "{}\t{}\n",
                    a.ip,
                    a.hostnames.clone().unwrap_or_default().join("\t")
                ));
            }
            let _ = std::fs::create_dir_all(self.pod_dir());
            let _ = crate::atomic::write(&path, text.as_bytes(), 0o644);
        }
        Some(path)
    }

    pub(super) async fn ensure_sandbox(&mut self) -> bool {
        if let Some(id) = self.rec.sandbox.clone() {
            let ready = self
                .sh
                .relist
                .borrow()
                .sandboxes
                .get(&id)
                .map(|s| s.state == cri::PodSandboxState::SandboxReady as i32);
            match ready {
                Some(true) => return true,
                // Not seen yet (just made, or the relist is behind): ask the runtime.
                None => {
                    if let Ok(r) = self
                        .sh
                        .rt
                        .pod_sandbox_status(cri::PodSandboxStatusRequest {
                            pod_sandbox_id: id.clone(),
                            verbose: false,
                        })
                        .await
                        && r.into_inner()
                            .status
                            .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
                    {
                        return true;
                    }
                }
                Some(false) => {}
            }
            self.rec.event(
                "Normal",
                "SandboxChanged",
                "",
                "Pod sandbox changed, it will be killed and re-created.",
            );
            self.kill_all_containers(0).await;
            self.stop_all_probes();
            let _ = self
                .sh
                .rt
                .stop_pod_sandbox(cri::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await;
            let _ = self
                .sh
                .rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                .await;
            self.rec.sandbox = None;
            self.rec.sandbox_attempt += 1;
            for c in self
                .rec
                .init_containers
                .iter_mut()
                .chain(self.rec.containers.iter_mut())
            {
                if c.id.is_some() {
                    c.id = None;
                    c.exited = None;
                    c.started = false;
                    c.ready = false;
                }
            }
            self.rec.set_condition("PodReadyToStartContainers", false);
        }
        let spec = self.spec();
        let log_dir = self.log_dir();
        let _ = std::fs::create_dir_all(&log_dir);
        let (store, ip) = self.ctx_parts();
        let vols = self.volumes.clone().unwrap_or_default();
        let ctx = PodContext {
            log_dir: &log_dir,
            volumes: &vols,
            ..pod_context(&self.pod, &spec, &self.rec, &store, &self.sh.node, &ip)
        };
        let mut cfg = convert::sandbox_config(&ctx, self.rec.sandbox_attempt);
        cfg.labels.insert(AGENT_LABEL.into(), "true".into());
        let handler = spec.runtime_class_name.clone().unwrap_or_default();
        match self
            .sh
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: handler,
            })
            .await
        {
            Ok(r) => {
                let id = r.into_inner().pod_sandbox_id;
                self.rec.sandbox = Some(id.clone());
                self.rec.reason.clear();
                self.rec.set_condition("PodReadyToStartContainers", true);
                self.target = self.sandbox_target(&id).await;
                self.rec.pod_ip = self.target.pod_ip.clone();
                self.rec.pod_ips = self.target.pod_ips.clone();
                let _ = self.sh.poke.send(());
                true
            }
            Err(s) => {
                self.rec.event(
                    "Warning",
                    "FailedCreatePodSandBox",
                    "",
                    format!("Failed to create pod sandbox: {}", s.message()),
                );
                self.rec.reason = "ContainerCreating".into();
                self.wake = Some(now() + 5);
                false
            }
        }
    }

    /// The pod's network namespace and IP, from the runtime's verbose status: crius reports
    /// `netNamespacePath`, containerd its runtime spec.
    async fn sandbox_target(&mut self, id: &str) -> Target {
        let Ok(r) = self
            .sh
            .rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.to_string(),
                verbose: true,
            })
            .await
        else {
            return Target::default();
        };
        let r = r.into_inner();
        let ips: Vec<String> = r
            .status
            .as_ref()
            .and_then(|s| s.network.as_ref())
            .map(|n| {
                std::iter::once(n.ip.clone())
                    .chain(n.additional_ips.iter().map(|a| a.ip.clone()))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let host_net = self.pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let info: serde_json::Value = r
            .info
            .get("info")
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default();
        let netns = info["netNamespacePath"]
            .as_str()
            .map(PathBuf::from)
            .or_else(|| {
                info["runtimeSpec"]["linux"]["namespaces"]
                    .as_array()?
                    .iter()
                    .find(|n| n["type"] == "network")?["path"]
                    .as_str()
                    .map(PathBuf::from)
            });
        Target {
            netns: if host_net { None } else { netns },
            pod_ip: ips.first().cloned().unwrap_or_default(),
            pod_ips: ips,
        }
    }

    pub(super) fn sandbox_config_for(&self, ctx: &PodContext) -> cri::PodSandboxConfig {
        let mut cfg = convert::sandbox_config(ctx, self.rec.sandbox_attempt);
        cfg.labels.insert(AGENT_LABEL.into(), "true".into());
        cfg
    }
}
