//! ExecSync: a command run in a running container by its monitor, its output read from pipes
//! the daemon hands over, with the timeout enforced by the monitor.

use super::{
    ContainerService, ContainerState, Duration, Error, ExecReport, ExecRequest, Path, PathBuf,
    invalid, io_err, runtime, state_name,
};
use tokio::io::AsyncReadExt;

/// Exec output beyond this, per stream, is dropped (probes read 10 KiB; this protects the
/// daemon). Both streams together stay well under the answer's limit (16 MiB, the CRI socket's
/// message size): a 16 MiB cap each made an answer too large to send, not a cut one.
const MAX_EXEC_OUTPUT: usize = 4 << 20;
/// How long output is still read after an exec'd command ended.
const EXEC_DRAIN: Duration = Duration::from_millis(200);

impl ContainerService {
    /// Runs a command in a running container and collects its output.
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), Error> {
        match self.run_exec_sync(id, cmd, timeout).await {
            Err(e) => Err(self.ended_under(id, e).await),
            ok => ok,
        }
    }

    /// An exec that failed because the container ended under it (its PID 1 exited, or its
    /// monitor went with it, as a stop does) is refused for the container's state, as one
    /// asked a moment later would be, not reported as the daemon's own failure.
    pub(super) async fn ended_under(&self, id: &str, e: Error) -> Error {
        if !matches!(e, Error::Exec { .. }) {
            return e;
        }
        let Ok(entry) = self.entry(id) else {
            return e;
        };
        let mut r = entry.lock().await;
        self.sync_exit(&mut r);
        // A PID 1 that is exiting has let go of its namespaces (ESRCH on joining them) before
        // it is a zombie. One that is not exiting is the command's own failure (a missing
        // binary, say), answered at once.
        match (r.state, r.init) {
            (ContainerState::Running, Some(init)) if !init.exiting() => e,
            (ContainerState::Running, _) => Error::WrongState {
                id: r.id.clone(),
                state: "exiting",
                want: "running",
            },
            (s, _) => Error::WrongState {
                id: r.id.clone(),
                state: state_name(s),
                want: "running",
            },
        }
    }

    async fn run_exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: i64,
    ) -> Result<(Vec<u8>, Vec<u8>, i32), Error> {
        if cmd.is_empty() {
            return Err(invalid("cmd", "is required"));
        }
        let cid = self.running_id(id).await?;
        let exec_err = |message: String| Error::Exec {
            id: cid.clone(),
            message,
        };
        let req = ExecRequest {
            args: cmd,
            // 0 (or less): no deadline. Seconds whose milliseconds overflow are refused, not
            // wrapped into a short deadline.
            timeout_ms: match u64::try_from(timeout) {
                Ok(0) | Err(_) => 0,
                Ok(s) => s.checked_mul(1000).ok_or_else(|| {
                    invalid("timeout", format!("{timeout} s is more than can be waited"))
                })?,
            },
            stdin: false,
            tty: false,
        };
        let body = serde_json::to_vec(&req).map_err(|e| exec_err(e.to_string()))?;
        // The command writes straight into these pipes; the monitor only starts and reaps it.
        // Its ends stay blocking (ours are made non-blocking when tokio takes them).
        let pipe = || {
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
                .map_err(|e| exec_err(format!("pipe: {e}")))
        };
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let (sock, conn) = self.connect_monitor(&cid, exec_err)?;
        {
            use std::os::fd::AsRawFd;
            send_request(&conn, &body, &[out_w.as_raw_fd(), err_w.as_raw_fd()])
                .map_err(|e| exec_err(format!("sending the command to the monitor: {e}")))?;
        }
        drop((out_w, err_w));
        conn.set_nonblocking(true).map_err(io_err(&sock))?;
        let mut conn = tokio::net::UnixStream::from_std(conn).map_err(io_err(&sock))?;
        let mut out =
            tokio::net::unix::pipe::Receiver::from_owned_fd(out_r).map_err(io_err(&sock))?;
        let mut err =
            tokio::net::unix::pipe::Receiver::from_owned_fd(err_r).map_err(io_err(&sock))?;
        let collect = async {
            let (mut o, mut e, mut report) = (Vec::new(), Vec::new(), Vec::new());
            let (mut bo, mut be, mut br) =
                (vec![0u8; 64 << 10], vec![0u8; 64 << 10], vec![0u8; 4096]);
            let (mut o_done, mut e_done) = (false, false);
            // Once the command has ended, what it wrote is already in the pipes; a background
            // child may hold them open forever, so reading stops shortly after.
            let mut ended: Option<tokio::time::Instant> = None;
            loop {
                if o_done && e_done && ended.is_some() {
                    break;
                }
                let drain = async {
                    match ended {
                        Some(t) => tokio::time::sleep_until(t + EXEC_DRAIN).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    r = out.read(&mut bo), if !o_done => match r {
                        Ok(0) | Err(_) => o_done = true,
                        Ok(n) => push_capped(&mut o, &bo[..n]),
                    },
                    r = err.read(&mut be), if !e_done => match r {
                        Ok(0) | Err(_) => e_done = true,
                        Ok(n) => push_capped(&mut e, &be[..n]),
                    },
                    r = conn.read(&mut br), if ended.is_none() => match r {
                        Ok(0) | Err(_) => ended = Some(tokio::time::Instant::now()),
                        Ok(n) => {
                            report.extend_from_slice(&br[..n]);
                            if report.ends_with(b"\n") {
                                ended = Some(tokio::time::Instant::now());
                            }
                        }
                    },
                    () = drain => break,
                }
            }
            (o, e, report)
        };
        // The monitor enforces the timeout; this guard only catches a monitor that hangs.
        let guard = if timeout > 0 {
            Duration::from_secs(timeout as u64 + 10)
        } else {
            Duration::from_secs(u64::MAX / 4)
        };
        let (o, e, report) =
            tokio::time::timeout(guard, collect)
                .await
                .map_err(|_| Error::ExecTimeout {
                    id: cid.clone(),
                    seconds: timeout,
                })?;
        let report: ExecReport = serde_json::from_slice(&report)
            .map_err(|_| exec_err("the container's monitor ended without an answer".into()))?;
        if let Some(message) = report.error {
            if report.bad_command {
                return Err(invalid("cmd", message));
            }
            return Err(exec_err(message));
        }
        if report.timed_out {
            return Err(Error::ExecTimeout {
                id: cid,
                seconds: timeout,
            });
        }
        Ok((o, e, report.exit_code))
    }
}

/// Appends output, keeping at most MAX_EXEC_OUTPUT bytes (the rest is read and dropped so the
/// writer never blocks).
pub(super) fn push_capped(buf: &mut Vec<u8>, data: &[u8]) {
    let room = MAX_EXEC_OUTPUT.saturating_sub(buf.len());
    buf.extend_from_slice(&data[..data.len().min(room)]);
}

impl ContainerService {
    /// The ID of a running container (its init recorded), else WrongState.
    pub(super) async fn running_id(&self, id: &str) -> Result<String, Error> {
        let entry = self.entry(id)?;
        let mut r = entry.lock().await;
        self.sync_exit(&mut r);
        match (r.state, r.init) {
            (ContainerState::Running, Some(_)) => Ok(r.id.clone()),
            (s, _) => Err(Error::WrongState {
                id: r.id.clone(),
                state: state_name(s),
                want: "running",
            }),
        }
    }

    /// A connection to container `cid`'s monitor, and its socket's path; `fail` words the
    /// error when the monitor does not answer.
    pub(super) fn connect_monitor(
        &self,
        cid: &str,
        fail: impl Fn(String) -> Error,
    ) -> Result<(PathBuf, std::os::unix::net::UnixStream), Error> {
        let sock = self.bundle(cid).dir.join(runtime::MONITOR_SOCKET);
        let dir = sock.parent().unwrap_or(Path::new("/"));
        let (_dir, short) =
            runtime::short_socket_path(dir, runtime::MONITOR_SOCKET).map_err(io_err(dir))?;
        let conn = connect_now(&short)
            .map_err(|e| fail(format!("the container's monitor does not answer ({e})")))?;
        Ok((sock, conn))
    }
}

/// Connects to a monitor's socket without waiting: a monitor whose queue of connections is full
/// (it is stopped, or busy) answers EAGAIN at once, where a blocking connect would hold one of
/// the daemon's few async threads until it takes the connection, however long. The stream is
/// blocking once connected.
fn connect_now(path: &Path) -> nix::Result<std::os::unix::net::UnixStream> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, connect, socket};
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &UnixAddr::new(path)?)?;
    let conn = std::os::unix::net::UnixStream::from(fd);
    conn.set_nonblocking(false).map_err(|e| {
        e.raw_os_error()
            .map_or(nix::Error::EIO, nix::Error::from_raw)
    })?;
    Ok(conn)
}

/// Sends a request to a monitor with `fds` attached (SCM_RIGHTS; none when empty), ended by a
/// newline (JSON has none of its own): the monitor reads until it, however the stream cuts it.
pub(super) fn send_request(
    conn: &std::os::unix::net::UnixStream,
    body: &[u8],
    fds: &[std::os::fd::RawFd],
) -> nix::Result<()> {
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let mut line = Vec::with_capacity(body.len() + 1);
    line.extend_from_slice(body);
    line.push(b'\n');
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(fds)];
    let cmsgs: &[nix::sys::socket::ControlMessage] = if fds.is_empty() { &[] } else { &cmsg };
    let iov = [std::io::IoSlice::new(&line)];
    let sent = nix::sys::socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &iov,
        cmsgs,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )?;
    // The descriptors went with the first piece; the rest is plain bytes.
    let mut rest = conn;
    rest.write_all(&line[sent..])
        .map_err(|e| nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_monitor_that_takes_no_connections_is_not_waited_on() {
        use nix::sys::socket::{
            AddressFamily, Backlog, SockFlag, SockType, UnixAddr, bind, listen, socket,
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.sock");
        let l = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&l),
            &UnixAddr::new(&path).unwrap(),
        )
        .unwrap();
        listen(&l, Backlog::new(1).unwrap()).unwrap();
        // Never accepted: the queue fills, and then a connect fails at once instead of waiting.
        let mut held = Vec::new();
        let refused = (0..64).find_map(|_| match super::connect_now(&path) {
            Ok(c) => {
                held.push(c);
                None
            }
            Err(e) => Some(e),
        });
        assert_eq!(refused, Some(nix::Error::EAGAIN), "{} held", held.len());
    }
}
