//! Probe and lifecycle-hook actions, run the way kubelet runs them (see the field notes): exec
//! through CRI ExecSync; HTTP GET, TCP connect and gRPC health checks to the pod's address. Those
//! three connect from inside the pod's network namespace (the socket is made in a thread that
//! entered it), so pods without a CNI network are reached on their own loopback; the connection
//! itself then runs on the agent's runtime as any other.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cri::v1 as cri;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::HTTPGetAction;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};
use tonic::transport::Channel;

/// A probe's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Success(String),
    Failure(String),
    /// The probe could not be run; it changes nothing.
    Unknown(String),
}

impl Outcome {
    pub fn is_success(&self) -> bool {
        matches!(self, Outcome::Success(_))
    }

    pub fn message(&self) -> &str {
        match self {
            Outcome::Success(m) | Outcome::Failure(m) | Outcome::Unknown(m) => m,
        }
    }
}

/// Where network probes of a pod go: its network namespace (none for host network) and IP.
#[derive(Debug, Clone, Default)]
pub struct Target {
    pub netns: Option<PathBuf>,
    pub pod_ip: String,
    /// Every IP of the pod, `pod_ip` first.
    pub pod_ips: Vec<String>,
}

/// Output kept from a probe or hook (kubelet caps it at 10 KiB).
const MAX_OUTPUT: usize = 10 << 10;

/// The version kubelet sends as `kube-probe/<major>.<minor>`.
const PROBE_AGENT: &str = "kube-probe/1.34";

fn cap(bytes: &[u8]) -> String {
    let b = &bytes[..bytes.len().min(MAX_OUTPUT)];
    String::from_utf8_lossy(b).trim().to_string()
}

/// Runs a command in a container; exit 0 is success.
pub async fn exec(
    rt: &mut crate::cri::v1::runtime_service_client::RuntimeServiceClient<Channel>,
    container: &str,
    cmd: &[String],
    timeout: Duration,
) -> Outcome {
    let req = cri::ExecSyncRequest {
        container_id: container.to_string(),
        cmd: cmd.to_vec(),
        timeout: timeout.as_secs().max(1) as i64,
    };
    // The runtime enforces the timeout; this one only guards against a runtime that hangs.
    match tokio::time::timeout(timeout + Duration::from_secs(5), rt.exec_sync(req)).await {
        Err(_) => Outcome::Failure(format!("command {cmd:?} timed out")),
        Ok(Err(s))
            if s.code() == tonic::Code::DeadlineExceeded || s.message().contains("timed out") =>
        {
            Outcome::Failure(format!(
                "command {cmd:?} timed out after {}s",
                timeout.as_secs()
            ))
        }
        Ok(Err(s)) => Outcome::Failure(format!("exec {cmd:?}: {}", s.message())),
        Ok(Ok(r)) => {
            let r = r.into_inner();
            let mut out = r.stdout;
            out.extend_from_slice(&r.stderr);
            if r.exit_code == 0 {
                Outcome::Success(cap(&out))
            } else {
                Outcome::Failure(format!(
                    "command {cmd:?} exited with {}: {}",
                    r.exit_code,
                    cap(&out)
                ))
            }
        }
    }
}

type SocketRequest = (
    PathBuf,
    bool,
    tokio::sync::oneshot::Sender<std::io::Result<OwnedFd>>,
);

/// The thread that makes sockets inside network namespaces. One long-lived thread does it for
/// every probe: it enters the namespace, makes the socket (which stays in that namespace for its
/// life) and goes back to its own, so a probe costs two setns calls rather than a thread, and
/// no namespace is kept alive by it.
fn netns_sockets() -> &'static std::sync::mpsc::Sender<SocketRequest> {
    static SENDER: std::sync::OnceLock<std::sync::mpsc::Sender<SocketRequest>> =
        std::sync::OnceLock::new();
    SENDER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SocketRequest>();
        let spawned = std::thread::Builder::new()
            .name("netns-sockets".into())
            .spawn(move || {
                let home = std::fs::File::open("/proc/thread-self/ns/net");
                for (netns, v6, reply) in rx {
                    let made = match &home {
                        Ok(home) => socket_in(home, &netns, v6),
                        Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
                    };
                    let _ = reply.send(made);
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "starting the namespace socket thread");
        }
        tx
    })
}

fn socket_in(home: &std::fs::File, netns: &std::path::Path, v6: bool) -> std::io::Result<OwnedFd> {
    use nix::sched::{CloneFlags, setns};
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socket};
    let ns = std::fs::File::open(netns)?;
    setns(&ns, CloneFlags::CLONE_NEWNET)?;
    let family = if v6 {
        AddressFamily::Inet6
    } else {
        AddressFamily::Inet
    };
    let made = socket(
        family,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    );
    // Back home before anything else, whatever happened.
    setns(home, CloneFlags::CLONE_NEWNET)?;
    Ok(made?)
}

/// A TCP socket made inside a network namespace.
async fn socket_inside(netns: PathBuf, v6: bool) -> std::io::Result<OwnedFd> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    netns_sockets()
        .send((netns, v6, tx))
        .map_err(|_| std::io::Error::other("the namespace socket thread is gone"))?;
    rx.await
        .map_err(|_| std::io::Error::other("the namespace socket thread is gone"))?
}

async fn address(target: &Target, host: &str, port: u16) -> std::io::Result<SocketAddr> {
    let host = if host.is_empty() {
        if target.pod_ip.is_empty() {
            "127.0.0.1"
        } else {
            target.pod_ip.as_str()
        }
    } else {
        host
    };
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port))
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other(format!("{host}: no address")))
}

/// Connects to `host:port` as seen from the pod.
pub async fn connect(
    target: &Target,
    host: &str,
    port: u16,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let addr = address(target, host, port).await?;
    let socket = match &target.netns {
        Some(ns) => {
            let ns = ns.clone();
            let v6 = addr.is_ipv6();
            let fd = socket_inside(ns, v6).await?;
            TcpSocket::from_std_stream(std::net::TcpStream::from(fd))
        }
        None if addr.is_ipv6() => TcpSocket::new_v6()?,
        None => TcpSocket::new_v4()?,
    };
    tokio::time::timeout(timeout, socket.connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
}

/// TCP: connecting is success.
pub async fn tcp(target: &Target, host: &str, port: u16, timeout: Duration) -> Outcome {
    match connect(target, host, port, timeout).await {
        Ok(_) => Outcome::Success(String::new()),
        Err(e) => Outcome::Failure(format!("dial tcp {host}:{port}: {e}")),
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn tls(stream: TcpStream, host: &str) -> std::io::Result<Box<dyn Io>> {
    // Probes do not verify certificates, as kubelet's do not.
    let config = crate::tls::unverified_client().map_err(std::io::Error::other)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap_or_else(|_| {
        rustls::pki_types::ServerName::try_from("localhost").expect("valid name")
    });
    let s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await?;
    Ok(Box::new(s))
}

/// HTTP GET: 200 to 399 is success; redirects are followed to the same host (10 at most), a
/// redirect elsewhere counts as success.
pub async fn http(
    target: &Target,
    action: &HTTPGetAction,
    port: u16,
    timeout: Duration,
) -> Outcome {
    let host = action.host.clone().unwrap_or_default();
    let https = action.scheme.as_deref() == Some("HTTPS");
    let mut path = action.path.clone().unwrap_or_else(|| "/".into());
    if !path.starts_with('/') {
        path.insert(0, '/');
    }
    let shown_host = if host.is_empty() {
        if target.pod_ip.is_empty() {
            "127.0.0.1".to_string()
        } else {
            target.pod_ip.clone()
        }
    } else {
        host.clone()
    };
    let work = async {
        for _ in 0..=10 {
            let url = format!(
                "{}://{shown_host}:{port}{path}",
                if https { "https" } else { "http" }
            );
            let (status, location, body) =
                match get_once(target, &host, &shown_host, port, &path, https, action).await {
                    Ok(r) => r,
                    Err(e) => return Outcome::Failure(format!("Get {url:?}: {e}")),
                };
            if (300..400).contains(&status)
                && let Some(loc) = location
            {
                // Same host: follow; elsewhere: success with a note.
                if let Some(rest) = loc
                    .strip_prefix("http://")
                    .or_else(|| loc.strip_prefix("https://"))
                {
                    let (authority, p) = rest.split_once('/').unwrap_or((rest, ""));
                    if authority != format!("{shown_host}:{port}") && authority != shown_host {
                        return Outcome::Success(format!("redirected to another host: {loc}"));
                    }
                    path = format!("/{p}");
                } else {
                    path = if loc.starts_with('/') {
                        loc
                    } else {
                        format!("/{loc}")
                    };
                }
                continue;
            }
            return if (200..400).contains(&status) {
                Outcome::Success(cap(&body))
            } else {
                Outcome::Failure(format!("HTTP probe failed with statuscode: {status}"))
            };
        }
        Outcome::Failure("stopped after 10 redirects".into())
    };
    match tokio::time::timeout(timeout, work).await {
        Ok(o) => o,
        Err(_) => Outcome::Failure(format!(
            "Get \"http://{shown_host}:{port}{}\": context deadline exceeded",
            action.path.clone().unwrap_or_default()
        )),
    }
}

/// Why one HTTP GET of a probe got no answer.
#[derive(Debug, thiserror::Error)]
enum GetError {
    #[error("{0}")]
    Connect(#[from] std::io::Error),
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("{0}")]
    Request(#[from] hyper::http::Error),
}

async fn get_once(
    target: &Target,
    host: &str,
    shown_host: &str,
    port: u16,
    path: &str,
    https: bool,
    action: &HTTPGetAction,
) -> Result<(u16, Option<String>, Vec<u8>), GetError> {
    let stream = connect(target, host, port, Duration::from_secs(3600)).await?;
    let io: Box<dyn Io> = if https {
        tls(stream, shown_host).await?
    } else {
        Box::new(stream)
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = hyper::Request::get(path)
        .header(hyper::header::HOST, format!("{shown_host}:{port}"))
        .header(hyper::header::USER_AGENT, PROBE_AGENT)
        .header(hyper::header::ACCEPT, "*/*")
        .header(hyper::header::CONNECTION, "close");
    for h in action.http_headers.iter().flatten() {
        let Ok(name) = hyper::header::HeaderName::from_bytes(h.name.as_bytes()) else {
            continue;
        };
        if let Some(hs) = req.headers_mut() {
            hs.remove(&name);
        }
        req = req.header(name, h.value.as_str());
    }
    let req = req.body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get(hyper::header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut body = Vec::new();
    let mut b = resp.into_body();
    while body.len() < MAX_OUTPUT {
        match b.frame().await {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    body.extend_from_slice(d);
                }
            }
            _ => break,
        }
    }
    Ok((status, location, body))
}

/// gRPC health v1 `Check`: only SERVING succeeds.
pub async fn grpc(target: &Target, port: u16, service: &str, timeout: Duration) -> Outcome {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    let t = target.clone();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://probe:{port}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Outcome::Unknown(e.to_string()),
    };
    let work = async {
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let t = t.clone();
                async move {
                    Ok::<_, std::io::Error>(TokioIo::new(connect(&t, "", port, timeout).await?))
                }
            }))
            .await
            .map_err(|e| {
                format!(
                    "failed to connect service \":{port}\" within {}s: {e}",
                    timeout.as_secs()
                )
            })?;
        let r = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .map_err(|s| format!("health rpc failed: {:?}: {}", s.code(), s.message()))?;
        Ok::<i32, String>(r.into_inner().status)
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => Outcome::Failure(format!(
            "timeout: health rpc did not complete within {}s",
            timeout.as_secs()
        )),
        Ok(Err(e)) => Outcome::Failure(e),
        Ok(Ok(s)) if s == ServingStatus::Serving as i32 => Outcome::Success(String::new()),
        Ok(Ok(s)) => Outcome::Failure(format!(
            "service unhealthy (responded with {:?})",
            ServingStatus::try_from(s)
                .map(|x| x.as_str_name())
                .unwrap_or("UNKNOWN")
        )),
    }
}

/// The loopback of the pod when it has no address of its own.
pub fn loopback() -> IpAddr {
    IpAddr::V4(Ipv4Addr::LOCALHOST)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tcp_and_http_on_this_host() {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = l.accept().await else {
                    break;
                };
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let reply = if req.starts_with("GET /ok ") {
                        assert!(
                            req.to_lowercase().contains("user-agent: kube-probe/"),
                            "{req}"
                        );
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_string()
                    } else if req.starts_with("GET /moved ") {
                        "HTTP/1.1 302 Found\r\nlocation: /ok\r\ncontent-length: 0\r\n\r\n"
                            .to_string()
                    } else if req.starts_with("GET /away ") {
                        "HTTP/1.1 302 Found\r\nlocation: http://example.invalid/\r\ncontent-length: 0\r\n\r\n".to_string()
                    } else {
                        "HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n".to_string()
                    };
                    let _ = s.write_all(reply.as_bytes()).await;
                });
            }
        });
        let t = Target::default();
        let d = Duration::from_secs(2);
        assert!(tcp(&t, "", port, d).await.is_success());
        let get = |p: &str| HTTPGetAction {
            path: Some(p.into()),
            ..Default::default()
        };
        assert_eq!(
            http(&t, &get("/ok"), port, d).await,
            Outcome::Success("ok".into())
        );
        assert!(http(&t, &get("/moved"), port, d).await.is_success());
        assert!(
            http(&t, &get("/away"), port, d)
                .await
                .message()
                .contains("another host")
        );
        let o = http(&t, &get("/busy"), port, d).await;
        assert_eq!(
            o,
            Outcome::Failure("HTTP probe failed with statuscode: 503".into())
        );
        // Nothing listening.
        drop(t);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        assert!(!tcp(&Target::default(), "", closed, d).await.is_success());
        assert!(!grpc(&Target::default(), closed, "", d).await.is_success());
    }
}
