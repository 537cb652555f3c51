//! TC ingress of the node's devices that are neither a pod's, nor an uplink, nor the
//! overlay (a second NIC, a bridge of another runtime): the pods' gateways are the
//! node's addresses for its pods only, and the node would answer ARP and take packets
//! for them there as for any of its addresses. An ARP request for a gateway and an IPv4
//! packet to one are dropped (`gateway_from_outside`, as on the uplinks); everything
//! else goes on to whatever else the hook runs (`TC_ACT_UNSPEC`), untouched.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};
use cni_ebpf_common::DropReason;
use network_types::{
    arp::ArpHdr,
    eth::{EthHdr, EtherType},
    ip::Ipv4Hdr,
};

use crate::primitives::{counters, maps};

#[classifier]
pub fn gateway_guard(ctx: TcContext) -> i32 {
    if for_gateway(&ctx) {
        return counters::drop_packet(DropReason::GatewayFromOutside);
    }
    // Not TC_ACT_OK: TCX (and direct-action filters) would end the hook's chain here.
    TC_ACT_UNSPEC
}

const ARP_REQUEST: u16 = 1;

/// Whether the frame is an ARP request for a gateway or an IPv4 packet to one (a frame
/// too short for its headers is neither: the stack drops it anyway).
#[inline(always)]
fn for_gateway(ctx: &TcContext) -> bool {
    let Ok(eth) = ctx.load::<EthHdr>(0) else {
        return false;
    };
    if eth.ether_type == EtherType::Arp as u16 {
        return ctx
            .load::<ArpHdr>(EthHdr::LEN)
            .is_ok_and(|arp| arp.oper() == ARP_REQUEST && maps::is_gateway(arp.tpa()));
    }
    eth.ether_type == EtherType::Ipv4 as u16
        && ctx
            .load::<Ipv4Hdr>(EthHdr::LEN)
            .is_ok_and(|ip| maps::is_gateway(ip.dst_addr))
}
