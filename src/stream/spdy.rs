//! SPDY/3.1 framing, as kubelet's clients (client-go through moby/spdystream) speak it after the
//! HTTP upgrade: 8-byte frame headers, control frames (SYN_STREAM, SYN_REPLY, RST_STREAM,
//! SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE) and DATA frames, header blocks compressed
//! with zlib against SPDY/3's preset dictionary, one compression context per direction for the
//! whole connection. The peer is untrusted: lengths are bounded, header blocks are bounded
//! after decompression, and anything malformed is an error that ends the connection.

use std::collections::BTreeMap;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The largest frame accepted (spdystream writes at most 32 KiB of data per frame; control
/// frames are small).
pub const MAX_FRAME: usize = 1 << 20;
/// The largest header block after decompression.
const MAX_HEADERS: usize = 256 << 10;
pub const FLAG_FIN: u8 = 0x01;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// Header names to their values (names lowercase, as SPDY/3 requires).
pub type Headers = BTreeMap<String, Vec<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream: u32,
        associated: u32,
        priority: u8,
        fin: bool,
        headers: Headers,
    },
    SynReply {
        stream: u32,
        fin: bool,
        headers: Headers,
    },
    RstStream {
        stream: u32,
        status: u32,
    },
    Settings(Vec<(u8, u32, u32)>),
    Ping(u32),
    GoAway {
        last: u32,
        status: u32,
    },
    Headers {
        stream: u32,
        headers: Headers,
    },
    WindowUpdate {
        stream: u32,
        delta: u32,
    },
    Data {
        stream: u32,
        fin: bool,
        data: Vec<u8>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpdyError {
    #[error("SPDY frame of {0} bytes is larger than {MAX_FRAME}")]
    TooLarge(usize),
    #[error("SPDY version {0} is not 3")]
    Version(u16),
    #[error("SPDY {kind} frame is malformed: {reason}")]
    Malformed { kind: &'static str, reason: String },
    #[error("SPDY header block: {0}")]
    Headers(String),
}

fn malformed(kind: &'static str, reason: impl Into<String>) -> SpdyError {
    SpdyError::Malformed {
        kind,
        reason: reason.into(),
    }
}

/// SPDY/3's preset dictionary for header compression (draft 3, section 2.6.10.1): each word
/// prefixed by its length (4 bytes, big-endian), then a run of common values. 1423 bytes.
pub fn dictionary() -> Vec<u8> {
    const WORDS: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const TAIL: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
        "502504505",
        "203 Non-Authoritative Information204 No Content301 Moved Permanently",
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found",
        "500 Internal Server Error501 Not Implemented503 Service Unavailable",
        "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 ",
        "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT",
        "chunked,text/html,image/png,image/jpg,image/gif,application/xml,",
        "application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age=",
        "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut d = Vec::with_capacity(1423);
    for w in WORDS {
        d.extend_from_slice(&(w.len() as u32).to_be_bytes());
        d.extend_from_slice(w.as_bytes());
    }
    d.extend_from_slice(TAIL.as_bytes());
    d
}

/// One connection's framing state: the two header compression contexts.
pub struct Codec {
    deflate: Compress,
    inflate: Decompress,
    dict: Vec<u8>,
    dict_set: bool,
}

impl Default for Codec {
    fn default() -> Self {
        Codec::new()
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Codec {
    pub fn new() -> Codec {
        let dict = dictionary();
        let mut deflate = Compress::new(Compression::default(), true);
        // The compressor's dictionary is set before the first block: it cannot fail then.
        let _ = deflate.set_dictionary(&dict);
        Codec {
            deflate,
            inflate: Decompress::new(true),
            dict,
            dict_set: false,
        }
    }

    /// Takes one whole frame off the front of `buf`, if it holds one.
    pub fn decode(&mut self, buf: &mut Vec<u8>) -> Result<Option<Frame>, SpdyError> {
        if buf.len() < 8 {
            return Ok(None);
        }
        let len = ((buf[5] as usize) << 16) | ((buf[6] as usize) << 8) | buf[7] as usize;
        if len > MAX_FRAME {
            return Err(SpdyError::TooLarge(len));
        }
        if buf.len() < 8 + len {
            return Ok(None);
        }
        let frame: Vec<u8> = buf.drain(..8 + len).collect();
        let flags = frame[4];
        let body = &frame[8..];
        if frame[0] & 0x80 == 0 {
            return Ok(Some(Frame::Data {
                stream: u32_at(&frame, 0) & 0x7fff_ffff,
                fin: flags & FLAG_FIN != 0,
                data: body.to_vec(),
            }));
        }
        let version = u16::from_be_bytes([frame[0] & 0x7f, frame[1]]);
        if version != 3 {
            return Err(SpdyError::Version(version));
        }
        let kind = u16::from_be_bytes([frame[2], frame[3]]);
        let need = |n: usize, what: &'static str| {
            if body.len() < n {
                Err(malformed(what, format!("{} bytes, {n} needed", body.len())))
            } else {
                Ok(())
            }
        };
        let stream = |at: usize| u32_at(body, at) & 0x7fff_ffff;
        Ok(Some(match kind {
            SYN_STREAM => {
                need(10, "SYN_STREAM")?;
                Frame::SynStream {
                    stream: stream(0),
                    associated: stream(4),
                    priority: body[8] >> 5,
                    fin: flags & FLAG_FIN != 0,
                    headers: self.inflate_headers(&body[10..])?,
                }
            }
            SYN_REPLY => {
                need(4, "SYN_REPLY")?;
                Frame::SynReply {
                    stream: stream(0),
                    fin: flags & FLAG_FIN != 0,
                    headers: self.inflate_headers(&body[4..])?,
                }
            }
            RST_STREAM => {
                need(8, "RST_STREAM")?;
                Frame::RstStream {
                    stream: stream(0),
                    status: u32_at(body, 4),
                }
            }
            SETTINGS => {
                need(4, "SETTINGS")?;
                let n = u32_at(body, 0) as usize;
                if body.len() != 4 + n.saturating_mul(8) {
                    return Err(malformed("SETTINGS", "length does not match its entries"));
                }
                Frame::Settings(
                    (0..n)
                        .map(|i| {
                            let at = 4 + i * 8;
                            let id = u32_at(body, at) & 0x00ff_ffff;
                            (body[at], id, u32_at(body, at + 4))
                        })
                        .collect(),
                )
            }
            PING => {
                need(4, "PING")?;
                Frame::Ping(u32_at(body, 0))
            }
            GOAWAY => {
                need(8, "GOAWAY")?;
                Frame::GoAway {
                    last: stream(0),
                    status: u32_at(body, 4),
                }
            }
            HEADERS => {
                need(4, "HEADERS")?;
                Frame::Headers {
                    stream: stream(0),
                    headers: self.inflate_headers(&body[4..])?,
                }
            }
            WINDOW_UPDATE => {
                need(8, "WINDOW_UPDATE")?;
                Frame::WindowUpdate {
                    stream: stream(0),
                    delta: u32_at(body, 4) & 0x7fff_ffff,
                }
            }
            // Unknown control frames are ignored, as the spec says.
            _ => Frame::Ping(0),
        }))
    }

    /// Appends `frame`, encoded, to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut Vec<u8>) -> Result<(), SpdyError> {
        let control = |out: &mut Vec<u8>, kind: u16, flags: u8, body: &[u8]| {
            out.extend_from_slice(&[0x80, 3]);
            out.extend_from_slice(&kind.to_be_bytes());
            out.push(flags);
            out.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
            out.extend_from_slice(body);
        };
        match frame {
            Frame::Data { stream, fin, data } => {
                if data.len() > MAX_FRAME {
                    return Err(SpdyError::TooLarge(data.len()));
                }
                out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
                out.push(if *fin { FLAG_FIN } else { 0 });
                out.extend_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
                out.extend_from_slice(data);
            }
            Frame::SynStream {
                stream,
                associated,
                priority,
                fin,
                headers,
            } => {
                let mut body = Vec::new();
                body.extend_from_slice(&stream.to_be_bytes());
                body.extend_from_slice(&associated.to_be_bytes());
                body.extend_from_slice(&[priority << 5, 0]);
                body.extend(self.deflate_headers(headers)?);
                control(out, SYN_STREAM, if *fin { FLAG_FIN } else { 0 }, &body);
            }
            Frame::SynReply {
                stream,
                fin,
                headers,
            } => {
                let mut body = stream.to_be_bytes().to_vec();
                body.extend(self.deflate_headers(headers)?);
                control(out, SYN_REPLY, if *fin { FLAG_FIN } else { 0 }, &body);
            }
            Frame::Headers { stream, headers } => {
                let mut body = stream.to_be_bytes().to_vec();
                body.extend(self.deflate_headers(headers)?);
                control(out, HEADERS, 0, &body);
            }
            Frame::RstStream { stream, status } => {
                let mut body = stream.to_be_bytes().to_vec();
                body.extend_from_slice(&status.to_be_bytes());
                control(out, RST_STREAM, 0, &body);
            }
            Frame::Settings(entries) => {
                let mut body = (entries.len() as u32).to_be_bytes().to_vec();
                for (flags, id, value) in entries {
                    let head = (u32::from(*flags) << 24) | (id & 0x00ff_ffff);
                    body.extend_from_slice(&head.to_be_bytes());
                    body.extend_from_slice(&value.to_be_bytes());
                }
                control(out, SETTINGS, 0, &body);
            }
            Frame::Ping(id) => control(out, PING, 0, &id.to_be_bytes()),
            Frame::GoAway { last, status } => {
                let mut body = last.to_be_bytes().to_vec();
                body.extend_from_slice(&status.to_be_bytes());
                control(out, GOAWAY, 0, &body);
            }
            Frame::WindowUpdate { stream, delta } => {
                let mut body = stream.to_be_bytes().to_vec();
                body.extend_from_slice(&delta.to_be_bytes());
                control(out, WINDOW_UPDATE, 0, &body);
            }
        }
        Ok(())
    }

    fn deflate_headers(&mut self, headers: &Headers) -> Result<Vec<u8>, SpdyError> {
        let mut raw = (headers.len() as u32).to_be_bytes().to_vec();
        for (name, values) in headers {
            raw.extend_from_slice(&(name.len() as u32).to_be_bytes());
            raw.extend_from_slice(name.to_ascii_lowercase().as_bytes());
            let value = values.join("\0");
            raw.extend_from_slice(&(value.len() as u32).to_be_bytes());
            raw.extend_from_slice(value.as_bytes());
        }
        let mut out = Vec::with_capacity(raw.len() + 64);
        let mut input = &raw[..];
        loop {
            out.reserve(256);
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(input, &mut out, FlushCompress::Sync)
                .map_err(|e| SpdyError::Headers(e.to_string()))?;
            let used = (self.deflate.total_in() - before) as usize;
            input = &input[used..];
            // Done once all input is in and the flush left room to spare.
            if input.is_empty() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }

    fn inflate_headers(&mut self, block: &[u8]) -> Result<Headers, SpdyError> {
        let mut raw: Vec<u8> = Vec::with_capacity(block.len() * 4 + 64);
        let mut input = block;
        loop {
            if raw.len() >= MAX_HEADERS {
                return Err(SpdyError::Headers(format!(
                    "more than {MAX_HEADERS} bytes decompressed"
                )));
            }
            raw.reserve(4096);
            let before_in = self.inflate.total_in();
            let before_out = raw.len();
            match self
                .inflate
                .decompress_vec(input, &mut raw, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) if e.needs_dictionary().is_some() && !self.dict_set => {
                    self.inflate
                        .set_dictionary(&self.dict)
                        .map_err(|e| SpdyError::Headers(e.to_string()))?;
                    self.dict_set = true;
                }
                Err(e) => return Err(SpdyError::Headers(e.to_string())),
            }
            let used = (self.inflate.total_in() - before_in) as usize;
            input = &input[used..];
            if input.is_empty() && raw.len() < raw.capacity() {
                break;
            }
            if used == 0 && raw.len() == before_out && !input.is_empty() && self.dict_set {
                return Err(SpdyError::Headers("no progress decompressing".into()));
            }
        }
        parse_headers(&raw)
    }
}

fn parse_headers(raw: &[u8]) -> Result<Headers, SpdyError> {
    let bad = |why: &str| SpdyError::Headers(why.to_string());
    let take = |at: &mut usize| -> Result<&[u8], SpdyError> {
        if *at + 4 > raw.len() {
            return Err(bad("truncated length"));
        }
        let n = u32_at(raw, *at) as usize;
        *at += 4;
        let end = at.checked_add(n).filter(|e| *e <= raw.len());
        let end = end.ok_or_else(|| bad("truncated string"))?;
        let s = &raw[*at..end];
        *at = end;
        Ok(s)
    };
    if raw.len() < 4 {
        return Err(bad("no pair count"));
    }
    let count = u32_at(raw, 0) as usize;
    let mut at = 4;
    let mut out = Headers::new();
    for _ in 0..count {
        let name = take(&mut at)?;
        let value = take(&mut at)?;
        if name.is_empty() {
            return Err(bad("empty header name"));
        }
        let name = String::from_utf8_lossy(name).to_ascii_lowercase();
        let values = String::from_utf8_lossy(value)
            .split('\0')
            .map(str::to_string)
            .collect();
        out.insert(name, values);
    }
    Ok(out)
}

/// The first value of a header.
pub fn header<'a>(h: &'a Headers, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.first()).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn dictionary_is_spdy3s() {
        let d = dictionary();
        assert_eq!(d.len(), 1423);
        assert_eq!(
            hex::encode(Sha256::digest(&d)),
            "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
        );
    }

    fn headers(pairs: &[(&str, &str)]) -> Headers {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), vec![v.to_string()]))
            .collect()
    }

    #[test]
    fn frames_round_trip_through_two_codecs() {
        // A client and a server: each one's compressor feeds the other's decompressor.
        let (mut client, mut server) = (Codec::new(), Codec::new());
        let frames = vec![
            Frame::SynStream {
                stream: 1,
                associated: 0,
                priority: 0,
                fin: false,
                headers: headers(&[("streamtype", "error")]),
            },
            Frame::SynStream {
                stream: 3,
                associated: 0,
                priority: 0,
                fin: true,
                headers: headers(&[("streamtype", "stdout"), ("port", "80")]),
            },
            Frame::Data {
                stream: 3,
                fin: true,
                data: b"hello".to_vec(),
            },
            Frame::Settings(vec![(0, 7, 65536)]),
            Frame::Ping(5),
            Frame::WindowUpdate {
                stream: 1,
                delta: 1000,
            },
            Frame::RstStream {
                stream: 3,
                status: 5,
            },
            Frame::GoAway { last: 3, status: 0 },
        ];
        let mut wire = Vec::new();
        for f in &frames {
            client.encode(f, &mut wire).unwrap();
        }
        // Fed a byte at a time, the same frames come out.
        let mut buf = Vec::new();
        let mut got = Vec::new();
        for b in wire {
            buf.push(b);
            while let Some(f) = server.decode(&mut buf).unwrap() {
                got.push(f);
            }
        }
        assert_eq!(got, frames);
        let mut back = Vec::new();
        let reply = Frame::SynReply {
            stream: 1,
            fin: false,
            headers: Headers::new(),
        };
        server.encode(&reply, &mut back).unwrap();
        assert_eq!(client.decode(&mut back).unwrap(), Some(reply));
    }

    #[test]
    fn malformed_and_oversized_frames_are_errors() {
        let mut c = Codec::new();
        // Too large.
        let mut b = vec![0, 0, 0, 1, 0, 0xff, 0xff, 0xff];
        assert!(matches!(c.decode(&mut b), Err(SpdyError::TooLarge(_))));
        // Wrong version.
        let mut b = vec![0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1];
        assert!(matches!(c.decode(&mut b), Err(SpdyError::Version(2))));
        // A SYN_STREAM too short, then one whose header block is garbage.
        let mut b = vec![0x80, 3, 0, 1, 0, 0, 0, 2, 0, 0];
        assert!(matches!(c.decode(&mut b), Err(SpdyError::Malformed { .. })));
        let mut b = vec![
            0x80, 3, 0, 1, 0, 0, 0, 14, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4,
        ];
        assert!(matches!(c.decode(&mut b), Err(SpdyError::Headers(_))));
        // SETTINGS whose count lies.
        let mut b = vec![0x80, 3, 0, 4, 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff];
        assert!(c.decode(&mut b).is_err());
        // Header pairs that claim more than there is.
        assert!(parse_headers(&[0, 0, 0, 1, 0, 0, 0, 9, b'a']).is_err());
        assert!(parse_headers(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0]).is_err());
    }

    #[test]
    fn a_decompression_bomb_is_refused() {
        let (mut client, mut server) = (Codec::new(), Codec::new());
        let big = "x".repeat(400 << 10);
        let mut wire = Vec::new();
        client
            .encode(
                &Frame::Headers {
                    stream: 1,
                    headers: headers(&[("a", &big)]),
                },
                &mut wire,
            )
            .unwrap();
        assert!(wire.len() < MAX_FRAME);
        assert!(matches!(
            server.decode(&mut wire),
            Err(SpdyError::Headers(_))
        ));
    }
}

#[cfg(test)]
mod captured {
    //! Frames client-go (kubestream, the code kubectl uses) sent to crius's server, recorded
    //! on the wire after the upgrade: exec with stdin ("hello\n" then EOF), exec with a
    //! terminal, and port forwarding (a connection that only probed, then an HTTP request, to
    //! port 8080). Recorded by a TCP proxy between kubestream and crius, the bytes after the
    //! upgrade's response head.
    use super::*;

    fn decode_all(mut wire: Vec<u8>) -> Vec<Frame> {
        let mut codec = Codec::new();
        let mut frames = Vec::new();
        while let Some(f) = codec.decode(&mut wire).unwrap() {
            frames.push(f);
        }
        assert!(wire.is_empty(), "{} bytes left", wire.len());
        frames
    }

    const EXEC_STDIN: &[u8] = include_bytes!("testdata/kubestream-exec-stdin.spdy");
    const EXEC_TTY: &[u8] = include_bytes!("testdata/kubestream-exec-tty.spdy");
    const PORT_FORWARD: &[u8] = include_bytes!("testdata/kubestream-portforward.spdy");

    fn syn(frame: &Frame) -> Option<(u32, &str, Option<&str>)> {
        let Frame::SynStream {
            stream, headers, ..
        } = frame
        else {
            return None;
        };
        let one = |k: &str| headers.get(k).and_then(|v| v.first()).map(String::as_str);
        Some((*stream, one("streamtype")?, one("requestid")))
    }

    #[test]
    fn exec_with_stdin() {
        let frames = decode_all(EXEC_STDIN.to_vec());
        let syns: Vec<_> = frames.iter().filter_map(syn).collect();
        assert_eq!(
            syns,
            [
                (1, "error", None),
                (3, "stdin", None),
                (5, "stdout", None),
                (7, "stderr", None)
            ]
        );
        let stdin: Vec<_> = frames
            .iter()
            .filter_map(|f| match f {
                Frame::Data {
                    stream: 3,
                    fin,
                    data,
                } => Some((data.as_slice(), *fin)),
                _ => None,
            })
            .collect();
        assert_eq!(stdin, [(&b"hello\n"[..], false), (&b""[..], true)]);
        assert_eq!(frames.last(), Some(&Frame::GoAway { last: 0, status: 0 }));
    }

    #[test]
    fn exec_with_a_terminal() {
        let frames = decode_all(EXEC_TTY.to_vec());
        let syns: Vec<_> = frames.iter().filter_map(syn).collect();
        assert_eq!(
            syns,
            [(1, "error", None), (3, "stdout", None), (5, "resize", None)]
        );
        // The client resets its streams once the exit status came.
        let resets = frames
            .iter()
            .filter(|f| matches!(f, Frame::RstStream { status: 5, .. }))
            .count();
        assert_eq!(resets, 3);
    }

    #[test]
    fn port_forward_pairs_streams_by_request_id() {
        let frames = decode_all(PORT_FORWARD.to_vec());
        let syns: Vec<_> = frames.iter().filter_map(syn).collect();
        assert_eq!(
            syns,
            [
                (1, "error", Some("0")),
                (3, "error", Some("1")),
                (5, "data", Some("1")),
                (7, "data", Some("0"))
            ]
        );
        for f in &frames {
            if let Frame::SynStream { headers, .. } = f {
                assert_eq!(headers.get("port"), Some(&vec!["8080".to_string()]));
            }
        }
        assert!(frames.contains(&Frame::Data {
            stream: 5,
            fin: false,
            data: b"GET / HTTP/1.0\r\n\r\n".to_vec()
        }));
    }

    /// Bytes arrive as the network cuts them: fed one byte at a time, the same frames come out
    /// (the header decompression context is not disturbed by partial frames).
    #[test]
    fn frames_cut_anywhere_decode_the_same() {
        for wire in [EXEC_STDIN, EXEC_TTY, PORT_FORWARD] {
            let whole = decode_all(wire.to_vec());
            let mut codec = Codec::new();
            let (mut buf, mut got) = (Vec::new(), Vec::new());
            for b in wire {
                buf.push(*b);
                while let Some(f) = codec.decode(&mut buf).unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, whole);
        }
    }

    /// A captured stream with bytes flipped or cut short ends in an error or a wait, never a
    /// panic or a wrong frame count beyond what was sent.
    #[test]
    fn damaged_captures_are_refused_cleanly() {
        for wire in [EXEC_STDIN, EXEC_TTY, PORT_FORWARD] {
            for i in 0..wire.len() {
                let mut bad = wire.to_vec();
                bad[i] ^= 0x5a;
                let mut codec = Codec::new();
                let mut n = 0;
                while let Ok(Some(_)) = codec.decode(&mut bad) {
                    n += 1;
                    assert!(n <= 64);
                }
            }
        }
    }
}

#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    fn headers() -> impl Strategy<Value = Headers> {
        proptest::collection::btree_map(
            "[a-z][a-z0-9-]{0,15}",
            proptest::collection::vec("[ -~]{0,40}", 1..3),
            0..6,
        )
    }

    fn frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (1u32..1 << 31, any::<bool>(), headers()).prop_map(|(stream, fin, headers)| {
                Frame::SynStream {
                    stream,
                    associated: 0,
                    priority: 0,
                    fin,
                    headers,
                }
            }),
            (1u32..1 << 31, any::<bool>(), headers()).prop_map(|(stream, fin, headers)| {
                Frame::SynReply {
                    stream,
                    fin,
                    headers,
                }
            }),
            (
                1u32..1 << 31,
                any::<bool>(),
                proptest::collection::vec(any::<u8>(), 0..3000)
            )
                .prop_map(|(stream, fin, data)| Frame::Data { stream, fin, data }),
            any::<u32>().prop_map(Frame::Ping),
            (1u32..1 << 31, 1u32..1 << 31)
                .prop_map(|(stream, delta)| Frame::WindowUpdate { stream, delta }),
        ]
    }

    proptest! {
        /// Whatever a client sends, decoding ends in a frame, a wait for more, or an error:
        /// never a panic, and never more buffered than was given.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let mut codec = Codec::new();
            let mut buf = bytes.clone();
            for _ in 0..64 {
                match codec.decode(&mut buf) {
                    Ok(Some(_)) => continue,
                    Ok(None) | Err(_) => break,
                }
            }
            prop_assert!(buf.len() <= bytes.len());
        }

        /// Frames survive encoding and decoding, one after another on one connection (the
        /// header compression context carries over).
        #[test]
        fn frames_round_trip(frames in proptest::collection::vec(frame(), 1..8)) {
            let (mut tx, mut rx) = (Codec::new(), Codec::new());
            let mut wire = Vec::new();
            for f in &frames {
                tx.encode(f, &mut wire).unwrap();
            }
            for f in &frames {
                let got = rx.decode(&mut wire).unwrap();
                prop_assert_eq!(got.as_ref(), Some(f));
            }
            prop_assert!(wire.is_empty());
        }
    }
}
