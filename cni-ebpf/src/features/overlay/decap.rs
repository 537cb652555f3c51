//! The overlay's way in for single packets: the uplink's ingress program takes a VXLAN
//! packet for one of this node's pods out of the tunnel itself (the outer IPv4, UDP,
//! VXLAN and inner Ethernet headers removed in place) and hands it straight into the
//! pod. This skips, for every such packet, the node's route lookup and UDP socket
//! lookup, the device's receive path (a tunnel metadata allocation per packet, its
//! GRO cell queue and a second pass through the receive loop) and the device's own
//! ingress program. Acknowledgements, request-response traffic and connection set-up
//! are such packets.
//!
//! Every VXLAN packet for the overlay's port is first tied to the host its outer source
//! claims to be (`underlay::claim`): one from another neighbour is dropped. Then it
//! takes only what the device would deliver into that pod unchanged, checked as
//! `ingress` checks it; the device stays the way for everything else, and its
//! ingress program counts what it drops:
//! - a GSO packet (the kernel's UDP-tunnel segmentation state cannot be cleared from
//!   BPF before `BPF_F_ADJ_ROOM_DECAP_L4_UDP`: a packet left marked as a tunnel burst
//!   would be segmented as one later). On a real NIC, GRO has merged a flow's segments
//!   into such packets before any program runs; on veths, senders' bursts arrive whole;
//! - an outer header with options or fragmented, a UDP checksum to verify (the
//!   overlay's senders leave it 0, as the kernel's VXLAN devices do over IPv4), VXLAN
//!   flags other than "VNI valid", another VNI;
//! - an inner frame that is not a well-formed IPv4 packet, whose source is not in the
//!   pod ranges of the node the outer source is, or for no pod of this node (the node
//!   itself, a pods' gateway, anything else);
//! - an outer ECN mark the inner header must take (RFC 6040: the device applies it,
//!   or drops a CE-marked packet that is not ECN-capable);
//! - an inner TTL at its end (the node answers with ICMP time exceeded).

use aya_ebpf::{
    bindings::{BPF_CSUM_LEVEL_DEC, bpf_adj_room_mode::BPF_ADJ_ROOM_MAC},
    helpers::generated::bpf_csum_level,
    programs::TcContext,
};
use cni_ebpf_common::{DropReason, ip_proto::UDP};
use network_types::{
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use super::encap::{ADDED, VXLAN_VNI_VALID};
use crate::{
    features::{services, underlay},
    primitives::{
        counters, deliver, maps,
        packet::{self, EthIpv4},
    },
};

/// The headers after an option-less outer IPv4 header, read in one load: UDP, VXLAN,
/// then the inner frame's Ethernet and IPv4 headers.
#[repr(C)]
#[derive(Clone, Copy)]
struct Tunnelled {
    udp: [u8; 8],
    vxlan: [u8; 8],
    inner: EthIpv4,
}

/// Where [`Tunnelled`] starts: after the outer Ethernet and option-less IPv4 headers.
const UDP_AT: usize = EthHdr::LEN + Ipv4Hdr::LEN;
/// Where the inner IPv4 header starts: after UDP, VXLAN and the inner Ethernet header.
const INNER_IP_AT: usize = UDP_AT + 16 + EthHdr::LEN;

/// A packet (IPv4 header `ip`) arriving on an uplink whose address is `node_addr`, taken out
/// of the tunnel and delivered into its pod when it is one this module takes (see
/// there); `None`: untouched, for the NAT, the stack and the overlay device. The
/// overlay's port is no translated flow's (the NAT's port search passes over it), so
/// nothing for it is a reply the NAT would have to translate.
#[inline(always)]
pub fn from_uplink(
    ctx: &TcContext,
    node_addr: [u8; 4],
    eth: &EthHdr,
    ip: &Ipv4Hdr,
) -> Result<Option<i32>, i64> {
    if ip.proto != UDP
        || ip.dst_addr != node_addr
        || ip.ihl() as usize != Ipv4Hdr::LEN
        || ip.frag_offset() != 0
        || ip.frag_flags() & MORE_FRAGMENTS != 0
    {
        return Ok(None);
    }
    let Some(config) = maps::overlay_config() else {
        return Ok(None);
    };
    let udp: [u8; 4] = ctx.load(UDP_AT)?;
    if u16::from_be_bytes([udp[2], udp[3]]) != config.port {
        return Ok(None);
    }
    // A frame from another neighbour than the host its outer source is (or by another
    // device than the FIB reaches it by) is a forged node's: dropped, bursts too. One
    // that cannot be checked, or with `--underlay-trust strict`, takes the device's way.
    match underlay::claim(ctx, eth, packet::ifindex(ctx), node_addr, ip.src_addr) {
        underlay::Claim::Forged => {
            return Ok(Some(counters::drop_packet(DropReason::UnderlaySpoofed)));
        }
        underlay::Claim::Tied if !underlay::strict() => {}
        _ => return Ok(None),
    }
    // SAFETY: the context pointer is valid for the whole program run.
    if unsafe { (*ctx.skb.skb).gso_size } != 0 {
        return Ok(None);
    }
    let frame_len = ctx.len();
    if (frame_len as usize) < UDP_AT + core::mem::size_of::<Tunnelled>() {
        return Ok(None);
    }
    let Tunnelled { udp, vxlan, inner } = ctx.load(UDP_AT)?;
    let [_, vni_2, vni_1, vni_0] = config.vni.to_be_bytes();
    if udp[6..8] != [0, 0] || vxlan != [VXLAN_VNI_VALID, 0, 0, 0, vni_2, vni_1, vni_0, 0] {
        return Ok(None);
    }
    let EthIpv4 {
        eth: inner_eth,
        ip: inner,
    } = inner;
    if inner_eth.ether_type != EtherType::Ipv4 as u16
        || !packet::ipv4_well_formed(&inner, frame_len - ADDED as u32)
        || inner.ttl <= 1
        || !ecn_unchanged(ip.tos, inner.tos)
    {
        return Ok(None);
    }
    if maps::remote_node(inner.src_addr).is_none_or(|node| node.addr != ip.src_addr) {
        return Ok(None);
    }
    let Some(pod) = maps::endpoint(inner.dst_addr) else {
        return Ok(None);
    };
    // A reply of a Service connection the stack translated: the device's way, whose
    // ingress program hands it to the stack (read at the inner headers' place).
    if services::is_translated_reply_at(ctx, &inner, INNER_IP_AT) {
        return Ok(None);
    }
    if ctx
        .adjust_room(-(ADDED as i32), BPF_ADJ_ROOM_MAC, 0)
        .is_err()
    {
        return Ok(None);
    }
    // A checksum a NIC verified counts the outer UDP header (zero-checksum UDP counts)
    // as its first level: the inner packet's checksums start one level down, as the
    // kernel's tunnels leave them.
    // SAFETY: a plain helper call on the program's context.
    unsafe { bpf_csum_level(ctx.skb.skb, u64::from(BPF_CSUM_LEVEL_DEC)) };
    // The frame is now the outer Ethernet header and the inner packet.
    let EthIpv4 { eth, ip } = ctx.load(0)?;
    deliver::deliver(ctx, &eth, &ip, &pod).map(Some)
}

/// The IPv4 flag that more fragments follow (of `Ipv4Hdr::frag_flags`).
const MORE_FRAGMENTS: u8 = 0b001;

/// Whether RFC 6040's decapsulation leaves the inner ECN field (`inner_tos`) as it is
/// under the outer one (`outer_tos`): the outer is not ECN-capable or says the same,
/// or it is ECT(0), which changes nothing.
#[inline(always)]
fn ecn_unchanged(outer_tos: u8, inner_tos: u8) -> bool {
    const ECN: u8 = 0b11;
    const ECT_0: u8 = 0b10;
    let (outer, inner) = (outer_tos & ECN, inner_tos & ECN);
    outer == 0 || outer == ECT_0 || outer == inner
}
