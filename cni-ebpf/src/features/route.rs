//! Pod traffic leaving the node: when the node's FIB sends a pod's packet out of an
//! uplink, hand it to the uplink directly (`bpf_redirect` with the neighbour's MAC
//! from the FIB), skipping the node's IP stack. The uplink's egress program then
//! source-NATs it. The FIB lookup honours the node's forwarding setting: with
//! forwarding off it answers "not forwarded" and the stack decides.
//!
//! MTU: the lookup gets no `tot_len`, so the kernel checks the packet itself against
//! the uplink's MTU, and a GSO packet (a TCP sender's burst of up to 64 KiB, or more
//! with BIG TCP) is checked segment by segment with `bpf_check_mtu` (the IPv4 header's
//! total length is the whole burst's, or 0 above 64 KiB: see docs/decisions.md, "The
//! FIB lookup's MTU check"). A packet whose segments do not fit goes to the stack,
//! which answers with ICMP "fragmentation needed" as a router must.

use aya_ebpf::{bindings::TC_ACT_OK, programs::TcContext};
use network_types::{eth::EthHdr, ip::Ipv4Hdr};

use crate::primitives::{deliver, fib, maps};

/// Sends `ip` (a pod's packet for no local pod) straight out of an uplink when the FIB
/// says that is its way and the neighbour is known; otherwise the stack takes it.
#[inline(always)]
pub fn to_uplink(
    ctx: &TcContext,
    eth: &EthHdr,
    ip: &Ipv4Hdr,
    ingress_ifindex: u32,
) -> Result<i32, i64> {
    if maps::nat_config().is_none() || ip.ttl <= 1 {
        return Ok(TC_ACT_OK);
    }
    // Anything but a resolved route out of an uplink (local addresses, no neighbour
    // yet, forwarding off, other devices) is the stack's business.
    let Some(next) = fib::forward(
        ctx,
        ingress_ifindex,
        ip.proto as u8,
        ip.tos,
        ip.src_addr,
        ip.dst_addr,
    ) else {
        return Ok(TC_ACT_OK);
    };
    if maps::uplink_addr(next.ifindex).is_none() || !segments_fit(ctx, next.ifindex) {
        return Ok(TC_ACT_OK);
    }
    deliver::routed(ctx, next.dmac, next.smac, eth, ip)?;
    Ok(deliver::out_of_node(ctx, next.ifindex))
}

/// Whether each segment of a GSO packet fits the MTU of `ifindex` (a packet that is not
/// GSO was checked whole by the FIB lookup).
#[inline(always)]
fn segments_fit(ctx: &TcContext, ifindex: u32) -> bool {
    // SAFETY: `skb` is the program's context; gso_size is a readable field of it.
    let gso_size = unsafe { (*ctx.skb.skb).gso_size };
    gso_size == 0 || fib::fits(ctx, ifindex)
}
