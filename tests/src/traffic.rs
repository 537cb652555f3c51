//! Real TCP traffic inside namespaces: an echo server, round trips, a long-lived stream.
//! Threads enter a namespace with setns and end with their work, so the test's own
//! threads never change namespace. Every loop is bounded in time.

use std::{
    fs::File,
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd,
    sync::{
        Arc,
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
    accept: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Listens on `0.0.0.0:port` inside `netns`; returns once it is bound.
    pub fn start(netns: &Netns, port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicU64::new(0));
        let (bound, ready) = mpsc::channel();
        let (stop_flag, counter) = (Arc::clone(&stop), Arc::clone(&received));
        let accept = spawn_in(netns, move || {
            let listener = TcpListener::bind(("0.0.0.0", port)).expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            bound.send(()).expect("ready signal");
            let deadline = Instant::now() + MAX_LIFETIME;
            while !stop_flag.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let (stop_flag, counter) = (Arc::clone(&stop_flag), Arc::clone(&counter));
                        thread::spawn(move || echo(stream, &stop_flag, &counter));
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        ready
            .recv_timeout(IO_TIMEOUT)
            .expect("the echo server did not bind");
        Self {
            stop,
            received,
            accept: Some(accept),
        }
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
