//! The overlay's way out for pods' packets: the pod program encapsulates a packet for
//! another node's pod itself (outer Ethernet, IPv4, UDP and VXLAN headers, what the
//! overlay device would put around it) and hands it to the uplink the FIB names for
//! that node. This skips the device's transmit path: its route lookup for every packet
//! (a tunnel key set from BPF is never cached), the UDP tunnel transmit and the node's
//! IP output. What comes out on the other node is the same VXLAN packet the device
//! would have sent: that node's uplink program takes it out of the tunnel when it is a
//! single packet ([`super::decap`]), its device receives the rest.
//!
//! The device stays the way for anything this does not take (`encapsulate` answers
//! `None`): no resolved neighbour for the remote node yet (the device's path resolves
//! it, and the packets after take this way), a way out that is no uplink, a packet
//! whose segments would not fit the overlay's MTU (the device answers with ICMP), a
//! BIG TCP burst the outer header's 16-bit length cannot hold, and a packet the
//! kernel cannot grow in place (a whole frame already at the veth's MTU, which the
//! kernel's growth check measures against).

use aya_ebpf::{
    bindings::{
        BPF_F_ADJ_ROOM_ENCAP_L2_ETH, BPF_F_ADJ_ROOM_ENCAP_L3_IPV4, BPF_F_ADJ_ROOM_ENCAP_L4_UDP,
        BPF_F_ADJ_ROOM_FIXED_GSO, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC,
    },
    helpers::generated::{bpf_get_hash_recalc, bpf_get_prandom_u32},
    programs::TcContext,
};
use cni_ebpf_common::{DropReason, NatConfig, OverlayConfig, ip_proto::UDP};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::OUTER_TTL;
use crate::primitives::{counters, csum, deliver, fib, maps};

/// What encapsulation adds after the outer Ethernet header (the frame's own, readdressed
/// to the next hop): outer IPv4 (20), UDP (8), VXLAN (8) and the inner Ethernet (14)
/// headers, as the overlay device's `OVERHEAD`.
pub(super) const ADDED: usize = 50;

/// `bpf_skb_adjust_room` flags: the room is a UDP tunnel over IPv4 carrying Ethernet
/// (so that GSO segments the inner packet and repeats the headers before it), and
/// the segment size stays (the pods' MTU already leaves room for the headers).
const FLAGS: u64 = BPF_F_ADJ_ROOM_FIXED_GSO as u64
    | BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 as u64
    | BPF_F_ADJ_ROOM_ENCAP_L4_UDP as u64
    | BPF_F_ADJ_ROOM_ENCAP_L2_ETH as u64
    // BPF_F_ADJ_ROOM_ENCAP_L2(len): the inner MAC header's length.
    | (EthHdr::LEN as u64) << 56;

/// The VXLAN header's flags: the VNI is valid (RFC 7348).
pub(super) const VXLAN_VNI_VALID: u8 = 0x08;

/// Outer UDP source ports come from the inner flow's hash, in the dynamic range RFC
/// 7348 recommends (49152 to 65535): one flow keeps one port, flows spread over the
/// underlay's paths.
const SOURCE_PORT_BASE: u16 = 49152;
const SOURCE_PORTS: u64 = 16384;

/// The headers written at the front of the grown frame, in one store.
#[repr(C)]
struct Headers {
    outer: EthHdr,
    ip: [u8; 20],
    udp: [u8; 8],
    vxlan: [u8; 8],
    inner: EthHdr,
}

const _: () = assert!(core::mem::size_of::<Headers>() == EthHdr::LEN + ADDED);

/// Encapsulates a pod's frame (`eth`, `ip`: its headers, read before the TTL was
/// decremented) for the node at `remote` and redirects it to the uplink towards that
/// node. `None`: the frame is untouched and the overlay device takes it (see the
/// module).
#[inline(always)]
pub fn encapsulate(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    config: &OverlayConfig,
    remote: [u8; 4],
    ingress_ifindex: u32,
) -> Result<Option<i32>, i64> {
    let frame_len = ctx.len() as usize;
    // The outer IPv4 header's total length must hold the whole (GSO) packet.
    if frame_len - EthHdr::LEN + ADDED > usize::from(u16::MAX) {
        return Ok(None);
    }
    // The overlay device's MTU is the uplink's less the overhead: a packet (or each
    // segment) within it fits the uplink once encapsulated.
    if !fib::fits(ctx, config.ifindex) {
        return Ok(None);
    }
    let Some(next) = fib::forward(ctx, ingress_ifindex, UDP, 0, [0; 4], remote) else {
        return Ok(None);
    };
    // The outer source is this node's address on that uplink, the one the other nodes
    // know this node by (they check the outer source of what the tunnel brings).
    let Some(local) = maps::uplink_addr(next.ifindex).filter(|addr| NatConfig::is_address(*addr))
    else {
        return Ok(None);
    };
    // SAFETY: plain helper calls on the program's context, and with no arguments.
    let (hash, id) = unsafe { (bpf_get_hash_recalc(ctx.skb.skb), bpf_get_prandom_u32()) };
    if ctx
        .adjust_room(ADDED as i32, BPF_ADJ_ROOM_MAC, FLAGS)
        .is_err()
    {
        return Ok(None);
    }
    let ip_len = (frame_len - EthHdr::LEN + ADDED) as u16;
    let udp_len = ip_len - 20;
    let source_port = SOURCE_PORT_BASE + ((u64::from(hash) * SOURCE_PORTS) >> 32) as u16;
    let [len_hi, len_lo] = ip_len.to_be_bytes();
    let [id_hi, id_lo] = (id as u16).to_be_bytes();
    let mut outer_ip = [
        0x45,
        ecn_encapsulated(ip.tos),
        len_hi,
        len_lo,
        id_hi,
        id_lo,
        0,
        0,
        OUTER_TTL,
        UDP,
        0,
        0,
        local[0],
        local[1],
        local[2],
        local[3],
        remote[0],
        remote[1],
        remote[2],
        remote[3],
    ];
    let check = csum::ipv4_header(&outer_ip);
    outer_ip[10] = check[0];
    outer_ip[11] = check[1];
    let [sport_hi, sport_lo] = source_port.to_be_bytes();
    let [dport_hi, dport_lo] = config.port.to_be_bytes();
    let [ulen_hi, ulen_lo] = udp_len.to_be_bytes();
    let [_, vni_2, vni_1, vni_0] = config.vni.to_be_bytes();
    let headers = Headers {
        outer: EthHdr {
            dst_addr: next.dmac,
            src_addr: next.smac,
            ether_type: eth.ether_type,
        },
        ip: outer_ip,
        // The UDP checksum stays 0, as the device sends it over IPv4.
        udp: [
            sport_hi, sport_lo, dport_hi, dport_lo, ulen_hi, ulen_lo, 0, 0,
        ],
        vxlan: [VXLAN_VNI_VALID, 0, 0, 0, vni_2, vni_1, vni_0, 0],
        // The pod's frame as it sent it, as the device would carry it.
        inner: EthHdr {
            dst_addr: eth.dst_addr,
            src_addr: eth.src_addr,
            ether_type: eth.ether_type,
        },
    };
    if ctx.store(0, &headers, 0).is_err() {
        return Ok(Some(counters::drop_packet(DropReason::OverlayEncapFailed)));
    }
    Ok(Some(deliver::out_of_node(ctx, next.ifindex)))
}

/// The outer header's TOS for an inner `tos`: its ECN field copied, with CE sent as
/// ECT(0) (RFC 6040's normal mode, as the kernel's tunnels do); no DSCP.
#[inline(always)]
fn ecn_encapsulated(tos: u8) -> u8 {
    const ECN: u8 = 0b11;
    const CE: u8 = 0b11;
    const ECT_0: u8 = 0b10;
    match tos & ECN {
        CE => ECT_0,
        ecn => ecn,
    }
}
