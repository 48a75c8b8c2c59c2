//! The NRI trunk's multiplexing (containerd/nri `pkg/net/multiplex`): one unix stream socket
//! carries logical connections as frames of `u32 BE conn id, u32 BE length, payload`, and each
//! connection carries ttrpc messages (10-byte header, then the payload). This file owns the
//! bytes: it frames each outgoing message the way Go peers can read it, reads frames with a
//! bounded size, and cuts each connection's byte stream back into whole messages. What the
//! messages mean is `ttrpc`'s. Uses tokio's I/O traits and `bytes`.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The connection the plugin serves and the runtime calls.
pub const PLUGIN_CONN: u32 = 1;
/// The connection the runtime serves and the plugin calls.
pub const RUNTIME_CONN: u32 = 2;
/// A frame's header: conn id and payload length.
pub const FRAME_HEADER_LEN: usize = 8;
/// A ttrpc message's header: length, stream id, type, flags.
pub const MESSAGE_HEADER_LEN: usize = 10;
/// The largest ttrpc message payload (ttrpc's own limit).
pub const MESSAGE_LENGTH_MAX: usize = 4 << 20;
/// The largest frame payload a Go mux writes: one whole message.
pub const MAX_FRAME_PAYLOAD: usize = MESSAGE_HEADER_LEN + MESSAGE_LENGTH_MAX;
/// Go ttrpc reads through a bufio.Reader of this size, and Go's mux fails a read whose frame
/// is larger than the buffer it is given, so writes are cut as Go's bufio.Writer cuts them.
const GO_BUFFER: usize = 4096;

/// Why the trunk cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum MuxError {
    #[error("frame on conn {conn} of {len} bytes exceeds {MAX_FRAME_PAYLOAD}")]
    FrameTooLarge { conn: u32, len: usize },
    #[error("message on conn {conn} of {len} bytes exceeds {MESSAGE_LENGTH_MAX}")]
    MessageTooLarge { conn: u32, len: usize },
    #[error("trunk ended inside a frame header ({got} of {FRAME_HEADER_LEN} bytes)")]
    Truncated { got: usize },
    #[error("reading the trunk: {source}")]
    Read {
        #[source]
        source: std::io::Error,
    },
}

/// A ttrpc message header, less its length field (that is the payload's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Header {
    pub stream_id: u32,
    pub kind: u8,
    pub flags: u8,
}

impl Header {
    pub const fn new(stream_id: u32, kind: u8, flags: u8) -> Header {
        Header {
            stream_id,
            kind,
            flags,
        }
    }
}

/// One ttrpc message framed for `conn`. The caller keeps `payload` within
/// MESSAGE_LENGTH_MAX.
pub fn encode(conn: u32, header: Header, payload: &[u8]) -> Bytes {
    let mut msg = Vec::with_capacity(MESSAGE_HEADER_LEN + payload.len());
    msg.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    msg.extend_from_slice(&header.stream_id.to_be_bytes());
    msg.extend_from_slice(&[header.kind, header.flags]);
    msg.extend_from_slice(payload);
    frames(conn, &msg)
}

/// The frames that carry one whole message (`msg`, header and payload) on `conn`: one frame
/// up to 4096 bytes, else the first 4096 bytes and then the rest, which is what a Go writer
/// flushing a 4096-byte bufio.Writer puts on the wire.
pub fn frames(conn: u32, msg: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(msg.len() + 2 * FRAME_HEADER_LEN);
    let (first, rest) = msg.split_at(msg.len().min(GO_BUFFER));
    for part in [first, rest] {
        if part.is_empty() && !out.is_empty() {
            break;
        }
        out.extend_from_slice(&conn.to_be_bytes());
        out.extend_from_slice(&(part.len() as u32).to_be_bytes());
        out.extend_from_slice(part);
    }
    out.freeze()
}

/// Reads one frame: its conn id and payload, or `None` at a clean end of the trunk. A frame
/// larger than any Go peer writes is refused before anything is allocated for it.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<(u32, Vec<u8>)>, MuxError> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    let mut got = 0;
    while got < FRAME_HEADER_LEN {
        let n = r
            .read(&mut header[got..])
            .await
            .map_err(|source| MuxError::Read { source })?;
        if n == 0 {
            return match got {
                0 => Ok(None),
                got => Err(MuxError::Truncated { got }),
            };
        }
        got += n;
    }
    let mut fields = &header[..];
    let conn = fields.get_u32();
    let len = fields.get_u32() as usize;
    if len > MAX_FRAME_PAYLOAD {
        return Err(MuxError::FrameTooLarge { conn, len });
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)
        .await
        .map_err(|source| MuxError::Read { source })?;
    Ok(Some((conn, payload)))
}

/// Each open connection's byte stream, cut into whole ttrpc messages. Frames may split a
/// message anywhere or hold several; frames for connections not open are dropped, as Go's
/// mux drops them. A stream holds at most one partial message, whose length is checked as
/// soon as its header is in, so a peer cannot make it grow past one message and one frame.
#[derive(Debug)]
pub struct Demux {
    streams: Vec<(u32, BytesMut)>,
}

impl Demux {
    pub fn new(conns: &[u32]) -> Demux {
        Demux {
            streams: conns.iter().map(|&c| (c, BytesMut::new())).collect(),
        }
    }

    /// Adds a frame's payload to its connection's stream; returns the messages (header and
    /// payload each) it completes, in order.
    pub fn push(&mut self, conn: u32, payload: &[u8]) -> Result<Vec<(Header, Bytes)>, MuxError> {
        let Some((_, stream)) = self.streams.iter_mut().find(|(c, _)| *c == conn) else {
            return Ok(Vec::new());
        };
        stream.extend_from_slice(payload);
        let mut messages = Vec::new();
        while stream.len() >= MESSAGE_HEADER_LEN {
            let mut fields = &stream[..MESSAGE_HEADER_LEN];
            let len = fields.get_u32() as usize;
            if len > MESSAGE_LENGTH_MAX {
                return Err(MuxError::MessageTooLarge { conn, len });
            }
            if stream.len() < MESSAGE_HEADER_LEN + len {
                break;
            }
            let header = Header::new(fields.get_u32(), fields.get_u8(), fields.get_u8());
            let mut msg = stream.split_to(MESSAGE_HEADER_LEN + len);
            messages.push((header, msg.split_off(MESSAGE_HEADER_LEN).freeze()));
        }
        Ok(messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Header = Header::new(5, 1, 1);

    /// `message` as `encode` lays it out, unframed: length, stream id, type, flags, payload.
    fn message(payload: &[u8]) -> Vec<u8> {
        let mut m = (payload.len() as u32).to_be_bytes().to_vec();
        m.extend_from_slice(&[0, 0, 0, 5, 1, 1]);
        m.extend_from_slice(payload);
        m
    }

    fn frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = conn.to_be_bytes().to_vec();
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// Every frame on `wire`, and the messages they make.
    async fn read_all(mut wire: &[u8]) -> (Vec<(u32, usize)>, Vec<(Header, Bytes)>) {
        let mut demux = Demux::new(&[PLUGIN_CONN, RUNTIME_CONN]);
        let (mut frames, mut messages) = (Vec::new(), Vec::new());
        while let Some((conn, payload)) = read_frame(&mut wire).await.unwrap() {
            frames.push((conn, payload.len()));
            messages.extend(demux.push(conn, &payload).unwrap());
        }
        (frames, messages)
    }

    #[tokio::test]
    async fn split_rule_frame_sizes_and_round_trip() {
        let max = MESSAGE_LENGTH_MAX;
        let cases = [
            (0, vec![10]),
            (100, vec![110]),
            (4086, vec![4096]),
            (4087, vec![4096, 1]),
            (8182, vec![4096, 4096]),
            (9990, vec![4096, 5904]),
            (max, vec![4096, MAX_FRAME_PAYLOAD - 4096]),
        ];
        for (len, sizes) in cases {
            let payload = vec![0xab; len];
            let wire = encode(RUNTIME_CONN, H, &payload);
            let (frames, messages) = read_all(&wire).await;
            let want: Vec<_> = sizes.into_iter().map(|s| (RUNTIME_CONN, s)).collect();
            assert_eq!(frames, want, "payload of {len} bytes");
            assert_eq!(wire.len(), len + 10 + FRAME_HEADER_LEN * frames.len());
            assert_eq!(messages, vec![(H, Bytes::from(payload))]);
        }
    }

    #[test]
    fn message_split_across_frames() {
        let msg = message(&[7; 300]);
        let mut demux = Demux::new(&[PLUGIN_CONN]);
        // Cut inside the header, then inside the payload.
        assert!(demux.push(PLUGIN_CONN, &msg[..3]).unwrap().is_empty());
        assert!(demux.push(PLUGIN_CONN, &msg[3..150]).unwrap().is_empty());
        assert!(demux.push(PLUGIN_CONN, &[]).unwrap().is_empty());
        let got = demux.push(PLUGIN_CONN, &msg[150..]).unwrap();
        assert_eq!(got, vec![(H, Bytes::from(vec![7; 300]))]);
    }

    #[test]
    fn two_messages_in_one_frame_and_a_tail() {
        let (a, b, c) = (message(b"first"), message(b""), message(&[3; 20]));
        let mut payload = [a, b].concat();
        payload.extend_from_slice(&c[..12]);
        let mut demux = Demux::new(&[RUNTIME_CONN]);
        let got = demux.push(RUNTIME_CONN, &payload).unwrap();
        assert_eq!(got, vec![(H, Bytes::from("first")), (H, Bytes::new())]);
        let got = demux.push(RUNTIME_CONN, &c[12..]).unwrap();
        assert_eq!(got, vec![(H, Bytes::from(vec![3; 20]))]);
    }

    #[test]
    fn streams_are_kept_apart() {
        let (a, b) = (message(&[1; 40]), message(&[2; 40]));
        let mut demux = Demux::new(&[PLUGIN_CONN, RUNTIME_CONN]);
        assert!(demux.push(PLUGIN_CONN, &a[..20]).unwrap().is_empty());
        assert_eq!(demux.push(RUNTIME_CONN, &b).unwrap()[0].1[0], 2);
        assert_eq!(demux.push(PLUGIN_CONN, &a[20..]).unwrap()[0].1[0], 1);
    }

    #[tokio::test]
    async fn unknown_conn_dropped() {
        let msg = message(b"payload");
        let wire = [frame(0, &msg), frame(7, &msg), frame(PLUGIN_CONN, &msg)].concat();
        let (frames, messages) = read_all(&wire).await;
        assert_eq!(frames.len(), 3);
        assert_eq!(messages, vec![(H, Bytes::from("payload"))]);
    }

    #[tokio::test]
    async fn oversized_frame_refused() {
        let mut header = PLUGIN_CONN.to_be_bytes().to_vec();
        header.extend_from_slice(&((MAX_FRAME_PAYLOAD + 1) as u32).to_be_bytes());
        let err = read_frame(&mut &header[..]).await.unwrap_err();
        assert!(matches!(
            err,
            MuxError::FrameTooLarge { conn: PLUGIN_CONN, len } if len == MAX_FRAME_PAYLOAD + 1
        ));
    }

    #[test]
    fn oversized_message_refused() {
        let mut header = ((MESSAGE_LENGTH_MAX + 1) as u32).to_be_bytes().to_vec();
        header.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        let err = Demux::new(&[PLUGIN_CONN])
            .push(PLUGIN_CONN, &header)
            .unwrap_err();
        assert!(matches!(
            err,
            MuxError::MessageTooLarge {
                conn: PLUGIN_CONN,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn end_of_trunk() {
        assert!(read_frame(&mut &[][..]).await.unwrap().is_none());
        let err = read_frame(&mut &[0u8, 0, 0][..]).await.unwrap_err();
        assert!(matches!(err, MuxError::Truncated { got: 3 }));
        let cut = &frame(PLUGIN_CONN, b"abcdef")[..10];
        let err = read_frame(&mut &cut[..]).await.unwrap_err();
        assert!(matches!(err, MuxError::Read { .. }));
    }
}
