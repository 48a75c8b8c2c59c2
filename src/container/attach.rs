//! Attach (CRI Attach through the streaming server): a connection to the container's monitor,
//! which owns the container's stdio, speaking `runtime::attach`'s frames. The session's stdout
//! and stderr are the monitor's output frames, its stdin and terminal sizes become frames the
//! other way. The attachment ends when the container does (the monitor closes it) or when the
//! session is dropped (the connection closes; the container keeps running).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::stream::{StreamOpts, StreamSession};
use super::{ContainerService, Duration, Error, Path, io_err, runtime};
use crate::runtime::attach::{self, AttachOpts, AttachRequest};

/// Room for output on its way to the streaming server, per stream.
const PIPE: usize = 256 << 10;

impl ContainerService {
    /// Attaches to the running container's own stdio.
    pub async fn attach_stream(&self, id: &str, opts: StreamOpts) -> Result<StreamSession, Error> {
        let cid = self.check_stream(id, &opts).await?;
        let sock = self.bundle(&cid).dir.join(runtime::MONITOR_SOCKET);
        let fail = |message: String| Error::Attach {
            id: cid.clone(),
            message,
        };
        let req = AttachRequest {
            attach: AttachOpts {
                stdin: opts.stdin,
                stdout: opts.stdout,
                stderr: opts.stderr,
            },
        };
        let mut body = serde_json::to_vec(&req).map_err(|e| fail(e.to_string()))?;
        // The monitor reads its request up to a newline (see `exec::send_request`).
        body.push(b'\n');
        let mut conn = {
            let dir = sock.parent().unwrap_or(Path::new("/"));
            let (_dir, short) =
                runtime::short_socket_path(dir, runtime::MONITOR_SOCKET).map_err(io_err(dir))?;
            tokio::net::UnixStream::connect(&short)
                .await
                .map_err(|e| fail(format!("the container's monitor does not answer ({e})")))?
        };
        conn.write_all(&body)
            .await
            .map_err(|e| fail(format!("sending the request to the monitor: {e}")))?;
        let (mut rd, mut wr) = conn.into_split();

        // The monitor's answer comes first.
        let mut inbuf = Vec::new();
        let (kind, payload) =
            tokio::time::timeout(Duration::from_secs(10), next_frame(&mut rd, &mut inbuf))
                .await
                .map_err(|_| fail("the container's monitor did not answer in 10 s".into()))?
                .map_err(|e| fail(e.to_string()))?
                .ok_or_else(|| fail("the container's monitor closed the attachment".into()))?;
        let tty = match kind {
            attach::READY => payload.first() == Some(&1),
            attach::ERROR => return Err(fail(String::from_utf8_lossy(&payload).into_owned())),
            k => return Err(fail(format!("unexpected frame {k} from the monitor"))),
        };

        // Output: frames into two pipes the streaming server reads.
        // Duplex pipes: dropping one end is the other's end of file.
        let (out_r, mut out_w) = tokio::io::duplex(PIPE);
        let (err_r, mut err_w) = tokio::io::duplex(PIPE);
        let (ended_tx, ended_rx) = oneshot::channel::<()>();
        // The writer holds its half until the attachment ends: dropping it would shut our
        // side down, which the monitor takes as the end of this attacher's input.
        let (over_tx, mut over_rx) = tokio::sync::watch::channel(false);
        let (cancel_tx, mut cancel_rx) = oneshot::channel::<()>();
        tokio::spawn(async move {
            loop {
                let frame = tokio::select! {
                    _ = &mut cancel_rx => break,
                    f = next_frame(&mut rd, &mut inbuf) => f,
                };
                let (kind, data) = match frame {
                    Ok(Some(f)) => f,
                    Ok(None) | Err(_) => break,
                };
                let to = match kind {
                    attach::STDOUT => &mut out_w,
                    attach::STDERR => &mut err_w,
                    _ => continue,
                };
                // A reader that went away leaves the others be.
                let _ = to.write_all(&data).await;
            }
            let _ = over_tx.send(true);
            let _ = ended_tx.send(());
        });

        // Input: stdin and terminal sizes as frames, written by one task.
        let (frames_tx, mut frames_rx) = mpsc::channel::<Vec<u8>>(16);
        tokio::spawn(async move {
            let mut sending = true;
            loop {
                let frame = tokio::select! {
                    f = frames_rx.recv(), if sending => f,
                    _ = over_rx.wait_for(|over| *over) => break,
                };
                match frame {
                    Some(f) => {
                        // A monitor not reading (stdin full) must not hold this past the end.
                        tokio::select! {
                            r = wr.write_all(&f) => if r.is_err() { break },
                            _ = over_rx.wait_for(|over| *over) => break,
                        }
                    }
                    None => sending = false,
                }
            }
        });
        let (service, cid2) = (self.clone(), cid.clone());
        let mut session = StreamSession {
            stdin: None,
            stdout: Some(Box::new(out_r)),
            stderr: (!tty).then(|| Box::new(err_r) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
            resize: None,
            done: Box::pin(async move {
                // Dropping the session (the client left) ends the reader, and the connection.
                let _cancel_on_drop = cancel_tx;
                let _ = ended_rx.await;
                // The monitor ends an attachment when the container ends, or when this
                // attacher fell too far behind: the container's state tells which.
                match service.check_stream(&cid2, &opts).await {
                    Ok(_) => Err(Error::Attach {
                        id: cid2,
                        message: "the container's monitor ended the attachment (the client \
                                  fell too far behind its output)"
                            .into(),
                    }),
                    Err(_) => Ok(0),
                }
            }),
        };
        if opts.stdin {
            let (stdin_r, stdin_w) = tokio::io::duplex(PIPE);
            session.stdin = Some(Box::new(stdin_w));
            let frames = frames_tx.clone();
            tokio::spawn(forward_stdin(stdin_r, frames));
        }
        if tty {
            let frames = frames_tx.clone();
            session.resize = Some(Box::new(move |w, h| {
                let mut f = Vec::new();
                attach::encode(attach::RESIZE, &attach::resize_payload(w, h), &mut f);
                // A size lost to a full queue is replaced by the next one.
                let _ = frames.try_send(f);
                Ok(())
            }));
        }
        Ok(session)
    }
}

/// Copies the client's stdin into STDIN frames, then says it ended.
async fn forward_stdin(mut from: tokio::io::DuplexStream, frames: mpsc::Sender<Vec<u8>>) {
    let mut buf = vec![0u8; attach::FRAME_MAX];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let mut f = Vec::with_capacity(n + 5);
                attach::encode(attach::STDIN, &buf[..n], &mut f);
                if frames.send(f).await.is_err() {
                    return;
                }
            }
        }
    }
    let mut f = Vec::new();
    attach::encode(attach::STDIN_END, &[], &mut f);
    let _ = frames.send(f).await;
}

/// Why the monitor's frames could not be read.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    #[error("{0}")]
    TooLong(#[from] attach::FrameTooLong),
    #[error("reading from the monitor: {0}")]
    Read(#[source] std::io::Error),
}

/// The next whole frame from the monitor; none at the end of the connection.
async fn next_frame(
    rd: &mut tokio::net::unix::OwnedReadHalf,
    buf: &mut Vec<u8>,
) -> Result<Option<(u8, Vec<u8>)>, FrameError> {
    let mut chunk = [0u8; 16 << 10];
    loop {
        if let Some(f) = attach::decode(buf)? {
            return Ok(Some(f));
        }
        match rd.read(&mut chunk).await {
            Ok(0) => return Ok(None),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(FrameError::Read(e)),
        }
    }
}
