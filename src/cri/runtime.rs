//! CRI RuntimeService. `Version` answers now; pod and container RPCs arrive with the runtime.

use std::pin::Pin;

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_server::RuntimeService;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::rpc;
use super::status::unimplemented;

pub const RUNTIME_NAME: &str = "crius";
pub const CRI_VERSION: &str = "v1";

pub struct Runtime;

impl Runtime {
    pub fn new() -> Runtime {
        Runtime
    }
}

macro_rules! not_yet {
    ($($method:ident($req:ty) -> $resp:ty = $name:literal;)*) => {
        $(
            // Written out as async_trait expands it: the attribute cannot see inside this macro.
            fn $method<'life0, 'async_trait>(
                &'life0 self,
                _req: Request<$req>,
            ) -> Pin<Box<dyn std::future::Future<Output = Result<Response<$resp>, Status>> + Send + 'async_trait>>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(rpc($name, async { Err(unimplemented($name, "the pod runtime is not built yet")) }))
            }
        )*
    };
}

#[tonic::async_trait]
impl RuntimeService for Runtime {
    async fn version(
        &self,
        _req: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        rpc("Version", async {
            Ok(cri::VersionResponse {
                version: "0.1.0".to_string(),
                runtime_name: RUNTIME_NAME.to_string(),
                runtime_version: env!("CARGO_PKG_VERSION").to_string(),
                runtime_api_version: CRI_VERSION.to_string(),
            })
        })
        .await
    }

    type GetContainerEventsStream =
        Pin<Box<dyn Stream<Item = Result<cri::ContainerEventResponse, Status>> + Send>>;

    async fn get_container_events(
        &self,
        _req: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        rpc("GetContainerEvents", async {
            Err(unimplemented(
                "GetContainerEvents",
                "container events are not built yet",
            ))
        })
        .await
    }

    not_yet! {
        run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse = "RunPodSandbox";
        stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse = "StopPodSandbox";
        remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse = "RemovePodSandbox";
        pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse = "PodSandboxStatus";
        list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse = "ListPodSandbox";
        create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse = "CreateContainer";
        start_container(cri::StartContainerRequest) -> cri::StartContainerResponse = "StartContainer";
        stop_container(cri::StopContainerRequest) -> cri::StopContainerResponse = "StopContainer";
        remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse = "RemoveContainer";
        list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse = "ListContainers";
        container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse = "ContainerStatus";
        update_container_resources(cri::UpdateContainerResourcesRequest) -> cri::UpdateContainerResourcesResponse = "UpdateContainerResources";
        reopen_container_log(cri::ReopenContainerLogRequest) -> cri::ReopenContainerLogResponse = "ReopenContainerLog";
        exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse = "ExecSync";
        exec(cri::ExecRequest) -> cri::ExecResponse = "Exec";
        attach(cri::AttachRequest) -> cri::AttachResponse = "Attach";
        port_forward(cri::PortForwardRequest) -> cri::PortForwardResponse = "PortForward";
        container_stats(cri::ContainerStatsRequest) -> cri::ContainerStatsResponse = "ContainerStats";
        list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse = "ListContainerStats";
        pod_sandbox_stats(cri::PodSandboxStatsRequest) -> cri::PodSandboxStatsResponse = "PodSandboxStats";
        list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse = "ListPodSandboxStats";
        update_runtime_config(cri::UpdateRuntimeConfigRequest) -> cri::UpdateRuntimeConfigResponse = "UpdateRuntimeConfig";
        status(cri::StatusRequest) -> cri::StatusResponse = "Status";
        checkpoint_container(cri::CheckpointContainerRequest) -> cri::CheckpointContainerResponse = "CheckpointContainer";
        list_metric_descriptors(cri::ListMetricDescriptorsRequest) -> cri::ListMetricDescriptorsResponse = "ListMetricDescriptors";
        list_pod_sandbox_metrics(cri::ListPodSandboxMetricsRequest) -> cri::ListPodSandboxMetricsResponse = "ListPodSandboxMetrics";
        runtime_config(cri::RuntimeConfigRequest) -> cri::RuntimeConfigResponse = "RuntimeConfig";
    }
}
