//! ARP responder: a pod's ARP requests are answered by the program, so the pod sends
//! everything to its host veth, where the forwarding program takes over. No bridge, no
//! proxy_arp sysctl.
//!
//! A request for another pod of this node is answered with that pod's own MAC, as a
//! bridge would let the pod learn it: frames between pods then carry the MACs they
//! would carry on a bridge, and `deliver::switch` hands them over without writing a
//! byte (a write costs a copy of the headers, as the sender's TCP still holds the
//! packet). Anything else (the gateway, addresses of no local pod) gets the host veth's
//! MAC: the pod's router.

use aya_ebpf::{bindings::TC_ACT_OK, helpers::generated::bpf_redirect, programs::TcContext};
use cni_ebpf_common::DropReason;
use network_types::{arp::ArpHdr, eth::EthHdr};

use crate::{
    features::pod_source,
    primitives::{
        counters::{self, Direction},
        maps,
    },
};

const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;
const HTYPE_ETHERNET: u16 = 1;
const PTYPE_IPV4: u16 = 0x0800;

/// Handles an ARP frame that left the pod behind the host veth `ifindex`.
#[inline(always)]
pub fn from_pod(ctx: &TcContext, eth: &EthHdr, ifindex: u32) -> Result<i32, i64> {
    if (ctx.len() as usize) < EthHdr::LEN + ArpHdr::LEN {
        return Ok(counters::drop_packet(DropReason::TruncatedFrame));
    }
    let mut arp: ArpHdr = ctx.load(EthHdr::LEN)?;
    if arp.htype() != HTYPE_ETHERNET
        || arp.ptype() != PTYPE_IPV4
        || arp.hlen() != 6
        || arp.plen() != 4
    {
        return Ok(counters::drop_packet(DropReason::MalformedArp));
    }
    let (sender, target) = (arp.spa(), arp.tpa());
    // Only ARP about the pod itself, from its own MAC, goes anywhere: a pod cannot
    // poison the node's or another pod's neighbour table, nor make us answer for an
    // address that is not its own.
    let pod = match pod_source::arp(ifindex, eth, sender, arp.sha()) {
        Ok(pod) => pod,
        Err(reason) => return Ok(counters::drop_packet(reason)),
    };
    // Replies (to the node's own requests) and gratuitous ARP (sender == target) are the
    // stack's business.
    if arp.oper() != ARP_REQUEST || sender == target {
        return Ok(TC_ACT_OK);
    }

    let answer = match maps::endpoint(target) {
        Some(neighbour) => neighbour.pod_mac,
        None => pod.host_mac,
    };
    let reply_eth = EthHdr {
        dst_addr: eth.src_addr,
        src_addr: answer,
        ether_type: eth.ether_type,
    };
    arp.set_oper(ARP_REPLY);
    arp.set_tha(arp.sha());
    arp.set_tpa(sender);
    arp.set_sha(answer);
    arp.set_spa(target);
    ctx.store(0, &reply_eth, 0)?;
    ctx.store(EthHdr::LEN, &arp, 0)?;
    counters::endpoint(ifindex, Direction::ToPod, ctx.len());
    // Out of the same veth: back into the pod.
    // SAFETY: a plain helper call with an ifindex and no flags.
    Ok(unsafe { bpf_redirect(ifindex, 0) } as i32)
}
