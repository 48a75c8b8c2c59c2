//! The streaming server's backend: streamed exec and attach, and connections in a pod's
//! network namespace, through the pod orchestrator. Errors become the messages the server
//! puts on the error stream.

use futures_util::future::BoxFuture;

use crate::container::stream::StreamSession;
use crate::pod::PodService;
use crate::stream::{Backend, BackendError, Opts, Session};

pub struct StreamBackend {
    pub pods: PodService,
}

/// A backend error as the client reads it: the error with its causes.
fn told<E: std::error::Error + Send + Sync + 'static>(e: E) -> BackendError {
    BackendError::new(super::status::chain(&e), e)
}

/// A container's stream session as the streaming server serves it: its end worded for the
/// client.
fn session(s: StreamSession) -> Session {
    Session {
        stdin: s.stdin,
        stdout: s.stdout,
        stderr: s.stderr,
        resize: s.resize,
        done: Box::pin(async move { s.done.await.map_err(told) }),
    }
}

impl Backend for StreamBackend {
    fn exec(
        &self,
        container_id: String,
        cmd: Vec<String>,
        o: Opts,
    ) -> BoxFuture<'static, Result<Session, BackendError>> {
        let pods = self.pods.clone();
        Box::pin(async move {
            let s = pods
                .exec_stream(&container_id, cmd, o)
                .await
                .map_err(told)?;
            Ok(session(s))
        })
    }

    fn attach(
        &self,
        container_id: String,
        o: Opts,
    ) -> BoxFuture<'static, Result<Session, BackendError>> {
        let pods = self.pods.clone();
        Box::pin(async move {
            let s = pods.attach_stream(&container_id, o).await.map_err(told)?;
            Ok(session(s))
        })
    }

    fn dial(
        &self,
        sandbox_id: String,
        port: u16,
    ) -> BoxFuture<'static, Result<tokio::net::TcpStream, BackendError>> {
        let pods = self.pods.clone();
        Box::pin(async move { pods.dial(&sandbox_id, port).await.map_err(told) })
    }
}
