//! Port forwarding over WebSocket channels, as kubelet's streaming server serves it to clients
//! that do not tunnel SPDY (protocol `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, or none):
//! the ports are the PortForward call's; port i has data channel 2i and error channel 2i+1, and
//! each channel's first message is the port as two little-endian bytes. Each port gets one
//! connection, dialled when the WebSocket opens, for the WebSocket's life; a failed dial is
//! reported as text on the port's error channel. The WebSocket closes once every port's
//! connection has ended, or when the client goes or stays idle too long.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::Message;

use super::Backend;
use super::session::Activity;
use super::websocket::{Ws, channel_payload, channel_writer};

/// Serves `ports` of the pod `sandbox_id` on `ws` until it ends.
pub(super) async fn serve(
    ws: Ws,
    base64: bool,
    sandbox_id: String,
    ports: Vec<u16>,
    backend: Arc<dyn Backend>,
    idle: Duration,
) {
    let activity = Arc::new(Activity::new());
    let (sink, mut incoming) = ws.split();
    let (out_tx, writer) = channel_writer(sink, base64);
    let mut inbound = Vec::new();
    let mut forwards = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        // Channels are one byte: 127 ports at most (the error channel of the last is 255).
        let Ok(data_ch) = u8::try_from(2 * i) else {
            break;
        };
        let error_ch = data_ch + 1;
        for ch in [data_ch, error_ch] {
            if out_tx
                .send((ch, port.to_le_bytes().to_vec()))
                .await
                .is_err()
            {
                return;
            }
        }
        let (to_pod, from_client) = mpsc::channel::<Vec<u8>>(16);
        inbound.push(Some(to_pod));
        forwards.spawn(forward(
            backend.clone(),
            sandbox_id.clone(),
            port,
            (data_ch, error_ch),
            from_client,
            out_tx.clone(),
            activity.clone(),
        ));
    }
    // The writer ends (and closes the WebSocket) once the forwards drop their senders.
    drop(out_tx);
    loop {
        tokio::select! {
            done = forwards.join_next() => {
                if done.is_none() {
                    break;
                }
            }
            _ = tokio::time::sleep(idle.min(Duration::from_secs(5))) => {
                if activity.idle() >= idle {
                    tracing::info!("closing a port forward idle for {idle:?}");
                    forwards.abort_all();
                    break;
                }
            }
            msg = incoming.next() => {
                activity.touch();
                let payload = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => {
                        forwards.abort_all();
                        break;
                    }
                    Some(Ok(m)) => match channel_payload(m, base64) {
                        Some(p) => p,
                        None => continue,
                    },
                };
                let Some((&ch, data)) = payload.split_first() else { continue };
                // Data for a port's connection; error channels and unknown ones carry nothing
                // from the client.
                let slot = inbound.get_mut(usize::from(ch / 2)).filter(|_| ch % 2 == 0);
                if let Some(slot) = slot
                    && let Some(tx) = slot.as_ref()
                    && tx.send(data.to_vec()).await.is_err()
                {
                    *slot = None;
                }
            }
        }
    }
    drop(inbound);
    while forwards.join_next().await.is_some() {}
    let _ = writer.await;
}

/// One port's connection: dialled inside the pod, then bytes both ways until the pod's side
/// ends (what the client sends after that is dropped).
async fn forward(
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    port: u16,
    (data_ch, error_ch): (u8, u8),
    mut from_client: mpsc::Receiver<Vec<u8>>,
    out: mpsc::Sender<(u8, Vec<u8>)>,
    activity: Arc<Activity>,
) {
    let tcp = match backend.dial(sandbox_id.clone(), port).await {
        Ok(t) => t,
        Err(e) => {
            let text = format!("error forwarding port {port} to pod {sandbox_id}: {e}");
            let _ = out.send((error_ch, text.into_bytes())).await;
            return;
        }
    };
    let (mut rd, mut wr) = tcp.into_split();
    let to_pod = tokio::spawn(async move {
        while let Some(data) = from_client.recv().await {
            if wr.write_all(&data).await.is_err() {
                return;
            }
        }
        // The client is done sending: the pod's side sees EOF.
        let _ = wr.shutdown().await;
    });
    let mut buf = vec![0u8; 32 << 10];
    loop {
        match rd.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => {
                if out.send((data_ch, buf[..n].to_vec())).await.is_err() {
                    break;
                }
                activity.touch();
            }
            Err(e) => {
                let text = format!("error forwarding port {port} to pod {sandbox_id}: {e}");
                let _ = out.send((error_ch, text.into_bytes())).await;
                break;
            }
        }
    }
    to_pod.abort();
}
