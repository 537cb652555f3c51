//! The metrics listener's connections, bounded in number and in time: at most
//! [`MAX_CONNECTIONS`] are served at once (the others wait in the listen backlog) and
//! each is closed [`CONNECTION_LIFETIME`] after it was accepted, whatever it does. A
//! client that opens connections and sends nothing (hyper sets no read timeout of its
//! own) thus cannot hold the daemon's files, nor keep the probes out for long.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Sleep,
};

/// Connections served at once: kubelet's two probes, a Prometheus or two, a person.
pub const MAX_CONNECTIONS: usize = 16;

/// How long a connection lives: a scrape answers well within it; a scraper's kept-alive
/// connection is closed after it and the scraper opens a new one.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(10);

/// A TCP listener handing out [`Bounded`] connections.
pub struct BoundedListener {
    listener: TcpListener,
    slots: Arc<Semaphore>,
}

impl BoundedListener {
    pub fn new(listener: TcpListener) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = Bounded;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // The semaphore is never closed: acquiring only waits for a connection to end.
        let slot = match Arc::clone(&self.slots).acquire_owned().await {
            Ok(slot) => slot,
            Err(_) => std::future::pending().await,
        };
        // Retries failed accepts (out of files) with a pause, as axum does.
        let (stream, address) = axum::serve::Listener::accept(&mut self.listener).await;
        let connection = Bounded {
            stream,
            deadline: Box::pin(tokio::time::sleep(CONNECTION_LIFETIME)),
            _slot: slot,
        };
        (connection, address)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// An accepted connection that fails its reads and writes once its lifetime is over
/// (which ends hyper's connection), and frees its slot when dropped.
pub struct Bounded {
    stream: TcpStream,
    deadline: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl Bounded {
    /// `Err` once the lifetime is over; otherwise registers the task to be woken then.
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the connection's lifetime is over",
            )),
            Poll::Pending => Ok(()),
        }
    }
}

impl AsyncRead for Bounded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Err(error) = self.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Bounded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Err(error) = self.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Err(error) = self.check(cx) {
            return Poll::Ready(Err(error));
        }
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
