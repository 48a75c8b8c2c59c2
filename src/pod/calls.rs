//! The calls that need nothing of a pod as a whole, passed on to the service that owns what
//! they name, so that every CRI call enters through `PodService` and the CRI layer holds no
//! other service. Each answers with the owning service's error, unchanged.

use super::PodService;
use crate::container::metrics::PodMetrics;
use crate::container::stats::{ContainerStats, PodStats, StatsFilter};
use crate::container::stream::{StreamOpts, StreamSession};
use crate::container::{self, ContainerFilter, ContainerStatus, ContainerSummary};
use crate::runtime::cgroup::Policy;
use crate::sandbox::config::Resources;
use crate::sandbox::{self, PodFilter, PodSummary};

/// A container's status with its verbose details.
pub type StatusReport = (ContainerStatus, std::collections::HashMap<String, String>);

impl PodService {
    /// ListPodSandbox.
    pub async fn list_pods(&self, filter: Option<&PodFilter>) -> Vec<PodSummary> {
        let mut pods = self.sandboxes.list(filter).await;
        // A pod whose RunPodSandbox plugins have not answered is not there yet.
        pods.retain(|p| !self.is_pending(&p.id));
        pods
    }

    /// One pod's record (PortForward checks it is ready).
    pub async fn pod(&self, id: &str) -> Result<sandbox::Record, sandbox::Error> {
        self.sandboxes.get(id).await
    }

    /// UpdatePodSandboxResources.
    pub async fn update_pod_resources(
        &self,
        id: &str,
        overhead: Option<Resources>,
        resources: Option<Resources>,
    ) -> Result<(), sandbox::Error> {
        self.sandboxes
            .update_resources(id, overhead, resources)
            .await
    }

    /// A connection to `port` inside the pod (port forwarding).
    pub async fn dial(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream, sandbox::Error> {
        self.sandboxes.dial(id, port).await
    }

    /// The node's cgroup policy (Status, RuntimeConfig).
    pub fn cgroup_policy(&self) -> &Policy {
        self.sandboxes.cgroups()
    }

    /// The configured runtime handlers.
    pub fn handlers(&self) -> &[String] {
        self.sandboxes.handlers()
    }

    /// PodSandboxStats.
    pub async fn pod_stats(&self, id: &str) -> Result<PodStats, container::Error> {
        self.containers.pod_stats(id).await
    }

    /// ListPodSandboxStats.
    pub async fn list_pod_stats(&self, filter: Option<&StatsFilter>) -> Vec<PodStats> {
        self.containers.list_pod_stats(filter).await
    }

    /// ListPodSandboxMetrics.
    pub async fn pod_metrics(&self) -> Vec<PodMetrics> {
        self.containers.pod_metrics().await
    }

    /// StartContainer.
    pub async fn start_container(&self, id: &str) -> Result<(), container::Error> {
        self.containers.start(id).await
    }

    /// StopContainer.
    pub async fn stop_container(&self, id: &str, timeout: i64) -> Result<(), container::Error> {
        self.containers.stop(id, timeout).await
    }

    /// RemoveContainer.
    pub async fn remove_container(&self, id: &str) -> Result<(), container::Error> {
        self.containers.remove(id).await
    }

    /// ListContainers.
    pub async fn list_containers(&self, filter: Option<&ContainerFilter>) -> Vec<ContainerSummary> {
        self.containers.list(filter).await
    }

    /// ContainerStatus.
    pub async fn container_status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<StatusReport, container::Error> {
        self.containers.status(id, verbose).await
    }

    /// ExecSync: stdout, stderr, exit code.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), container::Error> {
        self.containers.exec_sync(id, cmd, timeout).await
    }

    /// Whether Exec or Attach may hand out a URL; the container's full ID.
    pub async fn check_stream(
        &self,
        id: &str,
        opts: &StreamOpts,
    ) -> Result<String, container::Error> {
        self.containers.check_stream(id, opts).await
    }

    /// A streamed exec (the streaming server's Exec).
    pub async fn exec_stream(
        &self,
        id: &str,
        cmd: Vec<String>,
        opts: StreamOpts,
    ) -> Result<StreamSession, container::Error> {
        self.containers.exec_stream(id, cmd, opts).await
    }

    /// An attachment (the streaming server's Attach).
    pub async fn attach_stream(
        &self,
        id: &str,
        opts: StreamOpts,
    ) -> Result<StreamSession, container::Error> {
        self.containers.attach_stream(id, opts).await
    }

    /// ReopenContainerLog.
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), container::Error> {
        self.containers.reopen_log(id).await
    }

    /// UpdateContainerResources.
    pub async fn update_container_resources(
        &self,
        id: &str,
        resources: Resources,
    ) -> Result<(), container::Error> {
        self.containers.update_resources(id, resources).await
    }

    /// ContainerStats.
    pub async fn container_stats(&self, id: &str) -> Result<ContainerStats, container::Error> {
        self.containers.stats(id).await
    }

    /// ListContainerStats.
    pub async fn list_container_stats(&self, filter: Option<&StatsFilter>) -> Vec<ContainerStats> {
        self.containers.list_stats(filter).await
    }

    /// CheckpointContainer.
    pub async fn checkpoint_container(
        &self,
        id: &str,
        location: &str,
        timeout: i64,
    ) -> Result<(), container::Error> {
        self.containers.checkpoint(id, location, timeout).await
    }
}
