//! IPv4 forwarding between pods of this node: the destination is looked up in the
//! endpoints map and the frame handed straight to the destination pod with
//! `bpf_redirect_peer`: it never crosses the node's IP stack, netfilter, or a bridge.
//! A frame the sender addressed to the destination pod's MAC (an on-link neighbour, see
//! `arp`) goes as it is; one addressed to the gateway is routed: TTL decremented, MACs
//! rewritten. Anything else goes to the stack, as do Service connections when Service
//! ranges are configured (see `services`).

use aya_ebpf::{bindings::TC_ACT_OK, helpers::generated::bpf_redirect_peer, programs::TcContext};
use cni_ebpf_common::{DropReason, EndpointInfo};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::{
    csum::{self, IP_TTL},
    endpoints, hostport,
    metrics::{self, Direction},
    route, services,
};

/// Handles an IPv4 frame that left a pod.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, eth: &EthHdr, ifindex: u32) -> Result<i32, i64> {
    if (ctx.len() as usize) < EthHdr::LEN + Ipv4Hdr::LEN {
        return Ok(metrics::drop_packet(DropReason::TruncatedFrame));
    }
    let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
    if ip.version() != 4 || ip.ihl() < Ipv4Hdr::LEN as u8 {
        return Ok(metrics::drop_packet(DropReason::MalformedIpv4));
    }
    match endpoints::lookup(ip.dst_addr) {
        Some(destination) => {
            if hostport::reply_to_pod(ctx, &ip)? {
                // Source rewritten: deliver with the headers as they are now.
                let ip: Ipv4Hdr = ctx.load(EthHdr::LEN)?;
                return deliver(ctx, eth, &ip, &destination);
            }
            // A backend's reply on a Service connection: the stack undoes the DNAT.
            if services::is_reply(ctx, &ip)? {
                return Ok(services::to_stack(ctx));
            }
            if eth.dst_addr == destination.pod_mac {
                return Ok(switch(ctx, &destination));
            }
            deliver(ctx, eth, &ip, &destination)
        }
        None => match hostport::from_pod(ctx, eth, &ip)? {
            Some(verdict) => Ok(verdict),
            // A Service (kube-proxy's DNAT is in the stack).
            None if services::to_service(ctx, &ip)? => Ok(services::to_stack(ctx)),
            None => route::to_uplink(ctx, eth, &ip, ifindex),
        },
    }
}

/// Hands a frame already addressed to the pod `destination`'s MAC (the sender, on its
/// subnet, learnt it from `arp`) to that pod unchanged, as the bridge the pods believe
/// in would: no TTL decrement (the pods are on-link neighbours), no byte written, so the
/// sender's packet is not copied.
#[inline(always)]
fn switch(ctx: &TcContext, destination: &EndpointInfo) -> i32 {
    metrics::count(destination.host_ifindex, Direction::ToPod, ctx.len());
    // SAFETY: a plain helper call with an ifindex and no flags.
    unsafe { bpf_redirect_peer(destination.host_ifindex, 0) as i32 }
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
    decrement_ttl(ctx, ip)?;
    redirect(ctx, eth, destination)
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
    metrics::count(destination.host_ifindex, Direction::ToPod, ctx.len());
    // SAFETY: a plain helper call with an ifindex and no flags.
    Ok(unsafe { bpf_redirect_peer(destination.host_ifindex, 0) } as i32)
}

/// Decrements the TTL of `ip` (read from the frame, TTL above 1) with its checksum: TTL,
/// protocol and checksum in one store.
#[inline(always)]
pub fn decrement_ttl(ctx: &TcContext, ip: &Ipv4Hdr) -> Result<(), i64> {
    // The TTL shares a 16-bit checksum word with the protocol.
    let (old, new) = ([ip.ttl, ip.proto], [ip.ttl - 1, ip.proto]);
    let check = csum::ipv4_check(ip.check, [old], [new]);
    ctx.store(IP_TTL, &[new[0], new[1], check[0], check[1]], 0)?;
    Ok(())
}
