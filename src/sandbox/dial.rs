//! Connections inside a pod's network namespace, for port forwarding: the pod's own localhost,
//! reached from a thread that enters the namespace the pause process holds (a thread of its
//! own: the namespace is per thread, and tokio's threads are shared), IPv4 then IPv6, as
//! kubelet's runtimes dial. No external program (socat, nsenter) is involved.

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use super::{Error, Path, SandboxService, io, io_err};

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

impl SandboxService {
    /// A connection to localhost:`port` in the pod's network namespace.
    pub async fn dial(&self, id: &str, port: u16) -> Result<tokio::net::TcpStream, Error> {
        let r = self.get(id).await?;
        if !r.ready {
            return Err(Error::NotReady { id: r.id });
        }
        let netns = (!r.host_network()).then(|| self.paths(&r.id).ns("net"));
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("crius-dial".into())
            .spawn(move || {
                let _ = tx.send(dial_in(netns.as_deref(), port));
            })
            .map_err(io_err(Path::new("dial thread")))?;
        let stream = rx
            .await
            .map_err(|_| io_err(Path::new("dial thread"))(io::Error::other("ended early")))?
            .map_err(|source| Error::Dial { port, source })?;
        stream
            .set_nonblocking(true)
            .and_then(|()| tokio::net::TcpStream::from_std(stream))
            .map_err(|source| Error::Dial { port, source })
    }
}

/// On this (dedicated) thread: enter `netns`, if any, and connect.
fn dial_in(netns: Option<&Path>, port: u16) -> io::Result<TcpStream> {
    if let Some(ns) = netns {
        let f = std::fs::File::open(ns)?;
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
    }
    let v4 = SocketAddr::from(([127, 0, 0, 1], port));
    match TcpStream::connect_timeout(&v4, DIAL_TIMEOUT) {
        Ok(s) => Ok(s),
        Err(e4) => TcpStream::connect_timeout(
            &SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], port)),
            DIAL_TIMEOUT,
        )
        .map_err(|_| e4),
    }
}
