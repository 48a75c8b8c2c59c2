//! The attach protocol between the daemon and a container's monitor: the monitor owns the
//! container's stdio, so an attacher (CRI Attach, through the streaming server) connects to the
//! monitor's socket, sends an [`AttachRequest`] as its request, and from then on both sides
//! speak frames: a kind byte, a big-endian u32 length, the payload (at most [`FRAME_MAX`]).
//! The monitor sends `READY` (payload: 1 with a terminal, else 0) or `ERROR` (a message, then
//! it closes), then the container's output as it comes; the attacher sends stdin, the end of its
//! stdin, and terminal sizes. Output goes to every attacher and to the CRI log alike.

use serde::{Deserialize, Serialize};

/// What an attacher wants of the container's stdio.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct AttachOpts {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// The request that makes a monitor connection an attachment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AttachRequest {
    pub attach: AttachOpts,
}

/// Monitor to attacher: the attachment stands; the payload says whether there is a terminal.
pub const READY: u8 = 1;
/// Monitor to attacher: the container's stdout (or its terminal's output).
pub const STDOUT: u8 = 2;
/// Monitor to attacher: the container's stderr.
pub const STDERR: u8 = 3;
/// Monitor to attacher: why the attachment cannot be made; the connection closes after it.
pub const ERROR: u8 = 4;
/// Attacher to monitor: bytes for the container's stdin.
pub const STDIN: u8 = 10;
/// Attacher to monitor: this attacher's stdin ended (with `stdin_once` the container's does).
pub const STDIN_END: u8 = 11;
/// Attacher to monitor: the terminal's size, width then height, each a big-endian u16.
pub const RESIZE: u8 = 12;

/// The largest payload of one frame.
pub const FRAME_MAX: usize = 64 << 10;

/// Appends one frame to `out`; payloads longer than [`FRAME_MAX`] become several frames.
pub fn encode(kind: u8, payload: &[u8], out: &mut Vec<u8>) {
    let mut chunks = payload.chunks(FRAME_MAX).peekable();
    if chunks.peek().is_none() {
        out.push(kind);
        out.extend_from_slice(&0u32.to_be_bytes());
        return;
    }
    for c in chunks {
        out.push(kind);
        out.extend_from_slice(&(c.len() as u32).to_be_bytes());
        out.extend_from_slice(c);
    }
}

/// A malformed frame: the peer is not speaking this protocol.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("attach frame of {len} bytes (at most {FRAME_MAX})")]
pub struct FrameTooLong {
    pub len: usize,
}

/// Takes the first whole frame off `buf`: none until one has arrived whole.
pub fn decode(buf: &mut Vec<u8>) -> Result<Option<(u8, Vec<u8>)>, FrameTooLong> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if len > FRAME_MAX {
        return Err(FrameTooLong { len });
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let kind = buf[0];
    let payload = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((kind, payload)))
}

/// A RESIZE payload.
pub fn resize_payload(width: u16, height: u16) -> [u8; 4] {
    let (w, h) = (width.to_be_bytes(), height.to_be_bytes());
    [w[0], w[1], h[0], h[1]]
}

/// Width and height from a RESIZE payload.
pub fn parse_resize(p: &[u8]) -> Option<(u16, u16)> {
    match p {
        [a, b, c, d] => Some((u16::from_be_bytes([*a, *b]), u16::from_be_bytes([*c, *d]))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn frames_round_trip_and_split() {
        let mut buf = Vec::new();
        encode(STDOUT, b"hello", &mut buf);
        encode(STDIN_END, b"", &mut buf);
        let big = vec![7u8; FRAME_MAX + 10];
        encode(STDERR, &big, &mut buf);
        // Partial input waits for the rest.
        let mut partial = buf[..3].to_vec();
        assert_eq!(decode(&mut partial).unwrap(), None);
        assert_eq!(decode(&mut buf).unwrap(), Some((STDOUT, b"hello".to_vec())));
        assert_eq!(decode(&mut buf).unwrap(), Some((STDIN_END, Vec::new())));
        let (k, a) = decode(&mut buf).unwrap().unwrap();
        let (k2, b) = decode(&mut buf).unwrap().unwrap();
        assert_eq!((k, k2, a.len(), b.len()), (STDERR, STDERR, FRAME_MAX, 10));
        assert!(buf.is_empty());
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut buf = vec![STDIN];
        buf.extend_from_slice(&(FRAME_MAX as u32 + 1).to_be_bytes());
        assert_eq!(decode(&mut buf), Err(FrameTooLong { len: FRAME_MAX + 1 }));
    }

    #[test]
    fn resize_payloads() {
        assert_eq!(parse_resize(&resize_payload(120, 40)), Some((120, 40)));
        assert_eq!(parse_resize(b"abc"), None);
    }
}
