//! The overlay between nodes (`--routing vxlan`): a pod's packet for another node's pod
//! range is encapsulated by the pod program and sent out of the uplink towards that
//! node ([`encap`]), or, when that way is not open, goes into the daemon's
//! collect-metadata VXLAN device ([`to_remote`]); on that device's egress the tunnel
//! key is set from the node the destination belongs to ([`egress`], which also carries
//! the node's own traffic routed there); on its ingress, a decapsulated packet is
//! checked and handed straight into the pod ([`ingress`]). Single packets for this
//! node's pods are taken out of the tunnel before the device, by the uplink's program
//! ([`decap`]), after the same checks.
//!
//! What comes out of the tunnel is untrusted: its VNI must be the cluster's, and its
//! inner source must lie in the pod ranges of the node its outer source is (a node
//! cannot speak for another node's pods, nor a host outside the cluster for any);
//! it must be for a pod of this node or for the node itself (the overlay's own address,
//! which the node's own traffic to other nodes' pods leaves from). Anything else is
//! dropped and counted under its own reason.

pub mod decap;
pub mod encap;

use aya_ebpf::{
    bindings::{BPF_F_ZERO_CSUM_TX, TC_ACT_OK, TC_ACT_SHOT},
    helpers::generated::{bpf_skb_get_tunnel_key, bpf_skb_set_tunnel_key},
    programs::TcContext,
};
use cni_ebpf_common::{DropReason, NatCounter, OverlayConfig};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    features::{services, underlay},
    primitives::{counters, deliver, maps, policy},
};

/// The IPv4 part of the kernel's `struct bpf_tunnel_key`, up to `tunnel_label`: a size
/// every kernel since 4.x takes (the helpers zero the rest), a multiple of 8 bytes.
#[repr(C, align(8))]
struct TunnelKey {
    tunnel_id: u32,
    /// Host byte order.
    remote_ipv4: u32,
    /// The rest of the IPv6 remote address.
    remote_rest: [u32; 3],
    tos: u8,
    ttl: u8,
    ext: u16,
}

const TUNNEL_KEY_SIZE: u32 = core::mem::size_of::<TunnelKey>() as u32;
const _: () = assert!(TUNNEL_KEY_SIZE == 24);

/// TTL of the outer header.
const OUTER_TTL: u8 = 64;

/// A pod's frame (`eth`, `ip`, for no pod of this node, from the host veth
/// `ingress_ifindex`) for another node's pod range: counted for that node, and with the
/// overlay routed (TTL decremented: the node is a router hop) to that node,
/// encapsulated here ([`encap`]) or by the device, whose egress program sets the tunnel
/// key. `None`: not for the overlay (no other node's range, or native routing: the
/// node's routes take it).
#[inline(always)]
pub fn to_remote(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    ingress_ifindex: u32,
) -> Result<Option<i32>, i64> {
    let Some(remote) = maps::remote_node(ip.dst_addr) else {
        return Ok(None);
    };
    counters::node(remote.addr, ctx.len());
    let Some(config) = maps::overlay_config() else {
        return Ok(None);
    };
    // An expiring packet goes to the stack, which answers with ICMP time exceeded.
    if ip.ttl <= 1 {
        return Ok(Some(TC_ACT_OK));
    }
    deliver::decrement_ttl(ctx, ip)?;
    if let Some(verdict) = encap::encapsulate(ctx, eth, ip, &config, remote.addr, ingress_ifindex)?
    {
        return Ok(Some(verdict));
    }
    Ok(Some(deliver::out_of_node(ctx, config.ifindex)))
}

/// The overlay device's egress: the tunnel key of the node the packet's destination
/// belongs to. A packet for no other node's range has nowhere to go: dropped. One the
/// stack forwarded is judged by the egress policies of the pod that sent it, and may be a Service connection it translated, which is recorded
/// (`services::left_through_stack`).
#[inline(always)]
pub fn egress(ctx: &TcContext, config: &OverlayConfig, ip: &Ipv4Hdr) -> Result<i32, i64> {
    let Some(remote) = maps::remote_node(ip.dst_addr) else {
        return Ok(counters::drop_packet(DropReason::OverlayNotLocal));
    };
    if !deliver::take_redirected(ctx)
        && (!policy::stack_sender_admits(ctx) || services::left_through_stack(ctx, ip))
    {
        return Ok(TC_ACT_SHOT as i32);
    }
    let mut key = TunnelKey {
        tunnel_id: config.vni,
        remote_ipv4: u32::from_be_bytes(remote.addr),
        remote_rest: [0, 0, 0],
        tos: 0,
        ttl: OUTER_TTL,
        ext: 0,
    };
    // SAFETY: `key` is initialised stack memory of the size given.
    let set = unsafe {
        bpf_skb_set_tunnel_key(
            ctx.skb.skb,
            (&raw mut key).cast(),
            TUNNEL_KEY_SIZE,
            u64::from(BPF_F_ZERO_CSUM_TX),
        )
    };
    if set != 0 {
        return Err(set);
    }
    Ok(TC_ACT_OK)
}

/// The overlay device's ingress: a decapsulated frame (`eth`, `ip`) checked (VNI, inner
/// source against the sending node) and delivered into its pod, or to the node's stack
/// when it is for the node itself.
#[inline(always)]
pub fn ingress(
    ctx: &TcContext,
    config: &OverlayConfig,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
) -> Result<i32, i64> {
    let mut key = TunnelKey {
        tunnel_id: 0,
        remote_ipv4: 0,
        remote_rest: [0, 0, 0],
        tos: 0,
        ttl: 0,
        ext: 0,
    };
    // SAFETY: `key` is stack memory of the size given, written by the helper.
    let got =
        unsafe { bpf_skb_get_tunnel_key(ctx.skb.skb, (&raw mut key).cast(), TUNNEL_KEY_SIZE, 0) };
    if got != 0 {
        return Err(got);
    }
    if key.tunnel_id != config.vni {
        return Ok(counters::drop_packet(DropReason::OverlayForeignVni));
    }
    let sender = key.remote_ipv4.to_be_bytes();
    if maps::remote_node(ip.src_addr).is_none_or(|node| node.addr != sender) {
        return Ok(counters::drop_packet(DropReason::OverlaySpoofedSource));
    }
    if let Some(pod) = maps::endpoint(ip.dst_addr) {
        // A reply of a Service connection the stack translated: the stack undoes it.
        if services::is_translated_reply(ctx, ip) {
            return Ok(deliver::to_stack(ctx));
        }
        // `--underlay-trust strict`: through the node's stack, its netfilter.
        if underlay::strict() {
            counters::nat(NatCounter::UnderlayToStack);
            return Ok(deliver::to_stack(ctx));
        }
        return deliver::deliver(ctx, eth, ip, &pod);
    }
    // A pods' gateway is the node's for its own pods only.
    if maps::is_gateway(ip.dst_addr) {
        return Ok(counters::drop_packet(DropReason::GatewayFromOutside));
    }
    // For the node itself (the overlay's address): its stack takes it, as a frame for
    // this host (the inner MACs are the sender's business).
    if maps::is_node_addr(ip.dst_addr) {
        return Ok(deliver::to_stack(ctx));
    }
    Ok(counters::drop_packet(DropReason::OverlayNotLocal))
}
