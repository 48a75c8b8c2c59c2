//! Connecting to a CRI runtime over its unix socket (crius, containerd or CRI-O alike).

use std::path::{Path, PathBuf};

use crate::cri::v1::image_service_client::ImageServiceClient;
use crate::cri::v1::runtime_service_client::RuntimeServiceClient;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::MAX_MESSAGE_SIZE;
use super::proto::pulls_client::PullsClient;

/// The ImageSpec naming `image`, as every client call that takes one wants it.
pub fn image_spec(image: &str) -> crate::cri::v1::ImageSpec {
    crate::cri::v1::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    }
}

/// `unix:///run/x.sock` or a plain path.
pub fn socket_path(endpoint: &str) -> PathBuf {
    PathBuf::from(endpoint.strip_prefix("unix://").unwrap_or(endpoint))
}

/// Opens a channel to the runtime listening on `socket`. The connection is made lazily on first
/// use and re-made if the runtime restarts.
pub fn channel(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is required by tonic but unused: the connector dials the socket.
    Ok(Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        })))
}

pub fn runtime(ch: Channel) -> RuntimeServiceClient<Channel> {
    RuntimeServiceClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

pub fn images(ch: Channel) -> ImageServiceClient<Channel> {
    ImageServiceClient::new(ch)
        .max_decoding_message_size(MAX_MESSAGE_SIZE)
        .max_encoding_message_size(MAX_MESSAGE_SIZE)
}

pub fn pulls(ch: Channel) -> PullsClient<Channel> {
    PullsClient::new(ch)
}
