//! pod: pod sandboxes orchestrated above `sandbox`, `container` and
//! `network`. Running a pod resolves its pause image (pulled on first use and held while the
//! pod lives), has `sandbox` start the pause process and, unless the pod shares the host's
//! network, attaches its network namespace to the node's CNI network (`net`); stopping one
//! stops its containers, detaches the network, then stops the pause process; removing one
//! removes its containers, detaches again (harmless), removes the sandbox and releases the
//! image. PodSandboxStatus and the container event stream are assembled here. Every other
//! runtime call passes through here too (`calls`), so `cri` holds no other service, and pod-level
//! checkpoints and their restore into a new pod are orchestrated here (`checkpoint`). Uses
//! `image`, `sandbox`, `container` and `network`; its one record per pod is the network
//! attachment, kept in the sandbox's directory.

mod calls;
mod checkpoint;
mod net;
mod nri;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

pub use checkpoint::{PodRestore, Restored};

use crate::container::{self, ContainerService, events};
use crate::image::{self, ImageService};
use crate::network::{self, NetworkService};
use crate::records::now_nanos;
use crate::sandbox::config::{NamespaceMode, PodConfig};
use crate::sandbox::{self, PodState, PodStatus, SandboxService};

/// PodSandboxStatus's answer: the pod, its details, and its containers as ContainerStatus
/// shows them.
#[derive(Debug, Clone)]
pub struct PodReport {
    pub status: PodStatus,
    pub info: HashMap<String, String>,
    pub containers: Vec<container::ContainerStatus>,
    pub timestamp: i64,
}

/// A container event as GetContainerEvents gives it: the container as it was then, with its
/// pod's status and the pod's other containers as they are when it is sent.
#[derive(Debug, Clone)]
pub struct ContainerEvent {
    pub container_id: String,
    pub kind: events::EventKind,
    pub created_at: i64,
    /// None when the pod is gone.
    pub pod: Option<PodStatus>,
    pub containers: Vec<container::ContainerStatus>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Sandbox(#[from] sandbox::Error),
    #[error(transparent)]
    Container(#[from] container::Error),
    #[error(transparent)]
    Image(#[from] image::Error),
    #[error(transparent)]
    Nri(#[from] crate::nri::Error),
    /// RestorePod's `index`-th container config failed to be made.
    #[error("container_configs[{index}] ({name:?}): {source}")]
    Restoring {
        index: usize,
        name: String,
        #[source]
        source: Box<container::Error>,
    },
    #[error("pod sandbox {id}: {source}")]
    Network {
        id: String,
        #[source]
        source: network::Error,
    },
}

/// Pod-level operations over the services below.
#[derive(Clone)]
pub struct PodService {
    images: ImageService,
    sandboxes: SandboxService,
    containers: ContainerService,
    network: Arc<NetworkService>,
    /// kubelet's pod CIDR (UpdateRuntimeConfig), for the `ipRanges` capability.
    pod_cidr: Arc<Mutex<String>>,
    /// One stop or removal of a pod at a time (a removal must not take the namespace away
    /// under a stop's network DEL), and none while a container is being created in it (the
    /// removal would miss it and leave it without a pod).
    teardowns: Arc<Mutex<HashMap<String, Arc<tokio::sync::RwLock<()>>>>>,
    /// NRI plugins; `None` when NRI is turned off.
    nri: Option<crate::nri::Nri>,
    /// Pods whose RunPodSandbox plugins have not answered yet: not listed, not usable.
    pending: Arc<Mutex<std::collections::HashSet<String>>>,
}

impl PodService {
    pub fn new(
        images: ImageService,
        sandboxes: SandboxService,
        containers: ContainerService,
        network: Arc<NetworkService>,
        nri: Option<crate::nri::Nri>,
    ) -> PodService {
        PodService {
            images,
            sandboxes,
            containers,
            network,
            pod_cidr: Arc::new(Mutex::new(String::new())),
            teardowns: Arc::default(),
            nri,
            pending: Arc::default(),
        }
    }

    /// Whether the pod waits for its RunPodSandbox plugins.
    fn is_pending(&self, id: &str) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(id)
    }

    fn set_pending(&self, id: &str, pending: bool) {
        let mut set = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending {
            set.insert(id.to_string());
        } else {
            set.remove(id);
        }
    }

    fn teardown_lock(&self, id: &str) -> Arc<tokio::sync::RwLock<()>> {
        self.teardowns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Holds the pod against everything else (see `teardowns`).
    async fn teardown(&self, id: &str) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.teardown_lock(id).write_owned().await
    }

    /// CreateContainer, with no teardown of its pod running meanwhile.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: container::config::ContainerConfig,
        sandbox_config: Option<PodConfig>,
    ) -> Result<String, Error> {
        let _pod = match self.sandboxes.resolve(sandbox_id) {
            Ok(id) if self.is_pending(&id) => {
                return Err(sandbox::Error::NotReady { id }.into());
            }
            Ok(id) => Some(self.teardown_lock(&id).read_owned().await),
            // The container service names the missing pod.
            Err(_) => None,
        };
        Ok(self
            .containers
            .create(sandbox_id, config, sandbox_config)
            .await?)
    }

    /// StopPodSandbox: every container is killed, then the pause process stops.
    pub async fn stop(&self, sandbox_id: &str) -> Result<(), Error> {
        let id = match self.sandboxes.resolve(sandbox_id) {
            Ok(id) => id,
            Err(sandbox::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let _one = self.teardown(&id).await;
        let stops = self.containers.in_sandbox(&id).await.into_iter().map(|c| {
            let me = self.clone();
            async move { me.containers.stop(&c, 0).await }
        });
        for r in futures_util::future::join_all(stops).await {
            r?;
        }
        // Plugins hear of the stop with every container already exited.
        self.nri_stop(&id).await;
        // Not ready before the network goes: a crash in between leaves a pod that says it is
        // going, which start-up finishes, never a ready pod without its network.
        self.sandboxes.retire(&id).await?;
        self.detach(&id).await?;
        Ok(self.sandboxes.stop(&id).await?)
    }

    /// RemovePodSandbox: containers, then the sandbox's namespaces and files.
    pub async fn remove(&self, sandbox_id: &str) -> Result<(), Error> {
        let id = match self.sandboxes.resolve(sandbox_id) {
            Ok(id) => id,
            Err(sandbox::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let _one = self.teardown(&id).await;
        for c in self.containers.in_sandbox(&id).await {
            self.containers.remove(&c).await?;
        }
        self.nri_remove(&id).await;
        self.detach(&id).await?;
        let chain = self
            .sandboxes
            .get(&id)
            .await
            .ok()
            .and_then(|r| r.image_chain);
        self.sandboxes.remove(&id).await?;
        if let Some(c) = &chain {
            self.images.release(c);
        }
        self.teardowns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        Ok(())
    }

    /// RunPodSandbox: the sandbox, then its network. A pod whose network cannot be attached is
    /// taken down again: nothing of it is left but the error.
    pub async fn run(
        &self,
        config: PodConfig,
        handler: &str,
        pause_image: Option<&str>,
    ) -> Result<String, Error> {
        let host_network = config
            .namespaces()
            .is_some_and(|n| n.network == NamespaceMode::Node);
        // A broken network list fails the pod before anything is made.
        let attach = !host_network && self.network_wanted()?;
        // Held until the pod is listed: a plugin synchronizing meanwhile sees it.
        let _nri = match &self.nri {
            Some(n) => Some(n.hold_sync().await),
            None => None,
        };
        let id = self
            .start_sandbox(config.clone(), handler, pause_image, attach)
            .await?;
        self.set_pending(&id, true);
        let mut result = Ok(());
        if attach {
            result = self.attach(&id, &config).await;
        }
        if result.is_ok() {
            result = self.nri_run(&id).await;
        }
        if let Err(e) = result {
            if let Err(undo) = self.remove(&id).await {
                tracing::warn!(sandbox = id, error = %undo, "removing a pod that failed to start");
            }
            self.set_pending(&id, false);
            return Err(e);
        }
        self.set_pending(&id, false);
        Ok(id)
    }

    /// Starts the sandbox: on crius's built-in pause, or on the operator's pause image when one
    /// is configured (pulled when absent, with the node's credentials, and held while the pod
    /// lives so it is not collected from under it).
    async fn start_sandbox(
        &self,
        config: PodConfig,
        handler: &str,
        pause_image: Option<&str>,
        cni: bool,
    ) -> Result<String, Error> {
        let Some(reference) = pause_image else {
            return Ok(self.sandboxes.run(config, handler, None, cni).await?);
        };
        let image = match self.images.lookup(reference)? {
            Some(i) => i,
            None => self.images.pull(reference, None).await?,
        };
        let rc = &image.config.config;
        let mut args = rc.entrypoint.clone().unwrap_or_default();
        args.extend(rc.cmd.clone().unwrap_or_default());
        let chain = image.top_chain().cloned();
        if let Some(c) = &chain {
            self.images.hold(c);
        }
        let lowerdirs = match &chain {
            Some(_) => self.images.lowerdirs(&image),
            None => Ok(Vec::new()),
        };
        let result = match lowerdirs {
            Err(e) => Err(e.into()),
            Ok(lowerdirs) => {
                let sandbox_image = sandbox::SandboxImage {
                    chain: chain.clone(),
                    lowerdirs,
                    args,
                    env: rc.env.clone().unwrap_or_default(),
                    user: rc.user.clone(),
                    cwd: rc.working_dir.clone(),
                };
                self.sandboxes
                    .run(config, handler, Some(sandbox_image), cni)
                    .await
                    .map_err(Error::from)
            }
        };
        if result.is_err()
            && let Some(c) = &chain
        {
            self.images.release(c);
        }
        result
    }

    /// PodSandboxStatus: the sandbox's status with its containers' (as kubelet's evented PLEG
    /// wants them too).
    pub async fn status(&self, id: &str, verbose: bool) -> Result<PodReport, Error> {
        let (mut status, mut info) = self.sandboxes.status(id, verbose).await?;
        if self.is_pending(&status.pod.id) {
            return Err(sandbox::Error::NotFound { id: id.to_string() }.into());
        }
        self.network_status(&mut status, &mut info, verbose);
        if verbose && status.pod.state == PodState::Ready {
            // Asked for detail: whether the network is still as ADD left it (CNI CHECK).
            if let Some(verdict) = self.network_check(&status.pod.id).await {
                info.insert("networkCheck".to_string(), verdict);
            }
        }
        let mut containers = Vec::new();
        for c in self.containers.in_sandbox(&status.pod.id).await {
            if let Ok((s, _)) = self.containers.status(&c, false).await {
                containers.push(s);
            }
        }
        Ok(PodReport {
            status,
            info,
            containers,
            timestamp: now_nanos(),
        })
    }

    /// GetContainerEvents: every container event with its pod's status as PodSandboxStatus
    /// gives it (the event's container as it was then, as containerd gives it), until the
    /// subscriber falls behind (then it is dropped and should relist).
    pub fn events(
        &self,
    ) -> impl futures_util::Stream<Item = Result<ContainerEvent, events::Ended>> + use<> {
        let me = self.clone();
        let sub = self.containers.subscribe();
        futures_util::stream::unfold(Some(sub), move |sub| {
            let me = me.clone();
            async move {
                let mut sub = sub?;
                match sub.next().await {
                    Err(e) => Some((Err(e), None)),
                    Ok(n) => {
                        // A pod removed since has no status to give: the event still says so.
                        let pod = me.status(&n.sandbox_id, false).await.ok();
                        let (pod_status, mut statuses) = match pod {
                            Some(p) => (Some(p.status), p.containers),
                            None => (None, Vec::new()),
                        };
                        // The container's own status as it was when the event happened.
                        if let Some(then) = n.status {
                            match statuses.iter_mut().find(|s| s.id == then.id) {
                                Some(s) => *s = *then,
                                None => statuses.push(*then),
                            }
                        }
                        let event = ContainerEvent {
                            container_id: n.container_id,
                            kind: n.kind,
                            created_at: n.at,
                            pod: pod_status,
                            containers: statuses,
                        };
                        Some((Ok(event), Some(sub)))
                    }
                }
            }
        })
    }
}
