//! The loads the benchmark applies, each bounded in time: iperf3 for throughput, and a
//! small request/response tool of our own for TCP_RR (1-byte ping-pong on one
//! connection) and TCP_CRR (connect, 1 byte each way, close). Servers and clients run on
//! threads inside the namespaces (see `ebpf_cni_tests::traffic`).

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context;
use ebpf_cni_tests::{
    netns::Netns,
    traffic::{
        iperf::{self, Length},
        spawn_in,
    },
};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The congestion control of the throughput streams: the kernel's default (cubic),
/// whatever the machine sets (new namespaces inherit it). A paced one such as BBR sends
/// at its own estimate of the path's rate and leaves the CPUs idle, so the figure would
/// be that estimate; an unpaced sender keeps a CPU busy, and the figure is the
/// datapath's cost per byte (measurements: docs/decisions.md, "Throughput streams in
/// TCP cubic").
pub const CONGESTION_CONTROL: &str = "cubic";

/// TCP throughput from `client` to `server_ip` (inside `server`) with iperf3, Gbit/s,
/// with [`CONGESTION_CONTROL`].
pub fn throughput(
    client: &Netns,
    server: &Netns,
    server_ip: Ipv4Addr,
    seconds: u32,
) -> anyhow::Result<f64> {
    let report = iperf::stream(
        client,
        server,
        server_ip,
        Length::Seconds(seconds),
        &["--congestion", CONGESTION_CONTROL],
    )
    .map_err(anyhow::Error::msg)?;
    Ok(report.received_bps / 1e9)
}

/// A server thread in `netns` answering each byte with one byte, on every connection
/// it accepts, until dropped.
struct PongServer {
    stop: Arc<AtomicBool>,
    worker: Option<thread::JoinHandle<()>>,
}

impl PongServer {
    fn start(netns: &Netns, port: u16) -> anyhow::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (ready, bound) = mpsc::channel();
        let worker = spawn_in(netns, move || {
            let listener = match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
                Ok(listener) => listener,
                Err(error) => {
                    let _ = ready.send(Err(error.to_string()));
                    return;
                }
            };
            let _ = ready.send(Ok(()));
            while !flag.load(Ordering::Relaxed) {
                // Block in poll (not a sleep loop, which would add latency to every
                // connection), waking now and then to see the stop flag.
                let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
                if !matches!(poll(&mut fds, PollTimeout::from(100u16)), Ok(n) if n > 0) {
                    continue;
                }
                if let Ok((stream, _)) = listener.accept() {
                    pong(stream, &flag);
                }
            }
        });
        bound
            .recv_timeout(CONNECT_TIMEOUT)
            .context("the pong server did not start")?
            .map_err(anyhow::Error::msg)?;
        Ok(Self {
            stop,
            worker: Some(worker),
        })
    }
}

impl Drop for PongServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Answers every byte of one connection until EOF (the server side of RR and CRR).
fn pong(mut stream: TcpStream, stop: &AtomicBool) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let mut byte = [0u8; 1];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut byte) {
            Ok(1) => {
                if stream.write_all(&byte).is_err() {
                    return;
                }
            }
            _ => return,
        }
    }
}

/// TCP_RR: 1-byte request/response transactions per second on one connection.
pub fn tcp_rr(
    client: &Netns,
    server: &Netns,
    server_ip: Ipv4Addr,
    seconds: u32,
) -> anyhow::Result<f64> {
    let port = 7001;
    let _server = PongServer::start(server, port)?;
    let to = SocketAddr::from((server_ip, port));
    let duration = Duration::from_secs(u64::from(seconds));
    spawn_in(client, move || -> anyhow::Result<f64> {
        let mut stream = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut byte = [1u8; 1];
        let start = Instant::now();
        let mut transactions = 0u64;
        while start.elapsed() < duration {
            stream.write_all(&byte)?;
            stream.read_exact(&mut byte)?;
            transactions += 1;
        }
        Ok(transactions as f64 / start.elapsed().as_secs_f64())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the RR client panicked"))?
}

/// TCP_CRR: connect, 1 byte each way, close; connections per second.
pub fn tcp_crr(
    client: &Netns,
    server: &Netns,
    server_ip: Ipv4Addr,
    seconds: u32,
) -> anyhow::Result<f64> {
    let port = 7002;
    tcp_crr_via(
        client,
        server,
        port,
        SocketAddr::from((server_ip, port)),
        seconds,
    )
}

/// TCP_CRR to a server listening on `listen_port` inside `server`, reached at `to`
/// (for example the node's address and a host port mapped to it).
pub fn tcp_crr_via(
    client: &Netns,
    server: &Netns,
    listen_port: u16,
    to: SocketAddr,
    seconds: u32,
) -> anyhow::Result<f64> {
    let _server = PongServer::start(server, listen_port)?;
    let duration = Duration::from_secs(u64::from(seconds));
    spawn_in(client, move || -> anyhow::Result<f64> {
        let start = Instant::now();
        let mut connections = 0u64;
        let mut byte = [1u8; 1];
        while start.elapsed() < duration {
            let mut stream = TcpStream::connect_timeout(&to, CONNECT_TIMEOUT)
                .with_context(|| format!("connection {connections} to {to}"))?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(Duration::from_secs(2)))?;
            stream.write_all(&byte)?;
            stream.read_exact(&mut byte)?;
            drop(stream);
            connections += 1;
        }
        Ok(connections as f64 / start.elapsed().as_secs_f64())
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the CRR client panicked"))?
}

/// Lets a client namespace open many short connections in a row (TIME_WAIT reuse and a
/// wide port range), inside that namespace only.
pub fn tune_client(netns: &Netns) {
    for setting in [
        "net.ipv4.tcp_tw_reuse=1",
        "net.ipv4.ip_local_port_range=10000 65000",
    ] {
        netns.run("sysctl", &["-q", "-w", setting]);
    }
}
