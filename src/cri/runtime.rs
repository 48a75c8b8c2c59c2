//! CRI RuntimeService: requests in, `pod` calls, CRI messages out.

use std::collections::HashMap;
use std::pin::Pin;

use crate::cri::v1 as cri;
use crate::cri::v1::runtime_service_server::RuntimeService;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::convert;
use super::lists::{Listing, chunked};
use super::rpc;
use super::status::ToStatus;
use crate::pod::PodService;

/// The most ports one PortForward may name.
const MAX_FORWARDED_PORTS: usize = 1024;

pub const RUNTIME_NAME: &str = "crius";
pub const CRI_VERSION: &str = "v1";

pub struct Runtime {
    /// The orchestrator every call goes through.
    pods: PodService,
    /// The operator's pause image, if pods run on one rather than the built-in pause.
    pause_image: Option<String>,
    config: serde_json::Value,
    streams: crate::stream::StreamServer,
}

impl Runtime {
    pub fn new(
        pods: PodService,
        pause_image: Option<String>,
        config: serde_json::Value,
        streams: crate::stream::StreamServer,
    ) -> Runtime {
        Runtime {
            pods,
            pause_image,
            config,
            streams,
        }
    }
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

    async fn run_pod_sandbox(
        &self,
        req: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        rpc("RunPodSandbox", async {
            let req = req.into_inner();
            super::validate::runtime_handler(&req.runtime_handler)?;
            let config = req.config.ok_or_else(|| super::status::missing("config"))?;
            let config = convert::pod_config(config, "config")?;
            let (pods, pause) = (self.pods.clone(), self.pause_image.clone());
            let id = super::to_the_end(async move {
                Ok(pods
                    .run(config, &req.runtime_handler, pause.as_deref())
                    .await?)
            })
            .await?;
            Ok(cri::RunPodSandboxResponse { pod_sandbox_id: id })
        })
        .await
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        rpc("StopPodSandbox", async {
            let (pods, id) = (self.pods.clone(), req.into_inner().pod_sandbox_id);
            super::to_the_end(async move { Ok(pods.stop(&id).await?) }).await?;
            Ok(cri::StopPodSandboxResponse {})
        })
        .await
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        rpc("RemovePodSandbox", async {
            let (pods, id) = (self.pods.clone(), req.into_inner().pod_sandbox_id);
            super::to_the_end(async move { Ok(pods.remove(&id).await?) }).await?;
            Ok(cri::RemovePodSandboxResponse {})
        })
        .await
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<cri::PodSandboxStatusRequest>,
    ) -> Result<Response<cri::PodSandboxStatusResponse>, Status> {
        rpc("PodSandboxStatus", async {
            let req = req.into_inner();
            let report = self.pods.status(&req.pod_sandbox_id, req.verbose).await?;
            Ok(convert::cri_pod_report(report))
        })
        .await
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        rpc("ListPodSandbox", async {
            let items = match req.into_inner().filter.map(convert::pod_filter) {
                Some(None) => Vec::new(),
                Some(Some(f)) => self.pods.list_pods(Some(&f)).await,
                None => self.pods.list_pods(None).await,
            };
            Ok(cri::ListPodSandboxResponse {
                items: items.iter().map(convert::cri_pod).collect(),
            })
        })
        .await
    }

    async fn create_container(
        &self,
        req: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        rpc("CreateContainer", async {
            let req = req.into_inner();
            let config = req.config.ok_or_else(|| super::status::missing("config"))?;
            let config = convert::container_config(config)?;
            let sandbox_config = req
                .sandbox_config
                .map(|c| convert::pod_config(c, "sandbox_config"))
                .transpose()?;
            let pods = self.pods.clone();
            let id = super::to_the_end(async move {
                Ok(pods
                    .create_container(&req.pod_sandbox_id, config, sandbox_config)
                    .await?)
            })
            .await?;
            Ok(cri::CreateContainerResponse { container_id: id })
        })
        .await
    }

    async fn start_container(
        &self,
        req: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        rpc("StartContainer", async {
            let (pods, id) = (self.pods.clone(), req.into_inner().container_id);
            super::to_the_end(async move { Ok(pods.start_container(&id).await?) }).await?;
            Ok(cri::StartContainerResponse {})
        })
        .await
    }

    async fn stop_container(
        &self,
        req: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        rpc("StopContainer", async {
            let req = req.into_inner();
            let pods = self.pods.clone();
            super::to_the_end(async move {
                Ok(pods.stop_container(&req.container_id, req.timeout).await?)
            })
            .await?;
            Ok(cri::StopContainerResponse {})
        })
        .await
    }

    async fn remove_container(
        &self,
        req: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        rpc("RemoveContainer", async {
            let (pods, id) = (self.pods.clone(), req.into_inner().container_id);
            super::to_the_end(async move { Ok(pods.remove_container(&id).await?) }).await?;
            Ok(cri::RemoveContainerResponse {})
        })
        .await
    }

    async fn list_containers(
        &self,
        req: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        rpc("ListContainers", async {
            let containers = match req.into_inner().filter.map(convert::container_filter) {
                Some(None) => Vec::new(),
                Some(Some(f)) => self.pods.list_containers(Some(&f)).await,
                None => self.pods.list_containers(None).await,
            };
            Ok(cri::ListContainersResponse {
                containers: containers.iter().map(convert::cri_container).collect(),
            })
        })
        .await
    }

    async fn container_status(
        &self,
        req: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        rpc("ContainerStatus", async {
            let req = req.into_inner();
            let (status, info) = self
                .pods
                .container_status(&req.container_id, req.verbose)
                .await?;
            Ok(cri::ContainerStatusResponse {
                status: Some(convert::cri_container_status(&status)),
                info,
            })
        })
        .await
    }

    async fn exec_sync(
        &self,
        req: Request<cri::ExecSyncRequest>,
    ) -> Result<Response<cri::ExecSyncResponse>, Status> {
        rpc("ExecSync", async {
            let req = req.into_inner();
            super::validate::exec(&req.cmd)?;
            let (stdout, stderr, exit_code) = self
                .pods
                .exec_sync(&req.container_id, req.cmd, req.timeout)
                .await?;
            Ok(cri::ExecSyncResponse {
                stdout,
                stderr,
                exit_code,
            })
        })
        .await
    }

    async fn exec(
        &self,
        req: Request<cri::ExecRequest>,
    ) -> Result<Response<cri::ExecResponse>, Status> {
        rpc("Exec", async {
            let req = req.into_inner();
            super::validate::exec(&req.cmd)?;
            let opts = crate::stream::Opts {
                stdin: req.stdin,
                stdout: req.stdout,
                stderr: req.stderr,
                tty: req.tty,
            };
            let id = self.pods.check_stream(&req.container_id, &opts).await?;
            let url = self.streams.url_for(crate::stream::Request::Exec {
                container_id: id,
                cmd: req.cmd,
                opts,
            })?;
            Ok(cri::ExecResponse { url })
        })
        .await
    }

    async fn attach(
        &self,
        req: Request<cri::AttachRequest>,
    ) -> Result<Response<cri::AttachResponse>, Status> {
        rpc("Attach", async {
            let req = req.into_inner();
            let opts = crate::stream::Opts {
                stdin: req.stdin,
                stdout: req.stdout,
                stderr: req.stderr,
                tty: req.tty,
            };
            let id = self.pods.check_stream(&req.container_id, &opts).await?;
            let url = self.streams.url_for(crate::stream::Request::Attach {
                container_id: id,
                opts,
            })?;
            Ok(cri::AttachResponse { url })
        })
        .await
    }

    async fn port_forward(
        &self,
        req: Request<cri::PortForwardRequest>,
    ) -> Result<Response<cri::PortForwardResponse>, Status> {
        rpc("PortForward", async {
            let req = req.into_inner();
            let pod = self.pods.pod(&req.pod_sandbox_id).await?;
            if !pod.ready {
                return Err(crate::sandbox::Error::NotReady { id: pod.id }.into());
            }
            // Each URL holds its ports until used: a list of millions is no port-forward.
            if req.port.len() > MAX_FORWARDED_PORTS {
                return Err(Status::invalid_argument(format!(
                    "port: {} ports, more than {MAX_FORWARDED_PORTS}",
                    req.port.len()
                )));
            }
            let ports = req
                .port
                .iter()
                .map(|&p| {
                    u16::try_from(p).ok().filter(|&p| p != 0).ok_or_else(|| {
                        Status::invalid_argument(format!("port {p} is not a port (1 to 65535)"))
                    })
                })
                .collect::<Result<Vec<u16>, Status>>()?;
            let url = self.streams.url_for(crate::stream::Request::PortForward {
                sandbox_id: pod.id,
                ports,
            })?;
            Ok(cri::PortForwardResponse { url })
        })
        .await
    }

    async fn reopen_container_log(
        &self,
        req: Request<cri::ReopenContainerLogRequest>,
    ) -> Result<Response<cri::ReopenContainerLogResponse>, Status> {
        rpc("ReopenContainerLog", async {
            self.pods
                .reopen_container_log(&req.into_inner().container_id)
                .await?;
            Ok(cri::ReopenContainerLogResponse {})
        })
        .await
    }

    async fn status(
        &self,
        req: Request<cri::StatusRequest>,
    ) -> Result<Response<cri::StatusResponse>, Status> {
        rpc("Status", async {
            let verbose = req.into_inner().verbose;
            let cgroups = self.pods.cgroup_policy();
            let mut conditions = vec![
                cri::RuntimeCondition {
                    r#type: "RuntimeReady".into(),
                    status: true,
                    reason: String::new(),
                    message: String::new(),
                },
                {
                    let net = self.pods.network_readiness().await;
                    cri::RuntimeCondition {
                        r#type: "NetworkReady".into(),
                        status: net.ready,
                        reason: net.reason,
                        message: net.message,
                    }
                },
            ];
            // Not a condition kubelet acts on: it tells operators what the node enforces.
            let (enforced, reason, message) = match &cgroups.hierarchy {
                Some(h) => (true, String::new(), format!("cgroup v2 controllers: {}", h.controllers.join(" "))),
                None if cgroups.allow_unenforced => (
                    false,
                    "NoCgroupV2".to_string(),
                    "cgroup v2 is not mounted at /sys/fs/cgroup: pods run WITHOUT resource limits (cgroup.allow_unenforced)".to_string(),
                ),
                None => (
                    false,
                    "NoCgroupV2".to_string(),
                    "cgroup v2 is not mounted at /sys/fs/cgroup: resource limits are refused".to_string(),
                ),
            };
            conditions.push(cri::RuntimeCondition {
                r#type: "ResourceLimitsEnforced".into(),
                status: enforced,
                reason,
                message,
            });
            let features = || {
                Some(cri::RuntimeHandlerFeatures {
                    recursive_read_only_mounts: crate::container::recursive_read_only_mounts(),
                    user_namespaces: crate::container::user_namespaces(),
                })
            };
            let mut runtime_handlers = vec![cri::RuntimeHandler {
                name: String::new(),
                features: features(),
            }];
            for h in self.pods.handlers() {
                runtime_handlers.push(cri::RuntimeHandler {
                    name: h.clone(),
                    features: features(),
                });
            }
            let mut info = HashMap::new();
            if verbose {
                info.insert(
                    "info".to_string(),
                    serde_json::json!({
                        "runtime": RUNTIME_NAME,
                        "version": env!("CARGO_PKG_VERSION"),
                        "podCIDR": self.pods.pod_cidr(),
                    })
                    .to_string(),
                );
                info.insert("config".to_string(), self.config.to_string());
                info.insert(
                    "features".to_string(),
                    serde_json::json!({
                        "cgroupV2": cgroups.hierarchy.is_some(),
                        "cgroupDriver": if cgroups.systemd { "systemd" } else { "cgroupfs" },
                        "apparmor": crate::sandbox::security::apparmor_enabled(),
                        "selinux": crate::sandbox::security::selinux_enabled(),
                        "idmappedMounts": crate::container::user_namespaces(),
                    })
                    .to_string(),
                );
            }
            Ok(cri::StatusResponse {
                status: Some(cri::RuntimeStatus { conditions }),
                info,
                runtime_handlers,
                features: Some(cri::RuntimeFeatures {
                    supplemental_groups_policy: true,
                    // A pod with its own user namespace on the host's network is refused.
                    user_namespaces_host_network: true,
                    // Bind-mount options (Mount.mount_options): nosuid, nodev, noexec and
                    // their recursive forms.
                    mount_options: true,
                }),
            })
        })
        .await
    }

    async fn update_runtime_config(
        &self,
        req: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Result<Response<cri::UpdateRuntimeConfigResponse>, Status> {
        rpc("UpdateRuntimeConfig", async {
            let cidr = req
                .into_inner()
                .runtime_config
                .and_then(|c| c.network_config)
                .map(|n| n.pod_cidr)
                .unwrap_or_default();
            if !cidr.is_empty() {
                super::validate::pod_cidr(&cidr)?;
                tracing::info!(pod_cidr = cidr, "pod CIDR updated");
                self.pods.set_pod_cidr(&cidr);
            }
            Ok(cri::UpdateRuntimeConfigResponse {})
        })
        .await
    }

    async fn runtime_config(
        &self,
        _req: Request<cri::RuntimeConfigRequest>,
    ) -> Result<Response<cri::RuntimeConfigResponse>, Status> {
        rpc("RuntimeConfig", async {
            Ok(cri::RuntimeConfigResponse {
                linux: Some(cri::LinuxRuntimeConfiguration {
                    cgroup_driver: if self.pods.cgroup_policy().systemd {
                        cri::CgroupDriver::Systemd
                    } else {
                        cri::CgroupDriver::Cgroupfs
                    } as i32,
                }),
            })
        })
        .await
    }

    async fn update_container_resources(
        &self,
        req: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Result<Response<cri::UpdateContainerResourcesResponse>, Status> {
        rpc("UpdateContainerResources", async {
            let req = req.into_inner();
            let linux = req.linux.ok_or_else(|| super::status::missing("linux"))?;
            let pods = self.pods.clone();
            // To its end: cgroup files, systemd's properties and the record change together.
            super::to_the_end(async move {
                Ok(pods
                    .update_container_resources(&req.container_id, convert::resources(linux))
                    .await?)
            })
            .await?;
            Ok(cri::UpdateContainerResourcesResponse {})
        })
        .await
    }

    async fn container_stats(
        &self,
        req: Request<cri::ContainerStatsRequest>,
    ) -> Result<Response<cri::ContainerStatsResponse>, Status> {
        rpc("ContainerStats", async {
            let stats = self
                .pods
                .container_stats(&req.into_inner().container_id)
                .await?;
            Ok(cri::ContainerStatsResponse {
                stats: Some(convert::cri_container_stats(&stats)),
            })
        })
        .await
    }

    async fn list_container_stats(
        &self,
        req: Request<cri::ListContainerStatsRequest>,
    ) -> Result<Response<cri::ListContainerStatsResponse>, Status> {
        rpc("ListContainerStats", async {
            let filter = req.into_inner().filter.map(convert::container_stats_filter);
            let stats = self.pods.list_container_stats(filter.as_ref()).await;
            Ok(cri::ListContainerStatsResponse {
                stats: stats.iter().map(convert::cri_container_stats).collect(),
            })
        })
        .await
    }

    async fn pod_sandbox_stats(
        &self,
        req: Request<cri::PodSandboxStatsRequest>,
    ) -> Result<Response<cri::PodSandboxStatsResponse>, Status> {
        rpc("PodSandboxStats", async {
            let stats = self
                .pods
                .pod_stats(&req.into_inner().pod_sandbox_id)
                .await?;
            Ok(cri::PodSandboxStatsResponse {
                stats: Some(convert::cri_pod_stats(&stats)),
            })
        })
        .await
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Result<Response<cri::ListPodSandboxStatsResponse>, Status> {
        rpc("ListPodSandboxStats", async {
            let filter = req.into_inner().filter.map(convert::pod_stats_filter);
            let stats = self.pods.list_pod_stats(filter.as_ref()).await;
            Ok(cri::ListPodSandboxStatsResponse {
                stats: stats.iter().map(convert::cri_pod_stats).collect(),
            })
        })
        .await
    }

    async fn list_metric_descriptors(
        &self,
        _req: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Result<Response<cri::ListMetricDescriptorsResponse>, Status> {
        rpc("ListMetricDescriptors", async {
            Ok(cri::ListMetricDescriptorsResponse {
                descriptors: crate::container::metrics::descriptors()
                    .iter()
                    .map(convert::cri_descriptor)
                    .collect(),
            })
        })
        .await
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _req: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Result<Response<cri::ListPodSandboxMetricsResponse>, Status> {
        rpc("ListPodSandboxMetrics", async {
            Ok(cri::ListPodSandboxMetricsResponse {
                pod_metrics: self
                    .pods
                    .pod_metrics()
                    .await
                    .iter()
                    .map(convert::cri_pod_metrics)
                    .collect(),
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
            let stream = self
                .pods
                .events()
                .map(|e| e.map(convert::cri_event).map_err(|ended| ended.to_status()));
            Ok(Box::pin(stream) as Self::GetContainerEventsStream)
        })
        .await
    }

    type StreamPodSandboxesStream = Listing<cri::StreamPodSandboxesResponse>;

    async fn stream_pod_sandboxes(
        &self,
        req: Request<cri::StreamPodSandboxesRequest>,
    ) -> Result<Response<Self::StreamPodSandboxesStream>, Status> {
        rpc("StreamPodSandboxes", async {
            let pods = match req.into_inner().filter.map(convert::pod_filter) {
                Some(None) => Vec::new(),
                Some(Some(f)) => self.pods.list_pods(Some(&f)).await,
                None => self.pods.list_pods(None).await,
            };
            let items = pods.iter().map(convert::cri_pod).collect();
            Ok(chunked(items, |pod_sandboxes| {
                cri::StreamPodSandboxesResponse { pod_sandboxes }
            }))
        })
        .await
    }

    type StreamContainersStream = Listing<cri::StreamContainersResponse>;

    async fn stream_containers(
        &self,
        req: Request<cri::StreamContainersRequest>,
    ) -> Result<Response<Self::StreamContainersStream>, Status> {
        rpc("StreamContainers", async {
            let containers = match req.into_inner().filter.map(convert::container_filter) {
                Some(None) => Vec::new(),
                Some(Some(f)) => self.pods.list_containers(Some(&f)).await,
                None => self.pods.list_containers(None).await,
            };
            let items = containers.iter().map(convert::cri_container).collect();
            Ok(chunked(items, |containers| cri::StreamContainersResponse {
                containers,
            }))
        })
        .await
    }

    type StreamContainerStatsStream = Listing<cri::StreamContainerStatsResponse>;

    async fn stream_container_stats(
        &self,
        req: Request<cri::StreamContainerStatsRequest>,
    ) -> Result<Response<Self::StreamContainerStatsStream>, Status> {
        rpc("StreamContainerStats", async {
            let filter = req.into_inner().filter.map(convert::container_stats_filter);
            let stats = self.pods.list_container_stats(filter.as_ref()).await;
            let items = stats.iter().map(convert::cri_container_stats).collect();
            Ok(chunked(items, |container_stats| {
                cri::StreamContainerStatsResponse { container_stats }
            }))
        })
        .await
    }

    type StreamPodSandboxStatsStream = Listing<cri::StreamPodSandboxStatsResponse>;

    async fn stream_pod_sandbox_stats(
        &self,
        req: Request<cri::StreamPodSandboxStatsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxStatsStream>, Status> {
        rpc("StreamPodSandboxStats", async {
            let filter = req.into_inner().filter.map(convert::pod_stats_filter);
            let stats = self.pods.list_pod_stats(filter.as_ref()).await;
            let items = stats.iter().map(convert::cri_pod_stats).collect();
            Ok(chunked(items, |pod_sandbox_stats| {
                cri::StreamPodSandboxStatsResponse { pod_sandbox_stats }
            }))
        })
        .await
    }

    type StreamPodSandboxMetricsStream = Listing<cri::StreamPodSandboxMetricsResponse>;

    async fn stream_pod_sandbox_metrics(
        &self,
        _req: Request<cri::StreamPodSandboxMetricsRequest>,
    ) -> Result<Response<Self::StreamPodSandboxMetricsStream>, Status> {
        rpc("StreamPodSandboxMetrics", async {
            let metrics = self.pods.pod_metrics().await;
            let items = metrics.iter().map(convert::cri_pod_metrics).collect();
            Ok(chunked(items, |pod_sandbox_metrics| {
                cri::StreamPodSandboxMetricsResponse {
                    pod_sandbox_metrics,
                }
            }))
        })
        .await
    }

    async fn update_pod_sandbox_resources(
        &self,
        req: Request<cri::UpdatePodSandboxResourcesRequest>,
    ) -> Result<Response<cri::UpdatePodSandboxResourcesResponse>, Status> {
        rpc("UpdatePodSandboxResources", async {
            let req = req.into_inner();
            let pods = self.pods.clone();
            super::to_the_end(async move {
                Ok(pods
                    .update_pod_resources(
                        &req.pod_sandbox_id,
                        req.overhead.map(convert::resources),
                        req.resources.map(convert::resources),
                    )
                    .await?)
            })
            .await?;
            Ok(cri::UpdatePodSandboxResourcesResponse {})
        })
        .await
    }

    async fn checkpoint_container(
        &self,
        req: Request<cri::CheckpointContainerRequest>,
    ) -> Result<Response<cri::CheckpointContainerResponse>, Status> {
        rpc("CheckpointContainer", async {
            let req = req.into_inner();
            let pods = self.pods.clone();
            // To its end: a dropped dump would kill criu mid-way and leave its work behind.
            super::to_the_end(async move {
                Ok(pods
                    .checkpoint_container(&req.container_id, &req.location, req.timeout)
                    .await?)
            })
            .await?;
            Ok(cri::CheckpointContainerResponse {})
        })
        .await
    }

    async fn checkpoint_pod(
        &self,
        req: Request<cri::CheckpointPodRequest>,
    ) -> Result<Response<cri::CheckpointPodResponse>, Status> {
        rpc(
            "CheckpointPod",
            super::pod_checkpoint::checkpoint_pod(&self.pods, req),
        )
        .await
    }

    async fn restore_pod(
        &self,
        req: Request<cri::RestorePodRequest>,
    ) -> Result<Response<cri::RestorePodResponse>, Status> {
        let pause = self.pause_image.clone();
        rpc(
            "RestorePod",
            super::pod_checkpoint::restore_pod(&self.pods, pause, req),
        )
        .await
    }
}
