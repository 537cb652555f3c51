//! TCP: an echo server, round trips (from any port or a chosen one), many connections
//! held open at once, and a long-lived stream.

use std::{
    io::{ErrorKind, Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, bind, connect, setsockopt, socket,
    sockopt::ReuseAddr,
};

use super::{Background, io_timeout, max_lifetime, run_in};
use crate::netns::Netns;

/// A TCP echo server in a namespace, stopped on drop.
pub struct EchoServer {
    received: Arc<AtomicU64>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    _accept: Background<()>,
}

impl EchoServer {
    /// Listens on `0.0.0.0:port` inside `netns`; returns once it is bound.
    pub fn start(netns: &Netns, port: u16) -> Self {
        Self::start_for(netns, port, max_lifetime())
    }

    /// Like [`Self::start`], listening for up to `lifetime` rather than the helpers'
    /// usual bound (for a test that probes the same servers for minutes).
    pub fn start_for(netns: &Netns, port: u16, lifetime: Duration) -> Self {
        let received = Arc::new(AtomicU64::new(0));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (bound, ready) = mpsc::channel();
        let (counter, seen) = (Arc::clone(&received), Arc::clone(&peers));
        let accept = Background::start(netns, move |stop| {
            let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            bound.send(()).expect("ready signal");
            let deadline = Instant::now() + lifetime;
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        seen.lock().expect("peers lock").push(peer);
                        let _ = stream.set_nonblocking(false);
                        let (stop, counter) = (Arc::clone(&stop), Arc::clone(&counter));
                        thread::spawn(move || echo(stream, &stop, &counter));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        ready
            .recv_timeout(io_timeout())
            .expect("the echo server did not bind");
        Self {
            received,
            peers,
            _accept: accept,
        }
    }

    /// The source address of every connection accepted so far.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers lock").clone()
    }

    /// Bytes received over all connections so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

/// Echoes one connection until EOF, an error, the stop flag or the helpers' lifetime.
fn echo(mut stream: TcpStream, stop: &AtomicBool, received: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let deadline = Instant::now() + max_lifetime();
    let mut buffer = [0u8; 16 * 1024];
    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                received.fetch_add(n as u64, Ordering::Relaxed);
                if stream.write_all(&buffer[..n]).is_err() {
                    return;
                }
            }
            Err(error) if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return,
        }
    }
}

/// Connects from inside `netns` to `to`, sends `payload`, returns what came back.
pub fn round_trip(netns: &Netns, to: SocketAddr, payload: &[u8]) -> Result<Vec<u8>, String> {
    let payload = payload.to_vec();
    run_in(netns, move || {
        let stream = TcpStream::connect_timeout(&to, io_timeout())
            .map_err(|e| format!("connect {to}: {e}"))?;
        exchange(stream, &payload)
    })
}

/// Connects from `from_port` inside `netns` to `to`, exchanges `payload`.
pub fn round_trip_from(
    netns: &Netns,
    from_port: u16,
    to: SocketAddr,
    payload: &[u8],
) -> Result<Vec<u8>, String> {
    let payload = payload.to_vec();
    run_in(netns, move || {
        let socket = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )
        .map_err(|e| e.to_string())?;
        setsockopt(&socket, ReuseAddr, &true).map_err(|e| e.to_string())?;
        let local = SockaddrIn::new(0, 0, 0, 0, from_port);
        bind(socket.as_raw_fd(), &local).map_err(|e| format!("bind {from_port}: {e}"))?;
        let stream = TcpStream::from(socket);
        let remote = SockaddrIn::from(match to {
            SocketAddr::V4(v4) => v4,
            SocketAddr::V6(_) => return Err("IPv4 only".into()),
        });
        connect(stream.as_raw_fd(), &remote).map_err(|e| format!("connect {to}: {e}"))?;
        exchange(stream, &payload)
    })
}

/// Sends `payload` on a connected `stream` and reads the same number of bytes back
/// (small payloads: the echo is read only once all is written; megabytes go with
/// `bulk`). A write that cannot go on fails after the timeout rather than hang.
fn exchange(mut stream: TcpStream, payload: &[u8]) -> Result<Vec<u8>, String> {
    stream
        .set_read_timeout(Some(io_timeout()))
        .map_err(|e| e.to_string())?;
    stream
        .set_write_timeout(Some(io_timeout()))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(payload)
        .map_err(|e| format!("write: {e}"))?;
    let mut back = vec![0u8; payload.len()];
    stream
        .read_exact(&mut back)
        .map_err(|e| format!("read: {e}"))?;
    let _ = stream.shutdown(Shutdown::Both);
    Ok(back)
}

/// Opens `count` TCP connections from `netns` to `to` and keeps them open, then
/// exchanges a line on each; returns the connections that echoed correctly, still open
/// (the caller closes them when it drops them: connections of several callers are then
/// all open at once, whichever finished first).
pub fn many_connections(
    netns: &Netns,
    to: SocketAddr,
    count: usize,
) -> Result<Vec<TcpStream>, String> {
    run_in(netns, move || {
        let mut streams = Vec::with_capacity(count);
        for n in 0..count {
            let stream = TcpStream::connect_timeout(&to, io_timeout())
                .map_err(|e| format!("connection {n}: {e}"))?;
            stream
                .set_read_timeout(Some(io_timeout()))
                .map_err(|e| e.to_string())?;
            streams.push(stream);
        }
        let mut echoed = Vec::with_capacity(count);
        for (n, mut stream) in streams.into_iter().enumerate() {
            let line = format!("connection {n}\n").into_bytes();
            stream
                .write_all(&line)
                .map_err(|e| format!("write {n}: {e}"))?;
            let mut back = vec![0u8; line.len()];
            stream
                .read_exact(&mut back)
                .map_err(|e| format!("read {n}: {e}"))?;
            if back == line {
                echoed.push(stream);
            }
        }
        Ok(echoed)
    })
}

/// A client that keeps sending to an echo server until stopped, and reads the echo back.
pub struct Stream {
    echoed: Arc<AtomicU64>,
    worker: Background<Result<(), String>>,
}

impl Stream {
    /// Connects from inside `netns` to the echo server at `to` and starts sending.
    pub fn start(netns: &Netns, to: SocketAddr) -> Self {
        let echoed = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&echoed);
        let worker = Background::start(netns, move |stop| {
            let mut stream = TcpStream::connect_timeout(&to, io_timeout())
                .map_err(|e| format!("connect {to}: {e}"))?;
            stream
                .set_read_timeout(Some(io_timeout()))
                .map_err(|e| e.to_string())?;
            let chunk = [0x5au8; 1024];
            let mut back = [0u8; 1024];
            let deadline = Instant::now() + max_lifetime();
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                stream
                    .write_all(&chunk)
                    .map_err(|e| format!("write: {e}"))?;
                stream
                    .read_exact(&mut back)
                    .map_err(|e| format!("read: {e}"))?;
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(2));
            }
            Ok(())
        });
        Self { echoed, worker }
    }

    /// Bytes sent and echoed back so far.
    pub fn echoed(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }

    /// Stops the stream; returns the first error it met, if any.
    pub fn finish(mut self) -> Result<(), String> {
        // `finish` consumes the stream, so the worker is still there: `None` only means
        // it panicked.
        self.worker
            .finish()
            .unwrap_or_else(|| Err("panicked".into()))
    }
}
