//! The remote command protocol over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`,
//! `channel.k8s.io` and their `base64.` forms, or no protocol, as kubelet's own server takes
//! them): one channel byte before each message's payload (0 stdin, 1 stdout, 2 stderr, 3
//! error, 4 resize; v5's 255 closes a channel), the exit status on the error channel as with
//! SPDY v4 (before v4: nothing on success, else the message, as over SPDY v1 to v3). Port forwarding over
//! WebSocket is either `SPDY/3.1+portforward.k8s.io` tunnelled in binary messages (client-go's
//! tunnelling dialer, what kubectl and crictl use): the SPDY session runs on the messages'
//! bytes; or kubelet's channels (`channel_forward`).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::{SinkExt, StreamExt};
use http_body_util::Full;
use hyper::body::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Message, Role, WebSocketConfig};

use super::channel::{Ws, channel_payload, channel_writer};
use super::session::{Activity, Resizes, Stdin, exit_status, exit_text, opts_of};
use super::{Request, Session, Shared, reply};

const EXEC_PROTOCOLS: [&str; 5] = [
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];
const TUNNEL_PROTOCOL: &str = "SPDY/3.1+portforward.k8s.io";
/// Port forwarding: client-go's SPDY tunnel, or kubelet's channels (also with no protocol).
const PORT_FORWARD_PROTOCOLS: [&str; 3] = [
    TUNNEL_PROTOCOL,
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
];

/// Answers the WebSocket handshake and runs the protocol on the upgraded connection.
pub(super) fn upgrade(
    req: &mut hyper::Request<hyper::body::Incoming>,
    offered: Vec<String>,
    request: Request,
    shared: Arc<Shared>,
    permit: super::Slot,
) -> hyper::Response<Full<Bytes>> {
    let is_pf = matches!(request, Request::PortForward { .. });
    let supported: &[&str] = if is_pf {
        &PORT_FORWARD_PROTOCOLS
    } else {
        &EXEC_PROTOCOLS
    };
    // No protocol: kubelet's channels (port forwarding) or v1's binary channels (exec, attach).
    let protocol = if offered.is_empty() {
        Some("")
    } else {
        super::negotiate(&offered, supported)
    };
    let Some(protocol) = protocol else {
        return reply(
            403,
            &format!(
                "no websocket protocol in common: offered {offered:?}, supported {supported:?}"
            ),
        );
    };
    if let Request::PortForward { ports, .. } = &request
        && protocol != TUNNEL_PROTOCOL
    {
        let most = super::channel_forward::max_ports(protocol.contains("base64"));
        if ports.is_empty() || ports.len() > most {
            return reply(
                400,
                &format!(
                    "port forwarding over websocket channels ({protocol:?}) takes 1 to {most} ports \
                     from the PortForward call, not {}",
                    ports.len()
                ),
            );
        }
    }
    let Some(key) = req.headers().get("sec-websocket-key").cloned() else {
        return reply(400, "no Sec-WebSocket-Key");
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(req);
    let backend = shared.backend.clone();
    let idle = shared.idle_timeout;
    tokio::spawn(async move {
        let _permit = permit;
        let Ok(up) = on_upgrade.await else {
            return;
        };
        let ws = WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(up),
            Role::Server,
            Some(limits()),
        )
        .await;
        match request {
            Request::PortForward { .. } if protocol == TUNNEL_PROTOCOL => {
                let io = Tunnel::new(ws);
                super::session::run_spdy(io, super::PORT_FORWARD_PROTOCOL, request, backend, idle)
                    .await;
            }
            Request::PortForward { sandbox_id, ports } => {
                let base64 = protocol.contains("base64");
                super::channel_forward::serve(ws, base64, sandbox_id, ports, backend, idle).await;
            }
            request => remote_command(ws, protocol, request, backend, idle).await,
        }
    });
    let mut r = super::switching_protocols("websocket");
    let h = r.headers_mut();
    if let Ok(v) = hyper::header::HeaderValue::from_str(&accept) {
        h.insert("sec-websocket-accept", v);
    }
    if !protocol.is_empty() {
        h.insert(
            "sec-websocket-protocol",
            hyper::header::HeaderValue::from_static(protocol),
        );
    }
    r
}

/// What one client message may hold. Clients send keystrokes, stdin chunks and tunnelled SPDY
/// frames (client-go copies through 32 KiB buffers); anything far larger is refused, and the
/// connection closed, before it is buffered.
const MAX_MESSAGE: usize = 4 << 20;

fn limits() -> WebSocketConfig {
    WebSocketConfig::default()
        .max_message_size(Some(MAX_MESSAGE))
        .max_frame_size(Some(MAX_MESSAGE))
}

async fn remote_command(
    ws: Ws,
    protocol: &'static str,
    request: Request,
    backend: Arc<dyn super::Backend>,
    idle: std::time::Duration,
) {
    // Frames either way are activity (client-go's pings too), as over SPDY.
    let activity = Arc::new(Activity::new());
    let base64 = protocol.contains("base64");
    let v5 = protocol.starts_with("v5.");
    let v4 = v5 || protocol.starts_with("v4.");
    // v4 and later: a JSON status, success too; before: a message on failure only.
    let status = move |code: Result<i32, super::BackendError>| {
        if v4 {
            Some(exit_status(code))
        } else {
            exit_text(&code)
        }
    };
    let (sink, mut incoming) = ws.split();
    let (out_tx, writer) = channel_writer(sink, base64);
    let mut input = Stdin::new(opts_of(&request).tty);
    let Some(started) = request.start(&*backend).await else {
        return;
    };
    let Session {
        mut stdin,
        stdout,
        stderr,
        resize,
        mut done,
    } = match started {
        Ok(s) => s,
        Err(m) => {
            if let Some(s) = status(Err(m)) {
                let _ = out_tx.send((3, s)).await;
            }
            drop(out_tx);
            let _ = writer.await;
            return;
        }
    };
    // Aborted when the session ends (dropped): a child of the command may hold its output
    // open for ever (CVE-2026-53495), and a pump left running would keep the writer, the
    // connection and its stream slot.
    let mut pumps = tokio::task::JoinSet::new();
    for (from, ch) in [(stdout, 1u8), (stderr, 2u8)] {
        if let Some(mut r) = from {
            let (out, activity) = (out_tx.clone(), activity.clone());
            pumps.spawn(async move {
                let mut buf = vec![0u8; 32 << 10];
                while let Ok(n) = r.read(&mut buf).await {
                    if n == 0 || out.send((ch, buf[..n].to_vec())).await.is_err() {
                        break;
                    }
                    activity.touch();
                }
            });
        }
    }
    let mut resizes = Resizes::default();
    let code = loop {
        tokio::select! {
            code = &mut done => break Some(code),
            _ = tokio::time::sleep(idle.min(std::time::Duration::from_secs(5))) => {
                if activity.idle() >= idle {
                    tracing::info!("closing a stream idle for {idle:?}");
                    break None;
                }
            }
            msg = incoming.next() => {
                activity.touch();
                let payload = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => break None,
                    Some(Ok(m)) => match channel_payload(m, base64) {
                        Some(p) => p,
                        None => continue,
                    },
                };
                let Some((&ch, data)) = payload.split_first() else { continue };
                match ch {
                    0 => {
                        let data = input.pass(data);
                        if let Some(w) = stdin.as_mut()
                            && (w.write_all(data).await.is_err() || w.flush().await.is_err())
                        {
                            stdin = None;
                        }
                    }
                    4 => {
                        if let Some(r) = &resize {
                            for (w, h) in resizes.feed(data) {
                                let _ = r(w, h);
                            }
                        }
                    }
                    // v5: the client closed a channel; stdin's close is its EOF.
                    255 if v5 && data.first() == Some(&0) => {
                        if let Some(mut w) = stdin.take() {
                            let _ = w.shutdown().await;
                        }
                    }
                    _ => {}
                }
            }
        }
    };
    let Some(code) = code else {
        // Gone or idle: dropping the pumps stops reading the command's output, so the writer
        // closes the socket.
        return;
    };
    drop(stdin);
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        while pumps.join_next().await.is_some() {}
    })
    .await;
    pumps.abort_all();
    if let Some(s) = status(code) {
        let _ = out_tx.send((3, s)).await;
    }
    drop(out_tx);
    let _ = writer.await;
}

/// A WebSocket carrying a byte stream in its binary messages, as client-go tunnels SPDY.
struct Tunnel {
    ws: Ws,
    pending: Vec<u8>,
    at: usize,
}

impl Tunnel {
    fn new(ws: Ws) -> Tunnel {
        Tunnel {
            ws,
            pending: Vec::new(),
            at: 0,
        }
    }
}

impl AsyncRead for Tunnel {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            if self.at < self.pending.len() {
                let n = (self.pending.len() - self.at).min(buf.remaining());
                let at = self.at;
                buf.put_slice(&self.pending[at..at + n]);
                self.at += n;
                return Poll::Ready(Ok(()));
            }
            match self.ws.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Ok(Message::Close(_)))) => {
                    return Poll::Ready(Ok(()));
                }
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(std::io::Error::other(e)));
                }
                Poll::Ready(Some(Ok(Message::Binary(b)))) => {
                    self.pending = b.to_vec();
                    self.at = 0;
                }
                Poll::Ready(Some(Ok(_))) => {}
            }
        }
    }
}

impl AsyncWrite for Tunnel {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.ws.poll_ready_unpin(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => Poll::Ready(Err(std::io::Error::other(e))),
            Poll::Ready(Ok(())) => {
                let msg = Message::binary(data.to_vec());
                match self.ws.start_send_unpin(msg) {
                    Ok(()) => Poll::Ready(Ok(data.len())),
                    Err(e) => Poll::Ready(Err(std::io::Error::other(e))),
                }
            }
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.ws.poll_flush_unpin(cx).map_err(std::io::Error::other)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.ws.poll_close_unpin(cx).map_err(std::io::Error::other)
    }
}
