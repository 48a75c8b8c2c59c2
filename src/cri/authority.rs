//! Clients on gRPC's C core (Python `grpcio` 1.5x and later, C++, Ruby, PHP) dialling
//! `unix:///path/to.sock` send the percent-encoded socket path as `:authority`
//! (`run%2Fcrius%2Fcrius.sock`). The HTTP/2 server under tonic (h2, through the `http` crate)
//! refuses any authority with a `%` outside an IPv6 zone and resets every such stream with
//! PROTOCOL_ERROR, while containerd's Go server takes it. A unix socket has no authority worth
//! reading, so this filter sits between the socket and the server and, in the client's header
//! blocks, overwrites an invalid `:authority` literal with a valid name of the same length. The
//! same length keeps the HPACK dynamic tables of both ends in step (an entry's size is its
//! length), so nothing else in the stream changes. Huffman-coded values are left alone (no C-core
//! client sends them; Go and Rust clients send valid authorities).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// The client connection preface.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// A header block larger than this is passed on untouched, not held: twice the longest header
/// list the server takes (its encoded form is not much longer than the list), so h2 refuses
/// it anyway.
pub(super) const MAX_BLOCK: usize = 128 << 10;

enum Phase {
    Preface(usize),
    FrameHeader,
    /// Bytes of a frame that are passed on as they come.
    Pass(usize),
    /// A header block being collected until END_HEADERS.
    Block,
}

/// A server-side connection whose inbound header blocks are filtered.
pub struct AuthorityFilter<S> {
    inner: S,
    phase: Phase,
    /// Read but not yet looked at.
    pending: Vec<u8>,
    /// Frames of the header block being collected.
    block: Vec<u8>,
    /// Ready for the server, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    eof: bool,
}

impl<S> AuthorityFilter<S> {
    pub fn new(inner: S) -> AuthorityFilter<S> {
        AuthorityFilter {
            inner,
            phase: Phase::Preface(PREFACE_LEN),
            pending: Vec::new(),
            block: Vec::new(),
            out: Vec::new(),
            out_pos: 0,
            eof: false,
        }
    }

    /// Moves what can be decided from `pending` to `out`.
    fn process(&mut self) {
        let mut at = 0;
        loop {
            let avail = self.pending.len() - at;
            match self.phase {
                Phase::Preface(left) | Phase::Pass(left) if avail > 0 || left == 0 => {
                    let n = left.min(avail);
                    self.out.extend_from_slice(&self.pending[at..at + n]);
                    at += n;
                    self.phase = if left == n {
                        Phase::FrameHeader
                    } else if matches!(self.phase, Phase::Preface(_)) {
                        Phase::Preface(left - n)
                    } else {
                        Phase::Pass(left - n)
                    };
                    if left != n {
                        break;
                    }
                }
                Phase::Preface(_) | Phase::Pass(_) => break,
                Phase::FrameHeader => {
                    if avail < FRAME_HEADER_LEN {
                        break;
                    }
                    let h = &self.pending[at..at + FRAME_HEADER_LEN];
                    let len = frame_len(h);
                    let kind = h[3];
                    if kind == HEADERS || (kind == CONTINUATION && !self.block.is_empty()) {
                        self.phase = Phase::Block;
                    } else {
                        // A block cut short by another frame is the client's protocol error,
                        // for the server to see in order.
                        self.out.append(&mut self.block);
                        self.out
                            .extend_from_slice(&self.pending[at..at + FRAME_HEADER_LEN]);
                        at += FRAME_HEADER_LEN;
                        self.phase = Phase::Pass(len);
                    }
                }
                Phase::Block => {
                    if avail < FRAME_HEADER_LEN {
                        break;
                    }
                    let h = &self.pending[at..at + FRAME_HEADER_LEN];
                    let total = FRAME_HEADER_LEN + frame_len(h);
                    let flags = h[4];
                    if self.block.len() + total > MAX_BLOCK {
                        // Too big to hold: give up on this block and pass the rest as it is.
                        self.out.append(&mut self.block);
                        self.out.extend_from_slice(h);
                        at += FRAME_HEADER_LEN;
                        self.phase = Phase::Pass(total - FRAME_HEADER_LEN);
                        continue;
                    }
                    if avail < total {
                        break;
                    }
                    self.block.extend_from_slice(&self.pending[at..at + total]);
                    at += total;
                    if flags & END_HEADERS != 0 {
                        fix_block(&mut self.block);
                        self.out.append(&mut self.block);
                    }
                    self.phase = Phase::FrameHeader;
                }
            }
        }
        self.pending.drain(..at);
    }
}

fn frame_len(h: &[u8]) -> usize {
    (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2])
}

/// Rewrites invalid `:authority` literals in a header block (its HEADERS and CONTINUATION
/// frames, whole) in place.
fn fix_block(frames: &mut [u8]) {
    // Where each byte of the HPACK fragment sits in `frames`.
    let mut at = Vec::new();
    let mut i = 0;
    while i + FRAME_HEADER_LEN <= frames.len() {
        let len = frame_len(&frames[i..]);
        let (kind, flags) = (frames[i + 3], frames[i + 4]);
        let start = i + FRAME_HEADER_LEN;
        let end = (start + len).min(frames.len());
        let (mut s, mut e) = (start, end);
        if kind == HEADERS {
            if flags & PADDED != 0 && s < e {
                let pad = usize::from(frames[s]);
                s += 1;
                e = e.saturating_sub(pad).max(s);
            }
            if flags & PRIORITY != 0 {
                s = (s + 5).min(e);
            }
        }
        at.extend(s..e);
        i = end;
    }
    let fragment: Vec<u8> = at.iter().map(|&p| frames[p]).collect();
    for range in invalid_authorities(&fragment) {
        for k in range {
            frames[at[k]] = b'-';
        }
    }
}

/// An HPACK integer with an `n`-bit prefix at `*i`.
fn integer(b: &[u8], i: &mut usize, n: u32) -> Option<usize> {
    let mask = (1usize << n) - 1;
    let mut v = usize::from(*b.get(*i)?) & mask;
    *i += 1;
    if v < mask {
        return Some(v);
    }
    let mut shift = 0;
    loop {
        let c = *b.get(*i)?;
        *i += 1;
        v = v.checked_add(usize::from(c & 0x7f).checked_shl(shift)?)?;
        shift += 7;
        if c & 0x80 == 0 || shift > 28 {
            return Some(v);
        }
    }
}

/// A string literal at `*i`: whether Huffman-coded, and where its bytes are.
fn string(b: &[u8], i: &mut usize) -> Option<(bool, std::ops::Range<usize>)> {
    let huffman = *b.get(*i)? & 0x80 != 0;
    let len = integer(b, i, 7)?;
    let start = *i;
    let end = start.checked_add(len)?;
    if end > b.len() {
        return None;
    }
    *i = end;
    Some((huffman, start..end))
}

/// The byte ranges, in an HPACK fragment, of `:authority` values (plain, not Huffman) that are
/// not valid authorities, each holding the bytes to overwrite.
fn invalid_authorities(b: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let first = b[i];
        let prefix = if first & 0x80 != 0 {
            // Indexed field: nothing literal.
            if integer(b, &mut i, 7).is_none() {
                break;
            }
            continue;
        } else if first & 0xc0 == 0x40 {
            6
        } else if first & 0xe0 == 0x20 {
            // Dynamic table size update.
            if integer(b, &mut i, 5).is_none() {
                break;
            }
            continue;
        } else {
            4
        };
        let Some(index) = integer(b, &mut i, prefix) else {
            break;
        };
        let authority = if index == 0 {
            match string(b, &mut i) {
                Some((false, name)) => &b[name] == b":authority",
                Some((true, _)) => false,
                None => break,
            }
        } else {
            // Entry 1 of HPACK's static table is `:authority`.
            index == 1
        };
        let Some((huffman, value)) = string(b, &mut i) else {
            break;
        };
        if authority && !huffman && !value.is_empty() {
            let v = &b[value.clone()];
            if http::uri::Authority::try_from(v).is_err() {
                out.extend(
                    value
                        .clone()
                        .filter(|&k| !valid_name_byte(b[k]))
                        .map(|k| k..k + 1),
                );
            }
        }
    }
    out
}

/// Bytes kept as they are in a rewritten authority: a host name's.
fn valid_name_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'.' || c == b'-'
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFilter<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let me = &mut *self;
        loop {
            if me.out_pos < me.out.len() {
                let n = (me.out.len() - me.out_pos).min(buf.remaining());
                buf.put_slice(&me.out[me.out_pos..me.out_pos + n]);
                me.out_pos += n;
                if me.out_pos == me.out.len() {
                    me.out.clear();
                    me.out_pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if me.eof {
                // Whatever was held back goes out as it is.
                me.out.append(&mut me.block);
                me.out.append(&mut me.pending);
                if me.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; 16 << 10];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut me.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        me.eof = true;
                    } else {
                        me.pending.extend_from_slice(rb.filled());
                        me.process();
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFilter<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityFilter<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len();
        let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
        f.extend_from_slice(&1u32.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// `:method: POST` (static 3), `:authority` literal with incremental indexing (name index
    /// 1), then a literal `:authority` name without indexing.
    fn block(value: &[u8]) -> Vec<u8> {
        let mut b = vec![0x83, 0x41, value.len() as u8];
        b.extend_from_slice(value);
        b.extend_from_slice(&[0x00, 10]);
        b.extend_from_slice(b":authority");
        b.push(value.len() as u8);
        b.extend_from_slice(value);
        b
    }

    async fn filtered(input: Vec<u8>, chunk: usize) -> Vec<u8> {
        let (mut client, server) = tokio::io::duplex(1 << 20);
        let writer = tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            for c in input.chunks(chunk) {
                client.write_all(c).await.unwrap();
            }
        });
        let mut f = AuthorityFilter::new(server);
        let mut out = Vec::new();
        writer.await.unwrap();
        // The writer side is dropped once the task ends: read to EOF.
        f.read_to_end(&mut out).await.unwrap();
        out
    }

    fn preface() -> Vec<u8> {
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec()
    }

    #[tokio::test]
    async fn percent_encoded_authority_is_rewritten_in_place() {
        let mut input = preface();
        input.extend(frame(0x4, 0, &[])); // SETTINGS
        input.extend(frame(
            HEADERS,
            END_HEADERS,
            &block(b"run%2Fcrius%2Fcrius.sock"),
        ));
        input.extend(frame(0x0, 0, b"data with % and :authority in it"));
        let mut want = preface();
        want.extend(frame(0x4, 0, &[]));
        want.extend(frame(
            HEADERS,
            END_HEADERS,
            &block(b"run-2Fcrius-2Fcrius.sock"),
        ));
        want.extend(frame(0x0, 0, b"data with % and :authority in it"));
        for chunk in [1, 3, 7, 1000] {
            assert_eq!(filtered(input.clone(), chunk).await, want, "chunk {chunk}");
        }
    }

    #[tokio::test]
    async fn valid_authorities_padding_and_continuations() {
        // A valid authority is untouched.
        let mut input = preface();
        input.extend(frame(HEADERS, END_HEADERS, &block(b"localhost:1234")));
        assert_eq!(filtered(input.clone(), 5).await, input);
        // Padded with priority, split over a CONTINUATION in the middle of the value.
        let b = block(b"a%2Fb");
        let mut first = vec![2u8]; // pad length
        first.extend_from_slice(&[0, 0, 0, 0, 16]); // priority
        first.extend_from_slice(&b[..5]);
        first.extend_from_slice(&[0, 0]); // padding
        let mut input = preface();
        input.extend(frame(HEADERS, PADDED | PRIORITY, &first));
        input.extend(frame(CONTINUATION, END_HEADERS, &b[5..]));
        let fixed = block(b"a-2Fb");
        let mut first_want = vec![2u8, 0, 0, 0, 0, 16];
        first_want.extend_from_slice(&fixed[..5]);
        first_want.extend_from_slice(&[0, 0]);
        let mut want = preface();
        want.extend(frame(HEADERS, PADDED | PRIORITY, &first_want));
        want.extend(frame(CONTINUATION, END_HEADERS, &fixed[5..]));
        assert_eq!(filtered(input, 2).await, want);
    }

    #[test]
    fn hostile_fragments_do_not_panic() {
        for b in [
            vec![0xff],
            vec![0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            vec![0x41, 0x7f, 0xff, 0xff, 0xff, 0x0f],
            vec![0x00, 0x05, b'a'],
            vec![0x41, 0x85, b'%'],
        ] {
            let _ = invalid_authorities(&b);
            let mut f = frame(HEADERS, END_HEADERS | PADDED, &b);
            fix_block(&mut f);
        }
    }
}
