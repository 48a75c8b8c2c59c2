//! ttrpc, as NRI speaks it over one plugin's trunk: the runtime is a ttrpc client on
//! PLUGIN_CONN (unary calls matched to answers by stream id, each with a timeout) and a ttrpc
//! server on RUNTIME_CONN (each request handed to a `Serve`, concurrently, and answered with
//! the same stream id); a plugin built on this crate takes the other end, with the roles
//! swapped (`Trunk::plugin_side`). This file owns the trunk's tasks, ttrpc's Request/Response protobufs
//! and the trunk's end: when it ends, every call waiting on it fails at once. The bytes on the
//! socket are `mux`'s. Uses tokio and prost.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use prost::Message;
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

use super::mux::{self, Demux, Header, MESSAGE_LENGTH_MAX, MuxError, PLUGIN_CONN, RUNTIME_CONN};

/// gRPC status codes used here.
pub const UNIMPLEMENTED: i32 = 12;
const UNKNOWN: i32 = 2;
const INVALID_ARGUMENT: i32 = 3;
const DEADLINE_EXCEEDED: i32 = 4;
const RESOURCE_EXHAUSTED: i32 = 8;

const TYPE_REQUEST: u8 = 1;
const TYPE_RESPONSE: u8 = 2;
/// A unary request: the caller sends nothing more on its stream.
const FLAG_REMOTE_CLOSED: u8 = 0x1;

/// Requests from one plugin served at once; past this the trunk stops reading, so a plugin
/// flooding requests cannot make the runtime hold an unbounded number of them.
const MAX_SERVING: usize = 64;
/// Framed messages waiting for the writer.
const OUT_QUEUE: usize = 64;

/// How a call or a served request failed, as ttrpc carries it (google.rpc.Status).
#[derive(Debug, Clone)]
pub struct Status {
    pub code: i32,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connection closed")]
    Closed,
    #[error("{method}: no answer within {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    #[error("{method}: {message} (code {code})")]
    Failed {
        method: String,
        code: i32,
        message: String,
    },
    #[error("protocol error: {reason}")]
    Protocol { reason: String },
}

/// What the runtime serves on RUNTIME_CONN.
pub trait Serve: Send + Sync + 'static {
    fn serve(
        &self,
        service: String,
        method: String,
        payload: Bytes,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>>;
}

/// ttrpc's own messages (its `request.proto`, and google.rpc.Status).
mod wire {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Request {
        #[prost(string, tag = "1")]
        pub service: String,
        #[prost(string, tag = "2")]
        pub method: String,
        #[prost(bytes = "bytes", tag = "3")]
        pub payload: bytes::Bytes,
        #[prost(int64, tag = "4")]
        pub timeout_nano: i64,
        #[prost(message, repeated, tag = "5")]
        pub metadata: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(string, tag = "2")]
        pub value: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Response {
        #[prost(message, optional, tag = "1")]
        pub status: Option<Status>,
        #[prost(bytes = "vec", tag = "2")]
        pub payload: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(int32, tag = "1")]
        pub code: i32,
        #[prost(string, tag = "2")]
        pub message: String,
        #[prost(message, repeated, tag = "3")]
        pub details: Vec<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Any {
        #[prost(string, tag = "1")]
        pub type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }
}

/// A response carrying `code` (0 for success) and `payload`, encoded.
fn response(code: i32, message: String, payload: Vec<u8>) -> Vec<u8> {
    let status = wire::Status {
        code,
        message,
        details: Vec::new(),
    };
    let status = Some(status);
    wire::Response { status, payload }.encode_to_vec()
}

type Answer = oneshot::Sender<Result<wire::Response, CallError>>;

/// Calls waiting for answers; `open` turns false once, when the trunk ends.
struct Pending {
    open: bool,
    next_stream: u64,
    calls: HashMap<u32, Answer>,
}

struct Shared {
    /// The connection this side calls on and the one it serves.
    calls_on: u32,
    serves_on: u32,
    pending: Mutex<Pending>,
    out: mpsc::Sender<Bytes>,
    ended: watch::Sender<bool>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ends the trunk: waiting calls fail (their senders drop) and the tasks stop.
    fn end(&self) {
        {
            let mut pending = self.pending();
            pending.open = false;
            pending.calls.clear();
        }
        self.ended.send_replace(true);
    }

    async fn wait_ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }

    /// Hands an answer to the call waiting for it, if it still waits.
    fn answer(&self, header: Header, payload: Bytes) {
        if header.kind != TYPE_RESPONSE {
            return;
        }
        let Some(call) = self.pending().calls.remove(&header.stream_id) else {
            tracing::debug!(stream = header.stream_id, "NRI: answer for no waiting call");
            return;
        };
        let resp = wire::Response::decode(payload).map_err(|e| CallError::Protocol {
            reason: format!("undecodable response on stream {}: {e}", header.stream_id),
        });
        let _ = call.send(resp);
    }

    /// Answers a request served.
    async fn reply(&self, stream_id: u32, result: Result<Vec<u8>, Status>) {
        let mut resp = match result {
            Ok(payload) => response(0, String::new(), payload),
            // A failure must not read as success to the plugin.
            Err(s) if s.code == 0 => response(UNKNOWN, s.message, Vec::new()),
            Err(s) => response(s.code, s.message, Vec::new()),
        };
        if resp.len() > MESSAGE_LENGTH_MAX {
            let message = format!("response of {} bytes is too large", resp.len());
            resp = response(RESOURCE_EXHAUSTED, message, Vec::new());
        }
        let header = Header::new(stream_id, TYPE_RESPONSE, 0);
        let _ = self
            .out
            .send(mux::encode(self.serves_on, header, &resp))
            .await;
    }
}

/// Forgets a call's pending entry however the call ends (answer, timeout, or its caller
/// giving up), so a late answer finds nothing.
struct Forget<'a> {
    shared: &'a Shared,
    stream_id: u32,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.shared.pending().calls.remove(&self.stream_id);
    }
}

/// One plugin's trunk; cheap to clone.
#[derive(Clone)]
pub struct Trunk {
    shared: Arc<Shared>,
}

impl Trunk {
    /// Starts reading and writing `stream` (tokio tasks); requests on RUNTIME_CONN go to
    /// `runtime`. The trunk lives until the peer goes or `close()`.
    pub fn start(stream: tokio::net::UnixStream, runtime: Arc<dyn Serve>) -> Trunk {
        Trunk::with_roles(stream, runtime, PLUGIN_CONN, RUNTIME_CONN)
    }

    /// The plugin's end of a trunk: calls on RUNTIME_CONN, serves PLUGIN_CONN (a plugin
    /// written against this crate; the runtime never uses it).
    pub fn plugin_side(stream: tokio::net::UnixStream, plugin: Arc<dyn Serve>) -> Trunk {
        Trunk::with_roles(stream, plugin, RUNTIME_CONN, PLUGIN_CONN)
    }

    fn with_roles(
        stream: tokio::net::UnixStream,
        serve: Arc<dyn Serve>,
        calls_on: u32,
        serves_on: u32,
    ) -> Trunk {
        let (rd, wr) = stream.into_split();
        let (out, queue) = mpsc::channel(OUT_QUEUE);
        let pending = Pending {
            open: true,
            next_stream: 1,
            calls: HashMap::new(),
        };
        let shared = Arc::new(Shared {
            calls_on,
            serves_on,
            pending: Mutex::new(pending),
            out,
            ended: watch::Sender::new(false),
        });
        tokio::spawn(write_task(wr, queue, shared.clone()));
        tokio::spawn(read_task(rd, serve, shared.clone()));
        Trunk { shared }
    }

    /// A unary call to the other side. On timeout the pending entry is dropped (a late answer is
    /// ignored).
    pub async fn call<Req: prost::Message, Resp: prost::Message + Default>(
        &self,
        service: &str,
        method: &str,
        req: &Req,
        timeout: Duration,
    ) -> Result<Resp, CallError> {
        let request = wire::Request {
            service: service.into(),
            method: method.into(),
            payload: req.encode_to_vec().into(),
            // Go servers make this the handler's deadline.
            timeout_nano: i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX),
            metadata: Vec::new(),
        }
        .encode_to_vec();
        if request.len() > MESSAGE_LENGTH_MAX {
            let reason = format!("{method}: request of {} bytes is too large", request.len());
            return Err(CallError::Protocol { reason });
        }
        let exchange = async {
            // A place in the writer's queue first: the id is then taken and the frames queued
            // under one lock, because the peer refuses an id lower than one it has seen
            // ("StreamID cannot be re-used and must increment") and calls run concurrently.
            let slot = self.shared.out.reserve().await;
            let slot = slot.map_err(|_| CallError::Closed)?;
            let (stream_id, answer) = self.register(method, slot, &request)?;
            let _forget = Forget {
                shared: &self.shared,
                stream_id,
            };
            answer.await.map_err(|_| CallError::Closed)?
        };
        let resp = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| CallError::Timeout {
                method: method.into(),
                timeout,
            })??;
        match resp.status {
            Some(s) if s.code != 0 => Err(CallError::Failed {
                method: method.into(),
                code: s.code,
                message: s.message,
            }),
            _ => Resp::decode(resp.payload.as_slice()).map_err(|e| CallError::Protocol {
                reason: format!("{method}: undecodable answer: {e}"),
            }),
        }
    }

    /// Takes a stream id for a new call and queues its request in `slot`; where its answer
    /// will come.
    fn register(
        &self,
        method: &str,
        slot: mpsc::Permit<'_, Bytes>,
        request: &[u8],
    ) -> Result<(u32, oneshot::Receiver<Result<wire::Response, CallError>>), CallError> {
        let mut pending = self.shared.pending();
        if !pending.open {
            return Err(CallError::Closed);
        }
        // Stream ids may not be reused, so a trunk that used them all takes no more calls.
        let stream_id = u32::try_from(pending.next_stream).map_err(|_| CallError::Protocol {
            reason: format!("{method}: stream ids exhausted"),
        })?;
        pending.next_stream += 2;
        let (tx, rx) = oneshot::channel();
        pending.calls.insert(stream_id, tx);
        let header = Header::new(stream_id, TYPE_REQUEST, FLAG_REMOTE_CLOSED);
        slot.send(mux::encode(self.shared.calls_on, header, request));
        Ok((stream_id, rx))
    }

    /// Resolves once the trunk has ended (EOF, error, or close()).
    pub async fn closed(&self) {
        self.shared.wait_ended().await;
    }

    /// Ends the trunk: pending and later calls fail with Closed; the socket is shut down.
    pub fn close(&self) {
        self.shared.end();
    }
}

async fn write_task(mut wr: OwnedWriteHalf, mut queue: mpsc::Receiver<Bytes>, shared: Arc<Shared>) {
    let write = async {
        while let Some(frames) = queue.recv().await {
            wr.write_all(&frames).await?;
        }
        Ok::<_, std::io::Error>(())
    };
    let result = tokio::select! {
        r = write => r,
        _ = shared.wait_ended() => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "NRI: writing to a plugin's trunk");
    }
    shared.end();
    // Calls still queueing fail now rather than wait for their timeout.
    drop(queue);
    let _ = wr.shutdown().await;
}

async fn read_task(rd: OwnedReadHalf, runtime: Arc<dyn Serve>, shared: Arc<Shared>) {
    let result = tokio::select! {
        r = read_loop(rd, runtime, &shared) => r,
        _ = shared.wait_ended() => Ok(()),
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "NRI: reading a plugin's trunk");
    }
    shared.end();
}

async fn read_loop(
    rd: OwnedReadHalf,
    runtime: Arc<dyn Serve>,
    shared: &Arc<Shared>,
) -> Result<(), MuxError> {
    let mut rd = BufReader::new(rd);
    let mut demux = Demux::new(&[PLUGIN_CONN, RUNTIME_CONN]);
    let mut server = Server {
        runtime,
        shared: shared.clone(),
        last_stream: 0,
        slots: Arc::new(Semaphore::new(MAX_SERVING)),
    };
    while let Some((conn, payload)) = mux::read_frame(&mut rd).await? {
        for (header, payload) in demux.push(conn, &payload)? {
            if conn == shared.calls_on {
                shared.answer(header, payload);
            } else {
                server.request(header, payload).await;
            }
        }
    }
    Ok(())
}

/// The ttrpc server on the connection served.
struct Server {
    runtime: Arc<dyn Serve>,
    shared: Arc<Shared>,
    last_stream: u32,
    slots: Arc<Semaphore>,
}

impl Server {
    /// Starts serving one request; waits only when MAX_SERVING are already being served.
    async fn request(&mut self, header: Header, payload: Bytes) {
        // Data messages belong to streaming calls, which NRI has none of.
        if header.kind != TYPE_REQUEST {
            return;
        }
        let stream_id = header.stream_id;
        // As ttrpc's server: client streams are odd and never go back.
        if stream_id % 2 != 1 || stream_id <= self.last_stream {
            let reason = format!("stream id {stream_id} is not odd and increasing");
            return self.refuse(stream_id, reason).await;
        }
        self.last_stream = stream_id;
        let req = match wire::Request::decode(payload) {
            Ok(r) => r,
            Err(e) => {
                return self
                    .refuse(stream_id, format!("undecodable request: {e}"))
                    .await;
            }
        };
        let Ok(slot) = self.slots.clone().acquire_owned().await else {
            return;
        };
        let runtime = self.runtime.clone();
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_one(runtime, &shared, stream_id, req).await;
        });
    }

    async fn refuse(&self, stream_id: u32, message: String) {
        tracing::debug!(
            stream = stream_id,
            message,
            "NRI: refused a plugin's request"
        );
        let status = Status {
            code: INVALID_ARGUMENT,
            message,
        };
        self.shared.reply(stream_id, Err(status)).await;
    }
}

/// Runs one handler within the caller's deadline and answers; gives up if the trunk ends.
async fn serve_one(runtime: Arc<dyn Serve>, shared: &Shared, stream_id: u32, req: wire::Request) {
    let method = format!("{}/{}", req.service, req.method);
    let work = runtime.serve(req.service, req.method, req.payload);
    // The runtime keeps a plugin's deadline; a plugin's end leaves it to its handlers (a
    // scripted plugin must be able to stay silent past it).
    let deadline = u64::try_from(req.timeout_nano)
        .ok()
        .filter(|_| shared.serves_on == RUNTIME_CONN)
        .filter(|n| *n > 0)
        .map(Duration::from_nanos);
    let answer = async {
        let Some(deadline) = deadline else {
            return work.await;
        };
        tokio::time::timeout(deadline, work)
            .await
            .unwrap_or_else(|_| {
                let message = format!("{method}: deadline of {deadline:?} exceeded");
                Err(Status {
                    code: DEADLINE_EXCEEDED,
                    message,
                })
            })
    };
    let result = tokio::select! {
        r = answer => r,
        _ = shared.wait_ended() => return,
    };
    shared.reply(stream_id, result).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;
    use tokio::net::UnixStream;
    use tokio::sync::Notify;
    use tokio::task::JoinHandle;
    use wire::KeyValue;

    const LONG: Duration = Duration::from_secs(10);

    /// Serves "Echo" and "Slow" (answers once `gate` is notified); nothing else.
    struct TestRuntime {
        gate: Arc<Notify>,
    }

    impl Serve for TestRuntime {
        fn serve(
            &self,
            service: String,
            method: String,
            payload: Bytes,
        ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, Status>> + Send>> {
            let gate = self.gate.clone();
            Box::pin(async move {
                match (service.as_str(), method.as_str()) {
                    ("test.Runtime", "Echo") => Ok(payload.to_vec()),
                    ("test.Runtime", "Slow") => {
                        gate.notified().await;
                        Ok(b"slow".to_vec())
                    }
                    _ => Err(Status {
                        code: UNIMPLEMENTED,
                        message: format!("{service}/{method}"),
                    }),
                }
            })
        }
    }

    /// The plugin's end of the trunk, spoken with `mux`'s codec.
    struct FakePlugin {
        stream: UnixStream,
        demux: Demux,
        ready: VecDeque<(u32, Header, Bytes)>,
    }

    impl FakePlugin {
        /// The next message and its conn; `None` once the runtime has closed the trunk.
        async fn next(&mut self) -> Option<(u32, Header, Bytes)> {
            while self.ready.is_empty() {
                let (conn, payload) = mux::read_frame(&mut self.stream).await.unwrap()?;
                let msgs = self.demux.push(conn, &payload).unwrap();
                self.ready
                    .extend(msgs.into_iter().map(|(h, p)| (conn, h, p)));
            }
            self.ready.pop_front()
        }

        async fn send(&mut self, conn: u32, header: Header, payload: &[u8]) {
            let frames = mux::encode(conn, header, payload);
            self.stream.write_all(&frames).await.unwrap();
        }

        /// Reads a call made on PLUGIN_CONN: its stream id and request.
        async fn take_call(&mut self) -> (u32, wire::Request) {
            let (conn, header, payload) = self.next().await.unwrap();
            assert_eq!(conn, PLUGIN_CONN);
            assert_eq!(
                (header.kind, header.flags),
                (TYPE_REQUEST, FLAG_REMOTE_CLOSED)
            );
            (header.stream_id, wire::Request::decode(payload).unwrap())
        }

        async fn answer(&mut self, stream_id: u32, code: i32, payload: &impl Message) {
            let resp = response(code, format!("code {code}"), payload.encode_to_vec());
            let header = Header::new(stream_id, TYPE_RESPONSE, 0);
            self.send(PLUGIN_CONN, header, &resp).await;
        }

        /// Sends a request to the runtime on RUNTIME_CONN.
        async fn request(&mut self, stream_id: u32, method: &str, body: &[u8]) {
            let req = wire::Request {
                service: "test.Runtime".into(),
                method: method.into(),
                payload: Bytes::copy_from_slice(body),
                ..Default::default()
            };
            let header = Header::new(stream_id, TYPE_REQUEST, FLAG_REMOTE_CLOSED);
            self.send(RUNTIME_CONN, header, &req.encode_to_vec()).await;
        }

        /// Calls the runtime; returns the answer's header and response.
        async fn call(
            &mut self,
            stream_id: u32,
            method: &str,
            body: &[u8],
        ) -> (Header, wire::Response) {
            self.request(stream_id, method, body).await;
            let (conn, header, payload) = self.next().await.unwrap();
            assert_eq!(conn, RUNTIME_CONN);
            (header, wire::Response::decode(payload).unwrap())
        }
    }

    fn pair() -> (Trunk, FakePlugin, Arc<Notify>) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let gate = Arc::new(Notify::new());
        let runtime = Arc::new(TestRuntime { gate: gate.clone() });
        let plugin = FakePlugin {
            stream: theirs,
            demux: Demux::new(&[PLUGIN_CONN, RUNTIME_CONN]),
            ready: VecDeque::new(),
        };
        (Trunk::start(ours, runtime), plugin, gate)
    }

    fn kv(value: &str) -> KeyValue {
        KeyValue {
            key: "k".into(),
            value: value.into(),
        }
    }

    /// Starts a call of `method` on the plugin service in a task.
    fn spawn_call(
        trunk: &Trunk,
        method: &'static str,
        timeout: Duration,
    ) -> JoinHandle<Result<KeyValue, CallError>> {
        let trunk = trunk.clone();
        tokio::spawn(async move {
            trunk
                .call("test.Plugin", method, &kv(method), timeout)
                .await
        })
    }

    async fn within<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(LONG, f).await.unwrap()
    }

    async fn outcome(call: JoinHandle<Result<KeyValue, CallError>>) -> Result<KeyValue, CallError> {
        within(call).await.unwrap()
    }

    #[tokio::test]
    async fn call_answered() {
        let (trunk, mut plugin, _) = pair();
        let call = spawn_call(&trunk, "Configure", Duration::from_secs(3));
        let (stream_id, req) = plugin.take_call().await;
        assert_eq!(stream_id, 1);
        assert_eq!(
            (req.service.as_str(), req.method.as_str()),
            ("test.Plugin", "Configure")
        );
        assert_eq!(req.timeout_nano, 3_000_000_000);
        assert_eq!(KeyValue::decode(req.payload).unwrap(), kv("Configure"));
        plugin.answer(1, 0, &kv("done")).await;
        assert_eq!(outcome(call).await.unwrap(), kv("done"));

        let call = spawn_call(&trunk, "Synchronize", LONG);
        let (stream_id, _) = plugin.take_call().await;
        assert_eq!(stream_id, 3);
        plugin.answer(3, 9, &kv("")).await;
        let err = outcome(call).await.unwrap_err();
        assert!(
            matches!(err, CallError::Failed { code: 9, ref method, .. } if method == "Synchronize")
        );
    }

    #[tokio::test]
    async fn call_times_out_and_late_answer_ignored() {
        let (trunk, mut plugin, _) = pair();
        let call = spawn_call(&trunk, "Slow", Duration::from_millis(50));
        let (stream_id, _) = plugin.take_call().await;
        let err = outcome(call).await.unwrap_err();
        assert!(matches!(err, CallError::Timeout { ref method, .. } if method == "Slow"));
        assert!(trunk.shared.pending().calls.is_empty());

        plugin.answer(stream_id, 0, &kv("late")).await;
        let call = spawn_call(&trunk, "Next", LONG);
        let (next_id, _) = plugin.take_call().await;
        assert_eq!(next_id, 3);
        plugin.answer(next_id, 0, &kv("on time")).await;
        assert_eq!(outcome(call).await.unwrap(), kv("on time"));
    }

    /// Calls made at once from many threads reach the plugin with increasing stream ids (Go's
    /// ttrpc server refuses a lower id than one it has seen, failing that call).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_calls_keep_stream_ids_increasing() {
        const CALLS: usize = 400;
        let (trunk, mut plugin, _) = pair();
        let calls: Vec<_> = (0..CALLS)
            .map(|_| spawn_call(&trunk, "CreateContainer", LONG))
            .collect();
        let mut last = 0;
        for _ in 0..CALLS {
            let (stream_id, _) = within(plugin.take_call()).await;
            assert!(stream_id > last, "stream id {stream_id} after {last}");
            last = stream_id;
            plugin.answer(stream_id, 0, &kv("done")).await;
        }
        for call in calls {
            assert_eq!(outcome(call).await.unwrap(), kv("done"));
        }
    }

    #[tokio::test]
    async fn runtime_conn_served() {
        let (_trunk, mut plugin, _) = pair();
        let (header, resp) = plugin.call(1, "Nope", b"").await;
        assert_eq!(header, Header::new(1, TYPE_RESPONSE, 0));
        let status = resp.status.unwrap();
        assert_eq!(status.code, UNIMPLEMENTED);
        assert_eq!(status.message, "test.Runtime/Nope");

        let (header, resp) = plugin.call(3, "Echo", b"hello").await;
        assert_eq!(header.stream_id, 3);
        assert_eq!(resp.status.unwrap().code, 0);
        assert_eq!(resp.payload, b"hello");

        // A reused stream id is refused, as ttrpc's server refuses it.
        let (header, resp) = plugin.call(3, "Echo", b"again").await;
        assert_eq!(header.stream_id, 3);
        assert_eq!(resp.status.unwrap().code, INVALID_ARGUMENT);
    }

    #[tokio::test]
    async fn slow_handler_does_not_block_calls() {
        let (trunk, mut plugin, gate) = pair();
        plugin.request(1, "Slow", b"").await;
        let call = spawn_call(&trunk, "Configure", LONG);
        let (stream_id, _) = plugin.take_call().await;
        plugin.answer(stream_id, 0, &kv("fast")).await;
        assert_eq!(outcome(call).await.unwrap(), kv("fast"));

        gate.notify_one();
        let (conn, header, payload) = within(plugin.next()).await.unwrap();
        assert_eq!((conn, header.stream_id), (RUNTIME_CONN, 1));
        assert_eq!(wire::Response::decode(payload).unwrap().payload, b"slow");
    }

    #[tokio::test]
    async fn peer_close_fails_pending_calls() {
        let (trunk, mut plugin, _) = pair();
        let call = spawn_call(&trunk, "Configure", LONG);
        plugin.take_call().await;
        drop(plugin);
        assert!(matches!(outcome(call).await, Err(CallError::Closed)));
        within(trunk.closed()).await;
        let err = trunk.call::<_, KeyValue>("s", "m", &kv("x"), LONG).await;
        assert!(matches!(err, Err(CallError::Closed)));
    }

    #[tokio::test]
    async fn close_fails_pending_calls_and_ends_socket() {
        let (trunk, mut plugin, _) = pair();
        let call = spawn_call(&trunk, "Configure", LONG);
        plugin.take_call().await;
        trunk.close();
        assert!(matches!(outcome(call).await, Err(CallError::Closed)));
        within(trunk.closed()).await;
        assert!(within(plugin.next()).await.is_none());
    }

    #[tokio::test]
    async fn oversized_messages_refused() {
        let (trunk, mut plugin, _) = pair();
        let big = kv(&"x".repeat(MESSAGE_LENGTH_MAX));
        let err = trunk.call::<_, KeyValue>("s", "m", &big, LONG).await;
        assert!(matches!(err, Err(CallError::Protocol { .. })));

        // One coming in ends the trunk.
        let call = spawn_call(&trunk, "Configure", LONG);
        plugin.take_call().await;
        let mut header = ((MESSAGE_LENGTH_MAX + 1) as u32).to_be_bytes().to_vec();
        header.extend_from_slice(&[0, 0, 0, 1, TYPE_RESPONSE, 0]);
        let frame = mux::frames(PLUGIN_CONN, &header);
        plugin.stream.write_all(&frame).await.unwrap();
        assert!(matches!(outcome(call).await, Err(CallError::Closed)));
        within(trunk.closed()).await;
    }
}
