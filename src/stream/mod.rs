//! stream: the streaming server behind CRI Exec, Attach and PortForward, as kubelet's runtimes
//! embed it. The RPC hands out a URL with a single-use token that expires after a minute; the
//! client (kubelet proxying for the API server, kubectl, crictl) upgrades its HTTP/1.1 request
//! on that URL to SPDY/3.1 (`spdy`, `session`) or WebSocket (`websocket`) and speaks
//! Kubernetes' remote command protocol (`channel.k8s.io` to `v5.channel.k8s.io`) or port
//! forwarding (`portforward.k8s.io`). The work itself (a command in a container, a container's
//! own stdio, a connection inside a pod's network namespace) is the `Backend`'s, which the
//! `cri` glue provides. Streams idle longer than the configured timeout are closed and the
//! number of streams at once is capped; when the last stream ends, the heap's free memory goes
//! back to the kernel. Uses no other module of crius but `sys`.

mod channel;
mod channel_forward;
pub mod session;
pub mod spdy;
mod websocket;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::future::BoxFuture;
use http_body_util::Full;
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

/// How long a URL handed out by Exec, Attach or PortForward stays valid, unless configured.
pub const TOKEN_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Opts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// What a token was issued for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Exec {
        container_id: String,
        cmd: Vec<String>,
        opts: Opts,
    },
    Attach {
        container_id: String,
        opts: Opts,
    },
    PortForward {
        sandbox_id: String,
        /// The ports asked for: what WebSocket port forwarding serves (SPDY names its port
        /// per stream).
        ports: Vec<u16>,
    },
}

impl Request {
    /// Starts the command or attachment asked for; None for port forwarding, which has no
    /// session of its own.
    async fn start(self, backend: &dyn Backend) -> Option<Result<Session, BackendError>> {
        Some(match self {
            Request::Exec {
                container_id,
                cmd,
                opts,
            } => backend.exec(container_id, cmd, opts).await,
            Request::Attach { container_id, opts } => backend.attach(container_id, opts).await,
            Request::PortForward { .. } => return None,
        })
    }
}

/// Sets a terminal's size: width, height.
pub type Resize = Box<dyn Fn(u16, u16) -> std::io::Result<()> + Send + Sync>;

/// A running command (or an attachment to a container's stdio), as the backend hands it over;
/// the container service makes one ending in its own error (`E`), which the backend words.
pub struct Session<E = BackendError> {
    pub stdin: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    pub stdout: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stderr: Option<Box<dyn AsyncRead + Send + Unpin>>,
    /// Sets the terminal's size (width, height); with a terminal only.
    pub resize: Option<Resize>,
    /// The exit code once the command (or container) ends; an error when it could not be told.
    pub done: Pin<Box<dyn Future<Output = Result<i32, E>> + Send>>,
}

/// Why the backend could not start a session or tell how it ended: what the client is told
/// (the backend's error with its causes, worded by the backend) and the error itself, kept as
/// the source.
#[derive(Debug, thiserror::Error)]
#[error("{told}")]
pub struct BackendError {
    told: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl BackendError {
    pub fn new(told: String, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        BackendError {
            told,
            source: Box::new(source),
        }
    }
}

/// The work behind the streams.
pub trait Backend: Send + Sync + 'static {
    fn exec(
        &self,
        container_id: String,
        cmd: Vec<String>,
        opts: Opts,
    ) -> BoxFuture<'static, Result<Session, BackendError>>;
    fn attach(
        &self,
        container_id: String,
        opts: Opts,
    ) -> BoxFuture<'static, Result<Session, BackendError>>;
    /// A connection to localhost:port inside the pod's network namespace.
    fn dial(
        &self,
        sandbox_id: String,
        port: u16,
    ) -> BoxFuture<'static, Result<tokio::net::TcpStream, BackendError>>;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("streaming server address {address}: {source}")]
    Bind {
        address: String,
        source: std::io::Error,
    },
    #[error("streaming tokens: {0}")]
    Random(std::io::Error),
    #[error(
        "{MAX_TOKENS} streaming URLs are waiting to be used; try again when they are used or expire"
    )]
    TooManyWaiting,
}

/// How many issued URLs may wait to be used (kubelet's streaming server allows as many): each
/// holds its request (an exec's command, a port-forward's ports) until used or expired.
pub const MAX_TOKENS: usize = 1000;

/// The server's settings (`[stream]`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub address: String,
    pub port: u16,
    pub idle_timeout: Duration,
    pub max_streams: usize,
    /// How long a URL stays valid.
    pub token_ttl: Duration,
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

struct Shared {
    tokens: Mutex<HashMap<String, (Request, Instant)>>,
    backend: Arc<dyn Backend>,
    idle_timeout: Duration,
    token_ttl: Duration,
    slots: Arc<tokio::sync::Semaphore>,
    max_streams: usize,
    /// Set while a heap trim is queued or running: streams ending together queue one.
    trimming: AtomicBool,
}

/// One stream's place among `max_streams`. Dropping the last one hands the heap's free memory
/// back to the kernel: a burst of sessions (each SPDY one holds two zlib states) otherwise
/// leaves the daemon at its peak for good, since glibc keeps what it freed.
pub(crate) struct Slot {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Released first, so of two streams ending at once the later sees the server quiet.
        drop(self.permit.take());
        let shared = &self.shared;
        if shared.slots.available_permits() == shared.max_streams
            && let Ok(rt) = tokio::runtime::Handle::try_current()
            && !shared.trimming.swap(true, Ordering::AcqRel)
        {
            let shared = shared.clone();
            rt.spawn_blocking(move || {
                crate::sys::trim_heap();
                shared.trimming.store(false, Ordering::Release);
            });
        }
    }
}

/// The running server.
#[derive(Clone)]
pub struct StreamServer {
    base: String,
    shared: Arc<Shared>,
}

impl StreamServer {
    /// Binds per `settings` and serves with `backend` until the process ends.
    pub async fn start(
        settings: &Settings,
        backend: Arc<dyn Backend>,
    ) -> Result<StreamServer, Error> {
        let address = format!("{}:{}", settings.address, settings.port);
        let bind_err = |source| Error::Bind {
            address: address.clone(),
            source,
        };
        let addr: SocketAddr = address
            .parse()
            .map_err(|e| bind_err(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(bind_err)?;
        let local = listener.local_addr().map_err(bind_err)?;
        let shared = Arc::new(Shared {
            tokens: Mutex::new(HashMap::new()),
            backend,
            idle_timeout: settings.idle_timeout,
            token_ttl: settings.token_ttl,
            slots: Arc::new(tokio::sync::Semaphore::new(settings.max_streams.max(1))),
            max_streams: settings.max_streams.max(1),
            trimming: AtomicBool::new(false),
        });
        let host = match local {
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
            SocketAddr::V4(a) => a.to_string(),
        };
        let scheme = if settings.tls.is_some() {
            "https"
        } else {
            "http"
        };
        tracing::info!(address = %local, scheme, "streaming server listening");
        let tls = settings.tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(serve(listener, tls, shared.clone()));
        Ok(StreamServer {
            base: format!("{scheme}://{host}"),
            shared,
        })
    }

    /// A single-use URL for `req`.
    pub fn url_for(&self, req: Request) -> Result<String, Error> {
        let mut raw = [0u8; 18];
        getrandom::fill(&mut raw).map_err(|e| Error::Random(std::io::Error::other(e)))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let path = match &req {
            Request::Exec { .. } => "exec",
            Request::Attach { .. } => "attach",
            Request::PortForward { .. } => "portforward",
        };
        let mut tokens = self.shared.tokens.lock().unwrap_or_else(|p| p.into_inner());
        // Expired tokens are dropped whenever one is issued.
        let ttl = self.shared.token_ttl;
        tokens.retain(|_, (_, at)| at.elapsed() < ttl);
        if tokens.len() >= MAX_TOKENS {
            return Err(Error::TooManyWaiting);
        }
        tokens.insert(token.clone(), (req, Instant::now()));
        Ok(format!("{}/{path}/{token}", self.base))
    }
}

impl Shared {
    /// The request behind a token, once: a used, unknown or expired token is none.
    fn take(&self, kind: &str, token: &str) -> Option<Request> {
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let (req, at) = tokens.remove(token)?;
        let matches = matches!(
            (&req, kind),
            (Request::Exec { .. }, "exec")
                | (Request::Attach { .. }, "attach")
                | (Request::PortForward { .. }, "portforward")
        );
        (matches && at.elapsed() < self.token_ttl).then_some(req)
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "streaming server accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            match tls {
                None => serve_connection(stream, shared).await,
                Some(acceptor) => {
                    // A client that never finishes its handshake holds nothing for long.
                    let handshake =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
                    match handshake.await {
                        Ok(Ok(stream)) => serve_connection(stream, shared).await,
                        Ok(Err(e)) => tracing::debug!(error = %e, "streaming TLS handshake"),
                        Err(_) => tracing::debug!("streaming TLS handshake timed out"),
                    }
                }
            }
        });
    }
}

/// How long a TLS handshake, and a request's head, may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

async fn serve_connection<S>(stream: S, shared: Arc<Shared>)
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let shared = shared.clone();
        async move { Ok::<_, std::convert::Infallible>(route(shared, req).await) }
    });
    let io = hyper_util::rt::TokioIo::new(stream);
    // A client that connects and then says nothing holds no connection for long.
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT)
        .serve_connection(io, service)
        .with_upgrades()
        .await;
}

fn reply(status: u16, text: &str) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::from(format!("{text}\n"))));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::NOT_FOUND);
    r
}

/// The remote command protocols this server speaks over SPDY, best first.
pub const SPDY_EXEC_PROTOCOLS: [&str; 4] = [
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];
pub const PORT_FORWARD_PROTOCOL: &str = "portforward.k8s.io";

/// The first protocol the client offers (in its order) that the server speaks; with no offer,
/// the oldest, as kubelet does.
pub fn negotiate<'a>(offered: &[String], supported: &[&'a str]) -> Option<&'a str> {
    if offered.is_empty() {
        return supported.last().copied();
    }
    offered
        .iter()
        .flat_map(|o| o.split(','))
        .map(str::trim)
        .find_map(|o| supported.iter().find(|s| **s == o).copied())
}

async fn route(
    shared: Arc<Shared>,
    mut req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let (kind, token) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // The token is looked at only when the request is an upgrade: a stray GET does not burn it.
    let header = |name: &str| -> Vec<String> {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let upgrade = header("upgrade").join(",").to_ascii_lowercase();
    if upgrade.is_empty() {
        return reply(400, "this URL takes an upgrade to SPDY/3.1 or websocket");
    }
    let Some(request) = shared.take(kind, token) else {
        return reply(404, "unknown or expired streaming token");
    };
    let permit = match shared.slots.clone().try_acquire_owned() {
        Ok(p) => Slot {
            permit: Some(p),
            shared: shared.clone(),
        },
        Err(_) => return reply(429, "too many streams at once"),
    };
    let is_pf = matches!(request, Request::PortForward { .. });
    if upgrade.contains("websocket") {
        let offered = header("sec-websocket-protocol");
        return websocket::upgrade(&mut req, offered, request, shared.clone(), permit);
    }
    if !upgrade.contains("spdy/3.1") {
        return reply(400, "upgrade to SPDY/3.1 or websocket");
    }
    let offered = header("x-stream-protocol-version");
    let supported: &[&str] = if is_pf {
        &[PORT_FORWARD_PROTOCOL]
    } else {
        &SPDY_EXEC_PROTOCOLS
    };
    let Some(protocol) = negotiate(&offered, supported) else {
        return reply(
            403,
            &format!("no protocol in common: offered {offered:?}, supported {supported:?}"),
        );
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    let idle = shared.idle_timeout;
    let backend = shared.backend.clone();
    tokio::spawn(async move {
        let _permit = permit;
        match on_upgrade.await {
            Ok(up) => {
                let io = hyper_util::rt::TokioIo::new(up);
                session::run_spdy(io, protocol, request, backend, idle).await;
            }
            Err(e) => tracing::debug!(error = %e, "streaming upgrade failed"),
        }
    });
    let mut r = switching_protocols("SPDY/3.1");
    r.headers_mut().insert(
        "x-stream-protocol-version",
        hyper::header::HeaderValue::from_static(protocol),
    );
    r
}

/// A 101 answer upgrading the connection to `upgrade`; the caller adds its protocol's headers.
fn switching_protocols(upgrade: &'static str) -> hyper::Response<Full<Bytes>> {
    let mut r = hyper::Response::new(Full::new(Bytes::new()));
    *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
    let h = r.headers_mut();
    h.insert(
        "connection",
        hyper::header::HeaderValue::from_static("Upgrade"),
    );
    h.insert("upgrade", hyper::header::HeaderValue::from_static(upgrade));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_are_negotiated_in_the_clients_order() {
        let offer = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            negotiate(
                &offer(&["v4.channel.k8s.io", "v3.channel.k8s.io"]),
                &SPDY_EXEC_PROTOCOLS
            ),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(
            negotiate(
                &offer(&["v9.channel.k8s.io", "v2.channel.k8s.io"]),
                &SPDY_EXEC_PROTOCOLS
            ),
            Some("v2.channel.k8s.io")
        );
        assert_eq!(negotiate(&[], &SPDY_EXEC_PROTOCOLS), Some("channel.k8s.io"));
        assert_eq!(negotiate(&offer(&["nope"]), &SPDY_EXEC_PROTOCOLS), None);
    }
}
