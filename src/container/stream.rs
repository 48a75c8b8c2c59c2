//! Streamed exec (CRI Exec through the streaming server): the command runs in the container
//! exactly as ExecSync's does, through the container's monitor, but with live stdio: pipes for
//! stdin, stdout and stderr, or a terminal the command makes inside the container's own devpts
//! whose master comes back here (resized with TIOCSWINSZ). The session ends with the exit code
//! the monitor reports; dropping it closes the command's stdio and leaves everything else be.

use std::os::fd::{AsRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{ContainerService, Duration, Error, ExecReport, ExecRequest, invalid, io_err, runtime};
use crate::sys;

/// What the client asked for: the streaming server's own options.
pub use crate::stream::Opts as StreamOpts;

/// A running exec'd command or attachment with its stdio: the streaming server's session,
/// ending in this module's error.
pub type StreamSession = crate::stream::Session<Error>;

/// A terminal master, readable and writable without blocking a thread.
#[derive(Clone)]
struct Terminal(Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for Terminal {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| {
                nix::unistd::read(fd.get_ref(), unfilled).map_err(std::io::Error::from)
            }) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // EIO: every slave descriptor is closed, the command is gone: end of output.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for Terminal {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = match self.0.poll_write_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match guard
                .try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from))
            {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// A terminal has no half-close: EOF is the terminal's EOF character (^D) at line start.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.poll_write(cx, &[4]).map(|r| r.map(drop))
    }
}

impl ContainerService {
    /// Checks what the Exec and Attach RPCs may hand out a URL for: a running container, at
    /// least one stream, and no stderr with a terminal (it has one output), as kubelet checks.
    pub async fn check_stream(&self, id: &str, opts: &StreamOpts) -> Result<String, Error> {
        if opts.tty && opts.stderr {
            return Err(invalid(
                "stderr",
                "a terminal has no separate stderr (tty and stderr)",
            ));
        }
        if !(opts.stdin || opts.stdout || opts.stderr) {
            return Err(invalid(
                "stdin",
                "one of stdin, stdout and stderr must be asked for",
            ));
        }
        self.running_id(id).await
    }

    /// Starts `cmd` in the container with live stdio.
    pub async fn exec_stream(
        &self,
        id: &str,
        cmd: Vec<String>,
        opts: StreamOpts,
    ) -> Result<StreamSession, Error> {
        match self.start_exec_stream(id, cmd, opts).await {
            Err(e) => Err(self.ended_under(id, e).await),
            ok => ok,
        }
    }

    async fn start_exec_stream(
        &self,
        id: &str,
        cmd: Vec<String>,
        opts: StreamOpts,
    ) -> Result<StreamSession, Error> {
        if cmd.is_empty() {
            return Err(invalid("cmd", "is required"));
        }
        let cid = self.check_stream(id, &opts).await?;
        let exec_err = |message: String| Error::Exec {
            id: cid.clone(),
            message,
        };
        let req = ExecRequest {
            args: cmd,
            timeout_ms: 0,
            stdin: opts.stdin && !opts.tty,
            tty: opts.tty,
        };
        let body = serde_json::to_vec(&req).map_err(|e| exec_err(e.to_string()))?;
        // The command's ends stay blocking: ours are made non-blocking when tokio takes them.
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| exec_err(format!("pipe: {e}")))
        };
        let (sock, conn) = self.connect_monitor(&cid, exec_err)?;
        let send = |fds: &[std::os::fd::RawFd]| {
            super::exec::send_request(&conn, &body, fds)
                .map_err(|e| exec_err(format!("sending the command to the monitor: {e}")))
        };
        let mut session = StreamSession {
            stdin: None,
            stdout: None,
            stderr: None,
            resize: None,
            done: Box::pin(async { Ok(0) }),
        };
        if opts.tty {
            send(&[])?;
            let master = receive_terminal(&conn)
                .await
                .map_err(|e| exec_err(e.to_string()))?;
            let fd = sys::async_fd(
                master,
                tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
            )
            .map_err(io_err(&sock))?;
            let term = Terminal(Arc::new(fd));
            if opts.stdin {
                session.stdin = Some(Box::new(term.clone()));
            }
            session.stdout = Some(Box::new(term.clone()));
            let resize_fd = term.0.clone();
            session.resize = Some(Box::new(move |w, h| {
                sys::set_window_size(resize_fd.get_ref(), w, h)
            }));
        } else {
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            let stdin = if opts.stdin { Some(pipe()?) } else { None };
            let mut fds = vec![out_w.as_raw_fd(), err_w.as_raw_fd()];
            if let Some((r, _)) = &stdin {
                fds.push(r.as_raw_fd());
            }
            send(&fds)?;
            drop((out_w, err_w));
            let recv =
                |fd| tokio::net::unix::pipe::Receiver::from_owned_fd(fd).map_err(io_err(&sock));
            let (out, err) = (recv(out_r)?, recv(err_r)?);
            // Unwanted output is read and dropped, so the command never blocks on it.
            session.stdout = Some(Box::new(out));
            session.stderr = Some(Box::new(err));
            if let Some((r, w)) = stdin {
                drop(r);
                let w = tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(io_err(&sock))?;
                session.stdin = Some(Box::new(w));
            }
        }
        conn.set_nonblocking(true).map_err(io_err(&sock))?;
        let mut conn = tokio::net::UnixStream::from_std(conn).map_err(io_err(&sock))?;
        let id2 = cid.clone();
        session.done = Box::pin(async move {
            let mut report = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut conn, &mut report).await;
            let fail = |message: String| Error::Exec {
                id: id2.clone(),
                message,
            };
            let report: ExecReport = serde_json::from_slice(&report).map_err(|_| {
                fail(
                    "the container's monitor ended without an answer (was the container killed?)"
                        .into(),
                )
            })?;
            match report.error {
                Some(message) => Err(fail(message)),
                None => Ok(report.exit_code),
            }
        });
        Ok(session)
    }
}

/// Why an exec'd command's terminal did not come back.
#[derive(Debug, thiserror::Error)]
enum TerminalError {
    #[error("{0}")]
    Connection(#[from] std::io::Error),
    #[error("waiting for the terminal: {0}")]
    Wait(#[source] nix::Error),
    #[error("{0}")]
    Descriptor(#[source] nix::Error),
    /// The monitor's report instead of a terminal: why it made none.
    #[error("{0}")]
    Refused(String),
    #[error("the command made no terminal")]
    NoTerminal,
    #[error("{0}")]
    Join(#[from] tokio::task::JoinError),
}

/// The terminal master the exec'd command hands back (see `runtime::PTY_MESSAGE`), or the
/// monitor's refusal.
async fn receive_terminal(conn: &std::os::unix::net::UnixStream) -> Result<OwnedFd, TerminalError> {
    let conn = conn.try_clone()?;
    tokio::task::spawn_blocking(move || {
        conn.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut data = [0u8; 4];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut data)];
        let msg = nix::sys::socket::recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(TerminalError::Wait)?;
        let mut fd = None;
        for c in msg.cmsgs().map_err(TerminalError::Descriptor)? {
            if let nix::sys::socket::ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    fd.get_or_insert(sys::own_received_fd(r));
                }
            }
        }
        let n = msg.bytes;
        match fd {
            Some(fd) if &data[..n] == runtime::PTY_MESSAGE => {
                nix::fcntl::fcntl(
                    &fd,
                    nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
                )
                .map_err(TerminalError::Descriptor)?;
                Ok(fd)
            }
            _ => {
                // The monitor's report instead: the rest of its line says why.
                let mut rest = data[..n].to_vec();
                let mut more = [0u8; 4096];
                let _ = std::io::Read::read(&mut &conn, &mut more).map(|m| {
                    rest.extend_from_slice(&more[..m]);
                });
                let report: Option<ExecReport> = serde_json::from_slice(&rest).ok();
                Err(report
                    .and_then(|r| r.error)
                    .map_or(TerminalError::NoTerminal, TerminalError::Refused))
            }
        }
    })
    .await?
}
