//! The client side of streaming, for `crius exec -it`, `crius attach` and `crius port-forward`:
//! the CRI Exec, Attach or PortForward call hands back a URL, which is upgraded to SPDY/3.1
//! (the protocol every CRI runtime's streaming server speaks, kubelet's included) and driven as
//! kubectl does: remote command `v4.channel.k8s.io` (stdin, stdout, stderr, the error stream
//! with the exit status, terminal sizes) or `portforward.k8s.io` (a data and an error stream per
//! forwarded connection). Frames come from `stream::spdy`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{Doing, Error, Result, refuse};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::stream::spdy::{Codec, Frame, Headers};

/// A SPDY connection after the upgrade: frames out through one writer task, incoming data
/// routed by stream to whoever opened it (the channel closes at the stream's end).
struct Conn {
    out: mpsc::Sender<Frame>,
    routes: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Vec<u8>>>>>,
    next: u32,
}

trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// Where the streaming server is, and the TCP (and for https, TLS) connection to it.
async fn dial(url: &str) -> Result<(String, String, Box<dyn Io>)> {
    let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        _ => refuse!("streaming URL {url}: neither http:// nor https://"),
    };
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let tcp = tokio::net::TcpStream::connect(host)
        .await
        .doing(|| format!("connecting to the streaming server at {host}"))?;
    let _ = tcp.set_nodelay(true);
    if !tls {
        return Ok((host.to_string(), path.to_string(), Box::new(tcp)));
    }
    // The URL came over the CRI socket (root only) and its token is single-use, so, as crictl,
    // the server's certificate is verified only against CRIUS_STREAM_CA when that is set.
    let config = match std::env::var_os("CRIUS_STREAM_CA") {
        Some(ca) => crate::tls::client_trusting(std::path::Path::new(&ca)),
        None => crate::tls::unverified_client(),
    }
    .map_err(|e| Error::Refused(format!("TLS for the streaming server: {e}")))?;
    let name = host
        .rsplit_once(':')
        .map_or(host, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let name = rustls::pki_types::ServerName::try_from(name.to_string())
        .map_err(|e| Error::Refused(format!("streaming server name {name:?}: {e}")))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .doing(|| format!("TLS with the streaming server at {host}"))?;
    Ok((host.to_string(), path.to_string(), Box::new(stream)))
}

/// Upgrades `url` with `protocol` and starts serving the connection.
async fn connect(url: &str, protocol: &str) -> Result<Conn> {
    let (host, path, mut tcp) = dial(url).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
    );
    let talking = || format!("talking to the streaming server at {host}");
    tcp.write_all(request.as_bytes()).await.doing(talking)?;
    // The response head; what follows it is already SPDY.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p + 4;
        }
        if buf.len() > 64 << 10 {
            refuse!("the streaming server's answer has no end of headers");
        }
        let n = tcp.read(&mut chunk).await.doing(talking)?;
        if n == 0 {
            refuse!("the streaming server closed the connection");
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "101" {
        let body = String::from_utf8_lossy(&buf[head_end..]);
        refuse!(
            "the streaming server refused the stream: {} {}",
            head.lines().next().unwrap_or(""),
            body.trim()
        );
    }
    buf.drain(..head_end);
    let (mut rd, mut wr) = tokio::io::split(tcp);
    let (out, mut out_rx) = mpsc::channel::<Frame>(64);
    tokio::spawn(async move {
        let mut codec = Codec::new();
        let mut bytes = Vec::new();
        while let Some(f) = out_rx.recv().await {
            bytes.clear();
            if codec.encode(&f, &mut bytes).is_err() || wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // Unbounded per stream: one slow local reader must not stall every other stream (and the
    // PING answers) behind it.
    let routes: Arc<Mutex<HashMap<u32, mpsc::UnboundedSender<Vec<u8>>>>> = Arc::default();
    let (reader_routes, pong) = (routes.clone(), out.clone());
    tokio::spawn(async move {
        let mut codec = Codec::new();
        let mut chunk = vec![0u8; 64 << 10];
        'conn: loop {
            loop {
                let frame = match codec.decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(_) => break 'conn,
                };
                let (stream, data, end) = match frame {
                    Frame::Data { stream, data, fin } => (stream, data, fin),
                    Frame::RstStream { stream, .. } => (stream, Vec::new(), true),
                    Frame::Ping(id) => {
                        let _ = pong.send(Frame::Ping(id)).await;
                        continue;
                    }
                    Frame::GoAway { .. } => break 'conn,
                    _ => continue,
                };
                let route = lock(&reader_routes).get(&stream).cloned();
                if let Some(tx) = route
                    && !data.is_empty()
                {
                    let _ = tx.send(data);
                }
                if end {
                    lock(&reader_routes).remove(&stream);
                }
            }
            match rd.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        // Every stream ends with the connection.
        lock(&reader_routes).clear();
    });
    Ok(Conn {
        out,
        routes,
        next: 1,
    })
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conn {
    /// Opens a stream with `headers`; its incoming data arrives on the receiver.
    async fn open(
        &mut self,
        headers: &[(&str, String)],
    ) -> Result<(u32, mpsc::UnboundedReceiver<Vec<u8>>)> {
        let id = self.next;
        self.next += 2;
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.routes).insert(id, tx);
        let headers: Headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.clone()]))
            .collect();
        self.out
            .send(Frame::SynStream {
                stream: id,
                associated: 0,
                priority: 0,
                fin: false,
                headers,
            })
            .await
            .map_err(|_| Error::Refused("the streaming connection closed".into()))?;
        Ok((id, rx))
    }
}

/// Sends what `from` yields as DATA on `stream`, then its end.
async fn send_all(mut from: impl AsyncRead + Unpin, stream: u32, out: mpsc::Sender<Frame>) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let data = buf[..n].to_vec();
                let f = Frame::Data {
                    stream,
                    fin: false,
                    data,
                };
                if out.send(f).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = out
        .send(Frame::Data {
            stream,
            fin: true,
            data: Vec::new(),
        })
        .await;
}

/// Writes what a stream brings to `to`, until it ends.
async fn receive_all(mut from: mpsc::UnboundedReceiver<Vec<u8>>, mut to: impl AsyncWrite + Unpin) {
    while let Some(d) = from.recv().await {
        if to.write_all(&d).await.is_err() || to.flush().await.is_err() {
            break;
        }
    }
}

/// Exit code from the error stream's `metav1.Status` (v4): 0 for Success, the ExitCode cause
/// for a command that failed, an error for anything else. v4 always sends a status, so none
/// means the connection was lost.
fn exit_code(status: &[u8]) -> Result<i32> {
    if status.is_empty() {
        refuse!("the streaming connection ended without an exit status");
    }
    let v: serde_json::Value = serde_json::from_slice(status).map_err(|_| {
        Error::Refused(format!(
            "the error stream said: {}",
            String::from_utf8_lossy(status).trim()
        ))
    })?;
    if v["status"] == "Success" {
        return Ok(0);
    }
    if v["reason"] == "NonZeroExitCode"
        && let Some(code) = v["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str())
            .and_then(|m| m.parse().ok())
    {
        return Ok(code);
    }
    refuse!("{}", v["message"].as_str().unwrap_or("the stream failed"))
}

/// The local terminal set up for a remote one while it lives; restored on drop. With stdin the
/// terminal is raw, so every key reaches the remote side; without, only output processing is
/// off (the remote terminal already turned each `\n` into `\r\n`, and a second pass would
/// print `\r\r\n`), and ^C still stops the client.
struct RawTerminal(Option<(std::os::fd::OwnedFd, nix::sys::termios::Termios)>);

impl RawTerminal {
    fn enter(stdin: bool) -> RawTerminal {
        use nix::sys::termios::{OutputFlags, SetArg, cfmakeraw, tcgetattr, tcsetattr};
        use std::os::fd::AsFd;
        let fd = if stdin {
            std::io::stdin().as_fd().try_clone_to_owned()
        } else {
            std::io::stdout().as_fd().try_clone_to_owned()
        };
        let Ok(fd) = fd else {
            return RawTerminal(None);
        };
        // Not a terminal (a pipe, a file): nothing to set.
        let Ok(saved) = tcgetattr(&fd) else {
            return RawTerminal(None);
        };
        let mut set = saved.clone();
        if stdin {
            cfmakeraw(&mut set);
        } else {
            set.output_flags.remove(OutputFlags::OPOST);
        }
        if tcsetattr(&fd, SetArg::TCSANOW, &set).is_err() {
            return RawTerminal(None);
        }
        RawTerminal(Some((fd, saved)))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some((fd, t)) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(fd, nix::sys::termios::SetArg::TCSANOW, t);
        }
    }
}

/// The local terminal's size as the resize stream carries it.
fn terminal_size() -> Option<Vec<u8>> {
    let (w, h) = crate::sys::window_size(std::io::stdout()).ok()?;
    (w > 0 && h > 0).then(|| format!(r#"{{"Width":{w},"Height":{h}}}"#).into_bytes())
}

/// Runs a remote command session (exec or attach) on `url`: local stdio to and from the
/// streams, the terminal raw and its size followed with `tty`. Returns the exit code.
pub async fn remote_command(url: &str, stdin: bool, tty: bool) -> Result<i32> {
    let mut conn = connect(url, "v4.channel.k8s.io").await?;
    let (_, mut errors) = conn.open(&[("streamtype", "error".into())]).await?;
    let (_, stdout) = conn.open(&[("streamtype", "stdout".into())]).await?;
    let mut outputs = vec![tokio::spawn(receive_all(stdout, tokio::io::stdout()))];
    if !tty {
        let (_, stderr) = conn.open(&[("streamtype", "stderr".into())]).await?;
        outputs.push(tokio::spawn(receive_all(stderr, tokio::io::stderr())));
    }
    if stdin {
        let (id, _) = conn.open(&[("streamtype", "stdin".into())]).await?;
        tokio::spawn(send_all(tokio::io::stdin(), id, conn.out.clone()));
    }
    let _raw = tty.then(|| RawTerminal::enter(stdin));
    if tty {
        let (id, _) = conn.open(&[("streamtype", "resize".into())]).await?;
        let out = conn.out.clone();
        tokio::spawn(async move {
            let Ok(mut winch) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
            else {
                return;
            };
            loop {
                if let Some(size) = terminal_size() {
                    let f = Frame::Data {
                        stream: id,
                        fin: false,
                        data: size,
                    };
                    if out.send(f).await.is_err() {
                        return;
                    }
                }
                if winch.recv().await.is_none() {
                    return;
                }
            }
        });
    }
    let mut status = Vec::new();
    while let Some(d) = errors.recv().await {
        status.extend_from_slice(&d);
    }
    // Output sent before the status still lands, within reason.
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(2),
        futures_util::future::join_all(outputs),
    )
    .await;
    exit_code(&status)
}

/// Forwards connections to 127.0.0.1:LOCAL to the pod's REMOTE port, for each pair, until
/// `until` completes (Ctrl-C for the command).
pub async fn port_forward(
    url: &str,
    ports: &[(u16, u16)],
    until: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let conn = connect(url, "portforward.k8s.io").await?;
    let conn = Arc::new(tokio::sync::Mutex::new(conn));
    let mut listeners = Vec::new();
    for &(local, remote) in ports {
        let l = tokio::net::TcpListener::bind(("127.0.0.1", local))
            .await
            .doing(|| format!("listening on 127.0.0.1:{local}"))?;
        println!(
            "Forwarding from {} -> {remote}",
            l.local_addr().map(|a| a.to_string()).unwrap_or_default()
        );
        listeners.push((l, remote));
    }
    let request_ids = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (l, remote) in listeners {
        let (conn, ids) = (conn.clone(), request_ids.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Ok((sock, _)) = l.accept().await else {
                    // Out of descriptors, say: try again in a while, not at once.
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                };
                let id = ids
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                    .to_string();
                let opened = {
                    let mut c = conn.lock().await;
                    let common = [("port", remote.to_string()), ("requestid", id.clone())];
                    let error = c
                        .open(&[
                            ("streamtype", "error".into()),
                            common[0].clone(),
                            common[1].clone(),
                        ])
                        .await;
                    let data = c
                        .open(&[
                            ("streamtype", "data".into()),
                            common[0].clone(),
                            common[1].clone(),
                        ])
                        .await;
                    error.and_then(|e| data.map(|d| (e, d, c.out.clone())))
                };
                let Ok(((_, mut errors), (data_id, from_pod), out)) = opened else {
                    eprintln!("the streaming connection is gone");
                    return;
                };
                tokio::spawn(async move {
                    let (r, w) = sock.into_split();
                    let up = tokio::spawn(send_all(r, data_id, out));
                    let down = tokio::spawn(receive_all(from_pod, w));
                    let mut message = Vec::new();
                    while let Some(d) = errors.recv().await {
                        message.extend_from_slice(&d);
                    }
                    if !message.is_empty() {
                        eprintln!(
                            "port {remote}: {}",
                            String::from_utf8_lossy(&message).trim()
                        );
                    }
                    let _ = down.await;
                    up.abort();
                });
            }
        }));
    }
    until.await;
    for t in tasks {
        t.abort();
    }
    Ok(())
}

/// `crius exec -i/-t`: the command with live stdio through the runtime's streaming server.
pub async fn exec(
    socket: &std::path::Path,
    container: &str,
    cmd: &[String],
    stdin: bool,
    tty: bool,
) -> Result<i32> {
    let url = crate::cri::client::runtime(super::connect(socket)?)
        .exec(crate::cri::v1::ExecRequest {
            container_id: container.into(),
            cmd: cmd.to_vec(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        })
        .await
        .map_err(|s| super::rpc_error(&format!("exec in {container}"), socket, s))?
        .into_inner()
        .url;
    remote_command(&url, stdin, tty).await
}

/// `crius attach`: the container's own stdio.
pub async fn attach(
    socket: &std::path::Path,
    container: &str,
    stdin: bool,
    tty: bool,
) -> Result<i32> {
    let url = crate::cri::client::runtime(super::connect(socket)?)
        .attach(crate::cri::v1::AttachRequest {
            container_id: container.into(),
            stdin,
            tty,
            stdout: true,
            stderr: !tty,
        })
        .await
        .map_err(|s| super::rpc_error(&format!("attach to {container}"), socket, s))?
        .into_inner()
        .url;
    remote_command(&url, stdin, tty).await
}

/// `crius port-forward POD [LOCAL:]REMOTE...`.
pub async fn forward(socket: &std::path::Path, pod: &str, specs: &[String]) -> Result<()> {
    let mut ports = Vec::new();
    for s in specs {
        let parse = |p: &str| {
            p.parse::<u16>()
                .map_err(|_| Error::Refused(format!("port {s:?}: {p:?} is not a port number")))
        };
        ports.push(match s.split_once(':') {
            Some((l, r)) => (parse(l)?, parse(r)?),
            None => (parse(s)?, parse(s)?),
        });
    }
    let url = crate::cri::client::runtime(super::connect(socket)?)
        .port_forward(crate::cri::v1::PortForwardRequest {
            pod_sandbox_id: pod.into(),
            port: ports.iter().map(|(_, r)| i32::from(*r)).collect(),
        })
        .await
        .map_err(|s| super::rpc_error(&format!("port-forward to {pod}"), socket, s))?
        .into_inner()
        .url;
    port_forward(&url, &ports, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_from_statuses() {
        let status = |code| crate::stream::session::exit_status(code);
        assert_eq!(exit_code(&status(Ok(0))).ok(), Some(0));
        assert_eq!(exit_code(&status(Ok(7))).ok(), Some(7));
        assert!(exit_code(b"").is_err());
        let gone = crate::stream::BackendError::new(
            "container gone".into(),
            std::io::Error::other("container gone"),
        );
        let err = exit_code(&status(Err(gone)));
        assert!(err.is_err_and(|e| e.to_string().contains("container gone")));
    }
}
