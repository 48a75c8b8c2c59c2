//! Kubernetes' channel framing of WebSocket messages, which the remote command protocol
//! (`websocket`) and kubelet's port-forward channels (`channel_forward`) share: one channel byte
//! before each payload, or with `base64.` protocols the channel's digit and the payload in
//! base64.

use base64::Engine;
use futures_util::SinkExt;
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Message};

pub(super) type Ws = WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>;

/// Sends `(channel, payload)` pairs as messages (the channel byte first, or with `base64` its
/// digit and the payload in base64) until every sender is gone, then closes normally (1000:
/// clients take a close without a status, 1005, as an error).
pub(super) fn channel_writer(
    mut sink: futures_util::stream::SplitSink<Ws, Message>,
    base64: bool,
) -> (mpsc::Sender<(u8, Vec<u8>)>, tokio::task::JoinHandle<()>) {
    let (out_tx, mut out_rx) = mpsc::channel::<(u8, Vec<u8>)>(64);
    let writer = tokio::spawn(async move {
        while let Some((ch, data)) = out_rx.recv().await {
            if sink.send(channel_message(ch, &data, base64)).await.is_err() {
                return;
            }
        }
        let _ = sink
            .send(Message::Close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "".into(),
            })))
            .await;
    });
    (out_tx, writer)
}

/// One message on channel `ch`: the channel byte then the payload, or with `base64` the
/// channel's digit then the payload in base64 (channels below 10 only, as the protocol has).
pub(super) fn channel_message(ch: u8, data: &[u8], base64: bool) -> Message {
    if base64 {
        let mut t = String::from(char::from(b'0'.wrapping_add(ch)));
        t.push_str(&base64::engine::general_purpose::STANDARD.encode(data));
        Message::text(t)
    } else {
        let mut b = Vec::with_capacity(data.len() + 1);
        b.push(ch);
        b.extend_from_slice(data);
        Message::binary(b)
    }
}

/// A client message as the channel byte and the rest; none for messages that carry no
/// channel data (pings, undecodable base64, empty ones).
pub(super) fn channel_payload(msg: Message, base64: bool) -> Option<Vec<u8>> {
    match msg {
        Message::Binary(b) if !b.is_empty() => Some(b.to_vec()),
        Message::Text(t) if base64 => {
            let t = t.as_str();
            let ch = t.bytes().next()?;
            let data = base64::engine::general_purpose::STANDARD
                .decode(t.get(1..)?)
                .ok()?;
            let mut p = vec![ch.wrapping_sub(b'0')];
            p.extend(data);
            Some(p)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever a client sends as a binary or text message, it is read as a channel and a
        /// payload or ignored: never a panic.
        #[test]
        fn arbitrary_messages_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), text in "\\PC{0,100}") {
            for b64 in [false, true] {
                let _ = channel_payload(Message::binary(bytes.clone()), b64);
                let _ = channel_payload(Message::text(text.clone()), b64);
            }
        }

        /// What the server sends on a channel is what a client reads back, in both framings.
        #[test]
        fn channel_messages_round_trip(ch in 0u8..10, data in proptest::collection::vec(any::<u8>(), 0..300)) {
            for b64 in [false, true] {
                let got = channel_payload(channel_message(ch, &data, b64), b64);
                let mut want = vec![ch];
                want.extend_from_slice(&data);
                prop_assert_eq!(got, Some(want));
            }
        }
    }
}
