//! UDP: an echo server that records who sent, and a single request/answer.

use std::{
    net::{SocketAddr, UdpSocket},
    sync::{Arc, Mutex, atomic::Ordering, mpsc},
    time::{Duration, Instant},
};

use super::{Background, io_timeout, max_lifetime, run_in};
use crate::netns::Netns;

/// The largest UDP payload over IPv4: datagrams larger than the MTU travel in fragments.
const MAX_DATAGRAM: usize = 65_507;

/// A UDP echo server in a namespace that records who sent, stopped on drop.
pub struct UdpEcho {
    peers: Arc<Mutex<Vec<SocketAddr>>>,
    _worker: Background<()>,
}

impl UdpEcho {
    /// Listens on `0.0.0.0:port` inside `netns`; returns once it is bound.
    pub fn start(netns: &Netns, port: u16) -> Self {
        Self::start_for(netns, port, max_lifetime())
    }

    /// Like [`Self::start`], answering for up to `lifetime` rather than the helpers'
    /// usual bound.
    pub fn start_for(netns: &Netns, port: u16, lifetime: Duration) -> Self {
        let peers = Arc::new(Mutex::new(Vec::new()));
        let (bound, ready) = mpsc::channel();
        let seen = Arc::clone(&peers);
        let worker = Background::start(netns, move |stop| {
            let socket = UdpSocket::bind(("0.0.0.0", port)).expect("bind");
            socket
                .set_read_timeout(Some(Duration::from_millis(100)))
                .expect("timeout");
            bound.send(()).expect("ready signal");
            let deadline = Instant::now() + lifetime;
            let mut buffer = vec![0u8; MAX_DATAGRAM];
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((n, peer)) = socket.recv_from(&mut buffer) {
                    seen.lock().expect("peers lock").push(peer);
                    let _ = socket.send_to(&buffer[..n], peer);
                }
            }
        });
        ready
            .recv_timeout(io_timeout())
            .expect("the UDP server did not bind");
        Self {
            peers,
            _worker: worker,
        }
    }

    /// The source address of every datagram received so far.
    pub fn peers(&self) -> Vec<SocketAddr> {
        self.peers.lock().expect("peers lock").clone()
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
        let mut buffer = vec![0u8; MAX_DATAGRAM];
        let n = socket.recv(&mut buffer)?;
        buffer.truncate(n);
        Ok(buffer)
    })
}
