//! IPv4 packets of a protocol without ports, through raw sockets: what a GRE or ESP
//! tunnel endpoint sends and receives, for the source NAT of such protocols.

use std::{
    io,
    mem::MaybeUninit,
    net::{Ipv4Addr, SocketAddrV4},
    time::Duration,
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::run_in;
use crate::netns::Netns;

/// A raw IPv4 socket of one protocol inside a namespace: it receives every packet of
/// that protocol for the namespace's addresses, and sends packets of it.
pub struct RawSocket {
    socket: Socket,
}

impl RawSocket {
    /// Opens the socket inside `netns` (it stays in that namespace).
    pub fn open(netns: &Netns, proto: u8) -> Self {
        run_in(netns, move || Self::open_here(proto))
            .unwrap_or_else(|error| panic!("cannot open a raw socket of protocol {proto}: {error}"))
    }

    /// Opens the socket in the calling thread's namespace (a thread already inside the
    /// namespace it works in).
    pub fn open_here(proto: u8) -> io::Result<Self> {
        let socket = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(i32::from(proto))),
        )?;
        Ok(Self { socket })
    }

    /// Sends `payload` (what follows the IPv4 header, which the kernel writes) to `to`.
    pub fn send_to(&self, to: Ipv4Addr, payload: &[u8]) -> io::Result<()> {
        let to = SockAddr::from(SocketAddrV4::new(to, 0));
        self.socket.send_to(payload, &to).map(drop)
    }

    /// The next packet within `timeout`, as (source address, what follows its IPv4
    /// header); `None` when nothing came.
    pub fn recv(&self, timeout: Duration) -> Option<(Ipv4Addr, Vec<u8>)> {
        self.socket
            .set_read_timeout(Some(timeout))
            .expect("a read timeout");
        let mut buffer = [MaybeUninit::<u8>::uninit(); 2048];
        let n = self.socket.recv(&mut buffer).ok()?;
        // SAFETY: the kernel wrote the first `n` bytes.
        let packet: Vec<u8> = buffer[..n]
            .iter()
            .map(|byte| unsafe { byte.assume_init() })
            .collect();
        // A raw IPv4 socket receives the header too.
        let header_len = usize::from(packet.first()? & 0x0f) * 4;
        let source: [u8; 4] = packet.get(12..16)?.try_into().ok()?;
        Some((Ipv4Addr::from(source), packet.get(header_len..)?.to_vec()))
    }
}
