//! The CRI socket's connections: at most `MAX_CONNECTIONS` at once (a client past that waits in
//! the socket's backlog until another leaves), each with its header blocks filtered
//! (`authority`) and held to its `MAX_BLOCK` bytes while they are collected. gRPC servers
//! bound both; without them each half-sent header block held up to a MiB, with no end to their
//! number. Uses `authority` and tokio only.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;

use super::authority::AuthorityFilter;

/// Connections served at once: kubelet keeps one or two, a crictl call one, but critest opens
/// two for each of its specs and closes none (some 300 over a run).
pub const MAX_CONNECTIONS: usize = 1024;

/// The most header bytes a call may send (h2 refuses a longer list): kubelet's are well under
/// a KiB.
pub const HEADER_LIST_MAX: u32 = 64 * 1024;

/// A connection that holds its place among the `MAX_CONNECTIONS` until it is dropped.
pub struct Counted<S> {
    inner: S,
    _place: OwnedSemaphorePermit,
}

/// The accepted connections of `listener`, no more than `MAX_CONNECTIONS` open at once.
pub fn incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<Counted<AuthorityFilter<UnixStream>>>> {
    let places = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    futures_util::stream::unfold((listener, places), |(listener, places)| async move {
        // The semaphore is never closed, so a place always comes.
        let place = places.clone().acquire_owned().await.ok()?;
        loop {
            match listener.accept().await {
                Ok((s, _)) => {
                    let conn = Counted {
                        inner: AuthorityFilter::new(s),
                        _place: place,
                    };
                    return Some((Ok(conn), (listener, places)));
                }
                // Out of descriptors or memory for a moment: the server goes on, as Go's
                // does, after a pause.
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a CRI connection");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    })
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
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

impl<S: Connected> Connected for Counted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
