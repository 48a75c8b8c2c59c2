//! CheckpointPod and RestorePod (KEP-5823): their requests held to the CRI's contract before any
//! work (required fields, absolute paths, container IDs without repeats, unique non-empty
//! container names, no runtime option, since crius defines none), converted to crius's own
//! types, and run to their end under the call's deadline (`grpc-timeout`; 120 s when the caller
//! sets none, which the CRI asks it to). The work's own deadline comes a little before the
//! caller's, so the pod is resumed, or what a restore made removed, before the caller hears.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use tonic::{Request, Status};

use super::{convert, validate};
use crate::cri::v1 as cri;
use crate::pod::{PodRestore, PodService};

/// The bound of a call that sets no deadline (kubelet's default runtime request timeout).
const DEFAULT_DEADLINE: Duration = Duration::from_secs(120);

/// When the work must end for a call whose client waits `t`: a quarter of `t` earlier (at least
/// 250 ms, at most 5 s, never more than half), kept for undoing it. Undoing a dump (criu
/// killed and waited for, its pages removed, the pod thawed) took over 200 ms on a busy VM.
fn work_deadline(t: Duration) -> Duration {
    let reserve = (t / 4)
        .clamp(Duration::from_millis(250), Duration::from_secs(5))
        .min(t / 2);
    t - reserve
}

/// The work's deadline for a call with `metadata`.
fn deadline_of(metadata: &tonic::metadata::MetadataMap) -> tokio::time::Instant {
    let t = metadata
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(super::deadline::parse_timeout)
        .unwrap_or(DEFAULT_DEADLINE);
    tokio::time::Instant::now() + work_deadline(t)
}

/// CheckpointPod's request, checked.
fn check_checkpoint(req: &cri::CheckpointPodRequest) -> Result<(), Status> {
    validate::options("options", &req.options)?;
    if req.pod_sandbox_id.is_empty() {
        return Err(super::status::missing("pod_sandbox_id"));
    }
    validate::node_path("output_path", &req.output_path)?;
    if req.container_ids.is_empty() {
        return Err(Status::invalid_argument(
            "container_ids: is required (the running containers to checkpoint)",
        ));
    }
    let mut seen = HashSet::new();
    for (i, id) in req.container_ids.iter().enumerate() {
        if id.is_empty() {
            return Err(super::status::missing(&format!("container_ids[{i}]")));
        }
        if id.len() > validate::NAME_MAX {
            return Err(Status::invalid_argument(format!(
                "container_ids[{i}]: {}",
                validate::quoted(id)
            )));
        }
        if !seen.insert(id.as_str()) {
            return Err(Status::invalid_argument(format!(
                "container_ids[{i}]: {} is named twice",
                validate::quoted(id)
            )));
        }
    }
    Ok(())
}

/// RestorePod's request, checked and converted.
fn restore_request(req: cri::RestorePodRequest) -> Result<PodRestore, Status> {
    validate::options("options", &req.options)?;
    validate::node_path("checkpoint_path", &req.checkpoint_path)?;
    validate::runtime_handler(&req.runtime_handler)?;
    let config = req.config.ok_or_else(|| super::status::missing("config"))?;
    let config = convert::pod_config(config, "config")?;
    if req.container_configs.is_empty() {
        return Err(Status::invalid_argument(
            "container_configs: is required (one per container of the checkpoint)",
        ));
    }
    let mut names = HashSet::new();
    let mut containers = Vec::with_capacity(req.container_configs.len());
    for (i, c) in req.container_configs.into_iter().enumerate() {
        let c = convert::container_config(c).map_err(|s| {
            Status::new(s.code(), format!("container_configs[{i}]: {}", s.message()))
        })?;
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        if name.is_empty() {
            return Err(super::status::missing(&format!(
                "container_configs[{i}].metadata.name"
            )));
        }
        if !names.insert(name.clone()) {
            return Err(Status::invalid_argument(format!(
                "container_configs[{i}].metadata.name: {} is named twice",
                validate::quoted(&name)
            )));
        }
        containers.push(c);
    }
    Ok(PodRestore {
        checkpoint: PathBuf::from(req.checkpoint_path),
        config,
        handler: req.runtime_handler,
        containers,
    })
}

pub(super) async fn checkpoint_pod(
    pods: &PodService,
    req: Request<cri::CheckpointPodRequest>,
) -> Result<cri::CheckpointPodResponse, Status> {
    let deadline = deadline_of(req.metadata());
    let req = req.into_inner();
    check_checkpoint(&req)?;
    let pods = pods.clone();
    // To its end: a dropped call must still thaw the pod and remove what it wrote.
    super::to_the_end(async move {
        let out = std::path::Path::new(&req.output_path);
        Ok(pods
            .checkpoint_pod(&req.pod_sandbox_id, &req.container_ids, out, deadline)
            .await?)
    })
    .await?;
    Ok(cri::CheckpointPodResponse {})
}

pub(super) async fn restore_pod(
    pods: &PodService,
    pause_image: Option<String>,
    req: Request<cri::RestorePodRequest>,
) -> Result<cri::RestorePodResponse, Status> {
    let deadline = deadline_of(req.metadata());
    let restore = restore_request(req.into_inner())?;
    let pods = pods.clone();
    // To its end: a dropped call must still remove what it made.
    let restored = super::to_the_end(async move {
        Ok(pods
            .restore_pod(restore, pause_image.as_deref(), deadline)
            .await?)
    })
    .await?;
    Ok(cri::RestorePodResponse {
        pod_sandbox_id: restored.pod_id,
        restored_containers: restored
            .containers
            .into_iter()
            .map(|(name, container_id)| cri::RestoredContainer { name, container_id })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A change to a request, and how its refusal starts.
    type Case<'a, T> = (Box<dyn Fn(&mut T)>, &'a str);

    fn checkpoint() -> cri::CheckpointPodRequest {
        cri::CheckpointPodRequest {
            pod_sandbox_id: "pod".into(),
            output_path: "/var/lib/ckpt".into(),
            container_ids: vec!["a".into(), "b".into()],
            options: Default::default(),
        }
    }

    fn container(name: &str) -> cri::ContainerConfig {
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: "busybox".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn restore() -> cri::RestorePodRequest {
        cri::RestorePodRequest {
            checkpoint_path: "/var/lib/ckpt".into(),
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "p".into(),
                    uid: "u".into(),
                    namespace: "n".into(),
                    attempt: 0,
                }),
                ..Default::default()
            }),
            runtime_handler: String::new(),
            options: Default::default(),
            container_configs: vec![container("a"), container("b")],
        }
    }

    /// The refusal's code and message.
    fn refused<T>(r: Result<T, Status>) -> String {
        match r {
            Ok(_) => panic!("accepted"),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::InvalidArgument, "{s:?}");
                s.message().to_string()
            }
        }
    }

    #[test]
    fn checkpoint_requests_meet_the_contract() {
        check_checkpoint(&checkpoint()).unwrap();
        let cases: Vec<Case<'_, cri::CheckpointPodRequest>> = vec![
            (Box::new(|r| r.pod_sandbox_id.clear()), "pod_sandbox_id"),
            (Box::new(|r| r.output_path.clear()), "output_path"),
            (
                Box::new(|r| r.output_path = "ckpt".into()),
                "output_path: \"ckpt\" is not an absolute",
            ),
            (Box::new(|r| r.output_path = "/a\0b".into()), "output_path"),
            (Box::new(|r| r.container_ids.clear()), "container_ids"),
            (
                Box::new(|r| r.container_ids[1] = String::new()),
                "container_ids[1]",
            ),
            (
                Box::new(|r| r.container_ids[1] = "a".into()),
                "container_ids[1]: \"a\" is named twice",
            ),
            (
                Box::new(|r| {
                    r.options
                        .insert("criu.tcp-established".into(), "true".into());
                    r.options.insert("zz".into(), "1".into());
                }),
                "options[criu.tcp-established]",
            ),
            (
                Box::new(|r| {
                    r.options.insert("a\nb".into(), String::new());
                }),
                "options[\"a\\nb\"]",
            ),
        ];
        for (change, said) in cases {
            let mut r = checkpoint();
            change(&mut r);
            let m = refused(check_checkpoint(&r));
            assert!(m.starts_with(said), "{said}: {m}");
        }
    }

    #[test]
    fn restore_requests_meet_the_contract() {
        let ok = restore_request(restore()).unwrap();
        assert_eq!(ok.containers.len(), 2);
        let cases: Vec<Case<'_, cri::RestorePodRequest>> = vec![
            (Box::new(|r| r.checkpoint_path.clear()), "checkpoint_path"),
            (
                Box::new(|r| r.checkpoint_path = "x/y".into()),
                "checkpoint_path",
            ),
            (Box::new(|r| r.config = None), "config"),
            (
                Box::new(|r| r.container_configs.clear()),
                "container_configs",
            ),
            (
                Box::new(|r| r.container_configs[1].metadata = None),
                "container_configs[1].metadata.name",
            ),
            (
                Box::new(|r| r.container_configs[1] = container("a")),
                "container_configs[1].metadata.name: \"a\" is named twice",
            ),
            (
                Box::new(|r| r.container_configs[0].log_path = ".".into()),
                "container_configs[0]: config.log_path",
            ),
            (
                Box::new(|r| r.runtime_handler = "h".repeat(300)),
                "runtime_handler",
            ),
            (
                Box::new(|r| {
                    r.options.insert("restore.keep-ip".into(), "1".into());
                }),
                "options[restore.keep-ip]",
            ),
        ];
        for (change, said) in cases {
            let mut r = restore();
            change(&mut r);
            let m = refused(restore_request(r));
            assert!(m.starts_with(said), "{said}: {m}");
        }
    }

    #[test]
    fn the_work_ends_before_its_caller_stops_waiting() {
        assert_eq!(
            work_deadline(Duration::from_secs(60)),
            Duration::from_secs(55)
        );
        assert_eq!(
            work_deadline(Duration::from_secs(5)),
            Duration::from_millis(3750)
        );
        assert_eq!(
            work_deadline(Duration::from_millis(200)),
            Duration::from_millis(100)
        );
        assert_eq!(
            work_deadline(Duration::from_millis(40)),
            Duration::from_millis(20)
        );
        let mut m = tonic::metadata::MetadataMap::new();
        let before = tokio::time::Instant::now();
        let none = deadline_of(&m);
        assert!(none >= before + Duration::from_secs(100));
        m.insert("grpc-timeout", "3S".parse().unwrap());
        let three = deadline_of(&m);
        assert!(three <= tokio::time::Instant::now() + Duration::from_millis(2700));
    }
}
