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
use super::channel::{Ws, channel_payload, channel_writer};
use super::session::Activity;

/// Most ports one WebSocket may carry: channel numbers are one byte (binary), or one ASCII
/// character from '0' (base64).
pub(super) fn max_ports(base64: bool) -> usize {
    if base64 { 40 } else { 128 }
}

/// How long the last messages may take to reach a client at the end.
const FLUSH: Duration = Duration::from_secs(5);

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
    let (out_tx, mut writer) = channel_writer(sink, base64);
    let mut inbound: Vec<Option<mpsc::Sender<Vec<u8>>>> = Vec::new();
    let mut forwards = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().take(max_ports(base64)).enumerate() {
        let data_ch = (2 * i) as u8;
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
    // A client message waiting for room in its port's queue: while one waits, no more is read
    // from the client (its TCP window fills), but the other branches go on.
    let mut pending: Option<(usize, Vec<u8>)> = None;
    loop {
        let room = pending
            .as_ref()
            .and_then(|(i, _)| inbound.get(*i).cloned().flatten());
        if pending.is_some() && room.is_none() {
            // That port's connection is gone: what was for it is dropped.
            pending = None;
        }
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
            permit = async { room?.reserve_owned().await.ok() }, if room.is_some() => {
                if let Some((i, data)) = pending.take() {
                    match permit {
                        Some(p) => {
                            p.send(data);
                        }
                        None => inbound[i] = None,
                    }
                }
            }
            msg = incoming.next(), if pending.is_none() => {
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
                let port = usize::from(ch / 2);
                if ch % 2 == 0 && inbound.get(port).is_some_and(Option::is_some) {
                    pending = Some((port, data.to_vec()));
                }
            }
        }
    }
    drop(inbound);
    while forwards.join_next().await.is_some() {}
    // A client that stopped reading does not hold the stream past a short flush.
    if tokio::time::timeout(FLUSH, &mut writer).await.is_err() {
        writer.abort();
    }
}

/// One port's connection: dialled inside the pod, then bytes both ways until the pod's side
/// ends (what the client sends after that is dropped). Both directions live in this task, so
/// aborting it closes the connection.
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
    let to_pod = async {
        while let Some(data) = from_client.recv().await {
            if wr.write_all(&data).await.is_err() {
                return;
            }
        }
        // The client is done sending: the pod's side sees EOF.
        let _ = wr.shutdown().await;
    };
    let from_pod = async {
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
    };
    tokio::select! {
        _ = from_pod => {}
        // The client's side finishing does not end the connection; the pod's does.
        _ = async { to_pod.await; std::future::pending::<()>().await } => {}
    }
}
