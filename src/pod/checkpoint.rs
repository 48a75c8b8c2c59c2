//! CheckpointPod and RestorePod at the pod level. A checkpoint holds the pod against a teardown
//! while `container` freezes, dumps and writes its containers. A restore checks the runtime
//! handler, has `container` read the checkpoint and unpack every container's archive (so a bad
//! checkpoint fails before anything is made), runs the new pod as RunPodSandbox does, then makes
//! each container from its archive, CREATED and not started, while the pod stays unlisted. On
//! any error, or when the work ends past its deadline (its caller has gone with an error), the
//! pod is removed with whatever was made in it: containers, mounts, cgroups, its network.

use std::path::{Path, PathBuf};

use tokio::time::Instant;

use super::{Error, PodService};
use crate::container::config::ContainerConfig;
use crate::container::{self, PreparedRestore};
use crate::sandbox::{self, config::PodConfig};

/// RestorePod's request, in crius's own types.
#[derive(Debug, Clone)]
pub struct PodRestore {
    pub checkpoint: PathBuf,
    pub config: PodConfig,
    pub handler: String,
    pub containers: Vec<ContainerConfig>,
}

/// What RestorePod made: the pod, and each container's name and ID in the configs' order.
#[derive(Debug, Clone)]
pub struct Restored {
    pub pod_id: String,
    pub containers: Vec<(String, String)>,
}

fn deadline_passed(what: String) -> Error {
    container::Error::DeadlinePassed { what }.into()
}

impl PodService {
    /// CheckpointPod: the containers `ids` of pod `pod` into the empty directory `output`, all
    /// paused for one cut and all running again when it returns, by `deadline`.
    pub async fn checkpoint_pod(
        &self,
        pod: &str,
        ids: &[String],
        output: &Path,
        deadline: Instant,
    ) -> Result<(), Error> {
        let id = self.sandboxes.resolve(pod)?;
        if self.is_pending(&id) {
            return Err(sandbox::Error::NotFound {
                id: pod.to_string(),
            }
            .into());
        }
        let _pod = self.teardown_lock(&id).read_owned().await;
        Ok(self
            .containers
            .checkpoint_pod(&id, ids, output, deadline)
            .await?)
    }

    /// RestorePod: a new pod from `req.config` with each container of the checkpoint made
    /// from its archive (CREATED), by `deadline`; on failure nothing of it is left.
    pub async fn restore_pod(
        &self,
        req: PodRestore,
        pause_image: Option<&str>,
        deadline: Instant,
    ) -> Result<Restored, Error> {
        if !req.handler.is_empty() && !self.handlers().contains(&req.handler) {
            let mut known: Vec<String> = self.handlers().iter().map(|h| format!("{h:?}")).collect();
            known.insert(0, "\"\" (default)".into());
            return Err(sandbox::Error::UnknownHandler {
                handler: req.handler,
                known: known.join(", "),
            }
            .into());
        }
        let cp = self.containers.open_pod_checkpoint(&req.checkpoint).await?;
        let prepared = self
            .containers
            .prepare_restores(&cp, &req.containers)
            .await?;
        if Instant::now() >= deadline {
            return Err(deadline_passed(format!(
                "reading checkpoint {}",
                req.checkpoint.display()
            )));
        }
        let pod_id = self.run(req.config, &req.handler, pause_image).await?;
        // Unlisted until its containers are made: nothing acts on a half-restored pod.
        self.set_pending(&pod_id, true);
        let made = self
            .restore_containers(&pod_id, req.containers, prepared, deadline)
            .await
            .and_then(|made| {
                if Instant::now() >= deadline {
                    Err(deadline_passed(format!("restoring pod sandbox {pod_id}")))
                } else {
                    Ok(made)
                }
            });
        self.set_pending(&pod_id, false);
        match made {
            Ok(containers) => Ok(Restored { pod_id, containers }),
            Err(e) => {
                if let Err(undo) = self.remove(&pod_id).await {
                    tracing::warn!(sandbox = pod_id, error = %undo, "removing a pod whose restore failed");
                }
                Err(e)
            }
        }
    }

    /// Makes each container of `configs` from its prepared archive in pod `pod_id`.
    async fn restore_containers(
        &self,
        pod_id: &str,
        configs: Vec<ContainerConfig>,
        prepared: Vec<PreparedRestore>,
        deadline: Instant,
    ) -> Result<Vec<(String, String)>, Error> {
        let _pod = self.teardown_lock(pod_id).read_owned().await;
        let mut made = Vec::with_capacity(configs.len());
        for (index, (config, p)) in configs.into_iter().zip(prepared).enumerate() {
            let name = p.name.clone();
            if Instant::now() >= deadline {
                return Err(deadline_passed(format!("restoring container {name:?}")));
            }
            let id = self
                .containers
                .create_restored(pod_id, config, p)
                .await
                .map_err(|source| Error::Restoring {
                    index,
                    name: name.clone(),
                    source: Box::new(source),
                })?;
            made.push((name, id));
        }
        Ok(made)
    }
}
