//! Real TCP traffic inside namespaces: an echo server, round trips, a long-lived stream.
//! Threads enter a namespace with setns and end with their work, so the test's own
//! threads never change namespace. Every loop is bounded in time.

use std::{
    fs::File,
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::{AsFd, AsRawFd},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread::{self, JoinHandle},
    time::{Duration, Instant},
};

use nix::sched::{CloneFlags, setns};

use crate::netns::Netns;

/// The longest any helper here keeps a thread alive.
const MAX_LIFETIME: Duration = Duration::from_secs(60);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `work` on a new thread inside `netns`.
pub fn spawn_in<T, F>(netns: &Netns, work: F) -> JoinHandle<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let file = File::open(netns.path()).expect("cannot open the netns file");
    thread::spawn(move || {
        setns(file.as_fd(), CloneFlags::CLONE_NEWNET).expect("setns failed");
        work()
    })
}

/// Runs `work` inside `netns` and waits for it.
pub fn run_in<T, F>(netns: &Netns, work: F) -> T
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    spawn_in(netns, work)
        .join()
        .expect("the netns thread panicked")
}

/// A TCP echo server in a namespace, stopped on drop.
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    received: Arc<AtomicU64>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    accept: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Listens on `0.0.0.0:port` inside `netns`; returns once it is bound.
    pub fn start(netns: &Netns, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (bound, ready) = mpsc::channel();
        let (stop_flag, counter, seen) =
            (Arc::clone(&stop), Arc::clone(&received), Arc::clone(&peers));
        let accept = spawn_in(netns, move || {
            let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            bound.send(()).expect("ready signal");
            let deadline = Instant::now() + MAX_LIFETIME;
            while !stop_flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, peer)) => {
                        seen.lock().expect("peers lock").push(peer);
                        let _ = stream.set_nonblocking(false);
                        let (stop_flag, counter) = (Arc::clone(&stop_flag), Arc::clone(&counter));
                        thread::spawn(move || echo(stream, &stop_flag, &counter));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(1)),
                }
            }
        });
        ready
            .recv_timeout(IO_TIMEOUT)
            .expect("the echo server did not bind");
        Self {
            stop,
            received,
            peers,
            accept: Some(accept),
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

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn echo(mut stream: TcpStream, stop: &AtomicBool, received: &AtomicU64) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let deadline = Instant::now() + MAX_LIFETIME;
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
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// Connects from inside `netns` to `to`, sends `payload`, returns what came back.
pub fn round_trip(netns: &Netns, to: SocketAddr, payload: &[u8]) -> Result<Vec<u8>, String> {
    let payload = payload.to_vec();
    run_in(netns, move || {
        let mut stream = TcpStream::connect_timeout(&to, IO_TIMEOUT)
            .map_err(|e| format!("connect {to}: {e}"))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(&payload)
            .map_err(|e| format!("write: {e}"))?;
        let mut back = vec![0u8; payload.len()];
        stream
            .read_exact(&mut back)
            .map_err(|e| format!("read: {e}"))?;
        let _ = stream.shutdown(Shutdown::Both);
        Ok(back)
    })
}

/// A client that keeps sending to an echo server until stopped, and reads the echo back.
pub struct Stream {
    stop: Arc<AtomicBool>,
    echoed: Arc<AtomicU64>,
    worker: Option<JoinHandle<Result<(), String>>>,
}

impl Stream {
    pub fn start(netns: &Netns, to: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let echoed = Arc::new(AtomicU64::new(0));
        let (stop_flag, counter) = (Arc::clone(&stop), Arc::clone(&echoed));
        let worker = spawn_in(netns, move || {
            let mut stream = TcpStream::connect_timeout(&to, IO_TIMEOUT)
                .map_err(|e| format!("connect {to}: {e}"))?;
            stream
                .set_read_timeout(Some(IO_TIMEOUT))
                .map_err(|e| e.to_string())?;
            let chunk = [0x5au8; 1024];
            let mut back = [0u8; 1024];
            let deadline = Instant::now() + MAX_LIFETIME;
            while !stop_flag.load(Ordering::Relaxed) && Instant::now() < deadline {
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
        Self {
            stop,
            echoed,
            worker: Some(worker),
        }
    }

    /// Bytes sent and echoed back so far.
    pub fn echoed(&self) -> u64 {
        self.echoed.load(Ordering::Relaxed)
    }

    /// Stops the stream; returns the first error it met, if any.
    pub fn finish(mut self) -> Result<(), String> {
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take().map_or(Ok(()), |worker| {
            worker.join().unwrap_or_else(|_| Err("panicked".into()))
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// A UDP echo server in a namespace that records who sent, stopped on drop.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    worker: Option<JoinHandle<()>>,
}

impl UdpEcho {
    pub fn start(netns: &Netns, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (bound, ready) = mpsc::channel();
        let (stop_flag, seen) = (Arc::clone(&stop), Arc::clone(&peers));
        let worker = spawn_in(netns, move || {
            let socket = UdpSocket::bind(("0.0.0.0", port)).expect("bind");
            socket
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            bound.send(()).expect("ready signal");
            let deadline = Instant::now() + MAX_LIFETIME;
            let mut buffer = [0u8; 2048];
            while !stop_flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((n, peer)) = socket.recv_from(&mut buffer) {
                    seen.lock().expect("peers lock").push(peer);
                    let _ = socket.send_to(&buffer[..n], peer);
                }
            }
        });
        ready
            .recv_timeout(IO_TIMEOUT)
            .expect("the UDP server did not bind");
        Self {
            stop,
            peers,
            worker: Some(worker),
        }
    }

    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers lock").clone()
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Sends `payload` from `from_port` (0: any) inside `netns` to `to` and waits for an
/// answer; `Err` carries the socket error (for example "connection refused" when an
/// ICMP port unreachable came back).
pub fn udp_round_trip(
    netns: &Netns,
    from_port: u16,
    to: SocketAddr,
    payload: &[u8],
) -> Result<Vec<u8>, std::io::Error> {
    let payload = payload.to_vec();
    run_in(netns, move || {
        let socket = UdpSocket::bind(("0.0.0.0", from_port))?;
        socket.connect(to)?;
        socket.set_read_timeout(Some(Duration::from_secs(2)))?;
        socket.send(&payload)?;
        let mut buffer = vec![0u8; 2048];
        let n = socket.recv(&mut buffer)?;
        buffer.truncate(n);
        Ok(buffer)
    })
}

/// Opens `count` TCP connections from `netns` to `to` and keeps them open, then
/// exchanges a line on each and closes them all; returns how many echoed correctly.
pub fn many_connections(netns: &Netns, to: SocketAddr, count: usize) -> Result<usize, String> {
    run_in(netns, move || {
        let mut streams = Vec::with_capacity(count);
        for n in 0..count {
            let stream = TcpStream::connect_timeout(&to, IO_TIMEOUT)
                .map_err(|e| format!("connection {n}: {e}"))?;
            stream
                .set_read_timeout(Some(IO_TIMEOUT))
                .map_err(|e| e.to_string())?;
            streams.push(stream);
        }
        let mut echoed = 0;
        for (n, stream) in streams.iter_mut().enumerate() {
            let line = format!("connection {n}\n").into_bytes();
            stream
                .write_all(&line)
                .map_err(|e| format!("write {n}: {e}"))?;
            let mut back = vec![0u8; line.len()];
            stream
                .read_exact(&mut back)
                .map_err(|e| format!("read {n}: {e}"))?;
            if back == line {
                echoed += 1;
            }
        }
        Ok(echoed)
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
        let socket = nix::sys::socket::socket(
            nix::sys::socket::AddressFamily::Inet,
            nix::sys::socket::SockType::Stream,
            nix::sys::socket::SockFlag::empty(),
            None,
        )
        .map_err(|e| e.to_string())?;
        nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::ReuseAddr, &true)
            .map_err(|e| e.to_string())?;
        let local = nix::sys::socket::SockaddrIn::new(0, 0, 0, 0, from_port);
        nix::sys::socket::bind(socket.as_raw_fd(), &local)
            .map_err(|e| format!("bind {from_port}: {e}"))?;
        let mut stream = TcpStream::from(socket);
        let remote = nix::sys::socket::SockaddrIn::from(match to {
            SocketAddr::V4(v4) => v4,
            SocketAddr::V6(_) => return Err("IPv4 only".into()),
        });
        nix::sys::socket::connect(stream.as_raw_fd(), &remote)
            .map_err(|e| format!("connect {to}: {e}"))?;
        stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .map_err(|e| e.to_string())?;
        stream
            .write_all(&payload)
            .map_err(|e| format!("write: {e}"))?;
        let mut back = vec![0u8; payload.len()];
        stream
            .read_exact(&mut back)
            .map_err(|e| format!("read: {e}"))?;
        Ok(back)
    })
}
