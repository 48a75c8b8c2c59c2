//! One upgraded SPDY connection: the frame reader and writer, and on top of them Kubernetes'
//! remote command protocol (streams named by their `streamtype` header: error, stdin, stdout,
//! stderr, resize; the exit code on the error stream, as a `metav1.Status` from v4 on) or port
//! forwarding (a data and an error stream per `requestid`, for its `port`, dialled inside the
//! pod). Every stream the client opens is answered at once; flow control is the transport's
//! (spdystream, the clients' side, keeps no windows).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::spdy::{self, Codec, Frame, Headers};
use super::{Backend, Opts, Request, Session};

/// How long the client has to open the streams it asked for.
const STREAM_CREATION: Duration = Duration::from_secs(30);
/// How long output may trail a command's exit (a child of it may hold the pipes).
const DRAIN: Duration = Duration::from_secs(2);
/// Data per frame written.
const CHUNK: usize = 32 << 10;
/// Bytes of a client's data a session holds before it stops reading from the client (stdin a
/// command does not read, a pod connection that does not drain): the client's own TCP window
/// takes the rest. At least one frame's worth (`spdy::MAX_FRAME`).
const INBOUND_BUDGET: usize = 4 << 20;

/// A share of the session's inbound budget, held by the data it was taken for until that data
/// is written on or dropped.
#[derive(Debug)]
pub struct Held(#[allow(dead_code)] Option<tokio::sync::OwnedSemaphorePermit>);

/// What the reader tells the protocol.
#[derive(Debug)]
pub enum Event {
    Open {
        stream: u32,
        headers: Headers,
    },
    Data {
        stream: u32,
        data: Vec<u8>,
        fin: bool,
        held: Held,
    },
    Reset {
        stream: u32,
    },
}

/// The time of the last frame either way, for the idle timeout.
pub(super) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }
    pub(super) fn touch(&self) {
        self.last_ms
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
    pub(super) fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.start.elapsed().saturating_sub(last)
    }
}

/// Serves the protocol on an upgraded connection until it ends.
pub async fn run_spdy<IO>(
    io: IO,
    protocol: &'static str,
    request: Request,
    backend: Arc<dyn Backend>,
    idle: Duration,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let activity = Arc::new(Activity::new());
    let (out_tx, mut out_rx) = mpsc::channel::<Frame>(64);
    let writer_activity = activity.clone();
    let writer = tokio::spawn(async move {
        let mut codec = Codec::new();
        let mut buf = Vec::with_capacity(CHUNK + 64);
        while let Some(f) = out_rx.recv().await {
            buf.clear();
            if codec.encode(&f, &mut buf).is_err()
                || wr.write_all(&buf).await.is_err()
                // A tunnel (WebSocket) sends its message on flush.
                || wr.flush().await.is_err()
            {
                break;
            }
            writer_activity.touch();
        }
        let _ = wr.shutdown().await;
    });
    let (ev_tx, ev_rx) = mpsc::channel::<Event>(256);
    let budget = Arc::new(tokio::sync::Semaphore::new(INBOUND_BUDGET));
    let protocol_task = {
        let out = out_tx.clone();
        tokio::spawn(async move {
            match request {
                Request::PortForward { sandbox_id, .. } => {
                    port_forward(ev_rx, out, sandbox_id, backend).await
                }
                other => remote_command(ev_rx, out, protocol, other, backend).await,
            }
        })
    };
    // The reader: frames in, streams answered, events out.
    let mut codec = Codec::new();
    let mut buf = Vec::with_capacity(64 << 10);
    let mut chunk = vec![0u8; 64 << 10];
    'read: loop {
        let n = match tokio::time::timeout(Duration::from_secs(5), rd.read(&mut chunk)).await {
            Err(_) if activity.idle() >= idle => {
                tracing::info!("closing a stream idle for {idle:?}");
                break;
            }
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => n,
        };
        activity.touch();
        buf.extend_from_slice(&chunk[..n]);
        loop {
            let frame = match codec.decode(&mut buf) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => {
                    tracing::info!(error = %e, "closing a streaming connection");
                    let _ = out_tx.send(Frame::GoAway { last: 0, status: 1 }).await;
                    break 'read;
                }
            };
            let event = match frame {
                Frame::SynStream {
                    stream,
                    headers,
                    fin,
                    ..
                } => {
                    let _ = out_tx
                        .send(Frame::SynReply {
                            stream,
                            fin: false,
                            headers: Headers::new(),
                        })
                        .await;
                    if fin {
                        // Opened already half-closed: no data will come from the client.
                        let _ = ev_tx.send(Event::Open { stream, headers }).await;
                        Event::Data {
                            stream,
                            data: Vec::new(),
                            fin: true,
                            held: Held(None),
                        }
                    } else {
                        Event::Open { stream, headers }
                    }
                }
                Frame::Data { stream, fin, data } => {
                    // Waits, not reading on, while the budget is spent; a session idle
                    // meanwhile (nothing sent either way) ends.
                    let held = loop {
                        let want = budget.clone().acquire_many_owned(data.len() as u32);
                        match tokio::time::timeout(Duration::from_secs(5), want).await {
                            Ok(Ok(p)) => break Held(Some(p)),
                            Ok(Err(_)) => break 'read,
                            Err(_) if activity.idle() >= idle => {
                                tracing::info!("closing a stream idle for {idle:?}");
                                break 'read;
                            }
                            Err(_) => {}
                        }
                    };
                    Event::Data {
                        stream,
                        data,
                        fin,
                        held,
                    }
                }
                Frame::RstStream { stream, .. } => Event::Reset { stream },
                Frame::Ping(id) => {
                    let _ = out_tx.send(Frame::Ping(id)).await;
                    continue;
                }
                Frame::GoAway { .. } => break 'read,
                _ => continue,
            };
            if ev_tx.send(event).await.is_err() {
                break 'read;
            }
        }
    }
    drop(ev_tx);
    drop(out_tx);
    let _ = protocol_task.await;
    let _ = writer.await;
}

fn stream_type(h: &Headers) -> String {
    spdy::header(h, "streamtype")
        .unwrap_or("")
        .to_ascii_lowercase()
}

/// `metav1.Status` as the error stream carries it from v4 on.
pub fn exit_status(code: Result<i32, super::BackendError>) -> Vec<u8> {
    let v = match code {
        Ok(0) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Ok(n) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: exit status {n}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": n.to_string()}]},
        }),
        Err(e) => serde_json::json!({
            "metadata": {},
            "status": "Failure",
            "message": e.to_string(),
            "reason": "InternalError",
            "code": 500,
        }),
    };
    serde_json::to_vec(&v).unwrap_or_default()
}

/// What v1 to v3 put on the error stream: nothing on success, else a message.
pub(super) fn exit_text(code: &Result<i32, super::BackendError>) -> Option<Vec<u8>> {
    match code {
        Ok(0) => None,
        Ok(n) => Some(
            format!("command terminated with non-zero exit code: exit status {n}").into_bytes(),
        ),
        Err(e) => Some(e.to_string().into_bytes()),
    }
}

pub(super) fn opts_of(r: &Request) -> Opts {
    match r {
        Request::Exec { opts, .. } | Request::Attach { opts, .. } => *opts,
        Request::PortForward { .. } => Opts::default(),
    }
}

async fn send_data(out: &mpsc::Sender<Frame>, stream: u32, data: Vec<u8>, fin: bool) {
    let _ = out.send(Frame::Data { stream, data, fin }).await;
}

/// Copies `from` into DATA frames on `stream`, then closes it.
async fn pump(
    mut from: Box<dyn AsyncRead + Send + Unpin>,
    stream: Option<u32>,
    out: mpsc::Sender<Frame>,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if let Some(s) = stream {
                    send_data(&out, s, buf[..n].to_vec(), false).await;
                }
            }
        }
    }
    if let Some(s) = stream {
        send_data(&out, s, Vec::new(), true).await;
    }
}

/// Terminal sizes from the resize stream: a sequence of `{"Width":W,"Height":H}` objects.
#[derive(Default)]
pub struct Resizes {
    buf: Vec<u8>,
}

impl Resizes {
    pub fn feed(&mut self, data: &[u8]) -> Vec<(u16, u16)> {
        self.buf.extend_from_slice(data);
        if self.buf.len() > 64 << 10 {
            self.buf.clear();
        }
        let mut sizes = Vec::new();
        let mut de =
            serde_json::Deserializer::from_slice(&self.buf).into_iter::<serde_json::Value>();
        let mut used = 0;
        loop {
            let v = match de.next() {
                Some(Ok(v)) => v,
                // Half an object: wait for the rest.
                Some(Err(e)) if e.is_eof() => break,
                // Garbage: dropped, so what follows can still be read.
                Some(Err(_)) => {
                    used = self.buf.len();
                    break;
                }
                None => break,
            };
            used = de.byte_offset();
            let dim = |k: &str| v.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
            let (w, h) = (dim("Width"), dim("Height"));
            if w > 0 && h > 0 && w <= u16::MAX as u64 && h <= u16::MAX as u64 {
                sizes.push((w as u16, h as u16));
            }
        }
        self.buf.drain(..used);
        sizes
    }
}

/// A session's stdin, less the client terminal's end-of-file marker at its start: a
/// client that reads its own terminal in canonical mode, is sent ^D (an end of file: script
/// under `</dev/null` sends one when its input ends) and then makes the terminal raw, reads the
/// line discipline's EOF marker as one NUL byte and sends it (crictl and kubectl do, issue 24).
/// The container's terminal would echo it as `^@`. Only a lone NUL as the very first data is
/// taken for the marker; a Ctrl-@ typed as a session's first key is lost with it.
#[derive(Debug, Default)]
pub(super) struct Stdin {
    tty: bool,
    begun: bool,
}

impl Stdin {
    pub(super) fn new(tty: bool) -> Stdin {
        Stdin { tty, begun: false }
    }

    /// What of `data` goes on to the command.
    pub(super) fn pass<'a>(&mut self, data: &'a [u8]) -> &'a [u8] {
        let data = if !self.begun && self.tty && data == [0] {
            &[]
        } else {
            data
        };
        self.begun |= !data.is_empty();
        data
    }
}

/// Exec and attach: waits for the streams the options call for, starts the work, pumps.
async fn remote_command(
    mut events: mpsc::Receiver<Event>,
    out: mpsc::Sender<Frame>,
    protocol: &'static str,
    request: Request,
    backend: Arc<dyn Backend>,
) {
    let opts = opts_of(&request);
    let v4 = protocol == "v4.channel.k8s.io";
    let resize_supported = matches!(protocol, "v3.channel.k8s.io" | "v4.channel.k8s.io");
    let mut want = vec!["error"];
    if opts.stdin {
        want.push("stdin");
    }
    if opts.stdout {
        want.push("stdout");
    }
    if opts.stderr && !opts.tty {
        want.push("stderr");
    }
    if opts.tty && resize_supported {
        want.push("resize");
    }
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut early: Vec<Event> = Vec::new();
    let deadline = tokio::time::Instant::now() + STREAM_CREATION;
    while !want.iter().all(|w| ids.contains_key(*w)) {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(Event::Open { stream, headers })) => {
                ids.insert(stream_type(&headers), stream);
            }
            Ok(Some(e)) => early.push(e),
            Ok(None) => return,
            Err(_) => {
                tracing::info!(?want, got = ?ids.keys().collect::<Vec<_>>(), "streams not opened in time");
                return;
            }
        }
    }
    let error_stream = ids.get("error").copied();
    let finish = |code: Result<i32, super::BackendError>| {
        let out = out.clone();
        async move {
            if let Some(s) = error_stream {
                let body = if v4 {
                    Some(exit_status(code))
                } else {
                    exit_text(&code)
                };
                if let Some(b) = body {
                    send_data(&out, s, b, false).await;
                }
                send_data(&out, s, Vec::new(), true).await;
            }
        }
    };
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
        Err(message) => {
            finish(Err(message)).await;
            return;
        }
    };
    // Dropped with the session, which aborts them: a child of the command may hold its
    // output open for ever (CVE-2026-53495), and a pump left running would keep the
    // connection, and its stream slot, with it.
    let mut pumps = tokio::task::JoinSet::new();
    let mut open_outputs = Vec::new();
    for (from, name) in [(stdout, "stdout"), (stderr, "stderr")] {
        if let Some(r) = from {
            let stream = ids.get(name).copied();
            open_outputs.extend(stream);
            let out = out.clone();
            pumps.spawn(async move {
                pump(r, stream, out).await;
                stream
            });
        }
    }
    let (stdin_id, resize_id) = (ids.get("stdin").copied(), ids.get("resize").copied());
    let mut resizes = Resizes::default();
    let mut input = Stdin::new(opts.tty);
    let mut pending = early.into_iter();
    let code = loop {
        let event = match pending.next() {
            Some(e) => Some(e),
            None => {
                tokio::select! {
                    code = &mut done => break Some(code),
                    e = events.recv() => e,
                }
            }
        };
        match event {
            // The client went away: the work is left to end on its own (stdin closes).
            None => break None,
            Some(Event::Data {
                stream, data, fin, ..
            }) if Some(stream) == stdin_id => {
                let data = input.pass(&data);
                if let Some(w) = stdin.as_mut() {
                    if !data.is_empty() && w.write_all(data).await.is_err() {
                        stdin = None;
                    } else if let Some(w) = stdin.as_mut() {
                        let _ = w.flush().await;
                    }
                }
                if fin && let Some(mut w) = stdin.take() {
                    let _ = w.shutdown().await;
                }
            }
            Some(Event::Data { stream, data, .. }) if Some(stream) == resize_id => {
                if let Some(r) = &resize {
                    for (w, h) in resizes.feed(&data) {
                        let _ = r(w, h);
                    }
                }
            }
            Some(Event::Reset { stream }) if Some(stream) == stdin_id => {
                stdin = None;
            }
            Some(_) => {}
        }
    };
    let Some(code) = code else {
        return;
    };
    drop(stdin);
    drain(pumps, open_outputs, &out).await;
    finish(code).await;
}

/// Output still in the pipes reaches the client, within reason ([`DRAIN`]); then the pumps
/// are stopped, whatever a child of the command holds, and each stream they did not close
/// (`open`) is closed here, so the client stops waiting for it.
async fn drain(
    mut pumps: tokio::task::JoinSet<Option<u32>>,
    mut open: Vec<u32>,
    out: &mpsc::Sender<Frame>,
) {
    let _ = tokio::time::timeout(DRAIN, async {
        while let Some(done) = pumps.join_next().await {
            if let Ok(Some(s)) = done {
                open.retain(|o| *o != s);
            }
        }
    })
    .await;
    pumps.abort_all();
    for s in open {
        send_data(out, s, Vec::new(), true).await;
    }
}

/// Port forwarding: each request ID's data and error streams, its connection dialled in the
/// pod once both are open.
async fn port_forward(
    mut events: mpsc::Receiver<Event>,
    out: mpsc::Sender<Frame>,
    sandbox_id: String,
    backend: Arc<dyn Backend>,
) {
    #[derive(Default)]
    struct Pair {
        data: Option<u32>,
        error: Option<u32>,
        port: Option<u16>,
        started: bool,
    }
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    // Incoming data by data stream, to the connection's task.
    let mut inbound: HashMap<u32, mpsc::Sender<(Vec<u8>, bool, Held)>> = HashMap::new();
    while let Some(ev) = events.recv().await {
        match ev {
            Event::Open { stream, headers } => {
                let kind = stream_type(&headers);
                let id = spdy::header(&headers, "requestid")
                    .unwrap_or("")
                    .to_string();
                let port = spdy::header(&headers, "port").and_then(|p| p.parse::<u16>().ok());
                let pair = pairs.entry(id.clone()).or_default();
                match kind.as_str() {
                    "data" => pair.data = Some(stream),
                    "error" => pair.error = Some(stream),
                    _ => {
                        let _ = out.send(Frame::RstStream { stream, status: 1 }).await;
                        continue;
                    }
                }
                pair.port = pair.port.or(port);
                if let (Some(data), Some(error), false) = (pair.data, pair.error, pair.started) {
                    pair.started = true;
                    let (tx, rx) = mpsc::channel(64);
                    inbound.insert(data, tx);
                    tokio::spawn(forward(
                        backend.clone(),
                        sandbox_id.clone(),
                        pair.port,
                        data,
                        error,
                        rx,
                        out.clone(),
                    ));
                }
            }
            Event::Data {
                stream,
                data,
                fin,
                held,
            } => {
                if let Some(tx) = inbound.get(&stream) {
                    let _ = tx.send((data, fin, held)).await;
                    if fin {
                        inbound.remove(&stream);
                    }
                }
            }
            Event::Reset { stream } => {
                inbound.remove(&stream);
            }
        }
    }
}

/// One forwarded connection.
async fn forward(
    backend: Arc<dyn Backend>,
    sandbox_id: String,
    port: Option<u16>,
    data: u32,
    error: u32,
    mut inbound: mpsc::Receiver<(Vec<u8>, bool, Held)>,
    out: mpsc::Sender<Frame>,
) {
    let fail = |message: String| {
        let out = out.clone();
        async move {
            send_data(&out, error, message.into_bytes(), true).await;
            send_data(&out, data, Vec::new(), true).await;
        }
    };
    let Some(port) = port else {
        fail("the port header is missing or not a port number".into()).await;
        return;
    };
    let conn = match backend.dial(sandbox_id.clone(), port).await {
        Ok(c) => c,
        Err(e) => {
            fail(format!(
                "error forwarding port {port} to pod {sandbox_id}: {e}"
            ))
            .await;
            return;
        }
    };
    let (mut r, mut w) = conn.into_split();
    let to_pod = async move {
        while let Some((bytes, fin, _held)) = inbound.recv().await {
            if !bytes.is_empty() && w.write_all(&bytes).await.is_err() {
                break;
            }
            if fin {
                break;
            }
        }
        let _ = w.shutdown().await;
    };
    let from_pod = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => send_data(&out, data, buf[..n].to_vec(), false).await,
            }
        }
        send_data(&out, data, Vec::new(), true).await;
    };
    tokio::join!(to_pod, from_pod);
    send_data(&out, error, Vec::new(), true).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_and_resizes() {
        let ok: serde_json::Value = serde_json::from_slice(&exit_status(Ok(0))).unwrap();
        assert_eq!(ok["status"], "Success");
        let three: serde_json::Value = serde_json::from_slice(&exit_status(Ok(3))).unwrap();
        assert_eq!(three["details"]["causes"][0]["reason"], "ExitCode");
        assert_eq!(three["details"]["causes"][0]["message"], "3");
        assert_eq!(exit_text(&Ok(0)), None);
        let mut r = Resizes::default();
        assert_eq!(r.feed(br#"{"Width":80,"Height":24}{"Wid"#), vec![(80, 24)]);
        assert_eq!(r.feed(br#"th":100,"Height":50}"#), vec![(100, 50)]);
        assert_eq!(r.feed(b"not json at all"), vec![]);
        assert_eq!(r.feed(br#"{"Width":1,"Height":2}"#), vec![(1, 2)]);
    }

    #[test]
    fn a_terminals_first_lone_nul_is_the_clients_eof_marker() {
        assert_eq!(Stdin::new(true).pass(&[0]), b"");
        assert_eq!(Stdin::new(false).pass(&[0]), [0]);
        assert_eq!(Stdin::new(true).pass(&[0, b'a']), [0, b'a']);
        assert_eq!(Stdin::new(true).pass(b"ls\n"), b"ls\n");
        // Only the very first data: a NUL after anything else is the user's.
        let mut later = Stdin::new(true);
        assert_eq!(later.pass(b""), b"");
        assert_eq!(later.pass(&[0]), b"");
        let mut typed = Stdin::new(true);
        assert_eq!(typed.pass(b"a"), b"a");
        assert_eq!(typed.pass(&[0]), [0]);
    }
}
