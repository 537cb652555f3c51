//! Header access and checks: where the fields are, and reading what the features need.
//! Reads go through `ctx.load` (`bpf_skb_load_bytes`), which checks the bounds itself: a
//! frame too short for what is read is an error, never an out-of-bounds access, and
//! needs no data/data_end comparison for the verifier.

use aya_ebpf::programs::TcContext;
use cni_ebpf_common::{
    Segment,
    ip_proto::{DCCP, ICMP, SCTP, TCP, UDP, UDPLITE},
};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

/// The device a TC program runs on (ingress: where the frame arrived; egress: where it
/// leaves; on a netkit pair's hook: the pair's host side).
#[inline(always)]
pub fn ifindex(ctx: &TcContext) -> u32 {
    // SAFETY: the context pointer is valid for the whole program run.
    unsafe { (*ctx.skb.skb).ifindex }
}

/// Whether the program runs at a device's TC ingress, the one place `bpf_redirect_peer`
/// works, rather than on a netkit pair's hook (`from_pod` runs on both). At ingress the
/// kernel has just set the frame's input device (`skb_iif`) to the device itself; a
/// netkit pair clears it as the frame crosses (`skb_scrub_packet`), before the hook.
#[inline(always)]
pub fn at_tc_ingress(ctx: &TcContext) -> bool {
    // SAFETY: the context pointer is valid for the whole program run.
    unsafe { (*ctx.skb.skb).ingress_ifindex == (*ctx.skb.skb).ifindex }
}

/// Whether the frame carries a VLAN tag: one the kernel already took into the skb
/// (`vlan_present`, 802.1Q or 802.1ad), or one still in the frame (802.1Q, 802.1ad and
/// the older QinQ types).
#[inline(always)]
pub fn vlan_tagged(ctx: &TcContext, eth: &EthHdr) -> bool {
    // SAFETY: the context pointer is valid for the whole program run.
    let accelerated = unsafe { (*ctx.skb.skb).vlan_present } != 0;
    accelerated
        || eth.ether_type == EtherType::Ieee8021q as u16
        || eth.ether_type == EtherType::Ieee8021ad as u16
        || eth.ether_type == EtherType::Ieee8021QinQ1 as u16
        || eth.ether_type == EtherType::Ieee8021QinQ2 as u16
        || eth.ether_type == EtherType::Ieee8021QinQ3 as u16
}

/// `PACKET_OTHERHOST`: a frame for another host's MAC (a promiscuous device, a flooded
/// unicast), which the stack drops.
const PACKET_OTHERHOST: u32 = 3;

/// Whether the frame arrived for another host's MAC: nothing is delivered from it.
#[inline(always)]
pub fn for_other_host(ctx: &TcContext) -> bool {
    // SAFETY: `skb` is the program's context; pkt_type is a readable field of it.
    unsafe { (*ctx.skb.skb).pkt_type == PACKET_OTHERHOST }
}

/// Whether `ip`, the IPv4 header of a frame of `frame_len` bytes, is one to act on:
/// version 4, a header length of at least 20 bytes that fits in the packet's total
/// length, and a total length the frame holds (Ethernet padding may follow it). A total
/// length of 0 is a BIG TCP packet's, whose length is the skb's: accepted when the
/// frame is over 64 KiB.
#[inline(always)]
pub fn ipv4_well_formed(ip: &Ipv4Hdr, frame_len: u32) -> bool {
    let (header, total) = (u32::from(ip.ihl()), u32::from(ip.tot_len()));
    let packet = frame_len.saturating_sub(EthHdr::LEN as u32);
    let total_fits = if total == 0 {
        packet > u32::from(u16::MAX)
    } else {
        header <= total && total <= packet
    };
    ip.version() == 4 && header >= Ipv4Hdr::LEN as u32 && total_fits
}

/// Whether the layer-4 header of `ip` (the first fragment of its datagram, or a whole
/// one) lies within the packet's total length, as far as NAT reads and rewrites it:
/// TCP's 20 bytes, 8 of UDP, UDP-Lite and ICMP, 12 of SCTP and DCCP; protocols NAT
/// keys without ports have nothing to hold. A BIG TCP packet (total length 0) is longer
/// than 64 KiB.
#[inline(always)]
pub fn l4_header_fits(ip: &Ipv4Hdr) -> bool {
    let needed = match ip.proto as u8 {
        TCP => 20,
        UDP | UDPLITE | ICMP => 8,
        SCTP | DCCP => 12,
        _ => 0,
    };
    let total = ip.tot_len();
    total == 0 || u32::from(total) >= u32::from(ip.ihl()) + needed
}

/// Whether `quoted`, the IPv4 header an ICMP error quotes, is one to act on: version 4,
/// and a header length of at least 20 bytes within its total length. (The quote may be
/// cut short of that total: only what the header says about itself is checked.)
#[inline(always)]
pub fn quoted_ipv4_well_formed(quoted: &Ipv4Hdr) -> bool {
    let header = u16::from(quoted.ihl());
    quoted.version() == 4 && header >= Ipv4Hdr::LEN as u16 && header <= quoted.tot_len()
}

/// Offsets in the frame of the (outer) IPv4 TTL (the protocol and the header checksum
/// follow it), header checksum, source and destination.
pub const IP_TTL: usize = EthHdr::LEN + 8;
pub const IP_CSUM: usize = EthHdr::LEN + 10;
pub const IP_SRC: usize = EthHdr::LEN + 12;
pub const IP_DST: usize = EthHdr::LEN + 16;

pub const ICMP_ECHO_REPLY: u8 = 0;
pub const ICMP_ECHO_REQUEST: u8 = 8;
pub const ICMP_DEST_UNREACHABLE: u8 = 3;
pub const ICMP_TIME_EXCEEDED: u8 = 11;
pub const ICMP_PARAMETER_PROBLEM: u8 = 12;

/// Whether an ICMP message of `icmp_type` is an error quoting the packet that caused it
/// (one that NAT translates along with its flow).
#[inline(always)]
pub fn is_icmp_error(icmp_type: u8) -> bool {
    matches!(
        icmp_type,
        ICMP_DEST_UNREACHABLE | ICMP_TIME_EXCEEDED | ICMP_PARAMETER_PROBLEM
    )
}

/// The Ethernet and IPv4 headers, read together (one helper call for both).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EthIpv4 {
    pub eth: EthHdr,
    pub ip: Ipv4Hdr,
}

/// The ports of a TCP or UDP header at `l4` (as on the wire: source, then destination),
/// and for TCP the flags, sequence and acknowledgement numbers the flows follow: one
/// read for TCP (the flags sit 13 bytes in), the 4 bytes of ports for UDP (a short
/// datagram may have nothing after its 8-byte header).
#[inline(always)]
pub fn ports_and_flags(ctx: &TcContext, proto: u8, l4: usize) -> Result<(u16, u16, Segment), i64> {
    let (ports, seg) = if proto == TCP {
        let head: [u8; 14] = ctx.load(l4)?;
        let seg = Segment {
            flags: head[13],
            seq: u32::from_be_bytes([head[4], head[5], head[6], head[7]]),
            ack: u32::from_be_bytes([head[8], head[9], head[10], head[11]]),
        };
        ([head[0], head[1], head[2], head[3]], seg)
    } else {
        (ctx.load::<[u8; 4]>(l4)?, Segment::flags(0))
    };
    Ok((
        u16::from_be_bytes([ports[0], ports[1]]),
        u16::from_be_bytes([ports[2], ports[3]]),
        seg,
    ))
}

/// The (source, destination) ports of a packet of `proto` whose L4 header is at `l4`, as
/// a NAT flow is keyed: TCP, UDP, SCTP, DCCP and UDP-Lite have them where UDP does,
/// protocols without ports give (0, 0). `None` for ICMP (keyed by its echo identifier).
#[inline(always)]
pub fn flow_ports(ctx: &TcContext, proto: u8, l4: usize) -> Result<Option<(u16, u16)>, i64> {
    Ok(match proto {
        TCP | UDP | SCTP | DCCP | UDPLITE => {
            let ports: [u8; 4] = ctx.load(l4)?;
            Some((
                u16::from_be_bytes([ports[0], ports[1]]),
                u16::from_be_bytes([ports[2], ports[3]]),
            ))
        }
        ICMP => None,
        _ => Some((0, 0)),
    })
}
