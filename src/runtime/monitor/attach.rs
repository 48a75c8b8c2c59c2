//! Attachments to the container's own stdio (CRI Attach): the monitor reads the container's
//! output anyway (for the CRI log), so it hands every chunk to each attacher too, and writes
//! what attachers send into the container's stdin (a pipe, or the terminal). Nothing here may
//! block the monitor: attachers' sockets are non-blocking with a bounded backlog each (an
//! attacher that falls further behind is dropped; the log still gets every byte), and stdin
//! waits in a bounded buffer while the container does not read it (attachers are not read
//! meanwhile). With `stdin_once` (and no terminal, as containerd) the container's stdin closes
//! when the first attacher's stdin ends.

use super::{Duration, Errno, Monitor, OwnedFd, PollFd, PollFlags, Stream, UnixStream, sys};
use crate::runtime::attach::{self, AttachOpts};
use std::io::Write;
use std::os::fd::AsFd;

/// Output an attacher may fall behind by before it is dropped.
const BACKLOG_MAX: usize = 4 << 20;
/// Stdin buffered for a container that does not read it; attachers wait beyond this.
const STDIN_MAX: usize = 1 << 20;

pub(super) struct Attacher {
    conn: UnixStream,
    opts: AttachOpts,
    /// Frames not yet written to the attacher.
    out: Vec<u8>,
    /// Bytes of a frame not yet whole.
    inbuf: Vec<u8>,
    stdin_ended: bool,
    /// The attacher sends nothing more (it shut its side down); output still goes to it.
    input_closed: bool,
    closed: bool,
}

/// The container's stdin as attachers reach it.
pub(super) struct StdinState {
    /// The pipe's write end or the terminal's master (non-blocking); none once closed or when
    /// the container has no stdin.
    pub(super) fd: Option<OwnedFd>,
    pub(super) pending: Vec<u8>,
    pub(super) once: bool,
    /// Close it once `pending` is written (`stdin_once`).
    pub(super) closing: bool,
}

impl StdinState {
    /// Writes what it can of `pending`; closes the stdin if asked and done.
    fn flush(&mut self) {
        while let Some(fd) = &self.fd
            && !self.pending.is_empty()
        {
            match nix::unistd::write(fd, &self.pending) {
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return,
                // The container closed its stdin or is gone: what is left has nowhere to go.
                Err(_) => {
                    self.pending.clear();
                    self.fd = None;
                }
            }
        }
        if self.closing && self.pending.is_empty() {
            self.fd = None;
        }
    }
}

impl Attacher {
    /// Queues `data` as frames of `kind`; drops the attacher once too far behind.
    fn send(&mut self, kind: u8, data: &[u8]) {
        if self.closed {
            return;
        }
        attach::encode(kind, data, &mut self.out);
        self.flush();
        if self.out.len() > BACKLOG_MAX {
            eprintln!("monitor: an attacher fell more than {BACKLOG_MAX} bytes behind: dropped");
            self.closed = true;
        }
    }

    fn flush(&mut self) {
        while !self.out.is_empty() && !self.closed {
            match nix::unistd::write(&self.conn, &self.out) {
                Ok(n) => {
                    self.out.drain(..n);
                }
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return,
                Err(_) => self.closed = true,
            }
        }
    }
}

impl Monitor {
    /// A new attachment on `conn`: READY (or ERROR when the container is gone), then output.
    pub(super) fn attach(&mut self, mut conn: UnixStream, opts: AttachOpts, gone: bool) {
        let mut hello = Vec::new();
        if gone {
            attach::encode(attach::ERROR, b"the container is not running", &mut hello);
            let _ = conn.write_all(&hello);
            return;
        }
        attach::encode(
            attach::READY,
            &[u8::from(self.terminal.is_some())],
            &mut hello,
        );
        if conn.write_all(&hello).is_err() || conn.set_nonblocking(true).is_err() {
            return;
        }
        self.attachers.push(Attacher {
            conn,
            opts,
            out: Vec::new(),
            inbuf: Vec::new(),
            stdin_ended: !opts.stdin,
            input_closed: false,
            closed: false,
        });
    }

    /// Whether attachers may be read now (stdin has room).
    pub(super) fn attachers_readable(&self) -> bool {
        self.stdin.pending.len() < STDIN_MAX
    }

    /// Serves the attachers `ready` says are ready, and the container's stdin.
    pub(super) fn serve_attachers(&mut self, ready: &[PollFlags], stdin_writable: bool) {
        if stdin_writable {
            self.stdin.flush();
        }
        let mut chunk = vec![0u8; attach::FRAME_MAX];
        for (i, flags) in ready.iter().enumerate() {
            let Some(a) = self.attachers.get_mut(i) else {
                break;
            };
            if flags.contains(PollFlags::POLLOUT) {
                a.flush();
            }
            // Gone altogether: what it sent before hanging up is still read first. (A half-close
            // shows as readable, and is an end of input.)
            let hung_up = flags.intersects(PollFlags::POLLHUP | PollFlags::POLLERR);
            if !a.closed && !a.input_closed && (hung_up || flags.contains(PollFlags::POLLIN)) {
                loop {
                    match nix::unistd::read(&a.conn, &mut chunk) {
                        Ok(0) => {
                            a.input_closed = true;
                            if !a.stdin_ended {
                                a.stdin_ended = true;
                                self.stdin.closing |= self.stdin.once;
                            }
                            break;
                        }
                        Ok(n) => {
                            a.inbuf.extend_from_slice(&chunk[..n]);
                            if !hung_up || a.inbuf.len() > STDIN_MAX {
                                break;
                            }
                        }
                        Err(Errno::EINTR) => {}
                        Err(Errno::EAGAIN) => break,
                        Err(_) => {
                            a.closed = true;
                            break;
                        }
                    }
                }
            }
            if hung_up {
                a.closed = true;
            }
            loop {
                let (kind, payload) = match attach::decode(&mut a.inbuf) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => {
                        eprintln!("monitor: attacher: {e}");
                        a.closed = true;
                        break;
                    }
                };
                match kind {
                    attach::STDIN if !a.stdin_ended && self.stdin.fd.is_some() => {
                        self.stdin.pending.extend_from_slice(&payload);
                    }
                    attach::STDIN_END => {
                        a.stdin_ended = true;
                        self.stdin.closing |= self.stdin.once;
                    }
                    attach::RESIZE => {
                        if let (Some(t), Some((w, h))) =
                            (&self.terminal, attach::parse_resize(&payload))
                        {
                            let _ = sys::set_window_size(t, w, h);
                        }
                    }
                    _ => {}
                }
            }
        }
        self.drop_closed_attachers();
        self.stdin.flush();
    }

    fn drop_closed_attachers(&mut self) {
        let stdin = &mut self.stdin;
        self.attachers.retain(|a| {
            if a.closed && !a.stdin_ended {
                // A detach ends that attacher's stdin.
                stdin.closing |= stdin.once;
            }
            !a.closed
        });
    }

    /// Hands a chunk of the container's output to the attachers that want it.
    pub(super) fn fan_out(attachers: &mut [Attacher], stream: Stream, data: &[u8]) {
        for a in attachers.iter_mut() {
            match stream {
                Stream::Stdout if a.opts.stdout => a.send(attach::STDOUT, data),
                Stream::Stderr if a.opts.stderr => a.send(attach::STDERR, data),
                _ => {}
            }
        }
    }

    /// The container has ended: each attacher gets what is still queued (briefly), then its
    /// connection closes, which ends the attachment.
    pub(super) fn close_attachers(&mut self) {
        for mut a in std::mem::take(&mut self.attachers) {
            if a.closed || a.out.is_empty() {
                continue;
            }
            let _ = a.conn.set_nonblocking(false);
            let _ = a.conn.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = a.conn.write_all(&a.out);
        }
    }

    /// The descriptors the loop polls for attachments: the container's stdin while stdin waits
    /// to be written, then each attacher. Returns whether stdin was added.
    pub(super) fn attach_poll_fds<'a>(&'a self, fds: &mut Vec<PollFd<'a>>) -> bool {
        let stdin = match &self.stdin.fd {
            Some(fd) if !self.stdin.pending.is_empty() => {
                fds.push(PollFd::new(fd.as_fd(), PollFlags::POLLOUT));
                true
            }
            _ => false,
        };
        let readable = self.attachers_readable();
        for a in &self.attachers {
            let mut flags = PollFlags::empty();
            if readable && !a.input_closed {
                flags |= PollFlags::POLLIN;
            }
            if !a.out.is_empty() {
                flags |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(a.conn.as_fd(), flags));
        }
        stdin
    }
}
