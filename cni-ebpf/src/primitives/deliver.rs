//! Handing a frame over: straight into a pod of this node with `bpf_redirect_peer`, as
//! it is ([`switch`]) or routed ([`deliver`], [`redirect`]), or to the node's stack as
//! a frame for the host ([`to_stack`]). A pod whose host veth has a qdisc (an ingress
//! rate limit: [`endpoint_flags::SHAPED`]) gets its frames through that veth's egress
//! instead, and so does every pod when the program runs on a netkit pair's hook.
//! A pod's frame sent out of the node by the datapath itself ([`out_of_node`]) carries a
//! mark its egress program takes off ([`take_redirected`]): that program tells it from a
//! frame the node's stack forwarded.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::generated::{bpf_redirect, bpf_redirect_peer, bpf_skb_change_type},
    programs::TcContext,
};
use cni_ebpf_common::{EndpointInfo, endpoint_flags};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use super::{
    counters::{self, Direction},
    csum,
    packet::{self, EthIpv4, IP_TTL},
    policy::{self, Role},
};

/// `skb->pkt_type` of a frame addressed to this host.
const PACKET_HOST: u32 = 0;

/// `skb->mark` of a pod's frame the datapath redirects to an uplink or the overlay device
/// ([`out_of_node`]), taken off by the egress program there ([`take_redirected`]), which
/// then knows the frame did not cross the node's stack. No netfilter hook lies between
/// the two, and a pod's frames carry mark 0 (crossing from the pod's namespace clears
/// it), which the egress program writes back. "ecni" in ASCII: a value no rule of
/// kube-proxy's (bits 0x4000 and 0x8000) or of the node's leaves on a forwarded frame.
const REDIRECTED_MARK: u32 = 0x6563_6e69;

/// Hands a frame already addressed to the pod `destination`'s MAC (the sender, on its
/// subnet, learnt it from `arp`) to that pod unchanged, as the bridge the pods believe
/// in would: no TTL decrement (the pods are on-link neighbours), no byte written, so the
/// sender's packet is not copied.
#[inline(always)]
pub fn switch(ctx: &TcContext, destination: &EndpointInfo) -> i32 {
    into_pod(ctx, destination)
}

/// Hands an IPv4 frame (headers `eth`, `ip` as read) to the local pod `destination`:
/// TTL decremented, MACs rewritten, redirected into the pod. An expiring packet goes to
/// the stack instead, which answers with ICMP time exceeded.
#[inline(always)]
pub fn deliver(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    destination: &EndpointInfo,
) -> Result<i32, i64> {
    if ip.ttl <= 1 {
        return Ok(TC_ACT_OK);
    }
    routed(ctx, destination.pod_mac, destination.host_mac, eth, ip)?;
    Ok(into_pod(ctx, destination))
}

/// Hands a frame whose IPv4 header is ready (TTL decremented) to the local pod
/// `destination`: MACs rewritten, redirected into the pod.
#[inline(always)]
pub fn redirect(ctx: &TcContext, eth: &EthHdr, destination: &EndpointInfo) -> Result<i32, i64> {
    let rewritten = EthHdr {
        dst_addr: destination.pod_mac,
        src_addr: destination.host_mac,
        ether_type: eth.ether_type,
    };
    ctx.store(0, &rewritten, 0)?;
    Ok(into_pod(ctx, destination))
}

/// The redirect into the pod `destination`, when its policies let the packet in: to its interface directly (the host veth's
/// peer), or, when its host veth has a qdisc (an ingress limit's `tbf`), to that veth's
/// egress, whose qdisc paces the frames before the veth hands them to the pod; both
/// counted for it. On a netkit pair's hook, where the kernel refuses the peer redirect,
/// to the host veth's egress uncounted: the pair's transmit counts it in the kernel's
/// counters, which `ebpf-cnid endpoints` adds.
#[inline(always)]
fn into_pod(ctx: &TcContext, destination: &EndpointInfo) -> i32 {
    if !policy::admits(ctx, destination.host_ifindex, Role::Receiver) {
        return TC_ACT_SHOT as i32;
    }
    // SAFETY: plain helper calls with an ifindex and no flags.
    unsafe {
        if !packet::at_tc_ingress(ctx) {
            return bpf_redirect(destination.host_ifindex, 0) as i32;
        }
        counters::endpoint(destination.host_ifindex, Direction::ToPod, ctx.len());
        if destination.flags & endpoint_flags::SHAPED != 0 {
            bpf_redirect(destination.host_ifindex, 0) as i32
        } else {
            bpf_redirect_peer(destination.host_ifindex, 0) as i32
        }
    }
}

/// Rewrites a frame (headers `eth`, `ip` as they are in it, TTL above 1) for its next hop:
/// MACs `dst_mac` and `src_mac`, TTL decremented with the header checksum, both headers
/// in one store (one helper call where a separate TTL store would take two).
#[inline(always)]
pub fn routed(
    ctx: &TcContext,
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    eth: &EthHdr,
    ip: &Ipv4Hdr,
) -> Result<(), i64> {
    let (ttl, check) = ttl_decremented(ip);
    let headers = EthIpv4 {
        eth: EthHdr {
            dst_addr: dst_mac,
            src_addr: src_mac,
            ether_type: eth.ether_type,
        },
        ip: Ipv4Hdr { ttl, check, ..*ip },
    };
    ctx.store(0, &headers, 0)?;
    Ok(())
}

/// Decrements the TTL of `ip` (read from the frame, TTL above 1) with its checksum: TTL,
/// protocol and checksum in one store.
#[inline(always)]
pub fn decrement_ttl(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<(), i64> {
    let (ttl, check) = ttl_decremented(ip);
    ctx.store(IP_TTL, &[ttl, ip.proto, check[0], check[1]], 0)?;
    Ok(())
}

/// The TTL of `ip` (above 1) less one, and the header checksum that goes with it.
#[inline(always)]
fn ttl_decremented(ip: &Ipv4Hdr) -> (u8, [u8; 2]) {
    // The TTL shares a 16-bit checksum word with the protocol.
    let (old, new) = ([ip.ttl, ip.proto], [ip.ttl - 1, ip.proto]);
    (new[0], csum::ipv4_check(ip.check, [old], [new]))
}

/// Redirects a pod's frame to the egress of `ifindex` (an uplink or the overlay device),
/// marked as sent by the datapath (see [`REDIRECTED_MARK`]).
#[inline(always)]
pub fn out_of_node(ctx: &TcContext, ifindex: u32) -> i32 {
    ctx.set_mark(REDIRECTED_MARK);
    // SAFETY: a plain helper call with an ifindex and no flags (egress of the device).
    unsafe { bpf_redirect(ifindex, 0) as i32 }
}

/// At an uplink's or the overlay device's egress: whether the frame was redirected there
/// by [`out_of_node`] (its mark is then taken off) rather than forwarded or sent by the
/// node's stack.
#[inline(always)]
pub fn take_redirected(ctx: &TcContext) -> bool {
    // SAFETY: `skb` is the program's context; mark is a readable field of it.
    let redirected = unsafe { (*ctx.skb.skb).mark } == REDIRECTED_MARK;
    if redirected {
        ctx.set_mark(0);
    }
    redirected
}

/// Hands a pod's frame to the node's stack as one addressed to the node: a frame the pod
/// addressed to another pod's MAC (see `arp`) would otherwise be dropped there as not
/// the host's.
#[inline(always)]
pub fn to_stack(ctx: &TcContext) -> i32 {
    // SAFETY: a plain helper call on the program's context. It fails only for types a
    // TC program may not set; PACKET_HOST is allowed.
    unsafe { bpf_skb_change_type(ctx.skb.skb.cast(), PACKET_HOST) };
    TC_ACT_OK
}
