//! cri: the tonic glue. It serves CRI `runtime.v1` (RuntimeService, ImageService) and crius's own
//! `crius.v1.Pulls` on a unix socket, converts requests into crius's own types and answers back
//! into CRI's (`convert`: nothing below sees a generated CRI type) and holds every request to
//! crius's limits (`validate`: sizes, ranges, NULs, line breaks), turns requests into calls on
//! the `image`, `pod`, `sandbox` and `container` services (CheckpointPod and RestorePod, with
//! their contract's checks and deadline, in `pod_checkpoint`), maps their errors to statuses in
//! one place (`status`), bounds the socket's connections and their header blocks (`connections`),
//! and logs one line per RPC with its duration. It also holds the client side used by the CLI,
//! the front end and the tests. No runtime logic lives here.

mod authority;
pub mod client;
mod connections;
pub mod convert;
mod deadline;
mod images;
mod lists;
mod pod_checkpoint;
mod pulls;
mod runtime;
pub mod status;
pub mod streaming;
pub mod validate;

use std::future::Future;
use std::time::Instant;

use crate::cri::v1::image_service_server::ImageServiceServer;
use crate::cri::v1::runtime_service_server::RuntimeServiceServer;
use tokio::net::UnixListener;
use tonic::{Code, Response, Status};

use crate::image::ImageService;

/// CRI `runtime.v1`, generated from `k8s.io/cri-api`'s `api.proto` at the version
/// `hack/upstream.versions` pins, read from its Go module by `build.rs`.
pub mod v1 {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("runtime.v1");

    #[cfg(test)]
    mod tests {
        /// Every message the module's file defines was generated.
        #[test]
        fn every_message_generated() {
            let text = std::fs::read_to_string(env!("CRIUS_CRI_API_PROTO")).unwrap();
            let messages = text
                .lines()
                .filter(|l| l.trim_start().starts_with("message ") && l.trim_end().ends_with('{'))
                .count();
            let generated = include_str!(concat!(env!("OUT_DIR"), "/runtime.v1.rs"));
            // Each message is a struct (the services add their clients' and servers').
            let structs = generated.matches("pub struct ").count();
            assert!(
                structs >= messages,
                "{structs} structs for {messages} messages"
            );
        }
    }
}

/// Generated code for `proto/crius.proto`.
pub mod proto {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("crius.v1");
}

/// CRI messages can be large (ListContainers on a busy node); containerd allows 16 MiB.
pub const MAX_MESSAGE_SIZE: usize = 16 << 20;

/// What the server answers with.
pub struct Services {
    pub images: ImageService,
    /// Every runtime call goes through the pod orchestrator.
    pub pods: crate::pod::PodService,
    /// The operator's pause image; none runs pods on the built-in pause.
    pub pause_image: Option<String>,
    /// The daemon's configuration, shown by verbose Status (`crius info`, `crictl info`).
    pub config: serde_json::Value,
    /// The streaming server Exec and PortForward hand out URLs of.
    pub streams: crate::stream::StreamServer,
}

/// Serves every service on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: UnixListener,
    services: Services,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let runtime = RuntimeServiceServer::new(runtime::Runtime::new(
        services.pods,
        services.pause_image.clone(),
        services.config,
        services.streams,
    ))
    .max_decoding_message_size(MAX_MESSAGE_SIZE)
    .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let images = ImageServiceServer::new(images::Images::new(
        services.images.clone(),
        services.pause_image,
    ))
    .max_decoding_message_size(MAX_MESSAGE_SIZE)
    .max_encoding_message_size(MAX_MESSAGE_SIZE);
    let pulls = proto::pulls_server::PullsServer::new(pulls::Pulls::new(services.images));
    tonic::transport::Server::builder()
        // A header block is buffered whole before the call starts: kubelet's are well under a
        // KiB, and the default (16 MiB) let each half-sent block hold a MiB.
        .http2_max_header_list_size(connections::HEADER_LIST_MAX)
        .layer(deadline::DeadlineLayer)
        .add_service(runtime)
        .add_service(images)
        .add_service(pulls)
        .serve_with_incoming_shutdown(connections::incoming(listener), shutdown)
        .await
}

/// Runs a change of several steps (a teardown, a creation) to its end even when its caller goes
/// away (a client deadline, a closed connection): the call waits for it, and a dropped call no
/// longer drops the work half-way, such as between a pod's network and its record.
pub(crate) async fn to_the_end<T: Send + 'static>(
    work: impl Future<Output = Result<T, Status>> + Send + 'static,
) -> Result<T, Status> {
    match tokio::spawn(work).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(Status::unavailable(format!("the daemon is stopping: {e}"))),
    }
}

/// Runs one RPC: times it, logs it, and logs failures with their status.
pub(crate) async fn rpc<T>(
    name: &'static str,
    fut: impl Future<Output = Result<T, Status>>,
) -> Result<Response<T>, Status> {
    let start = Instant::now();
    let result = fut.await;
    let elapsed = start.elapsed();
    let code = match &result {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    };
    crate::metrics::global().rpc(name, &format!("{code:?}"), elapsed.as_secs_f64());
    match &result {
        Ok(_) => tracing::debug!(rpc = name, ?elapsed, "rpc ok"),
        Err(s)
            if matches!(
                s.code(),
                Code::NotFound | Code::InvalidArgument | Code::Unimplemented
            ) =>
        {
            tracing::info!(rpc = name, ?elapsed, code = ?s.code(), error = s.message(), "rpc failed")
        }
        Err(s) => {
            tracing::warn!(rpc = name, ?elapsed, code = ?s.code(), error = s.message(), "rpc failed")
        }
    }
    result.map(Response::new)
}
