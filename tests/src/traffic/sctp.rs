//! SCTP between namespaces, for NetworkPolicy's SCTP rules. Where the kernel has SCTP
//! ([`available`]), real associations: a server that accepts them, and a client whose
//! connect returns once the four-way handshake (INIT, INIT ACK, COOKIE ECHO, COOKIE
//! ACK) went both ways. Where it has not (a host without the module), SCTP packets
//! through raw sockets: the client sends an SCTP common header (its ports and a
//! verification tag of 0) and an echo in the server's namespace answers it with the
//! ports turned and a tag of 1 (an echo answers tag 0 only, so two echoes never answer
//! each other). The datapath judges SCTP by its ports, as either way shows.

use std::{
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
    sync::{
        OnceLock,
        atomic::{AtomicU16, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{Background, RawSocket, io_timeout, run_in};
use crate::netns::Netns;

/// IP protocol number of SCTP.
const IPPROTO_SCTP: u8 = 132;

/// What `cargo xtask vm-test` tells a guest of its kernel's configuration: `y` when it
/// is built with SCTP (`CONFIG_IP_SCTP`), `n` when not. Unset on a host, whose kernel
/// the probe decides.
pub const KERNEL_VAR: &str = "EBPF_CNI_KERNEL_SCTP";

/// Whether the running kernel makes SCTP sockets (the kernel loads its module at the
/// first one, where it has it): asked once, in a namespace of its own. Where the test
/// harness knows the kernel's configuration ([`KERNEL_VAR`]), the probe must agree with
/// it, so that a kernel with SCTP never runs only the raw packets.
pub fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let scratch = Netns::new("sctpprobe");
        let made = run_in(&scratch, || sctp_socket().is_ok());
        crate::kernel::as_configured(KERNEL_VAR, made, "an SCTP socket")
    })
}

fn sctp_socket() -> std::io::Result<Socket> {
    Socket::new(
        Domain::IPV4,
        Type::STREAM,
        Some(Protocol::from(i32::from(IPPROTO_SCTP))),
    )
}

/// Whether a client inside the calling thread's namespace reaches `to` over SCTP within
/// `timeout`: an association made ([`available`]), else an echo's answer to a packet.
pub fn reaches(to: SocketAddr, timeout: Duration) -> bool {
    if available() {
        let Ok(socket) = sctp_socket() else {
            return false;
        };
        return socket.connect_timeout(&SockAddr::from(to), timeout).is_ok();
    }
    let SocketAddr::V4(to) = to else {
        return false;
    };
    raw_round_trip(to, timeout)
}

/// An SCTP server on one port inside a namespace: real associations where the kernel
/// has SCTP, else an echo of raw SCTP packets (which answers on every port).
pub struct SctpServer {
    _worker: Background<()>,
}

impl SctpServer {
    /// Serves `port` inside `netns` for up to `lifetime`; returns once it listens.
    pub fn start_for(netns: &Netns, port: u16, lifetime: Duration) -> Self {
        let (bound, ready) = mpsc::channel();
        let real = available();
        let worker = Background::start(netns, move |stop| {
            let deadline = Instant::now() + lifetime;
            if real {
                let socket = sctp_socket().expect("an SCTP socket");
                socket.set_reuse_address(true).expect("SO_REUSEADDR");
                socket
                    .bind(&SockAddr::from(SocketAddrV4::new(
                        Ipv4Addr::UNSPECIFIED,
                        port,
                    )))
                    .expect("bind");
                socket.listen(128).expect("listen");
                // accept() waits this long at most (SO_RCVTIMEO).
                socket
                    .set_read_timeout(Some(Duration::from_millis(100)))
                    .expect("timeout");
                bound.send(()).expect("ready signal");
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    // Made is all a probe asks: the association closes at once.
                    let _ = socket.accept();
                }
            } else {
                let socket = RawSocket::open_here(IPPROTO_SCTP).expect("a raw SCTP socket");
                bound.send(()).expect("ready signal");
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    let Some((from, header)) = receive(&socket) else {
                        continue;
                    };
                    if header.tag == 0 && header.destination == port {
                        let _ = socket.send_to(from, &header.answer());
                    }
                }
            }
        });
        ready
            .recv_timeout(io_timeout())
            .expect("the SCTP server did not start");
        Self { _worker: worker }
    }
}

/// The part of an SCTP common header the probes use.
#[derive(Clone, Copy)]
struct Header {
    source: u16,
    destination: u16,
    tag: u32,
}

impl Header {
    /// The header's 12 bytes (the checksum 0: the datapath reads ports, and a kernel
    /// without SCTP checks nothing).
    fn bytes(self) -> [u8; 12] {
        let mut bytes = [0u8; 12];
        bytes[0..2].copy_from_slice(&self.source.to_be_bytes());
        bytes[2..4].copy_from_slice(&self.destination.to_be_bytes());
        bytes[4..8].copy_from_slice(&self.tag.to_be_bytes());
        bytes
    }

    /// An echo's answer: the ports turned, tag 1.
    fn answer(self) -> [u8; 12] {
        Header {
            source: self.destination,
            destination: self.source,
            tag: 1,
        }
        .bytes()
    }
}

/// The next SCTP packet on `socket` within 100 ms: its source address and common
/// header.
fn receive(socket: &RawSocket) -> Option<(Ipv4Addr, Header)> {
    let (from, sctp) = socket.recv(Duration::from_millis(100))?;
    let sctp = sctp.get(..8)?;
    Some((
        from,
        Header {
            source: u16::from_be_bytes([sctp[0], sctp[1]]),
            destination: u16::from_be_bytes([sctp[2], sctp[3]]),
            tag: u32::from_be_bytes([sctp[4], sctp[5], sctp[6], sctp[7]]),
        },
    ))
}

/// A source port for the next raw probe: each probe its own, so that probes running at
/// once in one namespace tell their answers apart.
fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    20_000 + NEXT.fetch_add(1, Ordering::Relaxed) % 40_000
}

/// Sends a packet to `to` and waits up to `timeout` for its echo's answer.
fn raw_round_trip(to: SocketAddrV4, timeout: Duration) -> bool {
    let Ok(socket) = RawSocket::open_here(IPPROTO_SCTP) else {
        return false;
    };
    let source = next_port();
    let request = Header {
        source,
        destination: to.port(),
        tag: 0,
    };
    let deadline = Instant::now() + timeout;
    // Sent again every 200 ms, as a real client would send its INIT again.
    let mut resend = Instant::now();
    while Instant::now() < deadline {
        if Instant::now() >= resend {
            if socket.send_to(*to.ip(), &request.bytes()).is_err() {
                return false;
            }
            resend = Instant::now() + Duration::from_millis(200);
        }
        if let Some((from, header)) = receive(&socket)
            && from == *to.ip()
            && header.tag == 1
            && header.source == to.port()
            && header.destination == source
        {
            return true;
        }
    }
    false
}
